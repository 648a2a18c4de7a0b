// The CUDA devices this process sees, and in CUDA's own words why there are none. Header-only
// and depending on the CUDA runtime alone, so that mhccl-launch can use it as libmhccl does.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

namespace mhccl::detail {

struct DeviceCount {
  int count = 0;        // 0 when cudaGetDeviceCount failed
  std::string why_none;  // empty when count > 0
};

// cudaGetDeviceCount, with its error as CUDA names and describes it ("cudaGetDeviceCount returned
// cudaErrorNoDevice: no CUDA-capable device is detected"); on a machine with no driver at all,
// where CUDA calls the driver insufficient, "no NVIDIA driver is installed (...)" around it. The
// error is cleared, so that no later check reports it.
inline DeviceCount cuda_device_count() {
  DeviceCount d;
  const cudaError_t st = cudaGetDeviceCount(&d.count);
  if (st != cudaSuccess) {
    cudaGetLastError();
    d.count = 0;
    d.why_none = std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(st) + ": " + cudaGetErrorString(st);
    // CUDA says "driver version is insufficient" where there is no driver at all, which reads as
    // "upgrade the driver": cudaDriverGetVersion gives 0 where none is installed.
    int driver = -1;
    if (st == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0) {
      d.why_none = "no NVIDIA driver is installed (" + d.why_none + ")";
    }
    cudaGetLastError();
  } else if (d.count == 0) {
    d.why_none = "cudaGetDeviceCount found 0 devices";
  }
  return d;
}

}  // namespace mhccl::detail
