// BF16 bit conversions shared by the kernels, the CPU reference and the tests.
// BF16 values cross mhccl's interfaces as raw uint16_t bits so that host code needs no CUDA types.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>

#if defined(__CUDACC__)
#define MHCCL_HD __host__ __device__ __forceinline__
#else
#define MHCCL_HD inline
#endif

namespace mhccl {

// Round to nearest even, the toolkit's definition on host and device: every NaN becomes 0x7FFF,
// no flush of subnormals.
MHCCL_HD uint16_t float_to_bf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

MHCCL_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MHCCL_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Exact widening: every BF16 value (subnormals, -0.0, Inf, NaN payloads) is a float.
MHCCL_HD float bf16_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

}  // namespace mhccl
