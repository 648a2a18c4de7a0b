"""One DeepSeek V4.1 decode sublayer boundary with mhccl, as an engine would run it.

    torchrun --nproc-per-node 2 examples/dsv41_decode_boundary.py [--tokens 16]

At a sublayer boundary the TP-partial output x of the attention (or MoE) block is all-reduced,
post-mixed into the hc = 4 residual streams with the carried comb/post, collapsed with the next
sublayer's carried pre-mix and RMS-normalized into the next layer input. Unfused that is
torch.distributed.all_reduce + a few elementwise kernels; mhccl.AllReduceMHC does it in one
launch (small batches) with a Lamport all-reduce over NVLink. This script checks the two agree
and times both, eagerly and under a CUDA graph.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import mhccl

H, HC, EPS = 5120, 4, 1e-6


def unfused(x, residual, post, comb, pre, norm_weight):
    """What an engine does without mhccl (the same math, in PyTorch)."""
    dist.all_reduce(x)                                                 # NCCL, BF16
    y = x.float()
    streams = post[:, :, None] * y[:, None, :] + torch.einsum("mst,msh->mth", comb, residual.float())
    streams = streams.to(torch.bfloat16)
    # The collapse, rounded to BF16 once before the norm, as vLLM's unfused DSV4.1 path does.
    c = torch.einsum("mt,mth->mh", pre, streams.float()).to(torch.bfloat16).float()
    layer_input = (c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + EPS) * norm_weight.float())
    return streams, layer_input.to(torch.bfloat16)


def time_us(fn, iters=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=16, help="decode batch (rows per call)")
    m = parser.parse_args().tokens
    if not torch.cuda.is_available():  # a clear reason, not torch's traceback on every rank
        print("dsv41_decode_boundary.py: no CUDA device (torch.cuda.is_available() is False): this "
              "example runs on GPUs", file=sys.stderr, flush=True)
        sys.exit(2)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, device = dist.get_rank(), torch.device("cuda", local_rank)

    # Replicated state (the same on every rank) and this rank's partial output.
    g = torch.Generator(device="cpu").manual_seed(0)
    residual = torch.randn(m, HC, H, generator=g).to(torch.bfloat16).to(device)
    post = (2 * torch.sigmoid(torch.randn(m, HC, generator=g))).to(device)
    comb = torch.softmax(torch.randn(m, HC, HC, generator=g), -1).to(device)
    pre = (torch.sigmoid(torch.randn(m, HC, generator=g)) + 1e-6).to(device)
    norm_weight = torch.ones(H, dtype=torch.bfloat16, device=device)
    x = torch.randn(m, H, generator=torch.Generator().manual_seed(1 + rank)).to(torch.bfloat16).to(device)

    # Built once per model (collective over the TP group), called at every boundary.
    op = mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=256, top_k=6, device=device)
    streams, layer_input = op(x, residual, post, comb, pre, norm_weight, EPS)

    ref_streams, ref_layer_input = unfused(x.clone(), residual, post, comb, pre, norm_weight)
    torch.cuda.synchronize()
    # PyTorch's einsum adds in another order than SPEC's fmaf chain: agreement to BF16 rounding.
    same = torch.allclose(streams.float(), ref_streams.float(), rtol=2 ** -7, atol=1e-3)
    close = torch.allclose(layer_input.float(), ref_layer_input.float(), rtol=2 ** -6, atol=1e-2)

    fused_us = time_us(lambda: op(x, residual, post, comb, pre, norm_weight, EPS))
    unfused_us = time_us(lambda: unfused(x.clone(), residual, post, comb, pre, norm_weight))

    graph = torch.cuda.CUDAGraph()       # as a decode engine replays its step
    with torch.cuda.graph(graph):
        for _ in range(10):
            op(x, residual, post, comb, pre, norm_weight, EPS)
    graph_us = time_us(graph.replay, iters=50) / 10
    # A replayed call cannot raise: an engine asks the communicator once a step (README, "Errors").
    op.check_errors()
    if rank == 0:
        print(f"M={m} TP={dist.get_world_size()} H={H} hc={HC}: agrees with the unfused path: "
              f"streams {same}, layer input {close}")
        print(f"  unfused (NCCL all-reduce + PyTorch mHC): {unfused_us:8.1f} us")
        print(f"  mhccl.AllReduceMHC, eager:                {fused_us:8.1f} us")
        print(f"  mhccl.AllReduceMHC, CUDA graph:           {graph_us:8.1f} us")
    dist.destroy_process_group()
    if not (same and close):  # a disagreement is an error, not a line to read past
        print(f"dsv41_decode_boundary.py: rank {rank}: mhccl and the unfused path disagree "
              f"(streams {same}, layer input {close})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
