// mhccl-bench --ops simulated: the per-call time of AllReduceMHC's Lamport paths with TP = 2 and
// 4 ranks simulated on one GPU (tools/common/sim_ranks.h, the kernels the library launches, each
// rank's calls on its own stream, no host synchronization between calls). One GPU has no NVLink:
// every "peer" store is a store into this GPU's memory. What it measures is what a call's
// kernels cost in instructions, L2 round trips and the ranks' waits for one another, not an
// NVLink latency: the cost of the call identity and of the fault word per call, when builds with
// and without them (an experiment tree) are timed side by side.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "common/sim_ranks.h"

namespace mhccl::bench {
namespace {

using json = nlohmann::json;
using kernels::ErrorRecord;
using sim::ConcurrentGroup;
using sim::Kind;
using testing::CallBuffers;
using testing::Problem;
using testing::Variant;

// A path's grids of every rank must fit the device together (one GPU simulates them all): a
// CTA-per-row consumer waits for its peers' publish kernels, which cannot start while the
// spinning consumers hold every SM (TP = 4, publish + consumer at M = 64: 256 CTAs of 640
// threads on 132 SMs had every rank's waits expire on one H200, 2026-12-03). Real ranks, a GPU
// each, never need that. The two-shot at TP = 4, M = 64 (also 64 CTAs a rank) passed there: its
// consumers wait for owners that wait only for publish kernels, which had started; it is kept,
// and a recorded error would mark it failed.
struct Case {
  Kind kind;
  int64_t m;
  bool finalize;
};

// The seconds per call of `calls` calls of one case on every rank: each rank's calls captured
// into one CUDA graph on its own stream, the graphs launched together (every stream waits for
// one start event; rank 0's stream then waits for every rank's end), the median of `repeats`.
double time_case(ConcurrentGroup& g, const Case& cs, int calls, int repeats, std::vector<std::string>& errors) {
  const int tp = g.tp;
  const Problem p = testing::make_problem(4200 + static_cast<uint64_t>(cs.m) * 7 + tp, cs.m, ConcurrentGroup::kH,
                                          ConcurrentGroup::kHc, tp, cs.finalize);
  std::vector<std::unique_ptr<CallBuffers>> bufs;
  for (int r = 0; r < tp; ++r) {
    bufs.push_back(std::make_unique<CallBuffers>(p.m, ConcurrentGroup::kH, ConcurrentGroup::kHc, 6));
    testing::upload(p, r, *bufs.back());
  }
  std::vector<cudaGraphExec_t> execs(tp, nullptr);
  for (int r = 0; r < tp; ++r) {
    cudaStream_t s = g.ranks[r]->stream;
    cudaGraph_t graph;
    MHCCL_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) g.launch(r, cs.kind, p, Variant::kPlain, *bufs[r]);
    MHCCL_TEST_CUDA(cudaStreamEndCapture(s, &graph));
    MHCCL_TEST_CUDA(cudaGraphInstantiate(&execs[r], graph, 0));
    MHCCL_TEST_CUDA(cudaGraphDestroy(graph));
  }
  cudaStream_t s0 = g.ranks[0]->stream;
  std::vector<cudaEvent_t> ends(tp);
  cudaEvent_t start, stop;
  MHCCL_TEST_CUDA(cudaEventCreate(&start));
  MHCCL_TEST_CUDA(cudaEventCreate(&stop));
  for (cudaEvent_t& e : ends) MHCCL_TEST_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  auto run = [&] {
    MHCCL_TEST_CUDA(cudaEventRecord(start, s0));
    for (int r = 1; r < tp; ++r) MHCCL_TEST_CUDA(cudaStreamWaitEvent(g.ranks[r]->stream, start, 0));
    for (int r = 0; r < tp; ++r) MHCCL_TEST_CUDA(cudaGraphLaunch(execs[r], g.ranks[r]->stream));
    for (int r = 1; r < tp; ++r) {
      MHCCL_TEST_CUDA(cudaEventRecord(ends[r], g.ranks[r]->stream));
      MHCCL_TEST_CUDA(cudaStreamWaitEvent(s0, ends[r], 0));
    }
    MHCCL_TEST_CUDA(cudaEventRecord(stop, s0));
    MHCCL_TEST_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    MHCCL_TEST_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1e-3 / calls;
  };
  for (int w = 0; w < 3; ++w) run();
  std::vector<double> samples;
  for (int i = 0; i < repeats; ++i) samples.push_back(run());
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  for (int r = 0; r < tp; ++r) {
    const ErrorRecord t = g.sinks[r]->timeout();
    if (t.ready != 0 || g.sinks[r]->fault() != 0) {
      errors.push_back("TP=" + std::to_string(tp) + " " + sim::kind_name(cs.kind) + " M=" + std::to_string(cs.m) +
                       ": rank " + std::to_string(r) + " recorded code " + std::to_string(t.code));
    }
  }
  for (cudaGraphExec_t e : execs) MHCCL_TEST_CUDA(cudaGraphExecDestroy(e));
  for (cudaEvent_t e : ends) cudaEventDestroy(e);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int time_simulated_ranks(const Options& o, std::vector<json>& rows) {
  const std::vector<Case> cases = {
      {Kind::kSingle, 1, false},        {Kind::kSingle, 8, false},   {Kind::kSingle, 1, true},
      {Kind::kPhasedOneShot, 8, false}, {Kind::kTwoShot, 8, false}, {Kind::kTwoShot, 64, false},
      {Kind::kTwoShot, 8, true},
  };
  int failures = 0;
  std::printf("  simulated ranks on one GPU (no NVLink: instruction and round-trip costs only), plain, "
              "CUDA graphs of %d calls a rank, median of %d:\n", o.calls_per_graph, o.repeats);
  for (const int tp : {2, 4}) {
    for (const Case& cs : cases) {
      ConcurrentGroup g(tp, 128, 10'000'000'000ull);  // a fresh group a case: its states at generation 0
      g.capped_owners = false;  // the owners' grid as the library launches it at these M
      std::vector<std::string> errors;
      const double us = time_case(g, cs, o.calls_per_graph, o.repeats, errors) * 1e6;
      for (const std::string& e : errors) std::printf("    FAILED: %s\n", e.c_str());
      failures += !errors.empty();
      std::printf("    TP=%d %-38s %-8s M=%-3lld %7.2f us a call%s\n", tp, sim::kind_name(cs.kind),
                  cs.finalize ? "finalize" : "call", static_cast<long long>(cs.m), us, g.pdl() ? "" : " (no PDL)");
      rows.push_back(json{{"op", cs.finalize ? "allreduce_mhc.finalize" : "allreduce_mhc.call"},
                          {"variant", "plain"},
                          {"protocol", std::string("simulated ") + sim::kind_name(cs.kind)},
                          {"tp", tp},
                          {"simulated", true},
                          {"pdl", g.pdl()},
                          {"m", cs.m},
                          {"hidden", ConcurrentGroup::kH},
                          {"hc", ConcurrentGroup::kHc},
                          {"us_median", us},
                          {"correct", errors.empty() ? json(nullptr) : json(false)}});
    }
  }
  return failures;
}

}  // namespace mhccl::bench
