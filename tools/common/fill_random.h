// Device-side random fills for benchmark inputs (fast at any size; never zeros).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace mhccl::testing {

cudaError_t fill_random_bf16(void* p, size_t n, uint64_t seed, float scale, cudaStream_t s);
cudaError_t fill_random_f32(void* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t s);
// [m, top_k] int32 routes into [0, rows), about a third -1.
cudaError_t fill_random_routes(void* p, int64_t m, int top_k, int64_t rows, uint64_t seed, cudaStream_t s);

}  // namespace mhccl::testing
