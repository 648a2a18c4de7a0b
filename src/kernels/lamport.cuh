// Lamport primitives: the sentinel, 16-byte packs, volatile loads/stores over NVLink peer
// mappings, the one bounded wait every poll loop goes through, the call headers and the fault word.
//
// A mailbox slot holds the sentinel until its writer stores real data; writers never store the
// sentinel (BF16 -0.0 -> +0.0, which changes no sum; the all-gather's word 0x80000000 travels
// as the marker 0x80000001 with an escape word that restores it), so "no lane holds the
// sentinel" means "all of this pack arrived". Lanes are compared as bits, never as floats.
#pragma once

#include <cstdint>

#include <cuda/atomic>

#include "kernels/params.h"
#include "mhccl/bf16.h"

namespace mhccl::kernels {


__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Programmatic dependent launch (sm_90): wait for the predecessor grid (a no-op when the kernel
// was launched without the PDL attribute), and let the successor grid get scheduled early.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // after every earlier load
}

// Volatile (relaxed, system-scope, uncached) 16-byte accesses: polls see peers' NVLink stores.
__device__ __forceinline__ uint4 ld_volatile(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void st_volatile(void* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_volatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// A relaxed GPU-scope load: the protocol state, where a kernel reads it without
// griddepcontrol.wait (PDL promises no cache invalidation then; a cached copy could be stale).
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Two adjacent words in one relaxed GPU-scope load (`p` 8-byte aligned): the fault word and this
// rank's rejected count beside it (ErrorSink::fault).
__device__ __forceinline__ uint2 ld_relaxed_gpu_pair(const uint32_t* p) {
  uint2 v;
  asm volatile("ld.relaxed.gpu.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
  return v;
}
// Read-only inputs of the kernel (written by predecessors, stable during it).
__device__ __forceinline__ uint4 ld_input(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// --- Sentinels -------------------------------------------------------------------------------
struct Bf16Lanes {  // BF16 mailboxes: 8 lanes of 16 bits a pack
  static __device__ __forceinline__ bool pending(uint4 v) {
    return (__vcmpeq2(v.x, kBf16SentinelPair) | __vcmpeq2(v.y, kBf16SentinelPair) |
            __vcmpeq2(v.z, kBf16SentinelPair) | __vcmpeq2(v.w, kBf16SentinelPair)) != 0;
  }
  static __device__ __forceinline__ uint32_t publishable(uint32_t w) {
    return w & ~__vcmpeq2(w, kBf16SentinelPair);  // -0.0 lanes become +0.0
  }
  static __device__ __forceinline__ uint4 sentinel() {
    return make_uint4(kBf16SentinelPair, kBf16SentinelPair, kBf16SentinelPair, kBf16SentinelPair);
  }
};
struct WordLanes {  // all-gather mailboxes: 4 lanes of 32 bits a pack, and its 32-bit escape words
  static __device__ __forceinline__ bool pending(uint32_t w) { return w == kWordSentinel; }
  static __device__ __forceinline__ bool pending(uint4 v) {
    return v.x == kWordSentinel || v.y == kWordSentinel || v.z == kWordSentinel ||
           v.w == kWordSentinel;
  }
  static __device__ __forceinline__ uint4 sentinel() {
    return make_uint4(kWordSentinel, kWordSentinel, kWordSentinel, kWordSentinel);
  }
  // A pack as it travels (params.h, escape_encode): where no lane is the sentinel or the
  // marker, the pack itself and `escape` 0 (no escape word is stored); otherwise sentinel lanes
  // become the marker and `escape` says which they were.
  static __device__ __forceinline__ uint4 encode(uint4 v, uint32_t& escape) {
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    escape = escape_encode(w);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
  // Whether an arrived pack holds marker lanes: its escape word says which were the sentinel.
  static __device__ __forceinline__ bool escaped(uint4 v) {
    return v.x == kWordMarker || v.y == kWordMarker || v.z == kWordMarker || v.w == kWordMarker;
  }
  static __device__ __forceinline__ uint4 decode(uint4 v, uint32_t escape) {
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    escape_decode(w, escape);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <class Lanes>
__device__ __forceinline__ uint4 publishable(uint4 v) {
  return make_uint4(Lanes::publishable(v.x), Lanes::publishable(v.y), Lanes::publishable(v.z),
                    Lanes::publishable(v.w));
}

// --- Publishing -------------------------------------------------------------------------------
// Pack offset of slot [gen][source][row] in a mailbox of `slot_rows` rows per (gen, source).
__device__ __forceinline__ int64_t mailbox_offset(uint32_t gen, int tp, int source, int64_t slot_rows,
                                                  int64_t row, int np, int pack) {
  return ((static_cast<int64_t>(gen) * tp + source) * slot_rows + row) * np + pack;
}

// Stores `v` at pack `off` of each of the tp mailboxes in `targets` (an array of the kernel's
// parameters, indexed with compile-time indices only, so it stays in parameter space).
__device__ __forceinline__ void store_to_ranks(void* const (&targets)[kMaxTp], int tp, int64_t off,
                                               uint4 v) {
#pragma unroll
  for (int i = 0; i < kMaxTp; ++i) {
    if (i < tp) st_volatile(static_cast<uint4*>(targets[i]) + off, v);
  }
}

// targets[owner] of a kernel-parameter array, selected with compile-time indices only (a
// runtime index would copy the array out of parameter space): the two-shot owner's mailbox.
__device__ __forceinline__ void* owner_target(void* const (&targets)[kMaxTp], int owner) {
  void* base = targets[0];
#pragma unroll
  for (int i = 1; i < kMaxTp; ++i) base = (i == owner) ? targets[i] : base;
  return base;
}

// --- Errors ----------------------------------------------------------------------------------
// `mine`/`theirs`: the two call identities of a kDivergence record (null otherwise).
__device__ __forceinline__ void record_error(const ErrorSink& e, uint32_t code, uint32_t protocol,
                                             int peer, uint32_t generation, int64_t row,
                                             int64_t value, uint32_t call = 0, const uint4* mine = nullptr,
                                             const uint4* theirs = nullptr) {
  const int slot = code == kBadRoute ? kRouteRecord : kTimeoutRecord;  // timeouts and faults: fatal
  volatile ErrorRecord* r = e.records + slot;
  const uint32_t epoch = r->epoch;
  if (atomicCAS(e.claims + slot, epoch, epoch + 1) != epoch) return;  // an earlier one stands
  r->code = code;
  r->op = e.op;
  r->protocol = protocol;
  r->peer = peer;
  r->generation = generation;
  r->row = static_cast<int32_t>(row);
  r->value = value;
  r->call = call;
  if (mine != nullptr) {
    const uint32_t a[4] = {mine->x, mine->y, mine->z, mine->w}, b[4] = {theirs->x, theirs->y, theirs->z, theirs->w};
    for (int i = 0; i < 4; ++i) {
      r->mine.w[i] = a[i];
      r->theirs.w[i] = b[i];
    }
  }
  __threadfence_system();
  r->ready = epoch + 1;
  __threadfence_system();
}

// Where a wait (or a publish) is, for the error record. `state`: the protocol's state (a kernel
// parameter, so no register holds it), read only when an error is recorded.
struct WaitSite {
  uint32_t protocol;
  int peer;
  uint32_t generation;
  int64_t row;
  const LamportState* state;
};

// The index of the call a wait belongs to, for its error record: the state's call count, less
// one where this call's last CTA already advanced the state (a generation past the site's).
__device__ __forceinline__ uint32_t call_of(const WaitSite& site) {  // error paths only
  if (site.state == nullptr) return 0;
  const volatile LamportState* s = site.state;
  for (;;) {
    const uint32_t gen = s->generation, calls = s->calls;
    if (s->generation != gen) continue;  // advanced in between: read again
    return gen == site.generation ? calls : calls - 1;
  }
}

// --- Fault containment (PROTOCOL.md, I12b) ----------------------------------------------------
// This rank's fault word (params.h, fault_word): 0 while no rank of the group gave up a wait or
// found a divergence. One per communicator: every kernel of every op reads it. Peers store into
// it over NVLink (system-scope atomics); this load is system scope too (the waits' reads).
__device__ __forceinline__ uint32_t load_fault(const ErrorSink& e) {
  return cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(*e.fault).load(cuda::memory_order_relaxed);
}
// The same word with a GPU-scope relaxed load (the load read_generation_cta makes too), for the
// publishers' per-row checks (publish_rows). The PTX memory model does not promise that it sees a
// peer's system-scope store (the two are not morally strong); it rests on the word living in
// this GPU's memory, whose L2 the peers' NVLink stores land in and a GPU-scope load reads
// (bypassing L1). It is a check against publishing after a fault, not an ordering with the
// peer's other stores: a fault raised after it is caught by the next check or the waits.
// A system-scope load of it in every lane of every row cost the streaming publishers more
// (PERFORMANCE.md, 2026-12-03).
__device__ __forceinline__ uint32_t load_fault_gpu(const ErrorSink& e) { return ld_relaxed_gpu(e.fault); }
// This rank gave up a wait of `peer` (or found its call header unlike its own): every rank's
// fault word (this one's too) names it, unless an earlier fault already stands there (the first
// one stays).
__device__ __forceinline__ void raise_fault(const ErrorSink& e, int peer, bool divergence) {
  const uint32_t w = fault_word(e.rank, peer, divergence);
  for (int r = 0; r < e.fault_ranks; ++r) {
    uint32_t expected = 0;
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(*e.fault_peers[r])
        .compare_exchange_strong(expected, w, cuda::memory_order_relaxed);
  }
}
// The error paths, not inlined: their registers stay out of the hot loops around them (inlined,
// they made the streaming finalize publishers spill). Arguments by value: no address of a
// kernel parameter escapes (that would copy it to local memory at the kernel's start).
//
// A fault seen here (fault word f): recorded on this rank (the timeout record: fatal), with the
// word, which names the rank that raised it and the peer it gave up on. Where this rank raised
// it itself, its own record stands already (the first record of its kind wins).
static __device__ __noinline__ void record_fault(const ErrorSink e, uint32_t f, const WaitSite site) {
  record_error(e, kPeerFault, site.protocol, fault_timed_out_rank(f), site.generation, site.row, f, call_of(site));
}
// A wait's budget expired: recorded, and the fault raised in every rank's word.
static __device__ __noinline__ void record_timeout(const ErrorSink e, const WaitSite site) {
  record_error(e, kWaitTimeout, site.protocol, site.peer, site.generation, site.row, 0, call_of(site));
  raise_fault(e, site.peer, false);
}
// A peer's call header differs from this rank's: both recorded, and the fault raised.
static __device__ __noinline__ void record_divergence(const ErrorSink e, const WaitSite site, const uint4 mine,
                                                      const uint4 theirs) {
  record_error(e, kDivergence, site.protocol, site.peer, site.generation, site.row, 0, call_of(site), &mine, &theirs);
  raise_fault(e, site.peer, true);
}
// Whether this thread may store into peers' mailboxes: `fault` (this rank's fault word as the
// kernel read it with its state, or as the caller loaded it since) is 0. A publish that is
// dropped records the fault (a cold path), so the host of this rank reports it and the call's
// outputs are never taken for right.
__device__ __forceinline__ bool may_publish(const ErrorSink& e, uint32_t fault, const WaitSite& site) {
  if (fault == 0) return true;
  record_fault(e, fault, site);
  return false;
}

// Volatile loads and the sentinel test of the two kinds of slot a wait polls: 16-byte packs, and
// the all-gather's 32-bit escape words.
__device__ __forceinline__ uint32_t ld_volatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_volatile(const uint4* p) { return ld_volatile(static_cast<const void*>(p)); }

// The fault word as a warp's threads that got here together read it: one load by the first of
// them, shared (a strong load of one address by every thread of a large grid serializes).
__device__ __forceinline__ uint32_t load_fault_coalesced(const ErrorSink& e) {
  const unsigned mask = __activemask();
  const int leader = __ffs(mask) - 1;
  uint32_t f = 0;
  if (static_cast<int>(threadIdx.x & 31) == leader) f = load_fault(e);
  return __shfl_sync(mask, f, leader);
}

// The one bounded wait: re-loads *slot until no lane holds the sentinel. `v` holds a first load
// made by the caller (so several slots' loads can be in flight together). Returns false when
// the spin budget expired (recorded, and the fault raised in every rank's fault word) or a fault
// of the group was seen (recorded); the caller then stores nothing more into any mailbox and
// goes on with whatever it holds, so the kernel ends and the host reports the error.
// The fault word is read on the first spin and every kFaultSpins after (a fault raised before or
// during the wait ends it within kFaultSpins polls: PROTOCOL.md I12b), the clock every 256.
// `poll_beside` (optional): called after each re-load of the slot, in the spin loop only. The
// wait of the checking CTA's first row passes one that re-loads the call's headers while the
// value in hand (a register, or shared memory) is still the sentinel (HeaderPoll), so that
// check_header finds them arrived instead of polling for them a round trip after the data:
// their writers store them before their first packs, and a first load made with the slot's
// came back stale whenever the slot's did. Computed inside the loop, its address holds no
// register across the wait.
struct NoPollBeside {
  __device__ __forceinline__ void operator()() const {}
};
constexpr uint32_t kFaultSpins = 32;
template <class Lanes, class T, class PollBeside = NoPollBeside>
__device__ __forceinline__ bool wait_slot(const T* slot, T& v, const ErrorSink& e, const WaitSite& site,
                                          PollBeside poll_beside = {}) {
  if (!Lanes::pending(v)) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t spin = 1;; ++spin) {
    v = ld_volatile(slot);
    poll_beside();
    if (!Lanes::pending(v)) return true;
    if (spin % kFaultSpins == 1) {
      const uint32_t f = load_fault_coalesced(e);
      if (f != 0) {
        record_fault(e, f, site);
        return false;
      }
      if (spin % 256 == 1 && global_timer_ns() - start > e.timeout_ns) {
        record_timeout(e, site);
        return false;
      }
    }
  }
}
template <class Lanes, class PollBeside = NoPollBeside>
__device__ __forceinline__ bool wait_slot(const void* slot, uint4& v, const ErrorSink& e, const WaitSite& site,
                                          PollBeside poll_beside = {}) {
  return wait_slot<Lanes>(static_cast<const uint4*>(slot), v, e, site, poll_beside);
}

// The bounded wait over a unit's n <= kN slots at once (a pack of each source): `val(r)` is
// where this thread holds slot r's latest load (a register of an unrolled array, or shared
// memory), made by the caller for every r first; `slot_of(r)` its address. Each spin re-loads
// every slot still holding a sentinel lane, all in flight together, so a wait for tp sources
// costs the latest one's round trip, not one round trip a source (a wait_slot a source waits
// for each in turn, and re-polls source r + 1 only once source r arrived), and the spin loop is
// one copy in the kernel's code, not kN (one H200, 2026-12-03: the one-shot consumer's code
// was 5184 SASS instructions at hc = 4 with one wait_slot a source). The fault word and the
// clock go as in wait_slot; an expired budget names the lowest source still missing
// (`peer_of(r)`: its rank). Returns whether every slot arrived.
template <class Lanes, int kN, class Val, class SlotOf, class PeerOf, class PollBeside = NoPollBeside>
__device__ __forceinline__ bool wait_slots(int n, Val val, SlotOf slot_of, const ErrorSink& e, WaitSite site,
                                           PeerOf peer_of, PollBeside poll_beside = {}) {
  uint32_t missing = 0;
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    if (r < n && Lanes::pending(val(r))) missing |= 1u << r;
  }
  if (missing == 0) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t spin = 1;; ++spin) {
#pragma unroll
    for (int r = 0; r < kN; ++r) {
      if (missing & (1u << r)) val(r) = ld_volatile(slot_of(r));
    }
    poll_beside();
#pragma unroll
    for (int r = 0; r < kN; ++r) {
      if ((missing & (1u << r)) && !Lanes::pending(val(r))) missing &= ~(1u << r);
    }
    if (missing == 0) return true;
    if (spin % kFaultSpins == 1) {
      site.peer = peer_of(__ffs(missing) - 1);
      const uint32_t f = load_fault_coalesced(e);
      if (f != 0) {
        record_fault(e, f, site);
        return false;
      }
      if (spin % 256 == 1 && global_timer_ns() - start > e.timeout_ns) {
        record_timeout(e, site);
        return false;
      }
    }
  }
}

// --- Call headers (PROTOCOL.md, I19) ------------------------------------------------------------
__device__ __forceinline__ bool same_pack(uint4 a, uint4 b) {
  return ((a.x ^ b.x) | (a.y ^ b.y) | (a.z ^ b.z) | (a.w ^ b.w)) == 0;
}
// wait_slot's poll_beside for a call header: while *value (where this thread holds the header's
// latest load) is the sentinel, re-load it from where `at()` says. `on`: whether this thread
// checks a header at all (one CTA's threads a call: PROTOCOL.md, I19).
template <class At>
struct HeaderPoll {
  bool on;
  uint4* value;
  At at;
  __device__ __forceinline__ void operator()() const {
    if (on && Bf16Lanes::pending(*value)) *value = ld_volatile(static_cast<const uint4*>(at()));
  }
};
template <class At>
__device__ __forceinline__ HeaderPoll<At> header_poll(bool on, uint4* value, At at) {
  return HeaderPoll<At>{on, value, at};
}

// A peer's call header at `hdr` (this rank's mailbox), against this rank's `want`: waits for it
// (the bounded wait: its writer stored it before its first pack of the call). A header unlike
// `want` is recorded as a divergence naming the peer, and the fault raised. Returns whether it
// arrived and matched. `v`: a first load made by the caller. kReset: the all-gather's headers
// (one a CTA, this thread its only reader, its writer stores it again only three calls later:
// I4) are reset to the sentinel once arrived; the all-reduce's (one a writer and call, read by
// one CTA) are reset by this rank's next call of the protocol, with the rows of this one
// (reset_call_headers).
template <class Lanes, bool kReset = false>
__device__ __forceinline__ bool check_header(const uint4* hdr, uint4 v, uint4 want, const ErrorSink& e,
                                             const WaitSite& site) {
  if (!wait_slot<Lanes>(hdr, v, e, site)) return false;
  if constexpr (kReset) st_volatile(const_cast<uint4*>(hdr), Lanes::sentinel());
  if (same_pack(v, want)) return true;
  record_divergence(e, site, want, v);
  return false;
}

// check_header with only its common case inline: a header that arrived and equals `want` is one
// compare (a header still in flight holds a sentinel lane, which no identity has: PROTOCOL.md
// I19, make_call_identity). Anything else takes the out-of-line path: the bounded wait, the
// compare, the record. The inline check costs the checking warp a few instructions; the whole
// check inline (the wait's setup, the header's address) was about 60 dependent ones, which every
// CTA of the row waited for at its RMS sum (ncu warp sampling, one H200, 2026-12-05).
// check_header_cold: the header at `hdr`; check_header_cold_at: at writer `writer`'s header slot
// of generation `gen` of the mailbox at `base` (call_header_offset), the address computed there.
template <class Lanes>
static __device__ __noinline__ bool check_header_cold(const uint4* hdr, uint4 v, uint4 want, const ErrorSink e,
                                                      const WaitSite site) {
  return check_header<Lanes>(hdr, v, want, e, site);
}
template <class Lanes>
static __device__ __noinline__ bool check_header_cold_at(const uint4* base, uint32_t gen, int sources,
                                                         int64_t slot_rows, int np, int writer, uint4 v, uint4 want,
                                                         const ErrorSink e, const WaitSite site) {
  return check_header<Lanes>(base + call_header_offset(gen, sources, slot_rows, np, writer), v, want, e, site);
}

// Resets the call headers of generation `gen` of writers 0 .. writers - 1 in the mailbox at
// `base` (its headers at pack offset `headers`: mailbox_row_packs of its layout) to the
// sentinel: thread w of the calling CTA resets writer w's.
__device__ __forceinline__ void reset_call_headers(void* base, int64_t headers, uint32_t gen, int writers) {
  const int w = static_cast<int>(threadIdx.x);
  if (w < writers) st_volatile(static_cast<uint4*>(base) + call_header_at(headers, gen, w), Bf16Lanes::sentinel());
}

// --- Protocol state --------------------------------------------------------------------------
struct Generation {
  uint32_t current;   // slots this call writes and reads
  uint32_t previous;  // slots of the previous call, reset by this one
  uint32_t prev_rows;
  uint32_t fault;     // this rank's fault word as the kernel started: publish nothing if set
  uint32_t rejected;  // this rank's count of rejected calls (ErrorSink::fault + 1), which its call identity carries
};
// This rank's identity of the call as its call header carries it (PROTOCOL.md, I19): the host's
// (op, protocol, variant, size) with the generation and the rejected count this kernel read.
__device__ __forceinline__ uint4 identity_pack(const CallIdentity& id, const Generation& g) {
  const CallIdentity c = with_call_state(id, g.current, g.rejected);
  return make_uint4(c.w[0], c.w[1], c.w[2], c.w[3]);
}
// The protocol state of this call, and the communicator's fault word with this rank's rejected
// count beside it (one 8-byte load). Plain loads in a kernel
// that passed griddepcontrol.wait (or has no PDL predecessor): the previous call's last kernel,
// which wrote the state, completed before, and its writes are visible (so is the count: a
// rejected call's increment is a kernel of the stream before this call's first); the fault word's line is
// not in this kernel's L1 before this load, which takes it from L2, where peers' stores land (a
// warp's loads of it are one request, and an SM's warps share one L1 miss). A line a predecessor
// grid still resident on the SM loaded could be stale (PDL; a review, 2026-12-05): then this call
// may publish once after a fault, which weakens only I12b's "nothing stored after a fault", never
// an error's report: a rank whose wait ended on the fault holds its fatal record already, and
// the waits read the word with system-scope loads. Where a kernel skips
// the wait (after our own publish, which passed it), PDL promises no such visibility:
// read_generation_cta then reads both with GPU-scope relaxed loads, by one thread of the CTA,
// shared through shared memory (`box`, a CTA barrier: call it from every thread). Not one strong
// load a warp: measured on one H200, strong loads of the state by every warp of 4096 CTAs cost
// 54 us a call in the Lamport floor and 39 us in the two-shot call at M = 4096 (TP=1 self-test),
// against cached loads.
using StateBox = uint32_t[4];
// The same loads by every warp itself (a warp's loads of one address are one request), with no
// CTA barrier: no warp waits for thread 0's round trip and the shared memory's before its first
// poll. For small grids only (kWarpStateMaxCtas: M <= 64 at hc = 4): the two-shot's owners of a
// CTA a row (the consumers keep read_generation_cta: a warp each, the one-shot finalize's was
// slower, 2026-12-05).
constexpr unsigned kWarpStateMaxCtas = 96;
__device__ __forceinline__ Generation read_generation_warp(const LamportState* s, const ErrorSink& e) {
  Generation g;
  g.current = ld_relaxed_gpu(&s->generation);
  g.prev_rows = ld_relaxed_gpu(&s->prev_rows);
  // GPU scope (load_fault_gpu): peers store into the fault word, the state and the count are
  // this GPU's own; a system-scope load cost more (PERFORMANCE.md).
  const uint2 w = ld_relaxed_gpu_pair(e.fault);
  g.fault = w.x;
  g.rejected = w.y;
  g.previous = (g.current + kGenerations - 1) % kGenerations;
  return g;
}
__device__ __forceinline__ Generation read_generation(const LamportState* s, const ErrorSink& e) {
  Generation g;
  g.current = s->generation;
  g.prev_rows = s->prev_rows;
  const uint2 w = *reinterpret_cast<const uint2*>(e.fault);
  g.fault = w.x;
  g.rejected = w.y;
  g.previous = (g.current + kGenerations - 1) % kGenerations;
  return g;
}
__device__ __forceinline__ Generation read_generation_cta(const LamportState* s, const ErrorSink& e, StateBox& box) {
  if (threadIdx.x == 0) {  // read_generation_warp's loads, by one thread
    const Generation t = read_generation_warp(s, e);
    box[0] = t.current;
    box[1] = t.prev_rows;
    box[2] = t.fault;
    box[3] = t.rejected;
  }
  __syncthreads();
  Generation g;
  g.current = box[0];
  g.prev_rows = box[1];
  g.fault = box[2];
  g.rejected = box[3];
  g.previous = (g.current + kGenerations - 1) % kGenerations;
  return g;
}

// The generation advance, in two halves so that its atomic round trip is off the kernel's tail.
// arrive_early: called by every thread of every CTA of a call's last kernel once each has read
// the state into registers (a CTA barrier makes that so for the whole CTA); thread 0 takes a
// ticket. advance_if_last: at the end, the CTA holding the last ticket advances the generation
// and records this call's rows. Safe this early: a ticket is taken only after the CTA read the
// state, so the last ticket means every CTA of the grid has read it; nothing later in this call
// reads it (the call's earlier kernels read it before they let this one launch), and the next
// call's first kernel reads it only after griddepcontrol.wait, i.e. after this grid completed.
// No memory fence: the next call's kernels see the new state through kernel completion, and a
// fence would wait for this thread's in-flight NVLink stores (a remote round trip a call).
__device__ __forceinline__ uint32_t arrive_early(LamportState* s) {
  __syncthreads();
  return threadIdx.x == 0 ? atomicAdd(&s->arrived, 1u) : 0u;
}
__device__ __forceinline__ void advance_if_last(LamportState* s, uint32_t ticket, uint32_t rows) {
  if (threadIdx.x != 0) return;
  const uint32_t total = gridDim.x * gridDim.y * gridDim.z;
  if (ticket == total - 1) {
    s->arrived = 0;
    s->generation = (s->generation + 1) % kGenerations;
    s->prev_rows = rows;
    s->calls += 1;
  }
}

// Resets packs [0, packs_per_slot) of `nslots` slots (slot i at base + i * slot_stride_packs)
// to the sentinel, spread over the whole grid.
template <class Lanes>
__device__ __forceinline__ void reset_slots(void* base, int nslots, int64_t slot_stride_packs,
                                            int64_t packs_per_slot) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int s = 0; s < nslots; ++s) {
    uint4* slot = static_cast<uint4*>(base) + s * slot_stride_packs;
    for (int64_t i = first; i < packs_per_slot; i += step) st_volatile(slot + i, Lanes::sentinel());
  }
}

// --- BF16 packs ------------------------------------------------------------------------------
__device__ __forceinline__ void unpack_bf16(uint4 v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 t = __floats2bfloat162_rn(lo, hi);  // one cvt.rn.bf16x2.f32
  return *reinterpret_cast<const uint32_t*>(&t);
}
__device__ __forceinline__ uint4 pack_bf16(const float (&f)[8]) {
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                    pack_bf16x2(f[6], f[7]));
}

// Position of this thread's pack in a row tiled by RowTiling (one pack a thread).
struct RowPack {
  int64_t row;
  int part;     // CTA within the row (cluster rank)
  int pack;     // pack index within the row
  bool active;  // pack < np
};
__device__ __forceinline__ RowPack row_pack(const RowTiling& t, int np) {
  RowPack r;
  r.row = blockIdx.x / t.ctas_per_row;
  r.part = static_cast<int>(blockIdx.x % t.ctas_per_row);
  r.pack = r.part * t.packs_per_cta + static_cast<int>(threadIdx.x);
  r.active = static_cast<int>(threadIdx.x) < t.packs_per_cta && r.pack < np;
  return r;
}

}  // namespace mhccl::kernels
