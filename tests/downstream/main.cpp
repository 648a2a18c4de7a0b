// Runs without a GPU: the installed libmhccl and the libraries it needs load (RUNPATH), the
// snippet links, and calls into the library answer (the environment report among them).
#include <cstdio>
#include <string>

#include <mhccl/error.h>
#include <mhccl/info.h>
#include <mhccl/mxfp8.h>

struct Boundary;
int run_boundary(Boundary& t, cudaStream_t stream);  // examples/cpp_snippet.cpp

int main(int argc, char**) {
  if (argc > 1) return 3;  // the snippet links (and needs a GPU and a rank environment to run)
  const char* name = mhccl::error_code_name(mhccl::ErrorCode::kPeerTimeout);
  std::printf("mhccl downstream: mxfp8_scale_bytes(1, 5120) = %lld, error code name '%s', run_boundary at %p\n",
              static_cast<long long>(mhccl::mxfp8_scale_bytes(1, 5120)), name,
              reinterpret_cast<void*>(&run_boundary));
  const std::string report = mhccl::environment_report();  // mhccl/info.h, installed and exported
  std::printf("mhccl downstream: environment report's first line: %s\n", report.substr(0, report.find('\n')).c_str());
  return mhccl::mxfp8_scale_bytes(1, 5120) == 512 * 40 && report.rfind("mhccl ", 0) == 0 ? 0 : 1;
}
