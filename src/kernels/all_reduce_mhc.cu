// AllReduceMHC kernels: the publish (x, or the MoE finalize reduction), the two-shot owners'
// reduce, and the fused consumer (Lamport poll + FP32 rank-order sum + mHC post-mix + collapse
// + RMSNorm + MXFP8). One thread owns one 16-byte pack (8 BF16) of a row; a row spans
// tiling.ctas_per_row CTAs (a thread-block cluster whose CTAs add their RMS partial sums
// through distributed shared memory).
#include <algorithm>
#include <utility>
#include <vector>

#include <cooperative_groups.h>
#include <cuda/ptx>

#include "kernels/launch.h"
#include "kernels/lamport.cuh"
#include "mhccl/fp8_groups.h"
#include "mhccl/mxfp8.h"

namespace mhccl::kernels {
namespace {

namespace cg = cooperative_groups;

// --- MoE finalize: this rank's x of one pack ------------------------------------------------
// x = bf16(acc + shared), acc = sum_k w[k] * gemm2[route[k]] from +0.0 in k order, FP32 fmaf
// (SPEC.md, finalize: the routed sum first, the shared expert added last, one rounding).
// Routes of -1 are skipped; any other index outside [0, rows) is skipped and, when `report`,
// recorded. The gemm2 packs of kGroup routes are loaded together before their fmas: 8, so that
// DSV4.1's top_k = 6 costs two dependent round trips (routes, then rows), not four.
constexpr int kFinalizeGroup = 8;

// Routes and weights k0 .. k0 + 7 of a row (route -1 and weight 0 past top_k).
struct RouteGroup {
  int32_t route[kFinalizeGroup];
  float w[kFinalizeGroup];
};
// Route k and weight k of a row (route -1 and weight 0 past top_k).
__device__ __forceinline__ int32_t route_k(const FinalizeInputs& f, int64_t row, int k) {
  return k < f.top_k ? __ldg(f.routes + row * f.top_k + k) : -1;
}
__device__ __forceinline__ float weight_k(const FinalizeInputs& f, int64_t row, int k) {
  return k < f.top_k ? __ldg(f.weights + row * f.top_k + k) : 0.0f;
}
__device__ __forceinline__ void load_route_group(const FinalizeInputs& f, int64_t row, int k0, RouteGroup& rg) {
#pragma unroll
  for (int j = 0; j < kFinalizeGroup; ++j) {
    rg.route[j] = route_k(f, row, k0 + j);
    rg.w[j] = weight_k(f, row, k0 + j);
  }
}

// The GEMM2 packs of a group's routes route_at(0 .. kFinalizeGroup - 1) that are in range, all
// loads in flight together. route_at / weight_at read the group where it lies (registers, or
// shared memory: read again where used instead of held in registers).
template <class RouteAt>
__device__ __forceinline__ void load_group_rows(const FinalizeInputs& f, int pack, int np, RouteAt route_at,
                                                uint4 (&g)[kFinalizeGroup]) {
#pragma unroll
  for (int j = 0; j < kFinalizeGroup; ++j) {
    const int32_t route = route_at(j);
    if (route >= 0 && route < f.gemm2_rows) {
      g[j] = ld_input(static_cast<const uint4*>(f.gemm2) + static_cast<int64_t>(route) * np + pack);
    }
  }
}

// acc += weight_at(j) * pack_at(j) over the group of kGroup routes k0 .. in k order; bad routes
// skipped (and recorded when `report`).
template <int kGroup = kFinalizeGroup, class RouteAt, class WeightAt, class PackAt>
__device__ __forceinline__ void fma_group_rows(const FinalizeInputs& f, int64_t row, int k0, RouteAt route_at,
                                               WeightAt weight_at, PackAt pack_at, float (&acc)[8],
                                               const ErrorSink& err, bool report) {
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const int32_t route = route_at(j);
    if (route >= 0 && route < f.gemm2_rows) {
      const float w = weight_at(j);
      float v[8];
      unpack_bf16(pack_at(j), v);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = __fmaf_rn(w, v[e], acc[e]);
    } else if (report && route != -1 && k0 + j < f.top_k) {
      record_error(err, kBadRoute, 0, -1, 0, row, route);
    }
  }
}

// The routed sum: acc += the route groups from k0 on, in k order.
__device__ __forceinline__ void finalize_groups(const FinalizeInputs& f, int64_t row, int pack, int np, int k0,
                                                float (&acc)[8], const ErrorSink& err, bool report) {
  for (; k0 < f.top_k; k0 += kFinalizeGroup) {
    RouteGroup rg;
    load_route_group(f, row, k0, rg);
    const auto route_at = [&](int j) { return rg.route[j]; };
    uint4 g[kFinalizeGroup];
    load_group_rows(f, pack, np, route_at, g);
    fma_group_rows(f, row, k0, route_at, [&](int j) { return rg.w[j]; }, [&](int j) { return g[j]; }, acc, err,
                   report);
  }
}

// The routes from kFinalizeGroup on (top_k > 8, not DSV4.1's 6), one at a time: acc += w[k] *
// gemm2[route[k]] in k order. Few registers (one route's loads in flight), so the first group's
// code around it, where the time goes, stays free of spills; each route is a dependent round trip.
__device__ __forceinline__ void finalize_tail(const FinalizeInputs& f, int64_t row, int pack, int np, float (&acc)[8],
                                              const ErrorSink& err, bool report) {
  const int32_t* row_routes = f.routes + row * f.top_k;
  const float* row_weights = f.weights + row * f.top_k;
#pragma unroll 1
  for (int k = kFinalizeGroup; k < f.top_k; ++k) {
    const int32_t route = __ldg(row_routes + k);
    fma_group_rows<1>(
        f, row, k, [&](int) { return route; }, [&](int) { return __ldg(row_weights + k); },
        [&](int) { return ld_input(static_cast<const uint4*>(f.gemm2) + static_cast<int64_t>(route) * np + pack); },
        acc, err, report);
  }
}

// bf16(acc + shared): the shared expert's pack added last to the routed sum (SPEC.md, finalize).
__device__ __forceinline__ uint4 add_shared_expert(float (&acc)[8], uint4 shared) {
  float s[8];
  unpack_bf16(shared, s);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], s[e]);
  return pack_bf16(acc);
}

// x = bf16(acc + shared), acc = sum_k w[k] * gemm2[route[k]] from +0.0 in k order, FP32 fmaf
// (SPEC.md, finalize). Routes of -1 are skipped; any other index outside [0, rows) is skipped
// and, when `report`, recorded. The gemm2 packs of kFinalizeGroup routes are loaded together
// before their fmas: 8, so that DSV4.1's top_k = 6 costs two dependent round trips (routes, then
// rows), not four. The shared row's load goes out with the first group's GEMM2 rows: no
// register holds it across the route loads (at 96 registers a thread it would spill).
// The routed sum into acc (from +0.0); `after_row_loads` runs once the first group's GEMM2 loads
// are out (where finalize_pack loads the shared expert's pack).
template <class AfterRowLoads>
__device__ __forceinline__ void finalize_routed(const FinalizeInputs& f, int64_t row, int pack, int np,
                                                const ErrorSink& err, bool report, float (&acc)[8],
                                                AfterRowLoads after_row_loads) {
  RouteGroup rg;
  load_route_group(f, row, 0, rg);
  const auto route_at = [&](int j) { return rg.route[j]; };
  uint4 g[kFinalizeGroup];
  load_group_rows(f, pack, np, route_at, g);
  after_row_loads();
  fma_group_rows(f, row, 0, route_at, [&](int j) { return rg.w[j]; }, [&](int j) { return g[j]; }, acc, err, report);
  finalize_groups(f, row, pack, np, kFinalizeGroup, acc, err, report);  // top_k > 8 only
}
__device__ __forceinline__ uint4 finalize_pack(const FinalizeInputs& f, int64_t row, int pack,
                                               int np, const ErrorSink& err, bool report) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  uint4 shared;
  finalize_routed(f, row, pack, np, err, report, acc,
                  [&] { shared = ld_input(static_cast<const uint4*>(f.shared) + row * np + pack); });
  return add_shared_expert(acc, shared);
}

// --- Reductions -----------------------------------------------------------------------------
// Deterministic CTA sum: an xor butterfly in each warp, the warps' sums in shared memory, then
// every warp adds those with the same butterfly (identical bits in every thread, a single
// barrier). Called by every thread of the CTA; at most 32 warps.
__device__ __forceinline__ float block_sum(float v, float* warp_sums) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  const unsigned lane = threadIdx.x & 31;
  float t = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xFFFFFFFFu, t, o);
  return t;
}

// Sum over the CTAs of a row's cluster, in cluster-rank order (identical bits on every CTA).
// Each CTA sends its partial into every CTA's slot with st.async, which signals the receiver's
// mbarrier; a CTA then waits on its own mbarrier only. No release fence on the sender's side:
// cluster.sync() (barrier.cluster.arrive.release) waited for this thread's earlier NVLink
// stores (the single-launch publish) to complete, 0.24 us a call at M = 1..8 (PERFORMANCE.md).
// Every CTA arrived on the cluster barrier at the kernel's start, after initialising its
// mbarrier (cluster_sum_prologue); the wait below (every CTA of the cluster has started: its
// shared memory may be written) is free by now.
struct ClusterSum {
  float slots[kMaxCtasPerRow];
  uint64_t bar;  // mbarrier: one phase a kernel (one row a CTA)
};

__device__ __forceinline__ void cluster_sum_prologue(ClusterSum& cs) {
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(&cs.bar, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  cg::this_cluster().barrier_arrive();  // waited for in cluster_row_sum
}

__device__ __forceinline__ float cluster_row_sum(float cta_total, ClusterSum& cs, int ctas) {
  cg::cluster_group cluster = cg::this_cluster();
  cluster.barrier_wait();
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                         cuda::ptx::space_shared, &cs.bar,
                                         static_cast<uint32_t>(ctas * sizeof(float)));
  }
  if (static_cast<int>(threadIdx.x) < ctas) {
    const int to = static_cast<int>(threadIdx.x);
    cuda::ptx::st_async(cluster.map_shared_rank(cs.slots, to) + cluster.block_rank(), cta_total,
                        cluster.map_shared_rank(&cs.bar, to));
  }
  // Every CTA of the cluster reaches this point (no early exit in the consumer; an expired
  // Lamport wait goes on with what it holds), and each sends one partial to each: the phase
  // completes. A CTA's shared memory is written only before it passes this wait.
  // Acquire at cluster scope: the partials were written by other CTAs of the cluster.
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, &cs.bar, 0u)) {
  }
  float t = 0.0f;
  for (int i = 0; i < ctas; ++i) t += cs.slots[i];
  return t;
}

// Rows [M, 128 * ceil(M / 128)) of the last 128-row tile of the swizzled scales are padding (0).
// A 16-byte chunk at (q, k-group) of a tile holds rows q, q+32, q+64, q+96 (4 blocks each): a
// chunk of padding rows only is zeroed with one coalesced store, a mixed one word by word. The
// chunks are spread over the whole grid.
__device__ __forceinline__ void zero_scale_padding_rows(uint8_t* scales, int64_t m, int64_t blocks) {
  const int valid = static_cast<int>(m % 128);  // rows of the last tile that hold scales
  if (valid == 0) return;
  const int64_t k_tiles = (blocks + 3) / 4;
  uint8_t* tile = scales + (m / 128) * k_tiles * 512;
  const int64_t chunks = k_tiles * 32;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int q = static_cast<int>(i % 32);
    uint8_t* chunk = tile + (i / 32) * 512 + q * 16;
    if (q >= valid) {
      *reinterpret_cast<uint4*>(chunk) = make_uint4(0, 0, 0, 0);
    } else {
      for (int j = 1; j < 4; ++j) {
        if (q + 32 * j >= valid) *reinterpret_cast<uint32_t*>(chunk + 4 * j) = 0u;
      }
    }
  }
}

// cp.async (sm_80+): 16- and 4-byte global -> shared copies that hold no register while in flight.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all_but_newest() {
  asm volatile("cp.async.wait_group 1;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// A row's mixes (post [HC], comb [HC][HC], pre [HC]; pre not for residual_only) into `mixes`
// with cp.async, spread over the CTA's threads; the caller commits and waits.
template <int HC, ConsumerVariant V>
__device__ __forceinline__ void cp_async_mixes(float* mixes, const ConsumerParams& p, int64_t row) {
  constexpr int kMixes = 2 * HC + HC * HC;
  for (int i = threadIdx.x; i < kMixes; i += blockDim.x) {
    if (i < HC) cp_async4(&mixes[i], p.post + row * HC + i);
    else if (i < HC + HC * HC) cp_async4(&mixes[i], p.comb + row * HC * HC + (i - HC));
    else if (V != ConsumerVariant::kResidualOnly) cp_async4(&mixes[i], p.pre + row * HC + (i - HC - HC * HC));
  }
}

// --- Kernels --------------------------------------------------------------------------------
// This rank's call header (PROTOCOL.md, I19), stored once a call, by the thread that publishes
// the first pack of row 0, before that pack: into writer slot `rank` of generation `gen` of every
// rank's mailbox (one-shot: the slots; two-shot: every owner's contributions, `targets` of
// either kind, each rank's once). `slot_rows`: rows per [gen][source] slot of that mailbox.
__device__ __forceinline__ void publish_call_header(void* const (&targets)[kMaxTp], int tp, int rank,
                                                    int64_t slot_rows, int np, uint32_t gen, uint4 hdr) {
  store_to_ranks(targets, tp, call_header_offset(gen, tp, slot_rows, np, rank), hdr);
}

template <bool kFinalize>
__global__ void __launch_bounds__(kMaxThreadsPerCta) publish_kernel(const PublishParams p) {
  const RowPack rp = row_pack(p.tiling, p.np);
  pdl_wait();  // x / the finalize inputs come from the predecessor; so may our last consumer
  // The generation is read before the dependents may start (they end the call and advance it).
  Generation g{0, 0, 0, 0, 0};
  if (p.dest != PublishDest::kLocal) g = read_generation(p.state, p.err);
  const uint32_t gen = g.current;
  pdl_launch_dependents();
  const int64_t np = p.np;
  if (p.dest == PublishDest::kLocal) {
    if (!rp.active) return;
    const uint4 v = kFinalize ? finalize_pack(p.fin, rp.row, rp.pack, p.np, p.err, rp.pack == 0)
                              : ld_input(static_cast<const uint4*>(p.x) + rp.row * np + rp.pack);
    static_cast<uint4*>(p.targets[0])[rp.row * np + rp.pack] = v;
    return;
  }
  const uint32_t proto = p.dest == PublishDest::kAllRanks ? kProtoOneShot : kProtoTwoShotOwner;
  const WaitSite site{proto, -1, gen, rp.row, p.state};
  // The call's header first, by thread 0 of CTA 0 (row 0, part 0): into every rank's mailbox.
  if (blockIdx.x == 0 && threadIdx.x == 0 && may_publish(p.err, g.fault, site)) {
    publish_call_header(p.targets, p.tp, p.rank, p.slot_rows, p.np, gen, identity_pack(p.id, g));
  }
  if (!rp.active) return;
  uint4 v;
  if constexpr (kFinalize) {
    v = finalize_pack(p.fin, rp.row, rp.pack, p.np, p.err, rp.pack == 0);
  } else {
    v = ld_input(static_cast<const uint4*>(p.x) + rp.row * np + rp.pack);
  }
  if (!may_publish(p.err, g.fault, site)) return;
  v = publishable<Bf16Lanes>(v);
  if (p.dest == PublishDest::kAllRanks) {
    store_to_ranks(p.targets, p.tp, mailbox_offset(gen, p.tp, p.rank, p.slot_rows, rp.row, p.np, rp.pack), v);
  } else {  // kOwner
    st_volatile(static_cast<uint4*>(owner_target(p.targets, static_cast<int>(rp.row % p.tp))) +
                    mailbox_offset(gen, p.tp, p.rank, p.slot_rows, rp.row / p.tp, p.np, rp.pack), v);
  }
}

// Two-shot owner, the call header of source `lane` (lane < tp of warp 0 of the checking CTA):
// where it is in this owner's contributions (nullptr for the other threads).
__device__ __forceinline__ const uint4* owner_header_at(const void* contributions, int tp, int64_t owner_rows, int np,
                                                        uint32_t gen) {
  const int lane = static_cast<int>(threadIdx.x);
  if (lane >= tp) return nullptr;
  return static_cast<const uint4*>(contributions) + call_header_offset(gen, tp, owner_rows, np, lane);
}

// Two-shot owner, warp 0 of the call's checking CTA (the first of the owner's grid, whose first
// owned row is row `rank`, or none where M <= rank), every lane, converged: lane s < tp checks
// source s's contribution header (at `hdr`, `v` its latest load); where every one arrived and
// matched this rank's identity `want` and no fault stands, lane 0 stores this owner's header
// into every rank's reduced buffer (writer slot `rank`). Every consumer waits for every owner's
// header, so none completes on a reduced row built from another call's contribution without an
// error (its wait ends at the fault the mismatch raised). The other owner CTAs check nothing:
// every contribution of generation g in this mailbox comes from the one call whose header is
// here (PROTOCOL.md, I19). kLean: only the compare inline (check_header_cold), as the consumers';
// owner_reduce_kernel only (in the streaming kernels, whose owners share the consumers' code
// and registers, it moved their spills).
template <bool kLean = false>
__device__ __forceinline__ void owner_headers(const uint4* hdr, uint4 v, void* const (&reduced)[kMaxTp], int tp,
                                              int rank, int64_t reduced_rows, int np, uint4 want, const Generation& g,
                                              const LamportState* state, const ErrorSink& err) {
  const int lane = static_cast<int>(threadIdx.x);
  bool ok = true;
  if (lane < tp) {
    const WaitSite site{kProtoTwoShotOwner, lane, g.current, rank, state};
    if constexpr (kLean) ok = same_pack(v, want) || check_header_cold<Bf16Lanes>(hdr, v, want, err, site);
    else ok = check_header<Bf16Lanes>(hdr, v, want, err, site);
  }
  ok = __all_sync(0xFFFFFFFFu, ok);
  if (lane == 0 && ok && may_publish(err, g.fault, WaitSite{kProtoTwoShotOwner, -1, g.current, rank, state})) {
    const int64_t off = call_header_offset(g.current, 1, reduced_rows, np, rank);
#pragma unroll
    for (int i = 0; i < kMaxTp; ++i) {
      if (i < tp) st_volatile(static_cast<uint4*>(reduced[i]) + off, want);
    }
  }
}

// Two-shot owner: owned row j (row j * tp + rank) of this pack summed over the tp sources' slots
// of `contributions` [gen][source][owned row][np] in rank order, rounded to BF16 and stored into
// every rank's reduced buffer [gen][reduced_rows][np] (`reduced`: tp bases).
// A reduced row goes out only when every contribution arrived and no fault stands: an owner
// never stores a row that misses a rank's contribution (its peers would consume it as right).
// `active`: whether this thread has a pack (pack < np); every thread of warp 0 calls it, with or
// without one. In the call's checking CTA, its first owned row, the call headers (warp 0, lane
// s < tp: source s's, at `hdr`; nullptr for the other threads and rows) are loaded before the
// contributions and re-loaded by their polls while stale (wait_slot), so that their round trip
// overlaps the contributions'; `before_publish` (warp 0, converged: owner_headers) checks them
// and stores this owner's header between the wait and the reduced pack's stores. Returns false
// where this thread's wait failed or a fault refused its store: an owner that loops over rows
// then stores no later one (PROTOCOL.md, I12b).
template <class BeforePublish>
__device__ __forceinline__ bool owner_reduce_pack(const void* contributions, void* const (&reduced)[kMaxTp], int tp,
                                                  int rank, int64_t owner_rows, int64_t reduced_rows, int64_t j,
                                                  int np, int pack, bool active, const Generation& g,
                                                  const LamportState* state, const ErrorSink& err,
                                                  const uint4* hdr, BeforePublish before_publish) {
  const uint32_t gen = g.current;
  const int64_t slot_packs = owner_rows * np;
  const int64_t row = j * tp + rank;
  const uint4* slot = static_cast<const uint4*>(contributions) +
                      (static_cast<int64_t>(gen) * tp * owner_rows + j) * np + pack;
  uint4 header = hdr != nullptr ? ld_volatile(hdr) : Bf16Lanes::sentinel();
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  bool arrived = true;
  if (active) {
    uint4 v[kMaxTp];
#pragma unroll
    for (int r = 0; r < kMaxTp; ++r) if (r < tp) v[r] = ld_volatile(slot + r * slot_packs);
    arrived = wait_slots<Bf16Lanes, kMaxTp>(
        tp, [&](int r) -> uint4& { return v[r]; }, [&](int r) { return slot + r * slot_packs; }, err,
        WaitSite{kProtoTwoShotOwner, -1, gen, row, state}, [](int r) { return r; },
        header_poll(hdr != nullptr, &header, [&] { return hdr; }));
#pragma unroll
    for (int r = 0; r < kMaxTp; ++r) {
      if (r >= tp) continue;
      float f[8];
      unpack_bf16(v[r], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], f[e]);
    }
  }
  before_publish(header);
  // Every contribution arrived (a failed wait recorded why and raised the fault), and no fault
  // stood when the kernel read the state (or, looping, when this row's fault word was read).
  if (!active) return true;
  if (!arrived || !may_publish(err, g.fault, WaitSite{kProtoTwoShotOwner, -1, gen, row, state})) return false;
  const uint4 y = publishable<Bf16Lanes>(pack_bf16(acc));
  const int64_t off = (static_cast<int64_t>(gen) * reduced_rows + row) * np + pack;
#pragma unroll
  for (int i = 0; i < kMaxTp; ++i) {
    if (i < tp) st_volatile(static_cast<uint4*>(reduced[i]) + off, y);
  }
  return true;
}

// Two-shot: each CTA (group) sums owned rows j (row j * tp + rank) over the tp sources in rank
// order and stores the BF16 rows into every rank's reduced buffer. kLoop false: the grid is
// ceil(M / tp) groups, one an owned row; ranks owning fewer rows leave the last
// group idle. kLoop true (launch_owner_reduce, where max_groups caps the grid below the owned
// rows): group g of the G takes rows g, g + G, ..., reading the state once for all of them (and
// the fault word row by row). Two
// instantiations, not one loop: as one kernel, the two-shot finalize at M = 8 measured 9% slower
// (one H200, 2026-12-04; its single row a group took the loop's code).
template <bool kLoop>
__global__ void __launch_bounds__(kMaxThreadsPerCta) owner_reduce_kernel(const OwnerReduceParams p) {
  const RowPack rp = row_pack(p.tiling, p.np);
  if (p.wait_predecessor) pdl_wait();
  // Before the consumer may start (and end the call); without griddepcontrol.wait: relaxed loads.
  __shared__ StateBox state_box;
  const Generation g = p.wait_predecessor                             ? read_generation(p.state, p.err)
                       : !kLoop && gridDim.x <= kWarpStateMaxCtas ? read_generation_warp(p.state, p.err)
                                                                   : read_generation_cta(p.state, p.err, state_box);
  pdl_launch_dependents();
  const int64_t row = rp.row * p.tp + p.rank;
  // Warp 0 of CTA 0 checks the call's headers (owner_headers) with its first owned row (j = 0,
  // row `rank`), or alone where this rank owns none (M <= rank).
  const bool checker = blockIdx.x == 0 && threadIdx.x < 32;
  const uint4* const hdr = checker ? owner_header_at(p.mailbox, p.tp, p.owner_rows, p.np, g.current) : nullptr;
  const uint4 want = identity_pack(p.id, g);
  if (row >= p.m) {  // the whole CTA: this rank owns no row of this group (for CTA 0: M <= rank)
    if (checker) {
      owner_headers<true>(hdr, hdr != nullptr ? ld_volatile(hdr) : Bf16Lanes::sentinel(), p.reduced, p.tp, p.rank,
                    p.reduced_rows, p.np, want, g, p.state, p.err);
    }
    return;
  }
  if (!checker && !rp.active) return;
  if constexpr (!kLoop) {
    owner_reduce_pack(p.mailbox, p.reduced, p.tp, p.rank, p.owner_rows, p.reduced_rows, rp.row, p.np, rp.pack,
                      rp.active, g, p.state, p.err, hdr, [&](uint4 header) {
                        if (checker) owner_headers<true>(hdr, header, p.reduced, p.tp, p.rank, p.reduced_rows, p.np, want, g, p.state, p.err);
                      });
  } else {
    // Each row after the CTA's first also reads the fault word (a GPU-scope load, in flight with
    // the row's contributions), as a CTA a row reads it with the state: a fault raised while
    // this CTA loops stops its later rows even where their contributions already arrived (a
    // wait that completes at its first load reads no fault word). A failed wait or a refused
    // store ends the loop (PROTOCOL.md, I12b).
    const int64_t owned = (p.m - p.rank + p.tp - 1) / p.tp;  // > rp.row: row < m above
    const int64_t groups = gridDim.x / p.tiling.ctas_per_row;
    Generation gj = g;
    for (int64_t j = rp.row; j < owned; j += groups) {
      const bool first = checker && j == 0;
      if (j != rp.row) gj.fault = g.fault | load_fault_gpu(p.err);
      if (!owner_reduce_pack(p.mailbox, p.reduced, p.tp, p.rank, p.owner_rows, p.reduced_rows, j, p.np, rp.pack,
                             rp.active, gj, p.state, p.err, first ? hdr : nullptr, [&](uint4 header) {
                               if (first) owner_headers<true>(hdr, header, p.reduced, p.tp, p.rank, p.reduced_rows, p.np, want, g, p.state, p.err);
                             })) {
        break;
      }
    }
  }
}

// y = bf16(y) for the reduced pack summed over `inputs` BF16 slots. A sum of one BF16 input
// (TP=1's x, finalize's x, a two-shot reduced row) from +0.0 is a BF16 value already: the
// rounding is skipped there (it is exact, and a NaN stays a NaN, which every output rounds
// to the same BF16 NaN), which saves 4 conversions a pack, the cost of the collapse's rounding
// (one H200, 2026-12-01, ae8bf87: with both, the direct call at M = 4096 was 3.5% slower).
template <ConsumerInput IN>
__device__ __forceinline__ void round_sum_to_bf16(float (&y)[8], int inputs) {
  if (IN == ConsumerInput::kPoll && inputs > 1) unpack_bf16(pack_bf16(y), y);
}

// The fused epilogue of one row's pack, once y (the reduced BF16 pack, as floats) is known:
// residual_out[t] = bf16(post[t] * y + sum_s comb[s][t] * residual[s]); c = sum_t pre[t] *
// residual_out[t]; p = bf16(c); layer_input = bf16(p * rsqrt(mean(p^2) + eps) * norm_weight);
// MXFP8 of it, or its per-token-group FP8 (kFp8).
// Called by every thread of the CTA (the RMS sum is a CTA and, over ctas CTAs, a cluster
// reduction); `mixes` (post, comb, pre of the row) and `warp_sums` in shared memory.
template <int HC, ConsumerVariant V>
__device__ __forceinline__ void epilogue_pack(const ConsumerParams& p, int64_t row, int pack, bool active,
                                              const float (&y)[8], const uint4 (&res)[HC], uint4 norm,
                                              const float* mixes, float* warp_sums, ClusterSum* cluster,
                                              int ctas) {
  const int64_t np = p.np;
  float c[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (active) {
    const float* post = mixes;
    const float* comb = mixes + HC;
    const float* pre = mixes + HC + HC * HC;
#pragma unroll
    for (int t = 0; t < HC; ++t) {
      const float post_t = post[t];
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(post_t, y[e]);
#pragma unroll
      for (int s = 0; s < HC; ++s) {
        const float w = comb[s * HC + t];
        float r[8];
        unpack_bf16(res[s], r);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = __fmaf_rn(w, r[e], o[e]);
      }
      const uint4 ob = pack_bf16(o);
      static_cast<uint4*>(p.residual_out)[(row * HC + t) * np + pack] = ob;
      if constexpr (V != ConsumerVariant::kResidualOnly) {
        const float pre_t = pre[t];
        unpack_bf16(ob, o);
#pragma unroll
        for (int e = 0; e < 8; ++e) c[e] = __fmaf_rn(pre_t, o[e], c[e]);
      }
    }
    // p = bf16(c): the collapse is rounded to BF16 once before the norm, as the reference module
    // and unfused engines do (SPEC.md, changed 2026-12-01). Below, c holds float(p).
    if constexpr (V != ConsumerVariant::kResidualOnly) unpack_bf16(pack_bf16(c), c);
  }

  if constexpr (V != ConsumerVariant::kResidualOnly) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss = __fmaf_rn(c[e], c[e], ss);
    float total = block_sum(ss, warp_sums);
    if (ctas > 1) {
      total = cluster_row_sum(total, *cluster, ctas);
    }
    const float h = static_cast<float>(np * 8);
    const float rinv = __frsqrt_rn(__fadd_rn(__fdiv_rn(total, h), p.eps));
    uint4 out = make_uint4(0, 0, 0, 0);
    if (active) {
      float w[8];
      unpack_bf16(norm, w);
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(__fmul_rn(c[e], rinv), w[e]);
      out = pack_bf16(o);
      static_cast<uint4*>(p.layer_input)[row * np + pack] = out;
    }
    if constexpr (V == ConsumerVariant::kMxfp8) {
      // amax of the 32-element block (4 packs on 4 consecutive lanes) over |bits|: NaN wins.
      const uint32_t w4[4] = {out.x, out.y, out.z, out.w};
      uint32_t amax = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) amax = max(amax, max(w4[i] & 0x7FFFu, (w4[i] >> 16) & 0x7FFFu));
      amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
      amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
      const uint8_t scale = ue8m0_scale(bf16_to_float(static_cast<uint16_t>(amax)));
      const int64_t blocks = np / 4;
      if (active) {
        float o[8];
        unpack_bf16(out, o);
        const uint32_t lo = mxfp8_encode2(o[0], o[1], scale) | (uint32_t(mxfp8_encode2(o[2], o[3], scale)) << 16);
        const uint32_t hi = mxfp8_encode2(o[4], o[5], scale) | (uint32_t(mxfp8_encode2(o[6], o[7], scale)) << 16);
        reinterpret_cast<uint2*>(p.mxfp8_values)[row * np + pack] = make_uint2(lo, hi);
        if ((pack & 3) == 0) {
          const int k = pack / 4;
          p.mxfp8_scales[mxfp8_scale_offset(row, k, blocks)] = scale;
          if (k == blocks - 1) {  // the row's padding blocks [S, 4 * ceil(S / 4)) are 0
            for (int64_t kp = blocks; kp % 4 != 0; ++kp) p.mxfp8_scales[mxfp8_scale_offset(row, kp, blocks)] = 0;
          }
        }
      }
    }
    if constexpr (V == ConsumerVariant::kFp8) {
      // amax of the 128-element group (16 packs on 16 consecutive lanes: packs_per_cta is a
      // multiple of kFp8GroupPacks, so a group is all active or all not) over |bits|: NaN wins.
      const uint32_t w4[4] = {out.x, out.y, out.z, out.w};
      uint32_t amax = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) amax = max(amax, max(w4[i] & 0x7FFFu, (w4[i] >> 16) & 0x7FFFu));
#pragma unroll
      for (int lane = 1; lane < kFp8GroupPacks; lane <<= 1) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lane));
      if (active) {
        const float s = fp8_group_scale(bf16_to_float(static_cast<uint16_t>(amax)), p.fp8_ue8m0);
        float o[8];
        unpack_bf16(out, o);
        const uint32_t lo = fp8_group_encode2(o[0], o[1], s) | (uint32_t(fp8_group_encode2(o[2], o[3], s)) << 16);
        const uint32_t hi = fp8_group_encode2(o[4], o[5], s) | (uint32_t(fp8_group_encode2(o[6], o[7], s)) << 16);
        reinterpret_cast<uint2*>(p.fp8_values)[row * np + pack] = make_uint2(lo, hi);
        if (pack % kFp8GroupPacks == 0) {
          const int64_t g = pack / kFp8GroupPacks, mp = p.fp8_scale_rows;
          p.fp8_scales[fp8_group_scale_offset(row, g, mp)] = s;
          // The column's padding rows M .. Mp-1 (at most 3): written by the last row's CTA, every
          // call, where they lie inside the tensor given (an MN-major view ends at the last
          // column's row M - 1). Three predicated stores, not a loop: a loop with the bound in it
          // cost the call 0.03-0.06 us at M = 1 and 2 (one H200, 2026-12-01, ef5bb80).
          if (row == p.m - 1) {
            const int64_t end = min(mp, p.fp8_scale_floats - g * mp);  // column g's rows inside it
#pragma unroll
            for (int i = 0; i < 3; ++i) {
              if (p.m + i < end) p.fp8_scales[fp8_group_scale_offset(p.m + i, g, mp)] = 0.0f;
            }
          }
        }
      }
    }
  }
}

// The error sink of a consumer's wait. A two-shot reduced row comes from an owner's reduce,
// which stalls only while the owner waits for a rank's contribution: the consumers' waits get
// twice the budget, so an owner's wait (this rank's own among them, whose owners wait for the
// same stalled rank) expires first and the record names the rank that stalled, not the owner
// that waited for it (the expiry stops every other wait of the communicator).
__device__ __forceinline__ ErrorSink consumer_sink(const ConsumerParams& p) {
  ErrorSink e = p.err;
  if (p.nslots == 1) e.timeout_ns *= 2;
  return e;
}

// The end of a polling consumer, the call's last kernel, in every CTA: the previous call's
// slots reset once this call's outputs are out (peers store into them again only two calls
// later: docs/PROTOCOL.md), for two-shot also this rank's owned contributions of the previous
// call; then the generation advance by the CTA that took the grid's last ticket (arrive_early).
// The previous call's headers (every writer's, in both mailboxes) are reset by CTA 0: while no
// fault is raised every one of them was waited for by the previous call on this rank (its
// checking CTAs wait for every writer's), so none can still land after the reset (after a fault
// one may; no later call then completes without an error: PROTOCOL.md, I19).
__device__ __forceinline__ void end_polling_call(const ConsumerParams& p, const Generation& g, uint32_t ticket) {
  const int64_t np = p.np;
  const int64_t slot_packs = p.slot_rows * np;
  void* const in = const_cast<void*>(p.in);
  if (blockIdx.x == 0) {
    reset_call_headers(in, p.in_headers, g.previous, p.tp);
    if (p.contributions != nullptr) reset_call_headers(p.contributions, p.contribution_headers, g.previous, p.tp);
  }
  reset_slots<Bf16Lanes>(static_cast<uint4*>(in) + g.previous * p.nslots * slot_packs,
                         p.nslots, slot_packs, static_cast<int64_t>(g.prev_rows) * np);
  if (p.contributions != nullptr) {
    const int64_t owned_prev = g.prev_rows > static_cast<uint32_t>(p.rank)
                                   ? (g.prev_rows - p.rank + p.tp - 1) / p.tp : 0;
    const int64_t contrib_packs = p.owner_rows * np;
    reset_slots<Bf16Lanes>(static_cast<uint4*>(p.contributions) + g.previous * p.tp * contrib_packs,
                           p.tp, contrib_packs, owned_prev * np);
  }
  advance_if_last(p.state, ticket, static_cast<uint32_t>(p.m));
}

template <int HC, ConsumerInput IN, ConsumerVariant V>
__global__ void __launch_bounds__(max_threads_per_cta(HC)) mhc_consumer_kernel(const ConsumerParams p) {
  __shared__ float warp_sums[kMaxThreadsPerCta / 32];
  __shared__ ClusterSum cluster_sum;
  const RowPack rp = row_pack(p.tiling, p.np);
  const int64_t np = p.np, row = rp.row;
  const int pack = rp.pack;
  if (V != ConsumerVariant::kResidualOnly && p.tiling.ctas_per_row > 1) cluster_sum_prologue(cluster_sum);
  if (p.wait_predecessor) pdl_wait();  // below: the predecessors' outputs, the protocol state

  // Loads that depend on no protocol state go out first: this row's mixes (every thread of the
  // row needs all of them) straight into shared memory with cp.async (a shared-memory store of a
  // loaded value would wait for the load, and hold back the warp's later loads and its publish
  // by a round trip), then the residual streams (the norm weight comes after the publish).
  constexpr int kMixes = 2 * HC + HC * HC;  // post [HC], comb [HC][HC], pre [HC]
  __shared__ float mixes[kMixes];
  // TP=1 finalize: the shared expert's pack too (added after the routed sum; in a register
  // across the route and GEMM2 loads it spilled at hc = 4).
  __shared__ uint4 shared_expert[IN == ConsumerInput::kFinalize ? kMaxThreadsPerCta : 1];
  // kPoll (hc <= 4): the residual streams too, [HC][blockDim.x]. In registers across the publish
  // and the wait (every source's packs in flight at once) they spilled, and a spill of a loaded
  // value waits for the load: the kernel's first round trip came before its publish (48 bytes
  // spilled at hc = 4 from a023957 on; ptxas -v).
  constexpr bool kResidualStaged = IN == ConsumerInput::kPoll && HC <= 4;
  __shared__ uint4 residual_staged[kResidualStaged ? HC * kMaxThreadsPerCta : 1];
  cp_async_mixes<HC, V>(mixes, p, row);
  if constexpr (IN == ConsumerInput::kFinalize) {
    if (rp.active) cp_async16(&shared_expert[threadIdx.x], static_cast<const uint4*>(p.fin.shared) + row * np + pack);
  }
  if constexpr (kResidualStaged) {
    if (rp.active) {
#pragma unroll
      for (int s = 0; s < HC; ++s) {
        cp_async16(&residual_staged[s * blockDim.x + threadIdx.x],
                   static_cast<const uint4*>(p.residual) + (row * HC + s) * np + pack);
      }
    }
  }
  cp_async_commit();
  uint4 res[HC];
  if (!kResidualStaged && rp.active) {
#pragma unroll
    for (int s = 0; s < HC; ++s) {
      res[s] = ld_input(static_cast<const uint4*>(p.residual) + (row * HC + s) * np + pack);
    }
  }
  // Single-launch one-shot: this rank's row goes out first. x is loaded before the state, the
  // state before the finalize reduction (whose route and GEMM2 loads depend on one another, and
  // whose arithmetic would hold a later state load back): the state's round trip overlaps the
  // first of the row's.
  uint4 mine = make_uint4(0, 0, 0, 0);
  Generation g{0, 0, 0, 0, 0};
  if constexpr (IN == ConsumerInput::kPoll) {
    const bool publish = p.publish_first && rp.active;
    if (publish && p.x != nullptr) mine = ld_input(static_cast<const uint4*>(p.x) + row * np + pack);
    __shared__ StateBox state_box;
    g = p.wait_predecessor ? read_generation(p.state, p.err) : read_generation_cta(p.state, p.err, state_box);
    if (publish && p.x == nullptr) mine = finalize_pack(p.fin, row, pack, p.np, p.err, pack == 0);
    const WaitSite site{p.protocol, -1, g.current, row, p.state};
    // The call's header before its first pack (thread 0 of CTA 0: row 0, part 0).
    if (p.publish_first && blockIdx.x == 0 && threadIdx.x == 0 && may_publish(p.err, g.fault, site)) {
      store_to_ranks(p.targets, p.tp, call_header_at(p.target_headers, g.current, p.rank), identity_pack(p.id, g));
    }
    if (publish && may_publish(p.err, g.fault, site)) {
      store_to_ranks(p.targets, p.tp, mailbox_offset(g.current, p.tp, p.rank, p.slot_rows, row, p.np, pack),
                     publishable<Bf16Lanes>(mine));
    }
  }
  pdl_launch_dependents();  // after the state read: dependents start the next call
  uint32_t ticket = 0;
  if constexpr (IN == ConsumerInput::kPoll) ticket = arrive_early(p.state);
  uint4 direct = make_uint4(0, 0, 0, 0);
  if constexpr (IN == ConsumerInput::kDirect) {
    if (rp.active) direct = ld_input(static_cast<const uint4*>(p.in) + row * np + pack);
  }
  // The norm weight, needed only after the RMS sum: loaded after the publish (its round trip
  // overlaps the poll or the input's), so that it holds no register across the publish (the
  // finalize reduction's loads there would otherwise spill it, and a spill of a loaded value
  // waits for the load).
  uint4 norm = make_uint4(0, 0, 0, 0);
  if constexpr (V != ConsumerVariant::kResidualOnly) {
    if (rp.active) norm = ld_input(static_cast<const uint4*>(p.norm_weight) + pack);
  }
  // The MXFP8 scales' padding rows depend on no data: their stores go out while the loads above
  // (and, polling, the peers' rows) are in flight instead of after the epilogue.
  if constexpr (V == ConsumerVariant::kMxfp8) zero_scale_padding_rows(p.mxfp8_scales, p.m, np / 4);

  // The call's headers (PROTOCOL.md, I19), checked by CTA 0 (row 0, part 0): its thread s < tp
  // checks writer s's (one-shot: source s; two-shot: owner s), its load in flight with the row's
  // packs below, and re-loaded by their polls while it is stale (wait_slot).
  const bool checks_header = IN == ConsumerInput::kPoll && blockIdx.x == 0 && static_cast<int>(threadIdx.x) < p.tp;
  auto header_at = [&] {
    return static_cast<const uint4*>(p.in) + call_header_at(p.in_headers, g.current, static_cast<int>(threadIdx.x));
  };
  uint4 header = make_uint4(0, 0, 0, 0);
  if (checks_header) header = ld_volatile(header_at());

  // y: this row's reduced pack, FP32 sum from +0.0 in rank order, rounded to BF16.
  float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (rp.active) {
    if constexpr (IN == ConsumerInput::kPoll) {
      const int64_t slot_packs = p.slot_rows * np;
      const uint4* slot = static_cast<const uint4*>(p.in) +
                          (static_cast<int64_t>(g.current) * p.nslots * p.slot_rows + row) * np + pack;
      uint4 v[kMaxTp];
#pragma unroll
      for (int r = 0; r < kMaxTp; ++r) if (r < p.nslots) v[r] = ld_volatile(slot + r * slot_packs);
      wait_slots<Bf16Lanes, kMaxTp>(
          p.nslots, [&](int r) -> uint4& { return v[r]; }, [&](int r) { return slot + r * slot_packs; },
          consumer_sink(p), WaitSite{p.protocol, -1, g.current, row, p.state},
          [&](int r) { return p.nslots > 1 ? r : static_cast<int>(row % p.tp); },
          header_poll(checks_header, &header, header_at));
#pragma unroll
      for (int r = 0; r < kMaxTp; ++r) {
        if (r >= p.nslots) continue;
        float f[8];
        unpack_bf16(v[r], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = __fadd_rn(y[e], f[e]);
      }
    } else {
      uint4 x = direct;
      if constexpr (IN == ConsumerInput::kFinalize) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        finalize_routed(p.fin, row, pack, p.np, p.err, pack == 0, acc, [] {});
        cp_async_wait_all();  // this thread's shared-expert pack (and the mixes)
        x = add_shared_expert(acc, shared_expert[threadIdx.x]);
      }
      float f[8];
      unpack_bf16(x, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = __fadd_rn(0.0f, f[e]);  // -0.0 -> +0.0, as the protocols
    }
    round_sum_to_bf16<IN>(y, p.nslots);
  }
  // Inline only the compare (check_header_cold_at). Not in the streaming consumer (consume_rows),
  // whose check is once a call of hundreds of rows: there it moved the kernels' spills (ptxas -v).
  if (checks_header) {
    const uint4 want = identity_pack(p.id, g);
    if (!same_pack(header, want)) {
      check_header_cold_at<Bf16Lanes>(static_cast<const uint4*>(p.in), g.current, p.nslots, p.slot_rows, p.np,
                                       static_cast<int>(threadIdx.x), header, want, consumer_sink(p),
                                       WaitSite{p.protocol, static_cast<int>(threadIdx.x), g.current, row, p.state});
    }
  }

  // residual_out[t] = bf16(post[t] * y + sum_s comb[s][t] * residual[s]); c = sum_t pre[t] * it.
  cp_async_wait_all();
  __syncthreads();  // the mixes are in shared memory
  if constexpr (kResidualStaged) {
    if (rp.active) {
#pragma unroll
      for (int s = 0; s < HC; ++s) res[s] = residual_staged[s * blockDim.x + threadIdx.x];
    }
  }
  epilogue_pack<HC, V>(p, row, pack, rp.active, y, res, norm, mixes, warp_sums, &cluster_sum,
                       p.tiling.ctas_per_row);

  if constexpr (IN == ConsumerInput::kPoll) end_polling_call(p, g, ticket);
}

// --- Streaming consumer ------------------------------------------------------------------------
// Publishing CTA `index` of `count` of a streaming Lamport call: this rank's rows index + k *
// count, one-shot into every rank's slot [gen][rank][row], two-shot (contributions given) into
// slot [gen][rank][row / tp] of the owner (rank row % tp). Several rows in flight a thread for
// x; the finalize reduction has its own 8 loads in flight.
template <bool kFin>
// Each row's stores go out only while no fault stands (the protocol's state as this call read
// it, and this rank's fault word, loaded with the row's inputs): once any rank of the group gave
// up a wait, the rest of the call publishes nothing.
__device__ __forceinline__ void publish_rows(const ConsumerParams& p, const Generation& gs, int64_t index,
                                             int64_t count) {
  const uint32_t gen = gs.current;
  const int64_t np = p.np;
  const int pack = static_cast<int>(threadIdx.x);
  const bool active = pack < np;  // each branch lets threads without a pack leave
  const bool two_shot = p.contributions != nullptr;
  const uint32_t proto = two_shot ? kProtoTwoShotOwner : kProtoOneShot;
  auto allowed = [&](uint32_t fault, int64_t row) {
    return may_publish(p.err, fault | gs.fault, WaitSite{proto, -1, gen, row, p.state});
  };
  // The call's header goes out before row 0's first pack (thread 0 of publisher 0).
  auto store = [&](int64_t row, uint4 v) {
    v = publishable<Bf16Lanes>(v);
    if (pack == 0 && row == 0) {
      publish_call_header(p.targets, p.tp, p.rank, two_shot ? p.owner_rows : p.slot_rows, p.np, gen,
                          identity_pack(p.id, gs));
    }
    if (!two_shot) {
      store_to_ranks(p.targets, p.tp, mailbox_offset(gen, p.tp, p.rank, p.slot_rows, row, p.np, pack), v);
    } else {
      st_volatile(static_cast<uint4*>(owner_target(p.targets, static_cast<int>(row % p.tp))) +
                      mailbox_offset(gen, p.tp, p.rank, p.owner_rows, row / p.tp, p.np, pack), v);
    }
  };
  if constexpr (!kFin) {
    if (!active) return;
    constexpr int kRows = 4;
    const uint4* x = static_cast<const uint4*>(p.x);
    for (int64_t r0 = index; r0 < p.m; r0 += kRows * count) {
      const uint32_t fault = load_fault_gpu(p.err);
      uint4 v[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int64_t row = r0 + u * count;
        if (row < p.m) v[u] = ld_input(x + row * np + pack);
      }
      if (!allowed(fault, r0)) return;
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int64_t row = r0 + u * count;
        if (row < p.m) store(row, v[u]);
      }
    }
  } else {  // kFin
    // The first route group a row (DSV4.1: top_k = 6, all of them): the next row's routes load
    // while this row's GEMM2 rows do, so a row costs one dependent round trip, not two
    // (finalize_pack's bits). Only the route indices go one row ahead (8 registers); the weights
    // load with the rows; routes beyond the group one at a time (finalize_tail). The shared
    // expert's pack (added last) waits in this CTA's dynamic shared memory, which a publishing
    // CTA does not otherwise use (cp.async: no register holds it across the routed sum; held in
    // one, with the top_k > 8 path beside it, the kernel spilled 228-324 bytes at hc = 4, ptxas -v).
    // No CTA barrier: the warps drift and overlap one another's loads (a shared-memory prefetch
    // with two barriers a row measured 267 us at M = 4096 against 224 here, TP=1 self-test);
    // each thread reads back only the pack it copied.
    if (!active) return;
    extern __shared__ uint4 stage_packs[];
    uint4* const shared_staged = stage_packs + pack;
    const FinalizeInputs& f = p.fin;
    auto load_routes = [&](int64_t row, int32_t (&route)[kFinalizeGroup]) {
#pragma unroll
      for (int j = 0; j < kFinalizeGroup; ++j) route[j] = route_k(f, row, j);
    };
    RouteGroup rg;
    if (index < p.m) load_routes(index, rg.route);
    for (int64_t row = index; row < p.m; row += count) {
#pragma unroll
      for (int j = 0; j < kFinalizeGroup; ++j) rg.w[j] = weight_k(f, row, j);
      const auto route_at = [&](int j) { return rg.route[j]; };
      uint4 g[kFinalizeGroup];
      load_group_rows(f, pack, static_cast<int>(np), route_at, g);
      cp_async16(shared_staged, static_cast<const uint4*>(f.shared) + row * np + pack);
      cp_async_commit();
      const uint32_t fault = load_fault_gpu(p.err);
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      int32_t next[kFinalizeGroup];
      const bool more = row + count < p.m;
      if (more) load_routes(row + count, next);
      fma_group_rows(f, row, 0, route_at, [&](int j) { return rg.w[j]; }, [&](int j) { return g[j]; }, acc, p.err,
                     pack == 0);
      finalize_tail(f, row, pack, static_cast<int>(np), acc, p.err, pack == 0);  // top_k > kFinalizeGroup only
      cp_async_wait_all();
      const uint4 shared = *shared_staged;
      if (!allowed(fault, row)) return;
      store(row, add_shared_expert(acc, shared));
      if (more) {
#pragma unroll
        for (int j = 0; j < kFinalizeGroup; ++j) rg.route[j] = next[j];
      }
    }
  }
}

// Owner CTA `index` of `count` of a streaming two-shot call: this rank's owned rows j = index +
// k * count (row j * tp + rank) into every rank's reduced buffer (slot_rows rows a generation).
__device__ __forceinline__ void reduce_owned_rows(const ConsumerParams& p, const Generation& g, int64_t index,
                                                  int64_t count) {
  const int pack = static_cast<int>(threadIdx.x);
  // Warp 0 of owner 0 checks the call's headers (owner_headers) with its first owned row, row
  // `rank`, or alone where this rank owns none.
  const bool checker = index == 0 && pack < 32, active = pack < p.np;
  if (!checker && !active) return;
  const int64_t owned = p.m > p.rank ? (p.m - p.rank + p.tp - 1) / p.tp : 0;
  const uint4* const hdr = checker ? owner_header_at(p.contributions, p.tp, p.owner_rows, p.np, g.current) : nullptr;
  const uint4 want = identity_pack(p.id, g);
  if (checker && owned == 0) {
    owner_headers(hdr, hdr != nullptr ? ld_volatile(hdr) : Bf16Lanes::sentinel(), p.reduced, p.tp, p.rank, p.slot_rows,
                  p.np, want, g, p.state, p.err);
    return;
  }
  // Unlike owner_reduce_kernel<true>, these owners do not read the fault word row by row nor
  // stop at a failed wait (PROTOCOL.md, I12b: an open limit of this opt-in shape). Made here as
  // in owner_reduce_kernel<true>, that change put 8-24 more bytes of spill into the one-shot
  // finalize's streaming kernel, which shares this code's registers; not measured, not made.
  for (int64_t j = index; j < owned; j += count) {
    const bool first = checker && j == 0;
    owner_reduce_pack(p.contributions, p.reduced, p.tp, p.rank, p.owner_rows, p.slot_rows, j, p.np, pack, active, g,
                      p.state, p.err, first ? hdr : nullptr, [&](uint4 header) {
                        if (first) owner_headers(hdr, header, p.reduced, p.tp, p.rank, p.slot_rows, p.np, want, g, p.state, p.err);
                      });
  }
}

// The consuming part of the streaming consumer: rows first, first + step, ... of one CTA each,
// the next row's inputs, residual streams and mixes copied into shared memory (cp.async) while
// the current one is computed. IN = kDirect: the input is x or the reduced rows; kPoll: the
// nslots mailbox slots of generation `gen` (a pack still holding a sentinel lane once its copy
// landed goes to the bounded wait); kFinalize (TP=1): the input is the shared expert's row, and
// the row's first kFinalizeGroup routes and weights come with it; the row's GEMM2 packs of those
// routes are then copied into shared memory too (one buffer, no registers held), while the next
// row's copies are in flight: one dependent round trip a row.
template <int HC, ConsumerInput IN, ConsumerVariant V>
__device__ __forceinline__ void consume_rows(const ConsumerParams& p, const Generation& g, int64_t first,
                                             int64_t step) {
  const uint32_t gen = g.current;
  constexpr int kMixes = 2 * HC + HC * HC;  // post [HC], comb [HC][HC], pre [HC]
  // [2][HC + inputs][blockDim.x]: residual streams, then inputs; kFinalize then
  // [min(top_k, kFinalizeGroup)][blockDim.x]: the current row's GEMM2 packs (streaming_smem).
  extern __shared__ uint4 stage_packs[];
  __shared__ float warp_sums[2][kMaxThreadsPerCta / 32];
  __shared__ float mixes[2][kMixes];
  __shared__ int32_t routes[2][kFinalizeGroup];  // kFinalize: the row's first route group
  __shared__ float weights[2][kFinalizeGroup];
  __shared__ uint4 headers[kMaxTp];  // kPoll, consumer 0: the call's header of each writer (thread s copies writer s's)
  const int64_t np = p.np;
  const int pack = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const bool active = pack < np;
  const int inputs = IN == ConsumerInput::kPoll ? p.nslots : 1;
  const int routes_staged = IN == ConsumerInput::kFinalize ? min(p.fin.top_k, kFinalizeGroup) : 0;
  const int stage_stride = (HC + inputs) * threads;
  uint4* const gemm2_packs = stage_packs + 2 * stage_stride;  // kFinalize
  const uint4* residual = static_cast<const uint4*>(p.residual);
  const uint4* in = static_cast<const uint4*>(p.in);
  const int64_t slot_packs = p.slot_rows * np;
  const uint4* slots = in + static_cast<int64_t>(gen) * p.nslots * slot_packs;  // kPoll
  // kPoll: consumer 0 checks the call's headers (PROTOCOL.md, I19) with its first row, row 0:
  // thread s < tp writer s's (one-shot: source s; two-shot: owner s), copied with the row.
  const bool checks_header = IN == ConsumerInput::kPoll && first == 0 && pack < p.tp;
  auto header_at = [&] { return in + call_header_offset(gen, p.nslots, p.slot_rows, p.np, pack); };
  uint4 norm = make_uint4(0, 0, 0, 0);
  if (V != ConsumerVariant::kResidualOnly && active) norm = ld_input(static_cast<const uint4*>(p.norm_weight) + pack);

  // Copies row `row` into `stage` and commits them as one group (each thread copies the packs
  // it will read itself; the mixes are spread over the CTA).
  auto prefetch = [&](int64_t row, int stage) {
    uint4* st = stage_packs + stage * stage_stride;
    if (active) {
#pragma unroll
      for (int s = 0; s < HC; ++s) cp_async16(st + s * threads + pack, residual + (row * HC + s) * np + pack);
      if constexpr (IN == ConsumerInput::kPoll) {
        for (int r = 0; r < inputs; ++r) cp_async16(st + (HC + r) * threads + pack, slots + r * slot_packs + row * np + pack);
      } else if constexpr (IN == ConsumerInput::kFinalize) {
        cp_async16(st + HC * threads + pack, static_cast<const uint4*>(p.fin.shared) + row * np + pack);
      } else {
        cp_async16(st + HC * threads + pack, in + row * np + pack);
      }
    }
    if (checks_header && row == 0) cp_async16(&headers[pack], header_at());
    cp_async_mixes<HC, V>(mixes[stage], p, row);
    if constexpr (IN == ConsumerInput::kFinalize) {  // the last threads (the mixes' are the first)
      const int j = threads - 1 - pack;
      if (j < routes_staged) cp_async4(&routes[stage][j], p.fin.routes + row * p.fin.top_k + j);
      else if (j - kFinalizeGroup >= 0 && j - kFinalizeGroup < routes_staged) {
        cp_async4(&weights[stage][j - kFinalizeGroup], p.fin.weights + row * p.fin.top_k + (j - kFinalizeGroup));
      }
    }
    cp_async_commit();
  };

  // Which rows a CTA computes. kPoll, kFinalize: rows first, first + step, ... (kPoll's roles go
  // by ticket; kFinalize taking rows as kDirect does measured 2.3% slower at M = 4096, 0.4% at
  // 1024, one H200, 2026-12-04: its GEMM2 gathers, not its SMs' shares, set its pace).
  // kDirect: the first kDealt so, then rows taken from the op's row tickets
  // (p.row_tickets: rows from kDealt * step on, to the CTA that asks first), so that a CTA whose
  // share of HBM ran faster takes more rows: dealt to the end, at M = 4096 the SMs' active cycles
  // ranged from 160K to 206K of the kernel's 208K (ncu, one H200, 2026-12-04). Thread 0 asks two
  // rows ahead, so that no barrier waits for its atomic: at row k's top it redeems the ticket it
  // asked for at row k - 1 (row k + 2, left in taken[] for every thread at row k + 1's top and
  // end, past row k's barriers) and asks for the next. Each CTA asks until it draws a row at or beyond M:
  // the call's tickets number (M - kDealt * step, at least 0) + step, and the CTA that redeems
  // the last one zeroes them for the op's next call (which reads them only after this grid
  // completed: griddepcontrol.wait, or stream order).
  constexpr bool kTaken = IN == ConsumerInput::kDirect;
  constexpr int kDealt = 3;
  constexpr uint32_t kNoTicket = 0xffffffffu;
  __shared__ int64_t taken[4];  // row j at j % 4: read at row j - 1's top and end, rewritten at row j + 2's top
  uint32_t ticket = kNoTicket;  // thread 0: the ticket asked for, not yet redeemed
  auto ask = [&] { ticket = atomicAdd(p.row_tickets, 1u); };
  auto redeem = [&]() -> int64_t {
    const int64_t from = kDealt * step;
    const uint32_t tickets = static_cast<uint32_t>((p.m > from ? p.m - from : 0) + step);
    if (ticket == tickets - 1) atomicExch(p.row_tickets, 0u);  // the call's last ticket
    const int64_t r = from + ticket;
    ticket = kNoTicket;
    return r;
  };
  if (kTaken && threadIdx.x == 0) ask();
  // The row after this CTA's k-th.
  auto row_after = [&](int k, int64_t row) -> int64_t {
    if constexpr (kTaken) return k + 1 < kDealt ? first + (k + 1) * step : taken[(k + 1) & 3];
    return row + step;
  };

  int stage = 0;
  int64_t row = first;
  if (row < p.m) prefetch(row, 0);
  for (int k = 0; row < p.m; row = row_after(k, row), stage ^= 1, ++k) {
    // The next row goes into the other stage, whose last readers finished: every thread passed
    // the previous row's barrier (the RMS sum's, or the one at the end for residual_only) after
    // its last read of that stage's mixes, and reads only the packs it copied itself.
    const int64_t next = row_after(k, row);
    if (kTaken && threadIdx.x == 0 && ticket != kNoTicket && k + 2 >= kDealt) {  // row k + 2
      const int64_t r = redeem();
      taken[(k + 2) & 3] = r;  // its last readers (row k - 3's top and end) passed row k - 1's barrier
      if (r < p.m) ask();
    }
    if constexpr (IN == ConsumerInput::kFinalize) {
      // This row's stage first (its routes give the GEMM2 rows), then the GEMM2 packs, then the
      // next row's stage; waiting for all but the newest group waits for the GEMM2 packs.
      cp_async_wait_all();
      __syncthreads();  // the routes, weights and mixes other threads copied are visible
      if (active) {
        for (int j = 0; j < routes_staged; ++j) {
          const int32_t route = routes[stage][j];
          if (route >= 0 && route < p.fin.gemm2_rows) {
            cp_async16(gemm2_packs + j * threads + pack,
                       static_cast<const uint4*>(p.fin.gemm2) + static_cast<int64_t>(route) * np + pack);
          }
        }
      }
      cp_async_commit();
      if (next < p.m) prefetch(next, stage ^ 1);
      else cp_async_commit();
      cp_async_wait_all_but_newest();  // each thread reads only the GEMM2 packs it copied
    } else {
      if (next < p.m) prefetch(next, stage ^ 1);
      else cp_async_commit();  // an empty group: "all but the newest" stays this row's
      cp_async_wait_all_but_newest();
      __syncthreads();  // the mixes other threads copied are visible
    }
    const uint4* st = stage_packs + stage * stage_stride;
    uint4 res[HC];
    // y: the row's reduced pack, FP32 sum from +0.0 in slot (rank) order, rounded to BF16.
    float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (active) {
      if constexpr (IN != ConsumerInput::kFinalize) {
#pragma unroll
        for (int s = 0; s < HC; ++s) res[s] = st[s * threads + pack];
      }
      if constexpr (IN == ConsumerInput::kPoll) {
        // Every source's pack of the row at once (the staged copies, re-loaded in place).
        uint4* const staged = stage_packs + stage * stage_stride + HC * threads + pack;
        wait_slots<Bf16Lanes, kMaxTp>(
            inputs, [&](int r) -> uint4& { return staged[r * threads]; },
            [&](int r) { return slots + r * slot_packs + row * np + pack; }, consumer_sink(p),
            WaitSite{p.protocol, -1, gen, row, p.state},
            [&](int r) { return p.nslots > 1 ? r : static_cast<int>(row % p.tp); },
            header_poll(checks_header && row == 0, &headers[checks_header ? pack : 0], header_at));
      }
      for (int r = 0; r < inputs; ++r) {
        uint4 v = st[(HC + r) * threads + pack];
        if constexpr (IN == ConsumerInput::kFinalize) {
          // x = bf16(sum_k w[k] * gemm2[route[k]] + shared): finalize_pack's order and bits (v
          // holds the shared expert's pack). The residual streams are read from shared memory
          // only after it (registers).
          float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          fma_group_rows(
              p.fin, row, 0, [&](int j) { return j < routes_staged ? routes[stage][j] : -1; },
              [&](int j) { return weights[stage][j]; }, [&](int j) { return gemm2_packs[j * threads + pack]; }, acc,
              p.err, pack == 0);
          finalize_tail(p.fin, row, pack, p.np, acc, p.err, pack == 0);  // top_k > kFinalizeGroup only
          v = add_shared_expert(acc, v);
        }
        float f[8];
        unpack_bf16(v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = __fadd_rn(y[e], f[e]);  // -0.0 -> +0.0, as the protocols
      }
      round_sum_to_bf16<IN>(y, inputs);
      if constexpr (IN == ConsumerInput::kFinalize) {
#pragma unroll
        for (int s = 0; s < HC; ++s) res[s] = st[s * threads + pack];
      }
    }
    if (checks_header && row == 0) {  // the call's headers (PROTOCOL.md, I19)
      check_header<Bf16Lanes>(header_at(), headers[pack], identity_pack(p.id, g), consumer_sink(p),
                              WaitSite{p.protocol, pack, gen, row, p.state});
    }
    epilogue_pack<HC, V>(p, row, pack, active, y, res, norm, mixes[stage], warp_sums[stage], nullptr, 1);
    if constexpr (V == ConsumerVariant::kResidualOnly) __syncthreads();
  }
  if (kTaken && threadIdx.x == 0 && ticket != kNoTicket) redeem();  // the call's last ticket may be this one
}

// The consumer at large M, rows of one CTA: a grid of the CTAs resident at once, each looping
// over rows and copying the next row's inputs, residual streams and mixes into shared memory
// with cp.async while it computes the current one (consume_rows). A CTA per row (one resident
// per SM at 640 threads and 96 registers) alternates between loading and computing; here an SM
// loads the next row during the current row's arithmetic, reductions and stores. Same
// arithmetic as mhc_consumer_kernel, same bits.
//
// IN = kDirect (TP=1 call, the NCCL fallback's reduced rows) and kFinalize (TP=1 finalize): every
// CTA consumes, rows r, r + gridDim.x, ...
// IN = kPoll (one-shot above the single launch; two-shot where streaming_min_rows asks): one
// launch for the whole call (the two-shot's automatic shape from kPollStreamingMinRows rows
// keeps its publish and owners' kernels before it, and every CTA consumes). Each
// CTA takes a ticket on arrival (the generation advance's, arrive_early); the first
// publisher_ctas tickets publish this rank's rows in row order (one-shot: into every rank's
// mailbox; two-shot: into the owners'), the next reducer_ctas (two-shot) reduce this rank's
// owned rows into every rank's reduced buffer, the others consume. The NVLink stores of later
// rows overlap the epilogue of earlier ones (separate kernels run them one after the other: a
// dependent kernel starts only once every CTA of the one before has). Deadlock-free whatever
// part of the grid is resident and in whatever order CTAs start: roles go by arrival, so every
// publisher and owner is a running CTA before any consumer exists; publishers wait for nothing,
// owners for publishers (of every rank), consumers for publishers and owners.
// Shared memory: 2 stages x (HC + inputs) x blockDim.x packs (dynamic), mixes and warp sums x 2.
// kFin (kPoll): the publishing CTAs reduce this rank's finalize inputs instead of loading x (a
// separate kernel, so the call's kernel carries none of the finalize code and its registers).
template <int HC, ConsumerInput IN, ConsumerVariant V, bool kFin = false>
__global__ void __launch_bounds__(max_threads_per_cta(HC)) mhc_consumer_streaming_kernel(const ConsumerParams p) {
  if (p.wait_predecessor) pdl_wait();
  if constexpr (IN == ConsumerInput::kPoll) {
    __shared__ uint32_t role_ticket;
    __shared__ StateBox state_box;
    const Generation g =
        p.wait_predecessor ? read_generation(p.state, p.err) : read_generation_cta(p.state, p.err, state_box);
    pdl_launch_dependents();  // after the state read: dependents start the next call
    const uint32_t t = arrive_early(p.state);
    if (threadIdx.x == 0) role_ticket = t;
    __syncthreads();
    const uint32_t ticket = role_ticket;
    const int64_t publishers = p.publisher_ctas, roles = publishers + p.reducer_ctas;
    if (ticket < publishers) {
      publish_rows<kFin>(p, g, ticket, publishers);
    } else if (ticket < roles) {
      reduce_owned_rows(p, g, ticket - publishers, roles - publishers);
    } else {
      consume_rows<HC, IN, V>(p, g, ticket - roles, static_cast<int64_t>(gridDim.x) - roles);
    }
    if constexpr (V == ConsumerVariant::kMxfp8) zero_scale_padding_rows(p.mxfp8_scales, p.m, p.np / 4);
    end_polling_call(p, g, ticket);
  } else {
    pdl_launch_dependents();
    consume_rows<HC, IN, V>(p, Generation{0, 0, 0, 0, 0}, blockIdx.x, gridDim.x);
    if constexpr (V == ConsumerVariant::kMxfp8) zero_scale_padding_rows(p.mxfp8_scales, p.m, p.np / 4);
  }
}

// --- Dispatch -------------------------------------------------------------------------------
using ConsumerFn = void (*)(ConsumerParams);

template <int HC, ConsumerInput IN>
ConsumerFn consumer_for(ConsumerVariant v) {
  switch (v) {
    case ConsumerVariant::kPlain: return mhc_consumer_kernel<HC, IN, ConsumerVariant::kPlain>;
    case ConsumerVariant::kMxfp8: return mhc_consumer_kernel<HC, IN, ConsumerVariant::kMxfp8>;
    case ConsumerVariant::kResidualOnly:
      return mhc_consumer_kernel<HC, IN, ConsumerVariant::kResidualOnly>;
    case ConsumerVariant::kFp8: return mhc_consumer_kernel<HC, IN, ConsumerVariant::kFp8>;
  }
  return nullptr;
}

template <int HC>
ConsumerFn consumer_for(ConsumerInput in, ConsumerVariant v) {
  switch (in) {
    case ConsumerInput::kPoll: return consumer_for<HC, ConsumerInput::kPoll>(v);
    case ConsumerInput::kDirect: return consumer_for<HC, ConsumerInput::kDirect>(v);
    case ConsumerInput::kFinalize: return consumer_for<HC, ConsumerInput::kFinalize>(v);
  }
  return nullptr;
}

ConsumerFn consumer_for(int hc, ConsumerInput in, ConsumerVariant v) {
  switch (hc) {
    case 1: return consumer_for<1>(in, v);
    case 2: return consumer_for<2>(in, v);
    case 4: return consumer_for<4>(in, v);
    case 8: return consumer_for<8>(in, v);
  }
  return nullptr;
}

template <ConsumerInput IN, bool kFin>
ConsumerFn streaming_consumer_for(int hc, ConsumerVariant v) {
  auto pick = [v](auto plain, auto mxfp8, auto residual_only, auto fp8) -> ConsumerFn {
    return v == ConsumerVariant::kPlain ? plain : v == ConsumerVariant::kMxfp8 ? mxfp8
           : v == ConsumerVariant::kFp8 ? fp8 : residual_only;
  };
  switch (hc) {
#define MHCCL_STREAMING(H)                                                                \
  case H:                                                                                  \
    return pick(mhc_consumer_streaming_kernel<H, IN, ConsumerVariant::kPlain, kFin>,       \
                mhc_consumer_streaming_kernel<H, IN, ConsumerVariant::kMxfp8, kFin>,       \
                mhc_consumer_streaming_kernel<H, IN, ConsumerVariant::kResidualOnly, kFin>, \
                mhc_consumer_streaming_kernel<H, IN, ConsumerVariant::kFp8, kFin>);
    MHCCL_STREAMING(1)
    MHCCL_STREAMING(2)
    MHCCL_STREAMING(4)
    MHCCL_STREAMING(8)
#undef MHCCL_STREAMING
  }
  return nullptr;
}
// finalize: a polling call whose publishing CTAs reduce the finalize inputs (kPoll only; TP=1's
// finalize is its own input, kFinalize).
ConsumerFn streaming_consumer_for(int hc, ConsumerInput in, ConsumerVariant v, bool finalize) {
  switch (in) {
    case ConsumerInput::kDirect: return streaming_consumer_for<ConsumerInput::kDirect, false>(hc, v);
    case ConsumerInput::kPoll:
      return finalize ? streaming_consumer_for<ConsumerInput::kPoll, true>(hc, v)
                      : streaming_consumer_for<ConsumerInput::kPoll, false>(hc, v);
    case ConsumerInput::kFinalize: return streaming_consumer_for<ConsumerInput::kFinalize, false>(hc, v);
  }
  return nullptr;
}

// Dynamic shared memory of the streaming consumer: 2 stages x (hc + inputs) packs a thread;
// kFinalize also a buffer of the first route group's GEMM2 packs, min(top_k, 8) a thread.
size_t streaming_smem(int hc, ConsumerInput input, int inputs, int threads, int top_k) {
  const int packs = 2 * (hc + inputs) + (input == ConsumerInput::kFinalize ? std::min(top_k, kFinalizeGroup) : 0);
  return static_cast<size_t>(packs * threads) * sizeof(uint4);
}

template <class Params>
cudaError_t launch_rows(void (*kernel)(Params), const Params& params, const RowTiling& t,
                        int64_t rows, cudaStream_t stream, bool pdl) {
  if (rows <= 0) return cudaSuccess;
  return launch_ex(kernel, params, dim3(static_cast<unsigned>(rows * t.ctas_per_row)),
                   dim3(static_cast<unsigned>(t.threads)), 0, stream, pdl,
                   static_cast<unsigned>(t.ctas_per_row));
}

}  // namespace

RowTiling row_tiling(int np, int64_t m, int hc, int ctas_per_row, int group_packs) {
  const int max_threads = max_threads_per_cta(hc);
  const int least = (np + max_threads - 1) / max_threads;
  int ctas = least;
  if (ctas_per_row > 0) {
    ctas = std::max(least, ctas_per_row);
  } else if (m * least <= kMaxSingleLaunchCtas) {
    // Small M: one row's epilogue is issue-bound on one SM; spread it over a cluster, within
    // the single-launch grid.
    ctas = std::max<int64_t>(least, std::min<int64_t>(kSmallMCtasPerRow, kMaxSingleLaunchCtas / m));
  }  // Large M: the least (measured best: more CTAs a row only add cluster barriers)
  ctas = std::min(ctas, kMaxCtasPerRow);
  RowTiling t;
  t.ctas_per_row = ctas;
  t.packs_per_cta = ((np + ctas - 1) / ctas + group_packs - 1) / group_packs * group_packs;
  t.threads = (t.packs_per_cta + 31) / 32 * 32;
  return t;
}

cudaError_t launch_publish(const PublishParams& p, cudaStream_t stream, bool pdl) {
  return p.x != nullptr ? launch_rows(publish_kernel<false>, p, p.tiling, p.m, stream, pdl)
                        : launch_rows(publish_kernel<true>, p, p.tiling, p.m, stream, pdl);
}

cudaError_t launch_owner_reduce(const OwnerReduceParams& p, cudaStream_t stream, bool pdl) {
  if (owner_reduce_loops(p.m, p.tp, p.max_groups)) {
    return launch_rows(owner_reduce_kernel<true>, p, p.tiling, p.max_groups, stream, pdl);
  }
  return launch_rows(owner_reduce_kernel<false>, p, p.tiling, (p.m + p.tp - 1) / p.tp, stream, pdl);
}

// CTAs of `fn` resident at once on one SM of the current device at `threads` threads and `smem`
// bytes of dynamic shared memory, and that device's SMs; 0 where a query fails (its error
// cleared: not sticky, the caller's fallback runs instead).
static int resident_per_sm(const void* fn, int threads, size_t smem) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return per_sm;
}
static int device_sms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

int owner_reduce_resident_ctas(int threads) {  // 0: a group a row then
  return resident_per_sm(reinterpret_cast<const void*>(owner_reduce_kernel<true>), threads, 0) * device_sms();
}

// Queried once per op, input and variant at construction (AllReduceMHC agrees on one value
// across the ranks), with the kernel's dynamic shared memory allowed first (a function attribute).
int streaming_consumer_resident_ctas(int hc, ConsumerInput input, ConsumerVariant variant, int inputs,
                                     int threads, int top_k) {
  const size_t smem = streaming_smem(hc, input, inputs, threads, top_k);
  if (smem > kMaxStreamingSmem) return 0;
  const int sms = device_sms();
  if (sms == 0) return 0;
  int least = -1;  // polling: the call's and finalize's kernels, the one grid for both
  for (const bool finalize : {false, true}) {
    if (finalize && input != ConsumerInput::kPoll) break;
    ConsumerFn fn = streaming_consumer_for(hc, input, variant, finalize);
    if (fn == nullptr ||
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxStreamingSmem)) !=
            cudaSuccess) {
      cudaGetLastError();  // not sticky: the CTA-per-row kernel runs instead
      return 0;
    }
    const int per_sm = resident_per_sm(reinterpret_cast<const void*>(fn), threads, smem);
    if (per_sm == 0) return 0;
    least = least < 0 ? per_sm : std::min(least, per_sm);
  }
  return least * sms;
}

bool consumer_streams(const ConsumerParams& p, ConsumerInput input) {
  if (p.tiling.ctas_per_row != 1 || p.streaming_min_rows == 0 ||
      p.streaming_ctas <= p.publisher_ctas + p.reducer_ctas || p.m <= 1 ||
      (input == ConsumerInput::kPoll && p.publish_first)) {
    return false;
  }
  const int roles = p.publisher_ctas + p.reducer_ctas;
  if (p.streaming_min_rows > 0) return p.m >= p.streaming_min_rows;
  // Automatic TP=1 finalize: only where its routes fit the staged group (beyond it, one dependent
  // round trip a route: not measured to pay).
  if (input == ConsumerInput::kFinalize && p.fin.top_k > kFinalizeGroup) return false;
  // Automatic kPoll, from kPollStreamingMinRows: the one-shot (its own publishing CTAs); the
  // two-shot only as the consumer after its publish and owners' kernels (no roles: its own owner
  // CTAs, 16 of them reducing every row, measured slower than the owners' kernel at TP=1).
  if (input == ConsumerInput::kPoll) {
    return (p.contributions == nullptr || roles == 0) && p.m >= kPollStreamingMinRows;
  }
  return p.m > p.streaming_ctas - roles;
}

cudaError_t preload_all_reduce_mhc_kernels(int hc) {
  std::vector<const void*> fns = {reinterpret_cast<const void*>(publish_kernel<false>),
                                  reinterpret_cast<const void*>(publish_kernel<true>),
                                  reinterpret_cast<const void*>(owner_reduce_kernel<false>),
                                  reinterpret_cast<const void*>(owner_reduce_kernel<true>)};
  for (const ConsumerInput in : {ConsumerInput::kPoll, ConsumerInput::kDirect, ConsumerInput::kFinalize}) {
    for (const ConsumerVariant v : {ConsumerVariant::kPlain, ConsumerVariant::kMxfp8, ConsumerVariant::kResidualOnly,
                                    ConsumerVariant::kFp8}) {
      fns.push_back(reinterpret_cast<const void*>(consumer_for(hc, in, v)));
      for (const bool fin : {false, true}) {
        if (fin && in != ConsumerInput::kPoll) continue;
        fns.push_back(reinterpret_cast<const void*>(streaming_consumer_for(hc, in, v, fin)));
      }
    }
  }
  for (const void* fn : fns) {
    if (fn == nullptr) return cudaErrorInvalidValue;
    cudaFuncAttributes attr;
    const cudaError_t st = cudaFuncGetAttributes(&attr, fn);
    if (st != cudaSuccess) return st;
  }
  return cudaSuccess;
}

cudaError_t launch_consumer(const ConsumerParams& given, int hc, ConsumerInput input,
                            ConsumerVariant variant, cudaStream_t stream, bool pdl) {
  ConsumerParams p = given;
  p.in_headers = mailbox_row_packs(p.nslots, p.slot_rows, p.np);
  p.target_headers = mailbox_row_packs(p.tp, p.slot_rows, p.np);
  p.contribution_headers = mailbox_row_packs(p.tp, p.owner_rows, p.np);
  if (consumer_streams(p, input)) {
    const int threads = p.tiling.threads;
    const int inputs = input == ConsumerInput::kPoll ? p.nslots : 1;
    const int64_t grid = std::min<int64_t>(p.m + p.publisher_ctas + p.reducer_ctas, p.streaming_ctas);
    return launch_ex(streaming_consumer_for(hc, input, variant, p.x == nullptr), p, dim3(static_cast<unsigned>(grid)),
                     dim3(static_cast<unsigned>(threads)), streaming_smem(hc, input, inputs, threads, p.fin.top_k), stream, pdl);
  }
  ConsumerFn fn = consumer_for(hc, input, variant);
  if (fn == nullptr) return cudaErrorInvalidValue;
  return launch_rows(fn, p, p.tiling, p.m, stream, pdl);
}

}  // namespace mhccl::kernels
