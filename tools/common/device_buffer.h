// Small CUDA helpers for tests and mhccl-bench: an owning device buffer, checked calls.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <chrono>
#include <thread>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/hash.h"

namespace mhccl::testing {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define MHCCL_TEST_CUDA(expr) ::mhccl::testing::cuda_ok((expr), #expr)

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) MHCCL_TEST_CUDA(cudaMalloc(&ptr_, bytes + 64));  // + slack for offset views
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

  // Synchronous with every stream: cudaMemcpy/cudaMemset run on the legacy stream, which
  // non-blocking streams do not wait for.
  template <class T> void upload(const std::vector<T>& v, size_t offset_bytes = 0) {
    if (v.empty()) return;
    MHCCL_TEST_CUDA(cudaMemcpy(static_cast<char*>(ptr_) + offset_bytes, v.data(), v.size() * sizeof(T),
                               cudaMemcpyHostToDevice));
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  }
  template <class T> std::vector<T> download(size_t count, size_t offset_bytes = 0) const {
    std::vector<T> v(count);
    if (count) {
      MHCCL_TEST_CUDA(cudaMemcpy(v.data(), static_cast<char*>(ptr_) + offset_bytes, count * sizeof(T),
                                 cudaMemcpyDeviceToHost));
    }
    return v;
  }
  void poison(uint8_t byte = 0xA5) {
    MHCCL_TEST_CUDA(cudaMemset(ptr_, byte, bytes_));
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Busy-waits on the GPU for `ns` nanoseconds (bounded by construction): delays a rank.
cudaError_t launch_gpu_delay(uint64_t ns, cudaStream_t stream);
// Loads the delay kernel now (CUDA's lazy loading would load it at its first launch, and a load
// while a kernel spins waits for that kernel: see SimCommunicator).
cudaError_t preload_gpu_delay();

// The result of an NCCL call on an mhccl communicator's NCCL communicator (Communicator::nccl(),
// non-blocking): ncclInProgress polled until the operation settles (at most 60 s).
inline ncclResult_t settle_nccl(ncclComm_t comm, ncclResult_t r) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (r == ncclInProgress && std::chrono::steady_clock::now() < end) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
    if (r == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return r;
}

using mhccl::detail::fnv1a;  // common/hash.h

}  // namespace mhccl::testing
