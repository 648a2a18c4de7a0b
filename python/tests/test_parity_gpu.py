"""Parity with an unfused PyTorch formulation written the way an engine writes it (vLLM's DSV4.1
path), at TP=1 on one GPU: the fraction of bit-identical elements of the residual streams, the
layer input and the MXFP8 bytes, printed (run with -s to see them) and asserted above 99.9%; and
every element of both sides, identical or not, checked against an FP64 recomputation: each must
be a BF16 rounding of a value within the FP32 rounding-error bound of its own computation, so a
difference between the two can come from the order of FP32 operations alone.

The checker's own tests (it flags a one-ulp error, accepts a legitimate reordering) are in
test_torch_parity_cpu.py (PyTorch on the CPU); the parity tests here need CUDA and skip
without it."""

import pytest

torch = pytest.importorskip("torch", reason="the parity tests need PyTorch")

import mhccl  # noqa: E402

H, HC, TOP_K, EPS = 5120, 4, 6, 1e-6
U = 2.0 ** -24  # FP32 unit roundoff
BF = torch.bfloat16
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


# --- the unfused formulation, as engines write it ---------------------------------------------

def unfused_finalize_x(gemm2, weights, routes, shared):
    valid = routes >= 0
    w = torch.where(valid, weights, torch.zeros_like(weights))
    routed = (w[..., None] * gemm2[routes.clamp(min=0).long()].float()).sum(1)
    return (shared.float() + routed).to(BF)


def unfused_streams(y, residual, post, comb):
    # comb indexed [source, target]: target t's stream sums comb[s, t] * residual[s] over s.
    return (post[..., None] * y[:, None, :].float()
            + (comb[..., None] * residual[:, :, None, :].float()).sum(1)).to(BF)


def unfused_layer_input(streams, pre, norm_weight, eps):
    x = (pre[..., None] * streams.float()).sum(1).to(BF).float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()).to(BF)


def mxfp8_quantize(layer_input):
    """[M, H] BF16 -> (E4M3 bytes [M, H], swizzled 128x4 UE8M0 scale bytes), as SPEC.md states it:
    32-element blocks, scale 2^e with e the least integer such that amax <= 448 * 2^e (exactly,
    from amax's bits; byte e + 127, 0 for amax == 0 and clamped at 0), values RNE, saturating."""
    m, h = layer_input.shape
    s = h // 32
    blocks = layer_input.float().view(m, s, 32)
    amax = blocks.abs().amax(-1).double()
    e = torch.ceil(torch.log2(amax / 448.0))
    e = torch.where(amax > 448.0 * torch.exp2(e), e + 1, e)  # log2 may be off by one: settle it
    e = torch.where(amax <= 448.0 * torch.exp2(e - 1), e - 1, e)
    e = torch.where(amax == 0, torch.full_like(e, -127.0), e).clamp(min=-127)
    q = (blocks * torch.exp2(-e).float()[..., None]).clamp(-448.0, 448.0)
    values = q.to(torch.float8_e4m3fn).view(torch.uint8).view(m, h)
    r = torch.arange(m, device=layer_input.device)[:, None]
    k = torch.arange(s, device=layer_input.device)[None, :]
    off = (r // 128 * ((s + 3) // 4) + k // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + k % 4
    scales = torch.zeros(mhccl.mxfp8_scale_bytes(m, h), dtype=torch.uint8, device=layer_input.device)
    scales[off.flatten()] = (e + 127).to(torch.uint8).flatten()
    return values, scales


# --- the FP64 check ----------------------------------------------------------------------------

def bf16_interval(v, err):
    """The BF16 values that rounding some w in [v - err, v + err] can give, as [lo, hi] (BF16
    rounding is monotone). FP64 in, the bounds rounded through FP32 (adds half an FP32 ulp,
    which the callers' bounds include)."""
    return (v - err).float().to(BF).float(), (v + err).float().to(BF).float()


def within(got, lo, hi):
    g = got.float()
    return (g >= lo) & (g <= hi)


def check_y(x_bf16=None, finalize=None):
    """(lo, hi) FP64 bounds of this rank's y at TP=1: x itself, or finalize's bf16(routed sum +
    shared) with the FP32 error of a top_k + 1 term sum (any order, fma or not)."""
    if x_bf16 is not None:
        y = x_bf16.double()
        return y, y
    gemm2, weights, routes, shared = finalize
    valid = routes >= 0
    w = torch.where(valid, weights, torch.zeros_like(weights)).double()
    terms = w[..., None] * gemm2[routes.clamp(min=0).long()].double()
    v = terms.sum(1) + shared.double()
    a = terms.abs().sum(1) + shared.double().abs()
    lo, hi = bf16_interval(v, (TOP_K + 3) * U * a)
    return lo.double(), hi.double()


def stream_ok(streams, y_lo, y_hi, residual, post, comb):
    """Whether each stream element is a BF16 rounding of post * y + sum_s comb[s, t] *
    residual[s] within the FP32 error bound of an hc + 1 term sum computed in any order (products
    rounded or fused, so hc + 2 roundings a term at most), for y anywhere in [y_lo, y_hi]."""
    p = post.double().reshape(post.shape[0], HC)[:, :, None]
    py_lo = torch.minimum(p * y_lo[:, None, :], p * y_hi[:, None, :])
    py_hi = torch.maximum(p * y_lo[:, None, :], p * y_hi[:, None, :])
    mix_terms = comb.double()[..., None] * residual.double()[:, :, None, :]  # [m, s, t, h]
    mix = mix_terms.sum(1)
    a = torch.maximum(py_lo.abs(), py_hi.abs()) + mix_terms.abs().sum(1)
    err = (HC + 3) * U * a
    lo, _ = bf16_interval(py_lo + mix, err)
    _, hi = bf16_interval(py_hi + mix, err)
    return within(streams, lo, hi)


def layer_input_ok(layer_input, streams, pre, norm_weight, eps):
    """Whether each layer-input element is a BF16 rounding of p * rsqrt(mean(p^2) + eps) * w
    within FP32 error, where p is a BF16 rounding of the collapse sum_t pre[t] * streams[t]
    within FP32 error (an hc term sum, any order), and the mean of squares is an FP32 sum of H
    terms in any tree whose longest chain has at most 512 additions."""
    terms = pre.double().reshape(pre.shape[0], HC)[:, :, None] * streams.double()
    c = terms.sum(1)
    c_err = (HC + 2) * U * terms.abs().sum(1)
    p_lo, p_hi = (t.double() for t in bf16_interval(c, c_err))
    p_mid = c.float().to(BF).double()
    ms = p_mid.pow(2).mean(-1, keepdim=True)
    # Relative error of the FP32 rsqrt factor: the sum of squares (512 U, halved by the square
    # root; the other candidates of p move it by at most one BF16 ulp of one element: 2^-7 / H),
    # rsqrt itself (2 ulp on CUDA), the eps add and the three products.
    rel = 512 * U / 2 + 2.0 ** -7 / H + 8 * U
    r = torch.rsqrt(ms + eps)
    w = norm_weight.double()
    a_lo, a_hi = p_lo * r * w, p_hi * r * w
    lo_v, hi_v = torch.minimum(a_lo, a_hi), torch.maximum(a_lo, a_hi)
    err = rel * torch.maximum(lo_v.abs(), hi_v.abs())
    lo, _ = bf16_interval(lo_v, err)
    _, hi = bf16_interval(hi_v, err)
    return within(layer_input, lo, hi)


# --- the checker can fail --------------------------------------------------------------------

def _small_problem(m=3, h=256, seed=0, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    residual = torch.randn(m, HC, h, generator=g, device=device).to(BF)
    post = 2 * torch.sigmoid(torch.randn(m, HC, generator=g, device=device))
    pre = torch.sigmoid(torch.randn(m, HC, generator=g, device=device)) + 1e-6
    comb = sinkhorn(torch.randn(m, HC, HC, generator=g, device=device))
    x = torch.randn(m, h, generator=g, device=device).to(BF)
    w = (1 + 0.3 * torch.randn(h, generator=g, device=device)).to(BF)
    return x, residual, post, comb, pre, w


def _bump(t, where):
    """t with the elements at ``where`` moved one BF16 ulp away from zero."""
    bits = t.view(torch.int16).clone()
    bits[where] += 1
    return bits.view(BF)


# --- the parity test ---------------------------------------------------------------------------

def sinkhorn(logits, iters=20):
    k = logits.double().exp()
    for _ in range(iters):  # rows, then columns, sum to 1
        k = k / k.sum(-1, keepdim=True)
        k = k / k.sum(-2, keepdim=True)
    return k.float()


def realistic(m, seed, device, finalize):
    g = torch.Generator(device=device).manual_seed(seed)
    d = dict(residual=torch.randn(m, HC, H, generator=g, device=device).to(BF),
             post=2 * torch.sigmoid(torch.randn(m, HC, generator=g, device=device)),
             pre=torch.sigmoid(torch.randn(m, HC, generator=g, device=device)) + 1e-6,
             comb=sinkhorn(torch.randn(m, HC, HC, generator=g, device=device)),
             norm_weight=(1 + 0.3 * torch.randn(H, generator=g, device=device)).to(BF))
    if finalize:
        rows = m * TOP_K
        routes = torch.randperm(rows, generator=g, device=device).view(m, TOP_K).to(torch.int32)
        routes[torch.rand(m, TOP_K, generator=g, device=device) < 0.33] = -1
        d.update(gemm2=torch.randn(rows, H, generator=g, device=device).to(BF),
                 weights=torch.rand(m, TOP_K, generator=g, device=device) / TOP_K,
                 routes=routes,
                 shared=(0.5 * torch.randn(m, H, generator=g, device=device)).to(BF))
    else:
        d["x"] = torch.randn(m, H, generator=g, device=device).to(BF)
    return d


def identical(a, b):
    return (a.view(torch.uint8 if a.element_size() == 1 else torch.int16)
            == b.view(torch.uint8 if b.element_size() == 1 else torch.int16))


@pytest.fixture(scope="module")
def op():
    return mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=4096, top_k=TOP_K,
                              device=torch.device("cuda", 0), quantize_layer_input=True)


@needs_cuda
@pytest.mark.parametrize("finalize", [False, True], ids=["call", "finalize"])
@pytest.mark.parametrize("m", [1, 7, 64, 300, 1024, 4096])
def test_parity_with_unfused_pytorch(op, m, finalize):
    dev = torch.device("cuda", 0)
    d = realistic(m, 1000 * m + finalize, dev, finalize)
    values = torch.full((m, H), 0x55, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    scales = torch.full((mhccl.mxfp8_scale_bytes(m, H),), 0xAB, dtype=torch.uint8, device=dev)
    epi = (d["residual"], d["post"], d["comb"], d["pre"], d["norm_weight"], EPS)
    if finalize:
        fin = (d["gemm2"], d["weights"], d["routes"], d["shared"])
        streams, li = op.finalize(*fin, *epi, mxfp8_out=(values, scales))
        y_ref = unfused_finalize_x(*fin)
        y_lo, y_hi = check_y(finalize=fin)
    else:
        streams, li = op(d["x"], *epi, mxfp8_out=(values, scales))
        y_ref = d["x"]
        y_lo, y_hi = check_y(d["x"])
    torch.cuda.synchronize()
    op.check_errors()
    ref_streams = unfused_streams(y_ref, d["residual"], d["post"], d["comb"])
    ref_li = unfused_layer_input(ref_streams, d["pre"], d["norm_weight"], EPS)
    ref_values, ref_scales = mxfp8_quantize(ref_li)

    same = {"streams": identical(streams, ref_streams), "layer input": identical(li, ref_li),
            "mxfp8 values": identical(values.view(torch.uint8), ref_values),
            "mxfp8 scales": identical(scales, ref_scales)}
    name = f"{'finalize' if finalize else 'call'} M={m}"
    print("\n" + name + ": " + ", ".join(
        f"{k} {100 * v.double().mean().item():.4f}% identical ({int((~v).sum())} differ)"
        for k, v in same.items()))

    # Every element of both sides is a BF16 rounding within its own FP32 error bound (rows in
    # chunks: the FP64 intermediates of M = 4096 would take several GB at once).
    for lo in range(0, m, 256):
        rows = slice(lo, min(m, lo + 256))
        args = (d["residual"][rows], d["post"][rows], d["comb"][rows])
        for side, s, layer in (("mhccl", streams, li), ("unfused", ref_streams, ref_li)):
            ok = stream_ok(s[rows], y_lo[rows], y_hi[rows], *args)
            assert bool(ok.all()), f"{name}: {side} streams: {int((~ok).sum())} elements off"
            ok = layer_input_ok(layer[rows], s[rows], d["pre"][rows], d["norm_weight"], EPS)
            assert bool(ok.all()), f"{name}: {side} layer input: {int((~ok).sum())} elements off"
    # MXFP8 is a function of the BF16 layer input (bit-exact, SPEC): ours is the quantization of
    # our layer input, so each MXFP8 difference from the unfused one is a layer-input difference.
    own_values, own_scales = mxfp8_quantize(li)
    assert torch.equal(values.view(torch.uint8), own_values), f"{name}: mxfp8 values"
    assert torch.equal(scales, own_scales), f"{name}: mxfp8 scales (padding included)"
    for k, v in same.items():
        assert v.double().mean().item() > 0.999, f"{name}: {k} only {v.double().mean().item():.5f} identical"
