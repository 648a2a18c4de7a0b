// The MoE boundary (AllReduceMHC::finalize) and the all-gather (LamportAllGather) from C++, as a
// user's project writes them; compiled in CI against the installed package (tests/downstream).
// The quick start (AllReduceMHC::call) is examples/cpp_snippet.cpp, the README's text.
#include <cstdio>

#include <mhccl/all_gather.h>
#include <mhccl/all_reduce_mhc.h>
#include <mhccl/communicator.h>
#include <mhccl/error.h>

// DLPack views of caller-owned CUDA tensors of one MoE boundary (DSV4.1: H=5120, hc=4, top_k=6).
struct MoeBoundary {
  DLTensor gemm2;        // [rows, 5120] BF16: this rank's unweighted GEMM2 output, permuted
  DLTensor weights;      // [M, 6] FP32 routing weights (already scaled)
  DLTensor idx;          // [M, 6] int32: row of gemm2 of each route, -1 where not on this rank
  DLTensor shared;       // [M, 5120] BF16: this rank's partial shared-expert output
  DLTensor residual;     // [M, 4, 5120] BF16
  DLTensor post;         // [M, 4] FP32
  DLTensor comb;         // [M, 4, 4] FP32, [source, target]
  DLTensor pre;          // [M, 4] FP32
  DLTensor w;            // [5120] BF16 RMSNorm weight
  DLTensor out;          // [M, 4, 5120] BF16, written
  DLTensor li;           // [M, 5120] BF16, written
};

// x = sum_k weights[m,k] * gemm2[idx[m,k]] + shared on this rank, all-reduced over the ranks,
// then the same mHC epilogue as call(). `op` was built collectively (every rank, same config).
int run_finalize(mhccl::AllReduceMHC& op, MoeBoundary& t, cudaStream_t stream) {
  try {
    mhccl::AllReduceMHCFinalizeArgs args;
    args.gemm2_permuted = &t.gemm2;
    args.expert_weights = &t.weights;
    args.expanded_idx_to_permuted_idx = &t.idx;
    args.shared_output = &t.shared;
    args.epilogue.residual = &t.residual;
    args.epilogue.post = &t.post;
    args.epilogue.comb = &t.comb;
    args.epilogue.pre = &t.pre;
    args.epilogue.norm_weight = &t.w;
    args.epilogue.residual_out = &t.out;
    args.epilogue.layer_input = &t.li;
    op.finalize(args, stream);  // stream-ordered, CUDA-graph capturable
    return 0;
  } catch (const mhccl::Error& e) {
    std::fprintf(stderr, "mhccl %s: %s\n", mhccl::error_code_id(e.code()), e.what());
    return e.is_argument_error() ? 2 : 1;
  }
}

// out = every rank's `in` concatenated along dim 0 in rank order ([tp * n, ...], in's dtype),
// exact for every dtype. `ag` was built collectively: mhccl::LamportAllGather ag(comm, capacity),
// capacity a multiple of 16 bytes, at least in's bytes on every rank.
int run_all_gather(mhccl::LamportAllGather& ag, const DLTensor& in, const DLTensor& out, cudaStream_t stream) {
  if (!ag.accepts(in)) return 2;  // decided from in's size alone: every rank decides alike
  try {
    ag.call(in, out, stream);
    return 0;
  } catch (const mhccl::Error& e) {
    std::fprintf(stderr, "mhccl %s: %s\n", mhccl::error_code_id(e.code()), e.what());
    return e.is_argument_error() ? 2 : 1;
  }
}
