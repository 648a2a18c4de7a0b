// Per-token-group FP8 (SPEC.md, "FP8 layer input for Hopper GEMMs") in one place: the scale rule,
// the element encoding and DeepGEMM's MN-major, TMA-aligned FP32 scale layout. Host and device
// usable, so the kernels, the CPU reference and the tests share each definition.
//
// A row of H elements is G = H / 128 groups of 128 consecutive elements. Per group:
//   s = max(amax |x|, 1e-10) / 448 (FP32 division); UE8M0 option: s = 2^ceil(log2(s)), exact;
//   values = E4M3(x / s) (FP32 division, round to nearest even, saturating to +-448).
// Scales: scale(m, g) at float offset g * Mp + m, Mp = ceil(M / 4) * 4 (16-byte columns); the
// floats of rows M .. Mp-1 of every column are padding, written 0.
//
// Non-finite inputs, as vLLM's PyTorch formulation (amax = x.abs().amax().clamp(min=1e-10),
// s = amax / 448, q = (x / s).clamp(-448, 448).to(float8_e4m3fn)) computes them:
//  - a NaN in a group: amax is NaN (max propagates NaN; so does clamp), the scale is NaN (written
//    as the quiet NaN 0x7FC00000), every value of the group is E4M3 NaN (0x7F);
//  - an Inf (and no NaN) in a group: amax = s = +Inf; a finite element becomes +-0 (0x00/0x80,
//    its sign), an infinite one NaN (Inf / Inf; 0x7F).
// (PyTorch's cast keeps a NaN's sign, 0xFF for a negative NaN; the toolkit's conversion used here
// writes every NaN as 0x7F. Both are E4M3 NaN.)
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "mhccl/bf16.h"

namespace mhccl {

constexpr int kFp8GroupElems = 128;     // elements sharing one FP32 scale
constexpr float kFp8GroupEps = 1e-10f;  // the least amax a scale is computed from
constexpr float kFp8E4M3Max = 448.0f;   // largest finite E4M3 value
constexpr uint32_t kFp8ScaleNaNBits = 0x7FC00000u;  // the scale of a group holding a NaN

// Rows of each scale column: Mp = ceil(M / 4) * 4 (16-byte aligned columns). -1 for m < 0 or
// m > 2^62 (out of range).
MHCCL_HD int64_t fp8_group_scale_rows(int64_t m) {
  if (m < 0 || m > (int64_t{1} << 62)) return -1;
  return (m + 3) / 4 * 4;
}

// Bytes of the FP32 scales of an [M, H] tensor: 4 * Mp * (H / 128). -1 (never a wrong size) when
// m or hidden is negative, hidden is not a multiple of 128, or the count would exceed 2^62
// (computed without overflow).
MHCCL_HD int64_t fp8_group_scale_bytes(int64_t m, int64_t hidden) {
  const int64_t mp = fp8_group_scale_rows(m);
  if (mp < 0 || hidden < 0 || hidden % kFp8GroupElems != 0) return -1;
  const int64_t groups = hidden / kFp8GroupElems;
  if (groups != 0 && mp > (int64_t{1} << 60) / groups) return -1;  // 4 * mp * groups <= 2^62
  return 4 * mp * groups;
}

// Float offset of scale(m_row, g) in the scales of Mp = fp8_group_scale_rows(M) rows a column.
MHCCL_HD int64_t fp8_group_scale_offset(int64_t m_row, int64_t g, int64_t mp) { return g * mp + m_row; }

// Floats the MN-major view [M, H / 128] with strides [1, Mp] spans from its data: (G - 1) * Mp + M,
// up to scale(M - 1, G - 1) (the last column's padding rows lie beyond it; vLLM's TMA-aligned
// scales end there). -1 where fp8_group_scale_bytes is.
MHCCL_HD int64_t fp8_group_scale_view_floats(int64_t m, int64_t hidden) {
  if (fp8_group_scale_bytes(m, hidden) < 0) return -1;
  const int64_t groups = hidden / kFp8GroupElems;
  return groups == 0 ? 0 : fp8_group_scale_offset(m - 1, groups - 1, fp8_group_scale_rows(m)) + 1;
}

// a / b in FP32, rounded to nearest even on host and device alike.
MHCCL_HD float fp8_div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// 2^ceil(log2(s)) for s >= 0, exactly, from the float's bits: a power of two stays, anything
// else goes to the next power of two (2^127 rounds up to +Inf); 0, Inf and NaN stay as they are.
MHCCL_HD float fp8_pow2_ceil(float s) {
  const uint32_t u = float_bits(s);
  if (u == 0 || u >= 0x7F800000u) return s;  // +0, +Inf, NaN (and the negative side, unused)
  if (u < 0x00800000u) {                     // subnormal: the least power of two >= its bits
    uint32_t p = 1;
    while (p < u) p <<= 1;
    return bits_float(p);                    // 0x00800000 is 2^-126, the least normal
  }
  if ((u & 0x7FFFFFu) == 0) return s;
  return bits_float(((u >> 23) + 1) << 23);
}

// The scale of a group whose largest magnitude is `amax` (NaN when the group holds a NaN).
MHCCL_HD float fp8_group_scale(float amax, bool ue8m0) {
  if (!(amax == amax)) return bits_float(kFp8ScaleNaNBits);  // max(NaN, eps) stays NaN
  const float s = fp8_div_rn(amax > kFp8GroupEps ? amax : kFp8GroupEps, kFp8E4M3Max);
  return ue8m0 ? fp8_pow2_ceil(s) : s;
}

// Elements v0, v1 of a group of scale s: E4M3(v / s), v0 in the low byte. The toolkit's
// conversion with saturation (cvt.rn.satfinite.e4m3x2.f32 on sm_89+ devices, its bit-exact
// software path on the host): round to nearest even, +-448 at most, every NaN 0x7F, -0.0 0x80.
MHCCL_HD uint16_t fp8_group_encode2(float v0, float v1, float s) {
  float2 q;
  q.x = fp8_div_rn(v0, s);
  q.y = fp8_div_rn(v1, s);
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3));
}

MHCCL_HD uint8_t fp8_group_encode(float v, float s) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(fp8_div_rn(v, s), __NV_SATFINITE, __NV_E4M3));
}

}  // namespace mhccl
