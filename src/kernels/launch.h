// Host entry points of the kernels (src/kernels/*.cu); src/ops/ builds the params.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/params.h"

namespace mhccl::kernels {

// cudaLaunchKernelEx of `kernel` with programmatic dependent launch (when `pdl`) and a
// thread-block cluster of `cluster_x` CTAs (when > 1): the one launch configuration of every
// mhccl kernel that needs either.
template <class Params>
cudaError_t launch_ex(void (*kernel)(Params), const Params& params, dim3 grid, dim3 block,
                      size_t smem, cudaStream_t stream, bool pdl, unsigned cluster_x = 1) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster_x;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, params);
}

// The tiling of rows of np packs for an epilogue over hc streams (rank-invariant: a function of
// its arguments only). ctas_per_row == 0: the least that fits; otherwise at least that.
// packs_per_cta is a multiple of `group_packs` (4: an MXFP8 block; kFp8GroupPacks for the FP8
// variant, whose np is a multiple of it); the CTAs a row and threads a CTA do not depend on it.
RowTiling row_tiling(int np, int64_t m, int hc, int ctas_per_row = 0, int group_packs = 4);

cudaError_t launch_publish(const PublishParams& p, cudaStream_t stream, bool pdl);
cudaError_t launch_owner_reduce(const OwnerReduceParams& p, cudaStream_t stream, bool pdl);
cudaError_t launch_consumer(const ConsumerParams& p, int hc, ConsumerInput input,
                            ConsumerVariant variant, cudaStream_t stream, bool pdl);
// CTAs of the streaming consumer (ConsumerParams::streaming_ctas) resident at once on the
// current device for an epilogue over hc streams with `inputs` input packs a thread (1: x,
// reduced rows or, kFinalize, the shared expert's row; tp: one-shot slots) at `threads` threads
// a CTA (0: it cannot run there); kFinalize also holds min(top_k, 8) GEMM2 packs a thread. A
// per-device query: the op agrees on one value across ranks at construction.
int streaming_consumer_resident_ctas(int hc, ConsumerInput input, ConsumerVariant variant, int inputs,
                                     int threads, int top_k = 0);
// CTAs of the two-shot owners' reduce (OwnerReduceParams::max_groups at a CTA a row) resident
// at once on the current device at `threads` threads a CTA; 0 where the query fails.
int owner_reduce_resident_ctas(int threads);
// Whether launch_owner_reduce runs the looping owners: max_groups (0: none) caps the grid below
// the ceil(M / tp) owned-row groups.
constexpr bool owner_reduce_loops(int64_t m, int tp, int64_t max_groups) {
  return max_groups > 0 && (m + tp - 1) / tp > max_groups;
}
// Whether launch_consumer runs the streaming consumer for these params (a function of the
// params only, so the host knows whether a one-shot needs its publish kernel).
bool consumer_streams(const ConsumerParams& p, ConsumerInput input);
cudaError_t launch_all_gather(const AllGatherParams& p, cudaStream_t stream, bool pdl);

// Loads every kernel an op can launch (cudaFuncGetAttributes: with CUDA's lazy loading a kernel
// is otherwise loaded at its first launch, inside a call, where that could wait behind a peer's
// spinning kernel). AllReduceMHC: every publish, owner-reduce and consumer kernel of an epilogue
// over hc streams (every input, variant and the streaming ones); the all-gather: its kernel and
// the fill and strided-copy kernels.
cudaError_t preload_all_reduce_mhc_kernels(int hc);
cudaError_t preload_all_gather_kernels();

// The NCCL fallback's identity exchange around its NCCL operations (params.h, FallbackParams): one
// thread that counts the call entered (the watchdog's progress counts, host-mapped; only this
// stream writes them) and writes this rank's identity, and one warp that counts it left and
// checks every rank's against it (kDivergence and the fault where one differs).
cudaError_t launch_fallback_enter(const FallbackParams& p, cudaStream_t stream);
cudaError_t launch_fallback_leave(const FallbackParams& p, cudaStream_t stream);
// *word += 1 atomically, stream-ordered: a rank's count of rejected calls (device memory beside
// its fault word; rejections on several streams lose no increment). Returns the launch's own
// status, as every launcher here (never an error an earlier call left pending).
cudaError_t launch_count_rejected(uint32_t* word, cudaStream_t stream);

// Every 32-bit word of [ptr, ptr + 4 * words) set to `value`.
cudaError_t launch_fill_u32(void* ptr, size_t words, uint32_t value, cudaStream_t stream);

// Copy of a strided tensor (up to 8 dims, strides in elements) into a contiguous buffer.
struct StridedCopy {
  const void* src;
  void* dst;
  int ndim;
  int64_t shape[8];
  int64_t strides[8];
  int elem_bytes;
};
cudaError_t launch_strided_copy(const StridedCopy& c, cudaStream_t stream);

}  // namespace mhccl::kernels
