"""The Python package on GPUs, against a float64 PyTorch reference written here from SPEC.md:
every op and variant, TP=1 in this process and TP=2 in two spawned processes; PyTorch CUDA-graph
capture; a non-default stream; identical results on every rank. Then the errors of real calls
(their classes and codes, the op usable after an argument error, a bad finalize route reported
by check_errors) and the communicator options of the constructors (wait_timeout_ms, watchdog,
force_nccl_fallback: in effect, and MHCCL_WAIT_TIMEOUT_MS over them). Skipped without PyTorch or
GPUs."""

import hashlib
import math
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need PyTorch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import mhccl  # noqa: E402

H, HC, TOP_K = 5120, 4, 6


def make_inputs(seed, m, tp, finalize, device):
    """Every rank's inputs of one call (each rank rebuilds all of them from the seed)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    bf = torch.bfloat16
    inp = {"residual": torch.randn(m, HC, H, generator=g).to(bf),
           "post": 2 * torch.sigmoid(torch.randn(m, HC, generator=g)),
           "pre": torch.sigmoid(torch.randn(m, HC, generator=g)) + 1e-6,
           "norm_weight": (1 + 0.3 * torch.randn(H, generator=g)).to(bf)}
    k = torch.randn(m, HC, HC, generator=g).double().exp()
    for _ in range(20):  # Sinkhorn: rows, then columns, sum to 1
        k = k / k.sum(-1, keepdim=True)
        k = k / k.sum(-2, keepdim=True)
    inp["comb"] = k.float()
    ranks = []
    for _ in range(tp):
        if not finalize:
            ranks.append({"x": (torch.randn(m, H, generator=g) / math.sqrt(tp)).to(bf)})
        else:
            rows = m * TOP_K
            routes = torch.randperm(rows, generator=g).view(m, TOP_K).to(torch.int32)
            routes[torch.rand(m, TOP_K, generator=g) < 0.33] = -1
            ranks.append({"gemm2": torch.randn(rows, H, generator=g).to(bf),
                          "weights": torch.rand(m, TOP_K, generator=g) / TOP_K,
                          "routes": routes,
                          "shared": (0.5 * torch.randn(m, H, generator=g)).to(bf)})
    to = lambda d: {key: v.to(device) for key, v in d.items()}  # noqa: E731
    return to(inp), [to(r) for r in ranks]


def rank_x64(r):
    """This rank's partial output in float64 (finalize: the top-k reduction + shared expert)."""
    if "x" in r:
        return r["x"].double()
    acc = r["shared"].double()
    valid = r["routes"] >= 0
    rows = r["gemm2"].double()[r["routes"].clamp(min=0).long()]  # [M, K, H]
    w = torch.where(valid, r["weights"].double(), torch.zeros_like(r["weights"].double()))
    return acc + (w[:, :, None] * rows).sum(1)


def bf16_ulp(v):
    e = torch.floor(torch.log2(v.abs().clamp(min=2.0 ** -126)))
    return torch.pow(2.0, e - 7)


def check(inp, ranks, residual_out, layer_input, eps, mxfp8=None):
    """residual_out and layer_input against float64, MXFP8 bytes against a float64 quantization of
    the layer input the op returned."""
    y = sum(rank_x64(r) for r in ranks)
    if "x" not in ranks[0]:  # each rank's x is rounded to BF16 before the sum (SPEC)
        y = sum(rank_x64(r).to(torch.bfloat16).double() for r in ranks)
    y = y.to(torch.bfloat16).double()
    res = inp["residual"].double()
    terms = inp["post"].double()[:, :, None] * y[:, None, :]
    mix = torch.einsum("mst,msh->mth", inp["comb"].double(), res)
    ref = terms + mix
    scale = terms.abs() + torch.einsum("mst,msh->mth", inp["comb"].double().abs(), res.abs())
    # The kernel rounds in FP32 where this sums in float64: y may differ by one BF16 ulp (a tie),
    # the streams by one ulp of their own plus FP32's error over the terms. Finalize: each rank's
    # x is an FP32 fma chain rounded to BF16 (SPEC), which may differ from the float64 chain by one
    # ulp of x_r, and those ulps can exceed y's own where the ranks' x cancel.
    y_ulps = bf16_ulp(y)
    if "x" not in ranks[0]:
        y_ulps = y_ulps + sum(bf16_ulp(rank_x64(r)) for r in ranks)
    y_slack = inp["post"].double()[:, :, None] * y_ulps[:, None, :]
    err = (residual_out.double() - ref).abs()
    assert bool((err <= bf16_ulp(ref) + y_slack + 1e-6 * scale).all()), f"residual_out off by {err.max().item()}"
    if layer_input is None:
        return
    # SPEC: the collapse is rounded to BF16 before the norm; the FP64 check of the parity test
    # (a BF16 rounding of the norm of a BF16 rounding of the collapse, within FP32 error bounds).
    from test_parity_gpu import layer_input_ok

    ok = layer_input_ok(layer_input, residual_out, inp["pre"], inp["norm_weight"], eps)
    assert bool(ok.all()), f"layer_input off at {int((~ok).sum())} elements"
    if mxfp8 is None:
        return
    values, scales = mxfp8
    m = layer_input.shape[0]
    blocks = layer_input.double().view(m, H // 32, 32)
    amax = blocks.abs().amax(-1)
    e = torch.ceil(torch.log2(amax / 448.0)).clamp(min=-127)
    e = torch.where(amax == 0, torch.full_like(e, -127), e)
    q = (blocks / torch.pow(2.0, e)[:, :, None]).float().to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(values.view(torch.uint8).cpu(), q.view(m, H).cpu()), "mxfp8 values differ"
    want = torch.zeros(mhccl.mxfp8_scale_bytes(m, H), dtype=torch.uint8)
    s = H // 32
    for r in range(m):
        for k in range(s):
            off = (r // 128 * ((s + 3) // 4) + k // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + k % 4
            want[off] = int(e[r, k].item()) + 127
    assert torch.equal(scales.view(torch.uint8).cpu(), want), "mxfp8 scales differ"


def run(op, inp, mine, finalize, variant, m):
    args = (inp["residual"], inp["post"], inp["comb"],
            None if variant == "residual" else inp["pre"],
            None if variant == "residual" else inp["norm_weight"], 1e-6)
    mx = None
    if variant == "mxfp8":
        mx = (torch.empty(m, H, dtype=torch.float8_e4m3fn, device=inp["residual"].device),
              torch.empty(mhccl.mxfp8_scale_bytes(m, H), dtype=torch.uint8, device=inp["residual"].device))
    if finalize:
        out = op.finalize(mine["gemm2"], mine["weights"], mine["routes"], mine["shared"], *args, mxfp8_out=mx)
    else:
        out = op(mine["x"], *args, mxfp8_out=mx)
    return out, mx


def every_variant(tp, rank, device):
    op = mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=128, top_k=TOP_K, device=device,
                            quantize_layer_input=True, residual_only=True)
    hashes = []
    seed = 1
    for finalize in (False, True):
        for variant in ("plain", "mxfp8", "residual"):
            for m in (1, 7, 64, 128):
                inp, ranks = make_inputs(seed, m, tp, finalize, device)
                seed += 1
                (res_out, li), mx = run(op, inp, ranks[rank], finalize, variant, m)
                torch.cuda.synchronize()
                try:
                    check(inp, ranks, res_out, li, 1e-6, mx)
                except AssertionError as e:
                    raise AssertionError(f"TP={tp} {'finalize' if finalize else 'call'} {variant} M={m}: {e}") from None
                hashes.append(_digest(res_out, li, *(mx or ())))
    return op, hashes


def _digest(*outputs):
    """The first 8 bytes of the SHA-256 of every output's bits, as an int64: ranks compare
    bits (SPEC: identical on every rank), not a sum that two differing results could share."""
    h = hashlib.sha256()
    for t in outputs:
        if t is not None:
            h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little", signed=True)


def graph_and_stream(op, tp, rank, device):
    # Three calls captured in one PyTorch CUDA graph, replayed with new inputs copied in.
    static = [make_inputs(900 + i, m, tp, False, device) for i, m in enumerate((3, 16, 70))]
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):  # an eager call first, on the side stream
        run(op, static[0][0], static[0][1][rank], False, "plain", 3)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [run(op, inp, ranks[rank], False, "plain", inp["residual"].shape[0])[0] for inp, ranks in static]
    for rep in range(5):
        fresh = [make_inputs(1000 + 3 * rep + i, inp["residual"].shape[0], tp, False, device)
                 for i, (inp, _) in enumerate(static)]
        for (inp, ranks), (new_inp, new_ranks) in zip(static, fresh):
            for key in inp:
                inp[key].copy_(new_inp[key])
            for r in range(tp):
                ranks[r]["x"].copy_(new_ranks[r]["x"])
        graph.replay()
        torch.cuda.synchronize()
        for (inp, ranks), (res_out, li) in zip(static, outs):
            check(inp, ranks, res_out, li, 1e-6)
    # A call on a non-default stream.
    inp, ranks = make_inputs(77, 5, tp, True, device)
    with torch.cuda.stream(stream):
        (res_out, li), _ = run(op, inp, ranks[rank], True, "plain", 5)
    stream.synchronize()
    check(inp, ranks, res_out, li, 1e-6)


def all_gather(tp, rank, device):
    ag = mhccl.LamportAllGather(rank_capacity_bytes=1 << 20, device=device)
    for n in (4, 1024, 65536):
        parts = [torch.randn(n, generator=torch.Generator().manual_seed(50 + r)).to(device) for r in range(tp)]
        for p in parts:  # FP32 -0.0 (the Lamport sentinel's bits) arrives as sent
            p[::3] = -0.0
        out = ag(parts[rank])
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int32), torch.cat(parts).view(torch.int32))  # bits
        ints = [torch.full((n,), -2 ** 31, dtype=torch.int32, device=device) for _ in range(tp)]
        got = ag(ints[rank])
        torch.cuda.synchronize()
        assert torch.equal(got, torch.cat(ints))  # int32 INT32_MIN arrives as sent
    assert ag.accepts(torch.empty(16, dtype=torch.uint8)) and not ag.accepts(torch.empty(8, dtype=torch.uint8))


def test_tp1_every_variant_graph_stream_all_gather():
    op, _ = every_variant(1, 0, torch.device("cuda", 0))
    graph_and_stream(op, 1, 0, torch.device("cuda", 0))
    all_gather(1, 0, torch.device("cuda", 0))


def _tp2_worker(rank, init_file, result_file):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    device = torch.device("cuda", rank)
    op, hashes = every_variant(2, rank, device)
    graph_and_stream(op, 2, rank, device)
    all_gather(2, rank, device)
    mine = torch.tensor(hashes, dtype=torch.int64, device=device)
    both = [torch.empty_like(mine) for _ in range(2)]
    dist.all_gather(both, mine)
    assert torch.equal(both[0], both[1]), "ranks differ"
    if rank == 0:
        with open(result_file, "w") as f:
            f.write("ok")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="TP=2 needs 2 GPUs")
def test_tp2_every_variant_graph_stream_all_gather():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        result = os.path.join(d, "result")
        mp.spawn(_tp2_worker, args=(os.path.join(d, "init"), result), nprocs=2, join=True)
        assert open(result).read() == "ok"


# --- Errors of real calls, and the communicator options (TP=1) ---------------------------------

DEV0 = torch.device("cuda", 0)


def _budget(given):
    """The wait budget in effect for a constructor's wait_timeout_ms: MHCCL_WAIT_TIMEOUT_MS where
    set (it takes precedence), else the value given, else 30 s."""
    env = os.environ.get("MHCCL_WAIT_TIMEOUT_MS")
    return int(env) if env else (30000 if given is None else given)


def test_a_cpp_argument_error_is_invalid_argument_with_its_code_and_the_op_stays_usable():
    op = mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=16, top_k=TOP_K, device=DEV0)
    inp, ranks = make_inputs(3001, 4, 1, False, DEV0)
    x = ranks[0]["x"]
    # A float32 residual: the Python layer passes it on, the C++ check refuses it.
    with pytest.raises(mhccl.InvalidArgumentError, match=r"^residual: expected dtype") as info:
        op(x, inp["residual"].float(), inp["post"], inp["comb"], inp["pre"], inp["norm_weight"], 1e-6)
    e = info.value
    assert e.code == "kInvalidArgument" and e.peer is None
    assert isinstance(e, ValueError) and isinstance(e, mhccl.Error) and isinstance(e, RuntimeError)
    # The same through the torch op, called directly.
    with pytest.raises(mhccl.InvalidArgumentError, match=r"^residual: expected dtype") as info:
        torch.ops.mhccl.all_reduce_mhc(op._handle, x, inp["residual"].float(), inp["post"],
                                       inp["comb"], inp["pre"], inp["norm_weight"], 1e-6)
    assert info.value.code == "kInvalidArgument"
    # The Python layer's own checks: M outside [1, max_num_tokens], a wrong Python type.
    big, big_ranks = make_inputs(3002, 17, 1, False, DEV0)
    with pytest.raises(mhccl.InvalidArgumentError, match=r"^x: expected M .* got M=17$") as info:
        run(op, big, big_ranks[0], False, "plain", 17)
    assert info.value.code == "kInvalidArgument"
    with pytest.raises(mhccl.ArgumentTypeError, match="^x: expected a torch.Tensor") as info:
        op(x.tolist(), inp["residual"], inp["post"], inp["comb"], inp["pre"], inp["norm_weight"], 1e-6)
    assert info.value.code == "kInvalidArgument" and isinstance(info.value, TypeError)
    # Nothing was launched for any of them: the op still works and the group is healthy.
    (res_out, li), _ = run(op, inp, ranks[0], False, "plain", 4)
    torch.cuda.synchronize()
    check(inp, ranks, res_out, li, 1e-6)
    op.check_errors()


def test_a_variant_the_op_was_not_built_with_is_unsupported():
    op = mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=16, top_k=TOP_K, device=DEV0)
    inp, ranks = make_inputs(3003, 4, 1, False, DEV0)
    with pytest.raises(mhccl.UnsupportedError, match=r"^mxfp8_out: needs an instance built with "
                                                     r"quantize_layer_input=true") as info:
        run(op, inp, ranks[0], False, "mxfp8", 4)
    assert info.value.code == "kUnsupported" and isinstance(info.value, ValueError)
    with pytest.raises(mhccl.UnsupportedError, match=r"^pre and norm_weight absent") as info:
        run(op, inp, ranks[0], False, "residual", 4)
    assert info.value.code == "kUnsupported"
    (res_out, li), _ = run(op, inp, ranks[0], False, "plain", 4)
    torch.cuda.synchronize()
    check(inp, ranks, res_out, li, 1e-6)


@pytest.mark.parametrize("m", [5, 40])
def test_a_bad_finalize_route_is_an_invalid_route_error_from_check_errors(m):
    op = mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=64, top_k=TOP_K, device=DEV0)
    inp, ranks = make_inputs(3010 + m, m, 1, True, DEV0)
    ranks[0]["routes"][1, 1] = 1 << 20  # far outside gemm2_permuted's rows: skipped, reported
    run(op, inp, ranks[0], True, "plain", m)  # the call itself raises nothing
    torch.cuda.synchronize()
    with pytest.raises(mhccl.InvalidRouteError, match="1048576") as info:
        op.check_errors()
    e = info.value
    assert e.code == "kInvalidRoute" and not isinstance(e, mhccl.PeerError)
    op.check_errors()  # reported once; the communicator stays usable
    inp, ranks = make_inputs(3020 + m, m, 1, True, DEV0)
    (res_out, li), _ = run(op, inp, ranks[0], True, "plain", m)
    torch.cuda.synchronize()
    check(inp, ranks, res_out, li, 1e-6)
    op.check_errors()


@pytest.mark.parametrize("given", [None, 4321])
def test_wait_timeout_and_watchdog_on_the_constructors(given):
    ar = mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=16, top_k=TOP_K, device=DEV0,
                            wait_timeout_ms=given, watchdog=False)
    ag = mhccl.LamportAllGather(rank_capacity_bytes=1 << 16, device=DEV0, wait_timeout_ms=given,
                                watchdog=False)
    for op in (ar, ag):
        assert op.wait_timeout_ms == _budget(given)
        assert op.watchdog is False and op.force_nccl_fallback is False
    assert ar._comm is ag._comm  # one communicator per (group, device, options)
    default = mhccl.LamportAllGather(rank_capacity_bytes=1 << 16, device=DEV0)
    assert default.watchdog is True and default.wait_timeout_ms == _budget(None)
    assert default._comm is not ag._comm
    # Both ops work on that communicator.
    inp, ranks = make_inputs(3030, 6, 1, False, DEV0)
    (res_out, li), _ = run(ar, inp, ranks[0], False, "plain", 6)
    part = torch.randn(256, device=DEV0)
    out = ag(part)
    torch.cuda.synchronize()
    check(inp, ranks, res_out, li, 1e-6)
    assert torch.equal(out, part)
    ar.check_errors()
    ag.check_errors()


def test_force_nccl_fallback_at_tp1_gives_the_direct_path_bits():
    kw = dict(hidden_size=H, hc_mult=HC, max_num_tokens=16, top_k=TOP_K, device=DEV0)
    direct = mhccl.AllReduceMHC(**kw)
    forced = mhccl.AllReduceMHC(**kw, force_nccl_fallback=True)
    assert forced.force_nccl_fallback is True and direct.force_nccl_fallback is False
    ag = mhccl.LamportAllGather(rank_capacity_bytes=1 << 16, device=DEV0, force_nccl_fallback=True)
    assert ag.force_nccl_fallback is True
    for finalize in (False, True):
        inp, ranks = make_inputs(3040 + finalize, 8, 1, finalize, DEV0)
        (a, a_li), _ = run(direct, inp, ranks[0], finalize, "plain", 8)
        (b, b_li), _ = run(forced, inp, ranks[0], finalize, "plain", 8)
        torch.cuda.synchronize()
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert torch.equal(a_li.view(torch.int16), b_li.view(torch.int16))
    part = torch.randn(64, device=DEV0)
    assert torch.equal(ag(part), part)


def test_the_wait_budget_in_effect_is_reported_and_the_environment_takes_precedence():
    """In a fresh process: MHCCL_DEBUG=INFO prints the communicator's budget and watchdog as
    built from the constructor's options, and MHCCL_WAIT_TIMEOUT_MS overrides wait_timeout_ms."""
    code = textwrap.dedent("""
        import mhccl
        a = mhccl.LamportAllGather(rank_capacity_bytes=4096, device=0, wait_timeout_ms=4321,
                                   watchdog=False)
        print("budget", a.wait_timeout_ms, a.watchdog)
    """)

    def child(**env):
        e = {k: v for k, v in os.environ.items() if k != "MHCCL_WAIT_TIMEOUT_MS"}
        e.update(MHCCL_DEBUG="INFO", **env)
        return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                              timeout=300)

    given = child()
    assert given.returncode == 0, given.stderr
    assert "budget 4321 False" in given.stdout
    assert "wait budget 4321 ms" in given.stderr and "fallback watchdog off" in given.stderr
    env = child(MHCCL_WAIT_TIMEOUT_MS="777")
    assert env.returncode == 0, env.stderr
    assert "budget 777 False" in env.stdout and "wait budget 777 ms" in env.stderr
