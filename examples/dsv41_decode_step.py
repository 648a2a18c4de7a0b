#!/usr/bin/env python3
"""A DeepSeek V4.1 decode step of L decoder layers with mhccl at every sublayer boundary, against
the same model written the unfused way; both under torch.compile and replayed as CUDA graphs.

    python examples/dsv41_decode_step.py                       # TP=1
    torchrun --nproc-per-node 2 examples/dsv41_decode_step.py  # TP=2
    options: --layers 4 --tokens 1,8,64,256 --check-only --profile --json PATH

Each layer (H = 5120, hc = 4 residual streams, as DSV4.1):
1. attention sublayer: its mHC mixes from the streams (vLLM's DeepSeek V4 formulation: the
   flattened hc streams, RMS-scaled, projected to 2*hc + hc*hc logits; pre = sigmoid + eps,
   post = 2 * sigmoid, comb = Sinkhorn of the row softmax, 20 iterations); a stand-in for
   attention of the real GEMM shapes, tensor-parallel: [M, 5120] x [5120, 5120/tp], then
   [M, 5120/tp] x [5120/tp, 5120] (a row-parallel partial); the boundary.
2. MoE sublayer: its mixes; a stand-in MoE: a router (sigmoid scores, top-6 of --experts),
   the experts of this rank (expert e lives on rank e % tp) as GEMMs of the real hidden size
   over all M tokens (their outputs are the "permuted" GEMM2 rows: expert-major), the
   expanded_idx_to_permuted_idx of the routes (-1 where another rank holds the expert) and a
   tensor-parallel shared expert; the boundary, through finalize.

DSV4.1 collapses a sublayer's input with the pre-mix computed from the streams the previous
sublayer started from (vLLM: mhc_pre_delayed), so the collapse and the next RMSNorm fold into
the boundary. The boundary is, in the mhccl model, ``AllReduceMHC.__call__`` (after attention)
and ``AllReduceMHC.finalize`` (after the MoE); in the unfused model, torch.distributed's
all_reduce of the BF16 partial (none at TP=1) and the PyTorch epilogue as engines write it.

The script checks that the CUDA-graph replays give the bits of the compiled step, and compares
the two models after L layers: the fraction of bit-identical stream and layer-input elements
and the largest ulp difference (mhccl sums in FP32 with fused multiply-adds in a fixed order;
the compiled PyTorch epilogue adds in Inductor's order, and where that rounds a stream element
the other way the difference flows through the following layers' mixes). Then it times the
decode step of each (CUDA events around graph replays, the median of the repeats). It exits 1
when a model fails to compile, capture or replay, or a replay differs from the compiled step;
the agreement of the two models is reported (AGREE, CLOSE, DIFFER), not enforced: SPEC.md's
bit-level promises are checked by ``bench/peers.py --check``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # reported by main(), so that --help works anywhere
    torch = None
    nn = None

H, HC, TOP_K = 5120, 4, 6
EPS = 1e-6             # RMSNorm eps (DSV4.1 rms_norm_eps)
HC_EPS = 1e-6          # hc_eps: pre's offset and the Sinkhorn's
SINKHORN_ITERS = 20    # hc_sinkhorn_iters
POST_MULT = 2.0        # post = 2 * sigmoid
ROUTED_SCALE = 1.5     # routed_scaling_factor of the stand-in router
MIX = (2 + HC) * HC    # pre, post, comb logits per token


def die(msg: str, code: int = 2) -> None:
    print(f"dsv41_decode_step.py: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# --------------------------------------------------------------------------------------------
# The model's arithmetic, shared by both models.

def hc_mixes(streams, fn, scale, base):
    """A sublayer's mHC mixes from its input streams [M, hc, H] BF16: fn [MIX, hc*H] FP32,
    scale [3], base [MIX]. Returns pre [M, hc], post [M, hc], comb [M, hc, hc] ([source, target])."""
    m = streams.shape[0]
    x = streams.reshape(m, HC * H).float()
    mixes = (x @ fn.t()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
    pre = torch.sigmoid(mixes[:, :HC] * scale[0] + base[:HC]) + HC_EPS
    post = torch.sigmoid(mixes[:, HC:2 * HC] * scale[1] + base[HC:2 * HC]) * POST_MULT
    comb = mixes[:, 2 * HC:].reshape(m, HC, HC) * scale[2] + base[2 * HC:].reshape(1, HC, HC)
    comb = torch.softmax(comb, dim=-1) + HC_EPS
    comb = comb / (comb.sum(dim=-2, keepdim=True) + HC_EPS)
    for _ in range(SINKHORN_ITERS - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + HC_EPS)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + HC_EPS)
    return pre, post, comb


def collapse_norm(streams, pre, norm_weight):
    """The layer input of streams: the collapse with pre rounded to BF16, RMSNorm in FP32."""
    p = (pre[..., None] * streams.float()).sum(1).to(torch.bfloat16).float()
    return (p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + EPS) * norm_weight.float()).to(torch.bfloat16)


def mhc_epilogue(y, residual, post, comb, pre, norm_weight):
    """The unfused boundary after the all-reduce: post-mix into the streams, collapse, RMSNorm;
    written with broadcasts (Inductor fuses them)."""
    streams = (post[..., None] * y[:, None, :].float()
               + (comb[..., None] * residual[:, :, None, :].float()).sum(1)).to(torch.bfloat16)
    return streams, collapse_norm(streams, pre, norm_weight)


def moe_finalize_x(gemm2, weights, routes, shared):
    """This rank's MoE output: sum_k w_k * gemm2[route_k] over the valid routes (-1 skipped, as a
    zero weight) + the shared expert, in FP32, rounded once."""
    w = torch.where(routes >= 0, weights, torch.zeros_like(weights))
    rows = gemm2[routes.clamp(min=0).long()].float()
    return ((w[..., None] * rows).sum(1) + shared.float()).to(torch.bfloat16)


def nccl_all_reduce(x):
    """torch.distributed's all_reduce of an owned BF16 partial (in place), outside the graph:
    what an engine calls (vLLM's all-reduce is an opaque custom op too)."""
    torch.distributed.all_reduce(x)
    return x


# --------------------------------------------------------------------------------------------

class Layer(nn.Module if nn is not None else object):
    """One decoder layer's weights on this rank (replicated ones alike on every rank)."""

    def __init__(self, index: int, tp: int, rank: int, experts: int, inter: int, device):
        super().__init__()
        self.tp, self.rank = tp, rank
        self.local_experts = experts // tp
        bf16 = torch.bfloat16

        def rand(shape, seed, scale, dtype=bf16):
            g = torch.Generator(device=device).manual_seed(seed)
            return nn.Parameter((torch.randn(shape, generator=g, device=device) * scale).to(dtype),
                                requires_grad=False)

        base = 100_000 * (index + 1)
        mine = base + 10_000 * (rank + 1)  # this rank's shards
        # mHC mix parameters (replicated): logits of O(1) on unit-RMS streams.
        self.attn_fn = rand((MIX, HC * H), base + 1, 0.5 / (HC * H) ** 0.5, torch.float32)
        self.ffn_fn = rand((MIX, HC * H), base + 2, 0.5 / (HC * H) ** 0.5, torch.float32)
        self.attn_scale = rand((3,), base + 3, 0.2, torch.float32)
        self.ffn_scale = rand((3,), base + 4, 0.2, torch.float32)
        with torch.no_grad():
            self.attn_scale += 1.0
            self.ffn_scale += 1.0
        self.attn_base = rand((MIX,), base + 5, 0.5, torch.float32)
        self.ffn_base = rand((MIX,), base + 6, 0.5, torch.float32)
        self.attn_norm = rand((H,), base + 7, 0.1)
        self.ffn_norm = rand((H,), base + 8, 0.1)
        with torch.no_grad():
            self.attn_norm += 1.0
            self.ffn_norm += 1.0
        # Attention stand-in (this rank's shards): column-parallel in, row-parallel out.
        self.wqkv = rand((H, H // tp), mine + 1, H ** -0.5)
        self.wo = rand((H // tp, H), mine + 2, H ** -0.5)
        # MoE stand-in: router (replicated), this rank's experts, the shared expert's shards.
        self.gate = rand((H, experts), base + 9, H ** -0.5, torch.float32)
        self.w13 = nn.Parameter(torch.cat(
            [rand((1, H, 2 * inter), base + 1000 + 10 * e, H ** -0.5).data
             for e in range(rank, experts, tp)]), requires_grad=False)
        self.w2 = nn.Parameter(torch.cat(
            [rand((1, inter, H), base + 1001 + 10 * e, inter ** -0.5).data
             for e in range(rank, experts, tp)]), requires_grad=False)
        self.s13 = rand((H, 2 * inter // tp), mine + 3, H ** -0.5)
        self.s2 = rand((inter // tp, H), mine + 4, inter ** -0.5)

    def attention(self, li):
        """[M, H] BF16 layer input -> this rank's [M, H] BF16 partial output."""
        return (li @ self.wqkv) @ self.wo

    def moe(self, li):
        """The finalize inputs of this rank: GEMM2 rows [local experts * M, H] (expert-major),
        routing weights [M, top_k] FP32 (scaled), routes [M, top_k] int32, shared [M, H] BF16."""
        m = li.shape[0]
        scores = torch.sigmoid(li.float() @ self.gate)
        weights, experts = torch.topk(scores, TOP_K, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True) * ROUTED_SCALE
        gate_up = torch.matmul(li.unsqueeze(0), self.w13)            # [El, M, 2I]
        g, u = gate_up.chunk(2, dim=-1)
        gemm2 = torch.matmul(F.silu(g) * u, self.w2).reshape(self.local_experts * m, H)
        tokens = torch.arange(m, device=li.device, dtype=torch.int64)[:, None]
        routes = torch.where(experts % self.tp == self.rank, (experts // self.tp) * m + tokens,
                             torch.full_like(experts, -1)).to(torch.int32)
        sg, su = (li @ self.s13).chunk(2, dim=-1)
        shared = (F.silu(sg) * su) @ self.s2
        return gemm2, weights, routes, shared


class FusedBoundary:
    """The boundaries through mhccl.AllReduceMHC. Until its calls are registered torch ops,
    Dynamo cannot trace into the extension: the calls then run as explicit graph breaks
    (torch.compiler.disable), eagerly on the current stream, which CUDA-graph capture records."""

    name = "mhccl"

    def __init__(self, op, traceable: bool):
        self.call_fn = op.__call__ if traceable else torch.compiler.disable(op.__call__)
        self.finalize_fn = op.finalize if traceable else torch.compiler.disable(op.finalize)

    def call(self, x, streams, post, comb, pre, norm_weight):
        return self.call_fn(x, streams, post, comb, pre, norm_weight, EPS)

    def finalize(self, gemm2, weights, routes, shared, streams, post, comb, pre, norm_weight):
        return self.finalize_fn(gemm2, weights, routes, shared, streams, post, comb, pre,
                                norm_weight, EPS)


class UnfusedBoundary:
    """torch.distributed.all_reduce (TP > 1) + the PyTorch epilogue."""

    name = "unfused"

    def __init__(self, tp: int):
        self.tp = tp
        self.all_reduce = torch.compiler.disable(nccl_all_reduce)

    def call(self, x, streams, post, comb, pre, norm_weight):
        if self.tp > 1:
            x = self.all_reduce(x)
        return mhc_epilogue(x, streams, post, comb, pre, norm_weight)

    def finalize(self, gemm2, weights, routes, shared, streams, post, comb, pre, norm_weight):
        x = moe_finalize_x(gemm2, weights, routes, shared)
        if self.tp > 1:
            x = self.all_reduce(x)
        return mhc_epilogue(x, streams, post, comb, pre, norm_weight)


class DecodeStep(nn.Module if nn is not None else object):
    """L layers of a decode step: (streams [M, hc, H], layer input [M, H]) -> the same after L."""

    def __init__(self, layers, final_norm, boundary):
        super().__init__()
        self.layers = layers
        self.final_norm = final_norm
        self.boundary = boundary

    def forward(self, streams, li):
        n = len(self.layers)
        for i in range(n):
            layer = self.layers[i]
            pre, post, comb = hc_mixes(streams, layer.attn_fn, layer.attn_scale, layer.attn_base)
            x = layer.attention(li)
            streams, li = self.boundary.call(x, streams, post, comb, pre, layer.ffn_norm)
            pre, post, comb = hc_mixes(streams, layer.ffn_fn, layer.ffn_scale, layer.ffn_base)
            gemm2, weights, routes, shared = layer.moe(li)
            nxt = self.layers[i + 1].attn_norm if i + 1 < n else self.final_norm
            streams, li = self.boundary.finalize(gemm2, weights, routes, shared, streams, post,
                                                 comb, pre, nxt)
        return streams, li


# --------------------------------------------------------------------------------------------

def ulp_diff(a, b):
    """|a - b| in BF16 ulps (+0 and -0 alike)."""
    def keys(t):
        k = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(k < 0, -(k & 0x7FFF), k)
    return (keys(a) - keys(b)).abs()


def compare(a, b):
    """(fraction of bit-identical elements, max ulp difference, relative RMS difference, fraction
    of tokens whose rows differ by less than 5% RMS)."""
    same = (a.view(torch.int16) == b.view(torch.int16)).float().mean().item()
    ulp = ulp_diff(a, b).max().item()
    d, r = (a.float() - b.float()).flatten(1), b.float().flatten(1)
    rel = (d.pow(2).mean().sqrt() / r.pow(2).mean().sqrt().clamp(min=1e-30)).item()
    rows = d.pow(2).mean(1).sqrt() / r.pow(2).mean(1).sqrt().clamp(min=1e-30)
    return same, ulp, rel, (rows < 0.05).float().mean().item()


def kernel_profile(run, steps: int):
    """The GPU kernels of ``steps`` calls of ``run`` (torch.profiler, CUDA activity; kernels
    inside CUDA-graph replays included): rows (us per step, launches per step, name), the most
    time first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if t > 0 and e.count > 0:
            rows.append((t / steps, e.count / steps, e.key))
    rows.sort(reverse=True)
    return rows


def print_profile(say, m: int, name: str, rows, top: int = 14) -> dict:
    """One model's kernels per decode step; returns the summary for the JSON row."""
    launches, busy = sum(r[1] for r in rows), sum(r[0] for r in rows)
    say(f"  M={m} {name}: {launches:.0f} kernel launches a step, {busy:.1f} us of kernel time "
        "(the kernels, most time first: us a step, launches a step, name)")
    for us, n, key in rows[:top]:
        say(f"    {us:8.1f} {n:5.0f}  {key[:100]}")
    if len(rows) > top:
        rest = rows[top:]
        say(f"    {sum(r[0] for r in rest):8.1f} {sum(r[1] for r in rest):5.0f}  "
            f"({len(rest)} other kernels)")
    return {"launches": launches, "kernel_us": busy,
            "kernels": [{"us": us, "launches": n, "name": key} for us, n, key in rows]}


def dynamo_stats() -> str:
    """Dynamo's graphs and graph breaks so far (both models together)."""
    try:
        from torch._dynamo.utils import counters

        return (f"Dynamo so far: {counters['stats']['unique_graphs']} graphs, "
                f"{sum(counters['graph_break'].values())} graph breaks")
    except Exception:  # noqa: BLE001
        return "Dynamo's counters not readable"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",") if v], default=[1, 8, 64, 256],
                   help="comma list of decode batch sizes M (default 1,8,64,256)")
    p.add_argument("--check-only", action="store_true", help="check, do not time")
    p.add_argument("--profile", action="store_true",
                   help="after timing, list each model's GPU kernels per decode step "
                        "(torch.profiler over graph replays): where the two steps' time goes")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    p.add_argument("--experts", type=int, default=8, help="routed experts of the MoE stand-in (default 8)")
    p.add_argument("--moe-inter", type=int, default=512,
                   help="intermediate size of each expert and of the shared expert (default 512)")
    p.add_argument("--replays", type=int, default=10, help="graph replays per timed repeat")
    p.add_argument("--repeats", type=int, default=11, help="timed repeats (the median is printed)")
    p.add_argument("--eager-roundings", action="store_true",
                   help="compile both models with the Inductor options emulate_precision_casts=True "
                        "and pattern_matcher=False, which keep the BF16 roundings of intermediates "
                        "that a fused kernel reuses (the collapse, finalize's x); Inductor's "
                        "defaults compute them in FP32")
    p.add_argument("--min-identical", type=float, default=0.5,
                   help="least fraction of bit-identical stream elements after L layers to call "
                        "the models in agreement (default 0.5; the fraction is the measurement)")
    a = p.parse_args()
    if a.layers < 1 or not a.tokens or any(m < 1 for m in a.tokens):
        die("--layers and every --tokens value must be >= 1")
    if a.experts < TOP_K or a.moe_inter < 1 or a.replays < 1 or a.repeats < 1:
        die(f"--experts must be >= {TOP_K}; --moe-inter, --replays, --repeats >= 1")
    return a


def main():
    args = parse_args()
    if torch is None:
        die("needs PyTorch (import torch failed)")
    if not torch.cuda.is_available():
        die("no CUDA device (torch.cuda.is_available() is False): this example runs on GPUs")
    try:
        import mhccl
    except ImportError as e:
        die(f"cannot import mhccl ({e}): pip install . first, or put it on PYTHONPATH")
    import torch.distributed as dist

    t0 = time.time()
    tp = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.device_count() <= local_rank:
        die(f"local rank {local_rank} needs GPU {local_rank}; {torch.cuda.device_count()} visible")
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = 0
    if tp > 1:
        try:
            dist.init_process_group("nccl", device_id=device)
        except TypeError:
            dist.init_process_group("nccl")
        rank = dist.get_rank()
    if H % tp or args.experts % tp or args.moe_inter % tp:
        die(f"H, --experts and --moe-inter must be multiples of TP={tp}")

    def say(*a, **kw):
        if rank == 0:
            print(*a, **kw, flush=True)

    def all_ok(ok: bool) -> bool:
        if tp == 1:
            return ok
        t = torch.tensor([0.0 if ok else 1.0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item() == 0.0

    def sync_ranks():
        torch.cuda.synchronize()
        if tp > 1:
            dist.barrier()
            dist.all_reduce(torch.zeros(1, device=device))

    # Dynamo recompiles the loop's resume functions per layer and per shape class: room for all.
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 1024))

    ms = sorted(set(args.tokens))
    commit = os.environ.get("MHCCL_COMMIT", "unknown")
    say(f"DSV4.1 decode step: {args.layers} layers, TP={tp}, H={H}, hc={HC}, top_k={TOP_K} of "
        f"{args.experts} experts (inter {args.moe_inter}), M={ms}; "
        f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, mhccl commit {commit}")
    layers = nn.ModuleList(Layer(i, tp, rank, args.experts, args.moe_inter, device)
                           for i in range(args.layers))
    g = torch.Generator(device=device).manual_seed(7)
    final_norm = nn.Parameter((1 + 0.1 * torch.randn(H, generator=g, device=device)).to(torch.bfloat16),
                              requires_grad=False)
    op = mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=max(ms), top_k=TOP_K,
                            device=device)
    # mhccl's calls as registered torch ops (when the package registers them) are traced into
    # the compiled graph; otherwise they are graph breaks.
    traceable = any(n.startswith("mhccl::") for n in torch._C._dispatch_get_all_op_names())
    models = {
        "mhccl": DecodeStep(layers, final_norm, FusedBoundary(op, traceable)),
        "unfused": DecodeStep(layers, final_norm, UnfusedBoundary(tp)),
    }
    options = {"emulate_precision_casts": True, "pattern_matcher": False} if args.eager_roundings else {}
    compiled = {name: torch.compile(model, options=options) for name, model in models.items()}
    say(f"[{time.time() - t0:.0f}s] built; mhccl's calls are "
        f"{'torch ops (traced into the graph)' if traceable else 'graph breaks (not registered as torch ops)'}")

    def state(m: int, seed: int):
        """A decode state: streams [m, hc, H] and its layer input for layer 0 (replicated)."""
        g = torch.Generator(device=device).manual_seed(seed)
        streams = torch.randn(m, HC, H, generator=g, device=device).to(torch.bfloat16)
        pre = torch.sigmoid(torch.randn(m, HC, generator=g, device=device)) + HC_EPS
        return streams, collapse_norm(streams, pre, layers[0].attn_norm)

    results, status = [], 0
    with torch.no_grad():
        for m in ms:
            row = {"m": m}
            graphs, outs, statics = {}, {}, {}
            for name, fn in compiled.items():
                try:
                    tc = time.time()
                    s0, l0 = state(m, 1000 + m)
                    # Eager runs of the compiled step on a side stream (compiles, autotunes and
                    # allocates there), then a capture of one step into a CUDA graph.
                    side = torch.cuda.Stream(device)
                    side.wait_stream(torch.cuda.current_stream(device))
                    with torch.cuda.stream(side):
                        for _ in range(2):
                            fn(s0, l0)
                    torch.cuda.current_stream(device).wait_stream(side)
                    sync_ranks()
                    s_in, l_in = s0.clone(), l0.clone()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                        s_out, l_out = fn(s_in, l_in)
                    # Replay with a new state copied into the static inputs; the compiled step run
                    # directly on that state must give the same bits.
                    s1, l1 = state(m, 2000 + m)
                    s_in.copy_(s1)
                    l_in.copy_(l1)
                    sync_ranks()
                    graph.replay()
                    want_s, want_l = fn(s1, l1)
                    torch.cuda.synchronize()
                    same_graph = torch.equal(s_out, want_s) and torch.equal(l_out, want_l)
                    graphs[name], statics[name] = graph, (s_in, l_in)
                    outs[name] = (s_out.clone(), l_out.clone())
                    row[f"{name}_graph_equals_compiled"] = same_graph
                    err = None if same_graph else "graph replay differs from the compiled step"
                    say(f"[{time.time() - t0:.0f}s] M={m} {name}: compiled and captured in "
                        f"{time.time() - tc:.1f}s; graph replay {'==' if same_graph else '!='} "
                        f"compiled step; {dynamo_stats()}")
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {e}"
                    import traceback

                    traceback.print_exc()
                if not all_ok(err is None):
                    say(f"  M={m} {name}: FAILED: {err or 'on another rank'}")
                    status = 1
                    graphs.pop(name, None)
                    outs.pop(name, None)
            if "mhccl" in outs and "unfused" in outs:
                (fs, fl), (us, ul) = outs["mhccl"], outs["unfused"]
                ss, su, sr, st = compare(fs, us)
                ls, lu, lr, lt = compare(fl, ul)
                # Where the two round an element differently, the difference flows through the
                # later layers' mixes, and now and then flips a token's expert choice (an O(1)
                # difference for that token). A wrong boundary would differ in every token.
                verdict = ("AGREE" if ss >= args.min_identical else
                           "CLOSE" if st >= 0.5 else "DIFFER")
                row.update(streams_identical=ss, streams_max_ulp=su, streams_rel_rms=sr,
                           streams_tokens_close=st, layer_input_identical=ls,
                           layer_input_max_ulp=lu, layer_input_rel_rms=lr,
                           layer_input_tokens_close=lt, verdict=verdict)
                say(f"  M={m} after {args.layers} layers, mhccl vs unfused: {verdict}: streams "
                    f"{ss:.6f} bit-identical (max {su} ulp; relative RMS difference {sr:.2e}; "
                    f"{st:.3f} of the tokens within 5%), layer input {ls:.6f} bit-identical "
                    f"(max {lu} ulp, {lr:.2e}, {lt:.3f})")
            if not args.check_only:
                for name, graph in graphs.items():
                    try:
                        e0 = torch.cuda.Event(enable_timing=True)
                        e1 = torch.cuda.Event(enable_timing=True)
                        samples = []
                        for _ in range(3):
                            graph.replay()
                        for _ in range(args.repeats):
                            sync_ranks()
                            e0.record()
                            for _ in range(args.replays):
                                graph.replay()
                            e1.record()
                            e1.synchronize()
                            samples.append(e0.elapsed_time(e1) * 1000.0 / args.replays)
                        samples.sort()
                        step_us = samples[len(samples) // 2]
                        if tp > 1:
                            t = torch.tensor([step_us], dtype=torch.float64, device=device)
                            dist.all_reduce(t, op=dist.ReduceOp.MAX)
                            step_us = t.item()
                        row[f"{name}_us"] = step_us
                    except Exception as e:  # noqa: BLE001
                        say(f"  M={m} {name}: timing failed: {type(e).__name__}: {e}")
                        status = 1
                if args.profile:
                    for name, graph in graphs.items():
                        try:
                            rows = kernel_profile(graph.replay, args.replays)
                            row[f"{name}_profile"] = print_profile(say, m, name, rows)
                        except Exception as e:  # noqa: BLE001
                            say(f"  M={m} {name}: profile failed: {type(e).__name__}: {e}")
                if "mhccl_us" in row and "unfused_us" in row:
                    say(f"  M={m} decode step ({args.layers} layers): mhccl {row['mhccl_us']:.1f} us, "
                        f"unfused {row['unfused_us']:.1f} us ({row['unfused_us'] / row['mhccl_us']:.2f}x)")
            results.append(row)
            del graphs, statics, outs
            torch.cuda.synchronize()

    if not args.check_only and rank == 0:
        say(f"\ndecode step, TP={tp}, {args.layers} layers: median us (CUDA-graph replays)")
        say(f"  {'M':>5} {'mhccl':>10} {'unfused':>10} {'speedup':>8}")
        for r in results:
            a, b = r.get("mhccl_us"), r.get("unfused_us")
            cells = [f"{v:.1f}" if v is not None else "-" for v in (a, b)]
            cells.append(f"{b / a:.2f}x" if a and b else "-")
            say(f"  {r['m']:>5} {cells[0]:>10} {cells[1]:>10} {cells[2]:>8}")
    if args.json and rank == 0:
        doc = {"op": "decode_step", "tp": tp, "layers": args.layers, "hidden": H, "hc": HC,
               "top_k": TOP_K, "experts": args.experts, "moe_inter": args.moe_inter,
               "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
               "commit": commit, "mhccl_traced": traceable,
               "compile_options": options,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "rows": results}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        say(f"wrote {args.json}")
    say(f"[{time.time() - t0:.0f}s] {'done' if status == 0 else 'done, with failures'}")
    if tp > 1:
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    sys.exit(status)


if __name__ == "__main__":
    main()
