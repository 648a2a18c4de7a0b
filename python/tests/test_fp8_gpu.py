"""The per-token-group FP8 layer input (SPEC.md, "FP8 layer input for Hopper GEMMs") from Python
at TP=1, call and finalize, both scale rules: bit-exact against a PyTorch formulation of vLLM's
``per_token_group_quant_fp8(layer_input, 128, column_major_scales=True, use_ue8m0=...)`` written
here, the scales compared in DeepGEMM's MN-major layout (padding rows zero), and the layer input
and streams identical to the plain build's. Skipped without PyTorch or a CUDA device."""

import pytest

torch = pytest.importorskip("torch", reason="the FP8 GPU tests need PyTorch")
if not torch.cuda.is_available():  # the FP8 variant's CPU side is in test_cpu.py / test_torch_cpu.py
    # The same reason as every GPU file's, so that the test summary names one reason, not two.
    pytest.skip("no CUDA device", allow_module_level=True)

import mhccl  # noqa: E402
from test_gpu import H, HC, TOP_K, make_inputs  # noqa: E402

GROUP = 128
MS = [1, 3, 64, 129, 1024]
CAPACITY = max(MS)


def pow2_ceil(s):
    """2^ceil(log2(s)) of positive normal FP32 values, exactly: frexp gives s = f * 2^e with f in
    [0.5, 1); s is a power of two iff f == 0.5 (then 2^(e-1)), else the next one is 2^e."""
    f, e = torch.frexp(s)
    e = torch.where(f == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(s), e)


def per_token_group_quant_fp8(x, ue8m0):
    """vLLM's per_token_group_quant_fp8(x, 128, column_major_scales=True, use_ue8m0=ue8m0), in
    PyTorch: (values [M, H] as uint8 bytes, scales flat in the MN-major layout, Mp * G floats,
    padding rows 0)."""
    m, h = x.shape
    g = h // GROUP
    groups = x.float().view(m, g, GROUP)
    amax = groups.abs().amax(-1).clamp(min=1e-10)  # FP32
    # IEEE division by 448, as vLLM's CUDA kernel's `absmax / max_8bit`: divided by a tensor, not
    # by the Python float, which PyTorch's CUDA division turns into a multiplication by its
    # reciprocal (1 ulp off in some scales: measured on one H200, 2026-12-01, 16a0528).
    s = amax / torch.full_like(amax, 448.0)
    if ue8m0:
        s = pow2_ceil(s)
    q = (groups / s[:, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    mp = mhccl.fp8_group_scale_rows(m)
    flat = torch.zeros(mp * g, dtype=torch.float32, device=x.device)
    flat.view(g, mp)[:, :m] = s.t()  # scale(m, g) at float offset g * Mp + m
    return q.view(m, h).view(torch.uint8), flat


def test_pow2_ceil_is_exact():
    s = torch.tensor([1.0, 0.75, 2.0 ** -20, 2.0 ** -20 * (1 + 2.0 ** -23), 3.0, 2.0 ** -126,
                      1e-10 / 448.0], device="cuda")
    want = torch.tensor([1.0, 1.0, 2.0 ** -20, 2.0 ** -19, 4.0, 2.0 ** -126, 2.0 ** -42], device="cuda")
    assert torch.equal(pow2_ceil(s), want)


def flat_scales(scales):
    """The Mp * G floats under an [M, G] view with strides (1, Mp), or a flat tensor as it is."""
    if scales.dim() == 1:
        return scales
    m, g = scales.shape
    mp = mhccl.fp8_group_scale_rows(m)
    return scales.as_strided((mp * g,), (1,), scales.storage_offset())


@pytest.fixture(scope="module")
def ops():
    dev = torch.device("cuda", torch.cuda.current_device())
    kw = dict(hidden_size=H, hc_mult=HC, max_num_tokens=CAPACITY, top_k=TOP_K, device=dev)
    return dev, {"plain": mhccl.AllReduceMHC(**kw),
                 False: mhccl.AllReduceMHC(**kw, quantize_layer_input_fp8=True),
                 True: mhccl.AllReduceMHC(**kw, quantize_layer_input_fp8=True, fp8_ue8m0_scales=True)}


def _run(op, inp, mine, finalize, **kw):
    epi = (inp["residual"], inp["post"], inp["comb"], inp["pre"], inp["norm_weight"], 1e-6)
    if finalize:
        return op.finalize(mine["gemm2"], mine["weights"], mine["routes"], mine["shared"], *epi, **kw)
    return op(mine["x"], *epi, **kw)


@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32-scales", "ue8m0-scales"])
@pytest.mark.parametrize("finalize", [False, True], ids=["call", "finalize"])
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("scales_form", ["view", "flat", "vllm"])
def test_fp8_matches_vllm_per_token_group_quant(ops, m, finalize, ue8m0, scales_form):
    """scales_form "vllm": the scales as vLLM's per_token_group_quant_fp8(...,
    tma_aligned_scales=True) allocates them, empty_strided((M, G), (1, Mp)), whose storage ends at
    the view's last element at M % 4 != 0: the call writes exactly that storage."""
    dev, built = ops
    inp, ranks = make_inputs(1000 + m + 7 * finalize, m, 1, finalize, dev)
    g = H // GROUP
    mp = mhccl.fp8_group_scale_rows(m)
    values = torch.full((m, H), 0x55, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    if scales_form == "view":
        scales = mhccl.empty_fp8_group_scales(m, H, dev)
    elif scales_form == "vllm":
        scales = torch.empty_strided((m, g), (1, mp), dtype=torch.float32, device=dev)
        extent = (g - 1) * mp + m
        assert scales.untyped_storage().nbytes() == 4 * extent
        storage = torch.empty(0, dtype=torch.float32, device=dev).set_(
            scales.untyped_storage(), 0, (extent,), (1,))
        storage.fill_(float("nan"))  # the other columns' padding rows must come back 0
    else:
        scales = torch.empty(mhccl.fp8_group_scale_bytes(m, H) // 4, dtype=torch.float32, device=dev)
    if scales_form != "vllm":
        flat_scales(scales).fill_(float("nan"))  # the padding rows must come back 0
    res, li = _run(built[ue8m0], inp, ranks[0], finalize, fp8_out=(values, scales))
    res_plain, li_plain = _run(built["plain"], inp, ranks[0], finalize)
    torch.cuda.synchronize()
    assert torch.equal(res.view(torch.int16), res_plain.view(torch.int16)), "streams differ from the plain build"
    assert torch.equal(li.view(torch.int16), li_plain.view(torch.int16)), "layer input differs from the plain build"
    want_values, want_scales = per_token_group_quant_fp8(li, ue8m0)
    got = values.view(torch.uint8)
    bad = (got != want_values).nonzero()
    assert bad.numel() == 0, f"fp8 values differ at {bad.shape[0]} elements, first {bad[:4].tolist()}"
    if scales_form == "vllm":  # its storage: the Mp * G floats but the last column's padding
        got_scales, want_scales = storage, want_scales[:extent]
    else:
        got_scales = flat_scales(scales)
    assert torch.equal(got_scales.view(torch.int32), want_scales.view(torch.int32)), (
        f"fp8 scales differ at {int((got_scales.view(torch.int32) != want_scales.view(torch.int32)).sum())} "
        f"of {got_scales.numel()} floats")
    if scales_form != "flat":
        assert tuple(scales.shape) == (m, g) and scales.stride() == (1, mp)


@pytest.mark.parametrize("finalize", [False, True], ids=["call", "finalize"])
@pytest.mark.parametrize("m", [3, 129])
def test_functional_with_fp8(ops, m, finalize):
    """torch.ops.mhccl.all_reduce_mhc(..., with_fp8=True) allocates the pair (the scales as the
    MN-major view over Mp * G floats) with the same bits as the fp8_out form."""
    dev, built = ops
    op = built[True]
    inp, ranks = make_inputs(77 + m, m, 1, finalize, dev)
    r = ranks[0]
    epi = (inp["residual"], inp["post"], inp["comb"], inp["pre"], inp["norm_weight"], 1e-6)
    if finalize:
        outs = torch.ops.mhccl.all_reduce_mhc_finalize(op._handle, r["gemm2"], r["weights"], r["routes"],
                                                       r["shared"], *epi, "auto", False, True)
    else:
        outs = torch.ops.mhccl.all_reduce_mhc(op._handle, r["x"], *epi, "auto", False, True)
    assert len(outs) == 4
    _, li, values, scales = outs
    mp = mhccl.fp8_group_scale_rows(m)
    assert values.dtype == torch.float8_e4m3fn and scales.stride() == (1, mp)
    want_values, want_scales = per_token_group_quant_fp8(li, True)
    assert torch.equal(values.view(torch.uint8), want_values)
    assert torch.equal(flat_scales(scales).view(torch.int32), want_scales.view(torch.int32))


def test_fp8_argument_errors_leave_the_op_usable(ops):
    dev, built = ops
    m = 4
    inp, ranks = make_inputs(5, m, 1, False, dev)
    values = torch.empty(m, H, dtype=torch.float8_e4m3fn, device=dev)
    scales = mhccl.empty_fp8_group_scales(m, H, dev)
    with pytest.raises(ValueError, match="need an instance built with quantize_layer_input_fp8=true"):
        _run(built["plain"], inp, ranks[0], False, fp8_out=(values, scales))
    # An empty_strided [M, G] view without the last column's padding rows (vLLM's TMA-aligned
    # scales) used to be refused here; it is accepted since 5a2bbe7 (scales_form "vllm" above).
    with pytest.raises(ValueError, match="fp8 scales: expected dtype float32"):
        _run(built[False], inp, ranks[0], False, fp8_out=(values, scales.to(torch.float16)))
    res, li = _run(built[False], inp, ranks[0], False, fp8_out=(values, scales))  # still works
    torch.cuda.synchronize()
    want_values, want_scales = per_token_group_quant_fp8(li, False)
    assert torch.equal(values.view(torch.uint8), want_values)
    assert torch.equal(flat_scales(scales).view(torch.int32), want_scales.view(torch.int32))
