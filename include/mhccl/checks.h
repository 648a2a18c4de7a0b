// Argument checks of every public op, on the host, before anything is launched (SPEC.md, Errors
// and state). Each throws mhccl::Error whose message names the argument, what was expected and
// what was given. They need no GPU: DLTensors are only described, never dereferenced.
#pragma once

#include <cstdint>
#include <string>

#include <dlpack/dlpack.h>

#include "mhccl/all_reduce_mhc.h"

namespace mhccl {

constexpr int64_t kMaxHidden = 32768;  // a row on at most 8 CTAs (one cluster), 8 BF16 a thread
constexpr int kMaxTopK = 16;
constexpr int64_t kMaxAllGatherCapacity = int64_t{1} << 35;  // 2^31 packs: LamportState::prev_rows, ErrorRecord::row
constexpr int64_t kMaxTokens = int64_t{1} << 24;  // max_num_tokens: mailbox sizes stay far from 2^63
constexpr int kMaxTp = 8;

// tp in {1, 2, 4, 8}.
void check_tp(int tp);

// Construction limits: H a positive multiple of 8 (of 32 with quantize_layer_input, of 128 with
// quantize_layer_input_fp8; not both, and fp8_ue8m0_scales only with the latter) and at
// most kMaxHidden; hc in {1, 2, 4, 8}; 1 <= top_k <= 16; 1 <= max_num_tokens <= kMaxTokens;
// thresholds >= 0. Tensors everywhere: no negative dimension, at most 2^48 elements; MXFP8
// values float8_e4m3fn or raw bytes, scales float8_e8m0fnu or raw bytes; FP8 values likewise,
// FP8 scales float32 (contiguous, or the MN-major view [M, H / 128] with strides [1, Mp]).
void check_all_reduce_mhc_config(const AllReduceMHCConfig& config, int tp);

// Checks a call against the built config for CUDA device `device`; returns M.
int64_t check_all_reduce_mhc_call(const AllReduceMHCConfig& config, int device,
                                  const AllReduceMHCCallArgs& args);
// Checks a finalize against the built config for CUDA device `device`; returns M.
int64_t check_all_reduce_mhc_finalize(const AllReduceMHCConfig& config, int device,
                                      const AllReduceMHCFinalizeArgs& args);

// rank_capacity_bytes: a positive multiple of 16.
void check_all_gather_config(int64_t rank_capacity_bytes);
// Bytes of a tensor (numel * element size); -1 when the element size is not whole bytes.
int64_t tensor_bytes(const DLTensor& t);
// 0 < bytes <= capacity and bytes % 16 == 0.
bool all_gather_accepts(int64_t rank_capacity_bytes, const DLTensor& in);
// 19 bits (kernels::kLayoutDigestBits) of a hash (FNV-1a, folded) of `in`'s dtype (code, bits,
// lanes) and shape: what an
// all-gather's call identity carries beside its size, so that ranks gathering as many bytes of
// another dtype or shape find a divergence (kernels/params.h, with_layout; PROTOCOL.md I19).
uint32_t all_gather_layout_digest(const DLTensor& in);
// Checks an all-gather call; returns true when `in` must first be copied (non-contiguous, or
// its data not 16-byte aligned).
bool check_all_gather_call(int64_t rank_capacity_bytes, int tp, int device, const DLTensor& in,
                           const DLTensor& out);

// Floats of a checked FP8 scales tensor that a call for M rows of width H writes, from its data
// pointer: Mp * G for a contiguous tensor; for the MN-major view [M, G] with strides [1, Mp], its
// extent (G - 1) * Mp + M: the last column's padding rows lie beyond the view (vLLM's
// TMA-aligned scales at M % 4 != 0 end there) and are not written.
int64_t fp8_scale_floats(const DLTensor& scales, int64_t m, int64_t h);

// The dimensions of a strided tensor for a copy in its row-major element order, at most
// max_dims of them: size-1 dimensions dropped, neighbours merged where the outer one's stride
// is the inner one's extent. Writes shape/strides (max_dims entries each) and returns their
// count (0 for a single element), or -1 where more than max_dims remain.
int coalesce_dims(const DLTensor& t, int64_t* shape, int64_t* strides, int max_dims);

// For messages: "bfloat16", "[3, 4, 5120]", ...
std::string describe_dtype(const DLDataType& t);
std::string describe_shape(const DLTensor& t);
bool is_contiguous(const DLTensor& t);

}  // namespace mhccl
