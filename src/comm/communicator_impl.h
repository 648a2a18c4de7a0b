// Communicator internals shared by the ops (not installed).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/params.h"
#include "mhccl/communicator.h"
#include "mhccl/error.h"

namespace mhccl {

struct Communicator::Impl {
  ncclComm_t comm = nullptr;
  bool owns_comm = false;
  int rank = 0;
  int tp = 1;
  int device = 0;
  CommunicatorOptions options;
  bool reachable = false;
  cudaStream_t setup_stream = nullptr;  // construction-time work (fills, peer tables, barriers)
  static constexpr int kSetupWords = 256;
  int* setup_words = nullptr;           // device ints for the construction-time all-reduces
  int* setup_host = nullptr;            // pinned host ints they are copied through (kSetupWords)
  // Every NCCL call's completion is polled (ncclCommGetAsyncError) within the budget, so that no
  // host-side wait on a peer lasts without end (PROTOCOL.md, I20): at TP > 1, where the owned
  // NCCL communicator is made non-blocking (config.blocking = 0: every call returns at once),
  // and around a caller's, which is non-blocking as the wrapping constructor asks (on a
  // blocking one the call itself waited, and the poll returns at once).
  bool nonblocking = false;

  // --- Budgets on host-side waits (PROTOCOL.md, I20) ---------------------------------------
  // Every one is options.wait_timeout_ms, the Lamport waits' budget. On expiry the rank aborts
  // its NCCL communicator (an owned one; a caller's is left to the caller, whom the message
  // tells to abort it), marks this one unusable and throws Error(kPeerTimeout) naming the wait.
  // `status`: what an NCCL call on `comm` returned; an error throws kNccl, ncclInProgress is
  // polled until the operation settles.
  void nccl_wait(ncclResult_t status, const char* what);
  // The setup stream's work (the NCCL all-reduces of construction among it) done, polled.
  void setup_wait(const char* what);
  // [[noreturn]]: aborts the NCCL communicator and throws kPeerTimeout for the wait `what`.
  [[noreturn]] void budget_expired(const char* what);
  // Aborts an owned NCCL communicator (ncclCommAbort waits for no peer and ends its kernels).
  void abort_nccl();
  // For teardown (never throws): whether the communicator's pending NCCL operation settled
  // within the budget (true where it is blocking: its calls returned settled).
  bool nccl_settles_quietly();
  bool nccl_settled(ncclResult_t& state);  // the poll both use
  // Throws kUnusable naming `what` where the watchdog aborted the NCCL communicator (comm null):
  // the check before each use of it, under nccl_mutex.
  void require_nccl(const std::string& what) const;

  // --- The NCCL fallback's watchdog (PROTOCOL.md, I20) --------------------------------------
  // An NCCL fallback call waits on the GPU, stream-ordered, where no host thread waits: a dead
  // peer would hold the stream (and any later host synchronization) for good. Each fallback
  // call brackets its NCCL operations with two tiny kernels that count into host-mapped
  // words (entered, left), captured with it into a CUDA graph, so replays count too. The
  // watchdog (check_fallback: every op call and check_errors(), and a background thread once a
  // fallback call was made, unless options.watchdog is false) finds the counts unequal and
  // unchanged for longer than the budget, aborts the communicator and reports kPeerTimeout.
  uint32_t* fallback_progress = nullptr;         // [2] host-mapped: entered, left
  uint32_t* fallback_progress_device = nullptr;  // their device address
  struct FallbackWatch {
    uint32_t entered = 0, left = 0;
    std::chrono::steady_clock::time_point since{};
    // Whether the counts show a fallback operation stuck for longer than budget_ms at `now`
    // (this observation kept for the next one).
    bool stuck(uint32_t entered_now, uint32_t left_now, std::chrono::steady_clock::time_point now, uint64_t budget_ms);
  } fallback_watch;
  std::recursive_mutex nccl_mutex;  // the watchdog's abort against a call's NCCL operations
  std::atomic<bool> watchdog_tripped{false};
  std::string watchdog_reason;  // set before watchdog_tripped
  std::thread watchdog;
  std::atomic<bool> watchdog_stop{false};
  std::mutex watchdog_thread;              // the start and stop of `watchdog`
  std::mutex watchdog_sleep;               // with watchdog_wake: a stop ends the thread's sleep at once
  std::condition_variable watchdog_wake;
  std::atomic<bool> fallback_ran{false};  // a fallback call was made (host side: its kernels may not have run yet)
  int teardown_watches = 0;           // teardowns synchronizing under the watchdog now (under watchdog_thread)
  bool watchdog_for_teardown = false;  // the running thread was started by a teardown (watchdog off)
  // One NCCL fallback call of an op, under nccl_mutex (throws kUnusable, "<who>: the NCCL
  // communicator was aborted", where the watchdog aborted it):
  //  - fallback_enter counts the call in (the watchdog's progress counts, stream-ordered; the
  //    watchdog thread starts at the first call) and writes this rank's identity of the call
  //    (kernels/params.h, FallbackParams; PROTOCOL.md I19) into the op's identity buffer `ids`;
  //  - the identities' 16-byte ncclAllGather, then `rows` (the call's collective), each bounded
  //    like nccl_wait. Two operations, not one group: NCCL orders a group's collectives by size,
  //    so where ranks' rows differ in count (the divergence this exists to find) the rows'
  //    traffic could land in the identity slots; alone and first, the identities' exchange pairs
  //    cleanly whenever every earlier operation did;
  //  - fallback_leave counts it out and checks every rank's identity against this rank's.
  // `launched` is set once the first kernel went out (guarded_call: a failure after it is fatal).
  void fallback_call(const char* who, kernels::ErrorSink err, kernels::CallIdentity id, void* ids,
                     const std::function<ncclResult_t()>& rows, cudaStream_t stream, const char* what, bool& launched);
  // An op's fallback identity buffer (kernels::fallback_ids_bytes): allocated where `ids` is
  // null, its call count zeroed in order on `stream`.
  static void ready_fallback_ids(void*& ids, cudaStream_t stream);
  // Throws kPeerTimeout (after aborting) when the watchdog found a fallback operation stuck.
  void check_fallback();
  bool watch_fallback();  // one look, under nccl_mutex: check_fallback and the thread
  // The watchdog's thread, started once (by the first fallback call where options.watchdog):
  // every tenth of the budget (10 ms to 1 s) it takes one look (watch_fallback). Returns whether
  // it started it now (false: running already). Throws std::system_error where no thread can be
  // had. Start and stop hold `watchdog_thread` (a teardown on one thread, a call on another);
  // neither is called under nccl_mutex, which the thread takes (stop joins it).
  bool start_watchdog();
  bool start_watchdog_locked();  // the same, the caller holding watchdog_thread
  // Before a teardown's device synchronization (an op's buffers, a window): where a fallback
  // call was made, the watchdog's thread even with options.watchdog off, so that a
  // synchronization behind a fallback operation stuck on a dead peer ends within the budget (the
  // abort of an owned NCCL communicator ends it) rather than never (SPEC: teardown never waits
  // on a dead peer without end). Returns whether the synchronization is watched: the caller then
  // calls unwatch_teardown() once synchronized, and the last of the teardowns watched at once
  // stops a thread a teardown started (options.watchdog off), so that it does not go on
  // watching the op calls that follow. Never throws.
  bool watch_teardown() noexcept;
  void unwatch_teardown() noexcept;
  void stop_watchdog() noexcept;  // ends the thread's sleep, joins it; it may be started again
  void stop_watchdog_locked() noexcept;

  // Error reporting (kernels/params.h, ErrorRecord).
  kernels::ErrorRecord* record = nullptr;         // [2] pinned, host-mapped: timeout, route
  kernels::ErrorRecord* record_device = nullptr;  // their device address
  uint32_t* device_words = nullptr;               // [0, 1] the records' claims, [2] abort flag
  bool unusable = false;
  std::string unusable_reason;
  ErrorContext unusable_context;
  // Calls of this communicator's ops rejected on this rank so far (by the library's checks or a
  // binding's: note_rejected_call). Every call's identity carries it, so a call rejected on some
  // ranks only is found by the peers of the next call (PROTOCOL.md, I19). The kernels read the
  // device copy (rejected_word(), advanced in stream order by count_rejected), so that a CUDA
  // graph's replay carries the count of its time; this one is the host's view of it.
  std::atomic<uint32_t> rejected{0};
  // Calls of this communicator's ops that went out on this rank so far (their first launch
  // made, whether they then completed or failed): with `rejected`, how a binding tells a call
  // that reached its launch from one rejected before it (launched_calls()).
  std::atomic<uint32_t> launched{0};  // atomic, as `rejected`: read without call_mutex
  // Op calls of this communicator one at a time (guarded_call, note_rejected_call): a binding
  // may call them without its interpreter's lock. The ranks' sequences of calls must still
  // agree, so calling ops of one communicator from several threads is the caller's to order.
  std::mutex call_mutex;
  // This rank's fault word was seen set, or could not be read (read_fault_word): teardown then
  // waits for no peer.
  bool fault_seen = false;
  // One allocation on every rank with every rank's address of it: an NCCL window (TP > 1,
  // shared), or plain device memory of this rank only (`peers` then holds just it).
  struct Window {
    void* ptr = nullptr;
    ncclWindow_t window = nullptr;
    bool plain = false;
    size_t bytes = 0;
    std::vector<void*> peers;       // host copy of the table
    void** peers_device = nullptr;  // device table [peers.size()]
  };
  // Collective where `shared` (every rank, same bytes): the memory filled with `fill` on every
  // rank before any peer may store into it. Not shared: plain device memory.
  void alloc_window(size_t bytes, uint32_t fill, bool shared, Window& w);
  // The device memory a symmetric window of `bytes` is counted as before it is allocated
  // (require_device_memory): rounded up to 2 MiB, the granularity such memory is mapped in.
  static uint64_t symmetric_window_bytes(int64_t bytes) {
    constexpr uint64_t kGranule = uint64_t{2} << 20;
    return (static_cast<uint64_t>(bytes) + kGranule - 1) / kGranule * kGranule;
  }
  // Deregisters and frees (waiting for no peer after a peer failure: see release()).
  void free_window(Window& w);
  // The fault words (kernels/params.h, fault_word; PROTOCOL.md I12b): one uint32 a rank, shared
  // over the group where peers are reachable (every rank's kernels store a fault into every
  // rank's word), this rank's alone otherwise; beside each (the word after it, one 8-byte
  // aligned pair the kernels read in one load) the rank's device count of rejected calls,
  // written by that rank only (count_rejected).
  Window fault_window;
  static constexpr size_t kFaultWindowBytes = 2 * sizeof(uint32_t);
  uint32_t* fault_word_local() const {
    return static_cast<uint32_t*>(fault_window.peers[fault_window.plain ? 0 : rank]);
  }
  uint32_t* rejected_word() const { return fault_word_local() + 1; }
  // Counts a call of this rank rejected before anything of it went out: `rejected`, and the
  // device count (rejected_word) by one in stream order on `stream`, the call's: the next call
  // enqueued there (a kernel reading it as a CUDA graph replays, too) carries the new count. An
  // increment that cannot be enqueued (the stream is broken) leaves the device count behind this
  // rank's calls: the communicator becomes unusable at TP > 1. A capture the rejection
  // invalidated gets none (it never runs); the host count still counts the call. Never throws.
  void count_rejected(cudaStream_t stream) noexcept;

  // Symmetric allocations left by buffers destroyed after a peer failed: freed only after
  // ncclCommAbort has released their windows (deregistration may wait for the dead peer).
  std::vector<void*> orphaned;
  std::vector<void*> orphaned_device;  // cudaMalloc'ed, likewise freed after the abort

  // A peer timed out or the ranks diverged (reported, recorded and not yet reported, or set in
  // this rank's fault word): teardown must not wait for the peers (no window deregistration,
  // ncclCommAbort instead of ncclCommDestroy). Reads the fault word (a copy) until it is seen set.
  bool peer_failed();
  // This rank's fault word, read now (a small copy on the setup stream, made in the relaxed
  // stream-capture mode so that a CUDA graph another stream or thread is capturing neither
  // forbids it nor is invalidated by it; 0 without a shared fault window). Construction time,
  // teardown and check_errors() only. A copy that fails (`*copy_error`, where given, gets the
  // CUDA error) leaves the word unknown: it is taken as set (teardown then waits for no peer),
  // and the callers that report (check_fault_word) raise kCuda naming the failure, not a fault.
  uint32_t read_fault_word(cudaError_t* copy_error = nullptr);
  // Raises the fault this rank's fault word holds (kPeerTimeout or kDivergence, naming the ranks;
  // `what`: the call that looked), or kCuda where it could not be read; either leaves the
  // communicator unusable.
  void check_fault_word(const char* what);
  // Makes the communicator unusable, naming why, and throws Error(code, message).
  [[noreturn]] void fail(ErrorCode code, const std::string& message, ErrorContext context = {});
  // What every op construction does first: check() and this rank's fault word (a fault another
  // rank raised that no kernel of this rank saw yet), so that a faulted communicator raises on
  // every rank before any collective.
  void check_for_construction(const char* what);
  // Before an op's configuration agreement (its errors are local there, and every rank raises):
  // throws kInvalidArgument where the `bytes` of device memory the op will allocate after the
  // agreement exceed what this rank's device has free, so that a configuration the device
  // cannot hold fails before anything is allocated and leaves the communicator usable (after
  // the agreement a failed allocation would leave it unusable). `what`: the op and its size
  // parameter, named in the message. Free memory can shrink between this check and the
  // allocation: a smaller shortfall still raises there.
  void require_device_memory(const std::string& what, uint64_t bytes, const char* lower) const;
  // Runs an op's call `body(launched)` on `stream`: body sets `launched` once anything that pairs
  // with the peers (a Lamport kernel, an NCCL call) went out. An exception before that counts the
  // call as rejected on this rank (count_rejected on `stream`); one after it leaves the
  // communicator unusable at TP > 1 (this rank's protocol state or NCCL sequence would be apart
  // from its peers').
  template <class Body>
  void guarded_call(const char* what, cudaStream_t stream, Body&& body) {
    std::lock_guard<std::mutex> lock(call_mutex);
    bool went_out = false;
    try {
      body(went_out);
    } catch (...) {  // ours or not (std::bad_alloc, std::system_error): the same rules
      if (!went_out) {
        count_rejected(stream);
      } else {
        ++launched;
        apart_after_launch(what, std::current_exception());
      }
      throw;
    }
    ++launched;
  }
  // A call that failed (`failure`, of any type) after its first launch: at TP > 1 this rank's
  // protocol state or NCCL sequence is apart from its peers' (its call went out in part), so the
  // communicator becomes unusable, naming `what` and the failure (an Error's context kept).
  void apart_after_launch(const char* what, std::exception_ptr failure);
  // An op's construction that failed on this rank (`failure`, of any type) after its
  // configuration agreement: its peers go on into collectives it left (they raise kPeerTimeout
  // within the budget), so this rank's communicator becomes unusable too, naming `what` and the
  // failure (an Error's context kept). A failure of the agreement itself is left as it stands.
  void apart_after_agreement(const char* what, std::exception_ptr failure);
  // Frees device memory of an op or buffer built on this communicator: at once (after a device
  // synchronization) normally; after a peer failure only after the abort, at destruction (a
  // synchronization could wait for an NCCL kernel stuck on the dead peer).
  void release(std::initializer_list<void*> ptrs);
  ~Impl();
  // An error sink for kernels of operation `op`.
  kernels::ErrorSink sink(uint32_t op) const;
  // Throws kUnusable, or a recorded peer timeout (which makes the communicator unusable). With
  // report_routes, also a recorded invalid route (Communicator::check_errors). Ops call it
  // without: a call must never be dropped on one rank only because of a non-fatal report that
  // one rank happened to see first, or the ranks' generations would part.
  void check(bool report_routes = false);
  // `values` (host ints) reduced with `op` over the ranks, in place: an NCCL all-reduce on the
  // setup stream, after the setup work queued there (collective; construction time only, from
  // one host thread at a time, like every NCCL call on the communicator), waited for within the
  // budget (`what`: the wait's name in a kPeerTimeout). At TP=1 the values stay.
  template <int N>
  void all_reduce_ints(int (&values)[N], ncclRedOp_t op, const char* what) {
    static_assert(N >= 1 && N <= kSetupWords, "at most kSetupWords values");
    all_reduce_ints(values, N, op, what);
  }
  void all_reduce_ints(int* values, int n, ncclRedOp_t op, const char* what);
  // Every rank's setup work done (collective; used at construction time only), within the budget.
  void barrier(const char* what);
  // Construction agrees on the configuration (collective; PROTOCOL.md I12c): every rank passes
  // the same named fields in the same order, and `local_error`, what checking this rank's
  // configuration threw (null when it is valid). First a header of fixed size (the op's kind,
  // its field count and a hash of the field names: comm::agreement_header), so that ranks
  // constructing different ops, or in another order, all throw Error(kInvalidArgument) naming
  // the op kinds instead of meeting in all-reduces of different counts. If any rank's
  // configuration is invalid, or any field differs between ranks, every rank throws: this
  // rank's own error, or Error(kInvalidArgument) naming the fields that differ. Call it before
  // anything is sized from the configuration.
  void agree(const char* what, const std::vector<std::pair<const char*, int64_t>>& fields,
             std::exception_ptr local_error);
  // Agreements that passed (the communicator's own, then each op's): an op's serial number is
  // the count after its own. It is the same on every rank for ops whose agreements met: every
  // rank takes the same verdict from the same all-reduced words, and a failure inside the
  // all-reduces makes its rank unusable. (Ops of one kind and configuration built in swapped
  // orders pass the agreement: each rank's serial then names the op its agreement met, which is
  // how NCCL pairs their calls too.) The NCCL fallback's identity carries it (I19).
  uint32_t ops_agreed = 0;
};

namespace comm {
// The configuration agreement's two halves (Communicator::Impl::agree), pure functions so that
// CPU tests can model several ranks: the ints a rank contributes to the all-reduce (ncclMax),
// and, from the reduced ints, "" when every rank passed the same valid configuration or else
// the error this rank throws.
using ConfigFields = std::vector<std::pair<const char*, int64_t>>;
std::vector<int> agreement_words(const ConfigFields& fields, bool valid);
std::string agreement_error(const char* what, int rank, const ConfigFields& fields, const std::vector<int>& reduced);
// The header the agreement exchanges first (op kind, field count, a hash of the field names) as
// fields, and, from its reduced words, "" when every rank builds the same op, else the error
// naming the op kinds that met.
ConfigFields agreement_header(const char* what, const ConfigFields& fields);
std::string agreement_header_error(const char* what, int rank, const std::vector<int>& reduced);
// The message of a divergence this rank found (a kDivergence record): `where` it was found, this
// rank's identity of the call and the peer's, and which of their fields differ.
std::string divergence_message(int rank, int peer, const std::string& where, const kernels::CallIdentity& mine,
                               const kernels::CallIdentity& theirs);
}  // namespace comm

}  // namespace mhccl
