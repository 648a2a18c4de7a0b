"""The PyTorch side of the package without a GPU: the choice of the TP group (a stand-in vLLM),
the input forms the reference module accepts, and the torch ops (registration, schemas, fake
implementations on meta tensors and FakeTensors for every variant, torch.library.opcheck on meta
tensors, and Dynamo tracing the classes' calls with fullgraph=True). Skipped without PyTorch."""

import os
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/install-deps.sh --torch installs it)")

import mhccl  # noqa: E402
from mhccl import _api, _ops  # noqa: E402

H, HC, TOP_K = 256, 4, 6


# --- the TP group ----------------------------------------------------------------------------

@pytest.fixture
def world(tmp_path):
    """torch.distributed initialized as a 1-rank gloo world (CPU)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def _stand_in_vllm(monkeypatch, get_tp_group):
    vllm = types.ModuleType("vllm")
    distributed = types.ModuleType("vllm.distributed")
    distributed.get_tp_group = get_tp_group
    vllm.distributed = distributed
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.distributed", distributed)


def test_group_without_torch_distributed_is_tp1():
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert _api._group_layout(None) == (None, 1, 0)


def test_group_defaults_to_the_world_without_vllm(world, monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.delitem(sys.modules, "vllm.distributed", raising=False)
    assert _api._group_layout(None) == (world.group.WORLD, 1, 0)


def test_group_defaults_to_vllms_tp_group(world, monkeypatch):
    tp_group = world.new_group([0], backend="gloo")
    assert tp_group is not world.group.WORLD
    _stand_in_vllm(monkeypatch, lambda: types.SimpleNamespace(device_group=tp_group))
    group, tp, rank = _api._group_layout(None)
    assert group is tp_group and (tp, rank) == (1, 0)
    other = world.new_group([0], backend="gloo")
    assert _api._group_layout(other)[0] is other  # an explicit group wins


def test_group_of_a_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="^group: expected a torch.distributed ProcessGroup or None, got str"):
        _api._group_layout("world")
    with pytest.raises(TypeError, match="^group: expected a torch.distributed ProcessGroup"):
        mhccl.AllReduceMHC(hidden_size=H, hc_mult=HC, max_num_tokens=64, top_k=TOP_K, device=0,
                           group=object())


def test_group_falls_back_to_the_world_when_vllm_is_not_initialized(world, monkeypatch):
    def uninitialized():
        raise AssertionError("tensor model parallel group is not initialized")  # as vLLM's

    _stand_in_vllm(monkeypatch, uninitialized)
    assert _api._group_layout(None)[0] is world.group.WORLD


# --- inputs as the reference module takes them -----------------------------------------------

def test_inputs_are_copied_to_contiguous_aligned_tensors():
    base = torch.arange(64, dtype=torch.bfloat16)
    strided = base.view(8, 8).t()
    misaligned = base[1:33]  # contiguous, 2 bytes past a 16-byte boundary of the storage
    aligned = torch.zeros(32, dtype=torch.bfloat16)
    assert not strided.is_contiguous() and misaligned.data_ptr() % 16
    for t in (strided, misaligned):
        c = _api._packed(t)
        assert c.is_contiguous() and c.data_ptr() % 16 == 0 and torch.equal(c, t)
    assert _api._packed(aligned) is aligned  # no copy where none is needed
    assert _api._packed(None) is None


def test_mixes_are_taken_by_element_count():
    m = 3
    op = types.SimpleNamespace(hc_mult=HC, top_k=TOP_K, hidden_size=8)
    post = torch.rand(m, HC, 1)
    comb = torch.rand(m, HC * HC)  # flat rows, as an engine may keep them
    pre = torch.rand(m * HC)
    ins = _api.AllReduceMHC._packed_epilogue(op, m, torch.zeros(m, HC, 8), post, comb, pre,
                                             torch.zeros(8))
    assert [tuple(t.shape) for t in ins[1:4]] == [(m, HC), (m, HC, HC), (m, HC)]
    assert torch.equal(ins[2].flatten(), comb.flatten()) and torch.equal(ins[3].flatten(), pre)
    with pytest.raises(ValueError, match=r"^comb: expected 48 elements \(\[3, 4, 4\] in any shape\), "
                                         r"got shape \[3, 15\]"):
        _api._mix_count_error("comb", torch.rand(m, 15), (m, HC, HC))
    _api._mix_count_error("post", post, (m, HC))  # [M, hc, 1] is fine


# --- the torch ops ---------------------------------------------------------------------------

class StandIn:
    """What the fake implementations read of an instance (no GPU to build a real one here): its
    sizes and the classes' own shape checks."""

    _rows = mhccl.AllReduceMHC._rows
    accepts = mhccl.LamportAllGather.accepts
    _check_size = mhccl.LamportAllGather._check_size

    def __init__(self, world_size=2):
        self.hidden_size, self.hc_mult, self.top_k, self.world_size = H, HC, TOP_K, world_size
        self.capacity, self.rank_capacity_bytes = 4096, 1 << 20


@pytest.fixture
def handle():
    _ops.ensure_registered()
    obj = StandIn()
    yield _ops.register_instance(obj), obj


def test_ops_are_registered_with_their_mutations():
    _ops.ensure_registered()
    _ops.ensure_registered()  # idempotent
    ops = torch.ops.mhccl
    schema = {name: str(getattr(ops, name).default._schema) for name in (
        "all_reduce_mhc", "all_reduce_mhc_out", "all_reduce_mhc_finalize",
        "all_reduce_mhc_finalize_out", "all_gather", "all_gather_out")}
    for name in ("all_reduce_mhc_out", "all_reduce_mhc_finalize_out"):
        s = schema[name]
        assert s.startswith(f"mhccl::{name}(int handle, "), s  # an int, never a SymInt
        assert "Tensor(a!) residual_out" in s, s
        for out in ("layer_input", "mxfp8_values", "mxfp8_scales", "fp8_values", "fp8_scales"):
            assert f"!)? {out}," in s or f"!)? {out})" in s, s
        assert s.endswith("Tensor(e!)? fp8_values, Tensor(f!)? fp8_scales) -> ()"), s  # the pair last
        assert "Tensor residual," in s  # residual itself is read only (an in-place call aliases it)
    assert "!) out" in schema["all_gather_out"]
    assert schema["all_reduce_mhc"].endswith("-> Tensor[]")
    for name in ("all_reduce_mhc", "all_reduce_mhc_finalize"):
        assert schema[name].endswith("bool with_mxfp8=False, bool with_fp8=False) -> Tensor[]"), schema[name]
    assert schema["all_gather"] == "mhccl::all_gather(int handle, Tensor inp) -> Tensor"


def test_dead_handle_raises(handle):
    h, _ = handle
    obj = StandIn()
    dead = _ops.register_instance(obj)
    del obj
    with pytest.raises(RuntimeError, match=f"handle {dead} names no live instance"):
        _ops.instance(dead, "AllReduceMHC")
    assert _ops.instance(h, "AllReduceMHC") is handle[1]
    assert _ops.instance(h, "LamportAllGather") is handle[1]


def _call_inputs(m, device, finalize, variant):
    bf = torch.bfloat16
    t = dict(residual=torch.zeros(m, HC, H, dtype=bf, device=device),
             post=torch.zeros(m, HC, device=device), comb=torch.zeros(m, HC, HC, device=device),
             pre=None if variant == "residual" else torch.zeros(m, HC, device=device),
             norm_weight=None if variant == "residual" else torch.zeros(H, dtype=bf, device=device))
    if finalize:
        lead = dict(gemm2_permuted=torch.zeros(m * TOP_K, H, dtype=bf, device=device),
                    expert_weights=torch.zeros(m, TOP_K, device=device),
                    expanded_idx_to_permuted_idx=torch.zeros(m, TOP_K, dtype=torch.int32, device=device),
                    shared_output=torch.zeros(m, H, dtype=bf, device=device))
    else:
        lead = dict(x=torch.zeros(m, H, dtype=bf, device=device))
    return lead, t


def _functional(h, lead, t, finalize, variant):
    args = (*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6,
            "auto", variant == "mxfp8", variant == "fp8")
    op = torch.ops.mhccl.all_reduce_mhc_finalize if finalize else torch.ops.mhccl.all_reduce_mhc
    return op(h, *args)


def _expected_shapes(m, variant):
    want = [((m, HC, H), torch.bfloat16)]
    if variant != "residual":
        want.append(((m, H), torch.bfloat16))
    if variant == "mxfp8":
        want += [((m, H), torch.float8_e4m3fn), ((mhccl.mxfp8_scale_bytes(m, H),), torch.uint8)]
    if variant == "fp8":
        want += [((m, H), torch.float8_e4m3fn), ((m, H // 128), torch.float32)]
    return want


def _fp8_scales_ok(scales, m):
    """The functional form's fp8 scales: the MN-major [M, G] view (strides (1, Mp)) of a buffer
    of Mp * G floats."""
    mp, g = mhccl.fp8_group_scale_rows(m), H // 128
    return (tuple(scales.shape) == (m, g) and scales.stride() == (1, mp)
            and scales.untyped_storage().nbytes() == 4 * mp * g)


VARIANTS = [(f, v) for f in (False, True) for v in ("plain", "mxfp8", "fp8", "residual")]


@pytest.mark.parametrize("finalize,variant", VARIANTS)
@pytest.mark.parametrize("m", [1, 129])
def test_fake_functional_forms_on_meta(handle, finalize, variant, m):
    lead, t = _call_inputs(m, "meta", finalize, variant)
    outs = _functional(handle[0], lead, t, finalize, variant)
    assert [(tuple(o.shape), o.dtype) for o in outs] == _expected_shapes(m, variant)
    assert all(o.device.type == "meta" for o in outs)
    if variant == "fp8":
        assert _fp8_scales_ok(outs[-1], m), (outs[-1].shape, outs[-1].stride())
        outs = outs[:-1]
    assert all(o.is_contiguous() for o in outs)


@pytest.mark.parametrize("finalize,variant", VARIANTS)
def test_fake_functional_forms_under_fake_tensor_mode(handle, finalize, variant):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        lead, t = _call_inputs(7, "cpu", finalize, variant)  # fake CPU tensors: no real kernel runs
        outs = _functional(handle[0], lead, t, finalize, variant)
    assert all(mode.is_our_fake(o) if hasattr(mode, "is_our_fake") else True for o in outs)
    assert [(tuple(o.shape), o.dtype) for o in outs] == _expected_shapes(7, variant)
    if variant == "fp8":
        assert _fp8_scales_ok(outs[-1], 7)


def _out_args(h, lead, t, finalize, variant, m, device):
    bf = torch.bfloat16
    outs = dict(residual_out=torch.zeros(m, HC, H, dtype=bf, device=device), layer_input=None,
                mxfp8_values=None, mxfp8_scales=None, fp8_values=None, fp8_scales=None)
    if variant != "residual":
        outs["layer_input"] = torch.zeros(m, H, dtype=bf, device=device)
    if variant == "mxfp8":
        outs["mxfp8_values"] = torch.zeros(m, H, dtype=torch.float8_e4m3fn, device=device)
        outs["mxfp8_scales"] = torch.zeros(mhccl.mxfp8_scale_bytes(m, H), dtype=torch.uint8, device=device)
    if variant == "fp8":
        outs["fp8_values"] = torch.zeros(m, H, dtype=torch.float8_e4m3fn, device=device)
        outs["fp8_scales"] = mhccl.empty_fp8_group_scales(m, H, device).zero_()
    args = (h, *lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6, "auto")
    return args, outs


@pytest.mark.parametrize("finalize,variant", VARIANTS)
def test_opcheck_on_meta(handle, finalize, variant):
    """torch.library.opcheck of both forms: schema (mutations as declared), fake tensors, and
    AOT dispatch with dynamic shapes. On meta tensors the fake implementation is what runs (the
    real one is a CUDA kernel: test_torch_gpu.py runs opcheck on CUDA tensors)."""
    m = 5
    lead, t = _call_inputs(m, "meta", finalize, variant)
    name = "all_reduce_mhc_finalize" if finalize else "all_reduce_mhc"
    torch.library.opcheck(getattr(torch.ops.mhccl, name),
                          (handle[0], *lead.values(), t["residual"], t["post"], t["comb"], t["pre"],
                           t["norm_weight"], 1e-6, "auto", variant == "mxfp8", variant == "fp8"))
    args, outs = _out_args(handle[0], lead, t, finalize, variant, m, "meta")
    torch.library.opcheck(getattr(torch.ops.mhccl, name + "_out"), args, outs)


def test_all_gather_fakes(handle):
    h, obj = handle
    inp = torch.zeros(3, 16, dtype=torch.float16, device="meta")
    out = torch.ops.mhccl.all_gather(h, inp)
    assert (tuple(out.shape), out.dtype) == ((3 * obj.world_size, 16), torch.float16)
    torch.library.opcheck(torch.ops.mhccl.all_gather, (h, inp))
    torch.library.opcheck(torch.ops.mhccl.all_gather_out,
                          (h, inp, torch.zeros(6, 16, dtype=torch.float16, device="meta")))


def _meta_instance(cls, **attrs):
    """A class instance without its C++ op (none can be built without a GPU), registered so that
    the fake implementations see it: enough for Dynamo to trace the class's Python side."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    obj._handle = _ops.register_instance(obj)
    return obj


@pytest.mark.parametrize("finalize,variant", VARIANTS)
@pytest.mark.parametrize("form", ["new", "given", "inplace"])
def test_class_calls_trace_with_fullgraph(finalize, variant, form):
    """Dynamo traces AllReduceMHC.__call__ / finalize into the torch ops with no graph break
    (fullgraph=True), and AOT autograd functionalizes the out-variants (backend aot_eager, run on
    meta tensors: the fake implementations stand in for the kernels)."""
    torch._dynamo.reset()  # each case compiles the same code object anew
    _ops.ensure_registered()
    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64)
    m = 9
    lead, t = _call_inputs(m, "meta", finalize, variant)
    _, outs = _out_args(op._handle, lead, t, finalize, variant, m, "meta")
    mx = (outs["mxfp8_values"], outs["mxfp8_scales"]) if variant == "mxfp8" else None
    fp8 = (outs["fp8_values"], outs["fp8_scales"]) if variant == "fp8" else None
    kw = {}
    if form != "new":  # caller-owned outputs; "inplace": residual_out is residual
        kw = dict(residual_out=t["residual"] if form == "inplace" else outs["residual_out"],
                  layer_input=outs["layer_input"])

    def step(lead, t):
        fn = op.finalize if finalize else op
        res, li = fn(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"],
                     1e-6, mxfp8_out=mx, fp8_out=fp8, **kw)
        return res, li

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    res, li = compiled(lead, t)
    assert (tuple(res.shape), res.dtype) == ((m, HC, H), torch.bfloat16)
    assert (li is None) == (variant == "residual")
    if form == "inplace":
        assert res is t["residual"]
    if li is not None:
        assert (tuple(li.shape), li.dtype) == ((m, H), torch.bfloat16)


def test_all_gather_call_traces_with_fullgraph():
    _ops.ensure_registered()
    ag = _meta_instance(mhccl.LamportAllGather, world_size=4, rank_capacity_bytes=1 << 20)
    out = torch.compile(lambda t: ag(t) * 2, fullgraph=True, backend="aot_eager")(
        torch.zeros(5, 8, device="meta"))
    assert tuple(out.shape) == (20, 8)


def test_cpu_tensors_reach_the_cpp_checks():
    """The ops have an implementation for every device type, so a CPU tensor gets the C++ check's
    ValueError (here from the real check_call of the extension), not the dispatcher's
    "no kernel for CPU"."""
    _ops.ensure_registered()
    lib = _api._lib()
    m, bf = 2, torch.bfloat16

    class CheckOnly:  # the C++ op's call, as far as its argument checks go (no GPU here)
        def call(self, x, residual, post, comb, pre, norm_weight, eps, residual_out, layer_input,
                 values, scales, fp8_values, fp8_scales, stream, protocol):
            lib.check_call(H, HC, 64, TOP_K, False, False, 0, x, residual, post, comb, pre,
                           norm_weight, eps, residual_out, layer_input, values, scales,
                           fp8_values, fp8_scales)

    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64,
                        _op=CheckOnly(), _device=0)
    # _stream asks torch.cuda for the current stream of cuda:0, which needs CUDA: stubbed here.
    orig, _api._stream = _api._stream, lambda t: 0
    try:
        with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor on device cuda:0, got device type 1") as info:
            op(torch.zeros(m, H, dtype=bf), torch.zeros(m, HC, H, dtype=bf), torch.zeros(m, HC),
               torch.zeros(m, HC, HC), torch.zeros(m, HC), torch.zeros(H, dtype=bf), 1e-6)
        assert type(info.value) is mhccl.InvalidArgumentError and info.value.code == "kInvalidArgument"
    finally:
        _api._stream = orig


class Raising:
    """A C++ op stand-in whose call throws a C++ mhccl::Error of ``code`` through the extension's
    real translator (``_raise_for_test``), as a kernel's recorded fault would at the next call."""

    def __init__(self, code):
        self.code = code

    def call(self, *args):
        _api._lib()._raise_for_test(self.code, f"{self.code} inside the op", 1, 7, "AllReduceMHC.call")

    finalize = call


@pytest.mark.parametrize("code,cls", [("kPeerTimeout", mhccl.PeerTimeoutError),
                                      ("kDivergence", mhccl.DivergenceError),
                                      ("kUnusable", mhccl.UnusableError),
                                      ("kInvalidArgument", mhccl.InvalidArgumentError),
                                      ("kCuda", mhccl.CudaError)])
@pytest.mark.parametrize("path", ["class", "functional_op", "out_op", "compiled"])
def test_errors_keep_their_class_through_the_torch_ops(monkeypatch, code, cls, path):
    """An mhccl.Error raised inside a torch op's implementation (eager, CPU tensors: the real
    implementation runs) reaches the caller as raised: class, message, code, peer, call index and
    op; through the class's call, each torch op called directly, and compiled code run (aot_eager:
    the error comes from the op's run, not from the trace)."""
    _ops.ensure_registered()
    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64,
                        _op=Raising(code), _device=0)
    monkeypatch.setattr(_api, "_stream", lambda d: 0)
    m = 2
    lead, t = _call_inputs(m, "cpu", False, "plain")
    ins = (lead["x"], t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6)
    if path == "class":
        run = lambda: op(*ins)  # noqa: E731
    elif path == "functional_op":
        run = lambda: torch.ops.mhccl.all_reduce_mhc(op._handle, *ins)  # noqa: E731
    elif path == "out_op":
        outs = (torch.empty(m, HC, H, dtype=torch.bfloat16), torch.empty(m, H, dtype=torch.bfloat16),
                None, None, None, None)
        run = lambda: torch.ops.mhccl.all_reduce_mhc_out(op._handle, *ins, "auto", *outs)  # noqa: E731
    else:
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: op(*a), fullgraph=True, backend="aot_eager")
        run = lambda: compiled(*ins)  # noqa: E731
    with pytest.raises(mhccl.Error) as info:
        run()
    e = info.value
    assert type(e) is cls, repr(e)
    assert (str(e), e.code, e.peer, e.call_index, e.op) == (
        f"{code} inside the op", code, 1, 7, "AllReduceMHC.call")


def test_python_layer_errors_keep_their_class_through_the_fakes(handle):
    """The fake implementations' own checks (meta tensors) raise the package's classes too."""
    h, _ = handle
    lead, t = _call_inputs(2, "meta", False, "plain")
    with pytest.raises(mhccl.InvalidArgumentError, match="^x: expected shape") as info:
        torch.ops.mhccl.all_reduce_mhc(h, torch.zeros(2, H + 8, dtype=torch.bfloat16, device="meta"),
                                       t["residual"], t["post"], t["comb"], t["pre"],
                                       t["norm_weight"], 1e-6)
    assert info.value.code == "kInvalidArgument"
    with pytest.raises(mhccl.InvalidArgumentError, match="names no live instance"):
        torch.ops.mhccl.all_reduce_mhc(10**9, lead["x"], t["residual"], t["post"], t["comb"],
                                       t["pre"], t["norm_weight"], 1e-6)


def test_wrong_types_in_calls_are_type_errors():
    _ops.ensure_registered()
    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64)
    lead, t = _call_inputs(2, "meta", False, "plain")
    args = [lead["x"], t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"]]
    with pytest.raises(TypeError, match="^norm_eps: expected a float, got str"):
        op(*args, "1e-6")
    with pytest.raises(TypeError, match="^comb: expected a torch.Tensor, got list"):
        op(args[0], args[1], args[2], [[0.0]], *args[4:], 1e-6)
    with pytest.raises(TypeError, match=r"^mxfp8_out: expected a \(values, scales\) pair"):
        op(*args, 1e-6, mxfp8_out=lead["x"])
    with pytest.raises(TypeError, match=r"^fp8_out: expected a \(values, scales\) pair"):
        op(*args, 1e-6, fp8_out=(lead["x"],))
    with pytest.raises(TypeError, match=r"^fp8_out\[1\] \(scales\): expected a torch.Tensor, got int"):
        op(*args, 1e-6, fp8_out=(lead["x"], 4))
    with pytest.raises(ValueError, match="^norm_eps: expected a finite float, got int beyond the float range"):
        op(*args, 2**1024)  # float() raises OverflowError
    with pytest.raises(TypeError, match="^norm_eps: expected a float, got Tensor"):
        op(*args, torch.zeros(2))  # float() raises ValueError
    with pytest.raises(TypeError, match="^protocol: expected a str, got int"):
        op(*args, 1e-6, None, 2)
    with pytest.raises(TypeError, match="^residual_out: expected a torch.Tensor or None, got int"):
        op(*args, 1e-6, residual_out=3)
    with pytest.raises(ValueError, match=r"^post: expected 8 elements"):
        op(args[0], args[1], torch.zeros(2, 3, device="meta"), *args[3:], 1e-6)


def test_torch_ops_are_registered_at_import():
    """``import mhccl`` registers every torch op where PyTorch imports (so that compiled code can
    name them before any instance exists), without loading the extension or needing a GPU."""
    import subprocess

    names = ("all_reduce_mhc", "all_reduce_mhc_out", "all_reduce_mhc_finalize",
             "all_reduce_mhc_finalize_out", "all_gather", "all_gather_out")
    probe = ("import sys, mhccl, torch; "
             f"print(all(hasattr(torch.ops.mhccl, n) for n in {names!r}), "
             "'mhccl._mhccl' in sys.modules, mhccl._ops._REGISTERED)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.stdout.split() == ["True", "False", "True"], out.stderr


# --- per-token-group FP8 -----------------------------------------------------------------------

@pytest.mark.parametrize("m", [1, 3, 4, 5, 129])
def test_fp8_group_scales_view_and_empty(m):
    mp, g = mhccl.fp8_group_scale_rows(m), H // 128
    flat = torch.arange(mp * g, dtype=torch.float32)
    view = mhccl.fp8_group_scales_view(flat, m, H)
    assert tuple(view.shape) == (m, g) and view.stride() == (1, mp)
    assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    for r in range(m):  # scale(r, g) at float offset g * Mp + r (SPEC)
        for k in range(g):
            assert view[r, k].item() == k * mp + r
    assert mhccl.fp8_group_scales_view(view, m, H) is view  # the view already
    assert mhccl.fp8_group_scales_view(flat.view(g, mp), m, H).stride() == (1, mp)  # any contiguous shape
    empty = mhccl.empty_fp8_group_scales(m, H, "meta")
    assert (tuple(empty.shape), empty.stride(), empty.dtype, empty.device.type) == \
        ((m, g), (1, mp), torch.float32, "meta")
    assert empty.untyped_storage().nbytes() == mhccl.fp8_group_scale_bytes(m, H)


def test_fp8_group_scales_view_errors():
    m, g = 5, H // 128
    with pytest.raises(ValueError, match="^scales: expected dtype float32, got torch.float16"):
        mhccl.fp8_group_scales_view(torch.zeros(8 * g, dtype=torch.float16), m, H)
    with pytest.raises(ValueError, match=r"^scales: expected a contiguous tensor of 16 float32 elements"):
        mhccl.fp8_group_scales_view(torch.zeros(m * g), m, H)  # unpadded
    with pytest.raises(ValueError, match=r"^scales: expected a contiguous tensor"):
        mhccl.fp8_group_scales_view(torch.zeros(g, 8).t(), m, H)  # right count, not contiguous
    with pytest.raises(ValueError, match=r"^scales: .*row-major shape \[8, 2\].*would not be scale\(r, g\)"):
        mhccl.fp8_group_scales_view(torch.zeros(8, g), m, H)  # the padded row-major [Mp, G]
    with pytest.raises(TypeError, match="^scales: expected a torch.Tensor, got list"):
        mhccl.fp8_group_scales_view([0.0] * 16, m, H)
    # The view over storage that ends at its last element (vLLM's TMA-aligned scales at
    # M % 4 != 0): returned as it is; an unpadded [M, 1] at G = 1 is that view too.
    vllm = torch.empty_strided((m, g), (1, 8))
    assert mhccl.fp8_group_scales_view(vllm, m, H) is vllm
    one = torch.zeros(m, 1)
    assert mhccl.fp8_group_scales_view(one, m, 128) is one
    with pytest.raises(ValueError, match="^hidden: expected a positive multiple of 128"):
        mhccl.fp8_group_scales_view(torch.zeros(16), m, 96)
    with pytest.raises(ValueError, match="^hidden: expected a positive multiple of 128"):
        mhccl.empty_fp8_group_scales(m, 96, "meta")


def test_fp8_scale_views_as_the_kernels_get_them():
    """The MN-major view that is the whole of a storage of exactly Mp * G floats goes to the C++
    call as the flat buffer over that storage (every padding row written 0); any other view as
    the view itself, whose extent (G - 1) * Mp + M is all the C++ call writes: over storage that
    ends at its last element (vLLM's per_token_group_quant_fp8 with tma_aligned_scales=True
    allocates empty_strided((M, G), (1, Mp))), or into a bigger buffer, whose floats past the
    extent may be another tensor's; anything else as it is, for the C++ check."""
    m, g = 5, H // 128
    vllm = torch.empty_strided((m, g), (1, 8), dtype=torch.float32)
    assert vllm.untyped_storage().nbytes() // 4 == (g - 1) * 8 + m
    assert _api._fp8_scales_for_kernel(vllm, m, H) is vllm
    full = mhccl.empty_fp8_group_scales(m, H, "cpu")
    flat = _api._fp8_scales_for_kernel(full, m, H)
    assert flat.shape == (8 * g,) and flat.data_ptr() == full.data_ptr()
    other = torch.zeros(8 * g)
    assert _api._fp8_scales_for_kernel(other, m, H) is other  # flat: the C++ check counts it
    own = torch.zeros(g, 8).t()[:m]  # [G, Mp] storage of its own
    flat = _api._fp8_scales_for_kernel(own, m, H)
    assert flat.shape == (8 * g,) and flat.data_ptr() == own.data_ptr()
    # Views into a bigger buffer (a workspace), at an offset or from its start: the floats past
    # the extent may be the next tensor's, so the C++ call gets the view and writes its extent.
    big = torch.zeros(1000)
    for offset in (0, 100):
        view = big.as_strided((m, g), (1, 8), offset)
        assert _api._fp8_scales_for_kernel(view, m, H) is view
    # Exactly Mp * G floats of storage, but not from its start: the view, too.
    shifted = torch.zeros(8 * g).as_strided((m, g), (1, 8), 1)
    assert _api._fp8_scales_for_kernel(shifted, m, H) is shifted


def test_fp8_scales_column_major_without_padding_named_as_such():
    """vLLM's column_major_scales=True without tma_aligned_scales gives [M, G] with strides (1, M):
    at M % 4 != 0 its columns are not Mp floats apart; the message says so (it used to call it
    row-major)."""
    m, g = 5, H // 128
    cm = torch.empty((g, m)).t()
    with pytest.raises(ValueError, match=r"^scales: expected the MN-major view \[5, 2\] with strides "
                                         r"\(1, 8\) .*tma_aligned_scales=True.*got column stride 5"):
        mhccl.fp8_group_scales_view(cm, m, H)


class Recorder:
    """A C++ op stand-in that records what the Python side hands it."""

    def __init__(self):
        self.calls = []

    def call(self, *args):
        self.calls.append(("call", args))

    def finalize(self, *args):
        self.calls.append(("finalize", args))


@pytest.fixture
def recording_op(monkeypatch):
    _ops.ensure_registered()
    rec = Recorder()
    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64,
                        _op=rec, _device=0)
    monkeypatch.setattr(_api, "_stream", lambda d: 1234)
    return op, rec


@pytest.mark.parametrize("finalize", [False, True])
@pytest.mark.parametrize("flat", [False, True])
def test_fp8_out_reaches_the_cpp_call(recording_op, finalize, flat):
    """fp8_out travels through the _out torch op to the C++ call's fp8_values / fp8_scales (CPU
    tensors run the real op implementation, whose C++ op is the recorder here): values as uint8
    bytes of the same memory, the scales tensor as given when flat, the view as the flat buffer
    over its storage (which holds the padding rows)."""
    op, rec = recording_op
    m = 3
    lead, t = _call_inputs(m, "cpu", finalize, "fp8")
    values = torch.zeros(m, H, dtype=torch.float8_e4m3fn)
    scales = (torch.zeros(mhccl.fp8_group_scale_bytes(m, H) // 4) if flat
              else mhccl.empty_fp8_group_scales(m, H, "cpu"))
    fn = op.finalize if finalize else op
    res, li = fn(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6,
                 fp8_out=(values, scales))
    assert (tuple(res.shape), tuple(li.shape)) == ((m, HC, H), (m, H))
    (kind, args), = rec.calls
    assert kind == ("finalize" if finalize else "call")
    mx_values, mx_scales, fp8_values, fp8_scales, stream, protocol = args[-6:]
    assert mx_values is None and mx_scales is None and (stream, protocol) == (1234, "auto")
    assert fp8_values.dtype == torch.uint8 and fp8_values.data_ptr() == values.data_ptr()
    if flat:
        assert fp8_scales is scales
    else:
        assert fp8_scales.shape == (mhccl.fp8_group_scale_bytes(m, H) // 4,)
        assert fp8_scales.data_ptr() == scales.data_ptr()
    assert args[-7] is li and args[-8] is res


def test_an_expanded_gemm2_beyond_the_row_limit_is_not_copied(recording_op):
    """gemm2_permuted's row count is free (any rows the routes index): an expanded tensor (stride
    0) of 2^31 rows or more goes to the C++ check, which names the limit, instead of being
    copied first (a copy of 10 TiB here: an adversarial review, 2026-12-05)."""
    op, rec = recording_op
    lead, t = _call_inputs(3, "cpu", True, "plain")
    huge = torch.zeros(1, H, dtype=torch.bfloat16).expand(2**31, H)
    op.finalize(huge, *list(lead.values())[1:], t["residual"], t["post"], t["comb"], t["pre"],
                t["norm_weight"], 1e-6)
    (kind, args), = rec.calls
    assert kind == "finalize" and args[0] is huge  # handed on as given, uncopied


@pytest.mark.parametrize("form", ["empty_fp8_group_scales", "workspace"])
def test_fp8_scales_under_inductor_reach_the_cpp_call(recording_op, form):
    """Compiled with Inductor (fullgraph), the out-op is re-inplaced: the C++ call gets the
    caller's buffer, as the flat buffer of Mp * G floats for empty_fp8_group_scales's view (so
    the kernels write its padding rows), as the view for a view into a workspace (its extent
    only; the floats past it are the workspace's)."""
    op, rec = recording_op
    m, g = 3, H // 128
    lead, t = _call_inputs(m, "cpu", False, "fp8")
    values = torch.zeros(m, H, dtype=torch.float8_e4m3fn)
    if form == "workspace":
        workspace = torch.zeros(1000)
        scales = workspace.as_strided((m, g), (1, 4), 16)
    else:
        scales = mhccl.empty_fp8_group_scales(m, H, "cpu")

    def step(x, residual, post, comb, pre, w, values, scales):
        return op(x, residual, post, comb, pre, w, 1e-6, fp8_out=(values, scales))

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    compiled(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], values, scales)
    (_, args), = rec.calls
    got = args[-3]
    assert got.data_ptr() == scales.data_ptr()
    if form == "workspace":
        assert (tuple(got.shape), got.stride()) == ((m, g), (1, 4))
    else:
        assert tuple(got.shape) == (4 * g,)


def test_lazy_conjugate_and_negative_views():
    """torch's lazy conjugate / negative bit does not travel through DLPack (nanobind takes the
    raw memory): an input is resolved (a copy) before the C++ call reads it, an output refused
    before anything runs."""
    z = torch.randn(4, 8, dtype=torch.complex64)
    packed = _api._packed(z.conj())
    assert not packed.is_conj() and torch.equal(packed, z.conj())
    neg = torch._neg_view(torch.randn(4, 8))
    assert neg.is_neg() and neg.is_contiguous()
    packed = _api._packed(neg)
    assert not packed.is_neg() and torch.equal(packed, neg)
    plain = torch.randn(4, 8)
    assert _api._packed(plain) is plain
    with pytest.raises(ValueError, match=r"^out: expected a tensor without the lazy conjugate"):
        _api._written(out=z.conj())
    with pytest.raises(ValueError, match=r"^layer_input: expected a tensor without the lazy"):
        _api._written(residual_out=None, layer_input=torch._neg_view(torch.zeros(2, 2)))
    _api._written(out=z, layer_input=None)


@pytest.mark.parametrize("finalize", [False, True])
def test_functional_with_fp8_allocates_the_strided_scales(recording_op, finalize):
    op, rec = recording_op
    m = 5
    lead, t = _call_inputs(m, "cpu", finalize, "fp8")
    outs = _functional(op._handle, lead, t, finalize, "fp8")
    assert [(tuple(o.shape), o.dtype) for o in outs] == _expected_shapes(m, "fp8")
    assert _fp8_scales_ok(outs[-1], m)
    (_, args), = rec.calls
    assert args[-6] is None and args[-5] is None  # no mxfp8 pair
    assert args[-4].data_ptr() == outs[2].data_ptr()
    # The view, over a buffer of Mp * G floats, reaches the C++ call as that flat buffer.
    assert args[-3].shape == (8 * (H // 128),) and args[-3].data_ptr() == outs[3].data_ptr()


def test_fp8_and_mxfp8_outputs_together_reach_the_cpp_refusal(recording_op):
    """Both quantized pairs at once are passed on as given: the C++ check (check_epilogue)
    refuses them with "expected either the mxfp8 outputs or the fp8 outputs"; the configuration
    refuses both variants at construction (test_cpu.py)."""
    op, rec = recording_op
    m = 2
    lead, t = _call_inputs(m, "cpu", False, "fp8")
    mx = (torch.zeros(m, H, dtype=torch.float8_e4m3fn), torch.zeros(mhccl.mxfp8_scale_bytes(m, H), dtype=torch.uint8))
    fp8 = (torch.zeros(m, H, dtype=torch.float8_e4m3fn), mhccl.empty_fp8_group_scales(m, H, "cpu"))
    op(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6,
       mxfp8_out=mx, fp8_out=fp8)
    (_, args), = rec.calls
    assert all(a is not None for a in args[-6:-2])


# --- checks before anything is allocated, copied or skipped ----------------------------------

BIG = 2**40  # rows of an expanded tensor (stride 0): its outputs could never be allocated


def _expanded(*shape, dtype=torch.float32):
    return torch.zeros(1, *shape[1:], dtype=dtype).expand(*shape)


@pytest.mark.parametrize("form", ["new", "given", "functional", "out"])
def test_call_rows_are_checked_before_outputs_are_allocated(recording_op, form):
    """M outside [1, max_num_tokens] is a ValueError before any output is allocated or input
    copied: an expanded x of 2**40 rows used to be allocated for (RuntimeError of the allocator)."""
    op, rec = recording_op
    x, residual = _expanded(BIG, H, dtype=torch.bfloat16), _expanded(BIG, HC, H, dtype=torch.bfloat16)
    post, comb, w = _expanded(BIG, HC), _expanded(BIG, HC, HC), torch.zeros(H, dtype=torch.bfloat16)
    want = r"^x: expected M \(rows\) in \[1, 64\] \(max_num_tokens\), got M=1099511627776$"
    with pytest.raises(ValueError, match=want):
        if form == "new":
            op(x, residual, post, comb, post, w, 1e-6)
        elif form == "given":
            op(x, residual, post, comb, post, w, 1e-6, layer_input=x)
        elif form == "functional":
            torch.ops.mhccl.all_reduce_mhc(op._handle, x, residual, post, comb, post, w, 1e-6)
        else:
            torch.ops.mhccl.all_reduce_mhc_out(op._handle, x, residual, post, comb, post, w, 1e-6,
                                               "auto", residual, x, None, None, None, None)
    assert rec.calls == []


@pytest.mark.parametrize("finalize", [False, True])
@pytest.mark.parametrize("form", ["new", "given"])
def test_compiled_calls_check_rows_when_they_run(recording_op, finalize, form):
    """Under torch.compile(fullgraph=True) the range of M is left to the op's real implementation:
    no guard on M and no compile-time error, the same ValueError as eager when the code runs."""
    op, rec = recording_op
    torch._dynamo.reset()

    def step(lead, t, li):
        fn = op.finalize if finalize else op
        return fn(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6,
                  **({} if li is None else dict(layer_input=li)))

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    name = "shared_output" if finalize else "x"
    for m in (3, 65):
        lead, t = _call_inputs(m, "cpu", finalize, "plain")
        li = torch.zeros(m, H, dtype=torch.bfloat16) if form == "given" else None
        if m == 65:
            with pytest.raises(ValueError, match=rf"^{name}: expected M \(rows\) in \[1, 64\]"):
                compiled(lead, t, li)
        else:
            res, _ = compiled(lead, t, li)
            assert tuple(res.shape) == (m, HC, H)
    assert len(rec.calls) == 1


@pytest.mark.parametrize("functional", [False, True])
def test_finalize_rows_are_checked_before_outputs_are_allocated(recording_op, functional):
    op, rec = recording_op
    gemm2 = torch.zeros(TOP_K, H, dtype=torch.bfloat16)
    weights, idx = _expanded(BIG, TOP_K), _expanded(BIG, TOP_K, dtype=torch.int32)
    shared, residual = _expanded(BIG, H, dtype=torch.bfloat16), _expanded(BIG, HC, H, dtype=torch.bfloat16)
    post, comb, w = _expanded(BIG, HC), _expanded(BIG, HC, HC), torch.zeros(H, dtype=torch.bfloat16)
    args = (gemm2, weights, idx, shared, residual, post, comb, post, w, 1e-6)
    with pytest.raises(ValueError, match=r"^shared_output: expected M \(rows\) in \[1, 64\]"):
        if functional:
            torch.ops.mhccl.all_reduce_mhc_finalize(op._handle, *args)
        else:
            op.finalize(*args)
    assert rec.calls == []


def test_leading_tensor_of_another_rank_is_named():
    """A 1-D x (or shared_output) is named, not reported as a wrong count of the mixes."""
    _ops.ensure_registered()
    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64)
    lead, t = _call_inputs(2, "meta", True, "plain")
    epilogue = (t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6)
    with pytest.raises(ValueError, match=r"^x: expected shape \[M, 256\], got \[256\]$"):
        op(torch.zeros(H, dtype=torch.bfloat16, device="meta"), *epilogue)
    with pytest.raises(ValueError, match=r"^shared_output: expected shape \[M, 256\], got \[2, 1, 256\]$"):
        op.finalize(lead["gemm2_permuted"], lead["expert_weights"], lead["expanded_idx_to_permuted_idx"],
                    lead["shared_output"].view(2, 1, H), *epilogue)


@pytest.mark.parametrize("case", ["call layer_input", "call norm_weight", "functional residual",
                                  "finalize gemm2_permuted", "all_gather out"])
def test_a_meta_tensor_among_real_ones_is_refused(recording_op, case):
    """The dispatcher sends a call with any meta tensor to the fake implementation (Meta outranks
    CPU and CUDA), which used to return without a launch or an error: the outputs were left as they
    were, or new uninitialized ones returned. Refused, naming the tensor."""
    op, rec = recording_op
    m, bf = 2, torch.bfloat16
    lead, t = _call_inputs(m, "cpu", case.startswith("finalize"), "plain")
    meta = lambda v: v.to("meta")  # noqa: E731
    epilogue = [t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6]
    if case == "call layer_input":
        want, run = "layer_input", lambda: op(*lead.values(), *epilogue,
                                              layer_input=torch.zeros(m, H, dtype=bf, device="meta"))
    elif case == "call norm_weight":
        epilogue[4] = meta(epilogue[4])
        want, run = "norm_weight", lambda: op(*lead.values(), *epilogue)
    elif case == "functional residual":
        epilogue[0] = meta(epilogue[0])
        want, run = "residual", lambda: torch.ops.mhccl.all_reduce_mhc(op._handle, *lead.values(), *epilogue)
    elif case == "finalize gemm2_permuted":
        lead["gemm2_permuted"] = meta(lead["gemm2_permuted"])
        want, run = "gemm2_permuted", lambda: op.finalize(*lead.values(), *epilogue)
    else:
        ag = _meta_instance(mhccl.LamportAllGather, world_size=2, rank_capacity_bytes=4096, _op=rec, _device=0)
        want, run = "out", lambda: torch.ops.mhccl.all_gather_out(
            ag._handle, torch.zeros(4, 4), torch.zeros(8, 4, device="meta"))
    first = "shared_output" if case.startswith("finalize") else "inp" if want == "out" else "x"
    with pytest.raises(ValueError, match=rf"^{want}: expected a tensor on cpu \({first}'s device\), got meta$"):
        run()
    assert rec.calls == []


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")  # the caches turned off below
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("case", ["call", "call into fresh outputs", "finalize", "all_gather"])
def test_a_call_whose_results_go_unused_is_still_made_when_compiled(recording_op, backend, case):
    """Every op is a collective, one of the rank's sequence of calls that pair with the peers':
    torch.compile must make it even where nothing reads its outputs. It used to be removed as dead
    code (aot_eager and Inductor; also the `_out` ops writing buffers made in the graph): nothing
    launched and nothing counted, so where ranks traced different code (a result used on some
    ranks only) their calls paired wrongly from then on (a review, 2026-12-05)."""
    op, rec = recording_op
    bf = torch.bfloat16
    lead, t = _call_inputs(3, "cpu", case == "finalize", "plain")
    epilogue = (t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6)
    ag = _meta_instance(mhccl.LamportAllGather, world_size=2, rank_capacity_bytes=4096, _op=rec, _device=0)
    gathered = torch.ones(4, 4)

    def step(y):
        if case == "call":
            op(*lead.values(), *epilogue)
        elif case == "call into fresh outputs":
            op(*lead.values(), *epilogue, residual_out=torch.empty(3, HC, H, dtype=bf),
               layer_input=torch.empty(3, H, dtype=bf))
        elif case == "finalize":
            op.finalize(*lead.values(), *epilogue)
        else:
            ag(gathered)
        return y + 1

    torch._dynamo.reset()
    # Caches off: a graph another build of the package compiled (and cached) may have dropped it.
    with torch.compiler.config.patch(force_disable_caches=True):
        out = torch.compile(step, backend=backend, fullgraph=True)(torch.zeros(2))
    assert torch.equal(out, torch.ones(2))
    assert [c[0] for c in rec.calls] == ["finalize" if case == "finalize" else "call"]


def test_all_gather_size_is_checked_before_anything_is_allocated(recording_op):
    """An expanded inp of 2**40 rows: a ValueError, not the allocator's error for the output (or
    the copy of inp); and a 0-d tensor, which the call refuses, is not accepted either."""
    _, rec = recording_op
    ag = _meta_instance(mhccl.LamportAllGather, world_size=2, rank_capacity_bytes=4096, _op=rec, _device=0)
    big = _expanded(BIG, 4)
    want = r"^inp: expected a multiple of 16 bytes, from 16 to 4096 \(rank_capacity_bytes\), got 17592186044416 bytes"
    with pytest.raises(ValueError, match=want):
        ag(big)
    with pytest.raises(ValueError, match=want):
        torch.ops.mhccl.all_gather_out(ag._handle, big, torch.zeros(8, 4))
    assert rec.calls == []
    scalar = torch.zeros((), dtype=torch.complex128)  # 16 bytes
    assert not ag.accepts(scalar) and not _api._lib().all_gather_accepts(4096, scalar)  # as the C++ twin
    out = ag(torch.zeros(4, 4))
    assert tuple(out.shape) == (8, 4) and len(rec.calls) == 1


@pytest.mark.parametrize("pair,name,fp8", [
    ("mxfp8", "mxfp8 values", "float8_e8m0fnu"), ("mxfp8", "mxfp8 values", "float8_e5m2"),
    ("mxfp8", "mxfp8 scales", "float8_e4m3fn"), ("fp8", "fp8 values", "float8_e8m0fnu")])
def test_quantized_outputs_of_another_float8_format_are_refused(recording_op, pair, name, fp8):
    """float8 outputs reach the C++ checks as uint8 bytes, which it takes: a float8 format other
    than the role's (E4M3 values, UE8M0 MXFP8 scales) used to pass unnoticed."""
    op, rec = recording_op
    m = 2
    lead, t = _call_inputs(m, "cpu", False, "fp8")
    dtype = getattr(torch, fp8)
    values = torch.zeros(m, H, dtype=dtype if name.endswith("values") else torch.uint8)
    if pair == "mxfp8":
        scales = torch.zeros(mhccl.mxfp8_scale_bytes(m, H), dtype=dtype if name.endswith("scales") else torch.uint8)
        kw = dict(mxfp8_out=(values, scales))
    else:
        kw = dict(fp8_out=(values, mhccl.empty_fp8_group_scales(m, H, "cpu")))
    want = "float8_e8m0fnu" if name == "mxfp8 scales" else "float8_e4m3fn"
    with pytest.raises(ValueError, match=rf"^{name}: expected dtype {want} \(or uint8/int8\), got torch.{fp8}$"):
        op(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6, **kw)
    assert rec.calls == []


def test_mxfp8_outputs_of_their_float8_formats_reach_the_cpp_call_as_bytes(recording_op):
    op, rec = recording_op
    m = 2
    lead, t = _call_inputs(m, "cpu", False, "mxfp8")
    values = torch.zeros(m, H, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(mhccl.mxfp8_scale_bytes(m, H), dtype=torch.float8_e8m0fnu)
    op(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6,
       mxfp8_out=(values, scales))
    (_, args), = rec.calls
    assert args[-6].dtype == args[-5].dtype == torch.uint8
    assert args[-6].data_ptr() == values.data_ptr() and args[-5].data_ptr() == scales.data_ptr()


# --- what a tester found (45f78e8: inputs that reached the kernels or gave wrong layouts) -----

def test_inputs_of_another_shape_are_passed_on_uncopied(recording_op):
    """A non-contiguous input is copied only when its shape is the one the C++ check asks for: an
    expanded residual or norm weight (stride 0, 2**40 rows) reaches the check as it is (which
    names the expected shape) instead of being copied first (the allocator's error)."""
    op, rec = recording_op
    m = 2
    lead, t = _call_inputs(m, "cpu", False, "plain")
    big_residual = _expanded(BIG, HC, H, dtype=torch.bfloat16)
    big_weight = torch.zeros(1, dtype=torch.bfloat16).expand(BIG)
    op(lead["x"], big_residual, t["post"], t["comb"], t["pre"], big_weight, 1e-6)
    (_, args), = rec.calls
    assert args[1] is big_residual and args[5] is big_weight
    rec.calls.clear()
    strided = torch.zeros(m, HC, 2 * H, dtype=torch.bfloat16)[..., ::2]  # the right shape: copied
    op(lead["x"], strided, t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6)
    (_, args), = rec.calls
    assert args[1] is not strided and args[1].is_contiguous() and tuple(args[1].shape) == (m, HC, H)


@pytest.mark.parametrize("eps", [-1e-50, -1.0, float("nan"), float("inf"), 1e39])
@pytest.mark.parametrize("form", ["class", "functional", "out"])
def test_eps_outside_float32_or_negative_is_refused(recording_op, eps, form):
    """A negative eps however small (it would round to -0.0 in float32 and pass the C++ check),
    NaN, Inf, and values beyond FLT_MAX (an undefined conversion) are ValueErrors before any call."""
    op, rec = recording_op
    lead, t = _call_inputs(2, "cpu", False, "plain")
    args = (lead["x"], t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], eps)
    with pytest.raises(ValueError, match="^norm_eps: expected a finite RMSNorm epsilon >= 0"):
        if form == "class":
            op(*args)
        elif form == "functional":
            torch.ops.mhccl.all_reduce_mhc(op._handle, *args)
        else:
            torch.ops.mhccl.all_reduce_mhc_out(op._handle, *args, "auto", torch.empty_like(t["residual"]),
                                               torch.empty_like(lead["x"]), None, None, None, None)
    assert rec.calls == []
    for fine in (0.0, -0.0, 1e-6, 3.4028234663852886e38):
        op(*args[:-1], fine)
    assert len(rec.calls) == 4


def test_bool_like_values_are_not_ints_or_floats():
    np = pytest.importorskip("numpy")
    for v in (torch.tensor(True), np.True_, np.array(True)):
        with pytest.raises(TypeError, match="^m: expected an int"):
            _api._int_arg("m", v)
        with pytest.raises(TypeError, match="^norm_eps: expected a float"):
            _api._float_arg("norm_eps", v)
    assert _api._int_arg("m", torch.tensor(3)) == 3 and _api._int_arg("m", np.int32(3)) == 3
    assert _api._bool_arg("residual_only", np.True_) is True
    assert _api._bool_arg("residual_only", np.False_) is False
    with pytest.raises(TypeError, match="^residual_only: expected a bool, got Tensor"):
        _api._bool_arg("residual_only", torch.tensor(True))
    with pytest.raises(TypeError, match="^norm_eps: expected a float, got Tensor"):
        _api._float_arg("norm_eps", torch.zeros((), device="meta"))  # no value to read
    with pytest.raises(RuntimeError, match="names no live instance"):
        _ops.instance(True, "AllReduceMHC")  # a bool is no handle

    class DeviceLike:  # .type without .index: the current CUDA device, as for torch.device("cuda")
        type = "cuda"
    def outcome(device):  # without a GPU torch.cuda.current_device() raises: the same for both
        try:
            return _api._device_index(device)
        except Exception as e:  # noqa: BLE001
            return type(e)
    assert outcome(DeviceLike()) is not AttributeError
    assert outcome(DeviceLike()) == outcome(torch.device("cuda"))


@pytest.mark.parametrize("m", [4, 8, 128])
def test_row_major_fp8_scales_of_the_right_count_are_refused(m):
    """At M % 4 == 0 a row-major [M, G] tensor has the Mp * G floats of the layout, but its [r, g]
    is not scale(r, g) (at g * Mp + r): refused by the view helper (and the C++ check), where it
    used to be taken for the flat buffer."""
    g = H // 128
    with pytest.raises(ValueError, match=r"^scales: expected the flat buffer .* got the row-major shape"):
        mhccl.fp8_group_scales_view(torch.zeros(m, g), m, H)
    assert mhccl.fp8_group_scales_view(torch.zeros(g, m), m, H).stride() == (1, m)  # [G, Mp]: the storage order
    assert mhccl.fp8_group_scales_view(torch.zeros(m * g), m, H).stride() == (1, m)


def test_fp8_scales_of_m_equal_to_groups_are_taken_as_g_by_mp():
    """At M == G == Mp (M = 40 at H = 5120) the [G, Mp] storage and a row-major [M, G] have one
    shape: taken as [G, Mp] (the C++ GPU tests pass that shape), not refused."""
    assert mhccl.fp8_group_scales_view(torch.zeros(40, 40), 40, 5120).stride() == (1, 40)
    with pytest.raises(ValueError, match=r"got the row-major shape"):  # M = 36: Mp = 36 != G
        mhccl.fp8_group_scales_view(torch.zeros(36, 40), 36, 5120)


def test_all_gather_refuses_more_than_16_dimensions_everywhere(recording_op):
    """accepts() says what the call does: 17 dimensions are refused by both (docs/USAGE.md's
    ``gather(t) if gather.accepts(t) else fallback(t)`` pattern)."""
    _, rec = recording_op
    ag = _meta_instance(mhccl.LamportAllGather, world_size=2, rank_capacity_bytes=4096, _op=rec, _device=0)
    t17 = torch.zeros([1] * 16 + [16])
    assert not ag.accepts(t17) and not _api._lib().all_gather_accepts(4096, t17)
    with pytest.raises(ValueError, match="^inp: expected at most 16 dimensions, got 17"):
        ag(t17)
    assert ag.accepts(torch.zeros([1] * 15 + [16]))
    with pytest.raises(ValueError, match=r"^inp: expected a multiple of 16 bytes"):  # the fake's own check
        torch.ops.mhccl.all_gather(ag._handle, torch.zeros(1 << 20, device="meta"))
    with pytest.raises(ValueError, match=r"^inp: a meta tensor"):  # the class refuses meta tensors eagerly
        ag(torch.zeros(1 << 20, device="meta"))
    assert rec.calls == []


def test_fakes_refuse_what_the_call_refuses(handle):
    """The functional fakes check the leading tensor's shape and M's range, eps and the pair of
    quantized outputs as the real implementations do (a bad call fails when traced on fake
    tensors, not only when it runs); a 0-d tensor is a ValueError, not an IndexError."""
    h, _ = handle
    lead, t = _call_inputs(3, "meta", False, "plain")
    rest = (t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"])
    for x, want in ((torch.zeros(H, dtype=torch.bfloat16, device="meta"), r"^x: expected shape \[M, 256\]"),
                    (torch.zeros((), dtype=torch.bfloat16, device="meta"), r"^x: expected shape \[M, 256\], got a scalar"),
                    (torch.zeros(3, H + 8, dtype=torch.bfloat16, device="meta"), r"^x: expected shape"),
                    (torch.zeros(5000, H, dtype=torch.bfloat16, device="meta"), r"^x: expected M \(rows\) in \[1, 4096\]")):
        with pytest.raises(ValueError, match=want):
            torch.ops.mhccl.all_reduce_mhc(h, x, *rest, 1e-6)
    with pytest.raises(ValueError, match="^norm_eps: expected a finite RMSNorm epsilon"):
        torch.ops.mhccl.all_reduce_mhc(h, lead["x"], *rest, float("nan"))
    with pytest.raises(ValueError, match="^with_mxfp8 and with_fp8: expected at most one"):
        torch.ops.mhccl.all_reduce_mhc(h, lead["x"], *rest, 1e-6, "auto", True, True)
    flead, _ = _call_inputs(3, "meta", True, "plain")
    with pytest.raises(ValueError, match=r"^shared_output: expected shape"):
        torch.ops.mhccl.all_reduce_mhc_finalize(h, flead["gemm2_permuted"], flead["expert_weights"],
                                                flead["expanded_idx_to_permuted_idx"],
                                                torch.zeros(3, dtype=torch.bfloat16, device="meta"), *rest, 1e-6)
    with pytest.raises(ValueError, match="^inp: expected at least one dimension, got a scalar"):
        torch.ops.mhccl.all_gather(h, torch.zeros((), device="meta"))


def test_protocol_for_takes_only_the_rows_a_call_takes(recording_op):
    op, _ = recording_op

    class Protocols:
        def protocol_for(self, m, finalize):
            return "one-shot"
    op._op = Protocols()
    assert op.protocol_for(1) == op.protocol_for(64, finalize=True) == "one-shot"
    for m in (0, -1, 65):
        with pytest.raises(ValueError, match=r"^m: expected an int in \[1, 64\]"):
            op.protocol_for(m)
    with pytest.raises(TypeError, match="^finalize: expected a bool"):
        op.protocol_for(1, finalize=1)


def test_size_helpers_trace_with_a_dynamic_m():
    """vLLM compiles with the token count dynamic (fullgraph): the size helpers take its symbolic
    M (they used to call getattr on it, which Dynamo cannot trace) and give the eager sizes."""
    h = 5120

    def sizes(x):
        m = x.shape[0]
        mx = torch.zeros(mhccl.mxfp8_scale_bytes(m, h), dtype=torch.uint8)
        flat = torch.zeros(mhccl.fp8_group_scale_bytes(m, h) // 4)
        view = mhccl.fp8_group_scales_view(flat, m, h)
        empty = mhccl.empty_fp8_group_scales(m, h, x.device)
        again = mhccl.fp8_group_scales_view(empty, m, h)  # a view: its storage not traced
        rows = torch.zeros(mhccl.fp8_group_scale_rows(m))
        return mx, flat, view, empty, rows, again

    torch._dynamo.reset()
    compiled = torch.compile(sizes, fullgraph=True, backend="aot_eager", dynamic=True)
    for m in (1, 5, 9, 40):
        x = torch.zeros(m, 8)
        got, want = compiled(x), sizes(x)
        assert [(tuple(t.shape), t.stride()) for t in got] == [(tuple(t.shape), t.stride()) for t in want]


# --- from an adversarial review of the Python layer (2026-12-04) --------------------------------

@pytest.fixture
def counting_op(monkeypatch):
    from test_cpu import _CountingComm  # the communicator stand-in of the eager count's test

    _ops.ensure_registered()
    comm, rec = _CountingComm(), Recorder()
    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64,
                        _op=rec, _device=0, _comm=comm)
    monkeypatch.setattr(_api, "_stream", lambda d: 1234)
    return op, comm, rec


def _plain_inputs(m, post_cols=HC, x_cols=H):
    bf = torch.bfloat16
    return (torch.zeros(m, x_cols, dtype=bf), torch.zeros(m, HC, H, dtype=bf), torch.zeros(m, post_cols),
            torch.zeros(m, HC, HC), torch.zeros(m, HC), torch.zeros(H, dtype=bf))


@pytest.mark.parametrize("bad", ["eps nan", "post count", "x width"])
def test_a_call_rejected_while_compiled_is_counted(counting_op, bad):
    """SPEC.md, "Ranks that diverge": a call rejected on some ranks only (the caller caught the
    error and went on) advances this rank's count of rejected calls, which the next call's
    identity carries. Eagerly it always did; under torch.compile (fullgraph=False) the Python
    checks raise while Dynamo traces, no call runs for the C++ op to count, and the count is
    made outside the graph."""
    op, comm, rec = counting_op
    eps = float("nan") if bad == "eps nan" else 1e-6
    args = _plain_inputs(3, post_cols=HC + 1 if bad == "post count" else HC, x_cols=H + 8 if bad == "x width" else H)
    with pytest.raises(mhccl.InvalidArgumentError):
        op(*args, eps)
    assert comm.rejected_calls == 1  # eager
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a, eps), backend="aot_eager")
    for i in (2, 3):
        with pytest.raises(mhccl.InvalidArgumentError):
            compiled(*args)
        assert comm.rejected_calls == i
    assert rec.calls == []


def _counting_all_gather(rec):
    """A LamportAllGather stand-in as counting_op's AllReduceMHC: its C++ op the recorder, its
    communicator counting rejected calls."""
    from test_cpu import _CountingComm

    comm = _CountingComm()
    return _meta_instance(mhccl.LamportAllGather, world_size=4, rank_capacity_bytes=1 << 20,
                          _op=rec, _device=0, _comm=comm), comm


@pytest.mark.parametrize("which", ["call", "finalize", "all_gather"])
def test_an_eager_call_on_meta_tensors_is_refused_and_counted(counting_op, which):
    """An eager call whose tensors are all meta tensors reached only the fake implementation
    (torch's meta kernel): meta outputs, no error, no call counted, so this rank's next call would
    have paired with its peers' call of this one (an adversarial review, 2026-12-05). Refused now,
    and counted as a rejected call; under torch.compile meta tensors still trace."""
    op, comm, rec = counting_op
    if which == "all_gather":
        op, comm = _counting_all_gather(rec)
        with pytest.raises(mhccl.InvalidArgumentError, match="^inp: a meta tensor"):
            op(torch.zeros(5, 8, device="meta"))
    else:
        lead, t = _call_inputs(3, "meta", which == "finalize", "plain")
        fn = op.finalize if which == "finalize" else op
        name = "shared_output" if which == "finalize" else "x"
        with pytest.raises(mhccl.InvalidArgumentError, match=f"^{name}: a meta tensor"):
            fn(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"], 1e-6)
    assert comm.rejected_calls == 1
    assert rec.calls == []


@pytest.mark.parametrize("which", ["call", "finalize", "all_gather"])
def test_a_compiled_call_run_on_meta_tensors_is_counted(counting_op, which):
    """The classes refuse an eager call on meta tensors; a compiled graph (or the torch op itself)
    run on meta tensors reaches only the fake implementation, as torch's meta kernel, and returns
    meta outputs: it is counted as a rejected call there, once a run (tracing counts nothing), so
    that where the peers made the call for real every rank's next call is a DivergenceError."""
    op, comm, rec = counting_op
    if which == "all_gather":
        op, comm = _counting_all_gather(rec)
        args = (torch.zeros(5, 8, device="meta"),)
        direct = lambda: torch.ops.mhccl.all_gather(op._handle, *args)  # noqa: E731
        step = op
    else:
        lead, t = _call_inputs(3, "meta", which == "finalize", "plain")
        args = (*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"])
        fn = op.finalize if which == "finalize" else op
        step = lambda *a: fn(*a, 1e-6)  # noqa: E731
        direct = lambda: _functional(op._handle, lead, t, which == "finalize", "plain")  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for i in (1, 2):
        outs = compiled(*args)
        assert all(o.device.type == "meta" for o in (outs if isinstance(outs, tuple) else (outs,)) if o is not None)
        assert comm.rejected_calls == i
    direct()
    assert comm.rejected_calls == 3
    assert rec.calls == []


@pytest.mark.parametrize("dynamic", [True, None])
def test_class_call_traces_with_fullgraph_when_eps_is_dynamic(recording_op, monkeypatch, dynamic):
    """USAGE.md: code calling the classes compiles with fullgraph=True. A dynamic eps (symbolic
    float: dynamic=True, or automatic dynamic once eps changes) was untraceable in the argument
    checks (a getattr on it). The first check of a tensor's dtype in the process may be traced
    too (the set of dtypes DLPack cannot carry, built then)."""
    op, rec = recording_op
    monkeypatch.setattr(_api, "_OPAQUE_DTYPES", None)
    torch._dynamo.reset()
    f = torch.compile(lambda *a, eps: op(*a, eps), backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for eps in (1e-6, 1e-5):
        f(*_plain_inputs(3), eps=eps)
    assert [args[6] for _, args in rec.calls] == [1e-6, 1e-5]


@pytest.mark.parametrize("which", ["all_reduce_mhc", "all_gather"])
def test_a_handle_of_the_other_kind_is_an_invalid_argument(which):
    """_ops.py: a bad handle is an InvalidArgumentError; one of the other op kind was a bare
    AttributeError."""
    _ops.ensure_registered()
    ag = _meta_instance(mhccl.LamportAllGather, world_size=2, rank_capacity_bytes=4096)
    ar = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64)
    meta = [t.to("meta") for t in _plain_inputs(2)]
    with pytest.raises(mhccl.InvalidArgumentError, match="not the (AllReduceMHC|LamportAllGather) this op takes"):
        if which == "all_reduce_mhc":
            torch.ops.mhccl.all_reduce_mhc(ag._handle, *meta, 1e-6)
        else:
            torch.ops.mhccl.all_gather(ar._handle, torch.zeros(4, 4, device="meta"))


@pytest.mark.parametrize("kind", ["sparse x", "sparse post", "nested x", "quantized x"])
def test_tensors_dlpack_cannot_carry_are_invalid_arguments(recording_op, kind):
    """A sparse, nested or quantized tensor: an InvalidArgumentError naming the argument, before
    anything reaches the C++ call (they were torch's RuntimeError, or nanobind's TypeError)."""
    op, rec = recording_op
    x, residual, post, comb, pre, w = _plain_inputs(2)
    if kind == "sparse x":
        x = x.to_sparse()
    elif kind == "sparse post":
        post = post.to_sparse()
    elif kind == "nested x":
        x = torch.nested.nested_tensor([torch.zeros(H, dtype=torch.bfloat16)] * 2)
    else:
        x = torch.quantize_per_tensor(x.float(), 1.0, 0, torch.quint8)
    with pytest.raises(mhccl.InvalidArgumentError, match="^" + kind.split()[1]):
        op(x, residual, post, comb, pre, w, 1e-6)
    assert rec.calls == []


@pytest.mark.parametrize("dtype", ["quint8", "qint32", "bits16", "bits8"])
def test_all_gather_accepts_what_the_call_takes(dtype):
    """accepts() decides what the call takes (USAGE.md: gather(t) if gather.accepts(t) else
    fallback(t)): False, not an error, for dtypes no DLPack dtype carries, which the call refuses."""
    _ops.ensure_registered()
    ag = _meta_instance(mhccl.LamportAllGather, world_size=2, rank_capacity_bytes=4096)
    t = torch.zeros(64, dtype=torch.uint8).view(getattr(torch, dtype))
    assert ag.accepts(t) is False
    with pytest.raises(mhccl.InvalidArgumentError, match="^inp: expected a tensor of a plain dtype"):
        ag(t)


def test_a_complex_eps_is_refused():
    """norm_eps: a float >= 0. A NumPy complex was taken as its real part."""
    np = pytest.importorskip("numpy")
    for eps in (np.complex128(1e-6 + 1j), np.complex64(1e-6 + 0.5j), 1e-6 + 1j):
        with pytest.raises(TypeError, match="^norm_eps: expected a float"):
            _api._eps_arg("norm_eps", eps)


def test_cuda_without_an_index_and_no_device_is_no_device_error():
    """device='cuda' (the current device) on a machine without one: NoDeviceError, as device=0
    (it was torch's RuntimeError)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    for device in ("cuda", torch.device("cuda")):
        with pytest.raises(mhccl.NoDeviceError):
            _api._device_index(device)


def test_a_group_torch_distributed_cannot_use_is_an_invalid_argument():
    """A ProcessGroup given while torch.distributed is not initialized: an InvalidArgumentError
    naming group (it was torch's ValueError)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("torch.distributed is initialized in this process")
    pg = dist.ProcessGroup(dist.HashStore(), 0, 1)
    with pytest.raises(mhccl.InvalidArgumentError, match="^group: "):
        _api._group_layout(pg)


def test_a_group_destroyed_since_can_still_be_forgotten(tmp_path, monkeypatch):
    """The cache keeps a communicator with its group until forget_communicator: given the group
    object, it is found after torch.distributed.destroy_process_group() too (a review, 2026-12-05:
    forgetting asked torch.distributed about the group, which raised for a destroyed one, and
    the entry, an NCCL communicator and its memory, stayed for the process's life)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("torch.distributed is initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    world = dist.group.WORLD
    monkeypatch.setattr(_api, "_COMMUNICATORS", {(id(world), 0, None, True, False): ("comm", world)})
    dist.destroy_process_group()
    assert mhccl.forget_communicator() == 0  # None: TP=1 now, not the destroyed world
    assert mhccl.forget_communicator(world) == 1 and not _api._COMMUNICATORS


def test_a_call_with_tensors_on_two_devices_rejected_while_compiled_is_counted(counting_op):
    """Tensors on two devices (here a weight never materialized, on meta, among CPU tensors):
    refused in the class while torch.compile traces, counted, an InvalidArgumentError; in the
    fake implementation alone it reached the caller as torch's TorchRuntimeError, not counted."""
    op, comm, rec = counting_op
    x, residual, post, comb, pre, w = _plain_inputs(3)
    w = w.to("meta")
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a, 1e-6), backend="aot_eager")
    for i in (1, 2):
        with pytest.raises(mhccl.InvalidArgumentError, match="^norm_weight: expected a tensor on cpu"):
            compiled(x, residual, post, comb, pre, w)
        assert comm.rejected_calls == i
    assert rec.calls == []
