// Turning CUDA/NCCL status codes into mhccl::Error, and a device guard.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "mhccl/error.h"

namespace mhccl::detail {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver
                    ? ErrorCode::kNoDevice : ErrorCode::kCuda,
                std::string(what) + " failed: " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ")");
  }
}

inline void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess && status != ncclInProgress) {
    throw Error(ErrorCode::kNccl, std::string(what) + " failed: " + ncclGetErrorString(status) +
                                      (status == ncclSystemError || status == ncclUnhandledCudaError
                                           ? std::string(" (") + ncclGetLastError(nullptr) + ")"
                                           : std::string()));
  }
}

// The integer in environment variable `name`, when set and not empty; Error(kInvalidArgument)
// naming the variable when it is not an integer in [lo, hi].
inline bool env_int(const char* name, long long lo, long long hi, long long* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  const bool digits = (*v >= '0' && *v <= '9') || (*v == '-' && v[1] >= '0' && v[1] <= '9');
  if (!digits || *end != '\0' || x < lo || x > hi) {
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": expected an integer in [" + std::to_string(lo) +
                                                 ", " + std::to_string(hi) + "], got '" + v + "'");
  }
  *out = x;
  return true;
}

// Makes `device` current for a scope and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Frees device allocations of `device` once its work is done (destructors: never throws).
inline void release_device_memory(int device, std::initializer_list<void*> ptrs) {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaDeviceSynchronize();
  for (void* p : ptrs) if (p) cudaFree(p);
  if (prev >= 0) cudaSetDevice(prev);
}

}  // namespace mhccl::detail

#define MHCCL_CUDA(expr) ::mhccl::detail::check_cuda((expr), #expr)
#define MHCCL_NCCL(expr) ::mhccl::detail::check_nccl((expr), #expr)
