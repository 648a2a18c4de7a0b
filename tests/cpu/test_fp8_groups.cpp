// Per-token-group FP8 (include/mhccl/fp8_groups.h, SPEC.md "FP8 layer input for Hopper GEMMs"):
// the scale rule (amax 0, subnormals, powers of two, UE8M0), the E4M3 values near 448 multiples,
// NaN/Inf as stated, the MN-major TMA-aligned layout and its sizes, and the CPU reference against
// an independent formulation of vLLM's per_token_group_quant_fp8(x, 128,
// column_major_scales=True, use_ue8m0=...) written here.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "mhccl/bf16.h"
#include "mhccl/fp8_groups.h"
#include "mhccl/reference.h"

namespace mhccl {
namespace {

uint32_t bits(float f) { return float_bits(f); }
bool e4m3_is_nan(uint8_t b) { return (b & 0x7F) == 0x7F; }

// --- An independent formulation of vLLM's PyTorch code, in plain C++ ---------------------------
// x_ = x.float().view(M, G, 128); amax = x_.abs().amax(-1).clamp(min=1e-10); s = amax / 448;
// use_ue8m0: s = 2 ** ceil(log2(s)); q = (x_ / s).clamp(-448, 448).to(torch.float8_e4m3fn);
// scales returned column-major and TMA-aligned: torch.empty_strided((M, G), (1, Mp)).
// PyTorch's semantics where C++'s differ: max and clamp propagate NaN. The cast is c10's
// fp8e4m3fn_from_fp32_value (round to nearest even by integer arithmetic, no saturation: >= 480
// and NaN become NaN, keeping the sign), not the toolkit's conversion the library uses.
uint8_t c10_fp8e4m3fn_from_fp32(float f) {
  constexpr uint32_t fp8_max = UINT32_C(1087) << 20;    // 480.0f: the first value past the range
  constexpr uint32_t denorm_mask = UINT32_C(141) << 23;  // 2^14: its ulp is E4M3's subnormal step
  uint32_t f_bits = bits(f);
  const uint32_t sign = f_bits & UINT32_C(0x80000000);
  f_bits ^= sign;
  uint8_t result;
  if (f_bits >= fp8_max) {
    result = 0x7F;
  } else if (f_bits < (UINT32_C(121) << 23)) {  // below 2^-6: the float add rounds to the step
    f_bits = bits(bits_float(f_bits) + bits_float(denorm_mask));
    result = static_cast<uint8_t>(f_bits - denorm_mask);
  } else {
    const uint8_t mant_odd = (f_bits >> 20) & 1;
    f_bits += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFF;
    f_bits += mant_odd;
    result = static_cast<uint8_t>(f_bits >> 20);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

float torch_clamp(float v, float lo, float hi) { return std::isnan(v) ? v : std::min(std::max(v, lo), hi); }

struct VllmGroupQuant {
  std::vector<uint8_t> q;  // [M, H]
  std::vector<float> s;    // storage of the [M, G] view with strides (1, Mp); padding left as NaN
};

VllmGroupQuant vllm_per_token_group_quant_fp8(const std::vector<uint16_t>& x, int64_t m, int64_t h, bool use_ue8m0) {
  const int64_t groups = h / 128, mp = (m + 3) / 4 * 4;  // get_tma_aligned_size(m, 4)
  VllmGroupQuant out;
  out.q.resize(static_cast<size_t>(m * h));
  out.s.assign(static_cast<size_t>(mp * groups), std::numeric_limits<float>::quiet_NaN());
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t* xg = x.data() + r * h + g * 128;
      float amax = 0.0f;
      bool nan = false;
      for (int i = 0; i < 128; ++i) {
        const float a = std::fabs(bf16_to_float(xg[i]));
        nan = nan || std::isnan(a);
        amax = std::max(amax, a);
      }
      if (nan) amax = std::numeric_limits<float>::quiet_NaN();
      amax = std::isnan(amax) ? amax : std::max(amax, 1e-10f);  // clamp(min=1e-10)
      float s = amax / 448.0f;
      if (use_ue8m0) s = static_cast<float>(std::exp2(std::ceil(std::log2(static_cast<double>(s)))));
      out.s[static_cast<size_t>(g * mp + r)] = s;
      for (int i = 0; i < 128; ++i) {
        out.q[static_cast<size_t>(r * h + g * 128 + i)] =
            c10_fp8e4m3fn_from_fp32(torch_clamp(bf16_to_float(xg[i]) / s, -448.0f, 448.0f));
      }
    }
  }
  return out;
}

// The reference's outputs for rows `x`.
struct Quantized {
  std::vector<uint8_t> values;
  std::vector<float> scales;
};
Quantized quantize(const std::vector<uint16_t>& x, int64_t m, int64_t h, bool ue8m0, float poison = -7.0f) {
  Quantized q;
  q.values.assign(static_cast<size_t>(m * h), 0xA5);
  q.scales.assign(static_cast<size_t>(fp8_group_scale_bytes(m, h) / 4), poison);
  reference::fp8_group_quantize(x.data(), m, h, ue8m0, q.values.data(), q.scales.data());
  return q;
}

// --- Sizes and layout ---------------------------------------------------------------------------
TEST(Fp8GroupLayout, RowsAndBytesAtSmallM) {
  const int64_t want_mp[][2] = {{1, 4}, {3, 4}, {4, 4}, {5, 8}, {129, 132}, {0, 0}, {2048, 2048}};
  for (const auto& c : want_mp) {
    EXPECT_EQ(fp8_group_scale_rows(c[0]), c[1]) << "M=" << c[0];
    EXPECT_EQ(fp8_group_scale_bytes(c[0], 5120), 4 * c[1] * 40) << "M=" << c[0];
    EXPECT_EQ(fp8_group_scale_bytes(c[0], 7168), 4 * c[1] * 56) << "M=" << c[0];
  }
  EXPECT_EQ(fp8_group_scale_bytes(3, 128), 16);  // one 16-byte column
  EXPECT_EQ(fp8_group_scale_offset(0, 0, 4), 0);
  EXPECT_EQ(fp8_group_scale_offset(2, 0, 4), 2);
  EXPECT_EQ(fp8_group_scale_offset(0, 1, 4), 4);
  EXPECT_EQ(fp8_group_scale_offset(128, 39, 132), 39 * 132 + 128);
}

TEST(Fp8GroupLayout, OutOfDomainAndOverflowGiveMinusOne) {
  EXPECT_EQ(fp8_group_scale_rows(-1), -1);
  EXPECT_EQ(fp8_group_scale_rows(std::numeric_limits<int64_t>::max()), -1);
  EXPECT_EQ(fp8_group_scale_rows(int64_t{1} << 62), int64_t{1} << 62);
  EXPECT_EQ(fp8_group_scale_bytes(-1, 128), -1);
  EXPECT_EQ(fp8_group_scale_bytes(1, -128), -1);
  EXPECT_EQ(fp8_group_scale_bytes(1, 100), -1);   // not a multiple of 128
  EXPECT_EQ(fp8_group_scale_bytes(1, 5120 + 64), -1);
  EXPECT_EQ(fp8_group_scale_bytes(0, 5120), 0);
  EXPECT_EQ(fp8_group_scale_bytes(7, 0), 0);
  EXPECT_EQ(fp8_group_scale_bytes(std::numeric_limits<int64_t>::max(), 128), -1);
  // 4 * Mp * G up to 2^62 is given, beyond it -1 (never a wrapped product).
  EXPECT_EQ(fp8_group_scale_bytes(int64_t{1} << 60, 128), int64_t{1} << 62);
  EXPECT_EQ(fp8_group_scale_bytes((int64_t{1} << 60) + 1, 128), -1);
  EXPECT_EQ(fp8_group_scale_bytes(int64_t{1} << 58, 512), int64_t{1} << 62);
  EXPECT_EQ(fp8_group_scale_bytes((int64_t{1} << 58) + 4, 512), -1);
  EXPECT_EQ(fp8_group_scale_bytes(int64_t{1} << 40, int64_t{1} << 40), -1);
}

// Every (row, group) lands once inside the buffer; the reference writes every float of the
// buffer: the scales where the map points, 0 in the padding (over a poisoned buffer).
TEST(Fp8GroupLayout, BijectionAndZeroPaddingAtM1_3_4_5_129) {
  for (const int64_t m : {1, 3, 4, 5, 129}) {
    const int64_t h = 512, groups = 4, mp = fp8_group_scale_rows(m);
    const int64_t floats = fp8_group_scale_bytes(m, h) / 4;
    ASSERT_EQ(floats, mp * groups);
    std::set<int64_t> seen;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t off = fp8_group_scale_offset(r, g, mp);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, floats);
        ASSERT_TRUE(seen.insert(off).second) << "M=" << m << " offset " << off << " twice";
        EXPECT_EQ(off % 4 == 0, r % 4 == 0);  // columns start 16-byte aligned
      }
    }
    std::vector<uint16_t> x(static_cast<size_t>(m * h));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(0x3F80 + (i * 7919) % 0x400);
    const Quantized q = quantize(x, m, h, false, std::numeric_limits<float>::quiet_NaN());
    for (int64_t off = 0; off < floats; ++off) {
      if (seen.count(off)) {
        EXPECT_GT(q.scales[off], 0.0f) << "M=" << m << " scale " << off;
      } else {
        EXPECT_EQ(bits(q.scales[off]), 0u) << "M=" << m << " padding float " << off;
      }
    }
    // Row r, group g: offset g * Mp + r, worked out by hand for the last row.
    const int64_t r = m - 1;
    float amax = 0;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, bf16_to_float(x[r * h + 3 * 128 + i]));
    EXPECT_EQ(bits(q.scales[3 * mp + r]), bits(amax / 448.0f)) << "M=" << m;
  }
}

// --- The scale rule ---------------------------------------------------------------------------
TEST(Fp8GroupScale, Pow2CeilIsExact) {
  EXPECT_EQ(bits(fp8_pow2_ceil(1.0f)), bits(1.0f));
  EXPECT_EQ(bits(fp8_pow2_ceil(std::nextafter(1.0f, 2.0f))), bits(2.0f));
  EXPECT_EQ(bits(fp8_pow2_ceil(std::nextafter(1.0f, 0.0f))), bits(1.0f));
  EXPECT_EQ(bits(fp8_pow2_ceil(0.75f)), bits(1.0f));
  EXPECT_EQ(bits(fp8_pow2_ceil(std::ldexp(1.0f, -126))), bits(std::ldexp(1.0f, -126)));
  EXPECT_EQ(bits(fp8_pow2_ceil(bits_float(3))), 4u);          // subnormal 3 * 2^-149 -> 2^-147
  EXPECT_EQ(bits(fp8_pow2_ceil(bits_float(0x00400000u))), 0x00400000u);
  EXPECT_EQ(bits(fp8_pow2_ceil(bits_float(0x00400001u))), 0x00800000u);  // to the least normal
  EXPECT_EQ(bits(fp8_pow2_ceil(3.4028235e38f)), bits(INFINITY));
  EXPECT_EQ(bits(fp8_pow2_ceil(INFINITY)), bits(INFINITY));
  EXPECT_TRUE(std::isnan(fp8_pow2_ceil(NAN)));
  EXPECT_EQ(bits(fp8_pow2_ceil(0.0f)), 0u);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng()) % 0x7F000000u + 1;  // positive, below 2^127
    const float s = bits_float(u);
    const double want = std::exp2(std::ceil(std::log2(static_cast<double>(s))));
    ASSERT_EQ(bits(fp8_pow2_ceil(s)), bits(static_cast<float>(want))) << "bits 0x" << std::hex << u;
  }
}

TEST(Fp8GroupScale, AmaxZeroAndSubnormalsTakeTheEpsilon) {
  const float eps_scale = 1e-10f / 448.0f;
  EXPECT_EQ(bits(fp8_group_scale(0.0f, false)), bits(eps_scale));
  EXPECT_EQ(bits(fp8_group_scale(0.0f, true)), bits(std::ldexp(1.0f, -42)));  // 2.23e-13 -> 2^-42
  EXPECT_EQ(bits(fp8_group_scale(1e-10f, false)), bits(eps_scale));
  EXPECT_EQ(bits(fp8_group_scale(std::nextafter(1e-10f, 1.0f), false)), bits(std::nextafter(1e-10f, 1.0f) / 448.0f));
  // A group of zeros (both signs), and one of BF16 subnormals: the epsilon's scale, values +-0.
  for (const bool ue8m0 : {false, true}) {
    std::vector<uint16_t> x(256);
    for (int i = 0; i < 128; ++i) x[i] = i % 2 ? 0x8000 : 0x0000;
    const uint16_t subnormals[] = {0x0001, 0x807F, 0x0040, 0x8001};
    for (int i = 128; i < 256; ++i) x[i] = subnormals[i % 4];
    const Quantized q = quantize(x, 1, 256, ue8m0);
    const float want = ue8m0 ? std::ldexp(1.0f, -42) : eps_scale;
    EXPECT_EQ(bits(q.scales[0]), bits(want));
    EXPECT_EQ(bits(q.scales[4]), bits(want));  // group 1 at offset 1 * Mp, Mp = 4
    for (int i = 0; i < 256; ++i) {
      EXPECT_EQ(q.values[i], (x[i] & 0x8000) ? 0x80 : 0x00) << "element " << i << (ue8m0 ? " ue8m0" : "");
    }
  }
  // Subnormals beside a normal value: divided like any element (they round to +-0 here).
  std::vector<uint16_t> x(128, 0x0001);
  x[5] = 0x3F80;  // 1.0
  x[6] = 0x8001;
  const Quantized q = quantize(x, 1, 128, false);
  EXPECT_EQ(bits(q.scales[0]), bits(1.0f / 448.0f));
  EXPECT_EQ(q.values[5], 0x7E);  // 1.0 / (1/448) = 448 (within rounding): 0x7E
  EXPECT_EQ(q.values[0], 0x00);
  EXPECT_EQ(q.values[6], 0x80);
}

// A group's largest element always maps to +-448 without UE8M0 (s = fl(amax / 448)); with it, no
// element clips and every element is the toolkit's E4M3 of x / s.
TEST(Fp8GroupScale, LargestElementIs448AndNothingClips) {
  std::mt19937_64 rng(9);
  for (int i = 0; i < 100000; ++i) {
    const uint16_t a = static_cast<uint16_t>(rng() % 0x7F00 + 1);  // finite positive BF16, subnormals too
    const float amax = bf16_to_float(a);
    const float s = fp8_group_scale(amax, false);
    if (amax > 1e-10f) {
      ASSERT_EQ(fp8_group_encode(amax, s), 0x7E) << amax;
      ASSERT_EQ(fp8_group_encode(-amax, s), 0xFE) << amax;
    }
    const float p = fp8_group_scale(amax, true);
    ASSERT_EQ(bits(p), bits(fp8_pow2_ceil(s)));
    ASSERT_LE(static_cast<double>(amax) / p, 448.0) << amax;
    ASSERT_GT(static_cast<double>(std::max(amax, 1e-10f)) / p, 224.0) << amax;
  }
}

// Values near multiples of 448: with amax = 448 * 2^k (s = 2^k exactly, either rule) an element
// v * 2^k encodes as v does; midpoints between E4M3 neighbours round to even, 448 and above
// saturate to 448 (never NaN), all as the toolkit's conversion.
TEST(Fp8GroupValues, NearMultiplesOf448RoundToNearestEvenAndSaturate) {
  for (const int k : {-20, -3, 0, 5, 30}) {
    const float s = std::ldexp(1.0f, k);
    for (const bool ue8m0 : {false, true}) {
      ASSERT_EQ(bits(fp8_group_scale(448.0f * s, ue8m0)), bits(s)) << k;
    }
    // 416 and 448 are the two largest finite E4M3 magnitudes; 432 their midpoint (0x7D is odd:
    // the tie goes to 448, even 0x7E); 400 = midpoint of 384 (0x7C, even) and 416 -> 384.
    const struct { float v; uint8_t want; } cases[] = {
        {448.0f, 0x7E}, {432.0f, 0x7E}, {431.0f, 0x7D}, {433.0f, 0x7E}, {416.0f, 0x7D},
        {400.0f, 0x7C}, {401.0f, 0x7D}, {-432.0f, 0xFE}, {464.0f, 0x7E}, {1e6f, 0x7E}, {-1e6f, 0xFE},
        {1.0f, 0x38}, {0.001953125f, 0x01}, {0.0009765625f, 0x00}, {0.0029296875f, 0x02}};
    for (const auto& c : cases) {
      const float x = c.v * s;
      EXPECT_EQ(fp8_group_encode(x, s), c.want) << "v=" << c.v << " k=" << k;
      EXPECT_EQ(fp8_group_encode(x, s), static_cast<uint8_t>(__nv_cvt_float_to_fp8(c.v, __NV_SATFINITE, __NV_E4M3)));
      const uint16_t two = fp8_group_encode2(x, -x, s);
      EXPECT_EQ(two & 0xFF, c.want);
      EXPECT_EQ(two >> 8, c.want ^ 0x80);
    }
  }
  // A scale that is no power of two: v / s divides in FP32 (not v * (1 / s)).
  const float s = fp8_group_scale(449.0f, false);
  EXPECT_EQ(bits(s), bits(449.0f / 448.0f));
  for (float v : {449.0f, 432.0f, 431.0f, 3.0f, 0.01f, -7.5f}) {
    EXPECT_EQ(fp8_group_encode(v, s), static_cast<uint8_t>(__nv_cvt_float_to_fp8(v / s, __NV_SATFINITE, __NV_E4M3))) << v;
  }
}

// NaN and Inf as fp8_groups.h states them, and as vLLM's formulation gives them (E4M3 NaN of
// either sign counts as NaN).
TEST(Fp8GroupValues, NaNAndInfAsStated) {
  for (const bool ue8m0 : {false, true}) {
    std::vector<uint16_t> x(3 * 128, 0x3F80);  // 1.0
    x[10] = 0x7FC1;                            // group 0: a NaN
    x[11] = 0xBF80;
    x[128 + 3] = 0x7F80;                       // group 1: +Inf, a -Inf, negative and positive finite
    x[128 + 4] = 0xFF80;
    x[128 + 5] = 0xC000;
    x[2 * 128 + 7] = 0xFFC0;                   // group 2: a negative NaN and an Inf
    x[2 * 128 + 8] = 0x7F80;
    const Quantized q = quantize(x, 1, 3 * 128, ue8m0);
    EXPECT_EQ(bits(q.scales[0]), kFp8ScaleNaNBits);
    EXPECT_EQ(bits(q.scales[4]), bits(INFINITY));
    EXPECT_EQ(bits(q.scales[8]), kFp8ScaleNaNBits);
    for (int i = 0; i < 128; ++i) EXPECT_EQ(q.values[i], 0x7F) << "NaN group, element " << i;
    for (int i = 128; i < 256; ++i) {
      const uint8_t want = (x[i] & 0x7FFF) == 0x7F80 ? 0x7F : (x[i] & 0x8000) ? 0x80 : 0x00;
      EXPECT_EQ(q.values[i], want) << "Inf group, element " << i - 128;
    }
    for (int i = 256; i < 384; ++i) EXPECT_EQ(q.values[i], 0x7F) << "NaN+Inf group, element " << i - 256;
    const VllmGroupQuant v = vllm_per_token_group_quant_fp8(x, 1, 3 * 128, ue8m0);
    EXPECT_TRUE(std::isnan(v.s[0]));
    EXPECT_EQ(bits(v.s[4]), bits(INFINITY));
    EXPECT_TRUE(std::isnan(v.s[8]));
    for (int i = 0; i < 384; ++i) {
      EXPECT_EQ(e4m3_is_nan(v.q[i]), e4m3_is_nan(q.values[i])) << i;
      if (!e4m3_is_nan(v.q[i])) EXPECT_EQ(v.q[i], q.values[i]) << i;
    }
  }
}

// --- Against vLLM's formulation ----------------------------------------------------------------
// Random rows of several magnitudes a group (normal-ish values of 2^-30 .. 2^30, a few groups of
// specials), every M of the layout cases and DSV4.1's H: values and scales bit for bit (NaN for
// NaN), the padding of the library's buffer 0.
TEST(Fp8GroupQuantize, MatchesVllmPerTokenGroupQuantFp8) {
  std::mt19937_64 rng(77);
  std::normal_distribution<float> n(0.0f, 1.0f);
  int groups_checked = 0;
  for (const int64_t h : {int64_t{512}, int64_t{5120}}) {
    for (const int64_t m : {1, 3, 4, 5, 129}) {
      const int64_t groups = h / 128, mp = fp8_group_scale_rows(m);
      std::vector<uint16_t> x(static_cast<size_t>(m * h));
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
          const int kind = static_cast<int>(rng() % 16);
          const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 61) - 30);
          for (int i = 0; i < 128; ++i) {
            uint16_t b = float_to_bf16(n(rng) * mag);
            if (kind == 0) b = 0;                                                    // zeros
            if (kind == 1) b = static_cast<uint16_t>((rng() % 0x7F) | (rng() % 2 ? 0x8000 : 0));  // subnormals
            if (kind == 2 && i == 17) b = 0xFFC1;                                    // NaN
            if (kind == 3 && i == 99) b = rng() % 2 ? 0x7F80 : 0xFF80;               // +-Inf
            if (kind == 4 && i == 64) b = 0x7F7F;                                    // BF16 max
            x[static_cast<size_t>(r * h + g * 128 + i)] = b;
          }
        }
      }
      for (const bool ue8m0 : {false, true}) {
        const Quantized q = quantize(x, m, h, ue8m0, std::numeric_limits<float>::quiet_NaN());
        const VllmGroupQuant v = vllm_per_token_group_quant_fp8(x, m, h, ue8m0);
        for (size_t i = 0; i < x.size(); ++i) {
          if (e4m3_is_nan(v.q[i])) {
            ASSERT_TRUE(e4m3_is_nan(q.values[i])) << "M=" << m << " H=" << h << " element " << i;
          } else {
            ASSERT_EQ(q.values[i], v.q[i]) << "M=" << m << " H=" << h << " element " << i << " x=0x" << std::hex
                                           << x[i] << (ue8m0 ? " ue8m0" : "");
          }
        }
        for (int64_t g = 0; g < groups; ++g) {
          for (int64_t r = 0; r < mp; ++r) {
            const size_t off = static_cast<size_t>(fp8_group_scale_offset(r, g, mp));
            if (r >= m) {
              ASSERT_EQ(bits(q.scales[off]), 0u) << "padding M=" << m << " g=" << g << " r=" << r;
            } else if (std::isnan(v.s[off])) {
              ASSERT_EQ(bits(q.scales[off]), kFp8ScaleNaNBits);
            } else {
              ASSERT_EQ(bits(q.scales[off]), bits(v.s[off])) << "M=" << m << " g=" << g << " r=" << r
                                                             << (ue8m0 ? " ue8m0" : "");
              ++groups_checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(groups_checked, 10000);
}

// The independent E4M3 cast itself against the toolkit's, where they must agree: every finite
// float in [-448, 448] of a BF16-ish grid and around each rounding boundary.
TEST(Fp8GroupQuantize, IndependentCastAgreesWithToolkitInRange) {
  int checked = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float v = bf16_to_float(static_cast<uint16_t>(b));
    if (!(std::fabs(v) <= 448.0f)) continue;
    for (const float p : {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e9f), std::nextafter(v, -1e9f)}) {
      if (!(std::fabs(p) <= 448.0f)) continue;
      ASSERT_EQ(c10_fp8e4m3fn_from_fp32(p), static_cast<uint8_t>(__nv_cvt_float_to_fp8(p, __NV_SATFINITE, __NV_E4M3)))
          << p;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000);
}

}  // namespace
}  // namespace mhccl
