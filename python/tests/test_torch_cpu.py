"""The PyTorch side of the package without a GPU: the choice of the TP group (a stand-in vLLM),
the input forms the reference module accepts, and the torch ops (registration, schemas, fake
implementations on meta tensors and FakeTensors for every variant, torch.library.opcheck on meta
tensors, and Dynamo tracing the classes' calls with fullgraph=True). Skipped without PyTorch."""

import os
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/install-deps.sh --python installs it)")

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
    op = types.SimpleNamespace(hc_mult=HC, top_k=TOP_K)
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
    """What the fake implementations read of an instance (no GPU to build a real one here)."""

    def __init__(self, world_size=2):
        self.hidden_size, self.hc_mult, self.top_k, self.world_size = H, HC, TOP_K, world_size


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
        for out in ("layer_input", "mxfp8_values", "mxfp8_scales"):
            assert f"!)? {out}," in s or f"!)? {out})" in s, s
        assert "-> ()" in s
        assert "Tensor residual," in s  # residual itself is read only (an in-place call aliases it)
    assert "!) out" in schema["all_gather_out"]
    assert schema["all_reduce_mhc"].endswith("-> Tensor[]")
    assert "bool with_mxfp8=False" in schema["all_reduce_mhc"]
    assert schema["all_gather"] == "mhccl::all_gather(int handle, Tensor inp) -> Tensor"


def test_dead_handle_raises(handle):
    h, _ = handle
    obj = StandIn()
    dead = _ops.register_instance(obj)
    del obj
    with pytest.raises(RuntimeError, match=f"handle {dead} names no live instance"):
        _ops.instance(dead)
    assert _ops.instance(h) is handle[1]


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
            "auto", variant == "mxfp8")
    op = torch.ops.mhccl.all_reduce_mhc_finalize if finalize else torch.ops.mhccl.all_reduce_mhc
    return op(h, *args)


def _expected_shapes(m, variant):
    want = [((m, HC, H), torch.bfloat16)]
    if variant != "residual":
        want.append(((m, H), torch.bfloat16))
    if variant == "mxfp8":
        want += [((m, H), torch.float8_e4m3fn), ((mhccl.mxfp8_scale_bytes(m, H),), torch.uint8)]
    return want


VARIANTS = [(f, v) for f in (False, True) for v in ("plain", "mxfp8", "residual")]


@pytest.mark.parametrize("finalize,variant", VARIANTS)
@pytest.mark.parametrize("m", [1, 129])
def test_fake_functional_forms_on_meta(handle, finalize, variant, m):
    lead, t = _call_inputs(m, "meta", finalize, variant)
    outs = _functional(handle[0], lead, t, finalize, variant)
    assert [(tuple(o.shape), o.dtype) for o in outs] == _expected_shapes(m, variant)
    assert all(o.device.type == "meta" and o.is_contiguous() for o in outs)


@pytest.mark.parametrize("finalize,variant", VARIANTS)
def test_fake_functional_forms_under_fake_tensor_mode(handle, finalize, variant):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        lead, t = _call_inputs(7, "cpu", finalize, variant)  # fake CPU tensors: no real kernel runs
        outs = _functional(handle[0], lead, t, finalize, variant)
    assert all(mode.is_our_fake(o) if hasattr(mode, "is_our_fake") else True for o in outs)
    assert [(tuple(o.shape), o.dtype) for o in outs] == _expected_shapes(7, variant)


def _out_args(h, lead, t, finalize, variant, m, device):
    bf = torch.bfloat16
    outs = dict(residual_out=torch.zeros(m, HC, H, dtype=bf, device=device), layer_input=None,
                mxfp8_values=None, mxfp8_scales=None)
    if variant != "residual":
        outs["layer_input"] = torch.zeros(m, H, dtype=bf, device=device)
    if variant == "mxfp8":
        outs["mxfp8_values"] = torch.zeros(m, H, dtype=torch.float8_e4m3fn, device=device)
        outs["mxfp8_scales"] = torch.zeros(mhccl.mxfp8_scale_bytes(m, H), dtype=torch.uint8, device=device)
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
                           t["norm_weight"], 1e-6, "auto", variant == "mxfp8"))
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
    kw = {}
    if form != "new":  # caller-owned outputs; "inplace": residual_out is residual
        kw = dict(residual_out=t["residual"] if form == "inplace" else outs["residual_out"],
                  layer_input=outs["layer_input"])

    def step(lead, t):
        fn = op.finalize if finalize else op
        res, li = fn(*lead.values(), t["residual"], t["post"], t["comb"], t["pre"], t["norm_weight"],
                     1e-6, mxfp8_out=mx, **kw)
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
                 values, scales, stream, protocol):
            lib.check_call(H, HC, 64, TOP_K, False, False, 0, x, residual, post, comb, pre,
                           norm_weight, eps, residual_out, layer_input, values, scales)

    op = _meta_instance(mhccl.AllReduceMHC, hidden_size=H, hc_mult=HC, top_k=TOP_K, capacity=64,
                        _op=CheckOnly(), _device=0)
    # _stream asks torch.cuda for the current stream of cuda:0, which needs CUDA: stubbed here.
    orig, _api._stream = _api._stream, lambda t: 0
    try:
        with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor on device cuda:0, got device type 1"):
            op(torch.zeros(m, H, dtype=bf), torch.zeros(m, HC, H, dtype=bf), torch.zeros(m, HC),
               torch.zeros(m, HC, HC), torch.zeros(m, HC), torch.zeros(H, dtype=bf), 1e-6)
    finally:
        _api._stream = orig


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
    with pytest.raises(TypeError, match="^protocol: expected a str, got int"):
        op(*args, 1e-6, None, 2)
    with pytest.raises(TypeError, match="^residual_out: expected a torch.Tensor or None, got int"):
        op(*args, 1e-6, residual_out=3)
    with pytest.raises(ValueError, match=r"^post: expected 8 elements"):
        op(args[0], args[1], torch.zeros(2, 3, device="meta"), *args[3:], 1e-6)


def test_torch_is_imported_by_registration_only():
    import subprocess

    probe = ("import sys, mhccl; from mhccl import _ops; a = 'torch' in sys.modules; "
             "_ops.ensure_registered(); import torch; "
             "print(a, hasattr(torch.ops.mhccl, 'all_reduce_mhc'))")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=env)
    assert out.stdout.split() == ["False", "True"]
