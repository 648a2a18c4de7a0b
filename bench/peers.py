#!/usr/bin/env python3
"""mhccl's fused sublayer boundary against what a PyTorch user would run instead, in one run.

    python bench/peers.py --check --json peers.json --plot peers.png                 # TP=1
    torchrun --nproc-per-node 2 bench/peers.py --check --json peers-tp2.json ...     # TP=2

Implementations, each at M = 1, 2, 4, ..., 4096 rows (H = 5120, hc = 4, top_k = 6):

- ``mhccl``: ``AllReduceMHC.__call__`` and ``finalize``, plain, with the MXFP8 layer input
  (``mxfp8``) and with the per-token-group FP8 layer input (``fp8``, a second instance built
  with ``quantize_layer_input_fp8``).
- ``mhccl+torch_compile_quant`` (variant ``fp8``): mhccl's plain call, then the per-token-group
  FP8 quantization of its BF16 layer input in PyTorch through ``torch.compile``, written as
  vLLM's ``per_token_group_quant_fp8(x, 128, column_major_scales=True)`` computes it: the
  separate step the fused ``fp8`` variant saves.
- ``torch_eager``: the unfused epilogue in eager PyTorch, written with broadcasts
  (streams = post * y + sum_s comb[s, t] * residual[s], the collapse with pre rounded to BF16,
  RMSNorm in FP32); finalize first reduces its top-k GEMM2 rows and adds the shared expert in
  FP32, rounded once.
- ``torch_compile``: the same functions through ``torch.compile`` (Inductor fuses the
  broadcasts; an einsum formulation it would leave as a batched GEMM); its ``fp8`` variant
  compiles the epilogue and the FP8 quantization as one function.
- TP >= 2: ``nccl+torch_eager`` and ``nccl+torch_compile`` (``torch.distributed.all_reduce`` of
  the BF16 partial, then the epilogue), ``symm_mem_one_shot+torch_compile``
  (``torch.ops.symm_mem.one_shot_all_reduce`` of a symmetric-memory buffer: peer loads, no
  multicast), and ``flashinfer_ar_rmsnorm`` (FlashInfer's fused all-reduce + residual add +
  RMSNorm, which is hc = 1 math: a reference point, not the same work) where
  ``import flashinfer`` works.

Timing as mhccl-bench's: a CUDA graph of ``--calls-per-graph`` calls over ``--sets`` rotating
input sets, ``--launches`` graph launches per timed repeat between CUDA events, the median of
``--repeats`` after ``--warmup`` launches, the slowest rank's median. ``--check`` first compares
mhccl with SPEC.md's arithmetic (streams bit-exact, layer input within 1 ulp of FP64 from the
BF16 collapse, the fp8 build's values and scales bit-identical to the PyTorch quantization of
its layer input, the compiled separate quantization's to that of the plain one: PASS or FAIL) and with the eager and compiled PyTorch
paths (the fraction of bit-identical streams, the layer input's ulps) at every M. ``--json``
writes the rows (mhccl-bench's fields, plus ``impl``), ``--plot`` a log-log PNG of latency
against M, one line per implementation and variant.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback

try:
    import torch
except ImportError:  # reported by main(), so that --help works anywhere
    torch = None

H, HC, TOP_K, EPS = 5120, 4, 6, 1e-6
DEFAULT_MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
VARIANTS = ("plain", "mxfp8", "fp8")
FP8_GROUP, FP8_MAX, FP8_EPS = 128, 448.0, 1e-10  # SPEC.md, "FP8 layer input for Hopper GEMMs"
SEPARATE_QUANT = "mhccl+torch_compile_quant"  # the baseline of the fp8 rows


def die(msg: str, code: int = 2) -> None:
    print(f"peers.py: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",") if v], default=DEFAULT_MS,
                   help="comma list of M (rows per call); default 1,2,4,...,4096")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON here")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of latency against M here (matplotlib)")
    p.add_argument("--check", action="store_true",
                   help="check mhccl against SPEC.md's arithmetic and the PyTorch paths first")
    p.add_argument("--check-only", action="store_true", help="--check, then exit without timing")
    p.add_argument("--impls", default="",
                   help="comma list of implementations to time (default: all that apply here)")
    p.add_argument("--ops", default="call,finalize", help="comma list of call, finalize")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma list of plain, mxfp8, fp8 to time and check (default: all; "
                        "--check checks plain always, the others against it; the fp8 table's "
                        "'extra over plain' needs plain timed)")
    p.add_argument("--fp8-ue8m0", action="store_true",
                   help="fp8: power-of-two (UE8M0) scales, s = 2^ceil(log2(s)), in the fused "
                        "build and the PyTorch quantization alike (default: FP32 scales)")
    p.add_argument("--calls-per-graph", type=int, default=20)
    p.add_argument("--launches", type=int, default=5, help="graph launches per timed repeat")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sets", type=int, default=4, help="rotating input sets")
    p.add_argument("--static-compile", action="store_true",
                   help="torch.compile(dynamic=False): one compile per M (default: PyTorch's "
                        "automatic dynamic shapes: M = 1 specialized, one compile for the rest)")
    p.add_argument("--eager-roundings", action="store_true",
                   help="compile with the Inductor options emulate_precision_casts=True and "
                        "pattern_matcher=False, which keep the BF16 roundings of intermediates "
                        "that a fused kernel reuses (the collapse, finalize's x); Inductor's "
                        "defaults (what a user gets) compute them in FP32")
    p.add_argument("--min-identical", type=float, default=0.99,
                   help="--check: least fraction of stream elements bit-identical to a PyTorch "
                        "path's to call them in agreement (default 0.99)")
    args = p.parse_args()
    args.check = args.check or args.check_only
    if not args.tokens or any(m < 1 for m in args.tokens):
        die("--tokens: a comma list of M >= 1")
    args.ops = [o for o in args.ops.split(",") if o]
    if not args.ops or any(o not in ("call", "finalize") for o in args.ops):
        die(f"--ops: expected call and/or finalize, got {args.ops}")
    args.variants = [v for v in args.variants.split(",") if v]
    if not args.variants or any(v not in VARIANTS for v in args.variants):
        die(f"--variants: expected some of {', '.join(VARIANTS)}, got {args.variants}")
    if min(args.calls_per_graph, args.launches, args.repeats, args.sets) < 1 or args.warmup < 0:
        die("--calls-per-graph, --launches, --repeats and --sets must be >= 1, --warmup >= 0")
    return args


# --------------------------------------------------------------------------------------------
# The unfused PyTorch formulation (what an engine writes without mhccl): plain functions of
# tensors, compiled or not.

def mhc_epilogue(y, residual, post, comb, pre, norm_weight, eps: float):
    """Post-mix into the hc streams, collapse with the carried pre (rounded to BF16), RMSNorm in
    FP32; as broadcasts. y [M,H] BF16 (the all-reduced partial), residual [M,hc,H] BF16,
    post/pre [M,hc] FP32, comb [M,hc,hc] FP32 indexed [source, target], norm_weight [H] BF16."""
    bf16 = torch.bfloat16
    streams = (post[..., None] * y[:, None, :].float()
               + (comb[..., None] * residual[:, :, None, :].float()).sum(1)).to(bf16)
    p = (pre[..., None] * streams.float()).sum(1).to(bf16).float()
    layer_input = p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    return streams, layer_input.to(bf16)


def moe_finalize_x(gemm2, weights, routes, shared):
    """This rank's MoE output: sum_k w_k * gemm2[route_k] over the valid routes (-1 skipped, as a
    zero weight) + the shared expert, in FP32, rounded once to BF16."""
    w = torch.where(routes >= 0, weights, torch.zeros_like(weights))
    rows = gemm2[routes.clamp(min=0).long()].float()                    # [M, top_k, H]
    return ((w[..., None] * rows).sum(1) + shared.float()).to(torch.bfloat16)


def finalize_epilogue(gemm2, weights, routes, shared, residual, post, comb, pre, norm_weight,
                      eps: float):
    """TP=1 finalize: the MoE reduction and the epilogue, one function (one compile)."""
    return mhc_epilogue(moe_finalize_x(gemm2, weights, routes, shared), residual, post, comb, pre,
                        norm_weight, eps)


def compile_options(args) -> dict:
    """Inductor options of the compiled epilogue. With its defaults Inductor keeps a fused
    kernel's BF16 intermediates in FP32 (a pattern pass folds x.to(bf16).float() into x, and its
    Triton code computes BF16 values in FP32); --eager-roundings keeps the roundings the code
    asks for (and turns off Triton's FMA contraction with them)."""
    if not args.eager_roundings:
        return {}
    return {"emulate_precision_casts": True, "pattern_matcher": False}


def ue8m0_scales(s):
    """2^ceil(log2(s)) of positive normal (or +Inf) FP32 scales, exactly, from their bits: a
    power of two stays, any other value carries into the exponent. Integer arithmetic, so that
    no compiler's exp2 or log2 can round it otherwise."""
    return ((s.view(torch.int32) + 0x007FFFFF) & 0x7F800000).view(torch.float32)


def quantize_fp8_groups(layer_input, fp8_max, values, scales, ue8m0: bool):
    """Per-token-group FP8 of layer_input ([M, H] BF16): the arithmetic of vLLM's
    ``per_token_group_quant_fp8(layer_input, 128, column_major_scales=True, use_ue8m0=ue8m0)``
    with SPEC.md's correctly rounded FP32 divisions. Per group of 128 consecutive elements of a
    row, s = max(amax in FP32, 1e-10) / 448 (with ue8m0 2^ceil(log2(s))), values = E4M3(x / s
    clamped to +-448). Writes values ([M, H] float8_e4m3fn) and scales (the MN-major TMA-aligned
    [M, G] view with strides (1, Mp) of mhccl.empty_fp8_group_scales; the padding rows left as
    they are, as vLLM leaves those of its empty_strided buffer).

    fp8_max is 448 as a one-element FP32 tensor on the device: on GPUs Inductor replaces a
    division by a constant with a multiplication by its reciprocal, which rounds otherwise."""
    m, h = layer_input.shape
    groups = layer_input.float().view(m, h // FP8_GROUP, FP8_GROUP)
    s = groups.abs().amax(-1).clamp(min=FP8_EPS) / fp8_max
    if ue8m0:
        s = ue8m0_scales(s)
    q = (groups / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    values.copy_(q.view(m, h))
    scales.copy_(s)


def mhc_epilogue_fp8(y, residual, post, comb, pre, norm_weight, eps: float, fp8_max, values,
                     scales, ue8m0: bool):
    """mhc_epilogue, then quantize_fp8_groups of its layer input: one function, one compile."""
    streams, layer_input = mhc_epilogue(y, residual, post, comb, pre, norm_weight, eps)
    quantize_fp8_groups(layer_input, fp8_max, values, scales, ue8m0)
    return streams, layer_input


def finalize_epilogue_fp8(gemm2, weights, routes, shared, residual, post, comb, pre, norm_weight,
                          eps: float, fp8_max, values, scales, ue8m0: bool):
    """finalize_epilogue, then quantize_fp8_groups of its layer input: one function, one
    compile."""
    streams, layer_input = finalize_epilogue(gemm2, weights, routes, shared, residual, post, comb,
                                             pre, norm_weight, eps)
    quantize_fp8_groups(layer_input, fp8_max, values, scales, ue8m0)
    return streams, layer_input


def fp8_compile_options(args) -> dict:
    """Inductor options of the compiled FP8 quantization: compile_options plus correctly
    rounded FP32 division (eager PyTorch's, SPEC.md's and the fused kernel's). Inductor's Triton
    code divides approximately otherwise (div.full), and the scales and values would differ from
    the rule's in the last bits."""
    import torch._inductor.config as inductor_config

    if not hasattr(getattr(inductor_config, "eager_numerics", None), "division_rounding"):
        raise RuntimeError("this PyTorch's Inductor has no eager_numerics.division_rounding "
                           "option (the correctly rounded division the FP8 rule needs)")
    return {**compile_options(args), "eager_numerics.division_rounding": True}


def compile_kwargs(args) -> dict:
    """torch.compile's dynamic= argument: --static-compile compiles once per M."""
    return {"dynamic": False} if args.static_compile else {}


# --------------------------------------------------------------------------------------------

class Ctx:
    """Process group, device, printing (rank 0), timing."""

    def __init__(self, args):
        import torch.distributed as dist

        self.args, self.dist = args, dist
        self.tp = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.device_count() <= self.local_rank:
            die(f"local rank {self.local_rank} needs GPU {self.local_rank}; "
                f"{torch.cuda.device_count()} visible")
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        self.rank = 0
        if self.tp > 1:
            try:
                dist.init_process_group("nccl", device_id=self.device)
            except TypeError:  # a PyTorch without device_id
                dist.init_process_group("nccl")
            self.rank = dist.get_rank()
        self._sync = torch.zeros(1, device=self.device)

    def say(self, *a, **kw):
        if self.rank == 0:
            print(*a, **kw, flush=True)

    def barrier(self):
        if self.tp > 1:
            self.dist.barrier()
            self.dist.all_reduce(self._sync)  # on the stream: the timed launches start together

    def max_over_ranks(self, v: float) -> float:
        if self.tp == 1:
            return v
        t = torch.tensor([v], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def all_ok(self, ok: bool) -> bool:
        """Whether ok holds on every rank (a failure on one rank skips the implementation on
        all of them, so that no rank waits alone in a collective)."""
        if self.tp == 1:
            return ok
        t = torch.tensor([0.0 if ok else 1.0], device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item()) == 0.0

    def time_calls(self, enqueue) -> float:
        """Median us per call of enqueue(i) over CUDA-graph replays (call i uses input set
        i % sets); the slowest rank's median."""
        a = self.args
        for i in range(min(a.sets, a.calls_per_graph)):  # eager first: compiles, autotuning,
            enqueue(i)                                    # first-use allocations, NCCL setup
        torch.cuda.synchronize()
        self.barrier()
        graph = torch.cuda.CUDAGraph()
        # thread-local capture mode, as mhccl-bench captures: other threads (NCCL's watchdog,
        # compile workers) may call CUDA meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for i in range(a.calls_per_graph):
                enqueue(i)
        torch.cuda.synchronize()
        for _ in range(a.warmup):
            self.barrier()
            graph.replay()
            torch.cuda.synchronize()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(a.repeats):
            self.barrier()
            e0.record()
            for _ in range(a.launches):
                graph.replay()
            e1.record()
            e1.synchronize()
            samples.append(e0.elapsed_time(e1) * 1000.0 / (a.launches * a.calls_per_graph))
        del graph
        samples.sort()
        return self.max_over_ranks(samples[len(samples) // 2])


class Inputs:
    """`sets` rotating input sets of `capacity` rows, sliced to M rows a call. The replicated
    state (residual streams, mixes, norm weight) is the same on every rank; x and the finalize
    inputs are this rank's. Routes and the MXFP8 and FP8 scale buffers exist per (set, M) before
    any capture; the quantized values of both share one buffer a set."""

    def __init__(self, ctx: Ctx, capacity: int, sets: int, ms):
        dev, bf16 = ctx.device, torch.bfloat16
        self.ctx, self.capacity, self.sets = ctx, capacity, sets
        self.data = []
        for s in range(sets):
            g = torch.Generator(device=dev).manual_seed(1000 + s)                   # replicated
            gr = torch.Generator(device=dev).manual_seed(5000 + 97 * s + ctx.rank)  # this rank's
            k = torch.randn(capacity, HC, HC, generator=g, device=dev, dtype=torch.float64).exp()
            for _ in range(20):  # Sinkhorn: rows, then columns, sum to 1
                k = k / k.sum(-1, keepdim=True)
                k = k / k.sum(-2, keepdim=True)
            d = {
                "residual": torch.randn(capacity, HC, H, generator=g, device=dev).to(bf16),
                "post": 2 * torch.sigmoid(torch.randn(capacity, HC, generator=g, device=dev)),
                "pre": torch.sigmoid(torch.randn(capacity, HC, generator=g, device=dev)) + 1e-6,
                "comb": k.float().contiguous(),
                "x": (torch.randn(capacity, H, generator=gr, device=dev) / ctx.tp ** 0.5).to(bf16),
                "gemm2": torch.randn(capacity * TOP_K, H, generator=gr, device=dev).to(bf16),
                "weights": torch.rand(capacity, TOP_K, generator=gr, device=dev) / TOP_K,
                "shared": (0.5 * torch.randn(capacity, H, generator=gr, device=dev)).to(bf16),
                "values": torch.empty(capacity, H, dtype=torch.float8_e4m3fn, device=dev),
            }
            # The NCCL path's all_reduce works in place: its own copy of x, which the timed
            # calls keep reducing (values grow; the kernels' speed does not depend on them).
            d["x_inplace"] = d["x"].clone()
            d["routes"] = {}
            for m in ms:
                # a random permutation of the m * top_k GEMM2 rows, a third of the routes -1
                # (experts held by another rank), as mhccl-bench's data
                r = torch.randperm(m * TOP_K, generator=gr, device=dev).view(m, TOP_K).to(torch.int32)
                r[torch.rand(m, TOP_K, generator=gr, device=dev) < 0.33] = -1
                d["routes"][m] = r.contiguous()
            self.data.append(d)
        g = torch.Generator(device=dev).manual_seed(77)
        self.norm_weight = (1 + 0.3 * torch.randn(H, generator=g, device=dev)).to(bf16)
        self.fp8_max = torch.full((1,), FP8_MAX, device=dev)  # see quantize_fp8_groups
        self.scales, self.fp8_scales = {}, {}
        try:
            import mhccl

            for m in ms:
                self.scales[m] = [torch.zeros(mhccl.mxfp8_scale_bytes(m, H), dtype=torch.uint8,
                                              device=dev) for _ in range(sets)]
                self.fp8_scales[m] = [mhccl.empty_fp8_group_scales(m, H, dev) for _ in range(sets)]
        except ImportError:
            pass

    def call_args(self, s: int, m: int):
        d = self.data[s]
        return (d["x"][:m], d["residual"][:m], d["post"][:m], d["comb"][:m], d["pre"][:m],
                self.norm_weight)

    def finalize_args(self, s: int, m: int):
        d = self.data[s]
        return (d["gemm2"][:m * TOP_K], d["weights"][:m], d["routes"][m], d["shared"][:m],
                d["residual"][:m], d["post"][:m], d["comb"][:m], d["pre"][:m], self.norm_weight)

    def mxfp8(self, s: int, m: int):
        return (self.data[s]["values"][:m], self.scales[m][s])

    def fp8(self, s: int, m: int):
        """(values [m, H] float8_e4m3fn, scales: the MN-major [m, G] view of Mp * G floats)."""
        return (self.data[s]["values"][:m], self.fp8_scales[m][s])


# --------------------------------------------------------------------------------------------
# Implementations: run(op, variant, set, m) -> (streams, layer_input); the constructor raises
# with the reason where one cannot run here.

class Mhccl:
    """mhccl's fused boundary: plain and mxfp8 from a build with quantize_layer_input, fp8 from
    a second build with quantize_layer_input_fp8 (the two options exclude each other), made
    where fp8 is among --variants."""

    name = "mhccl"

    def __init__(self, ctx: Ctx, inp: Inputs):
        import mhccl

        self.ctx, self.inp = ctx, inp
        kw = dict(hidden_size=H, hc_mult=HC, max_num_tokens=inp.capacity, top_k=TOP_K,
                  device=ctx.device)
        self.op = mhccl.AllReduceMHC(**kw, quantize_layer_input=True)
        self.variants = ("plain", "mxfp8")
        if "fp8" in ctx.args.variants:
            self.fp8_op = mhccl.AllReduceMHC(**kw, quantize_layer_input_fp8=True,
                                             fp8_ue8m0_scales=ctx.args.fp8_ue8m0)
            self.variants += ("fp8",)

    def protocol(self, op: str, m: int) -> str:
        if self.ctx.tp == 1:
            return "tp1"
        try:
            return self.op.protocol_for(m, op == "finalize")
        except Exception:  # noqa: BLE001
            return "auto"

    def run(self, op, variant, s, m):
        built, out = self.op, {}
        if variant == "mxfp8":
            out = {"mxfp8_out": self.inp.mxfp8(s, m)}
        elif variant == "fp8":
            built, out = self.fp8_op, {"fp8_out": self.inp.fp8(s, m)}
        if op == "call":
            x, res, post, comb, pre, w = self.inp.call_args(s, m)
            return built(x, res, post, comb, pre, w, EPS, **out)
        return built.finalize(*self.inp.finalize_args(s, m), EPS, **out)


class MhcclThenCompiledQuant:
    """The separate quantization an engine runs without the fused FP8 output: mhccl's plain
    call (the BF16 layer input out), then quantize_fp8_groups of it through torch.compile
    (fullgraph, fp8_compile_options) into the same buffers as the fused variant's."""

    name = SEPARATE_QUANT
    variants = ("fp8",)

    def __init__(self, ctx: Ctx, inp: Inputs, fused):
        if fused is None:
            raise RuntimeError("needs the mhccl implementation, which was not built")
        self.ctx, self.inp, self.fused = ctx, inp, fused
        self.quantize = torch.compile(quantize_fp8_groups, fullgraph=True,
                                      options=fp8_compile_options(ctx.args),
                                      **compile_kwargs(ctx.args))

    def protocol(self, op: str, m: int) -> str:
        return self.fused.protocol(op, m)

    def run(self, op, variant, s, m):
        assert variant == "fp8"
        streams, layer_input = self.fused.run(op, "plain", s, m)
        self.quantize(layer_input, self.inp.fp8_max, *self.inp.fp8(s, m), self.ctx.args.fp8_ue8m0)
        return streams, layer_input


class Torch:
    """The unfused path: the partial's all-reduce (none at TP=1, NCCL, or symmetric memory),
    then the PyTorch epilogue, eager or compiled; compiled, also the fp8 variant (the epilogue
    and quantize_fp8_groups compiled as one function) where fp8 is among --variants."""

    def __init__(self, ctx: Ctx, inp: Inputs, compiled: bool, reduce: str):
        self.ctx, self.inp, self.reduce = ctx, inp, reduce
        prefix = {"none": "", "nccl": "nccl+", "symm_mem": "symm_mem_one_shot+"}[reduce]
        self.name = prefix + ("torch_compile" if compiled else "torch_eager")
        self.variants = ("plain",)
        fns = (mhc_epilogue, moe_finalize_x, finalize_epilogue)
        if compiled:
            kw = compile_kwargs(ctx.args)
            fns = tuple(torch.compile(f, options=compile_options(ctx.args), **kw) for f in fns)
            if "fp8" in ctx.args.variants:
                options = fp8_compile_options(ctx.args)
                self.epilogue_fp8, self.finalize_tp1_fp8 = (
                    torch.compile(f, fullgraph=True, options=options, **kw)
                    for f in (mhc_epilogue_fp8, finalize_epilogue_fp8))
                self.variants += ("fp8",)
        self.epilogue, self.finalize_x, self.finalize_tp1 = fns
        if reduce == "symm_mem":
            self._setup_symm_mem()

    def _setup_symm_mem(self):
        import torch.distributed._symmetric_memory as symm_mem

        if os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") != "1":
            raise RuntimeError("TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is not set: symmetric memory "
                               "is not used with multicast possibly on")
        if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
            raise RuntimeError("this PyTorch has no torch.ops.symm_mem.one_shot_all_reduce")
        self.group_name = self.ctx.dist.group.WORLD.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older PyTorch
            try:
                symm_mem.enable_symm_mem_for_group(self.group_name)
            except Exception:  # noqa: BLE001
                pass
        self.copy_op = getattr(torch.ops.symm_mem, "one_shot_all_reduce_copy", None)
        # Symmetric buffers per input set: one holds the call's x (read in place, as an engine's
        # GEMM would write it there); finalize's x is copied into the other by the all-reduce
        # kernel (one_shot_all_reduce_copy), or by a copy first where that op is missing.
        self.sym, self.sym_fin = [], []
        for s in range(self.inp.sets):
            for bufs in (self.sym, self.sym_fin):
                buf = symm_mem.empty((self.inp.capacity, H), dtype=torch.bfloat16, device=self.ctx.device)
                symm_mem.rendezvous(buf, self.group_name)
                bufs.append(buf)
            self.sym[s].copy_(self.inp.data[s]["x"])
        torch.cuda.synchronize()

    def _all_reduce(self, x, s: int, m: int, owned: bool):
        """The BF16 sum over ranks of x ([m, H]); x may be overwritten where owned."""
        if self.reduce == "none":
            return x
        if self.reduce == "nccl":
            if not owned:
                x = x.clone()
            self.ctx.dist.all_reduce(x)
            return x
        if x is None:  # the call: the partial is in the symmetric buffer already
            return torch.ops.symm_mem.one_shot_all_reduce(self.sym[s][:m], "sum", self.group_name)
        if self.copy_op is not None:
            return self.copy_op(self.sym_fin[s][:m], x, "sum", self.group_name)
        self.sym_fin[s][:m].copy_(x)
        return torch.ops.symm_mem.one_shot_all_reduce(self.sym_fin[s][:m], "sum", self.group_name)

    def run(self, op, variant, s, m, exact: bool = False):
        """exact: the NCCL call reduces a copy of the set's x (checks); else the set's own
        in-place buffer (timing: no copy kernel in the measured path). fp8: the quantized layer
        input goes to the set's fp8 buffers."""
        assert variant in self.variants
        fp8 = ((self.inp.fp8_max, *self.inp.fp8(s, m), self.ctx.args.fp8_ue8m0)
               if variant == "fp8" else ())
        epilogue = self.epilogue_fp8 if fp8 else self.epilogue
        if op == "call":
            x, res, post, comb, pre, w = self.inp.call_args(s, m)
            if self.reduce == "symm_mem":
                y = self._all_reduce(None, s, m, owned=False)
            elif self.reduce == "nccl" and not exact:
                y = self._all_reduce(self.inp.data[s]["x_inplace"][:m], s, m, owned=True)
            else:
                y = self._all_reduce(x, s, m, owned=False)
            return epilogue(y, res, post, comb, pre, w, EPS, *fp8)
        gemm2, wts, routes, shared, res, post, comb, pre, w = self.inp.finalize_args(s, m)
        if self.reduce == "none":
            finalize = self.finalize_tp1_fp8 if fp8 else self.finalize_tp1
            return finalize(gemm2, wts, routes, shared, res, post, comb, pre, w, EPS, *fp8)
        y = self._all_reduce(self.finalize_x(gemm2, wts, routes, shared), s, m, owned=True)
        return epilogue(y, res, post, comb, pre, w, EPS, *fp8)


class FlashInferArNorm:
    """FlashInfer's TRT-LLM all-reduce fusion, pattern kARResidualRMSNorm: r = AR(x) + residual
    (one stream), RMSNorm(r). hc = 1 math; no finalize form."""

    name = "flashinfer_ar_rmsnorm"
    variants = ("plain",)

    def __init__(self, ctx: Ctx, inp: Inputs):
        if ctx.tp < 2:
            raise RuntimeError("TP=1: FlashInfer's fused all-reduce needs TP >= 2")
        import flashinfer.comm as fic  # an ImportError is the reason it is skipped

        self.ctx, self.inp, self.fic = ctx, inp, fic
        out = fic.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            ctx.rank, ctx.tp, inp.capacity, H, group=ctx.dist.group.WORLD)
        self.workspace = out[1] if isinstance(out, tuple) else out
        self.res1 = [d["residual"][:, 0].contiguous() for d in inp.data]
        self.res_out = torch.empty(inp.capacity, H, dtype=torch.bfloat16, device=ctx.device)
        self.norm_out = torch.empty_like(self.res_out)

    def run(self, op, variant, s, m):
        fic = self.fic
        fic.trtllm_allreduce_fusion(
            allreduce_in=self.inp.data[s]["x"][:m], world_size=self.ctx.tp, world_rank=self.ctx.rank,
            token_num=m, hidden_dim=H, workspace_ptrs=self.workspace, launch_with_pdl=True,
            use_oneshot=m * H * 2 <= (1 << 20), trigger_completion_at_end=False, fp32_acc=True,
            pattern_code=fic.AllReduceFusionPattern.kARResidualRMSNorm, allreduce_out=None,
            residual_in=self.res1[s][:m], residual_out=self.res_out[:m], norm_out=self.norm_out[:m],
            quant_out=None, scale_out=None, rms_gamma=self.inp.norm_weight, rms_eps=EPS,
            scale_factor=None, layout_code=None)
        return self.res_out[:m], self.norm_out[:m]


# --------------------------------------------------------------------------------------------
# Checks

def ulp_keys(t):
    """BF16 values as integers in the order of the values (+0 and -0 alike)."""
    b = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(b < 0, -(b & 0x7FFF), b)


def ulp_diff(a, b):
    return (ulp_keys(a) - ulp_keys(b)).abs()


def fma32(acc, a, b):
    """fmaf(a, b, acc) elementwise: the FP32 products of these operands are exact in FP64, so
    one FP64 add rounded to FP32 is the fused multiply-add (up to a double rounding ~2^-29 rare)."""
    return (acc.double() + a.double() * b.double()).float()


def spec_reference(ctx: Ctx, inp: Inputs, op: str, s: int, m: int):
    """SPEC.md's arithmetic in PyTorch: every rank's x (finalize: the fmaf chain over the valid
    routes + the shared expert, one rounding), summed in FP32 in rank order and rounded once;
    the streams as fmaf chains from post * y; p = bf16(fmaf chain of pre * streams); the layer
    input in FP64 from p. Returns (streams, layer input in FP64, p)."""
    d = inp.data[s]
    if op == "call":
        x = d["x"][:m]
    else:
        gemm2, wts, routes = d["gemm2"], d["weights"][:m], d["routes"][m]
        acc = torch.zeros(m, H, dtype=torch.float32, device=ctx.device)
        for k in range(TOP_K):
            valid = (routes[:, k] >= 0)[:, None]
            rows = gemm2[routes[:, k].clamp(min=0).long()]
            acc = torch.where(valid, fma32(acc, wts[:, k:k + 1], rows), acc)
        x = (acc + d["shared"][:m].float()).to(torch.bfloat16)
    if ctx.tp > 1:
        parts = [torch.empty_like(x) for _ in range(ctx.tp)]
        ctx.dist.all_gather(parts, x.contiguous())
        y = parts[0].float()
        for r in range(1, ctx.tp):
            y = y + parts[r].float()
        y = y.to(torch.bfloat16)
    else:
        y = x
    res, post, comb, pre = d["residual"][:m], d["post"][:m], d["comb"][:m], d["pre"][:m]
    out = []
    for t in range(HC):
        acc = post[:, t:t + 1] * y.float()
        for src in range(HC):
            acc = fma32(acc, comb[:, src, t:t + 1], res[:, src].float())
        out.append(acc.to(torch.bfloat16))
    streams = torch.stack(out, 1)
    c = pre[:, 0:1] * streams[:, 0].float()
    for t in range(1, HC):
        c = fma32(c, pre[:, t:t + 1], streams[:, t].float())
    p = c.to(torch.bfloat16).double()
    li = p * torch.rsqrt((p * p).mean(-1, keepdim=True) + EPS) * inp.norm_weight.double()
    return streams, li


def bits_differ(a, b) -> int:
    """How many elements of a and b (same shape and dtype, any strides) differ in their bits."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return int((a.view(as_int) != b.view(as_int)).sum().item())


def padded_fp8_scales(scales, m: int):
    """All Mp * G floats under the MN-major [m, G] view of FP8 scales, the padding rows too."""
    import mhccl

    mp = mhccl.fp8_group_scale_rows(m)
    return scales.as_strided((mp * scales.shape[1],), (1,), scales.storage_offset())


def check_fp8(ctx: Ctx, inp: Inputs, fused: Mhccl, separate, op: str, s: int, m: int, streams,
              layer_input):
    """The fp8 build against the plain call's streams and layer_input: its streams identical,
    its layer input within 1 ulp (the RMS sum's FP32 order follows the CTA tiling, which the
    FP8 groups of 16 packs change at some M: at M = 32, 3 CTAs a row of 224 packs instead of
    216; SPEC.md promises the layer input within 1 ulp, not one order), its values and scales
    (every float, the padding rows 0) bit-identical to quantize_fp8_groups of its own layer
    input run eagerly; then the values and the [m, G] scales of separate (the compiled
    quantization of the plain call's layer input; None where it was not built) against
    quantize_fp8_groups of that one. Returns (ok, the report line)."""
    import mhccl

    values, scales = inp.fp8(s, m)
    padded_fp8_scales(scales, m).fill_(float("nan"))  # the kernel writes every float of them
    fp8_streams, fp8_li = fused.run(op, "fp8", s, m)

    def quantized(li):
        want_values = torch.empty_like(values)
        want_scales = mhccl.empty_fp8_group_scales(m, H, ctx.device)
        padded_fp8_scales(want_scales, m).zero_()
        quantize_fp8_groups(li, inp.fp8_max, want_values, want_scales, ctx.args.fp8_ue8m0)
        return want_values, want_scales

    want_values, want_scales = quantized(fp8_li)
    streams_apart = bits_differ(fp8_streams, streams)
    li_apart = bits_differ(fp8_li, layer_input)
    li_ulps = int(ulp_diff(fp8_li, layer_input).max().item())
    as_plain = streams_apart == 0 and li_ulps <= 1
    bad = (bits_differ(values, want_values),
           bits_differ(padded_fp8_scales(scales, m), padded_fp8_scales(want_scales, m)))
    ok = as_plain and bad == (0, 0)

    def verdict(bad_values, bad_scales):
        if bad_values == bad_scales == 0:
            return "bit-identical"
        return f"DIFFER ({bad_values} of {values.numel()} values, {bad_scales} scales)"

    li_words = "identical" if li_apart == 0 else f"{li_apart} elements {li_ulps} ulp apart"
    line = (f"fp8 build: streams {'identical' if streams_apart == 0 else 'DIFFER'}"
            f" and layer input {li_words} (vs the plain build's), values and scales vs PyTorch's "
            f"quantization of its layer input: eager {verdict(*bad)}")
    if separate is None:
        return ok, line + f", {SEPARATE_QUANT} not built"
    separate.run(op, "fp8", s, m)
    want_values, want_scales = quantized(layer_input)
    bad = (bits_differ(values, want_values), bits_differ(scales, want_scales))
    return ok and bad == (0, 0), line + f", {separate.name} {verdict(*bad)}"


def check(ctx: Ctx, inp: Inputs, fused: Mhccl, refs, separate, ms, ops) -> bool:
    """mhccl against SPEC.md's arithmetic (streams bit-exact, layer input within 1 ulp of FP64
    from the BF16 collapse, the MXFP8 build's outputs identical to the plain call's, the fp8
    build's as check_fp8 says, for the variants among --variants: PASS/FAIL), then against each
    unfused PyTorch path in refs (the fraction of bit-identical streams, the layer input's ulps:
    AGREE/DIFFER, a measurement, not a failure)."""
    ctx.say("check: mhccl against SPEC.md's arithmetic, then against "
            + " and ".join(r.name for r in refs) + " (rank 0's numbers; every rank checks its own)")
    variants = ctx.args.variants
    all_ok, disagree = True, set()
    for op in ops:
        for m in ms:
            s = m % inp.sets
            lines, ok = [], False
            try:
                streams, li = fused.run(op, "plain", s, m)
                ss, sli = spec_reference(ctx, inp, op, s, m)
                torch.cuda.synchronize()
                spec_streams = torch.equal(streams.view(torch.int16), ss.view(torch.int16))
                spec_li = ulp_diff(li, sli.to(torch.bfloat16)).max().item()
                line = (f"streams {'bit-exact' if spec_streams else 'DIFFER'}, layer input "
                        f"{spec_li} ulp from FP64")
                passed = spec_streams and spec_li <= 1
                if "mxfp8" in variants:
                    streams_mx, li_mx = fused.run(op, "mxfp8", s, m)
                    # Bits, not values (torch.equal takes -0.0 for +0.0); the MXFP8 bytes
                    # themselves are checked bit-exact by the GPU tests, not here.
                    mx_same = (torch.equal(streams_mx.view(torch.int16), streams.view(torch.int16))
                               and torch.equal(li_mx.view(torch.int16), li.view(torch.int16)))
                    passed = passed and mx_same
                    line += f", mxfp8 build {'identical' if mx_same else 'DIFFERS'}"
                lines.append(line)
                if "fp8" in variants:
                    fp8_ok, fp8_line = check_fp8(ctx, inp, fused, separate, op, s, m, streams, li)
                    passed = passed and fp8_ok
                    lines.append(fp8_line)
                ok = passed
                for ref in refs:
                    rs, rli = ref.run(op, "plain", s, m, exact=True)
                    torch.cuda.synchronize()
                    same = (streams.view(torch.int16) == rs.view(torch.int16)).float().mean().item()
                    s_ulp = ulp_diff(streams, rs).max().item()
                    dli = ulp_diff(li, rli)
                    li_ulp, li_1 = dli.max().item(), (dli <= 1).float().mean().item()
                    agree = same >= ctx.args.min_identical and li_1 >= 0.99
                    if not agree:
                        disagree.add(ref.name)
                    lines.append(f"vs {ref.name}: {'AGREE' if agree else 'DIFFER'}, streams "
                                 f"{same:.6f} bit-identical (max {s_ulp} ulp), layer input max "
                                 f"{li_ulp} ulp ({li_1:.6f} within 1)")
            except Exception as e:  # noqa: BLE001
                lines.append(f"{type(e).__name__}: {e}")
                traceback.print_exc()
            ok = ctx.all_ok(ok)
            all_ok &= ok
            ctx.say(f"  {op:8s} M={m:<5d} {'PASS' if ok else 'FAIL'}: " + "\n                   ".join(lines))
    if disagree:
        ctx.say(f"  DIFFER against {', '.join(sorted(disagree))} is no failure of mhccl: PyTorch "
                "adds in another order, and compiled with Inductor's defaults it does not round "
                "the BF16 intermediates it reuses within a kernel (the collapse, finalize's x; "
                "--eager-roundings asks it to)")
    return all_ok


# --------------------------------------------------------------------------------------------

def plot(rows, path, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"peers.py: no plot ({e})", flush=True)
        return
    ops = [o for o in ("allreduce_mhc.call", "allreduce_mhc.finalize") if any(r["op"] == o for r in rows)]
    if not ops:
        print("peers.py: no rows to plot", flush=True)
        return
    fig, axes = plt.subplots(1, len(ops), figsize=(7 * len(ops), 5.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        lines = {}  # (impl, variant) -> points
        for r in rows:
            if r["op"] == op and r["us_median"] is not None:
                lines.setdefault((r["impl"], r["variant"]), []).append((r["m"], r["us_median"]))
        for (impl, variant), pts in sorted(lines.items()):
            pts.sort()
            label = impl + (f" {variant}" if impl == "mhccl" or variant != "plain" else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if impl == "mhccl" else "--",
                    marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M (rows per call)")
        ax.set_ylabel("us per call (median)")
        ax.set_title(op.replace("allreduce_mhc.", "AllReduceMHC."))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", flush=True)


def print_fp8_table(ctx: Ctx, results, ms, op: str):
    """The fused fp8 variant against mhccl plain and against plain + the separate compiled
    quantization (as PERFORMANCE-HISTORY.md's mhccl-bench FP8 table), then the other
    implementations' fp8 variants."""
    fused = results.get((op, "fp8", "mhccl"), {})
    plain = results.get((op, "plain", "mhccl"), {})
    separate = results.get((op, "fp8", SEPARATE_QUANT), {})
    others = [n for (o, v, n) in results
              if o == op and v == "fp8" and n not in ("mhccl", SEPARATE_QUANT)]
    if not (fused or separate or others):
        return
    ctx.say(f"  {op} fp8 ({'UE8M0' if ctx.args.fp8_ue8m0 else 'FP32'} scales; fused faster by = "
            f"{SEPARATE_QUANT} / mhccl fp8)")
    heads = ["mhccl fp8", "mhccl plain", "extra over plain", SEPARATE_QUANT, "fused faster by"]
    heads += [f"{n} fp8" for n in others]
    widths = [max(len(h), 9) for h in heads]
    ctx.say("    {:>5}".format("M") + "".join(f" {h:>{w}}" for h, w in zip(heads, widths)))
    for m in ms:
        f, p, q = fused.get(m), plain.get(m), separate.get(m)
        cells = [f"{f:.2f}" if f else "-", f"{p:.2f}" if p else "-",
                 f"{f - p:+.2f}" if f and p else "-", f"{q:.2f}" if q else "-",
                 f"{q / f:.2f}x" if f and q else "-"]
        cells += [f"{results[(op, 'fp8', n)][m]:.2f}" if m in results[(op, "fp8", n)] else "-"
                  for n in others]
        ctx.say(f"    {m:>5}" + "".join(f" {c:>{w}}" for c, w in zip(cells, widths)))


def print_tables(ctx: Ctx, results, ms, ops, baseline):
    names = []
    for key in results:
        if key[2] not in names:
            names.append(key[2])
    ctx.say(f"\nTP={ctx.tp}, H={H}, hc={HC}: us per call (median); x = {baseline} / mhccl")
    for op in ops:
        for variant in ("plain", "mxfp8"):
            if (op, variant, "mhccl") not in results and variant == "mxfp8":
                continue
            cols = [n for n in names if (op, variant if n == "mhccl" else "plain", n) in results]
            if not cols:
                continue
            ctx.say(f"  {op} {variant}" + (" (PyTorch columns: their plain epilogue, no MXFP8 "
                                             "quantization)" if variant == "mxfp8" else ""))
            ctx.say("    {:>5}".format("M") + "".join(f" {n:>32}" for n in cols) + "        x")
            for m in ms:
                line = f"    {m:>5}"
                for n in cols:
                    v = results[(op, variant if n == "mhccl" else "plain", n)].get(m)
                    line += f" {v:>32.2f}" if v is not None else f" {'-':>32}"
                ours = results.get((op, variant, "mhccl"), {}).get(m)
                base = results.get((op, "plain", baseline), {}).get(m)
                line += f"   {base / ours:6.2f}" if ours and base else "        -"
                ctx.say(line)
        print_fp8_table(ctx, results, ms, op)


def main():
    args = parse_args()
    if torch is None:
        die("needs PyTorch (import torch failed)")
    if not torch.cuda.is_available():
        die("no CUDA device (torch.cuda.is_available() is False): this benchmark runs on GPUs")
    try:
        import mhccl  # noqa: F401  (here: a clear error before any GPU work)
    except ImportError as e:
        die(f"cannot import mhccl ({e}): pip install . first, or put it on PYTHONPATH")
    t0 = time.time()
    # --static-compile recompiles each function once per M: room for all of them.
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 256))
    ctx = Ctx(args)
    ms = sorted(set(args.tokens))
    props = torch.cuda.get_device_properties(ctx.device)
    commit = os.environ.get("MHCCL_COMMIT", "unknown")
    ctx.say(f"peers.py: TP={ctx.tp} H={H} hc={HC} top_k={TOP_K} M={ms}; {props.name}, torch "
            f"{torch.__version__}, mhccl commit {commit}; {args.calls_per_graph} calls a graph x "
            f"{args.launches} launches, median of {args.repeats}, {args.sets} input sets; "
            f"compile {'static per M' if args.static_compile else 'automatic dynamic'}, options "
            f"{compile_options(args) or 'default'}; variants {','.join(args.variants)}"
            + (f" (fp8: {'UE8M0' if args.fp8_ue8m0 else 'FP32'} scales)"
               if "fp8" in args.variants else ""))
    inp = Inputs(ctx, max(ms), args.sets, ms)
    torch.cuda.synchronize()
    baseline = "torch_compile" if ctx.tp == 1 else "nccl+torch_compile"

    impls = {}
    builders = [("mhccl", lambda: Mhccl(ctx, inp))]
    if "fp8" in args.variants:
        builders += [(SEPARATE_QUANT, lambda: MhcclThenCompiledQuant(ctx, inp, impls.get("mhccl")))]
    if ctx.tp == 1:
        builders += [("torch_eager", lambda: Torch(ctx, inp, False, "none")),
                     ("torch_compile", lambda: Torch(ctx, inp, True, "none"))]
    else:
        builders += [("nccl+torch_eager", lambda: Torch(ctx, inp, False, "nccl")),
                     ("nccl+torch_compile", lambda: Torch(ctx, inp, True, "nccl")),
                     ("symm_mem_one_shot+torch_compile", lambda: Torch(ctx, inp, True, "symm_mem"))]
    builders += [("flashinfer_ar_rmsnorm", lambda: FlashInferArNorm(ctx, inp))]
    wanted = [w for w in args.impls.split(",") if w]
    needed = set(wanted)
    if args.check:
        needed |= {"mhccl", baseline, "torch_eager", "nccl+torch_eager", SEPARATE_QUANT}
    if SEPARATE_QUANT in wanted:
        needed.add("mhccl")  # its plain calls
    for name, build in builders:
        if wanted and name not in needed:
            continue
        try:
            impl, err = build(), None
        except Exception as e:  # noqa: BLE001
            impl, err = None, f"{type(e).__name__}: {e}"
        if not ctx.all_ok(impl is not None):
            ctx.say(f"skipped {name}: {err or 'failed on another rank'}")
            continue
        impls[name] = impl

    status = 0
    if args.check:
        eager = "torch_eager" if ctx.tp == 1 else "nccl+torch_eager"
        refs = [impls[n] for n in (eager, baseline) if n in impls]
        if "mhccl" in impls:
            if not check(ctx, inp, impls["mhccl"], refs, impls.get(SEPARATE_QUANT), ms, args.ops):
                status = 1
                ctx.say("check: FAILED" + ("" if args.check_only else " (timing goes on)"))
        else:
            ctx.say("check: not run (mhccl could not be built)")
            status = 1
        ctx.say(f"[{time.time() - t0:.0f}s] check done")
        if args.check_only:
            finish(ctx, status)

    results = {}  # (op, variant, impl) -> {m: us}
    for op in args.ops:
        for name, impl in impls.items():
            if (wanted and name not in wanted) or (op == "finalize" and isinstance(impl, FlashInferArNorm)):
                continue
            for variant in (v for v in impl.variants if v in args.variants):
                key = (op, variant, name)
                ctx.say(f"[{time.time() - t0:.0f}s] {op} {variant} {name}, us:", end="")
                for m in ms:
                    try:
                        us, err = ctx.time_calls(lambda i, m=m: impl.run(op, variant, i % inp.sets, m)), None
                    except Exception as e:  # noqa: BLE001
                        us, err = None, f"{type(e).__name__}: {e}"
                        try:
                            torch.cuda.synchronize()
                        except Exception:  # noqa: BLE001
                            pass
                    if not ctx.all_ok(err is None):
                        ctx.say(f"\n  M={m} failed: {err or 'on another rank'}; skipping larger M", end="")
                        status = status or 1
                        break
                    results.setdefault(key, {})[m] = us
                    ctx.say(f" {m}:{us:.2f}", end="")
                ctx.say("")

    rows = []
    for (op, variant, name), by_m in results.items():
        # fp8 rows against the separate quantization, the others against the compiled epilogue
        base_name, base_variant = ((SEPARATE_QUANT, "fp8") if variant == "fp8"
                                   else (baseline, "plain"))
        base_us = results.get((op, base_variant, base_name), {}) if name != base_name else {}
        has_protocol = hasattr(impls[name], "protocol")  # mhccl's path, where mhccl runs
        for m, us in sorted(by_m.items()):
            rows.append({
                "op": f"allreduce_mhc.{op}", "variant": variant, "impl": name,
                "protocol": impls[name].protocol(op, m) if has_protocol else name,
                "tp": ctx.tp, "m": m, "hidden": H, "hc": 1 if name == "flashinfer_ar_rmsnorm" else HC,
                "us_median": us, "baseline": base_name if name != base_name else "none",
                "baseline_us": base_us.get(m), "commit": commit})
    print_tables(ctx, results, ms, args.ops, baseline)

    if ctx.rank == 0:
        doc = {"machine": {"gpu": props.name, "gpus": ctx.tp, "sms": props.multi_processor_count,
                           "torch": torch.__version__, "cuda": torch.version.cuda},
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "command": (f"torchrun --nproc-per-node {ctx.tp} " if ctx.tp > 1 else "python ")
                          + " ".join(["bench/peers.py"] + sys.argv[1:]),
               "commit": commit,
               "timing": {"calls_per_graph": args.calls_per_graph, "launches": args.launches,
                          "repeats": args.repeats, "warmup": args.warmup, "sets": args.sets,
                          "compile": "static" if args.static_compile else "automatic dynamic",
                          "compile_options": compile_options(args), "variants": args.variants,
                          "fp8_scales": "ue8m0" if args.fp8_ue8m0 else "fp32"},
               "rows": rows}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            print(f"wrote {len(rows)} rows to {args.json}", flush=True)
        if args.plot:
            plot(rows, args.plot, f"AllReduceMHC boundary vs PyTorch: TP={ctx.tp}, H={H}, hc={HC}, "
                                  f"{props.name}, mhccl {commit}")
    ctx.say(f"[{time.time() - t0:.0f}s] done")
    finish(ctx, status)


def finish(ctx: Ctx, status: int):
    if ctx.tp > 1:
        try:
            ctx.dist.barrier()
            ctx.dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    sys.exit(status)


if __name__ == "__main__":
    main()
