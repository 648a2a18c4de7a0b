// The environment report (include/mhccl/info.h) and the no-device error without a GPU, the
// kernels-for-a-GPU rule, and MHCCL_DEBUG's parsing and output (src/common/debug.h).
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include "comm/nccl_version.h"
#include "common/build_info.h"
#include "common/debug.h"
#include "mhccl/communicator.h"
#include "mhccl/error.h"
#include "mhccl/info.h"

namespace mhccl {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// cudaGetDeviceCount as CUDA reports it: "" when there is a device, else CUDA's name and words
// (inside "no NVIDIA driver is installed (...)" where cudaDriverGetVersion gives 0).
std::string no_device_reason() {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (st == cudaSuccess) return n > 0 ? "" : "cudaGetDeviceCount found 0 devices";
  const std::string cuda = std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(st) + ": " + cudaGetErrorString(st);
  int driver = -1;  // 0: no driver installed (CUDA then calls it insufficient)
  const bool none = st == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
  cudaGetLastError();
  return none ? "no NVIDIA driver is installed (" + cuda + ")" : cuda;
}

std::string cuda_version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

TEST(EnvironmentReport, NamesTheVersions) {
  const std::string r = environment_report();
  EXPECT_EQ(r.rfind(std::string("mhccl ") + MHCCL_PROJECT_VERSION, 0), 0u) << r;
  EXPECT_TRUE(contains(r, "built with CUDA " + cuda_version(CUDART_VERSION) + ", NCCL headers " +
                              comm::nccl_version_string(NCCL_VERSION_CODE)))
      << r;
  int runtime = 0, nccl = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  ASSERT_EQ(ncclGetVersion(&nccl), ncclSuccess);
  EXPECT_TRUE(contains(r, "CUDA runtime " + cuda_version(runtime) + " (")) << r;
  EXPECT_TRUE(contains(r, "libcudart")) << r;  // the file the runtime was loaded from
  EXPECT_TRUE(contains(r, "NCCL library " + comm::nccl_version_string(nccl) + " (")) << r;
  EXPECT_TRUE(contains(r, "libnccl")) << r;
  EXPECT_TRUE(contains(r, std::string("CUDA architectures ") + detail::cuda_architectures())) << r;
  EXPECT_TRUE(contains(r, "CUDA driver: ")) << r;
}

TEST(EnvironmentReport, WithoutAGpuSaysWhyInCudasWords) {
  const std::string why = no_device_reason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present (the report lists it)";
  const std::string r = environment_report();
  EXPECT_TRUE(contains(r, "GPUs: no CUDA device: " + why + "\n")) << r;
  EXPECT_FALSE(contains(r, "P2P")) << r;
}

TEST(EnvironmentReport, ListsTheMhcclAndNcclVariables) {
  setenv("MHCCL_REPORT_TEST", "on", 1);
  setenv("NCCL_REPORT_TEST", "7", 1);
  setenv("REPORT_TEST_OTHER", "x", 1);
  const std::string r = environment_report();
  unsetenv("MHCCL_REPORT_TEST");
  unsetenv("NCCL_REPORT_TEST");
  unsetenv("REPORT_TEST_OTHER");
  EXPECT_TRUE(contains(r, "\n  MHCCL_REPORT_TEST=on\n")) << r;
  EXPECT_TRUE(contains(r, "\n  NCCL_REPORT_TEST=7\n")) << r;
  EXPECT_FALSE(contains(r, "REPORT_TEST_OTHER")) << r;
  EXPECT_LT(r.find("MHCCL_REPORT_TEST"), r.find("NCCL_REPORT_TEST"));  // sorted
}

TEST(NoDevice, TheCommunicatorSaysWhyInCudasWords) {
  const std::string why = no_device_reason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present";
  const ncclUniqueId id{};
  try {
    Communicator comm(id, 0, 1, 0);
    FAIL() << "expected Error(kNoDevice)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice);
    EXPECT_EQ(std::string(e.what()), "Communicator: no CUDA device (" + why +
                                         "): mhccl needs an NVIDIA GPU (sm_90+) with a driver; "
                                         "python -m mhccl.info or mhccl-bench --info says more");
  }
}

TEST(KernelsFor, SassOfTheSameMajorThenPtx) {
  using detail::kernels_for;
  EXPECT_EQ(kernels_for("90", 9, 0), "sm_90 SASS");
  EXPECT_EQ(kernels_for("90-real 100", 10, 0), "sm_100 SASS");
  EXPECT_EQ(kernels_for("90-real 100", 10, 3), "sm_100 SASS");  // same major, newer minor
  EXPECT_EQ(kernels_for("90-real 100", 12, 0), "compute_100 PTX, compiled by the driver at load");
  EXPECT_EQ(kernels_for("90", 10, 0), "compute_90 PTX, compiled by the driver at load");
  EXPECT_EQ(kernels_for("90a", 9, 0), "sm_90a SASS");
  EXPECT_EQ(kernels_for("90-real", 10, 0),
            "none: this build holds 90-real (rebuild with CMAKE_CUDA_ARCHITECTURES including 100)");
  EXPECT_EQ(kernels_for("100a", 10, 3),
            "none: this build holds 100a (rebuild with CMAKE_CUDA_ARCHITECTURES including 103)");
  EXPECT_EQ(kernels_for("90-virtual", 9, 0), "compute_90 PTX, compiled by the driver at load");
  EXPECT_EQ(kernels_for("native", 9, 0), "not known: this build holds the architectures CMake chose for native");
  EXPECT_EQ(kernels_for("all-major 90", 9, 0), "sm_90 SASS");
  EXPECT_EQ(kernels_for("90-real", 8, 0),
            "none: this build holds 90-real (rebuild with CMAKE_CUDA_ARCHITECTURES including 80)");
}

TEST(Debug, Levels) {
  using detail::DebugLevel;
  using detail::parse_debug_level;
  bool unknown = true;
  for (const char* v : {"INFO", "info", "Info"}) {
    EXPECT_EQ(parse_debug_level(v, &unknown), DebugLevel::kInfo) << v;
    EXPECT_FALSE(unknown) << v;
  }
  EXPECT_EQ(parse_debug_level(nullptr, &unknown), DebugLevel::kWarn);
  EXPECT_FALSE(unknown);
  for (const char* v : {"", "WARN", "warn"}) {
    EXPECT_EQ(parse_debug_level(v, &unknown), DebugLevel::kWarn) << v;
    EXPECT_FALSE(unknown) << v;
  }
  for (const char* v : {"INF0", "TRACE", "INFOX", "IN"}) {
    EXPECT_EQ(parse_debug_level(v, &unknown), DebugLevel::kWarn) << v;
    EXPECT_TRUE(unknown) << v;
  }
}

TEST(Debug, EveryLinePrefixed) {
  testing::internal::CaptureStderr();
  detail::debug_print("rank 0/2 cuda:0 AllReduceMHC", "first\nsecond\n");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "mhccl INFO rank 0/2 cuda:0 AllReduceMHC: first\nmhccl INFO rank 0/2 cuda:0 AllReduceMHC: second\n");
  EXPECT_EQ(detail::bytes_text(13762560), "13.1 MiB (13762560 bytes)");
}

}  // namespace
}  // namespace mhccl
