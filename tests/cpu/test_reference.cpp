// The CPU reference against hand-computed cases and an FP64 recomputation.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/mhc_data.h"
#include "mhccl/bf16.h"
#include "mhccl/reference.h"

namespace mhccl {
namespace {

uint16_t bf(float f) { return float_to_bf16(f); }

TEST(Reference, AllReduceSumsInRankOrderFromPositiveZero) {
  const uint16_t neg0 = 0x8000;
  std::vector<uint16_t> a = {neg0, bf(1.0f), bf(1.0f), 0x8001};
  std::vector<uint16_t> b = {neg0, bf(1.0f / 256), bf(3.0f / 512), 0x8001};
  std::vector<uint16_t> y(4);
  reference::all_reduce_bf16({a.data(), b.data()}, 4, y.data());
  EXPECT_EQ(y[0], 0x0000);      // -0 + -0 from +0 is +0
  EXPECT_EQ(y[1], bf(1.0f));    // 1 + 2^-8 is a tie: even
  EXPECT_EQ(y[2], 0x3F81);      // 1 + 3*2^-9 rounds up to 1 + 2^-7
  EXPECT_EQ(y[3], 0x8002);      // two negative subnormals add exactly
}

TEST(Reference, HcOneWithUnitMixesIsAResidualAdd) {
  const int64_t m = 3, h = 16;
  std::mt19937_64 rng(1);
  std::vector<uint16_t> y, res;
  testing::fill_bf16(rng, y, m * h, 1.0f);
  testing::fill_bf16(rng, res, m * h, 1.0f);
  std::vector<float> post(m, 1.0f), comb(m, 1.0f);
  reference::MHCProblem p{m, h, 1, res.data(), post.data(), comb.data(), nullptr, nullptr, 1e-6f};
  std::vector<uint16_t> out(m * h);
  reference::mhc_epilogue(p, y.data(), out.data(), nullptr);
  for (int64_t i = 0; i < m * h; ++i) {
    ASSERT_EQ(out[i], bf(bf16_to_float(y[i]) + bf16_to_float(res[i]))) << i;
  }
}

TEST(Reference, ZeroPostAndIdentityCombPassTheResidualThrough) {
  const int64_t m = 2, h = 24;
  const int hc = 4;
  std::mt19937_64 rng(2);
  std::vector<uint16_t> y, res;
  testing::fill_bf16(rng, y, m * h, 1.0f);
  testing::fill_bf16(rng, res, m * hc * h, 1.0f);  // never zero
  std::vector<float> post(m * hc, 0.0f), comb(m * hc * hc, 0.0f), pre(m * hc, 0.25f);
  for (int64_t r = 0; r < m; ++r) for (int s = 0; s < hc; ++s) comb[(r * hc + s) * hc + s] = 1.0f;
  std::vector<uint16_t> w(h, bf(1.0f));
  reference::MHCProblem p{m, h, hc, res.data(), post.data(), comb.data(), pre.data(), w.data(), 1e-6f};
  std::vector<uint16_t> out(m * hc * h), li(m * h);
  reference::mhc_epilogue(p, y.data(), out.data(), li.data());
  EXPECT_EQ(out, res);
}

TEST(Reference, RmsNormOfAKnownVector) {
  // hc = 1, post = 1, comb = 0: residual_out = y; pre = 1: c = y = [2,2,2,2,-2,-2,-2,-2];
  // mean(c^2) = 4, eps = 0: c / 2 = +-1, times the weights.
  const int64_t h = 8;
  std::vector<uint16_t> y = {bf(2), bf(2), bf(2), bf(2), bf(-2), bf(-2), bf(-2), bf(-2)};
  std::vector<uint16_t> res(h, bf(5.0f));
  std::vector<float> post = {1.0f}, comb = {0.0f}, pre = {1.0f};
  std::vector<uint16_t> w = {bf(1), bf(0.5f), bf(2), bf(-3), bf(1), bf(0.25f), bf(8), bf(0)};
  reference::MHCProblem p{1, h, 1, res.data(), post.data(), comb.data(), pre.data(), w.data(), 0.0f};
  std::vector<uint16_t> out(h), li(h);
  reference::mhc_epilogue(p, y.data(), out.data(), li.data());
  EXPECT_EQ(out, y);
  const std::vector<uint16_t> want = {bf(1), bf(0.5f), bf(2), bf(-3), bf(-1), bf(-0.25f), bf(-8), 0x8000};
  EXPECT_EQ(li, want);
  std::vector<double> ref(h);
  reference::layer_input_fp64(p, out.data(), ref.data());
  for (int64_t i = 0; i < h; ++i) EXPECT_EQ(ref[i], double(bf16_to_float(want[i])));
}

TEST(Reference, FinalizeSkipsMinusOneAndCountsInvalidRoutes) {
  // gemm2 rows r hold the value r + 1 everywhere; shared = 0.5.
  const int64_t h = 8, rows = 4;
  const int top_k = 3;
  std::vector<uint16_t> g(rows * h);
  for (int64_t r = 0; r < rows; ++r) for (int64_t j = 0; j < h; ++j) g[r * h + j] = bf(float(r + 1));
  std::vector<uint16_t> shared(2 * h, bf(0.5f));
  // Row 0: routes {2, -1, 0}, weights {0.5, 9, 2}: 0.5 + 0.5 * 3 + 2 * 1 = 4.
  // Row 1: routes {7, 3, -5}: 7 and -5 are invalid (skipped, counted): 0.5 + 0.25 * 4 = 1.5.
  std::vector<int32_t> routes = {2, -1, 0, 7, 3, -5};
  std::vector<float> w = {0.5f, 9.0f, 2.0f, 100.0f, 0.25f, 100.0f};
  std::vector<uint16_t> x(2 * h);
  const int64_t invalid = reference::finalize_rank_input(g.data(), rows, w.data(), routes.data(),
                                                         shared.data(), 2, h, top_k, x.data());
  EXPECT_EQ(invalid, 2);
  for (int64_t j = 0; j < h; ++j) {
    EXPECT_EQ(x[j], bf(4.0f));
    EXPECT_EQ(x[h + j], bf(1.5f));
  }
}

// The shared expert is added after the routed sum (SPEC.md, changed 2026-12-01): routes 2^-8,
// 2^-24, 2^-24 (weights 1) sum exactly to 2^-8 + 2^-23, and 1 + that rounds up to 1 + 2^-7 in
// BF16. Shared first, each 2^-24 is half an FP32 ulp of 1 + 2^-8 and ties to even (lost), and
// 1 + 2^-8 ties to even 1.0 in BF16: the old order gives 0x3F80.
TEST(Reference, FinalizeAddsTheSharedExpertLast) {
  const int64_t h = 8, rows = 3;
  const int top_k = 3;
  std::vector<uint16_t> g(rows * h);
  const float v[3] = {1.0f / 256, std::ldexp(1.0f, -24), std::ldexp(1.0f, -24)};
  for (int64_t r = 0; r < rows; ++r) for (int64_t j = 0; j < h; ++j) g[r * h + j] = bf(v[r]);
  std::vector<uint16_t> shared(h, bf(1.0f));
  std::vector<int32_t> routes = {0, 1, 2};
  std::vector<float> w = {1.0f, 1.0f, 1.0f};
  std::vector<uint16_t> x(h);
  EXPECT_EQ(reference::finalize_rank_input(g.data(), rows, w.data(), routes.data(), shared.data(), 1, h, top_k,
                                           x.data()), 0);
  for (int64_t j = 0; j < h; ++j) EXPECT_EQ(x[j], 0x3F81) << j;
}

// The norm reads the collapse rounded to BF16 (p = bf16(c)): a problem whose collapse is not
// BF16 (pre = 1 + 2^-10 over BF16 streams) gives the layer input of the same problem with the
// streams replaced by bf16(c) and pre = 1 (whose collapse is bf16(c) exactly). Without that
// rounding some elements differ (checked below, so the comparison can fail).
TEST(Reference, NormReadsTheCollapseRoundedToBf16) {
  const int64_t m = 2, h = 5120;
  std::mt19937_64 rng(11);
  std::vector<uint16_t> y, res(m * h, bf(0.0f));
  testing::fill_bf16(rng, y, m * h, 1.0f);
  std::vector<uint16_t> w;
  testing::fill_bf16(rng, w, h, 1.0f);
  std::vector<float> post(m, 1.0f), comb(m, 0.0f), pre(m, 1.0f + std::ldexp(1.0f, -10)), one(m, 1.0f);
  reference::MHCProblem a{m, h, 1, res.data(), post.data(), comb.data(), pre.data(), w.data(), 1e-6f};
  std::vector<uint16_t> out_a(m * h), li_a(m * h);
  reference::mhc_epilogue(a, y.data(), out_a.data(), li_a.data());
  ASSERT_EQ(out_a, y);  // post 1, comb 0: the streams are y
  std::vector<uint16_t> p(m * h);
  for (int64_t i = 0; i < m * h; ++i) p[i] = bf(pre[0] * bf16_to_float(y[i]));
  reference::MHCProblem b{m, h, 1, res.data(), post.data(), comb.data(), one.data(), w.data(), 1e-6f};
  std::vector<uint16_t> out_b(m * h), li_b(m * h);
  reference::mhc_epilogue(b, p.data(), out_b.data(), li_b.data());
  EXPECT_EQ(li_a, li_b);
  // The FP32 collapse into the norm (the rule before 2026-12-01) differs somewhere.
  int differ = 0;
  for (int64_t r = 0; r < m; ++r) {
    float ss = 0.0f;
    for (int64_t j = 0; j < h; ++j) {
      const float c = pre[0] * bf16_to_float(y[r * h + j]);
      ss = std::fmaf(c, c, ss);
    }
    const float rinv = 1.0f / std::sqrt(ss / static_cast<float>(h) + 1e-6f);
    for (int64_t j = 0; j < h; ++j) {
      const float c = pre[0] * bf16_to_float(y[r * h + j]);
      differ += bf((c * rinv) * bf16_to_float(w[j])) != li_a[r * h + j];
    }
  }
  EXPECT_GT(differ, 0);
}

TEST(Reference, AllGatherKeepsEveryWord) {
  // The Lamport sentinel 0x80000000 (FP32 -0.0, int32 INT32_MIN, UE8M0 bytes [2^-127 x 3, 2^1])
  // and the marker 0x80000001 arrive as sent (SPEC.md, changed 2026-12-01).
  std::vector<uint32_t> a = {1, 0x80000000u, 0x7F800000u, 0x80000001u};
  std::vector<uint32_t> b = {0x80000000u, 2, 3, 4};
  std::vector<uint32_t> out(8);
  reference::all_gather({reinterpret_cast<uint8_t*>(a.data()), reinterpret_cast<uint8_t*>(b.data())},
                        16, reinterpret_cast<uint8_t*>(out.data()));
  const std::vector<uint32_t> want = {1, 0x80000000u, 0x7F800000u, 0x80000001u, 0x80000000u, 2, 3, 4};
  EXPECT_EQ(out, want);
}

TEST(Reference, UlpDistance) {
  EXPECT_EQ(reference::bf16_ulp_distance(bf(1.0f), 1.0), 0.0);
  EXPECT_EQ(reference::bf16_ulp_distance(0x3F81, 1.0), 1.0);           // 1 + 2^-7
  EXPECT_EQ(reference::bf16_ulp_distance(bf(1.0f), 1.0 + 1.0 / 256), 0.5);
  EXPECT_TRUE(std::isinf(reference::bf16_ulp_distance(0x7FC0, 1.0)));
  // At zero the step is the least subnormal, 2^-133: 2^-8 is far away, not within an ulp.
  EXPECT_EQ(reference::bf16_ulp_distance(0x0000, 0.0), 0.0);
  EXPECT_EQ(reference::bf16_ulp_distance(0x0001, 0.0), 1.0);
  EXPECT_GT(reference::bf16_ulp_distance(bf(1.0f / 256), 0.0), 1e30);
}

// FP32 reference vs FP64 recomputation: layer_input within 1 BF16 ulp, over realistic mixes.
TEST(Reference, LayerInputWithinOneUlpOfFp64) {
  struct Shape { int64_t m, h; int hc; };
  int checked = 0;
  double worst = 0;
  for (const Shape s : {Shape{4, 5120, 4}, Shape{3, 7168, 8}, Shape{5, 2880, 2}, Shape{8, 64, 1},
                        Shape{2, 4096, 4}}) {
    for (uint64_t seed = 0; seed < 3; ++seed) {
      const testing::Problem p = testing::make_problem(100 + seed, s.m, s.h, s.hc, 2, seed == 2);
      const std::vector<uint16_t> y = testing::reference_y(p);
      const reference::MHCProblem mp = p.mhc(false);
      std::vector<uint16_t> out(s.m * s.hc * s.h), li(s.m * s.h);
      reference::mhc_epilogue(mp, y.data(), out.data(), li.data());
      std::vector<double> ref(s.m * s.h);
      reference::layer_input_fp64(mp, out.data(), ref.data());
      for (size_t i = 0; i < li.size(); ++i) {
        const double d = reference::bf16_ulp_distance(li[i], ref[i]);
        worst = std::max(worst, d);
        ASSERT_LE(d, 1.0) << "H=" << s.h << " hc=" << s.hc << " i=" << i;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100000);
  EXPECT_GT(worst, 0.0);  // the comparison is not vacuous: some values are not exact
}

}  // namespace
}  // namespace mhccl
