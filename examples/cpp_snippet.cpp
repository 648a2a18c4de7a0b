#include <cstdio>

#include <mhccl/all_reduce_mhc.h>
#include <mhccl/bootstrap.h>
#include <mhccl/communicator.h>
#include <mhccl/error.h>
#include <mhccl/mxfp8.h>  // mxfp8_scale_bytes
// CMake: find_package(mhccl REQUIRED), target_link_libraries(app PRIVATE mhccl::mhccl): the
// include paths of mhccl, CUDA, NCCL and DLPack; links libmhccl, the CUDA runtime and NCCL.

// DLPack views of caller-owned CUDA tensors of one decode boundary (DSV4.1: H=5120, hc=4).
struct Boundary {
  DLTensor x;          // [M, 5120] BF16: this rank's partial sublayer output
  DLTensor residual;   // [M, 4, 5120] BF16
  DLTensor post;       // [M, 4] FP32
  DLTensor comb;       // [M, 4, 4] FP32, [source, target]
  DLTensor pre;        // [M, 4] FP32
  DLTensor w;          // [5120] BF16 RMSNorm weight
  DLTensor out;        // [M, 4, 5120] BF16, written
  DLTensor li;         // [M, 5120] BF16, written
  DLTensor q;          // optional: [M, 5120] E4M3 bytes, written
  DLTensor s;          // and mhccl::mxfp8_scale_bytes(M, 5120) UE8M0 bytes
};

// One process per GPU (mhccl-launch, torchrun or mpirun set the rank environment).
int run_boundary(Boundary& t, cudaStream_t stream) {
  try {
    mhccl::RankEnvironment env = mhccl::rank_environment();
    mhccl::Communicator comm(mhccl::share_unique_id(env), env.rank, env.world_size, env.local_rank);

    mhccl::AllReduceMHCConfig cfg;  // DSV4.1: H=5120, hc=4, top_k=6
    cfg.max_num_tokens = 256;
    cfg.quantize_layer_input = true;    // accept MXFP8 outputs
    mhccl::AllReduceMHC op(comm, cfg);  // collective: every rank, same config

    mhccl::AllReduceMHCCallArgs args;
    args.x = &t.x;
    args.epilogue.residual = &t.residual;
    args.epilogue.post = &t.post;
    args.epilogue.comb = &t.comb;
    args.epilogue.pre = &t.pre;
    args.epilogue.norm_weight = &t.w;
    args.epilogue.residual_out = &t.out;
    args.epilogue.layer_input = &t.li;
    args.epilogue.mxfp8_values = &t.q;  // optional, with the scales
    args.epilogue.mxfp8_scales = &t.s;
    op.call(args, stream);              // stream-ordered, CUDA-graph capturable
    return cudaStreamSynchronize(stream) == cudaSuccess ? 0 : 1;
  } catch (const mhccl::Error& e) {  // checked before anything is launched
    std::fprintf(stderr, "mhccl %s: %s\n", mhccl::error_code_name(e.code()), e.what());
    return e.is_argument_error() ? 2 : 1;
  }
}
