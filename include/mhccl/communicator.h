// The TP group: an NCCL communicator, symmetric mailboxes registered as NCCL windows, a device
// table of peer pointers, and the error record that the kernels' bounded waits report into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace mhccl {

// Diagnostics, for every op of every communicator:
// - MHCCL_DEBUG=INFO (as NCCL_DEBUG=INFO): each construction of a Communicator, AllReduceMHC or
//   LamportAllGather prints its decisions once to stderr, each line "mhccl INFO rank R/TP
//   cuda:D <what>: ...": the NCCL library loaded and its version, P2P reachability (NCCL's LSA
//   team, cudaDeviceCanAccessPeer) and so the path the ops take, the budgets; for AllReduceMHC
//   the thresholds, the protocol and launches of a call and of a finalize for every class of M,
//   the mailbox bytes and the grids; for LamportAllGather its path, mailbox and grid. Unset,
//   empty or WARN: nothing is printed. Read once per process.
// - NVTX: every op call opens an NVTX range named by op, protocol and M ("mhccl.call one-shot
//   M=8", "mhccl.finalize two-shot M=2048", "mhccl.all_gather lamport M=8 bytes=81920"; M is
//   also the range's payload), every construction one named by its configuration, in the NVTX
//   domain "mhccl" (nsys profile --trace=cuda,nvtx). Without a profiler the name is not even
//   built: a few ns a call. CMake -DMHCCL_NVTX=OFF compiles the ranges out.
// - mhccl::environment_report() (mhccl/info.h): versions, GPUs, P2P matrix and variables.

struct CommunicatorOptions {
  // The budget of every wait on a peer, in milliseconds (1 ms to 24 h): each Lamport wait's spin
  // (on expiry the kernel records which peer, protocol, generation and row it waited for and
  // exits; the next call, or check_errors(), throws Error(kPeerTimeout) and the communicator
  // stays unusable), and every host-side wait (the NCCL communicator's initialization, the
  // configuration agreement and barriers of every op construction, window registration,
  // teardown) and the NCCL fallback's operations (the watchdog below): on expiry the rank
  // throws kPeerTimeout naming the wait and aborts its NCCL communicator. 30 s: far above any
  // stall of a live peer in decode (a rank behind by a whole prefill step is under a second),
  // short enough that a dead peer surfaces well before NCCL/torch watchdogs (10 min).
  // MHCCL_WAIT_TIMEOUT_MS in the environment, where set, takes precedence over this field (the
  // default or a value the caller set). Ranks should start within
  // it of one another: the first construction waits for every rank.
  uint64_t wait_timeout_ms = 30000;
  // The NCCL fallback's watchdog thread (PROTOCOL.md, I20): from the first fallback call on, a
  // background thread looks at the fallback's progress every tenth of the budget and aborts the
  // NCCL communicator when an operation waited past the budget (a dead peer; under CUDA graphs
  // no host call would see it), so that a synchronization stuck behind it returns, and the next
  // call or check_errors() throws kPeerTimeout. Off: only op calls and check_errors() look,
  // and teardown (an op's or this communicator's destruction after a fallback call) runs the
  // thread through its own device synchronizations alone, so that they end within the budget
  // too. Around a caller's ncclComm_t the watchdog cannot abort it (it reports, and the caller
  // aborts): a synchronization behind a fallback operation stuck on a dead peer, a teardown's
  // included, ends only once the caller aborts that communicator.
  bool watchdog = true;
  // Use the NCCL fallback path (ncclAllReduce + the same fused consumer) even where every peer
  // is load/store reachable.
  bool force_nccl_fallback = false;
};

class SymmetricBuffer;

// Constructed collectively: every rank of the TP group constructs one with the same arguments
// (and its own rank). Not thread-safe; one per (process, GPU) and group.
class Communicator {
 public:
  // Creates and owns an NCCL communicator of `tp` ranks from `id` (see make_unique_id), on CUDA
  // device `device`. tp in {1, 2, 4, 8}. Throws Error(kUnsupported) for another tp,
  // Error(kInvalidArgument) for a bad rank or device, Error(kNccl/kCuda) when NCCL or CUDA fail
  // (nothing is leaked), Error(kPeerTimeout) where a rank does not join within the budget.
  Communicator(const ncclUniqueId& id, int rank, int tp, int device,
               CommunicatorOptions options = {});
  // Wraps a communicator the caller created (and keeps owning: it must outlive this object).
  // Create it non-blocking (ncclConfig_t::blocking = 0), as the other constructor does: on a
  // blocking communicator NCCL's own host calls (window registration, the construction's small
  // all-reduces) wait for every rank with no budget, so a peer that never constructs would hang
  // this rank there instead of raising kPeerTimeout (PROTOCOL.md, I20).
  Communicator(ncclComm_t comm, int device, CommunicatorOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // A fresh NCCL unique id (rank 0 makes it, every rank receives it out of band).
  static ncclUniqueId make_unique_id();

  int rank() const;
  int tp() const;
  int device() const;
  // The NCCL communicator. One this object created at TP > 1 is non-blocking (config.blocking =
  // 0, so that every wait on it has a budget): an NCCL call on it may return ncclInProgress, and
  // the caller polls ncclCommGetAsyncError until it settles before the next call. At TP=1 (no
  // peer to wait for) it is blocking. After a budget expired it was aborted: nullptr.
  ncclComm_t nccl() const;
  const CommunicatorOptions& options() const;

  // True when every peer's memory is load/store reachable (one NVLink/P2P domain: NCCL's LSA
  // team is the whole group) and the fallback is not forced. False: ops use the NCCL fallback.
  bool peers_reachable() const;

  // Throws the first error a kernel recorded since the last check (non-blocking: reads a
  // host-mapped record and this rank's fault word; a kernel still running reports on a later
  // check): kPeerTimeout (a wait of this rank or a peer gave up) or kDivergence (the ranks'
  // calls stopped pairing), either of which leaves the communicator unusable (every later op,
  // and this, throws Error(kUnusable) until it is rebuilt), kCuda where the fault word could
  // not be read (unusable too), or kInvalidRoute (non-fatal; reported here only, never by an
  // op's call, so that no rank drops a call its peers make). Safe while a CUDA graph is being
  // captured on another stream or thread (its one copy is made in the relaxed capture mode).
  // Destruction after a peer timeout (reported or still pending in the record) waits for no
  // peer: the ops' symmetric windows are not deregistered and an owned NCCL communicator is
  // released with ncclCommAbort, so a rank whose peer died can tear down and exit. Around a
  // caller's ncclComm_t, abort it after destroying this; the ops' mailboxes are then
  // reclaimed only when the process ends.
  void check_errors();
  bool usable() const;

  // Calls of this communicator's ops rejected on this rank so far, as the host counted them.
  // Every rank's contribution to a call carries the device copy of this count as the call runs
  // (with the op, protocol, variant, M and generation: the call's identity; a rejection captured
  // into a CUDA graph counts once here and once a replay there), and every consumer checks its
  // peers' against its own, so a call rejected on some
  // ranks but not on others surfaces as Error(kDivergence) on every rank at the next call instead
  // of pairing the ranks' calls wrongly for good (a call rejected alike on every rank leaves the
  // counts equal and the ops usable). The ops count their own rejections; a binding that rejects
  // a call before it reaches an op (its own argument checks, an allocation that failed) calls
  // note_rejected_call(stream) with the stream the call was made on, so that its rejections
  // count too. The count the calls carry is advanced in stream order on that stream (one tiny
  // kernel), so a CUDA graph replayed after a rejection carries the count of its replay, not of
  // its capture; a rejection during a capture is part of the graph (each replay counts it).
  // Where the count cannot be enqueued on `stream` the communicator becomes unusable (TP > 1).
  // The calls of a communicator's ops, rejected or not, are issued in one stream order on each
  // rank (one stream, or streams ordered with events): a call in flight reads the count in each
  // of its kernels, so a rejection enqueued concurrently on an unordered stream could make a
  // call's kernels disagree (a false kDivergence, never a wrong value).
  void note_rejected_call(cudaStream_t stream);
  uint32_t rejected_calls() const;
  // Calls of this communicator's ops that went out on this rank so far (their first kernel or
  // NCCL operation enqueued, whether the call then completed or failed). A binding that wraps
  // an op's call tells by it and rejected_calls() whether an exception it caught came before
  // the call reached its launch (neither moved: it calls note_rejected_call) or after it (an
  // interrupt once the call returned: nothing to count).
  uint32_t launched_calls() const;

  // Symmetric memory of `bytes` on every rank (collective), each 32-bit word set to `fill`. At
  // TP=1: plain device memory (no peer). Throws Error(kUnsupported) where peers are unreachable.
  std::unique_ptr<SymmetricBuffer> alloc_symmetric(size_t bytes, uint32_t fill);

  struct Impl;  // src/comm/communicator_impl.h
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;  // shared with every buffer and op built on this communicator
};

// One allocation of the same size on every rank, mapped into every peer (NCCL window).
class SymmetricBuffer {
 public:
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  void* local() const { return local_; }
  size_t bytes() const { return bytes_; }
  // Device array of tp pointers: peers()[r] is rank r's copy (peers()[rank] == local(), this
  // rank's memory through NCCL's flat LSA mapping).
  void* const* peers() const { return peers_device_; }
  // The same pointers, readable on the host.
  void* peer(int r) const;
  // Sets every 32-bit word back to `fill` (stream-ordered, async).
  void fill(uint32_t fill, cudaStream_t stream) const;

 private:
  friend class Communicator;
  SymmetricBuffer() = default;
  struct State;
  std::unique_ptr<State> state_;
  void* local_ = nullptr;
  size_t bytes_ = 0;
  void** peers_device_ = nullptr;
};

}  // namespace mhccl
