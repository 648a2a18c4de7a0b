// MXFP8 (OCP Microscaling, E4M3 elements with a UE8M0 scale per 32 elements) in one place: the
// scale choice, the element encoding and the swizzled scale layout of block-scaled GEMMs.
// Host and device usable, so the kernels, the CPU reference and the tests share each definition.
//
// Scale rule (TransformerEngine's and DeepSeek V4 engines'): scale = 2^ceil(log2(amax / 448)),
// so amax / scale <= 448 and no element clips. Elements: round to nearest even, saturating to
// +-448, every NaN becomes 0x7F, -0.0 stays 0x80 — the toolkit's
// __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3), bit for bit (tested on every BF16 value).
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "mhccl/bf16.h"

namespace mhccl {

constexpr int kMxfp8BlockElems = 32;    // elements sharing one UE8M0 scale
constexpr float kE4M3Max = 448.0f;      // largest finite E4M3 value
constexpr uint8_t kUE8M0NaN = 0xFF;     // scale byte of a block whose amax is Inf or NaN

// Bytes of the swizzled scale tensor of an [M, H] MXFP8 tensor:
// 512 * ceil(M / 128) * ceil((H / 32) / 4). -1 (never a wrong size) when m or hidden is
// negative, hidden is not a multiple of 32, or the count would exceed int64 (computed without
// overflow), as fp8_group_scale_bytes (mhccl/fp8_groups.h).
MHCCL_HD int64_t mxfp8_scale_bytes(int64_t m, int64_t hidden) {
  if (m < 0 || hidden < 0 || hidden % kMxfp8BlockElems != 0) return -1;
  const int64_t row_tiles = m / 128 + (m % 128 != 0);  // ceil without overflow at INT64_MAX
  const int64_t k_tiles = (hidden / kMxfp8BlockElems + 3) / 4;
  if (k_tiles != 0 && row_tiles > INT64_MAX / 512 / k_tiles) return -1;
  return 512 * row_tiles * k_tiles;
}

// Byte offset of the scale of row r, block k (elements [32k, 32k+32)) in the 128x4 swizzled
// layout: tiles of 128 rows x 4 blocks, 512 bytes each, row-tile major; inside a tile,
// (r % 32) * 16 + ((r % 128) / 32) * 4 + k % 4. `blocks_per_row` is H / 32.
MHCCL_HD int64_t mxfp8_scale_offset(int64_t r, int64_t k, int64_t blocks_per_row) {
  const int64_t k_tiles = (blocks_per_row + 3) / 4;
  return ((r / 128) * k_tiles + k / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + k % 4;
}

// UE8M0 byte (biased exponent, 127 = 2^0) of the scale for a block of absolute maximum `amax`:
// the least e with amax <= 448 * 2^e, computed exactly from amax's bits; clamped to 2^-127
// (byte 0) below. amax == 0 gives byte 0; Inf or NaN gives 0xFF (E8M0 NaN).
MHCCL_HD uint8_t ue8m0_scale(float amax) {
  uint32_t a = float_bits(amax) & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return kUE8M0NaN;
  if (a == 0) return 0;
  int bias = 0;
  if (a < 0x00800000u) {  // subnormal: scale by 2^24 (exact) to read a normalized mantissa
    a = float_bits(bits_float(a) * 16777216.0f);
    bias = 24;
  }
  const int e2 = static_cast<int>(a >> 23) - 127 - bias;  // amax = 1.f * 2^e2
  // amax / 448 = (1.f / 1.75) * 2^(e2 - 8): at most 2^(e2-8) exactly when 1.f <= 1.75.
  const int e = (a & 0x7FFFFFu) <= 0x600000u ? e2 - 8 : e2 - 7;
  const int byte = e + 127;
  return static_cast<uint8_t>(byte < 0 ? 0 : byte);
}

// 1 / scale as a float (exact: a power of two in [2^-127, 2^127]); NaN for the NaN scale.
MHCCL_HD float ue8m0_inverse(uint8_t scale) {
  if (scale == kUE8M0NaN) return bits_float(0x7FC00000u);
  const uint32_t biased = 254u - scale;  // exponent of 2^(127 - scale)
  return bits_float(biased == 0 ? 0x00400000u : biased << 23);
}

// Value of a UE8M0 scale byte.
MHCCL_HD float ue8m0_value(uint8_t scale) {
  if (scale == kUE8M0NaN) return bits_float(0x7FC00000u);
  return scale == 0 ? bits_float(0x00400000u) : bits_float(static_cast<uint32_t>(scale) << 23);
}

// E4M3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no Inf; 0x7F/0xFF are NaN):
// round to nearest even, saturate finite overflow and Inf to +-448, NaN to 0x7F.
MHCCL_HD uint8_t e4m3_encode(float v) {
  const uint32_t u = float_bits(v);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;                     // NaN, whatever its sign
  if (a > 0x43E00000u) return sign | 0x7E;              // above 448: saturate (Inf too)
  if (a < 0x3C800000u) {                                // below 2^-6: subnormal step 2^-9
    // a * 2^9 < 8 is exact; round half to even with integer arithmetic on its bits.
    const float scaled = bits_float(a) * 512.0f;
    const uint32_t s = float_bits(scaled);
    if (s <= 0x3F000000u) {                             // at most 0.5 (a tie goes to even 0)
      return sign;
    }
    const int exp = static_cast<int>(s >> 23) - 127;    // 0.5 <= scaled < 8: exp in [-1, 2]
    const uint32_t mant = (s & 0x7FFFFFu) | 0x800000u;  // 24-bit significand
    const int shift = 23 - exp;                         // bits below the integer point
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint8_t>(q);              // q == 8 is the least normal, 0x08
  }
  const uint32_t exp = (a >> 23) - 127 + 7;             // 1..15
  const uint32_t mant = a & 0x7FFFFFu;
  uint32_t code = (exp << 3) | (mant >> 20);
  const uint32_t rem = mant & 0xFFFFFu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) ++code;  // may carry into exponent
  return sign | static_cast<uint8_t>(code > 0x7Eu ? 0x7Eu : code);
}

MHCCL_HD float e4m3_decode(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xF;
  const int mant = b & 0x7;
  if (exp == 0xF && mant == 0x7) return bits_float(0x7FC00000u);
  if (exp == 0) return sign * static_cast<float>(mant) * (1.0f / 512.0f);
  return sign * (1.0f + static_cast<float>(mant) * 0.125f) *
         bits_float(static_cast<uint32_t>(exp - 7 + 127) << 23);
}

// Element of a block quantized with `scale`: e4m3(v / scale). A NaN-scale block is all NaN
// (0x7F), whatever the element's sign, so host and device agree bit for bit.
MHCCL_HD uint8_t mxfp8_encode(float v, uint8_t scale) {
  if (scale == kUE8M0NaN) return 0x7F;
  return e4m3_encode(v * ue8m0_inverse(scale));
}

// Two elements, a | b << 8. On sm_89+ devices one hardware conversion
// (cvt.rn.satfinite.e4m3x2.f32, the toolkit's __nv_cvt_float2_to_fp8x2), which rounds and
// saturates as e4m3_encode does; the GPU tests hold every kernel's bytes to mxfp8_encode.
MHCCL_HD uint16_t mxfp8_encode2(float a, float b, uint8_t scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (scale == kUE8M0NaN) return 0x7F7F;
  const float inv = ue8m0_inverse(scale);
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(a * inv, b * inv), __NV_SATFINITE, __NV_E4M3));
#else
  return static_cast<uint16_t>(mxfp8_encode(a, scale) | (mxfp8_encode(b, scale) << 8));
#endif
}

}  // namespace mhccl
