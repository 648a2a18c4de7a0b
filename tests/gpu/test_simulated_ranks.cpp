// TP = 2, 4 and 8 simulated on one GPU, at the kernel level: R "ranks", each with its own
// mailboxes, generation state, call buffers and stream, run the AllReduceMHC kernels against one
// another, and every rank's outputs are checked against the CPU reference and compared across
// ranks. What it checks that TP=1 cannot: the rank-dependent arithmetic of the protocols (slot
// order, rotated targets, owners and owned rows, the owners' reduce, the resets of each rank's
// slots) at every tp the library supports, without a machine of that many GPUs. What it
// cannot: NVLink (every "peer" is memory of the one device) and timing.
//
// The paths, for one-shot and two-shot, call and finalize, every variant:
//  - phased: the publish kernels of every rank, then (two-shot) the owners' reduce, then the
//    CTA-per-row consumers, a device synchronization between phases;
//  - streaming: one launch per rank, the roles by arrival (publishers, owners, consumers), all
//    ranks' grids at once (each 1/R of the device's resident CTAs, so all fit together);
//  - single launch (one-shot, M of a few rows: every rank's grid fits the device at once);
//  - owners then streaming (two-shot, as the host runs it from 1024 rows): the publish kernels,
//    the owners' reduce with a capped grid (3 CTAs a rank, each looping over its owned rows),
//    then the streaming consumer with no roles, a device synchronization between phases.
// The host-side choice between them (src/ops/all_reduce_mhc.cpp) runs in the other tests.
// Likewise the all-gather kernel.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "common/mhc_harness.h"
#include "common/sim_ranks.h"
#include "gpu_env.h"
#include "kernels/launch.h"
#include "kernels/params.h"
#include "mhccl/fp8_groups.h"

namespace mhccl::gputest {
namespace {

using namespace kernels;
using namespace sim;
using testing::CallBuffers;
using testing::DeviceBuffer;
using testing::Outputs;
using testing::Problem;
using testing::Variant;

enum class Path { kPhased, kStreaming, kSingleLaunch, kOwnersThenStreaming };
const char* path_name(Path p) {
  return p == Path::kPhased ? "phased" : p == Path::kStreaming ? "streaming"
         : p == Path::kSingleLaunch ? "single launch" : "owners then streaming";
}


class SimulatedRanks : public ::testing::TestWithParam<int> {};

TEST_P(SimulatedRanks, EveryProtocolPathAgainstReference) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  constexpr int64_t kH = 5120, kCap = 300;
  constexpr int kHc = 4;
  const int np = static_cast<int>(kH / 8);
  std::vector<std::unique_ptr<SimRank>> ranks;
  for (int r = 0; r < tp; ++r) ranks.push_back(std::make_unique<SimRank>(kCap, kH, kHc, tp));
  const SimErrors errors(10'000'000'000ull, kOpAllReduceCall);  // 10 s
  const ErrorSink& err = errors.sink;
  // The streaming grid: this device's resident CTAs of the kernel, shared by the R ranks.
  const RowTiling big = row_tiling(np, kMaxSingleLaunchCtas + 1, kHc);
  const int publishers = tp >= 8 ? 4 : 8, reducers = tp >= 8 ? 4 : 8;
  // MHCCL_SIM_PHASED_ONLY=1: the phased path only, whose kernels never wait for a kernel running
  // beside them (for tools that may run one kernel at a time: compute-sanitizer's memcheck of the
  // kernels' rank-dependent indexing at TP=4 and 8; scripts/device-session.sh, stage sanitize).
  const bool phased_only = std::getenv("MHCCL_SIM_PHASED_ONLY") != nullptr;

  uint64_t seed = 90000 + 100 * tp;
  int checked = 0;
  uint32_t calls[2] = {0, 0};  // per protocol
  for (const bool two_shot : {false, true}) {
    for (const int64_t m : {int64_t{1}, int64_t{3}, int64_t{150}, kCap}) {
      for (const bool fin : {false, true}) {
        // One of plain, MXFP8, residual-only by turns, and one FP8 variant (call and finalize of
        // each (protocol, M) take one each of without and with UE8M0 scales).
        const uint64_t case_seed = seed++;
        for (const Variant v : {static_cast<Variant>(case_seed % 3), case_seed % 2 ? Variant::kFp8Ue8m0 : Variant::kFp8}) {
          const ConsumerVariant cv = consumer_variant(v);
          const Problem p = testing::make_problem(case_seed, m, kH, kHc, tp, fin);
          // 0 where the stages exceed the shared memory (one-shot at TP=8: the host then runs the
          // CTA-per-row consumer); a single row never streams.
          const int resident = streaming_consumer_resident_ctas(kHc, ConsumerInput::kPoll, cv, two_shot ? 1 : tp, big.threads);
          std::vector<Path> paths = {Path::kPhased};
          if (!phased_only && resident > 0 && m > 1) paths.push_back(Path::kStreaming);
          if (!phased_only && !two_shot && m <= 3) paths.push_back(Path::kSingleLaunch);
          if (!phased_only && two_shot && resident > 0 && m > 1) paths.push_back(Path::kOwnersThenStreaming);
          uint64_t hash_by_tiling[kMaxCtasPerRow + 1] = {};
          for (const Path path : paths) {
            std::vector<PublishParams> pps(tp);
            std::vector<OwnerReduceParams> orps(tp);
            std::vector<ConsumerParams> cps(tp);
            for (int r = 0; r < tp; ++r) {
              testing::upload(p, r, ranks[r]->buf);
              build_params(ranks, r, p, v, two_shot, err, pps[r], orps[r], cps[r]);
              ConsumerParams& cp = cps[r];
              if (path == Path::kStreaming) {
                cp.tiling = testing::is_fp8(v) ? row_tiling(np, kMaxSingleLaunchCtas + 1, kHc, 0, kFp8GroupPacks)
                                               : big;  // a row on one CTA (what the host streams; small M never does)
                cp.streaming_min_rows = 1;
                cp.streaming_ctas = resident / tp;
                cp.publisher_ctas = publishers;
                cp.reducer_ctas = two_shot ? reducers : 0;
                ASSERT_TRUE(consumer_streams(cp, ConsumerInput::kPoll)) << "tp=" << tp << " M=" << m;
              } else if (path == Path::kSingleLaunch) {
                cp.publish_first = true;
              } else if (path == Path::kOwnersThenStreaming) {
                cp.tiling = orps[r].tiling = testing::is_fp8(v) ? row_tiling(np, kMaxSingleLaunchCtas + 1, kHc, 0, kFp8GroupPacks) : big;
                orps[r].max_groups = 3;  // each owner CTA loops over its owned rows
                cp.streaming_min_rows = -1;  // automatic: what the host runs from kPollStreamingMinRows
                cp.m = kPollStreamingMinRows;
                cp.streaming_ctas = resident / tp;
                ASSERT_TRUE(consumer_streams(cp, ConsumerInput::kPoll)) << "tp=" << tp << " M=" << m;
                cp.m = m;
                cp.streaming_min_rows = 1;
                cp.wait_predecessor = false;
              }
            }
            MHCCL_TEST_CUDA(cudaDeviceSynchronize());  // the uploads (legacy stream) before any launch
            auto each = [&](auto&& launch) {
              for (int r = 0; r < tp; ++r) MHCCL_TEST_CUDA(launch(r));
              MHCCL_TEST_CUDA(cudaDeviceSynchronize());
            };
            if (path == Path::kPhased || path == Path::kOwnersThenStreaming) {
              if (path == Path::kOwnersThenStreaming) {
                for (PublishParams& pp : pps) pp.tiling = cps[0].tiling;
              }
              each([&](int r) { return launch_publish(pps[r], ranks[r]->stream, false); });
              if (two_shot) each([&](int r) { return launch_owner_reduce(orps[r], ranks[r]->stream, false); });
              for (ConsumerParams& cp : cps) {
                if (path == Path::kPhased) cp.streaming_min_rows = 0;
                cp.wait_predecessor = false;
              }
            }
            each([&](int r) { return launch_consumer(cps[r], kHc, ConsumerInput::kPoll, cv, ranks[r]->stream, true); });
            ++calls[two_shot ? 1 : 0];
            const ErrorRecord expired = errors.timeout();
            ASSERT_EQ(expired.ready, 0u)
                << "a wait expired: tp=" << tp << " " << path_name(path) << (two_shot ? " two-shot" : " one-shot")
                << " M=" << m << ": peer " << expired.peer << " row " << expired.row;
            for (int r = 0; r < tp; ++r) {
              const Outputs got = testing::download(p, v, ranks[r]->buf);
              EXPECT_EQ(testing::check(p, v, got), "")
                  << "tp=" << tp << " rank " << r << " " << path_name(path) << (two_shot ? " two-shot" : " one-shot")
                  << (fin ? " finalize" : " call") << " M=" << m << " " << testing::variant_name(v);
              // Every rank alike; every path alike where the rows have the same tiling (the RMS sum's
              // order follows the CTAs a row: the streaming path at small M has one, the host's
              // paths at that M five, so layer_input may differ there by the rounding of that sum).
              uint64_t& want = hash_by_tiling[cps[r].tiling.ctas_per_row];
              if (want == 0) want = got.hash();
              EXPECT_EQ(got.hash(), want) << "tp=" << tp << " rank " << r << " " << path_name(path) << " M=" << m;
              ++checked;
            }
          }
        }
      }
    }
  }
  // Every call advanced each rank's state of its protocol once, and left its ticket counter at 0.
  for (int r = 0; r < tp; ++r) {
    LamportState st[2];
    MHCCL_TEST_CUDA(cudaMemcpy(st, ranks[r]->states.get(), sizeof(st), cudaMemcpyDeviceToHost));
    EXPECT_EQ(st[0].calls, calls[0]) << "rank " << r << " one-shot calls";
    EXPECT_EQ(st[1].calls, calls[1]) << "rank " << r << " two-shot calls";
    EXPECT_EQ(st[0].arrived, 0u);
    EXPECT_EQ(st[1].arrived, 0u);
  }
  std::printf("simulated TP=%d on one GPU: %d rank outputs checked against the reference\n", tp, checked);
}

// Rank 0 of two runs a streaming call alone (rank 1 never publishes, nor reduces): its waits
// expire within the budget, the record names rank 1, the protocol and a row, and the kernel ends
// (no hang). One-shot (its consumers wait for rank 1's slots) and two-shot (its owners wait for
// rank 1's contributions, its consumers for rank 1's reduced rows).
TEST(SimulatedRanksTimeout, StreamingWaitExpiresNamingThePeer) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  constexpr int kTp = 2;
  constexpr int64_t kH = 5120, kCap = 200;
  std::vector<std::unique_ptr<SimRank>> ranks;
  for (int r = 0; r < kTp; ++r) ranks.push_back(std::make_unique<SimRank>(kCap, kH, 4, kTp));
  const RowTiling big = row_tiling(static_cast<int>(kH / 8), kMaxSingleLaunchCtas + 1, 4);
  for (const bool two_shot : {false, true}) {
    const SimErrors errors(200'000'000ull, kOpAllReduceCall);  // 0.2 s
    const Problem p = testing::make_problem(95000 + two_shot, kCap, kH, 4, kTp, false);
    testing::upload(p, 0, ranks[0]->buf);
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
    PublishParams pp;
    OwnerReduceParams orp;
    ConsumerParams cp;
    build_params(ranks, 0, p, Variant::kPlain, two_shot, errors.sink, pp, orp, cp);
    cp.tiling = big;
    cp.streaming_min_rows = 1;
    cp.streaming_ctas = streaming_consumer_resident_ctas(4, ConsumerInput::kPoll, ConsumerVariant::kPlain,
                                                         two_shot ? 1 : kTp, big.threads) / kTp;
    cp.publisher_ctas = 8;
    cp.reducer_ctas = two_shot ? 8 : 0;
    ASSERT_TRUE(consumer_streams(cp, ConsumerInput::kPoll));
    const auto t0 = std::chrono::steady_clock::now();
    MHCCL_TEST_CUDA(launch_consumer(cp, 4, ConsumerInput::kPoll, ConsumerVariant::kPlain, ranks[0]->stream, true));
    MHCCL_TEST_CUDA(cudaStreamSynchronize(ranks[0]->stream));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0) << (two_shot ? "two-shot" : "one-shot");
    const ErrorRecord t = errors.timeout();
    EXPECT_EQ(t.ready, 1u) << (two_shot ? "two-shot" : "one-shot") << ": no timeout recorded";
    EXPECT_EQ(t.code, static_cast<uint32_t>(kWaitTimeout));
    EXPECT_EQ(t.peer, 1) << (two_shot ? "two-shot" : "one-shot");
    EXPECT_TRUE(two_shot ? (t.protocol == kProtoTwoShotOwner || t.protocol == kProtoTwoShotReduced)
                         : t.protocol == kProtoOneShot) << "protocol " << t.protocol;
    EXPECT_GE(t.row, 0);
    EXPECT_LT(t.row, kCap);
  }
}

// The all-gather at tp ranks on one GPU: every size class, words equal to the sentinel
// 0x80000000 and to the marker 0x80000001 in every lane position (every word arrives as sent:
// the escape words), up to 9 calls in a row so that every generation's slots are used and reset
// at least twice.
TEST_P(SimulatedRanks, AllGatherAgainstReference) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  constexpr int64_t kCap = 1 << 20;
  struct Rank {
    DeviceBuffer mailbox, state, in, out;
    cudaStream_t stream = nullptr;
  };
  std::vector<Rank> ranks(tp);
  for (Rank& k : ranks) {
    k.mailbox = DeviceBuffer(static_cast<size_t>(all_gather_mailbox_bytes(tp, kCap / 16)));
    MHCCL_TEST_CUDA(launch_fill_u32(k.mailbox.get(), k.mailbox.bytes() / 4, kWordSentinel, nullptr));
    k.state = DeviceBuffer(sizeof(LamportState));
    MHCCL_TEST_CUDA(cudaMemset(k.state.get(), 0, sizeof(LamportState)));
    k.in = DeviceBuffer(kCap);
    k.out = DeviceBuffer(static_cast<size_t>(kCap * tp));
    MHCCL_TEST_CUDA(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
  }
  const SimErrors errors(10'000'000'000ull, kOpAllGather);  // 10 s
  std::mt19937_64 rng(7000 + tp);
  const int64_t sizes[] = {16, 48, 4096, 65536, kCap, 16, 1 << 18, 4096, 48};
  int calls = 0;
  for (const int64_t bytes : sizes) {
    // Every rank's grid must be resident at once on the one device (on real hardware each rank
    // has its own): up to 128 CTAs of 256 threads a rank at 1 MiB. Measured to fit: 2 x 1 MiB
    // (8 x 1 MiB does not); taken: at most 2 MiB over 2 ranks, 1 MiB over more.
    if (bytes * tp > (tp == 2 ? 2 : 1) * kCap) continue;
    ++calls;
    std::vector<std::vector<uint32_t>> in(tp, std::vector<uint32_t>(bytes / 4));
    std::vector<uint32_t> want(static_cast<size_t>(bytes / 4 * tp));
    for (int r = 0; r < tp; ++r) {
      for (auto& w : in[r]) w = static_cast<uint32_t>(rng());
      // A tenth of the words (and at least 3) the sentinel or the marker.
      for (size_t i = 0; i < std::max<size_t>(3, in[r].size() / 10); ++i) {
        in[r][rng() % in[r].size()] = rng() % 2 ? kWordSentinel : kWordMarker;
      }
      for (size_t i = 0; i < in[r].size(); ++i) want[r * in[r].size() + i] = in[r][i];
      ranks[r].in.upload(in[r]);
      MHCCL_TEST_CUDA(cudaMemset(ranks[r].out.get(), 0xA5, static_cast<size_t>(bytes * tp)));
    }
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
    for (int r = 0; r < tp; ++r) {
      AllGatherParams p = {};
      p.in = ranks[r].in.get();
      p.out = ranks[r].out.get();
      p.tp = tp;
      p.rank = r;
      p.packs = bytes / 16;
      p.capacity_packs = kCap / 16;
      p.state = ranks[r].state.as<LamportState>();
      p.err = errors.sink;
      p.id = make_call_identity(kOpAllGather, kProtoAllGather, 0, static_cast<uint64_t>(p.packs));
      for (int k = 0; k < tp; ++k) p.mailboxes[k] = ranks[(r + k) % tp].mailbox.get();
      MHCCL_TEST_CUDA(launch_all_gather(p, ranks[r].stream, true));
    }
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
    ASSERT_EQ(errors.timeout().ready, 0u) << "a wait expired: tp=" << tp << " " << bytes << " B";
    for (int r = 0; r < tp; ++r) {
      std::vector<uint32_t> got(want.size());
      MHCCL_TEST_CUDA(cudaMemcpy(got.data(), ranks[r].out.get(), got.size() * 4, cudaMemcpyDeviceToHost));
      EXPECT_TRUE(got == want) << "tp=" << tp << " rank " << r << " " << bytes << " B/rank";
    }
  }
  for (Rank& k : ranks) {
    LamportState st;
    MHCCL_TEST_CUDA(cudaMemcpy(&st, k.state.get(), sizeof(st), cudaMemcpyDeviceToHost));
    EXPECT_EQ(st.calls, static_cast<uint32_t>(calls));
    EXPECT_EQ(st.arrived, 0u);
    cudaStreamDestroy(k.stream);
  }
}

// --- Concurrent ranks ---------------------------------------------------------------------------
// Every rank's calls enqueued by `enqueue(r, stream)` on its own stream, with no host sync
// between them: eagerly, or (graph) captured into one CUDA graph a rank and every rank's graph
// then launched once. Waits for the device; returns the seconds it all took.
double run_ranks(const std::vector<cudaStream_t>& streams, bool graph,
                 const std::function<void(int, cudaStream_t)>& enqueue) {
  const int tp = static_cast<int>(streams.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<cudaGraphExec_t> execs(tp, nullptr);
  for (int r = 0; r < tp; ++r) {
    cudaGraph_t cg;
    if (graph) MHCCL_TEST_CUDA(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal));
    enqueue(r, streams[r]);
    if (graph) {
      MHCCL_TEST_CUDA(cudaStreamEndCapture(streams[r], &cg));
      MHCCL_TEST_CUDA(cudaGraphInstantiate(&execs[r], cg, 0));
      MHCCL_TEST_CUDA(cudaGraphDestroy(cg));
    }
  }
  if (graph) {
    for (int r = 0; r < tp; ++r) MHCCL_TEST_CUDA(cudaGraphLaunch(execs[r], streams[r]));
  }
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (cudaGraphExec_t e : execs) {
    if (e) MHCCL_TEST_CUDA(cudaGraphExecDestroy(e));
  }
  return secs;
}
std::vector<cudaStream_t> streams_of(const ConcurrentGroup& g) {
  std::vector<cudaStream_t> s;
  for (const auto& k : g.ranks) s.push_back(k->stream);
  return s;
}

int64_t rows_for(Kind k, uint64_t pick) {
  switch (k) {
    case Kind::kSingle: return 1 + static_cast<int64_t>(pick % 3);
    case Kind::kPhasedOneShot: return pick % 2 ? 5 : 8;
    case Kind::kTwoShot: return pick % 2 ? 6 : 10;
    default: return pick % 2 ? 40 : 100;
  }
}

struct PlannedCall {
  Kind kind;
  Problem p;
  Variant v;
  std::vector<std::unique_ptr<CallBuffers>> bufs;  // a rank's
  std::vector<uint64_t> delay_ns;                   // before the call, per rank
};

// `n` calls of every kind, call and finalize, every variant, in a seeded random order, with
// random delays before some calls on some ranks; every rank's inputs uploaded.
std::vector<PlannedCall> plan_calls(int tp, int n, uint64_t seed, uint64_t max_delay_ns) {
  std::mt19937_64 rng(seed);
  std::vector<PlannedCall> calls;
  for (int c = 0; c < n; ++c) {
    PlannedCall pc;
    pc.kind = static_cast<Kind>(rng() % kKinds);
    const bool fin = rng() % 2;
    pc.v = static_cast<Variant>(rng() % 3);
    pc.p = testing::make_problem(rng(), rows_for(pc.kind, rng()), ConcurrentGroup::kH, ConcurrentGroup::kHc, tp, fin);
    for (int r = 0; r < tp; ++r) {
      pc.bufs.push_back(std::make_unique<CallBuffers>(pc.p.m, ConcurrentGroup::kH, ConcurrentGroup::kHc, 6));
      testing::upload(pc.p, r, *pc.bufs.back());
      pc.delay_ns.push_back(max_delay_ns > 0 && rng() % 4 == 0 ? rng() % max_delay_ns : 0);
    }
    calls.push_back(std::move(pc));
  }
  return calls;
}

// Every output of every rank against the reference, and alike on every rank.
void check_calls(const std::vector<PlannedCall>& calls, int tp, const char* what) {
  for (size_t c = 0; c < calls.size(); ++c) {
    const PlannedCall& pc = calls[c];
    uint64_t want = 0;
    for (int r = 0; r < tp; ++r) {
      const Outputs got = testing::download(pc.p, pc.v, *pc.bufs[r]);
      EXPECT_EQ(testing::check(pc.p, pc.v, got), "")
          << what << " tp=" << tp << " call " << c << " rank " << r << " " << kind_name(pc.kind)
          << (pc.p.finalize ? " finalize" : " call") << " M=" << pc.p.m << " " << testing::variant_name(pc.v);
      if (r == 0) want = got.hash();
      EXPECT_EQ(got.hash(), want) << what << " call " << c << " rank " << r << ": ranks differ";
    }
  }
}

// The call headers in every rank's mailboxes once calls all completed without a fault
// (PROTOCOL.md, I19): of each protocol, its last call's generation holds that call's identity
// from every writer w < tp, and every other header slot the sentinel. So no header landed after
// its reset by the protocol's next call on that rank (one that did would be found here, unless a
// later call of its generation overwrote it with the same writer's header, which is what it
// then took for its own). It does not show that each header was waited for, only that none was
// left behind at the end.
void check_call_headers(const ConcurrentGroup& g, const std::vector<PlannedCall>& calls, const char* what) {
  const int tp = g.tp;
  const int np = static_cast<int>(ConcurrentGroup::kH / 8);
  const int64_t cap = g.ranks[0]->buf.rows;
  struct Box {
    const DeviceBuffer* buf;
    int sources;
    int64_t rows;
    const char* name;
  };
  for (const bool two_shot : {false, true}) {
    const PlannedCall* last = nullptr;
    for (const PlannedCall& pc : calls) {
      if (kind_two_shot(pc.kind) == two_shot) last = &pc;
    }
    for (int r = 0; r < tp; ++r) {
      const SimRank& k = *g.ranks[r];
      LamportState st[2];
      MHCCL_TEST_CUDA(cudaMemcpy(st, k.states.get(), sizeof(st), cudaMemcpyDeviceToHost));
      const uint32_t gen = (st[two_shot].generation + kGenerations - 1) % kGenerations;  // the last call's
      std::vector<Box> boxes;
      if (two_shot) {
        boxes = {{&k.bt, tp, (cap + tp - 1) / tp, "contributions"}, {&k.red, 1, cap, "reduced rows"}};
      } else {
        boxes = {{&k.ll, tp, cap, "one-shot slots"}};
      }
      for (const Box& box : boxes) {
        std::vector<uint32_t> h(4 * kGenerations * kMaxTp);
        MHCCL_TEST_CUDA(cudaMemcpy(h.data(), box.buf->as<char>() + 16 * call_header_offset(0, box.sources, box.rows, np, 0),
                                   h.size() * 4, cudaMemcpyDeviceToHost));
        for (uint32_t gn = 0; gn < kGenerations; ++gn) {
          for (int w = 0; w < kMaxTp; ++w) {
            uint32_t want[4] = {kBf16SentinelPair, kBf16SentinelPair, kBf16SentinelPair, kBf16SentinelPair};
            if (last != nullptr && gn == gen && w < tp) {
              const CallIdentity id = with_generation(
                  make_call_identity(last->p.finalize ? kOpAllReduceFinalize : kOpAllReduceCall,
                                     two_shot ? kProtoTwoShotOwner : kProtoOneShot,
                                     static_cast<uint32_t>(consumer_variant(last->v)), static_cast<uint64_t>(last->p.m)),
                  gen);
              for (int i = 0; i < 4; ++i) want[i] = id.w[i];
            }
            for (int i = 0; i < 4; ++i) {
              EXPECT_EQ(h[(gn * kMaxTp + w) * 4 + i], want[i])
                  << what << " tp=" << tp << " rank " << r << " " << box.name << ": generation " << gn << " writer " << w
                  << " word " << i << (gn == gen ? " (the last call's)" : " (should have been reset)");
            }
          }
        }
      }
    }
  }
}

class ConcurrentRanks : public ::testing::TestWithParam<int> {};

// 60 calls a rank, one-shot (single launch, publish + consumer, streaming), two-shot (three
// kernels, streaming), call and finalize, every variant, random delays up to 200 us before a
// quarter of the calls on each rank; no host synchronization until the last call.
TEST_P(ConcurrentRanks, MixedCallsWithoutHostSync) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  ConcurrentGroup g(tp, 128, 10'000'000'000ull);  // 10 s
  std::vector<PlannedCall> calls = plan_calls(tp, 60, 31000 + tp, 200'000);
  for (size_t c = 0; c < calls.size(); ++c) {
    for (int r = 0; r < tp; ++r) {
      if (calls[c].delay_ns[r] > 0) MHCCL_TEST_CUDA(testing::launch_gpu_delay(calls[c].delay_ns[r], g.ranks[r]->stream));
      g.launch(r, calls[c].kind, calls[c].p, calls[c].v, *calls[c].bufs[r]);
    }
  }
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  for (int r = 0; r < tp; ++r) {
    const ErrorRecord t = g.sinks[r]->timeout();
    ASSERT_EQ(t.ready, 0u) << "rank " << r << ": code " << t.code << " peer " << t.peer << " call " << t.call;
    EXPECT_EQ(g.sinks[r]->fault(), 0u);
  }
  check_calls(calls, tp, "eager");
  check_call_headers(g, calls, "eager");
  std::printf("concurrent TP=%d: %zu calls a rank checked\n", tp, calls.size());
}

// 12 calls a rank captured into one CUDA graph per rank (each rank's own stream), the graphs
// replayed together 3 times with no host synchronization between replays.
TEST_P(ConcurrentRanks, GraphReplayOfMixedCalls) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  ConcurrentGroup g(tp, 128, 10'000'000'000ull);
  std::vector<PlannedCall> calls = plan_calls(tp, 12, 32000 + tp, 100'000);
  std::vector<cudaGraphExec_t> execs(tp);
  for (int r = 0; r < tp; ++r) {
    cudaStream_t s = g.ranks[r]->stream;
    cudaGraph_t graph;
    MHCCL_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (PlannedCall& pc : calls) {
      if (pc.delay_ns[r] > 0) MHCCL_TEST_CUDA(testing::launch_gpu_delay(pc.delay_ns[r], s));
      g.launch(r, pc.kind, pc.p, pc.v, *pc.bufs[r]);
    }
    MHCCL_TEST_CUDA(cudaStreamEndCapture(s, &graph));
    MHCCL_TEST_CUDA(cudaGraphInstantiate(&execs[r], graph, 0));
    MHCCL_TEST_CUDA(cudaGraphDestroy(graph));
  }
  for (int replay = 0; replay < 3; ++replay) {
    for (int r = 0; r < tp; ++r) MHCCL_TEST_CUDA(cudaGraphLaunch(execs[r], g.ranks[r]->stream));
  }
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  for (int r = 0; r < tp; ++r) {
    const ErrorRecord t = g.sinks[r]->timeout();
    ASSERT_EQ(t.ready, 0u) << "rank " << r << ": code " << t.code << " peer " << t.peer << " call " << t.call;
    MHCCL_TEST_CUDA(cudaGraphExecDestroy(execs[r]));
  }
  check_calls(calls, tp, "graph");
  check_call_headers(g, calls, "graph");
}

// A rank that times out stops the group (PROTOCOL.md I12b): the last rank is held back 5x the
// wait budget before its call 3 of 10, enqueued without host sync (or captured in a graph and
// replayed). The other ranks' waits of call 3 expire; from then on no rank stores into a
// mailbox. Asserted: every rank records an error (no rank ends its calls silently), each names
// the stalled rank (a timeout waiting for it, or a fault raised by a rank that waited for it),
// every output of a call before a rank's recorded call is right, and nothing hangs. Before the
// fault word, the timed-out ranks ran through their later calls, publishing, and the held-back
// rank's first calls then completed on their peers' later data: wrong values, no error.
TEST_P(ConcurrentRanks, TimeoutStopsEveryRankBeforeAWrongValue) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  constexpr uint64_t kBudgetNs = 60'000'000;  // 60 ms
  constexpr int kCalls = 10, kStallCall = 3;
  const int stalled = tp - 1;
  for (const Kind kind : {Kind::kSingle, Kind::kPhasedOneShot, Kind::kTwoShot, Kind::kStreamOneShot, Kind::kStreamTwoShot,
                          Kind::kOwnersStreamTwoShot}) {
    for (const bool graph : {false, true}) {
      ConcurrentGroup g(tp, 128, kBudgetNs);
      std::mt19937_64 rng(33000 + tp * 10 + static_cast<int>(kind));
      std::vector<PlannedCall> calls;
      for (int c = 0; c < kCalls; ++c) {
        PlannedCall pc;
        pc.kind = kind;
        pc.v = static_cast<Variant>(c % 3);
        pc.p = testing::make_problem(rng(), rows_for(kind, rng()), ConcurrentGroup::kH, ConcurrentGroup::kHc, tp, c % 2);
        for (int r = 0; r < tp; ++r) {
          pc.bufs.push_back(std::make_unique<CallBuffers>(pc.p.m, ConcurrentGroup::kH, ConcurrentGroup::kHc, 6));
          testing::upload(pc.p, r, *pc.bufs.back());
          pc.delay_ns.push_back(r == stalled && c == kStallCall ? 5 * kBudgetNs : 0);
        }
        calls.push_back(std::move(pc));
      }
      const double secs = run_ranks(streams_of(g), graph, [&](int r, cudaStream_t s) {
        for (PlannedCall& pc : calls) {
          if (pc.delay_ns[r] > 0) MHCCL_TEST_CUDA(testing::launch_gpu_delay(pc.delay_ns[r], s));
          g.launch(r, pc.kind, pc.p, pc.v, *pc.bufs[r]);
        }
      });
      const std::string what = std::string(kind_name(kind)) + (graph ? " (graph)" : " (eager)") + " tp=" + std::to_string(tp);
      EXPECT_LT(secs, 10.0) << what;
      int timed_out = 0;
      for (int r = 0; r < tp; ++r) {
        const ErrorRecord t = g.sinks[r]->timeout();
        ASSERT_EQ(t.ready, 1u) << what << ": rank " << r << " recorded no error";
        if (t.code == kWaitTimeout) {
          ++timed_out;
          EXPECT_NE(r, stalled) << what;
          EXPECT_EQ(t.peer, stalled) << what << ": rank " << r << " timed out waiting for rank " << t.peer;
        } else {
          ASSERT_EQ(t.code, static_cast<uint32_t>(kPeerFault)) << what << ": rank " << r;
          EXPECT_NE(t.peer, stalled) << what << ": rank " << r << " names the stalled rank as the one that timed out";
          EXPECT_FALSE(fault_is_divergence(static_cast<uint32_t>(t.value))) << what << ": rank " << r;
          EXPECT_EQ(fault_waited_for(static_cast<uint32_t>(t.value)), stalled)
              << what << ": rank " << r << ": the fault names rank " << fault_waited_for(static_cast<uint32_t>(t.value));
        }
        EXPECT_NE(g.sinks[r]->fault(), 0u) << what << ": rank " << r << "'s fault word";
        EXPECT_LE(t.call, static_cast<uint32_t>(kStallCall + 1)) << what << ": rank " << r << " ran on to call " << t.call;
        // No wrong value before the first error: every call before the recorded one is right.
        for (uint32_t c = 0; c < t.call && c < kCalls; ++c) {
          const PlannedCall& pc = calls[c];
          EXPECT_EQ(testing::check(pc.p, pc.v, testing::download(pc.p, pc.v, *pc.bufs[r])), "")
              << what << ": rank " << r << " call " << c << " (its error is in call " << t.call << ")";
        }
      }
      EXPECT_GE(timed_out, 1) << what << ": no rank recorded the timeout itself";
    }
  }
}

// --- Ranks that diverge (PROTOCOL.md, I19) -------------------------------------------------------
// Every rank's contribution carries the call's identity, and every consumer checks its peers'
// against its own: ranks whose calls no longer pair get an error, never a wrong value.
enum class Divergence {
  kRejectedOnOneRank,    // the last rank's call 3 is rejected (it makes no call; its count goes up)
  kRejectedOnEveryRank,  // call 3 is rejected on every rank alike: no error, every other call right
  kOtherM,               // the last rank calls 3 with another M
  kFinalizeAgainstCall,  // the last rank's call 3 is finalize where the others' is call (or the reverse)
};
const char* divergence_name(Divergence d) {
  switch (d) {
    case Divergence::kRejectedOnOneRank: return "rejected on one rank";
    case Divergence::kRejectedOnEveryRank: return "rejected on every rank";
    case Divergence::kOtherM: return "another M on one rank";
    case Divergence::kFinalizeAgainstCall: return "call against finalize";
  }
  return "?";
}

// One rank's part of a divergence scenario: the calls it makes, each with its problem and
// buffers, and the index of the caller's call each one is.
struct RankPlan {
  std::vector<Problem> problems;
  std::vector<Variant> variants;
  std::vector<int> caller_call;
  std::vector<std::unique_ptr<CallBuffers>> bufs;
  std::vector<bool> rejected_before;  // the rank's count goes up before this call (its previous one was rejected)
};

// `calls` calls of `kind` on every rank with the same problems, but for the divergence at call
// `at` on the last rank (or every rank), enqueued without host sync (or captured into a graph a
// rank and replayed). Asserted: kRejectedOnEveryRank: no error, every call right. Otherwise: no
// wait reaches its budget (the identity check finds the divergence: no timeout), every rank
// records an error at the divergent call or the next, a divergence found on at least one rank
// (the others may see its fault first), every rank's calls before its recorded one right, and
// nothing hangs.
void run_divergence(int tp, Kind kind, Divergence d, bool graph, int calls, int at) {
  constexpr uint64_t kBudgetNs = 10'000'000'000ull;  // 10 s: an expiry here is a failure to see the divergence
  ConcurrentGroup g(tp, 128, kBudgetNs);
  const int odd = tp - 1;
  std::mt19937_64 rng(41000 + tp * 100 + static_cast<int>(kind) * 10 + static_cast<int>(d));
  std::vector<RankPlan> plans(tp);
  for (int c = 0; c < calls; ++c) {
    const bool fin = c % 2;
    const Variant v = static_cast<Variant>(c % 3);
    const int64_t m = rows_for(kind, rng());
    const Problem p = testing::make_problem(rng(), m, ConcurrentGroup::kH, ConcurrentGroup::kHc, tp, fin);
    for (int r = 0; r < tp; ++r) {
      RankPlan& rp = plans[r];
      const bool diverges = c == at && (r == odd || d == Divergence::kRejectedOnEveryRank);
      if (diverges && (d == Divergence::kRejectedOnOneRank || d == Divergence::kRejectedOnEveryRank)) {
        rp.rejected_before.resize(rp.problems.size() + 1, false);
        rp.rejected_before[rp.problems.size()] = true;  // the next call this rank makes counts one more
        continue;
      }
      Problem mine = p;
      if (diverges && d == Divergence::kOtherM) {
        mine = testing::make_problem(rng(), m == rows_for(kind, 0) ? rows_for(kind, 1) : rows_for(kind, 0),
                                     ConcurrentGroup::kH, ConcurrentGroup::kHc, tp, fin);
      } else if (diverges && d == Divergence::kFinalizeAgainstCall) {
        mine = testing::make_problem(rng(), m, ConcurrentGroup::kH, ConcurrentGroup::kHc, tp, !fin);
      }
      rp.problems.push_back(mine);
      rp.variants.push_back(v);
      rp.caller_call.push_back(c);
      rp.bufs.push_back(std::make_unique<CallBuffers>(mine.m, ConcurrentGroup::kH, ConcurrentGroup::kHc, 6));
      testing::upload(mine, r, *rp.bufs.back());
    }
  }
  for (RankPlan& rp : plans) rp.rejected_before.resize(rp.problems.size() + 1, false);
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  const std::string what = std::string(divergence_name(d)) + ", " + kind_name(kind) + (graph ? " (graph)" : " (eager)") +
                           " tp=" + std::to_string(tp);
  const double secs = run_ranks(streams_of(g), graph, [&](int r, cudaStream_t) {
    RankPlan& rp = plans[r];
    for (size_t i = 0; i < rp.problems.size(); ++i) {
      if (rp.rejected_before[i]) g.reject(r);
      g.launch(r, kind, rp.problems[i], rp.variants[i], *rp.bufs[i]);
    }
    if (rp.rejected_before[rp.problems.size()]) g.reject(r);
  });
  EXPECT_LT(secs, 5.0) << what;
  int found = 0;
  for (int r = 0; r < tp; ++r) {
    const RankPlan& rp = plans[r];
    const ErrorRecord t = g.sinks[r]->timeout();
    if (d == Divergence::kRejectedOnEveryRank) {
      EXPECT_EQ(t.ready, 0u) << what << ": rank " << r << " recorded code " << t.code << " at call " << t.call;
      EXPECT_EQ(g.sinks[r]->fault(), 0u) << what << ": rank " << r;
      EXPECT_EQ(rp.problems.size(), static_cast<size_t>(calls - 1));
      for (size_t i = 0; i < rp.problems.size(); ++i) {
        EXPECT_EQ(testing::check(rp.problems[i], rp.variants[i], testing::download(rp.problems[i], rp.variants[i], *rp.bufs[i])), "")
            << what << ": rank " << r << " call " << rp.caller_call[i];
      }
      continue;
    }
    ASSERT_EQ(t.ready, 1u) << what << ": rank " << r << " recorded no error";
    EXPECT_NE(t.code, static_cast<uint32_t>(kWaitTimeout)) << what << ": rank " << r << " timed out waiting for rank " << t.peer;
    if (t.code == kDivergence) {
      ++found;
      EXPECT_GE(t.peer, 0);
      EXPECT_LT(t.peer, tp);
      EXPECT_NE(t.peer, r) << what;
      EXPECT_FALSE(identity_equal(t.mine, t.theirs)) << what << ": rank " << r;
      if (d == Divergence::kRejectedOnOneRank) {
        EXPECT_NE(identity_rejected(t.mine), identity_rejected(t.theirs)) << what << ": rank " << r;
      } else if (d == Divergence::kOtherM) {
        EXPECT_NE(identity_size(t.mine), identity_size(t.theirs)) << what << ": rank " << r;
      } else {
        EXPECT_NE(identity_op(t.mine), identity_op(t.theirs)) << what << ": rank " << r;
      }
    } else {
      ASSERT_EQ(t.code, static_cast<uint32_t>(kPeerFault)) << what << ": rank " << r;
      EXPECT_TRUE(fault_is_divergence(static_cast<uint32_t>(t.value))) << what << ": rank " << r;
    }
    EXPECT_NE(g.sinks[r]->fault(), 0u) << what << ": rank " << r << "'s fault word";
    // At the divergent call or the next (this rank's own count of calls of the protocol).
    size_t first_divergent = rp.problems.size();
    for (size_t i = 0; i < rp.problems.size(); ++i) {
      if (rp.caller_call[i] >= at) {
        first_divergent = i;
        break;
      }
    }
    EXPECT_LE(t.call, first_divergent + 1) << what << ": rank " << r << " ran on to call " << t.call;
    // No wrong value before the first error.
    for (size_t i = 0; i < t.call && i < rp.problems.size(); ++i) {
      EXPECT_EQ(testing::check(rp.problems[i], rp.variants[i], testing::download(rp.problems[i], rp.variants[i], *rp.bufs[i])), "")
          << what << ": rank " << r << " call " << rp.caller_call[i] << " (its error is in call " << t.call << ")";
    }
  }
  if (d != Divergence::kRejectedOnEveryRank) EXPECT_GE(found, 1) << what << ": no rank recorded the divergence itself";
}

TEST_P(ConcurrentRanks, DivergentCallsGetAnErrorNeverAWrongValue) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  for (const Divergence d : {Divergence::kRejectedOnOneRank, Divergence::kRejectedOnEveryRank, Divergence::kOtherM,
                             Divergence::kFinalizeAgainstCall}) {
    for (const Kind kind : {Kind::kSingle, Kind::kPhasedOneShot, Kind::kTwoShot, Kind::kStreamOneShot, Kind::kStreamTwoShot,
                          Kind::kOwnersStreamTwoShot}) {
      for (const bool graph : {false, true}) {
        run_divergence(tp, kind, d, graph, d == Divergence::kRejectedOnEveryRank ? 14 : 8, 3);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// A call rejected on one rank only between a CUDA graph's capture and its replay (PROTOCOL.md,
// I19): every rank captures the same 3 calls into a graph of its own, and the graphs replay
// once (a control: no error, every output right). Then every rank but the last makes an eager
// call of the same kind, M and variant as the graph's first, which the last rank rejects (its
// count of rejected calls goes up on its stream), and the graphs replay again. The first
// ranks' eager call now pairs with the last rank's replayed first call: same op, protocol,
// variant and M, and a count of rejected calls captured at capture time would be the same too
// (the limit of 2026-12-03: wrong values on both sides, no error). Asserted: every rank records
// an error at the eager call or the replay's first call (its calls 3 or 4), a divergence on at
// least one rank naming the rejected counts, no wait expires, and nothing hangs. `every`: the
// eager call rejected on every rank instead: no error, and the second replay right.
void run_rejected_between_capture_and_replay(int tp, Kind kind, bool every) {
  constexpr uint64_t kBudgetNs = 10'000'000'000ull;  // 10 s: an expiry here is a failure to see the divergence
  constexpr int kGraphCalls = 3;
  ConcurrentGroup g(tp, 128, kBudgetNs);
  const int odd = tp - 1;
  std::mt19937_64 rng(47000 + tp * 100 + static_cast<int>(kind) * 10 + every);
  const int64_t m = rows_for(kind, rng());
  const Variant v = Variant::kPlain;
  // Every call the same shape: the graph's calls and the eager one (its own data and buffers).
  std::vector<Problem> problems;
  std::vector<std::vector<std::unique_ptr<CallBuffers>>> bufs(kGraphCalls + 1);
  for (int c = 0; c <= kGraphCalls; ++c) {
    problems.push_back(testing::make_problem(rng(), m, ConcurrentGroup::kH, ConcurrentGroup::kHc, tp, false));
    for (int r = 0; r < tp; ++r) {
      bufs[c].push_back(std::make_unique<CallBuffers>(m, ConcurrentGroup::kH, ConcurrentGroup::kHc, 6));
      testing::upload(problems[c], r, *bufs[c].back());
    }
  }
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  const std::string what = std::string(every ? "rejected on every rank" : "rejected on one rank") +
                           " between capture and replay, " + kind_name(kind) + " tp=" + std::to_string(tp);
  std::vector<cudaGraphExec_t> execs(tp, nullptr);
  for (int r = 0; r < tp; ++r) {
    cudaStream_t s = g.ranks[r]->stream;
    cudaGraph_t cg;
    MHCCL_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < kGraphCalls; ++c) g.launch(r, kind, problems[c], v, *bufs[c][r]);
    MHCCL_TEST_CUDA(cudaStreamEndCapture(s, &cg));
    MHCCL_TEST_CUDA(cudaGraphInstantiate(&execs[r], cg, 0));
    MHCCL_TEST_CUDA(cudaGraphDestroy(cg));
  }
  for (int r = 0; r < tp; ++r) MHCCL_TEST_CUDA(cudaGraphLaunch(execs[r], g.ranks[r]->stream));
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  for (int r = 0; r < tp; ++r) {
    const ErrorRecord t = g.sinks[r]->timeout();
    ASSERT_EQ(t.ready, 0u) << what << ", first replay: rank " << r << " recorded code " << t.code;
    for (int c = 0; c < kGraphCalls; ++c) {
      ASSERT_EQ(testing::check(problems[c], v, testing::download(problems[c], v, *bufs[c][r])), "")
          << what << ", first replay: rank " << r << " call " << c;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < tp; ++r) {
    if (every || r == odd) {
      g.reject(r);
    } else {
      g.launch(r, kind, problems[kGraphCalls], v, *bufs[kGraphCalls][r]);
    }
    MHCCL_TEST_CUDA(cudaGraphLaunch(execs[r], g.ranks[r]->stream));
  }
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (cudaGraphExec_t e : execs) MHCCL_TEST_CUDA(cudaGraphExecDestroy(e));
  EXPECT_LT(secs, 5.0) << what;
  int found = 0;
  for (int r = 0; r < tp; ++r) {
    const ErrorRecord t = g.sinks[r]->timeout();
    EXPECT_EQ(g.sinks[r]->rejected(), every || r == odd ? 1u : 0u) << what << ": rank " << r << "'s count";
    if (every) {
      EXPECT_EQ(t.ready, 0u) << what << ": rank " << r << " recorded code " << t.code << " at call " << t.call;
      for (int c = 0; c < kGraphCalls; ++c) {
        EXPECT_EQ(testing::check(problems[c], v, testing::download(problems[c], v, *bufs[c][r])), "")
            << what << ", second replay: rank " << r << " call " << c;
      }
      continue;
    }
    ASSERT_EQ(t.ready, 1u) << what << ": rank " << r << " recorded no error";
    EXPECT_NE(t.code, static_cast<uint32_t>(kWaitTimeout)) << what << ": rank " << r << " timed out waiting for rank " << t.peer;
    if (t.code == kDivergence) {
      ++found;
      EXPECT_NE(identity_rejected(t.mine), identity_rejected(t.theirs)) << what << ": rank " << r;
      EXPECT_EQ(identity_size(t.mine), identity_size(t.theirs)) << what << ": rank " << r;
    } else {
      ASSERT_EQ(t.code, static_cast<uint32_t>(kPeerFault)) << what << ": rank " << r;
      EXPECT_TRUE(fault_is_divergence(static_cast<uint32_t>(t.value))) << what << ": rank " << r;
    }
    // The first replay's calls were the protocol's calls 0-2 on every rank: the error is in call 3 or 4.
    EXPECT_GE(t.call, static_cast<uint32_t>(kGraphCalls)) << what << ": rank " << r;
    EXPECT_LE(t.call, static_cast<uint32_t>(kGraphCalls + 1)) << what << ": rank " << r << " ran on to call " << t.call;
  }
  if (!every) EXPECT_GE(found, 1) << what << ": no rank recorded the divergence itself";
}

TEST_P(ConcurrentRanks, RejectedBetweenCaptureAndReplayGetsAnError) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  for (const bool every : {false, true}) {
    for (const Kind kind : {Kind::kSingle, Kind::kPhasedOneShot, Kind::kTwoShot, Kind::kStreamOneShot, Kind::kStreamTwoShot,
                          Kind::kOwnersStreamTwoShot}) {
      run_rejected_between_capture_and_replay(tp, kind, every);
      if (HasFatalFailure()) return;
    }
  }
}

// The all-gather's simulated ranks on a simulated communicator (the fault words and records of
// `comm`).
struct SimAllGather {
  SimAllGather(std::shared_ptr<SimCommunicator> c, int64_t cap) : comm(std::move(c)), capacity(cap) {
    for (int r = 0; r < comm->tp; ++r) {
      ranks.emplace_back();
      Rank& k = ranks.back();
      k.mailbox = DeviceBuffer(static_cast<size_t>(all_gather_mailbox_bytes(comm->tp, cap / 16)));
      MHCCL_TEST_CUDA(launch_fill_u32(k.mailbox.get(), k.mailbox.bytes() / 4, kWordSentinel, nullptr));
      k.state = DeviceBuffer(sizeof(LamportState));
      MHCCL_TEST_CUDA(cudaMemset(k.state.get(), 0, sizeof(LamportState)));
    }
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  }
  // Enqueues rank r's all-gather of `bytes` from `in` into `out` on `stream`; `layout`: the
  // digest of its dtype and shape (all_gather_layout_digest) its identity carries.
  void launch(int r, const void* in, void* out, int64_t bytes, cudaStream_t stream, uint32_t layout = 0x2A5C3) {
    AllGatherParams p = {};
    p.in = in;
    p.out = out;
    p.tp = comm->tp;
    p.rank = r;
    p.packs = bytes / 16;
    p.capacity_packs = capacity / 16;
    p.state = ranks[r].state.as<LamportState>();
    p.err = comm->sinks[r]->sink;
    p.err.op = kOpAllGather;
    p.id = with_layout(make_call_identity(kOpAllGather, kProtoAllGather, 0, static_cast<uint64_t>(p.packs)), layout);
    for (int k = 0; k < comm->tp; ++k) p.mailboxes[k] = ranks[(r + k) % comm->tp].mailbox.get();
    MHCCL_TEST_CUDA(launch_all_gather(p, stream, true));
  }
  struct Rank {
    DeviceBuffer mailbox, state;
  };
  std::shared_ptr<SimCommunicator> comm;
  int64_t capacity;
  std::vector<Rank> ranks;
};

// Whether every 32-bit word of `b` is `word`.
bool all_words(const DeviceBuffer& b, uint32_t word) {
  std::vector<uint32_t> h(b.bytes() / 4);
  MHCCL_TEST_CUDA(cudaMemcpy(h.data(), b.get(), h.size() * 4, cudaMemcpyDeviceToHost));
  return std::all_of(h.begin(), h.end(), [&](uint32_t w) { return w == word; });
}

// All-gathers that diverge: the last rank's call 2 of 6 rejected (or of another size, or of as
// many bytes of another dtype or shape: another layout digest, which the identity carries in
// lane 0 and lane 3 beside the size): every rank records an error at that call or the next,
// every gather before it is right (bit for bit: the inputs hold sentinel and marker words), and
// nothing hangs.
TEST_P(ConcurrentRanks, DivergentAllGathersGetAnError) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  constexpr int64_t kCap = 1 << 16;
  constexpr int kCalls = 6, kAt = 2;
  enum class Diverge { kRejected, kOtherSize, kLayoutLane0, kLayoutLane3 };
  for (const Diverge how : {Diverge::kRejected, Diverge::kOtherSize, Diverge::kLayoutLane0, Diverge::kLayoutLane3}) {
    auto comm = std::make_shared<SimCommunicator>(tp, 10'000'000'000ull);
    SimAllGather ag(comm, kCap);
    std::vector<cudaStream_t> streams(tp);
    for (auto& st : streams) MHCCL_TEST_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::mt19937_64 rng(43000 + tp + 10 * static_cast<int>(how));
    // Inputs of every call on every rank, bytes of each.
    std::vector<int64_t> bytes(kCalls);
    std::vector<std::vector<std::vector<uint32_t>>> in(kCalls, std::vector<std::vector<uint32_t>>(tp));
    std::vector<std::vector<DeviceBuffer>> d_in(kCalls), d_out(kCalls);
    for (int c = 0; c < kCalls; ++c) {
      bytes[c] = 16 * (1 + static_cast<int64_t>(rng() % 512));
      for (int r = 0; r < tp; ++r) {
        in[c][r].resize(static_cast<size_t>(bytes[c] / 4));
        for (auto& w : in[c][r]) w = rng() % 4 == 0 ? (rng() % 2 ? kWordSentinel : kWordMarker) : static_cast<uint32_t>(rng());
        d_in[c].emplace_back(static_cast<size_t>(kCap));
        d_in[c].back().upload(in[c][r]);
        d_out[c].emplace_back(static_cast<size_t>(kCap * tp));
        d_out[c].back().poison();
      }
    }
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < tp; ++r) {
      for (int c = 0; c < kCalls; ++c) {
        int64_t b = bytes[c];
        uint32_t layout = 0x2A5C3;
        if (r == tp - 1 && c == kAt) {
          if (how == Diverge::kRejected) {
            comm->sinks[r]->count_rejected(streams[r]);
            continue;
          }
          if (how == Diverge::kOtherSize) b = bytes[c] == 16 ? 32 : bytes[c] - 16;
          if (how == Diverge::kLayoutLane0) layout ^= 0x1;      // the digest's low 6 bits: lane 0
          if (how == Diverge::kLayoutLane3) layout ^= 0x40000;  // its high 13: lane 3
        }
        ag.launch(r, d_in[c][r].get(), d_out[c][r].get(), b, streams[r], layout);
      }
    }
    MHCCL_TEST_CUDA(cudaDeviceSynchronize());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string what = std::string(how == Diverge::kRejected    ? "rejected on one rank"
                                         : how == Diverge::kOtherSize ? "another size"
                                         : how == Diverge::kLayoutLane0 ? "another dtype or shape (lane 0)"
                                                                        : "another dtype or shape (lane 3)") +
                             " tp=" + std::to_string(tp);
    EXPECT_LT(secs, 5.0) << what;
    int found = 0;
    for (int r = 0; r < tp; ++r) {
      const ErrorRecord t = comm->sinks[r]->timeout();
      ASSERT_EQ(t.ready, 1u) << what << ": rank " << r << " recorded no error";
      EXPECT_NE(t.code, static_cast<uint32_t>(kWaitTimeout)) << what << ": rank " << r;
      if (t.code == kDivergence) {
        ++found;
        EXPECT_EQ(t.protocol, static_cast<uint32_t>(kProtoAllGather));
      } else {
        EXPECT_EQ(t.code, static_cast<uint32_t>(kPeerFault)) << what << ": rank " << r;
      }
      EXPECT_LE(t.call, static_cast<uint32_t>(kAt + 1)) << what << ": rank " << r;
      for (uint32_t c = 0; c < t.call && c < static_cast<uint32_t>(kAt); ++c) {
        std::vector<uint32_t> got(static_cast<size_t>(bytes[c] / 4 * tp)), want;
        for (int q = 0; q < tp; ++q) want.insert(want.end(), in[c][q].begin(), in[c][q].end());
        MHCCL_TEST_CUDA(cudaMemcpy(got.data(), d_out[c][r].get(), got.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_TRUE(got == want) << what << ": rank " << r << " gather " << c;
      }
    }
    EXPECT_GE(found, 1) << what;
    for (auto& st : streams) cudaStreamDestroy(st);
  }
}

// One fault per communicator (PROTOCOL.md, I12b): a rank that times out in op A (its peer, the
// last rank, held back 5x the budget before A's call 3) then runs calls of a second AllReduceMHC
// B (another protocol) and all-gathers on the same communicator. Asserted: every rank records
// an error, B's mailboxes and the all-gather's hold nothing but the sentinel on every rank (no
// rank stored into any of them after the fault, nor before: B and the gather run only after),
// and nothing hangs. Eager and as CUDA graphs, for each kind of A.
TEST_P(ConcurrentRanks, FaultStopsEveryOpOfTheCommunicator) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  constexpr uint64_t kBudgetNs = 60'000'000;  // 60 ms
  constexpr int kCallsA = 5, kStallCall = 3, kCallsB = 3, kGathers = 2;
  constexpr int64_t kGatherBytes = 4096;
  const int stalled = tp - 1;
  for (const Kind kind : {Kind::kSingle, Kind::kPhasedOneShot, Kind::kTwoShot, Kind::kStreamOneShot, Kind::kStreamTwoShot,
                          Kind::kOwnersStreamTwoShot}) {
    // B: the other protocol of A's (one-shot against two-shot), in its CTA-per-row shape.
    const Kind kind_b = kind_two_shot(kind) ? Kind::kPhasedOneShot : Kind::kTwoShot;
    for (const bool graph : {false, true}) {
      ConcurrentGroup a(tp, 128, kBudgetNs);
      ConcurrentGroup b(a.comm, 128);
      SimAllGather ag(a.comm, kGatherBytes);
      std::mt19937_64 rng(44000 + tp * 10 + static_cast<int>(kind));
      struct Planned {
        ConcurrentGroup* op;
        Kind kind;
        Problem p;
        Variant v;
        std::vector<std::unique_ptr<CallBuffers>> bufs;
      };
      std::vector<Planned> plan;
      for (int c = 0; c < kCallsA + kCallsB; ++c) {
        Planned pc;
        pc.op = c < kCallsA ? &a : &b;
        pc.kind = c < kCallsA ? kind : kind_b;
        pc.v = static_cast<Variant>(c % 3);
        pc.p = testing::make_problem(rng(), rows_for(pc.kind, rng()), ConcurrentGroup::kH, ConcurrentGroup::kHc, tp, c % 2);
        for (int r = 0; r < tp; ++r) {
          pc.bufs.push_back(std::make_unique<CallBuffers>(pc.p.m, ConcurrentGroup::kH, ConcurrentGroup::kHc, 6));
          testing::upload(pc.p, r, *pc.bufs.back());
        }
        plan.push_back(std::move(pc));
      }
      std::vector<DeviceBuffer> g_in, g_out;
      for (int r = 0; r < tp; ++r) {
        std::vector<uint32_t> words(kGatherBytes / 4);
        for (auto& w : words) w = static_cast<uint32_t>(rng());
        g_in.emplace_back(static_cast<size_t>(kGatherBytes));
        g_in.back().upload(words);
        g_out.emplace_back(static_cast<size_t>(kGatherBytes * tp));
      }
      MHCCL_TEST_CUDA(cudaDeviceSynchronize());
      const double secs = run_ranks(streams_of(a), graph, [&](int r, cudaStream_t st) {
        for (int c = 0; c < kCallsA + kCallsB; ++c) {
          if (r == stalled && c == kStallCall) MHCCL_TEST_CUDA(testing::launch_gpu_delay(5 * kBudgetNs, st));
          Planned& pc = plan[c];
          // B's calls go on A's stream too (one stream a rank: the order an engine issues them in).
          std::swap(pc.op->ranks[r]->stream, st);
          pc.op->launch(r, pc.kind, pc.p, pc.v, *pc.bufs[r]);
          std::swap(pc.op->ranks[r]->stream, st);
          if (c == kCallsA - 1) {
            for (int k = 0; k < kGathers; ++k) ag.launch(r, g_in[r].get(), g_out[r].get(), kGatherBytes, st);
          }
        }
      });
      const std::string what = std::string(kind_name(kind)) + " then " + kind_name(kind_b) + (graph ? " (graph)" : " (eager)") +
                               " tp=" + std::to_string(tp);
      EXPECT_LT(secs, 10.0) << what;
      for (int r = 0; r < tp; ++r) {
        const ErrorRecord t = a.sinks[r]->timeout();
        EXPECT_EQ(t.ready, 1u) << what << ": rank " << r << " recorded no error";
        EXPECT_NE(a.sinks[r]->fault(), 0u) << what << ": rank " << r << "'s fault word";
        for (const DeviceBuffer* mb : {&b.ranks[r]->ll, &b.ranks[r]->bt, &b.ranks[r]->red}) {
          EXPECT_TRUE(all_words(*mb, kBf16SentinelPair)) << what << ": rank " << r << ": something was stored into op B's mailboxes";
        }
        EXPECT_TRUE(all_words(ag.ranks[r].mailbox, kWordSentinel)) << what << ": rank " << r << ": something was stored into the all-gather's mailbox";
      }
    }
  }
}

// The NCCL fallback's identity exchange (kernels/params.h, FallbackParams; PROTOCOL.md I19) at
// TP = 2, 4 and 8 on one GPU: each simulated rank's fallback_enter and fallback_leave kernels,
// with the NCCL group's 16-byte all-gather of the identities done by copies between the ranks'
// buffers (what ncclAllGather delivers; two NCCL ranks cannot share one GPU). Calls that pair
// leave no record; where one rank diverges (a call rejected on it alone, another M, another op of
// the communicator at that call), every rank records kDivergence at that call, naming the diverged
// rank (which names rank 0, or 1 where it is rank 0), with both identities; every fault word is
// raised with the divergence kind; and the calls before it left no record. A slot the group left
// unwritten (what an aborted NCCL operation leaves: the previous call's identity is cleared by
// the enter kernel) is no divergence: the rank records kWaitTimeout naming that rank (no rank
// where every slot is empty) and raises no fault. A rank whose identities all match but
// whose fault word another rank raised records kPeerFault naming the raiser.
TEST_P(SimulatedRanks, NcclFallbackIdentityFindsEveryDivergence) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  const int tp = GetParam();
  const cudaStream_t st = env().stream;
  enum class Diverge {
    kNone, kRejected, kOtherM, kOtherOp, kRejectedEverywhere, kNotDelivered, kNothingDelivered, kNotAnIdentity, kFaultRaised
  };
  const std::pair<Diverge, const char*> scenarios[] = {
      {Diverge::kNone, "none"}, {Diverge::kRejected, "rejected on one rank"}, {Diverge::kOtherM, "another M"},
      {Diverge::kOtherOp, "another op of the communicator"}, {Diverge::kRejectedEverywhere, "rejected on every rank"},
      {Diverge::kNotDelivered, "one rank's identity not delivered (an aborted all-gather)"},
      {Diverge::kNothingDelivered, "no identity delivered to rank 0, its own neither"},
      {Diverge::kNotAnIdentity, "other bytes in one rank's slot (a mispaired NCCL operation)"},
      {Diverge::kFaultRaised, "one rank's fault word raised by a peer before its rows arrived"}};
  for (const auto& [how, what] : scenarios) {
    SCOPED_TRACE(std::string(what) + ", tp " + std::to_string(tp));
    SimCommunicator comm(tp, 10'000'000'000ull);
    const int odd = how == Diverge::kOtherOp ? 0 : tp - 1;  // the rank that diverges
    std::vector<DeviceBuffer> ids, progress;
    for (int r = 0; r < tp; ++r) {
      ids.emplace_back(static_cast<size_t>(fallback_ids_bytes()));
      progress.emplace_back(8);
      MHCCL_TEST_CUDA(cudaMemset(ids.back().get(), 0, ids.back().bytes()));
      MHCCL_TEST_CUDA(cudaMemset(progress.back().get(), 0, 8));
    }
    constexpr int kCalls = 4, kDivergeAt = 2;
    for (int call = 0; call < kCalls; ++call) {
      const bool diverges = how != Diverge::kNone && how != Diverge::kRejectedEverywhere && how != Diverge::kNotDelivered &&
                            how != Diverge::kNothingDelivered && how != Diverge::kFaultRaised;
      const bool here = diverges && call == kDivergeAt;
      // kNotAnIdentity: every rank but `odd` finds other bytes in `odd`'s slot; `odd` sees every
      // identity equal to its own, and its fault word raised by the others (below).
      const auto finds = [&](int r) { return diverges && call >= kDivergeAt && (how != Diverge::kNotAnIdentity || r != odd); };
      if (call == kDivergeAt && how == Diverge::kRejected) comm.sinks[odd]->count_rejected(st);
      if (call == kDivergeAt && how == Diverge::kRejectedEverywhere) {
        for (int r = 0; r < tp; ++r) comm.sinks[r]->count_rejected(st);
      }
      std::vector<FallbackParams> fp(tp);
      for (int r = 0; r < tp; ++r) {
        // kNotDelivered: every rank's M changes at that call, so a slot the enter kernel failed to
        // clear (the previous call's identity, M = 8) would be found unlike this call's.
        const uint64_t m = here && how == Diverge::kOtherM && r == odd                ? 7
                           : how == Diverge::kNotDelivered && call == kDivergeAt ? 9
                                                                                      : 8;
        const uint32_t serial = here && how == Diverge::kOtherOp && r == odd ? 3 : 2;
        fp[r].err = comm.sinks[r]->sink;
        fp[r].id = with_op_serial(make_call_identity(kOpAllReduceCall, kProtoNccl, 0, m), serial);
        fp[r].progress = progress[r].as<uint32_t>();
        fp[r].ids = ids[r].get();
        fp[r].fault_own = comm.sinks[r]->sink.fault;  // the library: the window's own allocation
        fp[r].tp = tp;
        MHCCL_TEST_CUDA(launch_fallback_enter(fp[r], st));
      }
      for (int r = 0; r < tp; ++r) {  // the all-gather: rank s's ids[0] into every rank's ids[1 + s]
        for (int s = 0; s < tp; ++s) {
          if (how == Diverge::kNotDelivered && call == kDivergeAt && s == odd && r != odd) continue;
          if (how == Diverge::kNothingDelivered && call == kDivergeAt && r == 0) continue;
          MHCCL_TEST_CUDA(cudaMemcpyAsync(ids[r].as<char>() + 16 * (1 + s), ids[s].get(), 16, cudaMemcpyDeviceToDevice, st));
          if (here && how == Diverge::kNotAnIdentity && s == odd && r != odd) {  // BF16 rows' bytes, no magic
            const uint32_t rows[4] = {0x3F803F80u, 0x40004000u, 0xBF80BF80u, 0x3F003F00u};
            MHCCL_TEST_CUDA(cudaMemcpyAsync(ids[r].as<char>() + 16 * (1 + s), rows, 16, cudaMemcpyHostToDevice, st));
          }
        }
      }
      if (how == Diverge::kFaultRaised && call == kDivergeAt) {  // rank 0 gave up waiting for `odd`
        const uint32_t w = fault_word(0, odd);
        MHCCL_TEST_CUDA(cudaMemcpyAsync(comm.sinks[odd]->sink.fault, &w, sizeof(w), cudaMemcpyHostToDevice, st));
      }
      for (int r = 0; r < tp; ++r) MHCCL_TEST_CUDA(launch_fallback_leave(fp[r], st));
      MHCCL_TEST_CUDA(cudaStreamSynchronize(st));
      for (int r = 0; r < tp; ++r) {
        const ErrorRecord t = comm.sinks[r]->timeout();
        if (how == Diverge::kFaultRaised) {  // equal identities; `odd` records the fault from that call on
          if (r != odd || call < kDivergeAt) {
            EXPECT_NE(t.ready, t.epoch + 1) << "call " << call << ", rank " << r << ": a record, code " << t.code;
            EXPECT_EQ(comm.sinks[r]->fault(), 0u) << "call " << call << ", rank " << r;
            continue;
          }
          ASSERT_EQ(t.ready, t.epoch + 1) << "call " << call << ", rank " << r << ": no record";
          EXPECT_EQ(t.code, kPeerFault);
          EXPECT_EQ(t.protocol, kProtoNccl);
          EXPECT_EQ(t.call, static_cast<uint32_t>(kDivergeAt)) << "the first such call's (the record stands)";
          EXPECT_EQ(t.peer, 0) << "the rank that raised it";
          EXPECT_EQ(static_cast<uint32_t>(t.value), fault_word(0, odd));
          continue;
        }
        // kNotAnIdentity's `odd` sees only equal identities, and its fault word raised by the
        // others (rank 0's raise first, the leave kernels in rank order): it records that fault.
        if (how == Diverge::kNotAnIdentity && r == odd && call >= kDivergeAt) {
          ASSERT_EQ(t.ready, t.epoch + 1) << "call " << call << ", rank " << r << ": no record";
          EXPECT_EQ(t.code, kPeerFault);
          EXPECT_EQ(t.call, static_cast<uint32_t>(kDivergeAt));
          EXPECT_EQ(t.peer, 0) << "the rank that raised it";
          EXPECT_EQ(static_cast<uint32_t>(t.value), fault_word(0, odd, true));
          continue;
        }
        // An empty slot: the rank records a wait for that rank that did not end (not a
        // divergence), naming it, or no rank where every slot is empty; no fault is raised
        // (after an abort the peers' words may be unmapped), so the others record nothing.
        const bool empty_slot = call >= kDivergeAt && ((how == Diverge::kNotDelivered && r != odd) ||
                                                       (how == Diverge::kNothingDelivered && r == 0));
        if (empty_slot) {
          ASSERT_EQ(t.ready, t.epoch + 1) << "call " << call << ", rank " << r << ": no record";
          EXPECT_EQ(t.code, kWaitTimeout);
          EXPECT_EQ(t.protocol, kProtoNccl);
          EXPECT_EQ(t.call, static_cast<uint32_t>(kDivergeAt));
          EXPECT_EQ(t.peer, how == Diverge::kNotDelivered ? odd : -1);
          EXPECT_EQ(comm.sinks[r]->fault(), 0u);
          continue;
        }
        if (!finds(r)) {
          EXPECT_NE(t.ready, t.epoch + 1) << "call " << call << ", rank " << r << ": a record, code " << t.code;
          EXPECT_EQ(comm.sinks[r]->fault(), 0u) << "call " << call << ", rank " << r;
          continue;
        }
        ASSERT_EQ(t.ready, t.epoch + 1) << "call " << call << ", rank " << r << ": no record";
        EXPECT_EQ(t.code, kDivergence) << "rank " << r;
        EXPECT_EQ(t.protocol, kProtoNccl) << "rank " << r;
        EXPECT_EQ(t.call, static_cast<uint32_t>(kDivergeAt)) << "rank " << r << ": the op's fallback call count at it";
        EXPECT_EQ(t.peer, r != odd ? odd : (odd == 0 ? 1 : 0)) << "rank " << r;
        EXPECT_FALSE(identity_equal(t.mine, t.theirs)) << "rank " << r;
        EXPECT_EQ(identity_protocol(t.mine), kProtoNccl) << "rank " << r;
        const uint32_t f = comm.sinks[r]->fault();
        EXPECT_TRUE(fault_is_divergence(f)) << "rank " << r << ": fault word " << f;
        switch (how) {
          case Diverge::kRejected:
            EXPECT_NE(identity_rejected(t.mine), identity_rejected(t.theirs)) << "rank " << r;
            break;
          case Diverge::kOtherM:
            EXPECT_NE(identity_size(t.mine), identity_size(t.theirs)) << "rank " << r;
            break;
          case Diverge::kOtherOp:
            EXPECT_NE(identity_op_serial(t.mine), identity_op_serial(t.theirs)) << "rank " << r;
            break;
          case Diverge::kNotAnIdentity:
            EXPECT_EQ(t.theirs.w[0], 0x3F803F80u) << "rank " << r << ": the slot's bytes as found";
            break;
          default:
            break;
        }
      }
    }
    for (int r = 0; r < tp; ++r) {  // the watchdog's progress counts: every call entered and left
      const std::vector<uint32_t> pc = progress[r].download<uint32_t>(2);
      EXPECT_EQ(pc[0], static_cast<uint32_t>(kCalls)) << "rank " << r;
      EXPECT_EQ(pc[1], static_cast<uint32_t>(kCalls)) << "rank " << r;
      EXPECT_EQ(ids[r].download<uint32_t>(1, kFallbackCallsOffset)[0], static_cast<uint32_t>(kCalls)) << "rank " << r << ": the call count";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, ConcurrentRanks, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

INSTANTIATE_TEST_SUITE_P(Tp, SimulatedRanks, ::testing::Values(2, 4, 8),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

}  // namespace
}  // namespace mhccl::gputest
