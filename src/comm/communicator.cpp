// Communicator: NCCL bootstrap, symmetric windows and the kernels' error record.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/communicator_impl.h"
#include "comm/nccl_version.h"
#include "comm/peer_table.h"
#include "common/build_info.h"
#include "common/check.h"
#include "common/debug.h"
#include "common/devices.h"
#include "common/hash.h"
#include "common/nvtx.h"
#include "common/text.h"
#include "kernels/launch.h"
#include "mhccl/checks.h"

namespace mhccl {
namespace {

const char* protocol_label(uint32_t p) {
  switch (p) {
    case kernels::kProtoOneShot: return "one-shot";
    case kernels::kProtoTwoShotOwner: return "two-shot (owner reduce)";
    case kernels::kProtoTwoShotReduced: return "two-shot (reduced rows)";
    case kernels::kProtoAllGather: return "all-gather";
    case kernels::kProtoNccl: return "NCCL fallback";
  }
  return "?";
}

const char* op_label(uint32_t op) {
  switch (op) {
    case kernels::kOpAllGather: return "LamportAllGather";
    case kernels::kOpAllReduceCall: return "AllReduceMHC.call";
    case kernels::kOpAllReduceFinalize: return "AllReduceMHC.finalize";
  }
  return "?";
}

const char* variant_label(uint32_t v) {
  switch (v) {
    case 0: return "plain";
    case 1: return "mxfp8";
    case 2: return "residual-only";
    case 3: return "fp8";
  }
  return "?";
}

// A call identity (kernels/params.h, CallIdentity) in words, for divergence messages.
std::string identity_text(const kernels::CallIdentity& id) {
  if ((id.w[3] >> 16) != kernels::kIdentityMagic) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "not a call header (0x%08x 0x%08x 0x%08x 0x%08x)", id.w[0], id.w[1], id.w[2], id.w[3]);
    return buf;
  }
  const uint32_t op = kernels::identity_op(id);
  std::string t = op_label(op);
  t += std::string(" ") + protocol_label(kernels::identity_protocol(id));
  if (op == kernels::kOpAllGather) {
    char digest[48];
    std::snprintf(digest, sizeof(digest), " (dtype and shape digest 0x%05x)", kernels::identity_layout(id));
    t += ", " + std::to_string(kernels::identity_size(id) * 16) + " bytes a rank" + digest;
  } else {
    t += std::string(" ") + variant_label(kernels::identity_variant(id)) + ", M=" + std::to_string(kernels::identity_size(id));
  }
  if (kernels::identity_protocol(id) == kernels::kProtoNccl) {  // no generation; the op's serial number
    // The serial counts the communicator's own agreement first: its first op is #1.
    t += ", op #" + std::to_string(static_cast<int>(kernels::identity_op_serial(id)) - 1) +
         " of the communicator (in construction order)";
  } else {
    t += ", generation " + std::to_string(kernels::identity_generation(id));
  }
  t += ", after " + std::to_string(kernels::identity_rejected(id)) + " rejected calls";
  return t;
}

}  // namespace

namespace comm {
std::string divergence_message(int rank, int peer, const std::string& where, const kernels::CallIdentity& mine,
                               const kernels::CallIdentity& theirs) {
  std::string why;
  if ((theirs.w[3] >> 16) != kernels::kIdentityMagic) {
    why = kernels::identity_protocol(mine) == kernels::kProtoNccl
              ? "its slot held no call identity: another NCCL operation paired with this call's exchange of "
                "identities (the ranks issued different sequences of NCCL operations on the communicator)"
              : "the slot held no call header of this protocol (a protocol bug, or memory written by something else)";
  } else if (kernels::identity_rejected(mine) != kernels::identity_rejected(theirs)) {
    why = "a call was rejected on one of these ranks but not on the other (a check that saw a per-rank difference, "
          "an allocation that failed on one rank, an exception the caller caught and went past), so their calls "
          "no longer pair";
  } else if (kernels::identity_op(mine) != kernels::identity_op(theirs)) {
    const bool both_all_reduce = kernels::identity_op(mine) != kernels::kOpAllGather &&
                                 kernels::identity_op(theirs) != kernels::kOpAllGather;
    why = both_all_reduce ? "the ranks made different calls at the same point (call on one, finalize on the other)"
          : kernels::identity_protocol(mine) == kernels::kProtoNccl
              ? "the ranks made different calls at the same point (an all-gather on one, an all-reduce on the "
                "other: on the NCCL fallback the ops of a communicator share one NCCL communicator, which pairs "
                "calls by their order)"
              : "the ranks made different calls at the same point (an all-gather on one, an all-reduce on the other)";
  } else if (kernels::identity_size(mine) != kernels::identity_size(theirs)) {
    why = kernels::identity_op(mine) == kernels::kOpAllGather ? "the ranks gathered different sizes at the same call"
                                                               : "the ranks called with different M at the same call";
  } else if (kernels::identity_op(mine) == kernels::kOpAllGather &&
             kernels::identity_layout(mine) != kernels::identity_layout(theirs)) {
    why = "the ranks gathered as many bytes of another dtype or shape at the same call";
  } else if (kernels::identity_variant(mine) != kernels::identity_variant(theirs)) {
    why = "the ranks asked for different outputs (variants) at the same call";
  } else if (kernels::identity_op_serial(mine) != kernels::identity_op_serial(theirs)) {
    why = "the ranks called different ops of the communicator at the same call (on the NCCL fallback its ops "
          "share one NCCL communicator, which pairs calls by their order)";
  } else {
    why = "the ranks' calls no longer pair";
  }
  return where + " on rank " + std::to_string(rank) + ": rank " + std::to_string(peer) +
         "'s contribution carries another call's identity: this rank: " + identity_text(mine) + "; rank " +
         std::to_string(peer) + ": " + identity_text(theirs) + ". " + why +
         ". The ranks of a group must make the same sequence of calls. " +
         (kernels::identity_protocol(mine) == kernels::kProtoNccl
              ? std::string("Every rank of the group compares every rank's identity of this call (the NCCL "
                            "fallback all-gathers them), so each finds it here; the outputs of this call are "
                            "wrong")
              : std::string("No rank stores into a mailbox after this (every rank of the group was told to stop)")) +
         "; the communicator is unusable: destroy it and its ops and build them again";
}
}  // namespace comm

namespace {

// The NCCL loaded at run time (the system's, or PyTorch's nvidia-nccl-cu13 wheel beside the
// Python package) may differ from the headers mhccl was built with: comm/nccl_version.h says
// which ones run that code (same major version, at least as new).
void check_nccl_version() {
  int v = 0;
  MHCCL_NCCL(ncclGetVersion(&v));
  const std::string why = comm::nccl_version_mismatch(v, NCCL_VERSION_CODE);
  if (!why.empty()) throw Error(ErrorCode::kNccl, why);
}

constexpr uint64_t kMaxWaitTimeoutMs = 24ull * 3600 * 1000;  // a day; ns stay far from 2^64

// The budget of every wait (options.wait_timeout_ms, or MHCCL_WAIT_TIMEOUT_MS), checked.
void init_budget(Communicator::Impl& im) {
  if (const char* env = std::getenv("MHCCL_WAIT_TIMEOUT_MS")) {
    char* end = nullptr;
    const long long ms = std::strtoll(env, &end, 10);
    if (*end != '\0' || ms < 1 || static_cast<uint64_t>(ms) > kMaxWaitTimeoutMs) {
      throw Error(ErrorCode::kInvalidArgument, std::string("MHCCL_WAIT_TIMEOUT_MS: expected 1 to ") +
                                                   std::to_string(kMaxWaitTimeoutMs) + " ms, got '" + env + "'");
    }
    im.options.wait_timeout_ms = static_cast<uint64_t>(ms);
  }
  if (im.options.wait_timeout_ms < 1 || im.options.wait_timeout_ms > kMaxWaitTimeoutMs) {
    throw Error(ErrorCode::kInvalidArgument, "wait_timeout_ms: expected 1 to " +
                                                 std::to_string(kMaxWaitTimeoutMs) + " ms, got " +
                                                 std::to_string(im.options.wait_timeout_ms));
  }
}

// MHCCL_DEBUG=INFO: what this construction decided (the NCCL library, reachability, budgets).
void report_construction(const Communicator::Impl& im, int lsa) {
  detail::Text t;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, im.device) == cudaSuccess) {
    t << "GPU " << p.name << ", compute capability " << p.major << "." << p.minor << ", kernels: "
      << detail::kernels_for(detail::cuda_architectures(), p.major, p.minor) << "\n";
  }
  t << "NCCL library " << detail::nccl_library_text() << "\n";
  t << "NCCL communicator: "
    << (!im.owns_comm ? "the caller's (its calls polled within the budget where it is non-blocking)"
        : im.nonblocking ? "made by mhccl, non-blocking (every wait on it polled within the budget)"
                         : "made by mhccl, blocking (TP=1: no peer to wait for)")
    << "\n";
  t << "peers load/store reachable: " << (lsa == im.tp ? "yes" : "no") << " (NCCL's LSA team: " << lsa << " of "
    << im.tp << " ranks)" << (im.options.force_nccl_fallback ? ", NCCL fallback forced" : "") << "; ops run "
    << (im.tp == 1 ? "without peers (TP=1)" : im.reachable ? "the Lamport protocols" : "the NCCL fallback (ncclAllReduce / ncclAllGather)")
    << "\n";
  int count = 0;
  if (im.tp > 1 && cudaGetDeviceCount(&count) == cudaSuccess && count > 1) {
    t << "cudaDeviceCanAccessPeer from cuda:" << im.device << ":";
    for (int d = 0; d < count; ++d) {
      int can = 0;
      if (d == im.device) continue;
      if (cudaDeviceCanAccessPeer(&can, im.device, d) != cudaSuccess) cudaGetLastError();
      t << " cuda:" << d << " " << (can ? "yes" : "no");
    }
    t << "\n";
  }
  t << "wait budget " << im.options.wait_timeout_ms << " ms (CommunicatorOptions::wait_timeout_ms, MHCCL_WAIT_TIMEOUT_MS), "
    << "fallback watchdog " << (im.options.watchdog ? "on" : "off") << "\n";
  detail::debug_print("rank " + std::to_string(im.rank) + "/" + std::to_string(im.tp) + " cuda:" +
                          std::to_string(im.device) + " Communicator",
                      t.str());
}

void init_common(Communicator::Impl& im) {
  detail::DeviceGuard guard(im.device);
  MHCCL_CUDA(cudaStreamCreateWithFlags(&im.setup_stream, cudaStreamNonBlocking));
  MHCCL_CUDA(cudaMalloc(&im.setup_words, Communicator::Impl::kSetupWords * sizeof(int)));
  MHCCL_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&im.setup_host), Communicator::Impl::kSetupWords * sizeof(int),
                           cudaHostAllocDefault));
  MHCCL_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&im.record), 2 * sizeof(kernels::ErrorRecord),
                           cudaHostAllocMapped));
  std::memset(im.record, 0, 2 * sizeof(kernels::ErrorRecord));
  MHCCL_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&im.record_device), im.record, 0));
  MHCCL_CUDA(cudaMalloc(&im.device_words, 2 * sizeof(uint32_t)));
  MHCCL_CUDA(cudaMemset(im.device_words, 0, 2 * sizeof(uint32_t)));
  MHCCL_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&im.fallback_progress), 2 * sizeof(uint32_t), cudaHostAllocMapped));
  im.fallback_progress[0] = im.fallback_progress[1] = 0;
  MHCCL_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&im.fallback_progress_device), im.fallback_progress, 0));
  const int lsa = im.tp == 1 ? 1 : comm::lsa_team_size(im.comm);
  im.reachable = lsa == im.tp;
  // Every rank takes the same path (Lamport or the NCCL fallback): the forced fallback agreed. The
  // wait budget too: the record names the stalled rank only where the waits that wait for it
  // expire first (a two-shot consumer's budget is twice its owners', I12b), on every rank alike.
  im.agree("Communicator",
           {{"force_nccl_fallback", im.options.force_nccl_fallback},
            {"peers reachable", im.reachable},
            {"wait_timeout_ms (CommunicatorOptions or MHCCL_WAIT_TIMEOUT_MS)",
             static_cast<int64_t>(im.options.wait_timeout_ms)}},
           nullptr);
  if (im.options.force_nccl_fallback) im.reachable = false;
  im.alloc_window(Communicator::Impl::kFaultWindowBytes, 0u, im.reachable && im.tp > 1, im.fault_window);
  im.setup_wait("Communicator construction");
  if (detail::debug_info()) {
    try {  // a report that fails must not fail a construction every rank completed
      report_construction(im, lsa);
    } catch (const std::exception& e) {
      detail::debug_print("Communicator", std::string("the construction report failed: ") + e.what());
    }
  }
}

// The message of a fault another rank raised (a kPeerFault record, or the fault word read by
// check_errors() and at construction): the rank that raised it, the peer it gave up on, and why.
std::string fault_message(int rank, const std::string& where, uint32_t word, uint64_t timeout_ms) {
  const int raised_by = kernels::fault_timed_out_rank(word), peer = kernels::fault_waited_for(word);
  std::string msg = where + " on rank " + std::to_string(rank) + ": rank " + std::to_string(raised_by);
  if (kernels::fault_is_divergence(word)) {
    msg += " found that rank " + std::to_string(peer) +
           "'s contribution to a call carried another call's identity (the ranks diverged: a call rejected on some "
           "ranks only, another M, call against finalize, another op or variant at the same point; rank " +
           std::to_string(raised_by) + "'s error names both identities)";
  } else {
    msg += " waited for rank " + std::to_string(peer) + " longer than " + std::to_string(timeout_ms) + " ms (rank " +
           std::to_string(peer) + " died, hung, or issued a different sequence of calls)";
  }
  return msg + " and stopped the group: no rank stores into a mailbox after a fault, so this rank's calls from then "
               "on did not complete (on the NCCL fallback they completed, but their rows may be another call's: their "
               "outputs are not to be used). The communicator is unusable: destroy it and its ops and build them again";
}

ErrorCode fault_code(uint32_t word) {
  return kernels::fault_is_divergence(word) ? ErrorCode::kDivergence : ErrorCode::kPeerTimeout;
}

}  // namespace

Communicator::Impl::~Impl() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  free_window(fault_window);  // before the NCCL communicator goes (its window is registered there)
  // The watchdog after that: the window's free may synchronize the device behind a fallback
  // operation stuck on a dead peer, which only the watchdog's abort ends (watch_teardown).
  stop_watchdog();
  // After a peer timeout the peers may be dead and kernels (an NCCL collective of this
  // communicator) may wait for them: abort first, which waits for nobody and stops NCCL's
  // kernels, before anything that synchronizes the device. A healthy communicator is finalized
  // (which flushes its operations and may wait for peers: within the budget, else aborted).
  const bool failed = peer_failed();
  if (owns_comm && comm && !failed) {
    if (nonblocking) {
      const ncclResult_t st = ncclCommFinalize(comm);
      if ((st != ncclSuccess && st != ncclInProgress) || !nccl_settles_quietly()) abort_nccl();
    }
  }
  if (owns_comm && comm && (failed || unusable)) abort_nccl();
  if (!owns_comm && (failed || unusable)) {
    // The caller's NCCL communicator, not aborted yet (its owner aborts it after this, as the
    // error said): an NCCL operation of it may still wait for a dead peer, and a synchronization
    // or a free (cudaFree and cudaFreeHost synchronize) would wait with it. The small host and
    // device buffers are left to the process's end instead (a review, 2026-12-05).
    if (prev >= 0) cudaSetDevice(prev);
    return;
  }
  if (setup_stream) cudaStreamSynchronize(setup_stream);
  if (record) cudaFreeHost(record);
  record = nullptr;
  if (fallback_progress) cudaFreeHost(fallback_progress);
  if (device_words) cudaFree(device_words);
  if (setup_words) cudaFree(setup_words);
  if (setup_host) cudaFreeHost(setup_host);
  if (setup_stream) cudaStreamDestroy(setup_stream);
  if (owns_comm && comm) ncclCommDestroy(comm);
  for (void* p : orphaned) ncclMemFree(p);
  for (void* p : orphaned_device) cudaFree(p);
  if (prev >= 0) cudaSetDevice(prev);
}

// --- Budgets on host-side waits (PROTOCOL.md, I20) ----------------------------------------------
namespace {
using Clock = std::chrono::steady_clock;
// Polls `done()` (true: finished) until it is, or `budget_ms` passed: a few spins, then sleeps
// growing to a millisecond (construction and teardown only).
template <class Done>
bool poll_within(uint64_t budget_ms, Done done) {
  const Clock::time_point end = Clock::now() + std::chrono::milliseconds(budget_ms);
  std::chrono::microseconds nap(20);
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (Clock::now() > end) return done();
    if (i > 64) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
}
}  // namespace

void Communicator::Impl::abort_nccl() {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex);
  if (owns_comm && comm != nullptr) {
    ncclCommAbort(comm);  // waits for no peer; ends the communicator's kernels
    comm = nullptr;
  }
}

void Communicator::Impl::budget_expired(const char* what) {
  const std::string budget = std::to_string(options.wait_timeout_ms) + " ms";
  std::string msg = std::string(what) + " on rank " + std::to_string(rank) + ": waited longer than " + budget +
                    " (CommunicatorOptions::wait_timeout_ms, MHCCL_WAIT_TIMEOUT_MS) for the other ranks of the "
                    "group: a peer died, hung, failed earlier (its own error says why), or is building another op "
                    "or none at this point. ";
  if (owns_comm && tp == 1) {
    // No peer, so no NCCL kernel waits for one: nothing to abort (ncclCommAbort would wait for
    // the device's work: measured on one H200, 40e1d8c, the raise came only when the held work
    // ended, 3.0 s, for a budget of 0.3 s).
    msg += "This communicator is unusable: destroy it and its ops and build them again";
  } else if (owns_comm) {
    abort_nccl();
    msg += "The NCCL communicator was aborted; this communicator is unusable: destroy it and its ops and build "
           "them again";
  } else {
    msg += "The NCCL communicator is the caller's: abort it (ncclCommAbort) after destroying this communicator "
           "and its ops, which are unusable (destroying them waits for no peer)";
  }
  fail(ErrorCode::kPeerTimeout, msg, ErrorContext{-1, -1, what});
}

// Polls the non-blocking communicator until its pending operation settles or the budget passes;
// `state` then holds what ncclCommGetAsyncError last said (ncclInProgress: not settled).
bool Communicator::Impl::nccl_settled(ncclResult_t& state) {
  return poll_within(options.wait_timeout_ms, [&] {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
    return state != ncclInProgress;
  });
}

void Communicator::Impl::nccl_wait(ncclResult_t status, const char* what) {
  detail::check_nccl(status, what);
  if (!nonblocking || comm == nullptr) return;
  ncclResult_t state = status;
  if (!nccl_settled(state)) budget_expired(what);
  detail::check_nccl(state, what);
}

bool Communicator::Impl::nccl_settles_quietly() {
  if (!nonblocking || comm == nullptr) return true;
  ncclResult_t state = ncclInProgress;
  return nccl_settled(state) && state == ncclSuccess;
}

void Communicator::Impl::setup_wait(const char* what) {
  // It asks the NCCL communicator for its errors: under nccl_mutex, which the watchdog takes to
  // abort it (bounded: the wait is).
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex);
  cudaError_t st = cudaSuccess;
  ncclResult_t async = ncclSuccess;
  const bool done = poll_within(options.wait_timeout_ms, [&] {
    st = cudaStreamQuery(setup_stream);
    if (st != cudaErrorNotReady) return true;
    // A peer that aborted, or NCCL's own error, ends the wait with that error.
    if (nonblocking && comm != nullptr && ncclCommGetAsyncError(comm, &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress) {
      return true;
    }
    return false;
  });
  if (!done) budget_expired(what);
  if (st == cudaErrorNotReady) {
    abort_nccl();
    detail::check_nccl(async, what);
  }
  detail::check_cuda(st, what);
}

// --- The NCCL fallback's watchdog ----------------------------------------------------------------
bool Communicator::Impl::FallbackWatch::stuck(uint32_t entered_now, uint32_t left_now, Clock::time_point now,
                                              uint64_t budget_ms) {
  if (entered_now == left_now || entered_now != entered || left_now != left) {
    entered = entered_now;  // idle, or progress since the last look: the clock starts again
    left = left_now;
    since = now;
    return false;
  }
  return now - since > std::chrono::milliseconds(budget_ms);
}

// One look of the watchdog (the caller holds nccl_mutex): whether the fallback's progress counts
// show an operation stuck past the budget; then the communicator is aborted and the reason kept.
bool Communicator::Impl::watch_fallback() {
  if (watchdog_tripped) return true;
  const volatile uint32_t* w = fallback_progress;
  if (w == nullptr || !fallback_watch.stuck(w[0], w[1], Clock::now(), options.wait_timeout_ms)) return false;
  watchdog_reason = "NCCL fallback on rank " + std::to_string(rank) + ": an NCCL operation of this group waited "
                    "longer than " + std::to_string(options.wait_timeout_ms) +
                    " ms (CommunicatorOptions::wait_timeout_ms) for a peer that died, hung, or issued a different "
                    "sequence of calls; the watchdog aborted the NCCL communicator" +
                    (owns_comm ? "" : " (it is the caller's: ncclCommAbort was not called; abort it)") +
                    ". The communicator is unusable: destroy it and its ops and build them again";
  abort_nccl();
  watchdog_tripped = true;
  return true;
}

bool Communicator::Impl::start_watchdog() {
  std::lock_guard<std::mutex> started(watchdog_thread);
  return start_watchdog_locked();
}

bool Communicator::Impl::start_watchdog_locked() {
  if (watchdog.joinable()) return false;
  // The background half of the watchdog: looks every tenth of the budget (10 ms to 1 s).
  const auto every = std::chrono::milliseconds(std::min<uint64_t>(1000, std::max<uint64_t>(10, options.wait_timeout_ms / 10)));
  watchdog = std::thread([this, every] {
    std::unique_lock<std::mutex> sleep(watchdog_sleep);
    while (!watchdog_wake.wait_for(sleep, every, [this] { return watchdog_stop.load(); })) {
      sleep.unlock();
      {
        std::lock_guard<std::recursive_mutex> lock(nccl_mutex);
        if (watch_fallback()) return;
      }
      sleep.lock();
    }
  });
  return true;
}

bool Communicator::Impl::watch_teardown() noexcept {
  if (!fallback_ran || watchdog_tripped) return false;
  std::lock_guard<std::mutex> started(watchdog_thread);
  try {
    if (start_watchdog_locked()) watchdog_for_teardown = !options.watchdog;
  } catch (...) {  // no thread to be had: the synchronization is unbounded, as it was before
    return false;
  }
  ++teardown_watches;
  return true;
}

void Communicator::Impl::unwatch_teardown() noexcept {
  std::lock_guard<std::mutex> started(watchdog_thread);
  if (--teardown_watches == 0 && watchdog_for_teardown) stop_watchdog_locked();
}

void Communicator::Impl::stop_watchdog() noexcept {
  std::lock_guard<std::mutex> started(watchdog_thread);
  stop_watchdog_locked();
}

void Communicator::Impl::stop_watchdog_locked() noexcept {
  if (!watchdog.joinable()) return;
  {
    std::lock_guard<std::mutex> sleep(watchdog_sleep);
    watchdog_stop = true;
  }
  watchdog_wake.notify_all();
  watchdog.join();
  watchdog_stop = false;
  watchdog_for_teardown = false;
}

void Communicator::Impl::check_fallback() {
  if (!watchdog_tripped && fallback_progress != nullptr && fallback_progress[0] != 0) {
    std::lock_guard<std::recursive_mutex> lock(nccl_mutex);
    watch_fallback();
  }
  if (watchdog_tripped && !unusable) fail(ErrorCode::kPeerTimeout, watchdog_reason, ErrorContext{-1, -1, "NCCL fallback"});
}

void Communicator::Impl::require_nccl(const std::string& what) const {
  if (comm == nullptr) throw Error(ErrorCode::kUnusable, what + ": the NCCL communicator was aborted");
}

namespace {
// What a failure of any type says (an Error's message and context, a std::exception's message).
std::string failure_text(std::exception_ptr failure, ErrorContext& context) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    context = e.context();
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return "an exception of unknown type";
}
}  // namespace

void Communicator::Impl::apart_after_launch(const char* what, std::exception_ptr failure) {
  if (tp <= 1 || unusable) return;
  const std::string why = failure_text(failure, unusable_context);
  unusable = true;
  unusable_reason = std::string(what) + " on rank " + std::to_string(rank) + " failed after its first launch (" + why +
                    "): this rank's protocol state is apart from its peers'; destroy the communicator and its ops and "
                    "build them again";
}

void Communicator::Impl::apart_after_agreement(const char* what, std::exception_ptr failure) {
  if (unusable) return;
  const std::string why = failure_text(failure, unusable_context);
  unusable = true;
  unusable_reason = std::string(what) + " construction on rank " + std::to_string(rank) +
                    " failed after the configuration agreement (" + why +
                    "); its peers raise kPeerTimeout in the collective it left. Destroy the communicator and its ops "
                    "and build them again";
}

void Communicator::Impl::fallback_call(const char* who, kernels::ErrorSink err, kernels::CallIdentity id, void* ids,
                                       const std::function<ncclResult_t()>& rows, cudaStream_t stream, const char* what,
                                       bool& launched) {
  // The watchdog's thread first: its start can fail (std::system_error), and a failure before the
  // enter kernel leaves the call rejected on this rank (its count, which the peers' identities
  // then differ by), not half made. Before nccl_mutex: a stop (a teardown on another thread)
  // holds the thread's start and stop while it joins the thread, which takes nccl_mutex.
  if (options.watchdog) start_watchdog();
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex);
  require_nccl(who);
  kernels::FallbackParams fp = {};
  fp.err = err;
  fp.id = id;
  fp.progress = fallback_progress_device;
  fp.ids = ids;
  fp.fault_own = static_cast<const uint32_t*>(fault_window.ptr);  // its own allocation (sink: the peer mapping)
  fp.tp = tp;
  fallback_ran = true;  // before the enter kernel: teardown watches from here (watch_teardown)
  MHCCL_CUDA(kernels::launch_fallback_enter(fp, stream));
  launched = true;
  char* slots = static_cast<char*>(ids);
  nccl_wait(ncclAllGather(slots, slots + 16, 16, ncclUint8, comm, stream), "ncclAllGather of the NCCL fallback's call identities");
  nccl_wait(rows(), what);
  MHCCL_CUDA(kernels::launch_fallback_leave(fp, stream));
}

void Communicator::Impl::ready_fallback_ids(void*& ids, cudaStream_t stream) {
  if (ids == nullptr) MHCCL_CUDA(cudaMalloc(&ids, static_cast<size_t>(kernels::fallback_ids_bytes())));
  MHCCL_CUDA(cudaMemsetAsync(ids, 0, static_cast<size_t>(kernels::fallback_ids_bytes()), stream));
}

void Communicator::Impl::release(std::initializer_list<void*> ptrs) {
  if (peer_failed()) {
    for (void* p : ptrs) if (p) orphaned_device.push_back(p);
    return;
  }
  const bool watched = watch_teardown();  // the synchronization below may wait behind a fallback operation
  detail::release_device_memory(device, ptrs);
  if (watched) unwatch_teardown();
}

bool Communicator::Impl::peer_failed() {
  if (unusable || fault_seen || watchdog_tripped) return true;
  if (record == nullptr) return false;
  const volatile kernels::ErrorRecord* r = record + kernels::kTimeoutRecord;
  if (r->ready == r->epoch + 1) return true;
  return read_fault_word() != 0;
}

uint32_t Communicator::Impl::read_fault_word(cudaError_t* copy_error) {
  if (copy_error) *copy_error = cudaSuccess;
  if (fault_window.ptr == nullptr || fault_window.plain) return 0;  // no peer stores into it
  uint32_t word = 0;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  // A copy on the setup stream (non-blocking: it waits for no kernel of another stream), in the
  // relaxed capture mode: a synchronous copy is an unsafe call while a graph is captured in the
  // global mode (torch.cuda.graph's default), which would refuse it and invalidate that capture;
  // this copy is no part of any graph. A copy that fails leaves the word unknown: taken as set,
  // so teardown waits for no peer.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  if (!exchanged) cudaGetLastError();  // its own error: the copy below says whether it matters
  cudaError_t st = cudaMemcpyAsync(&word, fault_word_local(), sizeof(word), cudaMemcpyDeviceToHost, setup_stream);
  if (st == cudaSuccess) st = cudaStreamSynchronize(setup_stream);
  if (exchanged) cudaThreadExchangeStreamCaptureMode(&mode);
  if (st != cudaSuccess) {
    cudaGetLastError();  // this failure's own error (a sticky one stays)
    word = kernels::fault_word(rank, rank);
    if (copy_error) *copy_error = st;
  }
  if (prev >= 0) cudaSetDevice(prev);
  if (word != 0) fault_seen = true;
  return word;
}

void Communicator::Impl::check_fault_word(const char* what) {
  cudaError_t copy_error = cudaSuccess;
  const uint32_t word = read_fault_word(&copy_error);
  if (copy_error != cudaSuccess) {
    fail(ErrorCode::kCuda,
         std::string(what) + " on rank " + std::to_string(rank) + ": reading this rank's fault word failed (" +
             cudaGetErrorName(copy_error) + ": " + cudaGetErrorString(copy_error) +
             "), so whether a peer gave up a wait or found a divergence is unknown. The communicator is unusable: "
             "destroy it and its ops and build them again",
         ErrorContext{-1, -1, what});
  }
  if (word != 0) {
    fail(fault_code(word), fault_message(rank, what, word, options.wait_timeout_ms),
         ErrorContext{kernels::fault_timed_out_rank(word), -1, what});
  }
}

kernels::ErrorSink Communicator::Impl::sink(uint32_t op) const {
  kernels::ErrorSink s;
  s.records = record_device;
  s.claims = device_words;
  s.fault = fault_word_local();
  s.fault_peers = reinterpret_cast<uint32_t* const*>(fault_window.peers_device);
  s.fault_ranks = static_cast<int>(fault_window.peers.size());
  s.rank = rank;
  s.timeout_ns = options.wait_timeout_ms * 1000000ull;
  s.op = op;
  return s;
}

void Communicator::Impl::fail(ErrorCode code, const std::string& message, ErrorContext context) {
  unusable = true;
  unusable_reason = message;
  // A caller's NCCL communicator with an operation stuck past the budget: the watchdog did not
  // abort it, and its reason, which says so, is the caller's only word of it. Kept beside
  // whatever error is reported first (a review, 2026-12-05).
  if (!owns_comm && watchdog_tripped && message != watchdog_reason) {
    unusable_reason += ". Besides, the NCCL fallback's watchdog tripped: " + watchdog_reason;
  }
  unusable_context = context;
  throw Error(code, unusable_reason, std::move(context));
}

void Communicator::Impl::check_for_construction(const char* what) {
  check();
  check_fault_word(what);
}

void Communicator::Impl::require_device_memory(const std::string& what, uint64_t bytes, const char* lower) const {
  if (bytes == 0) return;
  size_t free_bytes = 0, total_bytes = 0;
  detail::DeviceGuard guard(device);
  MHCCL_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > free_bytes) {
    throw Error(ErrorCode::kInvalidArgument,
                what + ": needs " + detail::bytes_text(bytes) + " of device memory on rank " +
                    std::to_string(rank) + " (cuda:" + std::to_string(device) + "), which has " +
                    detail::bytes_text(free_bytes) + " free of " + detail::bytes_text(total_bytes) + "; " + lower +
                    " (nothing was allocated; the communicator stays usable)");
  }
}

void Communicator::Impl::check(bool report_routes) {
  if (unusable) throw Error(ErrorCode::kUnusable, unusable_reason, unusable_context);
  volatile kernels::ErrorRecord* r = record + kernels::kTimeoutRecord;
  // What this rank's kernels recorded comes before the watchdog's timeout: a divergence, a
  // peer's fault (a timeout or a divergence, with the rank that raised it) or a Lamport wait that
  // gave up (naming the rank it waited for). On the NCCL fallback such a fault can leave a later
  // call with no partner, whose stuck operation the watchdog then ends (PROTOCOL.md I19); the
  // record names the cause and the rank, the watchdog's timeout neither. The one record an abort
  // itself leaves, the fallback's identity not delivered (kWaitTimeout of kProtoNccl), comes
  // after the watchdog's timeout, the cause of its empty slot.
  const bool recorded = r->ready == r->epoch + 1;
  if (!recorded || (r->code == kernels::kWaitTimeout && r->protocol == kernels::kProtoNccl)) check_fallback();
  // A timeout first (fatal), then, for check_errors() only, a route report.
  if (r->ready != r->epoch + 1) {
    if (!report_routes) return;  // route reports are left for check_errors()
    // A fault another rank raised that no kernel of this rank has seen yet (this rank idle, or
    // its kernels still queued): read this rank's fault word itself.
    check_fault_word("Communicator");
    r = record + kernels::kRouteRecord;
    if (r->ready != r->epoch + 1) return;
  }
  const uint32_t epoch = r->epoch;
  kernels::ErrorRecord e{};
  e.code = r->code;
  e.op = r->op;
  e.protocol = r->protocol;
  e.peer = r->peer;
  e.generation = r->generation;
  e.row = r->row;
  e.value = r->value;
  e.call = r->call;
  for (int i = 0; i < 4; ++i) {
    e.mine.w[i] = r->mine.w[i];
    e.theirs.w[i] = r->theirs.w[i];
  }
  r->epoch = epoch + 1;  // consumed: the next error of its kind may be recorded
  // A peer the record names outside the group (a corrupted or foreign record) is no rank.
  if (e.peer < 0 || e.peer >= tp) e.peer = -1;
  const bool timeout_record = r == record + kernels::kTimeoutRecord;
  // Built without iostreams (see src/ops/checks.cpp).
  const std::string op = op_label(e.op);
  const bool known = timeout_record ? (e.code == kernels::kPeerFault || e.code == kernels::kDivergence ||
                                       e.code == kernels::kWaitTimeout)
                                    : e.code == kernels::kBadRoute;
  if (!known) {
    // Never a route report: from an op's call that would reject the call on this rank only.
    fail(ErrorCode::kUnusable, op + " on rank " + std::to_string(rank) + ": the kernels left an error record of unknown kind " +
                                   std::to_string(e.code) + " (op " + std::to_string(e.op) + ", protocol " +
                                   std::to_string(e.protocol) + "): a library mismatch or a corrupted record. The "
                                   "communicator is unusable: destroy it and its ops and build them again",
         ErrorContext{-1, static_cast<int64_t>(e.call), op});
  }
  const std::string where = op + " (" + protocol_label(e.protocol) + ", call " + std::to_string(e.call) + ")";
  if (e.code == kernels::kPeerFault) {
    const uint32_t word = static_cast<uint32_t>(e.value);
    fail(fault_code(word), fault_message(rank, where, word, options.wait_timeout_ms),
         ErrorContext{e.peer, static_cast<int64_t>(e.call), op});
  }
  if (e.code == kernels::kDivergence) {
    // The NCCL fallback's check (PROTOCOL.md I19) has no generation or row: `call` is the op's
    // count of fallback calls.
    const std::string at = e.protocol == kernels::kProtoNccl
                               ? where
                               : where + ", generation " + std::to_string(e.generation) + ", " +
                                     (e.protocol == kernels::kProtoAllGather ? "pack " : "row ") + std::to_string(e.row);
    fail(ErrorCode::kDivergence, comm::divergence_message(rank, e.peer, at, e.mine, e.theirs),
         ErrorContext{e.peer, static_cast<int64_t>(e.call), op});
  }
  if (e.code == kernels::kWaitTimeout && e.protocol == kernels::kProtoNccl) {
    // The NCCL fallback's exchange of identities left that rank's slot empty (PROTOCOL.md I19).
    const std::string who = e.peer >= 0 ? "rank " + std::to_string(e.peer) + "'s call identity did not arrive in"
                                        : std::string("no rank's call identity (this rank's own neither) arrived in");
    fail(ErrorCode::kPeerTimeout,
         where + " on rank " + std::to_string(rank) + ": " + who +
             " the NCCL fallback's exchange: its NCCL operation was aborted (a peer died, hung, or issued a "
             "different sequence of calls), or another operation paired with it, so the call's rows are not taken "
             "for this call's. The communicator is unusable: destroy it and its ops and build them again",
         ErrorContext{e.peer, static_cast<int64_t>(e.call), op});
  }
  if (e.code == kernels::kWaitTimeout) {
    const std::string peer = e.peer >= 0 ? std::to_string(e.peer) : std::string("(unknown)");
    const std::string msg =
        op + " on rank " + std::to_string(rank) + ": waited for rank " + peer +
        " (" + protocol_label(e.protocol) + ", generation " + std::to_string(e.generation) + ", " +
        (e.protocol == kernels::kProtoAllGather ? "pack " : "row ") + std::to_string(e.row) + ", call " +
        std::to_string(e.call) + ") longer than " + std::to_string(options.wait_timeout_ms) + " ms; rank " + peer +
        " died, hung, or issued a different sequence of calls. Every rank of the group was told to stop "
        "(no rank stores into a mailbox after it). The communicator is unusable: "
        "destroy it and its ops and build them again";
    fail(ErrorCode::kPeerTimeout, msg, ErrorContext{e.peer, static_cast<int64_t>(e.call), op});
  }
  throw Error(ErrorCode::kInvalidRoute,
              op + " on rank " + std::to_string(rank) + ": expanded_idx_to_permuted_idx of row " +
                  std::to_string(e.row) + " holds " + std::to_string(e.value) +
                  ", outside [-1, rows of gemm2_permuted); that route was skipped",
              ErrorContext{-1, -1, op});
}

void Communicator::Impl::all_reduce_ints(int* values, int n, ncclRedOp_t op, const char* what) {
  if (n < 1 || n > kSetupWords) {
    throw Error(ErrorCode::kInvalidArgument, "all_reduce_ints (internal): expected 1 to " +
                                                 std::to_string(kSetupWords) + " values, got " + std::to_string(n));
  }
  detail::DeviceGuard guard(device);
  // Under nccl_mutex (the fallback's watchdog may abort the NCCL communicator from its thread);
  // every wait below is bounded by the budget, so the watchdog waits at most that long for it.
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex);
  if (tp > 1) {
    require_nccl(what);
    // Through pinned host ints: a copy to or from pageable memory returns only once the stream's
    // earlier work (the all-reduce, which waits for every peer) has completed, which would hold
    // this thread, and nccl_mutex, past the budget (a review, 2026-12-05); from pinned memory
    // both copies are asynchronous and setup_wait's bounded poll covers the all-reduce.
    std::copy(values, values + n, setup_host);
    MHCCL_CUDA(cudaMemcpyAsync(setup_words, setup_host, n * sizeof(int), cudaMemcpyHostToDevice, setup_stream));
    nccl_wait(ncclAllReduce(setup_words, setup_words, n, ncclInt32, op, comm, setup_stream), what);
    MHCCL_CUDA(cudaMemcpyAsync(setup_host, setup_words, n * sizeof(int), cudaMemcpyDeviceToHost, setup_stream));
  }
  setup_wait(what);
  if (tp > 1) std::copy(setup_host, setup_host + n, values);
}

void Communicator::Impl::barrier(const char* what) {
  int word[1] = {0};
  all_reduce_ints(word, ncclSum, what);
}

namespace comm {

std::vector<int> agreement_words(const ConfigFields& fields, bool valid) {
  // Per 32-bit half h of every field, h and ~h: after an all-reduce with ncclMax they hold
  // max(h) and max(~h) = ~min(h) over the ranks, so a field agrees iff both halves' min equals
  // their max. Word 0: 1 where this rank's configuration is invalid.
  std::vector<int> words(1 + 4 * fields.size());
  words[0] = valid ? 0 : 1;
  for (size_t i = 0; i < fields.size(); ++i) {
    const uint64_t v = static_cast<uint64_t>(fields[i].second);
    const int hi = static_cast<int>(static_cast<uint32_t>(v >> 32)), lo = static_cast<int>(static_cast<uint32_t>(v));
    words[1 + 4 * i] = hi;
    words[2 + 4 * i] = ~hi;
    words[3 + 4 * i] = lo;
    words[4 + 4 * i] = ~lo;
  }
  return words;
}

std::string agreement_error(const char* what, int rank, const ConfigFields& fields, const std::vector<int>& reduced) {
  if (reduced[0] != 0) {
    return std::string(what) + " on rank " + std::to_string(rank) +
           ": another rank's configuration is invalid (that rank's error says why); every rank of the group must "
           "pass the same valid configuration";
  }
  std::string differ;
  for (size_t i = 0; i < fields.size(); ++i) {
    const uint32_t hi_max = static_cast<uint32_t>(reduced[1 + 4 * i]), hi_min = ~static_cast<uint32_t>(reduced[2 + 4 * i]);
    const uint32_t lo_max = static_cast<uint32_t>(reduced[3 + 4 * i]), lo_min = ~static_cast<uint32_t>(reduced[4 + 4 * i]);
    if (hi_max == hi_min && lo_max == lo_min) continue;
    differ += std::string(differ.empty() ? "" : ", ") + fields[i].first + " (this rank: " +
              std::to_string(fields[i].second) + ")";
  }
  if (differ.empty()) return "";
  return std::string(what) + " on rank " + std::to_string(rank) +
         ": the ranks of the group were built with different configurations: " + differ +
         " differ between ranks; every rank must pass the same configuration (and the same MHCCL_* launch-shape "
         "variables)";
}

// Op kinds by name (the agreement's `what`): codes the header carries.
namespace {
constexpr const char* kOpKinds[] = {"Communicator", "AllReduceMHC", "LamportAllGather"};
int64_t op_kind_code(const char* what) {
  for (int i = 0; i < 3; ++i) {
    if (std::strcmp(what, kOpKinds[i]) == 0) return i + 1;
  }
  return 0;
}
const char* op_kind_name(uint32_t code) { return code >= 1 && code <= 3 ? kOpKinds[code - 1] : "another op"; }
}  // namespace

ConfigFields agreement_header(const char* what, const ConfigFields& fields) {
  uint64_t h = detail::kFnv1aBasis;  // over the field names, each with its terminator
  for (const auto& f : fields) h = detail::fnv1a(f.first, std::strlen(f.first) + 1, h);
  return {{"op kind", op_kind_code(what)},
          {"field count", static_cast<int64_t>(fields.size())},
          {"field names", static_cast<int64_t>(h >> 1)}};
}

std::string agreement_header_error(const char* what, int rank, const std::vector<int>& reduced) {
  // Words as agreement_words lays them out: [0] unused here, then (hi, ~hi, lo, ~lo) a field.
  auto lo_range = [&](int field) {
    return std::make_pair(~static_cast<uint32_t>(reduced[4 + 4 * field]), static_cast<uint32_t>(reduced[3 + 4 * field]));
  };
  bool same = true;
  for (int f = 0; f < 3; ++f) {
    same &= static_cast<uint32_t>(reduced[1 + 4 * f]) == ~static_cast<uint32_t>(reduced[2 + 4 * f]) &&
            lo_range(f).first == lo_range(f).second;
  }
  if (same) return "";
  const auto kinds = lo_range(0);
  std::string msg = std::string(what) + " on rank " + std::to_string(rank) + ": the ranks of the group are not building ";
  if (kinds.first != kinds.second) {
    msg += "the same op at this point: " + std::string(op_kind_name(kinds.first)) + " on some, " +
           op_kind_name(kinds.second) + " on others";
  } else {
    msg += "the same kind of " + std::string(what) + " (another version of mhccl, or another field list)";
  }
  return msg + ". Every rank must construct the same ops in the same order; every rank throws this, and the "
               "communicator stays usable";
}

}  // namespace comm

void Communicator::Impl::agree(const char* what, const std::vector<std::pair<const char*, int64_t>>& fields,
                               std::exception_ptr local_error) {
  // The fixed-size header first: every rank all-reduces the same count here, whatever it builds.
  const std::string wait = std::string("configuration agreement of ") + what;
  std::vector<int> header = comm::agreement_words(comm::agreement_header(what, fields), true);
  // A failure inside the all-reduces (CUDA, NCCL) is this rank's alone: its peers may have
  // agreed and counted the op (ops_agreed), so this communicator is out of step: unusable.
  const auto reduce = [&](std::vector<int>& v) {
    try {
      all_reduce_ints(v.data(), static_cast<int>(v.size()), ncclMax, wait.c_str());
    } catch (const Error& e) {
      if (!unusable) fail(e.code(), std::string(e.what()) + " (this communicator is unusable: destroy it and its ops "
                                                           "and build them again)", e.context());
      throw;
    }
  };
  reduce(header);
  const std::string mismatch = comm::agreement_header_error(what, rank, header);
  if (!mismatch.empty()) throw Error(ErrorCode::kInvalidArgument, mismatch);
  std::vector<int> words = comm::agreement_words(fields, !local_error);
  if (static_cast<int>(words.size()) > kSetupWords) {
    throw Error(ErrorCode::kInvalidArgument, std::string("agree (internal): too many fields for ") + what);
  }
  reduce(words);
  if (local_error) std::rethrow_exception(local_error);
  const std::string error = comm::agreement_error(what, rank, fields, words);
  if (!error.empty()) throw Error(ErrorCode::kInvalidArgument, error);
  ++ops_agreed;
}

Communicator::Communicator(const ncclUniqueId& id, int rank, int tp, int device,
                           CommunicatorOptions options)
    : impl_(std::make_shared<Impl>()) {
  detail::nvtx::Range range(detail::nvtx::Kind::kConstruction, tp, [&] {
    return "mhccl.Communicator tp=" + std::to_string(tp) + " rank=" + std::to_string(rank) + " cuda:" +
           std::to_string(device);
  });
  check_tp(tp);
  if (rank < 0 || rank >= tp) {
    throw Error(ErrorCode::kInvalidArgument,
                "rank: expected 0.." + std::to_string(tp - 1) + ", got " + std::to_string(rank));
  }
  const detail::DeviceCount devices = detail::cuda_device_count();
  if (devices.count == 0) {
    throw Error(ErrorCode::kNoDevice, "Communicator: no CUDA device (" + devices.why_none +
                                          "): mhccl needs an NVIDIA GPU (sm_90+) with a driver; "
                                          "python -m mhccl.info or mhccl-bench --info says more");
  }
  if (device < 0 || device >= devices.count) {
    throw Error(ErrorCode::kInvalidArgument, "device: expected 0.." + std::to_string(devices.count - 1) +
                                                 ", got " + std::to_string(device));
  }
  check_nccl_version();
  Impl& im = *impl_;
  im.rank = rank;
  im.tp = tp;
  im.device = device;
  im.options = options;
  detail::DeviceGuard guard(device);
  // Non-blocking (PROTOCOL.md, I20): the init, and every later NCCL call, is polled within the
  // budget, so a rank whose peers never join raises kPeerTimeout instead of waiting for good.
  // At TP=1 there is no peer to wait for: blocking (measured on one H200, 58e1bc0: a
  // non-blocking TP=1 communicator left about 0.9 MB of host memory behind a cycle).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = tp > 1 ? 0 : 1;
  im.owns_comm = true;
  im.nonblocking = tp > 1;
  init_budget(im);
  im.nccl_wait(ncclCommInitRankConfig(&im.comm, tp, id, rank, &config), "NCCL communicator initialization");
  init_common(im);
}

Communicator::Communicator(ncclComm_t comm, int device, CommunicatorOptions options)
    : impl_(std::make_shared<Impl>()) {
  detail::nvtx::Range range(detail::nvtx::Kind::kConstruction, -1, [&] {
    return "mhccl.Communicator (the caller's NCCL communicator) cuda:" + std::to_string(device);
  });
  if (comm == nullptr) throw Error(ErrorCode::kInvalidArgument, "comm: expected an NCCL communicator, got null");
  check_nccl_version();
  Impl& im = *impl_;
  im.comm = comm;
  im.owns_comm = false;
  MHCCL_NCCL(ncclCommUserRank(comm, &im.rank));
  MHCCL_NCCL(ncclCommCount(comm, &im.tp));
  int cu_device = -1;
  MHCCL_NCCL(ncclCommCuDevice(comm, &cu_device));
  if (cu_device != device) {
    throw Error(ErrorCode::kInvalidArgument, "device: the NCCL communicator is on cuda:" +
                                                 std::to_string(cu_device) + ", got cuda:" +
                                                 std::to_string(device));
  }
  check_tp(im.tp);
  im.device = device;
  im.options = options;
  // Polled as non-blocking (Impl::nonblocking): the caller's communicator may be either, and
  // asking a blocking one costs one call that returns at once. Until 2026-12-05 it was taken as
  // blocking, so that a non-blocking one's ncclInProgress was taken for done (a review).
  im.nonblocking = im.tp > 1;
  init_budget(im);
  init_common(im);
}

Communicator::~Communicator() = default;

ncclUniqueId Communicator::make_unique_id() {
  ncclUniqueId id;
  MHCCL_NCCL(ncclGetUniqueId(&id));
  return id;
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::tp() const { return impl_->tp; }
int Communicator::device() const { return impl_->device; }
ncclComm_t Communicator::nccl() const { return impl_->comm; }
const CommunicatorOptions& Communicator::options() const { return impl_->options; }
bool Communicator::peers_reachable() const { return impl_->reachable; }
void Communicator::check_errors() {
  // Under the calls' mutex: a call on another thread (which the bindings make without Python's
  // lock) reads and consumes the same records and may make the communicator unusable meanwhile.
  std::lock_guard<std::mutex> lock(impl_->call_mutex);
  impl_->check(/*report_routes=*/true);
}
void Communicator::note_rejected_call(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(impl_->call_mutex);
  impl_->count_rejected(stream);
}

void Communicator::Impl::count_rejected(cudaStream_t stream) noexcept {
  ++rejected;
  if (fault_window.ptr == nullptr) return;  // no device state (a communicator of the CPU tests)
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  // A capture the rejection invalidated (its cause was an operation the capture forbids) will
  // never run: no count is owed to its calls, and none can be enqueued into it.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t st = cudaStreamIsCapturing(stream, &capture);
  if (st == cudaSuccess && capture != cudaStreamCaptureStatusInvalidated) {
    st = kernels::launch_count_rejected(rejected_word(), stream);
  }
  if (st != cudaSuccess) cudaGetLastError();  // this failure's own error (not sticky), at any TP
  if (prev >= 0) cudaSetDevice(prev);
  if (st == cudaSuccess || tp == 1 || unusable) return;
  unusable = true;
  try {
    unusable_reason = "a call rejected on rank " + std::to_string(rank) + " could not be counted on its stream (" +
                      cudaGetErrorString(st) +
                      "): this rank's calls no longer carry its count of rejected calls, which pairs its calls with "
                      "its peers' (PROTOCOL.md, I19); destroy the communicator and its ops and build them again";
  } catch (...) {  // out of memory: a shorter reason, never an exception out of a rejection
    unusable_reason.clear();
  }
}

uint32_t Communicator::rejected_calls() const { return impl_->rejected; }
uint32_t Communicator::launched_calls() const { return impl_->launched; }
bool Communicator::usable() const { return !impl_->unusable; }

// --- Symmetric buffers ------------------------------------------------------------------------
void Communicator::Impl::alloc_window(size_t bytes, uint32_t fill, bool shared, Window& w) {
  detail::DeviceGuard guard(device);
  const size_t size = (std::max<size_t>(bytes, 16) + 4095) / 4096 * 4096;
  const int entries = shared ? tp : 1;
  w.plain = !shared || tp == 1;  // no peer: plain device memory, its own (only) peer entry
  w.bytes = size;
  if (w.plain) {
    MHCCL_CUDA(cudaMalloc(&w.ptr, size));
  } else {
    MHCCL_NCCL(ncclMemAlloc(&w.ptr, size));
    std::lock_guard<std::recursive_mutex> lock(nccl_mutex);  // as all_reduce_ints: the watchdog may abort
    require_nccl("symmetric window registration");
    nccl_wait(ncclCommWindowRegister(comm, w.ptr, size, &w.window, NCCL_WIN_COLL_SYMMETRIC),
              "symmetric window registration (ncclCommWindowRegister)");
  }
  MHCCL_CUDA(kernels::launch_fill_u32(w.ptr, size / 4, fill, setup_stream));
  MHCCL_CUDA(cudaMalloc(reinterpret_cast<void**>(&w.peers_device), entries * sizeof(void*)));
  w.peers.assign(static_cast<size_t>(entries), nullptr);
  if (w.plain) {
    w.peers[0] = w.ptr;
    MHCCL_CUDA(cudaMemcpyAsync(w.peers_device, w.peers.data(), sizeof(void*), cudaMemcpyHostToDevice, setup_stream));
  } else {
    MHCCL_CUDA(comm::launch_peer_table(w.window, tp, w.peers_device, setup_stream));
    MHCCL_CUDA(cudaMemcpyAsync(w.peers.data(), w.peers_device, tp * sizeof(void*), cudaMemcpyDeviceToHost,
                               setup_stream));
  }
  if (shared) {
    barrier("symmetric window barrier");  // every rank's fill is done before any peer can store into it
  } else {
    setup_wait("window allocation");
  }
  for (int r = 0; r < entries; ++r) {
    if (w.peers[r] == nullptr) {
      throw Error(ErrorCode::kNccl, "NCCL window: no load/store mapping of rank " + std::to_string(r));
    }
  }
}

void Communicator::Impl::free_window(Window& w) {
  if (w.ptr == nullptr && w.peers_device == nullptr) return;
  // The memory of a window that cannot be deregistered now: an owned communicator is aborted,
  // which releases the window, and frees the memory after that. Around the caller's ncclComm_t
  // the window stays registered until the caller aborts it, so the memory is left to the
  // process's end rather than freed under a live window.
  auto orphan = [&] {
    if (w.ptr && owns_comm) orphaned.push_back(w.ptr);
  };
  if (w.plain) {
    if (w.ptr) release({w.ptr});
  } else if (peer_failed()) {
    orphan();  // nothing here may wait: no device synchronization, no deregistration (it may wait for a dead peer)
  } else {
    const bool watched = watch_teardown();
    cudaDeviceSynchronize();  // not under nccl_mutex: the watchdog may need it to end a stuck NCCL kernel
    if (watched) unwatch_teardown();
    // The NCCL communicator under nccl_mutex from here: the watchdog's thread may have aborted
    // it meanwhile (its abort ends the kernels the synchronization waited for), so the failure
    // is looked at again under the lock (a review, 2026-12-05: a deregistration raced the abort).
    std::lock_guard<std::recursive_mutex> lock(nccl_mutex);
    if (peer_failed() || (w.window && comm == nullptr)) {
      orphan();
    } else {
      // Deregistration may wait for the peers: within the budget, else the communicator is
      // aborted (which releases the window) and the memory freed after it.
      const ncclResult_t st = w.window ? ncclCommWindowDeregister(comm, w.window) : ncclSuccess;
      if ((st != ncclSuccess && st != ncclInProgress) || !nccl_settles_quietly()) {
        unusable = true;
        if (unusable_reason.empty()) unusable_reason = "a window deregistration did not complete within the budget";
        orphan();
      } else if (w.ptr) {
        ncclMemFree(w.ptr);
      }
    }
  }
  if (w.peers_device) release({w.peers_device});
  w = Window{};
}

struct SymmetricBuffer::State {
  std::shared_ptr<Communicator::Impl> comm;
  Communicator::Impl::Window window;
};

std::unique_ptr<SymmetricBuffer> Communicator::alloc_symmetric(size_t bytes, uint32_t fill) {
  Impl& im = *impl_;
  im.check();
  if (!im.reachable) {
    throw Error(ErrorCode::kUnsupported, "symmetric buffers need every peer load/store reachable");
  }
  std::unique_ptr<SymmetricBuffer> buf(new SymmetricBuffer());
  buf->state_ = std::make_unique<SymmetricBuffer::State>();
  SymmetricBuffer::State& st = *buf->state_;
  st.comm = impl_;
  im.alloc_window(bytes, fill, /*shared=*/true, st.window);
  // NCCL maps every rank of the LSA team, this one too, into one flat range: the own entry is
  // another virtual address of the same memory. Every access goes through the table, so the
  // kernels reach each slot through one address.
  buf->local_ = st.window.peers[im.rank];
  buf->bytes_ = st.window.bytes;
  buf->peers_device_ = st.window.peers_device;
  return buf;
}

SymmetricBuffer::~SymmetricBuffer() {
  if (!state_) return;
  State& st = *state_;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(st.comm->device);
  st.comm->free_window(st.window);
  if (prev >= 0) cudaSetDevice(prev);
}

void* SymmetricBuffer::peer(int r) const { return state_->window.peers.at(static_cast<size_t>(r)); }

void SymmetricBuffer::fill(uint32_t value, cudaStream_t stream) const {
  MHCCL_CUDA(kernels::launch_fill_u32(local_, bytes_ / 4, value, stream));
}

}  // namespace mhccl
