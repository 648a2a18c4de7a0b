// The unfused baseline of the FP8 variant: per-token-group FP8 quantization of a [M, H] BF16
// tensor (the layer input) by a kernel of its own, as an engine launches it after the norm
// (vLLM's per_token_group_quant_fp8, column-major TMA-aligned scales). The same bits as the
// fused variant (include/mhccl/fp8_groups.h): mhccl-bench checks it against the CPU reference.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace mhccl::bench {

// values [M, H] E4M3, scales fp8_group_scale_bytes(M, H) bytes (padding rows written 0).
// H a multiple of 128, at most 8192. Launched with programmatic dependent launch (it waits for
// its predecessor before reading `in`).
cudaError_t launch_group_quant(const void* in, void* values, float* scales, int64_t m, int64_t h, bool ue8m0,
                               cudaStream_t stream);

}  // namespace mhccl::bench
