// LamportAllGather: a TP all-gather along dim 0 through Lamport mailboxes over NVLink peer
// mappings (SPEC.md, LamportAllGather), for up to rank_capacity_bytes per rank.
#pragma once

#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

namespace mhccl {

class Communicator;

// Constructed collectively over the communicator's group. One kernel per call: every rank
// stores its 16-byte packs into slot [generation][rank] of every rank's mailbox, polls its own
// mailbox with a bounded spin and copies the slots out in rank order. Every byte arrives as
// sent, for every dtype: a pack holding the sentinel word 0x80000000 (FP32 -0.0, int32
// INT32_MIN, UE8M0 bytes [2^-127 x 3, 2^1]) or the marker 0x80000001 travels encoded with an
// escape word (docs/PROTOCOL.md, I1); one without them costs nothing more. Each CTA's call
// header carries the call's identity (the size, a digest of the input's dtype and shape, the
// rank's rejected count): ranks gathering different sizes, as many bytes of another dtype or
// shape, or whose calls no longer pair, get Error(kDivergence) (I19). TP=1 is a device
// copy; the NCCL fallback an ncclAllGather of the bytes as they are.
class LamportAllGather {
 public:
  // rank_capacity_bytes: a positive multiple of 16, at most 2^35. Mailbox at TP > 1 with peers
  // reachable: 3.75 * tp * capacity + 6 KiB * tp bytes per rank (the packs and escape words of
  // 3 generations, and the call headers), rounded up to 4 KiB; beside it a staging copy of
  // capacity bytes.
  LamportAllGather(Communicator& comm, int64_t rank_capacity_bytes);
  ~LamportAllGather();
  LamportAllGather(const LamportAllGather&) = delete;
  LamportAllGather& operator=(const LamportAllGather&) = delete;

  // Whether `in` fits: 1 to 16 dimensions (the gather concatenates along dim 0, which a 0-d
  // tensor has not), 0 < bytes <= capacity and bytes % 16 == 0 (from its shape and dtype alone,
  // so every rank decides alike).
  bool accepts(const DLTensor& in) const;

  // out = every rank's `in` concatenated along dim 0 in rank order: a contiguous tensor of in's
  // dtype and shape [tp * in.shape[0], in.shape[1:]...] on the same device. A non-contiguous or
  // misaligned `in` is first copied into an internal staging buffer (stream-ordered).
  void call(const DLTensor& in, const DLTensor& out, cudaStream_t stream);

  int64_t rank_capacity_bytes() const;
  // Device memory per rank of the mailbox (and, on the NCCL fallback, its call identities), bytes.
  size_t mailbox_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mhccl
