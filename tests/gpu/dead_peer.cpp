// A dead peer: run as two or more ranks under `mhccl-launch --grace`. After 20 checked calls the
// last rank kills itself (SIGKILL, mid-run, nothing torn down). Every other rank keeps calling
// AllReduceMHC and must get Error(kPeerTimeout) naming the dead rank (or, on the NCCL fallback,
// the stuck NCCL operation) within the wait budget (2 s here) plus a margin, then
// Error(kUnusable) on the next call, then tear its ops and communicator down without waiting
// for the dead peer, and exit 0. Modes (argv[1]): lamport (default: the Lamport paths), fallback
// (force_nccl_fallback: NCCL's wait, bounded by the watchdog, PROTOCOL.md I20), fallback-graph
// (the same, the survivor replaying a CUDA graph of calls captured before the death: no host
// call of the library runs while it is stuck), fallback-teardown (the fallback with the watchdog
// off: the survivor makes one call after the death, which NCCL holds, and destroys its op and
// communicator at once; their device synchronizations must end within the budget, which the
// watchdog's thread, started for teardown, brings about: PROTOCOL.md I20).
//
// Prints "dead peer: PASS ..." or "dead peer: FAIL ..." (ctest matches those lines; the
// launcher's own exit code is the dead rank's 137).
#include <csignal>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "common/devices.h"
#include "common/mhc_harness.h"
#include "mhccl/bootstrap.h"
#include "mhccl/communicator.h"
#include "mhccl/error.h"

namespace {

using namespace mhccl;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int fail(int rank, const std::string& why) {
  std::printf("dead peer: FAIL rank %d: %s\n", rank, why.c_str());
  return 1;
}

int run(const std::string& mode) {
  const bool fallback = mode != "lamport", graph = mode == "fallback-graph", teardown_only = mode == "fallback-teardown";
  if (mode != "lamport" && mode != "fallback" && mode != "fallback-graph" && mode != "fallback-teardown") {
    std::printf("dead peer: FAIL: unknown mode '%s' (lamport, fallback, fallback-graph, fallback-teardown)\n",
                mode.c_str());
    return 2;
  }
  const detail::DeviceCount devices = detail::cuda_device_count();
  const int count = devices.count;
  if (count == 0) {
    std::printf("dead peer: SKIPPED: no CUDA device (%s)\n", devices.why_none.c_str());
    return 77;
  }
  const RankEnvironment ranks = rank_environment();
  if (ranks.world_size < 2) {
    std::printf("dead peer: SKIPPED: needs 2 ranks (mhccl-launch -n 2 --grace 60 -- %s)\n", "mhccl_dead_peer_test");
    return 77;
  }
  const int device = ranks.local_rank % count;
  MHCCL_TEST_CUDA(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  MHCCL_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int rank = ranks.rank, tp = ranks.world_size, victim = tp - 1;
  constexpr uint64_t kBudgetMs = 2000;
  CommunicatorOptions o;
  o.wait_timeout_ms = kBudgetMs;
  o.force_nccl_fallback = fallback;
  o.watchdog = !teardown_only;
  auto comm = std::make_unique<Communicator>(share_unique_id(ranks), rank, tp, device, o);
  if (!fallback && !comm->peers_reachable()) {
    std::printf("dead peer: SKIPPED: peers not load/store reachable (no Lamport waits)\n");
    return 77;
  }
  AllReduceMHCConfig cfg;
  cfg.hidden_size = 5120;
  cfg.hc_mult = 4;
  cfg.max_num_tokens = 64;
  cfg.quantize_layer_input = true;
  cfg.two_shot_min_rows = 33;
  cfg.two_shot_min_finalize_rows = 33;
  auto op = std::make_unique<AllReduceMHC>(*comm, cfg);
  auto bufs = std::make_unique<testing::CallBuffers>(64, 5120, 4, 6);
  for (int c = 0; c < 20; ++c) {  // alive: checked calls across both protocols
    const testing::Problem p = testing::make_problem(90000 + c, c % 2 ? 3 : 40, 5120, 4, tp, c % 3 == 0);
    testing::upload(p, rank, *bufs);
    testing::launch(*op, p, testing::Variant::kMxfp8, Protocol::kAuto, *bufs, device, stream);
    MHCCL_TEST_CUDA(cudaStreamSynchronize(stream));
    const std::string err = testing::check(p, testing::Variant::kMxfp8, testing::download(p, testing::Variant::kMxfp8, *bufs));
    if (!err.empty()) return fail(rank, "call " + std::to_string(c) + " before the death: " + err);
  }
  // fallback-graph: a graph of 4 calls, captured (and replayed once, checked) while alive.
  cudaGraphExec_t exec = nullptr;
  const testing::Problem gp = testing::make_problem(90500, 8, 5120, 4, tp, false);
  if (graph) {
    testing::upload(gp, rank, *bufs);
    cudaGraph_t g;
    MHCCL_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 4; ++i) testing::launch(*op, gp, testing::Variant::kPlain, Protocol::kAuto, *bufs, device, stream);
    MHCCL_TEST_CUDA(cudaStreamEndCapture(stream, &g));
    MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, g, 0));
    MHCCL_TEST_CUDA(cudaGraphDestroy(g));
    MHCCL_TEST_CUDA(cudaGraphLaunch(exec, stream));
    MHCCL_TEST_CUDA(cudaStreamSynchronize(stream));
    const std::string err = testing::check(gp, testing::Variant::kPlain, testing::download(gp, testing::Variant::kPlain, *bufs));
    if (!err.empty()) return fail(rank, "the graph's replay before the death: " + err);
  }
  if (rank == victim) {
    std::printf("rank %d: 20 calls checked; dying now (SIGKILL)\n", rank);
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  if (teardown_only) {
    // One call the dead peer never joins (NCCL holds it on the GPU), then teardown at once: the
    // op's and the communicator's synchronizations wait behind it until the watchdog's thread,
    // which nothing started before (watchdog off), aborts it. The test's own buffers go last
    // (cudaFree synchronizes the device too, with no budget of the library's).
    const testing::Problem p = testing::make_problem(91000, 5, 5120, 4, tp, false);
    testing::upload(p, rank, *bufs);
    testing::launch(*op, p, testing::Variant::kPlain, Protocol::kAuto, *bufs, device, stream);
    const auto t1 = Clock::now();
    op.reset();
    comm.reset();
    const double teardown = since(t1);
    if (teardown > kBudgetMs / 1000.0 + 8.0) return fail(rank, "teardown took " + std::to_string(teardown) + " s");
    bufs.reset();
    cudaGetLastError();
    std::printf("dead peer: PASS (%s) rank %d: op and communicator torn down in %.2f s behind a fallback call "
                "the dead peer never joined (budget %llu ms, watchdog off)\n",
                mode.c_str(), rank, teardown, static_cast<unsigned long long>(kBudgetMs));
    return 0;
  }
  // A survivor: call on until the timeout arrives.
  const auto t0 = Clock::now();
  ErrorCode code = ErrorCode::kInvalidArgument;
  std::string message;
  int calls = 0;
  for (; calls < 50 && message.empty(); ++calls) {
    const testing::Problem p = testing::make_problem(91000 + calls, calls % 2 ? 5 : 50, 5120, 4, tp, false);
    try {
      if (graph) {
        MHCCL_TEST_CUDA(cudaGraphLaunch(exec, stream));  // no library call: the watchdog thread must see it
      } else {
        testing::upload(p, rank, *bufs);
        testing::launch(*op, p, testing::Variant::kPlain, Protocol::kAuto, *bufs, device, stream);
      }
      cudaStreamSynchronize(stream);  // returns once the stuck operation was aborted (its status aside)
      cudaGetLastError();
      comm->check_errors();
    } catch (const Error& e) {
      code = e.code();
      message = e.what();
    }
  }
  const double waited = since(t0);
  if (message.empty()) return fail(rank, "no error in 50 calls after the peer died");
  if (code != ErrorCode::kPeerTimeout) return fail(rank, std::string("expected kPeerTimeout, got ") + error_code_name(code) + ": " + message);
  if (fallback ? message.find("NCCL fallback") == std::string::npos
               : message.find("waited for rank " + std::to_string(victim)) == std::string::npos) {
    return fail(rank, "the error does not name rank " + std::to_string(victim) + ": " + message);
  }
  if (waited > kBudgetMs / 1000.0 + 8.0) return fail(rank, "the error took " + std::to_string(waited) + " s");
  if (comm->usable()) return fail(rank, "the communicator still says usable");
  try {
    const testing::Problem p = testing::make_problem(92000, 4, 5120, 4, tp, false);
    testing::launch(*op, p, testing::Variant::kPlain, Protocol::kAuto, *bufs, device, stream);
    return fail(rank, "an unusable communicator took a call");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kUnusable) return fail(rank, std::string("expected kUnusable, got ") + e.what());
  }
  const auto t1 = Clock::now();
  if (exec) cudaGraphExecDestroy(exec);
  bufs.reset();
  op.reset();
  comm.reset();
  MHCCL_TEST_CUDA(cudaStreamDestroy(stream));
  const double teardown = since(t1);
  if (teardown > 10.0) return fail(rank, "teardown took " + std::to_string(teardown) + " s");
  std::printf("dead peer: PASS (%s) rank %d: %s after %d calls and %.2f s (budget %llu ms): \"%s\"; "
              "next call kUnusable; teardown %.2f s\n",
              mode.c_str(), rank, error_code_name(code), calls, waited, static_cast<unsigned long long>(kBudgetMs),
              message.c_str(), teardown);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(argc > 1 ? argv[1] : "lamport");
  } catch (const std::exception& e) {
    std::printf("dead peer: FAIL: %s\n", e.what());
    return 1;
  }
}
