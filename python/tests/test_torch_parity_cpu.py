"""The parity checker's own tests (test_parity_gpu.py's FP64 bounds): it accepts the unfused
formulation and a legitimate reordering of its FP32 sums, flags a one-ulp error, and the MXFP8
formulation's hand cases. PyTorch on the CPU; no GPU (so that the GPU suite, skipped without a
CUDA device, runs no CPU test under its name)."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/install-deps.sh --torch installs it)")

from test_parity_gpu import (  # noqa: E402
    BF, EPS, HC, _bump, _small_problem, check_y, layer_input_ok, mxfp8_quantize, stream_ok,
    unfused_layer_input, unfused_streams)


def test_checker_accepts_the_unfused_formulation_and_flags_one_ulp():
    x, residual, post, comb, pre, w = _small_problem()
    streams = unfused_streams(x, residual, post, comb)
    y_lo, y_hi = check_y(x)
    assert bool(stream_ok(streams, y_lo, y_hi, residual, post, comb).all())
    li = unfused_layer_input(streams, pre, w, EPS)
    assert bool(layer_input_ok(li, streams, pre, w, EPS).all())
    # One ulp off anywhere is caught (except where the FP64 value sits within the FP32 error bound
    # of a rounding midpoint: there both neighbours are legitimate), and at almost every element.
    bad = stream_ok(_bump(streams, (slice(None),) * 3), y_lo, y_hi, residual, post, comb)
    assert bad.float().mean() < 0.01, bad.float().mean()
    bad_li = layer_input_ok(_bump(li, (slice(None),) * 2), streams, pre, w, EPS)
    assert bad_li.float().mean() < 0.02, bad_li.float().mean()
    # comb transposed ([target, source]) is caught too.
    wrong = unfused_streams(x, residual, post, comb.transpose(1, 2))
    assert not bool(stream_ok(wrong, y_lo, y_hi, residual, post, comb).all())


def test_checker_accepts_a_reordered_fp32_sum():
    """The same math in another FP32 order (an fma chain over sources, the collapse as a chain)
    passes, and differs from the unfused one somewhere: the check tolerates exactly that."""
    x, residual, post, comb, pre, w = _small_problem(m=64, seed=3)
    acc = post[..., None] * x[:, None, :].float()
    for s in range(HC):
        acc = torch.addcmul(acc, comb[:, s, :, None], residual[:, s, None, :].float())
    chain = acc.to(BF)
    y_lo, y_hi = check_y(x)
    assert bool(stream_ok(chain, y_lo, y_hi, residual, post, comb).all())
    c = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(HC):
        c = c + pre[:, t, None] * chain[:, t].float()
    p = c.to(BF).float()
    li = (p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(BF)
    assert bool(layer_input_ok(li, chain, pre, w, EPS).all())


def test_mxfp8_formulation_hand_cases():
    # A block of amax 448 has scale 2^0 (byte 127); 452 needs 2^1; 0 gives byte 0.
    li = torch.zeros(1, 64, dtype=BF)
    li[0, 0], li[0, 1] = 448.0, -3.0
    li[0, 32] = 452.0
    values, scales = mxfp8_quantize(li)
    assert scales[0].item() == 127 and scales[1].item() == 128
    assert values[0, 0].item() == 0x7E and values[0, 1].item() == 0xC4  # 448, -3
    assert values[0, 32].item() == 0x76  # 226 -> 224 (RNE on the E4M3 grid, step 16)
    assert mxfp8_quantize(torch.zeros(1, 32, dtype=BF))[1][0].item() == 0
