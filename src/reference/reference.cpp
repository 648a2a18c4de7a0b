// CPU reference of SPEC.md. Built with -ffp-contract=off: every product and fmaf below rounds
// exactly where the spec (and the kernels) round.
#include "mhccl/reference.h"

#include <cmath>
#include <cstring>

#include "mhccl/bf16.h"
#include "mhccl/fp8_groups.h"
#include "mhccl/mxfp8.h"

namespace mhccl::reference {

void all_reduce_bf16(const std::vector<const uint16_t*>& xs, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (const uint16_t* x : xs) acc += bf16_to_float(x[i]);
    y[i] = float_to_bf16(acc);
  }
}

int64_t finalize_rank_input(const uint16_t* gemm2, int64_t rows, const float* w,
                            const int32_t* idx, const uint16_t* shared, int64_t m, int64_t h,
                            int top_k, uint16_t* x) {
  int64_t invalid = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int k = 0; k < top_k; ++k) {
      const int32_t p = idx[r * top_k + k];
      if (p != -1 && (p < 0 || p >= rows)) ++invalid;
    }
    for (int64_t j = 0; j < h; ++j) {
      float acc = 0.0f;  // the routed sum first, the shared expert last (SPEC.md, finalize)
      for (int k = 0; k < top_k; ++k) {
        const int32_t p = idx[r * top_k + k];
        if (p < 0 || p >= rows) continue;
        acc = std::fmaf(w[r * top_k + k], bf16_to_float(gemm2[p * h + j]), acc);
      }
      x[r * h + j] = float_to_bf16(acc + bf16_to_float(shared[r * h + j]));
    }
  }
  return invalid;
}

void mhc_epilogue(const MHCProblem& p, const uint16_t* y, uint16_t* residual_out,
                  uint16_t* layer_input) {
  const int64_t h = p.h;
  const int hc = p.hc;
  std::vector<float> c(static_cast<size_t>(h));
  for (int64_t r = 0; r < p.m; ++r) {
    const float* post = p.post + r * hc;
    const float* comb = p.comb + r * hc * hc;
    const uint16_t* res = p.residual + r * hc * h;
    uint16_t* out = residual_out + r * hc * h;
    std::fill(c.begin(), c.end(), 0.0f);
    for (int t = 0; t < hc; ++t) {
      for (int64_t j = 0; j < h; ++j) {
        float acc = post[t] * bf16_to_float(y[r * h + j]);
        for (int s = 0; s < hc; ++s) {
          acc = std::fmaf(comb[s * hc + t], bf16_to_float(res[s * h + j]), acc);
        }
        out[t * h + j] = float_to_bf16(acc);
        if (p.pre != nullptr) c[j] = std::fmaf(p.pre[r * hc + t], bf16_to_float(out[t * h + j]), c[j]);
      }
    }
    if (p.pre == nullptr) continue;
    // The collapse is rounded to BF16 once, before the norm (SPEC.md: p = bf16(c)).
    for (int64_t j = 0; j < h; ++j) c[j] = bf16_to_float(float_to_bf16(c[j]));
    float sumsq = 0.0f;
    for (int64_t j = 0; j < h; ++j) sumsq = std::fmaf(c[j], c[j], sumsq);
    const float rinv = 1.0f / std::sqrt(sumsq / static_cast<float>(h) + p.eps);
    for (int64_t j = 0; j < h; ++j) {
      layer_input[r * h + j] = float_to_bf16((c[j] * rinv) * bf16_to_float(p.norm_weight[j]));
    }
  }
}

void layer_input_fp64(const MHCProblem& p, const uint16_t* residual_out, double* out) {
  const int64_t h = p.h;
  const int hc = p.hc;
  std::vector<double> c(static_cast<size_t>(h));
  for (int64_t r = 0; r < p.m; ++r) {
    double sumsq = 0.0;
    for (int64_t j = 0; j < h; ++j) {
      float acc = 0.0f;  // SPEC's FP32 collapse, exactly as the kernels compute it, then p = bf16(c)
      for (int t = 0; t < hc; ++t) {
        acc = std::fmaf(p.pre[r * hc + t], bf16_to_float(residual_out[(r * hc + t) * h + j]), acc);
      }
      c[j] = bf16_to_float(float_to_bf16(acc));  // p = bf16(c): the norm reads the BF16 collapse
      sumsq += c[j] * c[j];
    }
    const double rinv = 1.0 / std::sqrt(sumsq / double(h) + double(p.eps));
    for (int64_t j = 0; j < h; ++j) {
      out[r * h + j] = c[j] * rinv * double(bf16_to_float(p.norm_weight[j]));
    }
  }
}

namespace {
// The amax of n BF16 values over their absolute values' bits, as BF16 bits: NaN (above Inf) wins,
// as in the kernels (MXFP8 blocks and FP8 groups alike).
uint16_t amax_bits(const uint16_t* v, int n) {
  uint16_t amax = 0;
  for (int i = 0; i < n; ++i) {
    const uint16_t a = v[i] & 0x7FFF;
    amax = a > amax ? a : amax;
  }
  return amax;
}
}  // namespace

void mxfp8_quantize(const uint16_t* in, int64_t m, int64_t h, uint8_t* values, uint8_t* scales) {
  const int64_t blocks = h / kMxfp8BlockElems;
  std::memset(scales, 0, static_cast<size_t>(mxfp8_scale_bytes(m, h)));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t k = 0; k < blocks; ++k) {
      const uint16_t* v = in + r * h + k * kMxfp8BlockElems;
      const uint8_t scale = ue8m0_scale(bf16_to_float(amax_bits(v, kMxfp8BlockElems)));
      scales[mxfp8_scale_offset(r, k, blocks)] = scale;
      for (int i = 0; i < kMxfp8BlockElems; ++i) {
        values[r * h + k * kMxfp8BlockElems + i] = mxfp8_encode(bf16_to_float(v[i]), scale);
      }
    }
  }
}

void fp8_group_quantize(const uint16_t* in, int64_t m, int64_t h, bool ue8m0, uint8_t* values, float* scales) {
  const int64_t groups = h / kFp8GroupElems, mp = fp8_group_scale_rows(m);
  const int64_t bytes = fp8_group_scale_bytes(m, h);  // -1 outside its domain: nothing to write
  if (bytes <= 0) return;
  std::memset(scales, 0, static_cast<size_t>(bytes));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t* v = in + r * h + g * kFp8GroupElems;
      const float s = fp8_group_scale(bf16_to_float(amax_bits(v, kFp8GroupElems)), ue8m0);
      scales[fp8_group_scale_offset(r, g, mp)] = s;
      for (int i = 0; i < kFp8GroupElems; ++i) {
        values[r * h + g * kFp8GroupElems + i] = fp8_group_encode(bf16_to_float(v[i]), s);
      }
    }
  }
}

void all_gather(const std::vector<const uint8_t*>& xs, int64_t bytes, uint8_t* out) {
  for (size_t r = 0; r < xs.size(); ++r) std::memcpy(out + r * bytes, xs[r], static_cast<size_t>(bytes));
}

double bf16_ulp_distance(uint16_t got, double want) {
  const double g = bf16_to_float(got);
  if (std::isnan(g) || std::isnan(want)) return (std::isnan(g) && std::isnan(want)) ? 0.0 : INFINITY;
  if (std::isinf(want) || std::isinf(g)) return g == want ? 0.0 : INFINITY;
  const double a = std::fabs(want);
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1); e is 0 for a == 0
  // 8 significant bits; at and near zero the subnormal step 2^-133.
  const double ulp = a == 0.0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::max(e - 1 - 7, -133));
  return std::fabs(g - want) / ulp;
}

}  // namespace mhccl::reference
