// LamportAllGather kernel, and the small utility kernels (fill, strided copy).
#include <algorithm>

#include "kernels/launch.h"
#include "kernels/lamport.cuh"

namespace mhccl::kernels {
namespace {

constexpr int kAllGatherThreads = 256;   // at most, a CTA
// kAllGatherMaxCtas (params.h): every CTA co-resident on any sm_90 part (>= 114 SMs); also the
// call headers' units a slot.
// Packs a CTA takes at least: below 128 x 256 packs the grid spreads over more SMs with fewer
// threads each, so more SMs issue the NVLink stores and the polls in parallel.
constexpr int kAllGatherPacksPerCta = 256;

// One kernel: each thread first publishes its packs (grid-stride) to every peer's slot
// [gen][rank] and to its own output rows, then collects the same packs of every peer from its
// own mailbox. A thread waits only for the peers' threads of the same index, which publish
// before they wait, so the co-resident grid cannot deadlock. Every word arrives as sent: a pack
// holding the sentinel (or the marker) travels encoded, with an escape word (WordLanes::encode).
// Thread 0 of each CTA publishes the CTA's call header first, and thread k of each CTA checks
// the header of rank (rank + k) % tp's CTA of the same index (PROTOCOL.md, I19).
__global__ void __launch_bounds__(kAllGatherThreads) all_gather_kernel(const AllGatherParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const uint4* in = static_cast<const uint4*>(p.in);
  uint4* out = static_cast<uint4*>(p.out);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p.tp == 1) {
    for (int64_t i = first; i < p.packs; i += step) out[i] = ld_input(in + i);
    return;
  }
  // The first pack's input load goes out before the state load: two round trips overlapped.
  uint4 head = make_uint4(0, 0, 0, 0);
  if (first < p.packs) head = ld_input(in + first);
  const Generation g = read_generation(p.state, p.err);
  const uint32_t ticket = arrive_early(p.state);
  uint4* local = static_cast<uint4*>(p.mailboxes[0]);
  uint32_t* local_words = static_cast<uint32_t*>(p.mailboxes[0]);
  const int64_t cap = p.capacity_packs;
  const int64_t my_slot = (static_cast<int64_t>(g.current) * p.tp + p.rank) * cap;
  const uint4 want = identity_pack(p.id, g);
  const WaitSite site{kProtoAllGather, -1, g.current, first, p.state};
  // Once a fault stands, nothing goes into any peer's mailbox (PROTOCOL.md, I12b); the waits below
  // then end at once and the record says why.
  if (threadIdx.x == 0 && may_publish(p.err, g.fault, site)) {
    const int64_t off = all_gather_header_offset(g.current, p.tp, p.rank, cap, blockIdx.x);
#pragma unroll
    for (int k = 1; k < kMaxTp; ++k) {
      if (k < p.tp) st_volatile(static_cast<uint4*>(p.mailboxes[k]) + off, want);
    }
  }
  const bool publish = first >= p.packs || may_publish(p.err, g.fault, site);
  for (int64_t i = first; publish && i < p.packs; i += step) {
    const uint4 x = i == first ? head : ld_input(in + i);
    uint32_t escape;
    const uint4 v = WordLanes::encode(x, escape);
#pragma unroll
    for (int k = 1; k < kMaxTp; ++k) {
      if (k < p.tp) st_volatile(static_cast<uint4*>(p.mailboxes[k]) + my_slot + i, v);
    }
    if (escape != 0) {
      const int64_t off = all_gather_escape_offset(g.current, p.tp, p.rank, cap, i);
#pragma unroll
      for (int k = 1; k < kMaxTp; ++k) {
        if (k < p.tp) st_volatile(static_cast<uint32_t*>(p.mailboxes[k]) + off, escape);
      }
    }
    out[p.rank * p.packs + i] = x;
  }
  // This CTA's unit: thread k < tp checks rank (rank + k) % tp's call header, its load in flight
  // while this thread's packs are collected.
  const int hk = static_cast<int>(threadIdx.x);
  const bool checks_header = hk >= 1 && hk < p.tp;
  const int hsource = (p.rank + hk) % p.tp;
  uint4* hdr = local + all_gather_header_offset(g.current, p.tp, hsource, cap, blockIdx.x);
  uint4 header = make_uint4(0, 0, 0, 0);
  if (checks_header) header = ld_volatile(hdr);
  for (int64_t i = first; i < p.packs; i += step) {
    uint4 v[kMaxTp];
#pragma unroll
    for (int k = 1; k < kMaxTp; ++k) {
      const int r = (p.rank + k) % p.tp;
      if (k < p.tp) v[k] = ld_volatile(local + (static_cast<int64_t>(g.current) * p.tp + r) * cap + i);
    }
#pragma unroll
    for (int k = 1; k < kMaxTp; ++k) {
      if (k >= p.tp) continue;
      const int r = (p.rank + k) % p.tp;
      const uint4* slot = local + (static_cast<int64_t>(g.current) * p.tp + r) * cap + i;
      const WaitSite at{kProtoAllGather, r, g.current, i, p.state};
      if (wait_slot<WordLanes>(slot, v[k], p.err, at) && WordLanes::escaped(v[k])) {
        // A pack that carried the sentinel: its escape word, stored after it, restores the lanes
        // (then reset: this thread is its only reader).
        uint32_t* esc = local_words + all_gather_escape_offset(g.current, p.tp, r, cap, i);
        uint32_t e = ld_volatile(esc);
        if (wait_slot<WordLanes>(esc, e, p.err, at)) {
          st_volatile(esc, kWordSentinel);
          v[k] = WordLanes::decode(v[k], e);
        }
      }
      out[r * p.packs + i] = v[k];
    }
  }
  if (checks_header) check_header<WordLanes, true>(hdr, header, want, p.err, WaitSite{kProtoAllGather, hsource, g.current, first, p.state});
  reset_slots<WordLanes>(local + static_cast<int64_t>(g.previous) * p.tp * cap,
                         p.tp, cap, g.prev_rows);
  advance_if_last(p.state, ticket, static_cast<uint32_t>(p.packs));
}

// The NCCL fallback's identity exchange (params.h, FallbackParams; PROTOCOL.md I19), one thread
// before its NCCL operations and one warp after them.
__global__ void fallback_enter_kernel(const FallbackParams p) {
  volatile uint32_t* entered = p.progress;
  *entered = *entered + 1;
  // The watchdog reads the count from the host. The fence is also what orders a fault this rank
  // raised in an earlier kernel of this stream (a Lamport wait given up: raise_fault's
  // compare-and-swaps into every rank's word) before the identity's write below, and by stream
  // order before this call's NCCL sends, so that a peer whose call pairs with this one under an
  // equal identity sees the fault in fallback_leave (PROTOCOL.md, I19: what a fence in
  // raise_fault would give, with no cost to the Lamport kernels; an open limit, as it rests on
  // stream order and NCCL's own ordering). Keep it here, and this kernel launched without PDL.
  __threadfence_system();
  char* base = static_cast<char*>(p.ids);
  volatile uint32_t* calls = reinterpret_cast<uint32_t*>(base + kFallbackCallsOffset);
  const uint32_t n = *calls;
  *calls = n + 1;
  const uint32_t rejected = *const_cast<const volatile uint32_t*>(p.err.fault + 1);
  const CallIdentity c = with_call_state(p.id, 0, rejected);
  uint4* ids = reinterpret_cast<uint4*>(base);
  ids[0] = make_uint4(c.w[0], c.w[1], c.w[2], c.w[3]);
  // The receive slots cleared: one the all-gather leaves unwritten (aborted by the watchdog,
  // which reports kPeerTimeout) is not taken for another call's identity.
  for (int s = 0; s < p.tp; ++s) ids[1 + s] = make_uint4(0, 0, 0, 0);
}

__global__ void fallback_leave_kernel(const FallbackParams p) {
  const int s = static_cast<int>(threadIdx.x);
  if (s == 0) {
    volatile uint32_t* left = p.progress + 1;
    *left = *left + 1;
    __threadfence_system();
  }
  const uint32_t calls = *reinterpret_cast<const volatile uint32_t*>(static_cast<const char*>(p.ids) + kFallbackCallsOffset);
  const uint4* ids = static_cast<const uint4*>(p.ids);
  const uint4 mine = ids[0];
  const uint4 theirs = s < p.tp ? ids[1 + s] : mine;
  // A slot still all zeros was not delivered: the watchdog aborted the exchange (it reports
  // kPeerTimeout first), or another NCCL operation paired with it and brought zeros. Either way
  // the rows are not this call's: recorded as a wait for that rank that did not end (a review,
  // 2026-12-05: it was skipped), naming no rank where every slot is empty (the exchange did
  // not happen, so no slot says who failed). Anything else that is not this rank's identity, an
  // identity or not, is a divergence.
  const bool delivered = (theirs.x | theirs.y | theirs.z | theirs.w) != 0;
  const bool differs = theirs.x != mine.x || theirs.y != mine.y || theirs.z != mine.z || theirs.w != mine.w;
  const uint32_t found = __ballot_sync(0xFFFFFFFFu, differs);
  const uint32_t arrived = __ballot_sync(0xFFFFFFFFu, s < p.tp && delivered);  // none: no exchange happened
  if (found == 0) {
    // Every identity equal to this rank's: then this rank's fault word (PROTOCOL.md, I12b), read
    // after the rows arrived. A rank that gave up (a Lamport wait of another call timed out)
    // raises it in every rank's word where the word is shared (peers reachable), before it sends
    // anything later, and its later calls' rows can pair with this call under an equal identity:
    // where the raise landed before this read, the call is recorded as a peer fault, so that its
    // outputs are never taken for right (a review, 2026-12-05: nothing of the NCCL path looked).
    // Read after the identities' check, so that a rank that finds a divergence itself reports
    // that; read at fault_own, which an abort of the NCCL communicator leaves mapped.
    if (s == 0) {
      const uint32_t f = *static_cast<const volatile uint32_t*>(p.fault_own);
      if (f != 0) record_error(p.err, kPeerFault, kProtoNccl, fault_timed_out_rank(f), 0, 0, f, calls - 1);
    }
    return;
  }
  if (s != __ffs(found) - 1) return;
  // The first rank whose slot differs: recorded on this rank (and for a divergence the fault
  // raised; not for an empty slot, which an abort of the NCCL communicator may leave, whose
  // peers' fault words may then be unmapped: the record alone makes this rank raise).
  if (!delivered) {
    record_error(p.err, kWaitTimeout, kProtoNccl, arrived != 0 ? s : -1, 0, 0, 0, calls - 1);
    return;
  }
  record_error(p.err, kDivergence, kProtoNccl, s, 0, 0, 0, calls - 1, &mine, &theirs);
  raise_fault(p.err, s, true);
}

// A rejected call's count (ErrorSink::fault + 1, device memory): atomic, since a rank's ops may
// be rejected on several streams and their increments must not be lost.
__global__ void count_rejected_kernel(uint32_t* word) { atomicAdd(word, 1u); }

__global__ void fill_u32_kernel(uint32_t* ptr, size_t words, uint32_t value) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    ptr[i] = value;
  }
}

__global__ void strided_copy_kernel(const StridedCopy c, int64_t numel) {
  const char* src = static_cast<const char*>(c.src);
  char* dst = static_cast<char*>(c.dst);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = 0;
    for (int d = c.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % c.shape[d];
      rem /= c.shape[d];
      off += idx * c.strides[d];
    }
    const char* s = src + off * c.elem_bytes;
    char* t = dst + i * c.elem_bytes;
    for (int b = 0; b < c.elem_bytes; ++b) t[b] = s[b];
  }
}

}  // namespace

cudaError_t launch_all_gather(const AllGatherParams& p, cudaStream_t stream, bool pdl) {
  // The shape depends on the byte count only (every rank launches alike).
  const int64_t per = p.packs_per_cta > 0 ? p.packs_per_cta : kAllGatherPacksPerCta;
  const int64_t ctas = std::max<int64_t>(1, std::min<int64_t>(kAllGatherMaxCtas, (p.packs + per - 1) / per));
  const int64_t threads = std::min<int64_t>(kAllGatherThreads, ((p.packs + ctas - 1) / ctas + 31) / 32 * 32);
  return launch_ex(all_gather_kernel, p, dim3(static_cast<unsigned>(ctas)),
                   dim3(static_cast<unsigned>(std::max<int64_t>(32, threads))), 0, stream, pdl);
}

cudaError_t preload_all_gather_kernels() {
  for (const void* fn : {reinterpret_cast<const void*>(all_gather_kernel), reinterpret_cast<const void*>(fill_u32_kernel),
                         reinterpret_cast<const void*>(strided_copy_kernel),
                         reinterpret_cast<const void*>(count_rejected_kernel), reinterpret_cast<const void*>(fallback_enter_kernel),
                         reinterpret_cast<const void*>(fallback_leave_kernel)}) {
    cudaFuncAttributes attr;
    const cudaError_t st = cudaFuncGetAttributes(&attr, fn);
    if (st != cudaSuccess) return st;
  }
  return cudaSuccess;
}

// The launchers below return their launch's own status (cudaLaunchKernel[Ex]), never an error
// left pending by an earlier CUDA call of the thread (cudaGetLastError would return, and clear,
// that one: a rejected call's count then looked failed when the rejection's own cause was a
// CUDA error).
cudaError_t launch_fallback_enter(const FallbackParams& p, cudaStream_t stream) {
  return launch_ex(fallback_enter_kernel, p, dim3(1), dim3(1), 0, stream, false);
}

cudaError_t launch_fallback_leave(const FallbackParams& p, cudaStream_t stream) {
  return launch_ex(fallback_leave_kernel, p, dim3(1), dim3(32), 0, stream, false);
}

cudaError_t launch_count_rejected(uint32_t* word, cudaStream_t stream) {
  return launch_ex(count_rejected_kernel, word, dim3(1), dim3(1), 0, stream, false);
}

cudaError_t launch_fill_u32(void* ptr, size_t words, uint32_t value, cudaStream_t stream) {
  if (words == 0) return cudaSuccess;
  const size_t blocks = (words + 255) / 256;
  uint32_t* p = static_cast<uint32_t*>(ptr);
  void* args[] = {&p, &words, &value};
  return cudaLaunchKernel(reinterpret_cast<const void*>(fill_u32_kernel),
                          dim3(static_cast<unsigned>(blocks < 1024 ? blocks : 1024)), dim3(256), args, 0, stream);
}

cudaError_t launch_strided_copy(const StridedCopy& c, cudaStream_t stream) {
  int64_t numel = 1;
  for (int d = 0; d < c.ndim; ++d) numel *= c.shape[d];
  if (numel == 0) return cudaSuccess;
  const int64_t blocks = (numel + 255) / 256;
  StridedCopy copy = c;
  void* args[] = {&copy, &numel};
  return cudaLaunchKernel(reinterpret_cast<const void*>(strided_copy_kernel),
                          dim3(static_cast<unsigned>(blocks < 1024 ? blocks : 1024)), dim3(256), args, 0, stream);
}

}  // namespace mhccl::kernels
