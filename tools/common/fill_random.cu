#include <algorithm>

#include <cuda_bf16.h>

#include "common/fill_random.h"

namespace mhccl::testing {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27; x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Roughly normal: the sum of four uniforms, centred; never exactly zero in BF16.
__device__ __forceinline__ float pseudo_normal(uint64_t seed, uint64_t i) {
  const uint64_t a = mix(seed * 0x9E3779B97F4A7C15ull + i), b = mix(a);
  const float u = ((a & 0xFFFFFF) + ((a >> 32) & 0xFFFFFF) + (b & 0xFFFFFF) + ((b >> 32) & 0xFFFFFF)) /
                  16777216.0f - 2.0f;
  return u * 1.7320508f;
}

__global__ void bf16_kernel(uint16_t* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v = pseudo_normal(seed, i) * scale;
    uint16_t b = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    if ((b & 0x7FFF) == 0) b = 0x3C00;  // never a zero
    p[i] = b;
  }
}
__global__ void f32_kernel(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    p[i] = lo + (hi - lo) * ((mix(seed * 31 + i) & 0xFFFFFF) / 16777216.0f);
  }
}
__global__ void routes_kernel(int32_t* p, int64_t m, int top_k, int64_t rows, uint64_t seed) {
  const int64_t n = m * top_k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(seed * 977 + i);
    // A bijection of [0, rows) when rows is odd or a power of two times an odd multiplier; the
    // modulus keeps it in range either way. About a third of routes are -1 (not on this rank).
    p[i] = (h % 3 == 0) ? -1 : static_cast<int32_t>((i * 2654435761ull + seed) % rows);
  }
}
unsigned blocks_for(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096)); }

}  // namespace

cudaError_t fill_random_bf16(void* p, size_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n) bf16_kernel<<<blocks_for(n), 256, 0, s>>>(static_cast<uint16_t*>(p), n, seed, scale);
  return cudaGetLastError();
}
cudaError_t fill_random_f32(void* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  if (n) f32_kernel<<<blocks_for(n), 256, 0, s>>>(static_cast<float*>(p), n, seed, lo, hi);
  return cudaGetLastError();
}
cudaError_t fill_random_routes(void* p, int64_t m, int top_k, int64_t rows, uint64_t seed, cudaStream_t s) {
  if (m) routes_kernel<<<blocks_for(size_t(m * top_k)), 256, 0, s>>>(static_cast<int32_t*>(p), m, top_k, rows, seed);
  return cudaGetLastError();
}

}  // namespace mhccl::testing
