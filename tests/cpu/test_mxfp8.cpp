// MXFP8: E4M3 encoding against the CUDA toolkit's host conversion, the UE8M0 scale rule, the
// swizzled 128x4 scale layout.
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "mhccl/mxfp8.h"
#include "mhccl/reference.h"

namespace mhccl {
namespace {

uint8_t toolkit_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

TEST(E4M3, EveryBf16ValueMatchesToolkit) {
  int checked = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float v = bf16_to_float(static_cast<uint16_t>(b));
    ASSERT_EQ(e4m3_encode(v), toolkit_e4m3(v)) << "bf16 bits 0x" << std::hex << b << " = " << v;
    ++checked;
  }
  EXPECT_EQ(checked, 65536);
}

// Every representable E4M3 magnitude, in increasing order.
std::vector<float> e4m3_magnitudes() {
  std::vector<float> m;
  for (int b = 0; b <= 0x7E; ++b) m.push_back(e4m3_decode(static_cast<uint8_t>(b)));
  return m;
}

TEST(E4M3, SweepAroundEveryRoundingBoundaryMatchesToolkit) {
  const std::vector<float> mags = e4m3_magnitudes();
  int checked = 0;
  for (size_t i = 0; i + 1 < mags.size(); ++i) {
    const float mid = 0.5f * (mags[i] + mags[i + 1]);  // exact: adjacent E4M3 values
    float probes[] = {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), mags[i],
                      std::nextafter(mags[i], 1e9f), std::nextafter(mags[i + 1], 0.0f)};
    for (float p : probes) {
      for (float s : {1.0f, -1.0f}) {
        ASSERT_EQ(e4m3_encode(s * p), toolkit_e4m3(s * p)) << "v = " << s * p;
        ++checked;
      }
    }
  }
  // Saturation region, tiny values, specials.
  for (float v : {448.0f, 449.0f, 463.99f, 464.0f, 464.01f, 480.0f, 1e30f, INFINITY, -INFINITY,
                  NAN, -NAN, 0.0f, -0.0f, 1e-40f, -1e-40f, 0.0009765625f, 0.0009765626f,
                  0.0009765624f, 0.001953125f}) {
    EXPECT_EQ(e4m3_encode(v), toolkit_e4m3(v)) << "v = " << v;
    ++checked;
  }
  EXPECT_GT(checked, 1500);
}

TEST(E4M3, SpecialsAreAsDocumented) {
  EXPECT_EQ(e4m3_encode(448.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(1e9f), 0x7E);       // saturates
  EXPECT_EQ(e4m3_encode(-INFINITY), 0xFE);  // saturates, keeps the sign
  EXPECT_EQ(e4m3_encode(NAN), 0x7F);        // NaN stays NaN
  EXPECT_EQ(e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(e4m3_encode(1.0f), 0x38);
  EXPECT_EQ(e4m3_encode(0.001953125f), 0x01);  // least subnormal, 2^-9
  EXPECT_TRUE(std::isnan(e4m3_decode(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_decode(0xFF)));
}

TEST(E4M3, DecodeOfEncodeWithinHalfAnUlp) {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    // Magnitudes spread over the whole E4M3 range, both signs.
    const double mag = std::ldexp(1.0 + double(x % 1000003) / 1000003.0, int(x >> 40) % 19 - 10);
    const float v = static_cast<float>((x >> 63) ? -mag : mag);
    if (std::fabs(v) > 448.0f) continue;
    const float back = e4m3_decode(e4m3_encode(v));
    int e = 0;
    std::frexp(std::fabs(v), &e);
    const double ulp = std::ldexp(1.0, std::max(e - 1, -6) - 3);  // 3 mantissa bits, min exp -6
    ASSERT_LE(std::fabs(double(back) - double(v)), 0.5 * ulp) << "v = " << v;
    ++checked;
  }
  EXPECT_GT(checked, 100000);
}

TEST(UE8M0, ScaleRuleAtDocumentedPoints) {
  EXPECT_EQ(ue8m0_scale(0.0f), 0);                       // amax 0 gives byte 0
  EXPECT_EQ(ue8m0_scale(std::ldexp(1.0f, -130)), 0);     // 2^-138 clamps to 2^-127
  EXPECT_EQ(ue8m0_scale(1e-30f), 127 - 108);             // ceil(log2(1e-30 / 448)) = -108
  EXPECT_EQ(ue8m0_scale(447.0f), 127);
  EXPECT_EQ(ue8m0_scale(448.0f), 127);                   // exactly 448 * 2^0
  EXPECT_EQ(ue8m0_scale(449.0f), 128);
  EXPECT_EQ(ue8m0_scale(std::ldexp(1.0f, 100)), 127 + 92);
  EXPECT_EQ(ue8m0_scale(INFINITY), 0xFF);
  EXPECT_EQ(ue8m0_scale(NAN), 0xFF);
  EXPECT_EQ(ue8m0_scale(3.4028235e38f), 127 + 120);      // FLT_MAX still finite
}

TEST(UE8M0, ScaleIsTheLeastPowerOfTwoThatFits) {
  uint64_t x = 12345;
  for (int i = 0; i < 100000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits = static_cast<uint32_t>(x >> 33) & 0x7F7FFFFFu;  // finite, positive
    float amax;
    std::memcpy(&amax, &bits, 4);
    if (amax == 0.0f) continue;
    const int byte = ue8m0_scale(amax);
    const double e = byte - 127;
    if (byte > 0) {
      ASSERT_LE(double(amax), 448.0 * std::ldexp(1.0, int(e))) << amax;
      ASSERT_GT(double(amax), 448.0 * std::ldexp(1.0, int(e) - 1)) << amax;
    } else {
      ASSERT_LE(double(amax), 448.0 * std::ldexp(1.0, -127)) << amax;
    }
    // Quantized elements never clip: amax / scale <= 448.
    ASSERT_NE(mxfp8_encode(amax, static_cast<uint8_t>(byte)) & 0x7F, 0x7F);
    ASSERT_LE(double(amax) * double(ue8m0_inverse(static_cast<uint8_t>(byte))), 448.0);
  }
}

TEST(ScaleLayout, M300H5120IsABijectionIntoTheBuffer) {
  const int64_t m = 300, h = 5120, s = h / 32;
  const int64_t total = mxfp8_scale_bytes(m, h);
  EXPECT_EQ(total, 512 * 3 * 40);
  std::set<int64_t> seen;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t k = 0; k < s; ++k) {
      const int64_t off = mxfp8_scale_offset(r, k, s);
      ASSERT_GE(off, 0);
      ASSERT_LT(off, total);
      ASSERT_TRUE(seen.insert(off).second) << "offset " << off << " taken twice (r=" << r << ", k=" << k << ")";
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), m * s);
  // Offsets worked out by hand: (r/128 * 40 + k/4) * 512 + (r%32) * 16 + (r%128)/32 * 4 + k%4.
  EXPECT_EQ(mxfp8_scale_offset(0, 0, s), 0);
  EXPECT_EQ(mxfp8_scale_offset(32, 0, s), 4);
  EXPECT_EQ(mxfp8_scale_offset(100, 7, s), 512 + 64 + 12 + 3);
  EXPECT_EQ(mxfp8_scale_offset(129, 5, s), 41 * 512 + 16 + 0 + 1);
  EXPECT_EQ(mxfp8_scale_offset(299, 159, s), 119 * 512 + 176 + 4 + 3);

  // The reference quantizer leaves every byte outside the (row, block) map at 0, even over a
  // poisoned buffer.
  std::vector<uint16_t> in(static_cast<size_t>(m * h));
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(0x3F80 + (i * 7919) % 0x400);
  std::vector<uint8_t> values(in.size()), scales(static_cast<size_t>(total), 0xAB);
  reference::mxfp8_quantize(in.data(), m, h, values.data(), scales.data());
  for (int64_t off = 0; off < total; ++off) {
    if (!seen.count(off)) ASSERT_EQ(scales[off], 0) << "padding byte " << off;
    else ASSERT_NE(scales[off], 0) << "scale byte " << off;
  }
}

TEST(ScaleLayout, NonMultipleOfFourBlocksPads) {
  // H = 2880: 90 blocks a row, padded to 92.
  EXPECT_EQ(mxfp8_scale_bytes(1, 2880), 512 * 1 * 23);
  EXPECT_EQ(mxfp8_scale_offset(0, 89, 90), 22 * 512 + 1);
  EXPECT_EQ(mxfp8_scale_bytes(129, 64), 512 * 2 * 1);
}

TEST(ScaleLayout, ScaleBytesNeverAWrongSize) {
  // -1 where no size is right (as fp8_group_scale_bytes): negative M or H, H not a multiple of
  // 32, a count beyond int64 (no overflow into a small or negative number).
  EXPECT_EQ(mxfp8_scale_bytes(0, 32), 0);
  EXPECT_EQ(mxfp8_scale_bytes(-1, 5120), -1);
  EXPECT_EQ(mxfp8_scale_bytes(-300, 5120), -1);
  EXPECT_EQ(mxfp8_scale_bytes(4, -32), -1);
  EXPECT_EQ(mxfp8_scale_bytes(4, 5128), -1);
  EXPECT_EQ(mxfp8_scale_bytes((int64_t{1} << 60) + 1, 5120), -1);
  EXPECT_EQ(mxfp8_scale_bytes(INT64_MAX, 32), -1);
  const int64_t top = INT64_MAX / 512 * 128;  // the largest M whose count fits at H = 32
  EXPECT_EQ(mxfp8_scale_bytes(top, 32), 512 * (top / 128));
  EXPECT_EQ(mxfp8_scale_bytes(top + 128, 32), -1);
}

TEST(Mxfp8Quantize, BlockOfKnownValues) {
  // One row of 32 values: amax 3.0 -> scale 2^ceil(log2(3/448)) = 2^-7 (byte 120); element
  // v encodes v * 128: 3.0 -> 384 (0x7C), 1.0 -> 128 (0x70), -0.5 -> -64 (0xE8).
  std::vector<uint16_t> row(32, 0x3F80);  // 1.0
  row[3] = 0x4040;                        // 3.0
  row[7] = 0xBF00;                        // -0.5
  std::vector<uint8_t> values(32), scales(static_cast<size_t>(mxfp8_scale_bytes(1, 32)));
  reference::mxfp8_quantize(row.data(), 1, 32, values.data(), scales.data());
  EXPECT_EQ(scales[0], 120);
  EXPECT_EQ(values[3], 0x7C);
  EXPECT_EQ(values[0], 0x70);
  EXPECT_EQ(values[7], 0xE8);
  for (size_t i = 1; i < scales.size(); ++i) EXPECT_EQ(scales[i], 0);
}

TEST(Mxfp8Quantize, NaNBlockHasNaNScaleAndNaNElements) {
  std::vector<uint16_t> row(64, 0x3F80);
  row[40] = 0x7FC1;  // NaN in block 1
  std::vector<uint8_t> values(64), scales(static_cast<size_t>(mxfp8_scale_bytes(1, 64)));
  reference::mxfp8_quantize(row.data(), 1, 64, values.data(), scales.data());
  EXPECT_EQ(scales[mxfp8_scale_offset(0, 0, 2)], 127 - 8);  // amax 1 -> 2^-8
  EXPECT_EQ(scales[mxfp8_scale_offset(0, 1, 2)], 0xFF);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(values[i], 0x7F);
}

}  // namespace
}  // namespace mhccl
