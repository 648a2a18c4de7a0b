// Lamport primitives: the sentinel, 16-byte packs, volatile loads/stores over NVLink peer
// mappings, and the one bounded wait every poll loop goes through.
//
// A mailbox slot holds the sentinel until its writer stores real data; writers never store the
// sentinel (BF16 -0.0 -> +0.0, all-gather word 0x80000000 -> 0), so "no lane holds the
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
// A relaxed GPU-scope load: the protocol state, where a kernel reads it without
// griddepcontrol.wait (PDL promises no cache invalidation then; a cached copy could be stale).
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
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
struct WordLanes {  // all-gather mailboxes: 4 lanes of 32 bits a pack
  static __device__ __forceinline__ bool pending(uint4 v) {
    return v.x == kWordSentinel || v.y == kWordSentinel || v.z == kWordSentinel ||
           v.w == kWordSentinel;
  }
  static __device__ __forceinline__ uint32_t publishable(uint32_t w) {
    return w == kWordSentinel ? 0u : w;
  }
  static __device__ __forceinline__ uint4 sentinel() {
    return make_uint4(kWordSentinel, kWordSentinel, kWordSentinel, kWordSentinel);
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
__device__ __forceinline__ void record_error(const ErrorSink& e, uint32_t code, uint32_t protocol,
                                             int peer, uint32_t generation, int64_t row,
                                             int64_t value, uint32_t call = 0) {
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
// This rank's fault word (params.h, fault_word): 0 while no rank of the group gave up a wait.
// System scope: peers store into it over NVLink.
__device__ __forceinline__ uint32_t load_fault(const ErrorSink& e) {
  return cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(*e.fault).load(cuda::memory_order_relaxed);
}
// A wait of this rank for `waited_for` expired: every rank's fault word (this one's too) names
// this rank, unless an earlier fault already stands there (the first one stays).
__device__ __forceinline__ void raise_fault(const ErrorSink& e, int waited_for) {
  const uint32_t w = fault_word(e.rank, waited_for);
  for (int r = 0; r < e.fault_ranks; ++r) {
    uint32_t expected = 0;
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(*e.fault_peers[r])
        .compare_exchange_strong(expected, w, cuda::memory_order_relaxed);
  }
}
// This protocol's state marked: none of its later kernels on this rank publishes (I12b).
__device__ __forceinline__ void mark_faulted(const WaitSite& site) {
  if (site.state != nullptr) atomicExch(const_cast<uint32_t*>(&site.state->faulted), 1u);
}
// The error paths, not inlined: their registers stay out of the hot loops around them (inlined,
// they made the streaming finalize publishers spill). Arguments by value: no address of a
// kernel parameter escapes (that would copy it to local memory at the kernel's start).
//
// A fault seen here: recorded on this rank (the timeout record: fatal), naming the rank that
// timed out and the one it waited for. Where this rank timed out itself, its kWaitTimeout record
// stands already (the first record of its kind wins).
static __device__ __noinline__ void record_fault(const ErrorSink e, uint32_t f, const WaitSite site) {
  record_error(e, kPeerFault, site.protocol, fault_timed_out_rank(f), site.generation, site.row,
               fault_waited_for(f), call_of(site));
  mark_faulted(site);
}
// A wait's budget expired: recorded, and the fault raised in every rank's word.
static __device__ __noinline__ void record_timeout(const ErrorSink e, const WaitSite site) {
  record_error(e, kWaitTimeout, site.protocol, site.peer, site.generation, site.row, 0, call_of(site));
  raise_fault(e, site.peer);
  mark_faulted(site);
}
// Whether this thread may store into peers' mailboxes: `stop` (this protocol's state says a
// wait of it gave up, or the caller loaded a fault word that is set) is false. A publish that is
// dropped records the fault (the word read on this cold path), so the host of this rank
// reports it and the call's outputs are never taken for right.
__device__ __forceinline__ bool may_publish(const ErrorSink& e, uint32_t stop, const WaitSite& site) {
  if (stop == 0) return true;
  const uint32_t f = load_fault(e);
  record_fault(e, f != 0 ? f : fault_word(e.rank, e.rank), site);
  return false;
}

// The one bounded wait: re-loads *slot until no lane holds the sentinel. `v` holds a first load
// made by the caller (so several slots' loads can be in flight together). Returns false when
// the spin budget expired (recorded, and the fault raised in every rank's fault word) or a fault
// of the group was seen (recorded); the caller then stores nothing more into any mailbox and
// goes on with whatever it holds, so the kernel ends and the host reports the error.
template <class Lanes>
__device__ __forceinline__ bool wait_slot(const void* slot, uint4& v, const ErrorSink& e,
                                          const WaitSite& site) {
  if (!Lanes::pending(v)) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t spin = 1;; ++spin) {
    v = ld_volatile(slot);
    if (!Lanes::pending(v)) return true;
    if ((spin & 255u) == 0) {
      const uint32_t f = load_fault(e);
      if (f != 0) {
        record_fault(e, f, site);
        return false;
      }
      if (global_timer_ns() - start > e.timeout_ns) {
        record_timeout(e, site);
        return false;
      }
    }
  }
}

// --- Protocol state --------------------------------------------------------------------------
struct Generation {
  uint32_t current;   // slots this call writes and reads
  uint32_t previous;  // slots of the previous call, reset by this one
  uint32_t prev_rows;
  uint32_t faulted;   // LamportState::faulted: publish nothing
};
// The protocol state of this call. Plain loads in a kernel that passed griddepcontrol.wait (or
// has no PDL predecessor): the previous call's last kernel, which wrote it, completed before,
// and its writes are visible. Where a kernel skips the wait (after our own publish, which
// passed it), PDL promises no such visibility: read_generation_cta then reads it with GPU-scope
// relaxed loads, by one thread of the CTA, shared through shared memory (`box`, a CTA barrier:
// call it from every thread). Not one strong load a warp: measured on one H200 (session 6),
// strong loads of the state by every warp of 4096 CTAs cost 54 us a call in the Lamport floor
// and 39 us in the two-shot call at M = 4096 (TP=1 self-test), against cached loads.
__device__ __forceinline__ Generation read_generation(const LamportState* s) {
  Generation g;
  g.current = s->generation;
  g.prev_rows = s->prev_rows;
  g.faulted = s->faulted;
  g.previous = (g.current + kGenerations - 1) % kGenerations;
  return g;
}
__device__ __forceinline__ Generation read_generation_cta(const LamportState* s, uint32_t (&box)[3]) {
  if (threadIdx.x == 0) {
    box[0] = ld_relaxed_gpu(&s->generation);
    box[1] = ld_relaxed_gpu(&s->prev_rows);
    box[2] = ld_relaxed_gpu(&s->faulted);
  }
  __syncthreads();
  Generation g;
  g.current = box[0];
  g.prev_rows = box[1];
  g.faulted = box[2];
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
