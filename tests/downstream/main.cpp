// Runs without a GPU: the installed libmhccl and the libraries it needs load (RUNPATH), the
// snippet links, and a call into the library answers.
#include <cstdio>

#include <mhccl/error.h>
#include <mhccl/mxfp8.h>

struct Boundary;
int run_boundary(Boundary& t, cudaStream_t stream);  // examples/cpp_snippet.cpp

int main(int argc, char**) {
  if (argc > 1) return 3;  // the snippet links (and needs a GPU and a rank environment to run)
  const char* name = mhccl::error_code_name(mhccl::ErrorCode::kPeerTimeout);
  std::printf("mhccl downstream: mxfp8_scale_bytes(1, 5120) = %lld, error code name '%s', run_boundary at %p\n",
              static_cast<long long>(mhccl::mxfp8_scale_bytes(1, 5120)), name,
              reinterpret_cast<void*>(&run_boundary));
  return mhccl::mxfp8_scale_bytes(1, 5120) == 512 * 40 ? 0 : 1;
}
