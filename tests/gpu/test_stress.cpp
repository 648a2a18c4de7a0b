// Stress (issues 5 and 7): thousands of calls in one sequence, every one checked against the CPU
// reference. M drawn at random in [1, capacity] so that calls cross the one-shot/two-shot
// threshold back and forth; the variant (the per-token-group FP8 ones on ops of their own),
// call/finalize and all-gathers interleaved on the same communicator drawn at random; inputs with -0.0, +0.0, subnormals of both signs, Inf and NaN;
// a random rank delayed before random calls; batches run eagerly and as one CUDA graph (PDL on),
// with no host synchronization inside a batch. Every rank draws the same sequence from one seed
// and checks every rank's result, and the ranks' output hashes must agree.
//
// MHCCL_STRESS_CALLS sets the number of calls at TP=2 (default 10,000); TP=1 runs a fifth.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/mhc_harness.h"
#include "common/tensor_desc.h"
#include "gpu_env.h"
#include "mhccl/all_gather.h"
#include "mhccl/reference.h"

namespace mhccl::gputest {
namespace {

using testing::CallBuffers;
using testing::Desc;
using testing::DeviceBuffer;
using testing::Problem;
using testing::Variant;

constexpr int64_t kH = 512;
constexpr int kHc = 4;
constexpr int64_t kCap = 256;
constexpr int64_t kTwoShotMin = 100;  // calls and finalizes of >= 100 rows go two-shot
constexpr int kBatch = 50;            // calls between host synchronizations
constexpr int64_t kGatherCap = 64 << 10;

int64_t stress_calls(int tp) {
  int64_t n = 10000;
  if (const char* s = std::getenv("MHCCL_STRESS_CALLS")) n = std::max<long long>(1, std::atoll(s));
  return tp == 1 ? std::max<int64_t>(1, n / 5) : n;
}

// -0.0, +0.0, subnormals of both signs, +-Inf, NaNs with and without sign and payload.
constexpr uint16_t kSpecials[] = {0x8000, 0x0000, 0x8001, 0x0001, 0x807F, 0x007F,
                                  0x7F80, 0xFF80, 0x7FC0, 0xFFC1};

void sprinkle(std::mt19937_64& rng, std::vector<uint16_t>& v, int count) {
  for (int i = 0; i < count && !v.empty(); ++i) {
    v[rng() % v.size()] = kSpecials[rng() % (sizeof kSpecials / sizeof kSpecials[0])];
  }
}

// One entry of a batch: an AllReduceMHC call/finalize, or an all-gather.
struct Entry {
  bool gather = false;
  Problem p;
  Variant v = Variant::kPlain;
  std::vector<std::vector<uint8_t>> gather_in;  // [tp][bytes]
  int delayed_rank = -1;
  uint64_t delay_ns = 0;
};

Entry draw(std::mt19937_64& rng, uint64_t seed, int tp) {
  Entry e;
  if (rng() % 6 == 0) {
    e.gather = true;
    const int64_t bytes = 16 * (1 + static_cast<int64_t>(rng() % (kGatherCap / 16)));
    e.gather_in.resize(tp);
    for (int r = 0; r < tp; ++r) {
      e.gather_in[r].resize(bytes);
      std::mt19937_64 g(seed * 7 + r);
      for (int64_t i = 0; i < bytes; i += 8) {
        const uint64_t w = g();
        std::memcpy(e.gather_in[r].data() + i, &w, 8);
      }
      for (int i = 0; i < 4; ++i) {  // sentinel words and -0.0 among them
        const uint32_t s = i % 2 ? 0x80000000u : 0u;
        std::memcpy(e.gather_in[r].data() + 4 * (g() % (bytes / 4)), &s, 4);
      }
    }
  } else {
    const uint64_t c = rng() % 4;  // half small, a quarter each side of the threshold
    const int64_t m = c < 2 ? 1 + static_cast<int64_t>(rng() % 16)
                    : c == 2 ? 17 + static_cast<int64_t>(rng() % (kTwoShotMin - 17))
                             : kTwoShotMin + static_cast<int64_t>(rng() % (kCap - kTwoShotMin + 1));
    const bool fin = rng() % 2 == 0;
    e.v = static_cast<Variant>(rng() % 5);  // the FP8 variants on their own ops (below)
    e.p = testing::make_problem(seed, m, kH, kHc, tp, fin);
    std::mt19937_64 s(seed ^ 0x5bd1e995u);
    if (s() % 2 == 0) {  // specials in the reduced inputs and the residual streams
      for (auto& x : fin ? e.p.gemm2 : e.p.x) sprinkle(s, x, 1 + static_cast<int>(s() % 8));
      if (fin) for (auto& x : e.p.shared) sprinkle(s, x, static_cast<int>(s() % 3));
      sprinkle(s, e.p.residual, static_cast<int>(s() % 4));
    }
    if (!fin && s() % 8 == 0) {  // a row of -0.0 on every rank: the sum is +0.0
      const int64_t row = static_cast<int64_t>(s() % m);
      for (auto& x : e.p.x) std::fill(x.begin() + row * kH, x.begin() + (row + 1) * kH, uint16_t(0x8000));
    }
  }
  if (tp > 1 && rng() % 5 == 0) {
    e.delayed_rank = static_cast<int>(rng() % tp);
    e.delay_ns = 2000 + rng() % 50000;
  }
  return e;
}

class Stress : public ::testing::TestWithParam<int> {
 protected:
  int tp() const { return GetParam(); }
  Communicator& comm() { return *env().comm(tp()); }
  int rank() { return env().rank(tp()); }
};

TEST_P(Stress, RandomCallsAllVariantsSpecialsGraphsDelaysAndGathers) {
  MHCCL_REQUIRE_TP(tp());
  AllReduceMHCConfig cfg;
  cfg.hidden_size = kH;
  cfg.hc_mult = kHc;
  cfg.max_num_tokens = kCap;
  cfg.top_k = 6;
  cfg.quantize_layer_input = true;
  cfg.residual_only = true;
  cfg.two_shot_min_rows = kTwoShotMin;
  cfg.two_shot_min_finalize_rows = kTwoShotMin;
  // The streaming consumer from 48 rows (at TP=2 the one-shot from 48 to 99 rows with its
  // publishing CTAs, two-shot above), the single launch up to 32: every consumer kind runs.
  cfg.streaming_min_rows = 48;
  cfg.single_launch_max_rows = 32;
  AllReduceMHC op(comm(), cfg);
  // The per-token-group FP8 variants (without and with UE8M0 scales) on ops of their own, on the
  // same communicator, interleaved with the others.
  AllReduceMHCConfig fp8_cfg = cfg, ue8m0_cfg = cfg;
  testing::build_quant(fp8_cfg, testing::Quant::kFp8);
  testing::build_quant(ue8m0_cfg, testing::Quant::kFp8Ue8m0);
  AllReduceMHC fp8_op(comm(), fp8_cfg), ue8m0_op(comm(), ue8m0_cfg);
  auto op_for = [&](Variant v) -> AllReduceMHC& {
    return v == Variant::kFp8 ? fp8_op : v == Variant::kFp8Ue8m0 ? ue8m0_op : op;
  };
  LamportAllGather ag(comm(), kGatherCap);
  std::vector<std::unique_ptr<CallBuffers>> bufs;
  std::vector<DeviceBuffer> gin, gout;
  for (int i = 0; i < kBatch; ++i) {
    bufs.push_back(std::make_unique<CallBuffers>(kCap, kH, kHc, 6));
    gin.emplace_back(kGatherCap);
    gout.emplace_back(kGatherCap * tp());
  }
  const int64_t calls = stress_calls(tp());
  std::mt19937_64 rng(777);  // the same sequence on every rank
  int64_t done = 0, checked = 0, gathers = 0, two_shot = 0, graphs = 0;
  int bad = 0;
  for (int64_t batch = 0; done < calls; ++batch) {
    const int n = static_cast<int>(std::min<int64_t>(kBatch, calls - done));
    std::vector<Entry> es;
    for (int i = 0; i < n; ++i) es.push_back(draw(rng, 1000003 * (batch + 1) + i, tp()));
    for (int i = 0; i < n; ++i) {
      if (es[i].gather) {
        gin[i].upload(es[i].gather_in[rank()]);
        gout[i].poison();
      } else {
        testing::upload(es[i].p, rank(), *bufs[i]);
      }
    }
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
    const bool as_graph = batch % 2 == 1;
    cudaGraph_t graph = nullptr;
    if (as_graph) MHCCL_TEST_CUDA(cudaStreamBeginCapture(env().stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; ++i) {
      const Entry& e = es[i];
      if (e.delayed_rank == rank()) MHCCL_TEST_CUDA(testing::launch_gpu_delay(e.delay_ns, env().stream));
      if (e.gather) {
        const int64_t bytes = static_cast<int64_t>(e.gather_in[0].size());
        Desc din(gin[i].get(), testing::kU8, {bytes}, env().device);
        Desc dout(gout[i].get(), testing::kU8, {bytes * tp()}, env().device);
        ag.call(din.t, dout.t, env().stream);
      } else {
        testing::launch(op_for(e.v), e.p, e.v, Protocol::kAuto, *bufs[i], env().device, env().stream);
      }
    }
    if (as_graph) {
      MHCCL_TEST_CUDA(cudaStreamEndCapture(env().stream, &graph));
      cudaGraphExec_t exec = nullptr;
      MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      MHCCL_TEST_CUDA(cudaGraphLaunch(exec, env().stream));
      MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      ++graphs;
    }
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    comm().check_errors();
    uint64_t hash = 0;
    for (int i = 0; i < n; ++i) {
      const Entry& e = es[i];
      std::string err;
      uint64_t h = 0;
      if (e.gather) {
        const int64_t bytes = static_cast<int64_t>(e.gather_in[0].size());
        const std::vector<uint8_t> got = gout[i].download<uint8_t>(bytes * tp());
        std::vector<const uint8_t*> ptrs;
        for (auto& v : e.gather_in) ptrs.push_back(v.data());
        std::vector<uint8_t> want(got.size());
        reference::all_gather(ptrs, bytes, want.data());
        if (got != want) err = "all-gather of " + std::to_string(bytes) + " bytes differs";
        h = testing::fnv1a(got.data(), got.size());
        ++gathers;
      } else {
        const testing::Outputs got = testing::download(e.p, e.v, *bufs[i]);
        err = testing::check(e.p, e.v, got);
        h = got.hash();
        two_shot += op.protocol_for(e.p.m, e.p.finalize) == Protocol::kTwoShot;
      }
      hash = testing::fnv1a(&h, 8, hash);
      ++checked;
      if (!err.empty() && bad++ < 5) {
        ADD_FAILURE() << "batch " << batch << " entry " << i << (as_graph ? " (graph)" : " (eager)")
                      << (e.gather ? " all-gather" : e.p.finalize ? " finalize" : " call")
                      << " M=" << e.p.m << " " << (e.gather ? "" : testing::variant_name(e.v)) << ": " << err;
      }
    }
    EXPECT_TRUE(env().same_on_all_ranks(hash, tp())) << "ranks differ in batch " << batch;
    done += n;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(checked, calls);
  std::printf("stress TP=%d: %lld calls checked (%lld all-gathers, %lld two-shot), %lld batches as graphs\n",
              tp(), static_cast<long long>(checked), static_cast<long long>(gathers),
              static_cast<long long>(two_shot), static_cast<long long>(graphs));
  comm().check_errors();
}

INSTANTIATE_TEST_SUITE_P(Tp, Stress, ::testing::Values(1, 2),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

}  // namespace
}  // namespace mhccl::gputest
