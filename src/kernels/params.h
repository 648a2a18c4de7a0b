// Plain structs shared by the host launchers and the kernels (no CUDA-only types).
#pragma once

#include <cstdint>

#include "mhccl/bf16.h"  // MHCCL_HD

namespace mhccl::kernels {

constexpr int kGenerations = 3;  // call k uses generation k % 3 and resets k-1's (PROTOCOL.md)
constexpr int kMaxTp = 8;
constexpr int kMaxTopK = 16;
constexpr uint32_t kBf16SentinelPair = 0x80008000u;  // two BF16 -0.0: an empty mailbox word
constexpr uint32_t kWordSentinel = 0x80000000u;      // an empty all-gather mailbox word
constexpr int kMaxThreadsPerCta = 640;  // a 5120-wide row on one CTA; 96 registers a thread
// The epilogue over hc = 8 streams needs more registers: at most 512 threads (128 registers).
constexpr int max_threads_per_cta(int hc) { return hc == 8 ? 512 : kMaxThreadsPerCta; }

// What a kernel's bounded wait or a finalize route check records, in host-mapped memory: two
// records, [kTimeoutRecord] for expired waits and [kRouteRecord] for bad routes, so that a route
// report nobody has read yet never hides a later timeout. The host owns `epoch`; a kernel claims
// a record with a CAS of its device claim word from epoch to epoch + 1 (the first error of its
// kind wins), writes the fields, then sets ready = epoch + 1 last, so the host never reads a
// half-written record. The host consumes it by advancing epoch.
enum ErrorKind : uint32_t { kNoError = 0, kWaitTimeout = 1, kBadRoute = 2, kPeerFault = 3, kDivergence = 4 };
enum OpKind : uint32_t { kOpAllGather = 1, kOpAllReduceCall = 2, kOpAllReduceFinalize = 3 };
enum ProtocolKind : uint32_t { kProtoOneShot = 1, kProtoTwoShotOwner = 2, kProtoTwoShotReduced = 3,
                               kProtoAllGather = 4, kProtoNccl = 5 };

// --- Call identity (PROTOCOL.md, I19) ---------------------------------------------------------
// What every rank's contribution to a call carries, so that no consumer uses rows of another
// call: the op (call, finalize, all-gather), the protocol, the consumer variant, the size (M
// rows; packs a rank for the all-gather), the generation, and how many calls this rank has
// rejected so far. The host builds the first four (make_call_identity, a launch argument; the
// all-gather's also its layout digest, with_layout); the
// kernels add the generation and the rejected count from device memory as the call runs
// (with_call_state): the count is this rank's word beside its fault word (ErrorSink::fault),
// advanced in stream order by every rejected call, so a CUDA graph's replay carries the count
// of its time, not of its capture (a call rejected on one rank between a capture and a replay
// is found at the replay). Ranks that make the same sequence of calls put the same identity
// into every slot; a rank that diverged (a call rejected on it alone, another M, call against
// finalize, another variant) puts another one there.
//
// One 16-byte pack, the call header, published once a call into each mailbox a rank publishes
// into (a header slot beside the rows: call_header_offset) by the thread that publishes row 0's
// first pack, before it (an all-gather: one a CTA). 8 lanes of 16 bits, each with its top bit clear, so that no
// lane is the BF16 sentinel (0x8000) and no word the all-gather's (0x80000000):
//   lane 0: op (2 bits) | protocol (3) << 2 | variant (2) << 5 | generation (2) << 7
//           | the all-gather's layout digest, its low 6 bits, << 9
//   lanes 1-3: the size, 15 bits a lane (45 bits); the all-gather's size in packs takes 32 of
//           them (rank_capacity_bytes <= 2^35: up to 2^31 packs), lane 3's bits 2-14 the layout
//           digest's high 13
//   lanes 4-5: the rejected count modulo 2^30
//   lane 6: 0, but on the NCCL fallback: the op's serial number modulo 2^15 (with_op_serial)
//   lane 7: kIdentityMagic (a written header is never all zeros)
// On the NCCL fallback (kProtoNccl: FallbackParams below) the generation is 0 (it has none).
struct CallIdentity {
  uint32_t w[4];
};
constexpr uint32_t kIdentityMagic = 0x6D48u;  // "mH"
constexpr int kIdentityGenerationShift = 7;
MHCCL_HD constexpr uint32_t identity_lane(uint64_t v, int lane) {  // 15 bits of v from bit 15 * lane
  return static_cast<uint32_t>((v >> (15 * lane)) & 0x7FFFu);
}
// The identity of a call at generation 0 with no rejected call (the kernels add both:
// with_call_state).
MHCCL_HD constexpr CallIdentity make_call_identity(uint32_t op, uint32_t protocol, uint32_t variant, uint64_t size) {
  return CallIdentity{{(op & 3u) | ((protocol & 7u) << 2) | ((variant & 3u) << 5) | (identity_lane(size, 0) << 16),
                       identity_lane(size, 1) | (identity_lane(size, 2) << 16), 0u, kIdentityMagic << 16}};
}
MHCCL_HD constexpr CallIdentity with_generation(CallIdentity id, uint32_t gen) {
  id.w[0] = (id.w[0] & ~(3u << kIdentityGenerationShift)) | ((gen & 3u) << kIdentityGenerationShift);
  return id;
}
MHCCL_HD constexpr CallIdentity with_rejected(CallIdentity id, uint32_t rejected) {
  id.w[2] = identity_lane(rejected, 0) | (identity_lane(rejected, 1) << 16);
  return id;
}
// The identity as a call carries it: its generation and this rank's rejected count added.
MHCCL_HD constexpr CallIdentity with_call_state(CallIdentity id, uint32_t gen, uint32_t rejected) {
  return with_rejected(with_generation(id, gen), rejected);
}
// The NCCL fallback's identity also carries the op's serial number (its place in the order the
// communicator's ops were built, Communicator::Impl::ops_agreed: the same on every rank, since
// construction agrees on it): ops of one communicator share its NCCL communicator, which pairs
// calls by their place in it, so ranks calling two ops in another order would pair one op's call
// with the other's (the Lamport paths have a mailbox an op: their calls never pair).
MHCCL_HD constexpr CallIdentity with_op_serial(CallIdentity id, uint32_t serial) {
  id.w[3] = (id.w[3] & 0xFFFF0000u) | identity_lane(serial, 0);
  return id;
}
// The all-gather's layout digest (with_layout): 19 bits of a hash of the input's dtype and shape,
// beside its exact size. Ranks that gather as many bytes of another dtype or shape (f32 [4, 8]
// against bf16 [2, 32]) would otherwise pair, each reading the others' bytes as its own dtype;
// with it they find a divergence but where two layouts' digests collide (2^-19 for a pair).
constexpr int kAllGatherSizeBits = 32;  // packs: rank_capacity_bytes <= 2^35, so up to 2^31 of them
constexpr uint32_t kLayoutDigestBits = 19;
MHCCL_HD constexpr CallIdentity with_layout(CallIdentity id, uint32_t digest) {
  id.w[0] = (id.w[0] & ~(0x3Fu << 9)) | ((digest & 0x3Fu) << 9);
  id.w[1] = (id.w[1] & ~(0x1FFFu << 18)) | (((digest >> 6) & 0x1FFFu) << 18);
  return id;
}
MHCCL_HD constexpr uint32_t identity_layout(const CallIdentity& id) {
  return ((id.w[0] >> 9) & 0x3Fu) | (((id.w[1] >> 18) & 0x1FFFu) << 6);
}
// The fields back (for error messages and tests).
MHCCL_HD constexpr uint32_t identity_op_serial(const CallIdentity& id) { return id.w[3] & 0x7FFFu; }
MHCCL_HD constexpr uint32_t identity_op(const CallIdentity& id) { return id.w[0] & 3u; }
MHCCL_HD constexpr uint32_t identity_protocol(const CallIdentity& id) { return (id.w[0] >> 2) & 7u; }
MHCCL_HD constexpr uint32_t identity_variant(const CallIdentity& id) { return (id.w[0] >> 5) & 3u; }
MHCCL_HD constexpr uint32_t identity_generation(const CallIdentity& id) {
  return (id.w[0] >> kIdentityGenerationShift) & 3u;
}
MHCCL_HD constexpr uint64_t identity_size(const CallIdentity& id) {
  const uint64_t size = static_cast<uint64_t>(id.w[0] >> 16) | (static_cast<uint64_t>(id.w[1] & 0x7FFFu) << 15) |
                        (static_cast<uint64_t>(id.w[1] >> 16) << 30);
  return identity_op(id) == kOpAllGather ? size & ((uint64_t{1} << kAllGatherSizeBits) - 1) : size;
}
MHCCL_HD constexpr uint32_t identity_rejected(const CallIdentity& id) { return (id.w[2] & 0x7FFFu) | ((id.w[2] >> 16) << 15); }
MHCCL_HD constexpr bool identity_equal(const CallIdentity& a, const CallIdentity& b) {
  return a.w[0] == b.w[0] && a.w[1] == b.w[1] && a.w[2] == b.w[2] && a.w[3] == b.w[3];
}

// --- Mailbox layouts ---------------------------------------------------------------------------
// A Lamport mailbox of the all-reduce (one-shot slots, two-shot contributions, two-shot reduced
// rows): the rows [gen][source][slot_rows][np] packs, then the call headers [gen][kMaxTp] packs,
// one a (generation, writer): a call's writer stores its header once (PROTOCOL.md, I19), the
// source rank into the one-shot slots and the contributions, a row's owner into the reduced
// rows (which have one "source" for their rows, the row's owner, but a header of each owner).
constexpr int kMaxCtasPerRow = 8;  // portable cluster size
MHCCL_HD constexpr int64_t mailbox_row_packs(int sources, int64_t slot_rows, int np) {
  return static_cast<int64_t>(kGenerations) * sources * slot_rows * np;
}
MHCCL_HD constexpr int64_t mailbox_bytes(int sources, int64_t slot_rows, int np) {
  return 16 * (mailbox_row_packs(sources, slot_rows, np) + static_cast<int64_t>(kGenerations) * kMaxTp);
}
// Pack offset of writer `writer`'s call header of generation `gen` (writer < kMaxTp), from the
// offset of the mailbox's headers (`headers`: mailbox_row_packs of its layout).
MHCCL_HD constexpr int64_t call_header_at(int64_t headers, uint32_t gen, int writer) {
  return headers + static_cast<int64_t>(gen) * kMaxTp + writer;
}
MHCCL_HD constexpr int64_t call_header_offset(uint32_t gen, int sources, int64_t slot_rows, int np, int writer) {
  return call_header_at(mailbox_row_packs(sources, slot_rows, np), gen, writer);
}
// The all-gather's mailbox: the packs [gen][source][capacity_packs], the call headers
// [gen][source][kAllGatherMaxCtas] packs (a unit is a CTA), then the escape words
// [gen][source][capacity_packs] (uint32): a pack with a lane equal to the sentinel 0x80000000
// or to the marker 0x80000001 travels with those lanes set to the marker and, in its escape
// word, which of them were the sentinel (kEscapeTag | a bit per lane), so every word arrives as
// sent (SPEC.md, changed 2026-12-01).
constexpr int kAllGatherMaxCtas = 128;  // every CTA co-resident on any sm_90 part (>= 114 SMs)
constexpr uint32_t kWordMarker = 0x80000001u;
constexpr uint32_t kEscapeTag = 0x100u;  // an escape word is kEscapeTag | lane bits: never the sentinel
MHCCL_HD constexpr int64_t all_gather_header_offset(uint32_t gen, int tp, int source, int64_t capacity_packs, int unit) {
  return static_cast<int64_t>(kGenerations) * tp * capacity_packs + (static_cast<int64_t>(gen) * tp + source) * kAllGatherMaxCtas + unit;
}
// Word offset of pack i's escape word of slot [gen][source].
MHCCL_HD constexpr int64_t all_gather_escape_offset(uint32_t gen, int tp, int source, int64_t capacity_packs, int64_t i) {
  return 4 * (static_cast<int64_t>(kGenerations) * tp * (capacity_packs + kAllGatherMaxCtas)) +
         (static_cast<int64_t>(gen) * tp + source) * capacity_packs + i;
}
// The escape encoding of one pack's 4 lanes, in place: returns the escape word (0 where the
// pack travels as it is). escape_decode(escape_encode(w)) restores w; no encoded lane is the
// sentinel; an encoded pack holds the marker in some lane iff its escape word is not 0.
MHCCL_HD constexpr uint32_t escape_encode(uint32_t (&w)[4]) {
  uint32_t special = 0, sentinels = 0;
  for (int i = 0; i < 4; ++i) {
    special |= static_cast<uint32_t>((w[i] | 1u) == kWordMarker) << i;
    sentinels |= static_cast<uint32_t>(w[i] == kWordSentinel) << i;
    w[i] |= w[i] == kWordSentinel ? 1u : 0u;
  }
  return special == 0 ? 0u : kEscapeTag | sentinels;
}
MHCCL_HD constexpr void escape_decode(uint32_t (&w)[4], uint32_t escape) {
  for (int i = 0; i < 4; ++i) {
    if (escape & (1u << i)) w[i] = kWordSentinel;
  }
}
MHCCL_HD constexpr int64_t all_gather_mailbox_bytes(int tp, int64_t capacity_packs) {
  return 16 * static_cast<int64_t>(kGenerations) * tp * (capacity_packs + kAllGatherMaxCtas) +
         4 * static_cast<int64_t>(kGenerations) * tp * capacity_packs;
}

struct ErrorRecord {
  uint32_t epoch;      // written by the host only
  uint32_t ready;      // epoch + 1 once the fields below are complete
  uint32_t code;
  uint32_t op;
  uint32_t protocol;
  int32_t peer;        // rank waited for (timeout, divergence); kPeerFault: the rank that raised the fault
  uint32_t generation;
  int32_t row;         // row (or pack, for the all-gather) waited for / with the bad route
  int64_t value;       // the bad route index; kPeerFault: the fault word
  uint32_t call;       // this rank's call of the protocol (its state's call count) that recorded it
  uint32_t pad;
  CallIdentity mine;   // kDivergence: this rank's identity of the call, and the peer's
  CallIdentity theirs;
};

// The fault word (one per rank, in the communicator's symmetric fault window): 0 while every
// wait of the group completed and no rank found a divergence. A rank whose wait expires, or
// that finds a peer's call header unlike its own, stores fault_word(itself, the peer, kind) into
// every rank's word (its own too); every kernel of every op of the communicator reads its own
// word with its protocol state and publishes nothing once it is set, and every wait watches it
// from its first spin, so that once any rank gave up, no rank stores into a mailbox again and
// every rank's waits end with an error naming the rank that raised it (PROTOCOL.md, I12b).
constexpr uint32_t kFaultRaised = 0x80000000u;
constexpr uint32_t kFaultDivergence = 0x40000000u;  // raised by a divergence, not a timeout
MHCCL_HD constexpr uint32_t fault_word(int raised_by, int peer, bool divergence = false) {
  return kFaultRaised | (divergence ? kFaultDivergence : 0u) | (static_cast<uint32_t>(peer) << 8) |
         static_cast<uint32_t>(raised_by);
}
MHCCL_HD constexpr int fault_timed_out_rank(uint32_t w) { return static_cast<int>(w & 0xFFu); }
MHCCL_HD constexpr int fault_waited_for(uint32_t w) { return static_cast<int>((w >> 8) & 0xFFu); }
MHCCL_HD constexpr bool fault_is_divergence(uint32_t w) { return (w & kFaultDivergence) != 0; }

constexpr int kTimeoutRecord = 0;
constexpr int kRouteRecord = 1;

struct ErrorSink {
  ErrorRecord* records;  // [2] host-mapped, pinned
  uint32_t* claims;      // [2] device memory: CAS targets, equal to their record's epoch while free
  // This rank's fault word (fault_word above), read by every kernel and wait, and beside it
  // (fault + 1, the same 8-byte aligned pair, read with it in one load) this rank's count of
  // rejected calls: written only by this rank, in stream order (launch_count_rejected), never by a peer.
  uint32_t* fault;
  uint32_t* const* fault_peers;  // device array [fault_ranks]: every rank's fault word (this one's too)
  int fault_ranks;       // tp where the fault window is shared; 1 (this rank's word) otherwise
  int rank;              // this rank, as fault_word names it
  uint64_t timeout_ns;   // spin budget of one wait
  uint32_t op;
};

// Device-resident protocol state, advanced by the kernels themselves so that CUDA-graph
// replays stay right: the generation of the current call and the rows of the previous call
// (whose slots this call resets). `arrived` counts CTAs of the last kernel of a call; the last
// one to arrive advances the state. (A fault is not kept here: it is the communicator's, in
// its fault word, which every kernel reads with this state.)
struct LamportState {
  uint32_t generation;
  uint32_t prev_rows;
  uint32_t arrived;
  uint32_t calls;
};

// The NCCL fallback's call identity (PROTOCOL.md, I19). Its calls publish into no mailbox, so
// no call header can travel beside their rows: instead each rank's identity of the call is
// all-gathered just before the rows' collective (a 16-byte ncclAllGather of its own), and every
// rank compares every rank's against its own. Two kernels bracket the two NCCL operations (they
// are the watchdog's progress counts too); Communicator::Impl::fallback_call runs the four:
//  - fallback_enter: counts the call entered, advances the op's fallback call count (for the
//    error record's call index), reads this rank's rejected count (ErrorSink::fault + 1, in
//    stream order, as the Lamport kernels do), writes with_call_state(id, 0, rejected) into
//    ids[0], the all-gather's send buffer, and clears the receive slots;
//  - fallback_leave: counts the call left, then compares ids[1 + s] (rank s's, the receive
//    buffer) with ids[0] for every s < tp; the first that differs records kDivergence naming
//    rank s and raises the fault, as a Lamport consumer's check_header does (a slot holding
//    anything but this rank's identity, an identity or not, differs). A slot still all zeros
//    was not delivered (every identity has kIdentityMagic): the watchdog's abort of a stuck
//    NCCL operation leaves one, or another operation paired with the exchange brought zeros; it
//    is recorded as kWaitTimeout naming rank s (no rank: -1, where every slot is empty), and no
//    fault is raised (after an abort the peers' fault words may be unmapped).
//    Where every identity matched, this rank's fault word is read (fault_own) and a fault
//    another rank raised before it is recorded as kPeerFault.
// Every rank sees every rank's identity, so where one rank diverged every rank finds it at that
// call. Device memory of an op (fallback_ids_bytes): ids[0] this rank's, ids[1, 1 + kMaxTp)
// every rank's, then the op's call count (one uint32, zeroed at allocation).
struct FallbackParams {
  ErrorSink err;
  CallIdentity id;     // the host's part: op, kProtoNccl, variant, M (all-gather: packs), op serial
  uint32_t* progress;  // the communicator's watchdog progress counts [entered, left] (host-mapped)
  void* ids;           // the op's identity buffer (above)
  // This rank's fault word at an address that stays mapped after an abort of the NCCL
  // communicator (the window's own allocation, not its peer mapping): fallback_leave reads it
  // after the NCCL operations, which the watchdog's abort may have ended.
  const uint32_t* fault_own;
  int tp;
};
constexpr int64_t kFallbackCallsOffset = 16 * (1 + kMaxTp);  // bytes: the op's call count
MHCCL_HD constexpr int64_t fallback_ids_bytes() { return kFallbackCallsOffset + 16; }

// How a row of np 16-byte packs maps onto CTAs: ctas_per_row CTAs (a thread-block cluster when
// > 1), each of `threads` threads covering packs_per_cta packs (a multiple of 4, so an MXFP8
// block of 4 packs never straddles CTAs; of kFp8GroupPacks for the FP8 variant), one pack per
// thread. Rank-invariant: a function of (M, H, hc, variant) only.
struct RowTiling {
  int ctas_per_row;
  int threads;
  int packs_per_cta;
};

enum class PublishDest : int {
  kAllRanks = 0,  // one-shot: slot [gen][rank][m] of every rank's mailbox
  kOwner = 1,     // two-shot: slot [gen][rank][m / tp] of rank (m % tp)'s mailbox
  kLocal = 2,     // NCCL fallback of finalize: row m of a local buffer, no Lamport
};

// The MoE finalize's inputs (SPEC.md, finalize): x[m] = bf16(sum over k of weights[m,k] *
// gemm2[routes[m,k]] + shared[m]) (routed sum first, shared expert last), routes of -1 (and any
// outside [0, gemm2_rows)) skipped.
struct FinalizeInputs {
  const void* gemm2;  // [gemm2_rows, H] BF16
  int64_t gemm2_rows;
  const float* weights;   // [M, top_k]
  const int32_t* routes;  // [M, top_k]
  const void* shared;     // [M, H] BF16
  int top_k;
};

struct PublishParams {
  const void* x;       // this rank's rows, or nullptr: the finalize reduction of `fin`
  FinalizeInputs fin;
  int64_t m;
  int np;  // packs per row = H / 8
  RowTiling tiling;
  PublishDest dest;
  // kAllRanks: the tp mailbox bases rotated so targets[i] is rank (rank + 1 + i) % tp's (remote
  // stores first, the local one last); kOwner: targets[r] is rank r's; kLocal: targets[0].
  void* targets[kMaxTp];
  int tp;
  int rank;
  int64_t slot_rows;  // rows per [gen][source] slot of the destination mailbox
  const LamportState* state;
  ErrorSink err;
  CallIdentity id;  // this rank's identity of the call (generation 0): its call headers
};

enum class ConsumerInput : int {
  kPoll = 0,      // Lamport slots [gen][0..nslots)[m] of a local mailbox (one-shot, two-shot)
  kDirect = 1,    // plain BF16 rows [M, H] (TP=1 x, NCCL fallback's reduced rows)
  kFinalize = 2,  // TP=1 finalize: this rank's x computed from the finalize inputs
};
enum class ConsumerVariant : int { kPlain = 0, kMxfp8 = 1, kResidualOnly = 2, kFp8 = 3 };
constexpr int kConsumerVariants = 4;
// Packs of one FP8 group of 128 elements (include/mhccl/fp8_groups.h): 16 consecutive lanes.
constexpr int kFp8GroupPacks = 16;

// One-shot in a single launch: the consumer first publishes its own row (x, or the finalize
// reduction) into every rank's slot, then polls. A CTA waits only for the peers' CTAs of the
// same row, which publish before they wait, so this is deadlock-free while every CTA of the
// grid can be resident at once: at most kMaxSingleLaunchCtas CTAs (1 per SM at 640 threads;
// below the 114 SMs of the smallest sm_90 part, and rank-invariant).
constexpr int kMaxSingleLaunchCtas = 96;
// CTAs a row of a small-M call spreads over (a cluster), when the single-launch grid allows.
constexpr int kSmallMCtasPerRow = 5;
// Dynamic shared memory the streaming consumer may take: 2 stages of (hc + inputs) packs a
// thread, inputs = 1 (x, reduced rows) or tp (one-shot slots): hc = 4 at 640 threads 100 KiB
// (TP=2 one-shot 120 KiB, TP=4 160 KiB); hc = 8 at 512 threads 144 KiB (TP=2 160 KiB, TP=4
// 192 KiB). Above it (TP=8 one-shot) the CTA-per-row consumer runs.
constexpr size_t kMaxStreamingSmem = 200 * 1024;
// The automatic choice (streaming_min_rows = -1) of the polling consumer: the one-shot call
// streams (one launch, its own publishing CTAs) from this many rows. Measured on one H200
// through the own mailbox (TP=1 self-test, docs/PERFORMANCE.md): streaming is 8% slower at 512
// rows, 5% (call) and 16% (finalize) faster at 1024, 14-22% from 2048. The two-shot's consumer
// streams from this many rows too, after its publish and owners' kernels (no roles of its own):
// with the owners' reduce on its resident CTAs, 30-33% faster than the CTA-per-row consumer at
// 1024 and 4096 rows (call), 24-26% (finalize) (one H200, 2026-12-04, 1b0b5e3). TP=2 is yet to
// be measured (not yet run on two GPUs).
constexpr int64_t kPollStreamingMinRows = 1024;

struct ConsumerParams {
  // griddepcontrol.wait before reading anything: needed when this kernel is the call's first
  // (or follows NCCL). After our own publish it is not: the publish passed its wait, so every
  // input of the call is complete before this kernel can even start, and skipping the wait
  // lets it poll and compute while the publish still stores (overlap at large M).
  bool wait_predecessor;
  const void* in;  // kPoll: local mailbox; kDirect: rows
  bool publish_first;       // kPoll one-shot: publish this row first (single launch)
  const void* x;            // what to publish: x, or (nullptr) the finalize inputs below
  void* targets[kMaxTp];    // as PublishParams::targets (kAllRanks)
  int rank;
  int nslots;
  int64_t slot_rows;
  LamportState* state;  // kPoll only
  FinalizeInputs fin;   // kFinalize, and a single-launch publish of finalize (x == nullptr)
  // Two-shot: this rank's contribution mailbox [gen][source][owned row][np] and its rows per
  // slot. The consumer, the call's last kernel, resets the previous call's contributions (the
  // owner reduce cannot: nothing orders its end before the next call's kernels).
  void* contributions;
  int64_t owner_rows;
  uint32_t protocol;    // for error records
  int tp;               // rank m % tp owns row m (two-shot: the peer a reduced-row wait names)
  // epilogue
  const void* residual;
  const float* post;
  const float* comb;
  const float* pre;
  const void* norm_weight;
  float eps;
  void* residual_out;
  void* layer_input;
  void* mxfp8_values;
  uint8_t* mxfp8_scales;
  void* fp8_values;       // kFp8: [M, H] E4M3
  float* fp8_scales;      // kFp8: scale(m, g) at g * fp8_scale_rows + m, padding rows written 0
  int64_t fp8_scale_rows; // Mp = ceil(M / 4) * 4
  int64_t fp8_scale_floats; // floats of fp8_scales that may be written: padding rows at or beyond
                            // it are not (the MN-major view ends at the last column's row M - 1)
  bool fp8_ue8m0;         // kFp8: power-of-two scales
  int64_t m;
  int np;
  RowTiling tiling;
  ErrorSink err;
  CallIdentity id;  // kPoll: this rank's identity of the call, which every peer's call header must equal
  // Rows of one CTA, kDirect or kPoll (not a single launch): from this many rows the streaming
  // (persistent, prefetching) consumer runs on min(M + role CTAs, streaming_ctas) CTAs; 0:
  // never; -1: automatic (kDirect when M exceeds its CTAs; kPoll from kPollStreamingMinRows:
  // one-shot with its publishing CTAs, two-shot after its publish and owners' kernels, no roles).
  int64_t streaming_min_rows;
  // CTAs of the streaming consumer resident at once for this input, the same on every rank (the
  // op's minimum over the ranks, agreed at construction: launch shapes never depend on a
  // per-rank query); 0: it does not run.
  int streaming_ctas;
  // kPoll, streaming: the first publisher_ctas CTAs to arrive publish this rank's rows (no publish
  // kernel before it; one-shot into `targets`, two-shot into the owners' `targets`, as
  // PublishParams kOwner), then reducer_ctas CTAs (two-shot only) reduce this rank's owned rows
  // of `contributions` into every rank's reduced buffer `reduced` (rotated, as
  // OwnerReduceParams::reduced); 0, 0: every CTA consumes.
  int publisher_ctas;
  int reducer_ctas;
  void* reduced[kMaxTp];
  // kDirect streaming: the op's row ticket counter (consume_rows), zero between calls;
  // calls of one op share it: they run one at a time (stream-ordered).
  uint32_t* row_tickets;
  // Set by launch_consumer, not by its callers: the pack offsets of the call headers
  // (mailbox_row_packs) in `in` (nslots, slot_rows), in the one-shot `targets` (tp, slot_rows)
  // and in `contributions` (tp, owner_rows), so that no kernel computes them from the layout (a
  // 64-bit multiply chain on the path of the thread that publishes and checks the header).
  int64_t in_headers;
  int64_t target_headers;
  int64_t contribution_headers;
};

struct OwnerReduceParams {
  bool wait_predecessor;        // as ConsumerParams::wait_predecessor
  const void* mailbox;          // local contributions [gen][source][owned row][np]
  void* reduced[kMaxTp];        // every rank's reduced rows [gen][C][np], rotated as PublishParams::targets
  int tp;
  int rank;
  int64_t owner_rows;           // rows per [gen][source] slot = ceil(C / tp)
  int64_t reduced_rows;         // rows per generation of the reduced buffer = C
  int64_t m;
  int np;
  RowTiling tiling;
  // Row groups (CTAs, or clusters of tiling.ctas_per_row) of the grid at most; 0: one a owned
  // row. Where this rank owns more rows, each group loops over them (one state read a group).
  // Not rank-invariant, nor need it be: an owner's grid pairs with nothing of its peers'.
  int64_t max_groups;
  const LamportState* state;
  ErrorSink err;
  CallIdentity id;  // as PublishParams::id: the contributions' headers must equal it, the reduced rows' carry it
};

struct AllGatherParams {
  const void* in;
  void* out;
  void* mailboxes[kMaxTp];  // mailboxes[i]: rank (rank + i) % tp's [gen][source][capacity packs]
  int tp;
  int rank;
  int64_t packs;           // this call's packs per rank
  int64_t capacity_packs;
  LamportState* state;
  ErrorSink err;
  CallIdentity id;         // this rank's identity of the call: its CTAs' headers, and what the peers' must equal
  int packs_per_cta;       // launch shape (host side): packs a CTA takes at least; 0: default
};

}  // namespace mhccl::kernels
