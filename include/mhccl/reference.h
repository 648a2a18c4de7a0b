// The CPU reference: SPEC.md's arithmetic in plain C++ (FP32 with the same fmaf chains and
// rounding points as the kernels), the oracle of every GPU test and of mhccl-bench's checks.
// BF16 tensors are raw uint16_t bits, row-major, in host memory.
#pragma once

#include <cstdint>
#include <vector>

namespace mhccl::reference {

// y[i] = bf16(acc), acc = +0.0f, then acc += float(x_r[i]) for r = 0..tp-1 (rank order).
// Starting from +0.0 makes an all-zero sum +0.0 whatever the zeros' signs, as the Lamport
// protocols give it (their mailboxes never hold -0.0).
void all_reduce_bf16(const std::vector<const uint16_t*>& rank_inputs, int64_t n, uint16_t* y);

// This rank's x of finalize: acc = +0.0f; for k = 0..top_k-1 with p = idx[m,k] in [0, rows):
// acc = fmaf(weights[m,k], float(gemm2[p,h]), acc); then x[m,h] = bf16(acc + float(shared[m,h]))
// (the routed sum first, the shared expert added last, one rounding: the reference module's
// order). Routes of -1 are skipped; any other index outside [0, rows) is skipped too and counted.
// Returns that count.
int64_t finalize_rank_input(const uint16_t* gemm2, int64_t rows, const float* weights,
                            const int32_t* idx, const uint16_t* shared, int64_t m, int64_t h,
                            int top_k, uint16_t* x);

// One sublayer boundary's mHC inputs, [m, ...] row-major.
struct MHCProblem {
  int64_t m = 0, h = 0;
  int hc = 0;
  const uint16_t* residual = nullptr;     // [m, hc, h] BF16
  const float* post = nullptr;            // [m, hc]
  const float* comb = nullptr;            // [m, hc, hc], [source, target]
  const float* pre = nullptr;             // [m, hc]; nullptr: residual-only
  const uint16_t* norm_weight = nullptr;  // [h] BF16
  float eps = 1e-6f;
};

// residual_out[m,t,h] = bf16(acc), acc = post[m,t] * float(y[m,h]); then for s = 0..hc-1:
//   acc = fmaf(comb[m,s,t], float(residual[m,s,h]), acc).
// layer_input[m,h] (skipped when pre is nullptr): c = +0.0f, for t = 0..hc-1:
//   c = fmaf(pre[m,t], float(residual_out[m,t,h]), c);  p = float(bf16(c)) (the collapse rounded
//   to BF16 once, as the reference module and unfused engines do);
//   r = 1 / sqrtf(sum_h(p^2) / h + eps);  layer_input = bf16((p * r) * float(norm_weight[h])).
void mhc_epilogue(const MHCProblem& p, const uint16_t* y, uint16_t* residual_out,
                  uint16_t* layer_input);

// The layer input with its RMSNorm in FP64, for checks of layer_input within 1 BF16 ulp. The
// collapse p = bf16(c) of SPEC's FP32 fmaf chain over the BF16 residual_out (bit-exact by
// contract, and where c nearly cancels its FP32 rounding dominates any tolerance); what may differ between
// implementations is the RMS sum's association, rsqrt and the last products, checked here.
void layer_input_fp64(const MHCProblem& p, const uint16_t* residual_out, double* out);

// MXFP8 of [m, h] BF16 rows (include/mhccl/mxfp8.h): values [m, h] E4M3 and the swizzled UE8M0
// scales, mxfp8_scale_bytes(m, h) bytes with every padding byte 0. h a multiple of 32.
void mxfp8_quantize(const uint16_t* in, int64_t m, int64_t h, uint8_t* values, uint8_t* scales);

// Per-token-group FP8 of [m, h] BF16 rows (include/mhccl/fp8_groups.h): values [m, h] E4M3 and
// the FP32 scales in the MN-major TMA-aligned layout, fp8_group_scale_bytes(m, h) / 4 floats
// with every padding float 0. Per group of 128: amax over |x| (NaN when any element is NaN),
// s = fp8_group_scale(amax, ue8m0), values fp8_group_encode(x, s). h a multiple of 128.
void fp8_group_quantize(const uint16_t* in, int64_t m, int64_t h, bool ue8m0, uint8_t* values, float* scales);

// Every rank's bytes concatenated in rank order, every byte as sent (words equal to the Lamport
// sentinel 0x80000000 included: SPEC.md, changed 2026-12-01).
void all_gather(const std::vector<const uint8_t*>& rank_inputs, int64_t bytes, uint8_t* out);

// |got - want| in units of the BF16 ulp at `want` (subnormal ulp 2^-133 near 0); NaN vs NaN is 0,
// NaN vs a number is +Inf.
double bf16_ulp_distance(uint16_t got, double want);

}  // namespace mhccl::reference
