#include "common/device_buffer.h"

namespace mhccl::testing {
namespace {
__global__ void gpu_delay_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); while (now - start < ns);
}
}  // namespace

cudaError_t launch_gpu_delay(uint64_t ns, cudaStream_t stream) {
  gpu_delay_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

cudaError_t preload_gpu_delay() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, gpu_delay_kernel);
}
}  // namespace mhccl::testing
