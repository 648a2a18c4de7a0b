// AllReduceMHC on the GPU, TP=1 and TP=2: every variant and M class against the CPU reference,
// identical bits on every rank and across protocols, graphs, PDL, alternating M, delays, bad input.
// Each test runs three times a TP: its ops built for MXFP8 (instance tp1, tp2: every variant),
// and for the per-token-group FP8 without and with UE8M0 scales (tp1_fp8, tp1_fp8ue8m0, ...: the
// FP8 variant where the MXFP8 instance runs MXFP8, and in place of its variant loops).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator_impl.h"
#include "common/tensor_desc.h"
#include "gpu_env.h"
#include "kernels/launch.h"
#include "common/mhc_harness.h"
#include "mhccl/all_gather.h"
#include "mhccl/checks.h"
#include "mhccl/communicator.h"
#include "mhccl/error.h"
#include "mhccl/fp8_groups.h"
#include "mhccl/mxfp8.h"

namespace mhccl::gputest {
namespace {

using testing::CallBuffers;
using testing::Desc;
using testing::Outputs;
using testing::Problem;
using testing::Quant;
using testing::Variant;
using testing::check;
using testing::download;
using testing::launch;
using testing::upload;
using testing::variant_name;

AllReduceMHCConfig config(int64_t h, int hc, int64_t capacity, int64_t two_shot_min = 0,
                          Quant quant = Quant::kMxfp8) {
  AllReduceMHCConfig c;
  c.hidden_size = h;
  c.hc_mult = hc;
  c.max_num_tokens = capacity;
  c.top_k = 6;
  testing::build_quant(c, quant);  // MXFP8 where H % 32 == 0, or FP8 where H % 128 == 0
  c.residual_only = true;
  c.two_shot_min_rows = two_shot_min;
  c.two_shot_min_finalize_rows = two_shot_min;
  return c;
}

kernels::ConsumerVariant consumer_variant(Variant v) {
  switch (v) {
    case Variant::kPlain: return kernels::ConsumerVariant::kPlain;
    case Variant::kMxfp8: return kernels::ConsumerVariant::kMxfp8;
    case Variant::kResidualOnly: return kernels::ConsumerVariant::kResidualOnly;
    default: return kernels::ConsumerVariant::kFp8;
  }
}

class AllReduceMHCTest : public ::testing::TestWithParam<std::tuple<int, Quant>> {
 protected:
  int tp() const { return std::get<0>(GetParam()); }
  Quant quant() const { return std::get<1>(GetParam()); }
  bool fp8() const { return quant() != Quant::kMxfp8; }
  // The quantized variant of this instance's ops.
  Variant qv() const { return testing::quant_variant(quant()); }
  // What a test's variant loop covers: every variant with MXFP8 ops; the FP8 variant alone with
  // FP8 ops (plain and residual-only run in the MXFP8 instance).
  std::vector<Variant> variants() const {
    if (fp8()) return {qv()};
    return {Variant::kPlain, Variant::kMxfp8, Variant::kResidualOnly};
  }
  // Whether an op of this instance with hidden size h has variant v.
  static bool builds(Variant v, int64_t h) {
    if (v == Variant::kMxfp8) return h % 32 == 0;
    if (testing::is_fp8(v)) return h % 128 == 0;
    return true;
  }
  // This instance's config (hides the free function in the tests' bodies).
  AllReduceMHCConfig config(int64_t h, int hc, int64_t capacity, int64_t two_shot_min = 0) const {
    return gputest::config(h, hc, capacity, two_shot_min, quant());
  }
  Communicator& comm() { return *env().comm(tp()); }
  int rank() { return env().rank(tp()); }

  // One call from fresh inputs: upload, launch, sync, check vs reference and across ranks.
  Outputs run(AllReduceMHC& op, CallBuffers& b, const Problem& p, Variant v,
              Protocol protocol = Protocol::kAuto, const char* what = "") {
    upload(p, rank(), b);
    launch(op, p, v, protocol, b, env().device, env().stream);
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    Outputs got = download(p, v, b);
    const std::string err = check(p, v, got);
    EXPECT_EQ(err, "") << what << " M=" << p.m << " H=" << p.h << " hc=" << p.hc << " "
                       << (p.finalize ? "finalize " : "call ") << variant_name(v) << " "
                       << protocol_name(op.protocol_for(p.m, p.finalize));
    EXPECT_TRUE(env().same_on_all_ranks(got.hash(), tp())) << "ranks differ: M=" << p.m << " " << what;
    return got;
  }
};

TEST_P(AllReduceMHCTest, Dsv41EveryVariantEveryM) {
  MHCCL_REQUIRE_TP(tp());
  // Two-shot from 129 rows: 1..128 one-shot (the one-shot limit), 129..256 two-shot.
  AllReduceMHC op(comm(), config(5120, 4, 256, 129));
  CallBuffers b(256, 5120, 4, 6);
  uint64_t seed = 1;
  for (bool fin : {false, true}) {
    for (Variant v : variants()) {
      for (int64_t m : {1, 2, 3, 7, 16, 63, 64, 65, 128, 129, 200, 256}) {
        run(op, b, testing::make_problem(seed++, m, 5120, 4, tp(), fin), v);
      }
    }
  }
  comm().check_errors();
}

// The MN-major FP8 scales view [M, G] with strides [1, Mp] (vLLM's TMA-aligned scales, whose
// storage at M % 4 != 0 ends at the last column's row M - 1): the call writes the view's extent,
// (G - 1) * Mp + M floats, padding rows of the other columns 0 (run's check), and nothing past
// it: the last column's padding rows keep the poison upload wrote. Every path: the single launch
// and CTA per row (small M), streaming (large M), one-shot, two-shot; call and finalize.
TEST_P(AllReduceMHCTest, Fp8ScalesViewWritesNothingPastIt) {
  MHCCL_REQUIRE_TP(tp());
  if (qv() != Variant::kFp8Ue8m0) GTEST_SKIP() << "the harness passes the view in the fp8ue8m0 instance";
  AllReduceMHC op(comm(), config(5120, 4, 320, 129));
  CallBuffers b(320, 5120, 4, 6);
  const int64_t groups = 5120 / kFp8GroupElems;
  uint64_t seed = 61000;
  int checked = 0;
  for (bool fin : {false, true}) {
    for (int64_t m : {1, 2, 3, 5, 7, 65, 133, 257, 319}) {
      const Problem p = testing::make_problem(seed++, m, 5120, 4, tp(), fin);
      const Outputs got = run(op, b, p, qv(), Protocol::kAuto, "view");
      const int64_t mp = fp8_group_scale_rows(m), extent = fp8_group_scale_view_floats(m, 5120);
      for (int64_t i = extent; i < mp * groups; ++i) {
        uint32_t w;
        std::memcpy(&w, got.scales.data() + 4 * i, 4);
        ASSERT_EQ(w, 0xA5A5A5A5u) << "float " << i << " past the view's extent " << extent << " written, M=" << m
                                  << (fin ? " finalize" : " call");
        ++checked;
      }
    }
  }
  std::printf("TP=%d: %d floats past the FP8 scale views' ends left alone\n", tp(), checked);
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, ProtocolsGiveIdenticalBits) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHC op(comm(), config(5120, 4, 256, 129));
  CallBuffers b(256, 5120, 4, 6);
  for (int64_t m : {1, 7, 65, 128}) {
    for (bool fin : {false, true}) {
      const Problem p = testing::make_problem(300 + m + fin, m, 5120, 4, tp(), fin);
      const Outputs one = run(op, b, p, qv(), Protocol::kOneShot, "one-shot");
      const Outputs two = run(op, b, p, qv(), Protocol::kTwoShot, "two-shot");
      EXPECT_EQ(one.hash(), two.hash()) << "one-shot vs two-shot M=" << m;
      if (tp() == 2) {  // the NCCL fallback adds once: the same bits at TP=2
        const Outputs nccl = run(op, b, p, qv(), Protocol::kNccl, "nccl");
        EXPECT_EQ(one.hash(), nccl.hash()) << "one-shot vs NCCL fallback M=" << m;
      }
    }
  }
  comm().check_errors();
}

// Issue 5: M around the default TP=2 threshold (2048) and at large M, with the default
// thresholds, every variant, call and finalize, against the reference; at TP=2 one-shot,
// two-shot and the NCCL fallback give identical bits at the same M. (At TP=1 these M run the
// streaming consumer.)
TEST_P(AllReduceMHCTest, LargeMAcrossDefaultThresholds) {
  MHCCL_REQUIRE_TP(tp());
  constexpr int64_t kCap = 4096;
  AllReduceMHC op(comm(), config(5120, 4, kCap));  // default thresholds
  CallBuffers b(kCap, 5120, 4, 6);
  uint64_t seed = 80000;
  for (int64_t m : {int64_t{1000}, int64_t{2047}, int64_t{2048}, int64_t{2049}, kCap}) {
    for (bool fin : {false, true}) {
      for (Variant v : variants()) {
        run(op, b, testing::make_problem(seed++, m, 5120, 4, tp(), fin), v, Protocol::kAuto, "default thresholds");
      }
    }
  }
  if (tp() > 1) {
    for (int64_t m : {int64_t{2047}, int64_t{2049}, kCap}) {
      const Problem p = testing::make_problem(seed++, m, 5120, 4, tp(), false);
      const Outputs one = run(op, b, p, qv(), Protocol::kOneShot, "one-shot");
      const Outputs two = run(op, b, p, qv(), Protocol::kTwoShot, "two-shot");
      const Outputs nccl = run(op, b, p, qv(), Protocol::kNccl, "nccl");
      EXPECT_EQ(one.hash(), two.hash()) << "one-shot vs two-shot M=" << m;
      EXPECT_EQ(one.hash(), nccl.hash()) << "one-shot vs NCCL fallback M=" << m;
    }
  }
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, OtherShapes) {
  MHCCL_REQUIRE_TP(tp());
  uint64_t seed = 1000;
  // FP8: the H of the FP8 build (multiples of 128), call and finalize of the FP8 variant.
  const std::vector<int64_t> hs = fp8() ? std::vector<int64_t>{5120, 4096, 7168} : std::vector<int64_t>{4096, 7168, 2880, 64};
  for (int64_t h : hs) {
    for (int hc : {1, 2, 4, 8}) {
      AllReduceMHC op(comm(), config(h, hc, 65, 33));
      CallBuffers b(65, h, hc, 6);
      for (int64_t m : {1, 7, 65}) {
        if (fp8()) {
          run(op, b, testing::make_problem(seed++, m, h, hc, tp(), false), qv());
          run(op, b, testing::make_problem(seed++, m, h, hc, tp(), true), qv());
          continue;
        }
        run(op, b, testing::make_problem(seed++, m, h, hc, tp(), false), Variant::kPlain);
        run(op, b, testing::make_problem(seed++, m, h, hc, tp(), true), Variant::kMxfp8);
        run(op, b, testing::make_problem(seed++, m, h, hc, tp(), false), Variant::kResidualOnly);
      }
    }
  }
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, NegativeZeroSubnormalsAndZeroSums) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHC op(comm(), config(5120, 4, 64, 33));
  CallBuffers b(64, 5120, 4, 6);
  for (int64_t m : {1, 16, 40}) {
    Problem p = testing::make_problem(500 + m, m, 5120, 4, tp(), false);
    const uint16_t patterns[] = {0x8000, 0x8001, 0x0001, 0x807F};
    for (int r = 0; r < tp(); ++r) {
      for (size_t i = 0; i < p.x[r].size(); ++i) {
        // -0.0 everywhere on some rows; negative/positive subnormals; exact cancellation.
        const int64_t row = static_cast<int64_t>(i) / p.h;
        if (row % 3 == 0) p.x[r][i] = 0x8000;
        else if (row % 3 == 1) p.x[r][i] = patterns[(i + r) % 4];
        else if (tp() == 2) p.x[r][i] = r == 0 ? p.x[0][i] : static_cast<uint16_t>(p.x[0][i] ^ 0x8000);
      }
    }
    run(op, b, p, qv(), Protocol::kAuto, "signed zeros");
    if (tp() == 2) {
      run(op, b, p, qv(), Protocol::kTwoShot, "signed zeros two-shot");
      run(op, b, p, qv(), Protocol::kNccl, "signed zeros nccl");
    }
  }
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, PdlOnOffBitwiseEqual) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHCConfig on = config(5120, 4, 128, 65), off = on;
  off.enable_pdl = false;
  AllReduceMHC a(comm(), on), c(comm(), off);
  CallBuffers b(128, 5120, 4, 6);
  for (int64_t m : {1, 33, 100}) {
    const Problem p = testing::make_problem(700 + m, m, 5120, 4, tp(), m == 33);
    EXPECT_EQ(run(a, b, p, qv()).hash(), run(c, b, p, qv()).hash()) << "M=" << m;
  }
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, SingleLaunchEqualsTwoLaunches) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHCConfig one = config(5120, 4, 128, 129), two = one;
  two.single_launch_max_rows = 0;
  AllReduceMHC a(comm(), one), c(comm(), two);
  CallBuffers b(128, 5120, 4, 6);
  for (int64_t m : {1, 7, 96, 97, 128}) {
    for (bool fin : {false, true}) {
      const Problem p = testing::make_problem(800 + m + fin, m, 5120, 4, tp(), fin);
      EXPECT_EQ(run(a, b, p, qv(), Protocol::kAuto, "single launch").hash(),
                run(c, b, p, qv(), Protocol::kAuto, "two launches").hash()) << "M=" << m;
    }
  }
  comm().check_errors();
}

// The streaming (persistent, prefetching) consumer against the CTA-per-row one: TP=1 calls, and
// at TP=2 the one-shot (its first CTAs publish), the two-shot and the NCCL fallback's consumer,
// call and finalize; every shape whose row fits one CTA, M across the resident-CTA count, every
// variant; bits equal and right. Then the one-shot with a single publishing CTA.
TEST_P(AllReduceMHCTest, StreamingConsumerEqualsRowPerCta) {
  MHCCL_REQUIRE_TP(tp());
  struct Shape { int64_t h; int hc; };
  std::vector<Protocol> protocols = {Protocol::kAuto};
  if (tp() > 1) protocols = {Protocol::kOneShot, Protocol::kTwoShot, Protocol::kNccl};
  for (const Shape sh : {Shape{5120, 4}, Shape{4096, 8}, Shape{2880, 2}, Shape{512, 4}, Shape{64, 1}}) {
    const int64_t cap = sh.h >= 4096 ? 300 : 600;
    // One-shot up to capacity for call; two-shot built (its finalize threshold 2), forced below.
    AllReduceMHCConfig streaming = config(sh.h, sh.hc, cap, cap + 1), per_row = streaming;
    streaming.two_shot_min_finalize_rows = per_row.two_shot_min_finalize_rows = 2;
    streaming.streaming_min_rows = 1;  // every M > 1
    per_row.streaming_min_rows = 0;    // never
    AllReduceMHC a(comm(), streaming), b(comm(), per_row);
    CallBuffers buf(cap, sh.h, sh.hc, 6);
    uint64_t seed = 70000 + sh.h + sh.hc;
    // Where a row fits one CTA, the streaming kernels can run here (else both sides would be
    // the CTA-per-row path and the comparison would check nothing).
    const kernels::RowTiling t = kernels::row_tiling(static_cast<int>(sh.h / 8), kernels::kMaxSingleLaunchCtas + 1, sh.hc);
    if (t.ctas_per_row == 1 && builds(qv(), sh.h)) {
      const kernels::ConsumerVariant cv = consumer_variant(qv());
      EXPECT_GT(kernels::streaming_consumer_resident_ctas(sh.hc, kernels::ConsumerInput::kDirect, cv, 1, t.threads), 0);
      EXPECT_GT(kernels::streaming_consumer_resident_ctas(sh.hc, kernels::ConsumerInput::kFinalize, cv, 1, t.threads, 6), 0)
          << "H=" << sh.h << " hc=" << sh.hc;
      EXPECT_GT(kernels::streaming_consumer_resident_ctas(sh.hc, kernels::ConsumerInput::kPoll, cv, 1, t.threads), 0);
    }
    for (const Protocol proto : protocols) {
      for (int64_t m : {int64_t{2}, int64_t{3}, int64_t{64}, int64_t{133}, cap}) {
        for (Variant v : variants()) {
          if (!builds(v, sh.h)) continue;
          for (bool fin : {false, true}) {
            if (fin && m == 3 && v != qv()) continue;
            const Problem p = testing::make_problem(seed++, m, sh.h, sh.hc, tp(), fin);
            const Outputs x = run(a, buf, p, v, proto, "streaming");
            const Outputs y = run(b, buf, p, v, proto, "row per CTA");
            EXPECT_EQ(x.hash(), y.hash()) << "H=" << sh.h << " hc=" << sh.hc << " M=" << m << " "
                                          << variant_name(v) << (fin ? " finalize " : " call ")
                                          << protocol_name(proto);
          }
        }
      }
    }
  }
  // finalize with top_k beyond one route group of 8 (the streaming paths stage or prefetch the
  // first group only) and with a single route.
  for (const int top_k : {1, 10}) {
    AllReduceMHCConfig streaming = config(5120, 4, 300, 301), per_row = streaming;
    streaming.top_k = per_row.top_k = top_k;
    streaming.two_shot_min_finalize_rows = per_row.two_shot_min_finalize_rows = 2;
    streaming.streaming_min_rows = 1;
    per_row.streaming_min_rows = 0;
    AllReduceMHC a(comm(), streaming), b(comm(), per_row);
    CallBuffers buf(300, 5120, 4, top_k);
    for (const Protocol proto : protocols) {
      for (int64_t m : {int64_t{2}, int64_t{133}, int64_t{300}}) {
        const Problem p = testing::make_problem(72000 + top_k * 1000 + m, m, 5120, 4, tp(), true, top_k);
        const Outputs x = run(a, buf, p, qv(), proto, "streaming");
        const Outputs y = run(b, buf, p, qv(), proto, "row per CTA");
        EXPECT_EQ(x.hash(), y.hash()) << "top_k=" << top_k << " M=" << m << " " << protocol_name(proto);
      }
    }
  }
  if (tp() > 1) {  // one publishing CTA for the whole call (the consumers wait on it longest)
    ::setenv("MHCCL_STREAM_PUBLISHERS", "1", 1);
    AllReduceMHCConfig cfg = config(5120, 4, 300, 301);
    cfg.streaming_min_rows = 1;
    AllReduceMHC one(comm(), cfg);
    ::unsetenv("MHCCL_STREAM_PUBLISHERS");
    CallBuffers buf(300, 5120, 4, 6);
    for (int64_t m : {int64_t{2}, int64_t{300}}) {
      for (bool fin : {false, true}) {
        run(one, buf, testing::make_problem(71000 + m + fin, m, 5120, 4, tp(), fin), qv(),
            Protocol::kOneShot, "one publisher");
      }
    }
  }
  comm().check_errors();
}

// TP=1 with lamport_self_test: the one-shot (single launch, publish + CTA-per-row consumer,
// the streaming consumer whose first CTAs to arrive publish) and the two-shot (publish, owner reduce,
// both consumers) run through the rank's own mailbox, many calls in a row (generations and
// resets cycle), and give the bits of the direct path; so does the NCCL fallback's path over the
// one-rank NCCL communicator (Protocol::kNccl with lamport_self_test), eager and replayed in a
// CUDA graph. At TP > 1 the other tests run them.
TEST_P(AllReduceMHCTest, LamportProtocolsThroughOwnMailboxAtTp1) {
  MHCCL_REQUIRE_TP(tp());
  if (tp() != 1) GTEST_SKIP() << "TP=1 only (at TP > 1 the protocols run between ranks)";
  AllReduceMHCConfig base = config(5120, 4, 300, 129);
  base.lamport_self_test = true;
  AllReduceMHCConfig streaming = base, per_row = base, two_launches = base;
  streaming.streaming_min_rows = 1;
  per_row.streaming_min_rows = 0;
  two_launches.single_launch_max_rows = 0;
  AllReduceMHC a(comm(), streaming), b(comm(), per_row), c(comm(), two_launches), direct(comm(), config(5120, 4, 300, 129));
  EXPECT_GT(a.mailbox_bytes(), 0u);
  EXPECT_EQ(direct.mailbox_bytes(), 0u);
  CallBuffers buf(300, 5120, 4, 6);
  uint64_t seed = 72000;
  int calls = 0;
  for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{96}, int64_t{97}, int64_t{128}, int64_t{129}, int64_t{300}}) {
    for (Variant v : variants()) {
      for (bool fin : {false, true}) {
        const Problem p = testing::make_problem(seed++, m, 5120, 4, 1, fin);
        const uint64_t want = run(direct, buf, p, v, Protocol::kAuto, "direct").hash();
        for (AllReduceMHC* op : {&a, &b, &c}) {
          for (Protocol proto : {Protocol::kOneShot, Protocol::kTwoShot}) {
            if (proto == Protocol::kOneShot && m > 128) continue;  // above the one-shot mailbox
            EXPECT_EQ(run(*op, buf, p, v, proto, protocol_name(proto)).hash(), want)
                << "M=" << m << " " << variant_name(v) << (fin ? " finalize " : " call ") << protocol_name(proto)
                << (op == &a ? " streaming" : op == &b ? " row per CTA" : " two launches");
            ++calls;
          }
          if (op == &a) {  // the NCCL fallback's path over the one-rank NCCL communicator
            EXPECT_EQ(run(*op, buf, p, v, Protocol::kNccl, "nccl").hash(), want)
                << "M=" << m << " " << variant_name(v) << (fin ? " finalize" : " call") << " nccl";
            ++calls;
          }
        }
      }
    }
  }
  // The NCCL fallback's path captured into a CUDA graph (its identity kernels and its two NCCL
  // operations), replayed with new inputs: right each time, and no error recorded (every
  // replay's identity is the call's: the op's call count is not part of it).
  {
    const Variant gv = variants().front();
    const Problem p0 = testing::make_problem(seed++, 8, 5120, 4, 1, false);
    run(a, buf, p0, gv, Protocol::kNccl, "nccl before the capture");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MHCCL_TEST_CUDA(cudaStreamBeginCapture(env().stream, cudaStreamCaptureModeThreadLocal));
    launch(a, p0, gv, Protocol::kNccl, buf, env().device, env().stream);
    MHCCL_TEST_CUDA(cudaStreamEndCapture(env().stream, &graph));
    MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      const Problem p = testing::make_problem(seed++, 8, 5120, 4, 1, false);
      upload(p, rank(), buf);
      MHCCL_TEST_CUDA(cudaGraphLaunch(exec, env().stream));
      MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
      EXPECT_EQ(check(p, gv, download(p, gv, buf)), "") << "nccl, graph replay " << rep;
      ++calls;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    EXPECT_NO_THROW(comm().check_errors());
  }
  // The automatic launch shape from kPollStreamingMinRows rows: the two-shot's publish and
  // owners' reduce (its CTAs capped at those resident, each looping over rows), then the
  // streaming consumer with no roles.
  {
    constexpr int64_t kBig = 1100;
    AllReduceMHCConfig big = config(5120, 4, kBig, 129);
    big.lamport_self_test = true;
    AllReduceMHC automatic(comm(), big), big_direct(comm(), config(5120, 4, kBig, 129));
    CallBuffers bbuf(kBig, 5120, 4, 6);
    // What makes the host take that shape here (else the comparison below would check the
    // CTA-per-row path): the streaming consumer can run, and the owners' resident CTAs are fewer
    // than the rows (the loop runs).
    const kernels::RowTiling t = kernels::row_tiling(640, kernels::kMaxSingleLaunchCtas + 1, 4);
    ASSERT_EQ(t.ctas_per_row, 1);
    for (Variant v : variants()) {
      EXPECT_GT(kernels::streaming_consumer_resident_ctas(4, kernels::ConsumerInput::kPoll, consumer_variant(v), 1,
                                                          t.threads), 0) << variant_name(v);
    }
    const int owners = kernels::owner_reduce_resident_ctas(t.threads);
    EXPECT_GT(owners, 0);
    EXPECT_LT(owners, kernels::kPollStreamingMinRows);
    for (int64_t m : {kernels::kPollStreamingMinRows, kBig}) {
      for (Variant v : variants()) {
        for (bool fin : {false, true}) {
          const Problem p = testing::make_problem(seed++, m, 5120, 4, 1, fin);
          const uint64_t want = run(big_direct, bbuf, p, v, Protocol::kAuto, "direct").hash();
          EXPECT_EQ(run(automatic, bbuf, p, v, Protocol::kTwoShot, "two-shot, automatic shape").hash(), want)
              << "M=" << m << " " << variant_name(v) << (fin ? " finalize" : " call") << " two-shot, automatic shape";
          ++calls;
        }
      }
    }
  }
  // finalize with top_k beyond one route group of 8 (the streaming publishers reduce the first
  // group with its loads in flight together and the later routes one at a time) and with a
  // single route, through the own mailbox against the direct path; then a bad route beyond the
  // first group, reported by the streaming publishers (check_errors) and skipped.
  for (const int top_k : {1, 10}) {
    AllReduceMHCConfig k_streaming = streaming, k_direct = config(5120, 4, 300, 129);
    k_streaming.top_k = k_direct.top_k = top_k;
    AllReduceMHC ks(comm(), k_streaming), kd(comm(), k_direct);
    CallBuffers kbuf(300, 5120, 4, top_k);
    for (int64_t m : {int64_t{2}, int64_t{97}, int64_t{128}, int64_t{300}}) {
      const Problem p = testing::make_problem(seed++, m, 5120, 4, 1, true, top_k);
      const uint64_t want = run(kd, kbuf, p, qv(), Protocol::kAuto, "direct").hash();
      for (Protocol proto : {Protocol::kOneShot, Protocol::kTwoShot}) {
        if (proto == Protocol::kOneShot && m > 128) continue;
        EXPECT_EQ(run(ks, kbuf, p, qv(), proto, protocol_name(proto)).hash(), want)
            << "top_k=" << top_k << " M=" << m << " finalize " << protocol_name(proto) << " streaming";
        ++calls;
      }
    }
    if (top_k == 10) {
      Problem p = testing::make_problem(seed++, 128, 5120, 4, 1, true, top_k);
      for (auto& routes : p.routes) routes[top_k + 9] = 1 << 20;  // row 1, route 9: far outside gemm2
      run(ks, kbuf, p, qv(), Protocol::kOneShot, "one-shot, bad route 9");
      try {
        comm().check_errors();
        ADD_FAILURE() << "the bad route beyond the first group was not reported (streaming publishers)";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidRoute) << e.what();
      }
    }
  }
  std::printf("TP=1: %d calls through the own mailbox, each equal to the direct path\n", calls);
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, GraphOfThreeCallsReplayed) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHC op(comm(), config(5120, 4, 128, 65));
  struct Slot { int64_t m; bool fin; Variant v; };
  // FP8 ops: the quantized variant at M = 3 (scale padding rows) and a finalize of 16 rows.
  const Slot slots[3] = {{3, false, fp8() ? qv() : Variant::kPlain}, {16, true, qv()}, {70, false, Variant::kResidualOnly}};
  std::vector<std::unique_ptr<CallBuffers>> bufs;
  std::vector<Problem> probs;
  for (const Slot& s : slots) {
    bufs.push_back(std::make_unique<CallBuffers>(s.m, 5120, 4, 6));
    probs.push_back(testing::make_problem(900 + s.m, s.m, 5120, 4, tp(), s.fin));
    upload(probs.back(), rank(), *bufs.back());
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MHCCL_TEST_CUDA(cudaStreamBeginCapture(env().stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) launch(op, probs[i], slots[i].v, Protocol::kAuto, *bufs[i], env().device, env().stream);
  MHCCL_TEST_CUDA(cudaStreamEndCapture(env().stream, &graph));
  MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  int bad = 0;
  for (int rep = 0; rep < 100; ++rep) {
    for (int i = 0; i < 3; ++i) {
      probs[i] = testing::make_problem(10000 + rep * 3 + i, slots[i].m, 5120, 4, tp(), slots[i].fin);
      upload(probs[i], rank(), *bufs[i]);
    }
    MHCCL_TEST_CUDA(cudaGraphLaunch(exec, env().stream));
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    for (int i = 0; i < 3; ++i) {
      const std::string err = check(probs[i], slots[i].v, download(probs[i], slots[i].v, *bufs[i]));
      if (!err.empty() && bad++ < 3) ADD_FAILURE() << "replay " << rep << " call " << i << ": " << err;
    }
  }
  EXPECT_EQ(bad, 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  comm().check_errors();
}

// The streaming consumers of the direct path (the call's, which takes its rows from the op's row
// tickets, PROTOCOL.md I10e, and TP=1's finalize; at TP > 1 the NCCL path's consumer) and the
// CTA-a-row kernel, alternating: calls of alternating M (below, at and beyond the
// streaming grid, whose rows then divide unevenly over its CTAs), call and finalize, every
// variant, back to back without a host sync (each kernel launched while the one before still
// runs, PDL), eagerly and as a graph replayed, each call's outputs poisoned before and checked
// against the reference after: a row left unwritten, or written from another call's inputs.
TEST_P(AllReduceMHCTest, StreamingCallsBackToBackAndReplayed) {
  MHCCL_REQUIRE_TP(tp());
  constexpr int64_t kCap = 600;
  AllReduceMHCConfig cfg = config(5120, 4, kCap, kCap + 1);
  cfg.two_shot_min_finalize_rows = kCap + 1;
  AllReduceMHC op(comm(), cfg);
  const Protocol proto = tp() == 1 ? Protocol::kAuto : Protocol::kNccl;
  struct Slot { int64_t m; bool fin; };
  const Slot slots[] = {{kCap, false}, {2, true}, {133, false}, {kCap, true}, {300, false}, {131, true}};
  constexpr int kSlots = sizeof(slots) / sizeof(slots[0]);
  std::vector<std::unique_ptr<CallBuffers>> bufs;
  std::vector<Problem> probs(kSlots);
  std::vector<Variant> vs(kSlots);
  const std::vector<Variant> all = variants();
  for (int i = 0; i < kSlots; ++i) bufs.push_back(std::make_unique<CallBuffers>(slots[i].m, 5120, 4, 6));
  auto fresh = [&](uint64_t seed) {
    for (int i = 0; i < kSlots; ++i) {
      vs[i] = all[(seed + i) % all.size()];
      probs[i] = testing::make_problem(seed * kSlots + i, slots[i].m, 5120, 4, tp(), slots[i].fin);
      upload(probs[i], rank(), *bufs[i]);  // outputs poisoned
    }
  };
  int bad = 0;
  auto verify = [&](const char* how, int rep) {
    uint64_t h = 0;
    for (int i = 0; i < kSlots; ++i) {
      const Outputs got = download(probs[i], vs[i], *bufs[i]);
      h = testing::fnv1a(&h, 8, got.hash());
      const std::string err = check(probs[i], vs[i], got);
      if (!err.empty() && bad++ < 3) {
        ADD_FAILURE() << how << " " << rep << ", call " << i << " (M=" << slots[i].m
                      << (slots[i].fin ? " finalize " : " call ") << variant_name(vs[i]) << "): " << err;
      }
    }
    EXPECT_TRUE(env().same_on_all_ranks(h, tp())) << how << " " << rep;
  };
  for (int rep = 0; rep < 8; ++rep) {  // eager, the calls back to back
    fresh(81000 + rep);
    env().barrier();
    for (int i = 0; i < kSlots; ++i) launch(op, probs[i], vs[i], proto, *bufs[i], env().device, env().stream);
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    verify("eager run", rep);
  }
  fresh(82000);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MHCCL_TEST_CUDA(cudaStreamBeginCapture(env().stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kSlots; ++i) launch(op, probs[i], vs[i], proto, *bufs[i], env().device, env().stream);
  MHCCL_TEST_CUDA(cudaStreamEndCapture(env().stream, &graph));
  MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 8; ++rep) {  // the variants stay as captured; the data is fresh
    for (int i = 0; i < kSlots; ++i) {
      probs[i] = testing::make_problem(83000 + rep * kSlots + i, slots[i].m, 5120, 4, tp(), slots[i].fin);
      upload(probs[i], rank(), *bufs[i]);
    }
    env().barrier();
    MHCCL_TEST_CUDA(cudaGraphLaunch(exec, env().stream));
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    verify("graph replay", rep);
  }
  EXPECT_EQ(bad, 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  comm().check_errors();
}

// The opt-in NCCL threshold: the automatic choice takes the NCCL path from nccl_min_rows (the
// same bits as one-shot at TP=2), and its buffer exists from construction, so the first call of
// the op may be under CUDA-graph capture.
TEST_P(AllReduceMHCTest, NcclOptInChosenAndCapturable) {
  MHCCL_REQUIRE_TP(tp());
  if (tp() == 1) GTEST_SKIP() << "TP=1 has no protocol choice";
  AllReduceMHCConfig cfg = config(5120, 4, 128, 129);
  cfg.nccl_min_rows = 65;
  cfg.nccl_min_finalize_rows = 100;
  AllReduceMHC op(comm(), cfg);
  EXPECT_EQ(op.protocol_for(64, false), Protocol::kOneShot);
  EXPECT_EQ(op.protocol_for(65, false), Protocol::kNccl);
  EXPECT_EQ(op.protocol_for(99, true), Protocol::kOneShot);
  EXPECT_EQ(op.protocol_for(100, true), Protocol::kNccl);
  // First call of the op: captured.
  CallBuffers b(128, 5120, 4, 6);
  Problem p = testing::make_problem(880, 128, 5120, 4, tp(), false);
  upload(p, rank(), b);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MHCCL_TEST_CUDA(cudaStreamBeginCapture(env().stream, cudaStreamCaptureModeThreadLocal));
  launch(op, p, qv(), Protocol::kAuto, b, env().device, env().stream);
  MHCCL_TEST_CUDA(cudaStreamEndCapture(env().stream, &graph));
  MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    p = testing::make_problem(881 + rep, 128, 5120, 4, tp(), false);
    upload(p, rank(), b);
    MHCCL_TEST_CUDA(cudaGraphLaunch(exec, env().stream));
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    const Outputs got = download(p, qv(), b);
    EXPECT_EQ(check(p, qv(), got), "") << "replay " << rep;
    EXPECT_TRUE(env().same_on_all_ranks(got.hash(), tp())) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // Eager, across the thresholds: auto equals forced one-shot bit for bit.
  for (int64_t m : {int64_t{64}, int64_t{65}, int64_t{128}}) {
    for (bool fin : {false, true}) {
      const Problem q = testing::make_problem(890 + m + fin, m, 5120, 4, tp(), fin);
      const Outputs a = run(op, b, q, qv(), Protocol::kAuto, "auto");
      const Outputs o = run(op, b, q, qv(), Protocol::kOneShot, "one-shot");
      EXPECT_EQ(a.hash(), o.hash()) << "M=" << m << (fin ? " finalize" : " call");
    }
  }
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, AlternatingMThousandCallsWithoutHostSync) {
  MHCCL_REQUIRE_TP(tp());
  // Small rows so that 1000 calls' inputs and outputs all stay on the device; two-shot from 65
  // rows, so the sequence crosses protocols too.
  constexpr int kCalls = 1000;
  constexpr int64_t kH = 512, kCap = 128;
  AllReduceMHC op(comm(), config(kH, 4, kCap, 65));
  std::mt19937_64 rng(4242);
  const int64_t pattern[] = {1, 64, 3, kCap, 7, 65, 2, 100};
  std::vector<Problem> probs;
  std::vector<Variant> variants;
  std::vector<std::unique_ptr<CallBuffers>> bufs;
  for (int c = 0; c < kCalls; ++c) {
    const int64_t m = c < 8 ? pattern[c] : 1 + static_cast<int64_t>(rng() % kCap);
    const bool fin = rng() % 3 == 0;
    const Variant choices[3] = {Variant::kPlain, qv(), Variant::kResidualOnly};
    variants.push_back(choices[rng() % 3]);
    probs.push_back(testing::make_problem(20000 + c, m, kH, 4, tp(), fin));
    bufs.push_back(std::make_unique<CallBuffers>(m, kH, 4, 6));
    upload(probs.back(), rank(), *bufs.back());
  }
  env().barrier();
  for (int c = 0; c < kCalls; ++c) {
    launch(op, probs[c], variants[c], Protocol::kAuto, *bufs[c], env().device, env().stream);
  }
  MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
  int bad = 0;
  uint64_t all = 0;
  for (int c = 0; c < kCalls; ++c) {
    const Outputs got = download(probs[c], variants[c], *bufs[c]);
    all = testing::fnv1a(&all, 8, got.hash());
    const std::string err = check(probs[c], variants[c], got);
    if (!err.empty() && bad++ < 3) ADD_FAILURE() << "call " << c << " M=" << probs[c].m << ": " << err;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(env().same_on_all_ranks(all, tp()));
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, OneRankDelayed) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHC op(comm(), config(5120, 4, 128, 65));
  CallBuffers b(128, 5120, 4, 6);
  for (int c = 0; c < 24; ++c) {
    const int64_t m = (c % 2) ? 1 + c : 100;
    const Problem p = testing::make_problem(30000 + c, m, 5120, 4, tp(), c % 3 == 0);
    upload(p, rank(), b);
    if (rank() == tp() - 1) MHCCL_TEST_CUDA(testing::launch_gpu_delay(100000 + 100000 * (c % 4), env().stream));
    launch(op, p, qv(), Protocol::kAuto, b, env().device, env().stream);
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    EXPECT_EQ(check(p, qv(), download(p, qv(), b)), "") << "call " << c;
  }
  comm().check_errors();
}

TEST_P(AllReduceMHCTest, RejectedCallsLeaveStateIntact) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHC op(comm(), config(5120, 4, 64, 33));
  CallBuffers b(64, 5120, 4, 6);
  const int dev = env().device;
  using testing::kBF16;
  using testing::kF32;
  using testing::kI32;
  using testing::kI64;
  using testing::kU8;
  // Each mutation breaks one argument of an otherwise valid call (or finalize) of M=8: every
  // error kind of the argument checks (tests/cpu/test_checks.cpp), here on a live communicator.
  using CallArgs = AllReduceMHCCallArgs;
  using FinArgs = AllReduceMHCFinalizeArgs;
  struct Bad {
    const char* what;
    bool finalize;
    std::function<void(CallArgs&, FinArgs&, std::vector<Desc>&)> mutate;
  };
  auto D = [&](std::vector<Desc>& keep, void* p, DLDataType t, std::vector<int64_t> s, int d = -1) {
    keep.emplace_back(p, t, std::move(s), d < 0 ? dev : d);
    return keep.back().get();
  };
  std::vector<Bad> bad = {
      {"x dtype", false, [&](auto& a, auto&, auto& k) { a.x = D(k, b.x, kF32, {8, 5120}); }},
      {"x shape", false, [&](auto& a, auto&, auto& k) { a.x = D(k, b.x, kBF16, {8, 5000}); }},
      {"x missing", false, [&](auto& a, auto&, auto&) { a.x = nullptr; }},
      {"M zero", false, [&](auto& a, auto&, auto& k) { a.x = D(k, b.x, kBF16, {0, 5120}); }},
      {"M above capacity", false, [&](auto& a, auto&, auto& k) { a.x = D(k, b.x, kBF16, {65, 5120}); }},
      {"x non-contiguous", false, [&](auto& a, auto&, auto& k) { D(k, b.x, kBF16, {8, 5120}); k.back().with_strides({10240, 1}); a.x = k.back().get(); }},  // the right shape: refused for its strides
      {"x misaligned", false, [&](auto& a, auto&, auto& k) { a.x = D(k, b.x + 8, kBF16, {8, 5120}); }},
      {"x without shape", false, [&](auto& a, auto&, auto& k) { D(k, b.x, kBF16, {8, 5120}); k.back().t.shape = nullptr; a.x = k.back().get(); }},
      {"residual_out byte offset", false, [&](auto& a, auto&, auto& k) { D(k, b.res_out, kBF16, {8, 4, 5120}); k.back().t.byte_offset = 2; a.epilogue.residual_out = k.back().get(); }},
      {"misaligned residual", false, [&](auto& a, auto&, auto& k) { a.epilogue.residual = D(k, b.residual + 2, kBF16, {8, 4, 5120}); }},
      {"residual on another device", false, [&](auto& a, auto&, auto& k) { a.epilogue.residual = D(k, b.residual, kBF16, {8, 4, 5120}, dev + 1); }},
      {"residual on the host", false, [&](auto& a, auto&, auto& k) { D(k, b.residual, kBF16, {8, 4, 5120}); k.back().t.device = DLDevice{kDLCPU, 0}; a.epilogue.residual = k.back().get(); }},
      {"residual shape", false, [&](auto& a, auto&, auto& k) { a.epilogue.residual = D(k, b.residual, kBF16, {8, 2, 5120}); }},
      {"residual dtype", false, [&](auto& a, auto&, auto& k) { a.epilogue.residual = D(k, b.residual, kF32, {8, 4, 5120}); }},
      {"post shape", false, [&](auto& a, auto&, auto& k) { a.epilogue.post = D(k, b.post, kF32, {8, 3}); }},
      {"post dtype", false, [&](auto& a, auto&, auto& k) { a.epilogue.post = D(k, b.post, kBF16, {8, 4}); }},
      {"post non-contiguous", false, [&](auto& a, auto&, auto& k) { D(k, b.post, kF32, {8, 4}); k.back().with_strides({8, 1}); a.epilogue.post = k.back().get(); }},
      {"comb shape", false, [&](auto& a, auto&, auto& k) { a.epilogue.comb = D(k, b.comb, kF32, {8, 4, 2}); }},
      {"comb misaligned", false, [&](auto& a, auto&, auto& k) { a.epilogue.comb = D(k, b.comb + 2, kF32, {8, 4, 4}); }},
      {"comb on another device", false, [&](auto& a, auto&, auto& k) { a.epilogue.comb = D(k, b.comb, kF32, {8, 4, 4}, dev + 1); }},
      {"pre shape", false, [&](auto& a, auto&, auto& k) { a.epilogue.pre = D(k, b.pre, kF32, {8, 4, 4}); }},
      {"norm_weight shape", false, [&](auto& a, auto&, auto& k) { a.epilogue.norm_weight = D(k, b.norm, kBF16, {5121}); }},
      {"pre without norm_weight", false, [&](auto& a, auto&, auto&) { a.epilogue.norm_weight = nullptr; }},
      {"norm_weight without pre", false, [&](auto& a, auto&, auto&) { a.epilogue.pre = nullptr; }},
      {"mxfp8 with residual-only", false, [&](auto& a, auto&, auto&) { a.epilogue.pre = a.epilogue.norm_weight = a.epilogue.layer_input = nullptr; }},
      {"mxfp8 values without scales", false, [&](auto& a, auto&, auto&) { a.epilogue.mxfp8_scales = nullptr; }},
      {"mxfp8 scales too small", false, [&](auto& a, auto&, auto& k) { a.epilogue.mxfp8_scales = D(k, b.scales, kU8, {16}); }},
      {"mxfp8 scales negative dims", false, [&](auto& a, auto&, auto& k) { a.epilogue.mxfp8_scales = D(k, b.scales, kU8, {-1, -mxfp8_scale_bytes(8, 5120)}); }},
      {"mxfp8 values shape", false, [&](auto& a, auto&, auto& k) { a.epilogue.mxfp8_values = D(k, b.values, kU8, {8, 2560}); }},
      {"mxfp8 values dtype", false, [&](auto& a, auto&, auto& k) { a.epilogue.mxfp8_values = D(k, b.values, kBF16, {8, 2560}); }},
      {"mxfp8 values e5m2", false, [&](auto& a, auto&, auto& k) { a.epilogue.mxfp8_values = D(k, b.values, DLDataType{12, 8, 1}, {8, 5120}); }},
      {"layer_input missing", false, [&](auto& a, auto&, auto&) { a.epilogue.layer_input = nullptr; }},
      {"layer_input given to residual-only", false, [&](auto& a, auto&, auto&) { a.epilogue.pre = a.epilogue.norm_weight = nullptr; a.epilogue.mxfp8_values = a.epilogue.mxfp8_scales = nullptr; a.epilogue.fp8_values = a.epilogue.fp8_scales = nullptr; }},
      {"eps negative", false, [&](auto& a, auto&, auto&) { a.epilogue.eps = -1.0f; }},
      {"eps NaN", false, [&](auto& a, auto&, auto&) { a.epilogue.eps = NAN; }},
      {"protocol out of range", false, [&](auto& a, auto&, auto&) { a.protocol = static_cast<Protocol>(7); }},
      // M=64 is above the one-shot mailbox's 32 rows (at TP=1, where protocols do not apply, x
      // then disagrees with the other tensors' 8 rows).
      {"one-shot forced above its rows", false, [&](auto& a, auto&, auto& k) { a.x = D(k, b.x, kBF16, {64, 5120}); a.protocol = tp() > 1 ? Protocol::kOneShot : Protocol::kAuto; }},
      {"finalize index dtype", true, [&](auto&, auto& f, auto& k) { f.expanded_idx_to_permuted_idx = D(k, b.routes, kI64, {8, 3}); }},
      {"finalize index missing", true, [&](auto&, auto& f, auto&) { f.expanded_idx_to_permuted_idx = nullptr; }},
      {"finalize top_k mismatch", true, [&](auto&, auto& f, auto& k) { f.expert_weights = D(k, b.weights, kF32, {8, 5}); }},
      {"finalize weights dtype", true, [&](auto&, auto& f, auto& k) { f.expert_weights = D(k, b.weights, kBF16, {8, 6}); }},
      {"finalize gemm2 shape", true, [&](auto&, auto& f, auto& k) { f.gemm2_permuted = D(k, b.gemm2, kBF16, {48, 2560}); }},
      {"finalize shared rows disagree", true, [&](auto&, auto& f, auto& k) { f.shared_output = D(k, b.shared, kBF16, {9, 5120}); }},
      {"finalize shared misaligned", true, [&](auto&, auto& f, auto& k) { f.shared_output = D(k, b.shared + 4, kBF16, {8, 5120}); }},
  };
  if (fp8()) {  // the FP8 outputs' errors in place of the MXFP8 ones (the valid call below has FP8 outputs)
    bad.erase(std::remove_if(bad.begin(), bad.end(), [](const Bad& k) { return std::string(k.what).rfind("mxfp8", 0) == 0; }),
              bad.end());
    const std::vector<Bad> fp8_bad = {
        {"fp8 with residual-only", false, [&](auto& a, auto&, auto&) { a.epilogue.pre = a.epilogue.norm_weight = a.epilogue.layer_input = nullptr; }},
        {"fp8 values without scales", false, [&](auto& a, auto&, auto&) { a.epilogue.fp8_scales = nullptr; }},
        {"fp8 scales without values", false, [&](auto& a, auto&, auto&) { a.epilogue.fp8_values = nullptr; }},
        {"fp8 with mxfp8 outputs", false, [&](auto& a, auto&, auto& k) { a.epilogue.mxfp8_values = D(k, b.values, kU8, {8, 5120}); a.epilogue.mxfp8_scales = D(k, b.scales, kU8, {mxfp8_scale_bytes(8, 5120)}); }},
        {"fp8 scales too small", false, [&](auto& a, auto&, auto& k) { a.epilogue.fp8_scales = D(k, b.scales, kF32, {16}); }},
        {"fp8 scales uint8", false, [&](auto& a, auto&, auto& k) { a.epilogue.fp8_scales = D(k, b.scales, kU8, {fp8_group_scale_bytes(8, 5120)}); }},
        {"fp8 scales misaligned", false, [&](auto& a, auto&, auto& k) { a.epilogue.fp8_scales = D(k, b.scales + 4, kF32, {40, 8}); }},
        {"fp8 scales on another device", false, [&](auto& a, auto&, auto& k) { a.epilogue.fp8_scales = D(k, b.scales, kF32, {40, 8}, dev + 1); }},
        {"fp8 scales negative dims", true, [&](auto&, auto& f, auto& k) { f.epilogue.fp8_scales = D(k, b.scales, kF32, {-40, -8}); }},
        {"fp8 values shape", false, [&](auto& a, auto&, auto& k) { a.epilogue.fp8_values = D(k, b.values, kU8, {8, 2560}); }},
        {"fp8 values e5m2", true, [&](auto&, auto& f, auto& k) { f.epilogue.fp8_values = D(k, b.values, DLDataType{12, 8, 1}, {8, 5120}); }},
    };
    bad.insert(bad.end(), fp8_bad.begin(), fp8_bad.end());
  }
  uint64_t seed = 40000;
  int rejected = 0;
  for (const Bad& k : bad) {
    run(op, b, testing::make_problem(seed++, 8, 5120, 4, tp(), seed % 2 == 0), qv(), Protocol::kAuto, "before");
    Desc x(b.x, kBF16, {8, 5120}, dev), res(b.residual, kBF16, {8, 4, 5120}, dev),
        post(b.post, kF32, {8, 4}, dev), comb(b.comb, kF32, {8, 4, 4}, dev),
        pre(b.pre, kF32, {8, 4}, dev), norm(b.norm, kBF16, {5120}, dev),
        out(b.res_out, kBF16, {8, 4, 5120}, dev), li(b.layer, kBF16, {8, 5120}, dev),
        val(b.values, kU8, {8, 5120}, dev), sc(b.scales, kU8, {mxfp8_scale_bytes(8, 5120)}, dev),
        g2(b.gemm2, kBF16, {48, 5120}, dev), w(b.weights, kF32, {8, 6}, dev),
        rt(b.routes, kI32, {8, 6}, dev), sh(b.shared, kBF16, {8, 5120}, dev);
    CallArgs a;
    a.x = x.get();
    a.epilogue = {res.get(), post.get(), comb.get(), pre.get(), norm.get(), 1e-6f, out.get(), li.get(), val.get(), sc.get()};
    Desc fsc(b.scales, kF32, {40, 8}, dev);  // FP8 scales of M = 8: [G, Mp]
    if (fp8()) {
      a.epilogue.mxfp8_values = a.epilogue.mxfp8_scales = nullptr;
      a.epilogue.fp8_values = val.get();
      a.epilogue.fp8_scales = fsc.get();
    }
    FinArgs f;
    f.gemm2_permuted = g2.get();
    f.expert_weights = w.get();
    f.expanded_idx_to_permuted_idx = rt.get();
    f.shared_output = sh.get();
    f.epilogue = a.epilogue;
    std::vector<Desc> keep;
    keep.reserve(4);
    k.mutate(a, f, keep);
    const uint32_t counted = comm().rejected_calls();
    // The first rejection with a CUDA error left pending by an earlier call of this thread (an
    // allocation that failed): its count goes out all the same and the communicator stays usable
    // (the count's launch reports its own status, not the pending error).
    void* too_big = nullptr;
    if (rejected == 0) EXPECT_NE(cudaMalloc(&too_big, size_t{1} << 50), cudaSuccess);
    if (k.finalize) {
      EXPECT_THROW(op.finalize(f, env().stream), Error) << k.what;
    } else {
      EXPECT_THROW(op.call(a, env().stream), Error) << k.what;
    }
    if (rejected == 0) {
      EXPECT_TRUE(comm().usable()) << k.what;
      cudaGetLastError();  // whatever of the failed allocation is still pending
    }
    // Counted once (the call identity carries the count: every rank rejected it alike here, so
    // the next call's identities agree and it runs: PROTOCOL.md, I19).
    EXPECT_EQ(comm().rejected_calls(), counted + 1) << k.what;
    ++rejected;
    run(op, b, testing::make_problem(seed++, 8, 5120, 4, tp(), true), qv(), Protocol::kAuto, "after");
  }
  std::printf("TP=%d: %d kinds of bad call rejected, each between two checked calls\n", tp(), rejected);
  comm().check_errors();
  // The count the calls carry (the device word beside this rank's fault word) is the host's:
  // every rejection above advanced it on the call's stream.
  uint32_t device_count = 0;
  MHCCL_TEST_CUDA(cudaMemcpy(&device_count, comm().impl()->rejected_word(), sizeof(device_count), cudaMemcpyDeviceToHost));
  EXPECT_EQ(device_count, comm().rejected_calls());
}

TEST_P(AllReduceMHCTest, InvalidRouteIsSkippedAndReported) {
  MHCCL_REQUIRE_TP(tp());
  // One bad route (row 1, route k), on the CTA-per-row paths (M = 5: a single launch at TP > 1;
  // M = 133: publish + a CTA per row) and the streaming ones (TP=1: the direct finalize
  // consumer; TP > 1: the one-shot's publishing CTAs), in the first group of 8 routes and, at
  // top_k = 10, beyond it. M = 600 streaming: a bad route in every seventh row from row 1, so
  // that the streaming consumers' later rows of a CTA (TP=1: up to five, the route ring's
  // every entry) skip it too.
  struct Case { int64_t m; bool streaming; int top_k, k; int64_t every; };
  for (const Case c : {Case{5, false, 6, 1, 0}, Case{133, false, 6, 1, 0}, Case{133, true, 6, 1, 0},
                       Case{133, true, 10, 1, 0}, Case{133, true, 10, 9, 0}, Case{600, true, 6, 3, 7}}) {
    AllReduceMHCConfig cfg = config(5120, 4, 600, 601);
    cfg.top_k = c.top_k;
    cfg.streaming_min_rows = c.streaming ? 2 : 0;
    AllReduceMHC op(comm(), cfg);
    CallBuffers b(600, 5120, 4, c.top_k);
    Problem p = testing::make_problem(50000 + c.m + c.top_k + c.k, c.m, 5120, 4, tp(), true, c.top_k);
    for (auto& routes : p.routes) {  // far outside gemm2
      for (int64_t row = 1; row < c.m; row += c.every > 0 ? c.every : c.m) routes[row * c.top_k + c.k] = 1 << 20;
    }
    const std::string what = "M=" + std::to_string(c.m) + (c.streaming ? " streaming" : " CTA per row") +
                             " top_k=" + std::to_string(c.top_k) + " bad route " + std::to_string(c.k);
    run(op, b, p, fp8() ? qv() : Variant::kPlain, Protocol::kAuto, what.c_str());
    try {
      comm().check_errors();
      ADD_FAILURE() << "the bad route was not reported: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidRoute) << e.what();
      EXPECT_NE(std::string(e.what()).find("1048576"), std::string::npos) << e.what();
    }
    comm().check_errors();  // reported once; the communicator stays usable
    run(op, b, testing::make_problem(50100 + c.m + c.top_k, c.m, 5120, 4, tp(), true, c.top_k),
        fp8() ? qv() : Variant::kPlain,
        Protocol::kAuto, "after");
  }
}

// The ops' serial numbers (Communicator::Impl::ops_agreed, which the NCCL fallback's identity
// carries: PROTOCOL.md I19): one more at each op whose agreement passed, whatever its kind; none
// for a construction every rank refused (an invalid hc); numbers are not reused after an op is
// destroyed. Equal on every rank.
TEST_P(AllReduceMHCTest, OpsNumberedInConstructionOrder) {
  MHCCL_REQUIRE_TP(tp());
  if (fp8()) GTEST_SKIP() << "runs in the MXFP8 instance";
  Communicator::Impl& c = *comm().impl();
  const uint32_t before = c.ops_agreed;
  EXPECT_GE(before, 1u) << "the communicator's own agreement";
  {
    AllReduceMHC a(comm(), config(5120, 4, 64, 65));
    EXPECT_EQ(c.ops_agreed, before + 1);
    LamportAllGather g(comm(), 4096);
    EXPECT_EQ(c.ops_agreed, before + 2);
    EXPECT_THROW(AllReduceMHC(comm(), config(5120, 3, 64, 65)), Error);
    EXPECT_EQ(c.ops_agreed, before + 2);
    AllReduceMHC b(comm(), config(5120, 4, 64, 65));
    EXPECT_EQ(c.ops_agreed, before + 3);
  }
  AllReduceMHC d(comm(), config(5120, 4, 64, 65));
  EXPECT_EQ(c.ops_agreed, before + 4);
  EXPECT_TRUE(env().same_on_all_ranks(c.ops_agreed, tp()));
  EXPECT_TRUE(comm().usable());
}

// Names: tp1, tp2 (MXFP8 ops, as before the FP8 variant), tp1_fp8, tp1_fp8ue8m0, tp2_fp8, ...
INSTANTIATE_TEST_SUITE_P(Tp, AllReduceMHCTest,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(Quant::kMxfp8, Quant::kFp8, Quant::kFp8Ue8m0)),
                         [](const auto& info) {
                           const Quant q = std::get<1>(info.param);
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (q == Quant::kMxfp8 ? "" : q == Quant::kFp8 ? "_fp8" : "_fp8ue8m0");
                         });

// A rank that never publishes: the other gets Error(kPeerTimeout) naming it within the budget.
// Twice, each on a fresh communicator: a single-launch call (M = 4), and a streaming one-shot
// call (M = 64, its publishing CTAs in the same grid as the waiting ones).
TEST(PeerTimeout, ReportedNamingThePeer) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!env().world) GTEST_SKIP() << "needs 2 ranks: run under mhccl-launch -n 2";
  for (const bool streaming : {false, true}) {
    CommunicatorOptions o;
    o.wait_timeout_ms = 1000;
    std::unique_ptr<Communicator> c = make_world_communicator(o);
    if (!c->peers_reachable()) GTEST_SKIP() << "peers not load/store reachable: no Lamport waits";
    {
      AllReduceMHCConfig cfg = config(5120, 4, 64, 65);
      if (streaming) cfg.streaming_min_rows = 2;
      AllReduceMHC op(*c, cfg);
      CallBuffers b(64, 5120, 4, 6);
      const int tp = c->tp();
      const int64_t m = streaming ? 64 : 4;
      if (c->rank() == 0) {
        const Problem p = testing::make_problem(60000 + m, m, 5120, 4, tp, false);
        upload(p, 0, b);
        const auto t0 = std::chrono::steady_clock::now();
        launch(op, p, Variant::kPlain, Protocol::kAuto, b, env().device, env().stream);
        MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_LT(s, 10.0) << (streaming ? "streaming" : "single launch");
        try {
          c->check_errors();
          ADD_FAILURE() << "no timeout reported" << (streaming ? " (streaming)" : " (single launch)");
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kPeerTimeout) << e.what();
          EXPECT_NE(std::string(e.what()).find("waited for rank 1"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(c->usable());
        try {
          launch(op, p, Variant::kPlain, Protocol::kAuto, b, env().device, env().stream);
          ADD_FAILURE() << "an unusable communicator took a call";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kUnusable) << e.what();
        }
      }
      env().barrier();
    }
    env().barrier();
  }
}

// Construction agrees on the configuration (PROTOCOL.md I12c): rank 1 builds with another
// max_num_tokens, then with another two-shot threshold, then with an invalid hc: every rank
// throws (no hang, no window registered with sizes that differ), naming the field; then the
// same communicator builds a matching op and runs a checked call.
TEST(ConfigAgreement, MismatchThrowsOnEveryRankNamingTheField) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!env().world) GTEST_SKIP() << "needs 2 ranks: run under mhccl-launch -n 2";
  Communicator& c = *env().world;
  const bool odd = c.rank() == 1;
  struct Case {
    const char* field;
    AllReduceMHCConfig cfg;
  };
  AllReduceMHCConfig capacity = config(5120, 4, odd ? 96 : 64, 65);
  AllReduceMHCConfig threshold = config(5120, 4, 64, odd ? 33 : 65);
  AllReduceMHCConfig invalid = config(5120, odd ? 3 : 4, 64, 65);
  for (const Case& k : {Case{"max_num_tokens", capacity}, Case{"two_shot_min_rows", threshold}, Case{"hc", invalid}}) {
    try {
      AllReduceMHC op(c, k.cfg);
      ADD_FAILURE() << "rank " << c.rank() << ": a mismatched " << k.field << " was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(e.is_argument_error()) << e.what();
      const std::string msg = e.what();
      if (std::string(k.field) != "hc") {
        EXPECT_NE(msg.find(k.field), std::string::npos) << msg;
      } else if (odd) {
        EXPECT_NE(msg.find("hc"), std::string::npos) << msg;  // its own check's message
      } else {
        EXPECT_NE(msg.find("another rank's configuration is invalid"), std::string::npos) << msg;
      }
    }
  }
  EXPECT_TRUE(c.usable());
  AllReduceMHC op(c, config(5120, 4, 64, 65));
  CallBuffers b(8, 5120, 4, 6);
  const Problem p = testing::make_problem(61000, 8, 5120, 4, c.tp(), false);
  upload(p, c.rank(), b);
  launch(op, p, Variant::kResidualOnly, Protocol::kAuto, b, env().device, env().stream);
  MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
  EXPECT_EQ(testing::check(p, Variant::kResidualOnly, download(p, Variant::kResidualOnly, b)), "");
  env().barrier();
}

// The NCCL fallback's call identity (PROTOCOL.md I19), on two GPUs with the fallback forced, for
// the call, the finalize and the all-gather, each on a fresh communicator: two checked calls;
// a call rejected on every rank alike (no error, the next call right on both); then rank 1
// rejects its call 4 (and catches it) while rank 0's goes through, and both make one more call.
// Rank 0's call 4 pairs with rank 1's call 5 in NCCL: both ranks report an error, neither returns
// a wrong value without one. Rank 1's call completed on rank 0's data: kDivergence naming rank 0
// at the op's fallback call 3. Rank 0 records the same divergence; the harness's upload of its
// next call synchronizes the device, so it throws it there before launching (were it launched,
// that call would have no partner and the watchdog would end its wait; check() would still
// report the divergence first). Before I19
// reached the fallback, rank 1 summed rank 0's call 4 into its call 5 with no error. Last, two
// ops of one configuration called in the opposite order on the two ranks: each call pairs in
// NCCL with the other op's, and both ranks report kDivergence (the ops' serial numbers differ).
TEST(NcclFallback, CallRejectedOnOneRankGetsAnError) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!env().world) GTEST_SKIP() << "needs 2 ranks: run under mhccl-launch -n 2";
  enum class Kind { kCall, kFinalize, kAllGather, kSwappedOps };
  for (const Kind kind : {Kind::kCall, Kind::kFinalize, Kind::kAllGather, Kind::kSwappedOps}) {
    const char* what = kind == Kind::kCall ? "call" : kind == Kind::kFinalize ? "finalize"
                       : kind == Kind::kAllGather ? "all-gather" : "two ops in opposite orders";
    SCOPED_TRACE(what);
    CommunicatorOptions o;
    o.wait_timeout_ms = 2000;
    o.force_nccl_fallback = true;
    std::unique_ptr<Communicator> c = make_world_communicator(o);
    const int tp = c->tp(), rank = c->rank();
    ASSERT_FALSE(c->peers_reachable()) << "the fallback was forced";
    const bool fin = kind == Kind::kFinalize;
    AllReduceMHC op(*c, config(5120, 4, 64, 65));
    LamportAllGather ag(*c, 4096);
    AllReduceMHC other(*c, config(5120, 4, 64, 65));  // kSwappedOps: the same configuration as `op`
    CallBuffers b(80, 5120, 4, 6);
    testing::DeviceBuffer d_in(4096 + 64), d_out(8 * (4096 + 64));
    // One call (seed `seed`) of `on`: launched, not synchronized. `bad`: one this rank rejects (M
    // above the capacity, or bytes above it).
    auto issue = [&](uint64_t seed, bool bad, AllReduceMHC& on) {
      if (kind == Kind::kAllGather) {
        const int64_t bytes = bad ? 4096 + 16 : 1024;
        std::vector<uint8_t> in(static_cast<size_t>(bytes));
        std::mt19937_64 rng(seed * 7 + rank);
        for (auto& v : in) v = static_cast<uint8_t>(rng());
        d_in.upload(in);
        Desc din(d_in.get(), testing::kU8, {bytes}, env().device);
        Desc dout(d_out.get(), testing::kU8, {bytes * tp}, env().device);
        ag.call(din.t, dout.t, env().stream);
      } else {
        const Problem p = testing::make_problem(seed, bad ? 65 : 8, 5120, 4, tp, fin);
        upload(p, rank, b);
        launch(on, p, Variant::kPlain, Protocol::kAuto, b, env().device, env().stream);
      }
    };
    // Whether the last good call of seed `seed` is right on this rank.
    auto right = [&](uint64_t seed) {
      if (kind == Kind::kAllGather) {
        std::vector<uint8_t> want;
        for (int r = 0; r < tp; ++r) {
          std::mt19937_64 rng(seed * 7 + r);
          for (int i = 0; i < 1024; ++i) want.push_back(static_cast<uint8_t>(rng()));
        }
        return d_out.download<uint8_t>(want.size()) == want;
      }
      const Problem p = testing::make_problem(seed, 8, 5120, 4, tp, fin);
      return check(p, Variant::kPlain, download(p, Variant::kPlain, b)).empty();
    };
    const uint64_t base = 62000 + 100 * static_cast<uint64_t>(kind);
    for (uint64_t i = 0; i < 2; ++i) {
      issue(base + i, false, op);
      MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
      EXPECT_TRUE(right(base + i)) << "call " << i;
    }
    EXPECT_THROW(issue(base + 10, true, op), Error) << "rejected on every rank";
    issue(base + 2, false, op);
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    EXPECT_TRUE(right(base + 2)) << "after a call rejected on every rank";
    EXPECT_NO_THROW(c->check_errors());
    const auto t0 = std::chrono::steady_clock::now();
    bool raised = false;
    ErrorCode code = ErrorCode::kInvalidArgument;
    int peer = -2;
    int64_t call = -2;
    auto caught = [&](const Error& e) {
      raised = true;
      code = e.code();
      peer = e.peer();
      call = e.call_index();
      std::printf("rank %d, %s: %s\n", rank, what, e.what());
    };
    if (kind == Kind::kSwappedOps) {  // op then other on rank 0, other then op on rank 1
      try {
        issue(base + 3, false, rank == 0 ? op : other);
        issue(base + 4, false, rank == 0 ? other : op);
      } catch (const Error& e) {
        caught(e);
      }
    } else {
      // Rank 1 rejects its call 4; rank 0's goes through. Then both make one more.
      if (rank == 1) {
        EXPECT_THROW(issue(base + 3, true, op), Error);
      } else {
        issue(base + 3, false, op);
      }
      try {
        issue(base + 4, false, op);  // rank 0 may already hold the divergence and throw it here
      } catch (const Error& e) {
        caught(e);
      }
    }
    // Rank 0's last call: bounded by the watchdog, which aborts the NCCL communicator (the
    // synchronization's status aside, as in dead_peer.cpp: an abort may leave one).
    cudaStreamSynchronize(env().stream);
    cudaGetLastError();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 20.0);
    if (!raised) {
      try {
        c->check_errors();
      } catch (const Error& e) {
        caught(e);
      }
    }
    EXPECT_TRUE(raised) << "rank " << rank << ": no error after its calls stopped pairing";
    EXPECT_EQ(code, ErrorCode::kDivergence) << "rank " << rank;
    if (code == ErrorCode::kDivergence) {
      EXPECT_EQ(peer, 1 - rank);
      // The op's fallback calls before it: 3 (the rejections made none); swapped: the first of
      // the two, call 3 of `op` on rank 0 and call 0 of `other` on rank 1.
      EXPECT_EQ(call, kind == Kind::kSwappedOps && rank == 1 ? 0 : 3) << "rank " << rank;
    }
    EXPECT_FALSE(c->usable());
    env().barrier();
  }
}

}  // namespace
}  // namespace mhccl::gputest
