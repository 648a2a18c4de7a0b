// Bench-only baselines: the Lamport floor (a plain one-shot publish + poll of the same rows with
// no epilogue, in one launch where the grid is co-resident as the library's small-M path: the
// least an all-reduce of these rows costs over this protocol), and the two
// bandwidth ceilings (HBM copy, NVLink stores to a peer) the floors of large M are made of.
#pragma once

#include <memory>

#include "mhccl/communicator.h"

namespace mhccl::bench {

class LamportFloor {
 public:
  LamportFloor(Communicator& comm, int64_t capacity_rows, int64_t hidden);
  ~LamportFloor();
  // y[M, H] = bf16(sum of every rank's x[M, H]), one-shot: publish + poll.
  void run(const void* x, void* y, int64_t m, cudaStream_t stream);

 private:
  Communicator& comm_;
  int64_t capacity_, hidden_;
  std::unique_ptr<SymmetricBuffer> mailbox_;
  void* state_ = nullptr;
};

// The launch floor: one tiny kernel (one warp storing one int into `flag`, device memory),
// launched plainly (no PDL), or with PDL as the ops launch theirs (it then waits for its
// predecessor with griddepcontrol.wait before the store). Timed as the ops are, it is what a
// CUDA graph's node costs with no work at all: the floor of a TP=1 call.
void launch_floor(int* flag, cudaStream_t stream, bool pdl = false);
// The row floor: one kernel that loads `streams` rows of `hidden` BF16 from `in` (a thread a
// 16-byte pack of each, 128 threads a CTA: 5 CTAs at H = 5120, the call's tiling at M = 1) and
// then stores them into `out` (at most 16 rows): the bytes of a TP=1 call at M = 1 (x and hc
// residual streams in, hc + 1 rows out) with no arithmetic and no reduction. Above the launch
// floor by one dependent round trip to memory and the stores: the least a kernel that reads its
// inputs before it writes them costs. With `pdl`, launched as the ops are (griddepcontrol.wait
// before the loads).
void launch_row_floor(const void* in, void* out, int64_t hidden, int streams, cudaStream_t stream, bool pdl = false);

// Device-to-device copy bandwidth, bytes read plus bytes written per second.
double copy_bandwidth_gbps(size_t bytes, cudaStream_t stream);
// Bandwidth of 16-byte stores from this rank into peer `(rank + 1) % tp`'s memory over the
// symmetric window's peer mapping (the path every publish takes), bytes per second.
double peer_store_bandwidth_gbps(Communicator& comm, size_t bytes, cudaStream_t stream);

}  // namespace mhccl::bench
