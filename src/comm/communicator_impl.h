// Communicator internals shared by the ops (not installed).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/params.h"
#include "mhccl/communicator.h"

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
  static constexpr int kSetupWords = 16;
  int* setup_words = nullptr;           // device ints for the construction-time all-reduces

  // Error reporting (kernels/params.h, ErrorRecord).
  kernels::ErrorRecord* record = nullptr;         // [2] pinned, host-mapped: timeout, route
  kernels::ErrorRecord* record_device = nullptr;  // their device address
  uint32_t* device_words = nullptr;               // [0, 1] the records' claims, [2] abort flag
  bool unusable = false;
  std::string unusable_reason;
  // Symmetric allocations left by buffers destroyed after a peer failed: freed only after
  // ncclCommAbort has released their windows (deregistration may wait for the dead peer).
  std::vector<void*> orphaned;
  std::vector<void*> orphaned_device;  // cudaMalloc'ed, likewise freed after the abort

  // A peer timed out (reported, or recorded and not yet reported): teardown must not wait for
  // the peers (no window deregistration, ncclCommAbort instead of ncclCommDestroy).
  bool peer_failed() const;
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
  // one host thread at a time, like every NCCL call on the communicator). At TP=1 the values
  // stay.
  template <int N>
  void all_reduce_ints(int (&values)[N], ncclRedOp_t op) {
    static_assert(N >= 1 && N <= kSetupWords, "at most kSetupWords values");
    all_reduce_ints(values, N, op);
  }
  void all_reduce_ints(int* values, int n, ncclRedOp_t op);
  // Every rank's setup work done (collective; used at construction time only).
  void barrier();
};

}  // namespace mhccl
