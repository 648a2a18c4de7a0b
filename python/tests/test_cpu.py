"""The Python package without a GPU: it imports, its pure parts compute, and argument errors
surface as ValueError with the C++ message (NumPy arrays stand in for tensors through DLPack)."""

import os
import sys
import types

import numpy as np
import pytest

import mhccl
from mhccl import _api


def test_import_needs_no_gpu_and_no_torch():
    import subprocess

    # Without PyTorch (an import of it fails): the package imports, the extension is not loaded,
    # no torch op is registered.
    probe = ("import sys; sys.modules['torch'] = None; import mhccl, mhccl._ops; "
             "print('mhccl._mhccl' in sys.modules, mhccl._ops._REGISTERED)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr
    # With whatever this machine has: still no extension loaded at import.
    probe = "import sys, mhccl; print('mhccl._mhccl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"], out.stderr
    assert mhccl.__version__
    assert set(mhccl.__all__) == {"AllReduceMHC", "LamportAllGather", "mxfp8_scale_bytes",
                                  "fp8_group_scale_bytes", "fp8_group_scale_rows",
                                  "fp8_group_scales_view", "empty_fp8_group_scales", "forget_communicator",
                                  "Error", "InvalidArgumentError", "UnsupportedError",
                                  "ArgumentTypeError", "NoDeviceError", "CudaError", "NcclError",
                                  "PeerError", "PeerTimeoutError", "DivergenceError",
                                  "UnusableError", "InvalidRouteError"}
    assert all(hasattr(mhccl, name) for name in mhccl.__all__)


@pytest.mark.parametrize("m,h,want", [(1, 5120, 512 * 1 * 40), (300, 5120, 512 * 3 * 40),
                                      (128, 5120, 512 * 40), (129, 64, 512 * 2 * 1),
                                      (1, 2880, 512 * 23)])
def test_mxfp8_scale_bytes(m, h, want):
    assert mhccl.mxfp8_scale_bytes(m, h) == want
    assert _api._lib().mxfp8_scale_bytes(m, h) == want  # the C++ definition agrees


def test_mxfp8_scale_bytes_rejects_bad_hidden():
    with pytest.raises(ValueError, match="multiple of 32"):
        mhccl.mxfp8_scale_bytes(4, 5120 + 8)


@pytest.mark.parametrize("m,h,name", [(1.5, 5120, "m"), (True, 5120, "m"), ("4", 5120, "m"),
                                      (None, 5120, "m"), (4, 5120.0, "hidden"), (4, False, "hidden")])
def test_mxfp8_scale_bytes_takes_ints_only(m, h, name):
    with pytest.raises(TypeError, match=f"^{name}: expected an int"):
        mhccl.mxfp8_scale_bytes(m, h)


def test_mxfp8_scale_bytes_range():
    assert mhccl.mxfp8_scale_bytes(np.int64(300), np.int32(5120)) == 512 * 3 * 40  # __index__ ints
    assert mhccl.mxfp8_scale_bytes(0, 32) == 0
    with pytest.raises(ValueError, match=r"^m: expected an int in \[0, "):
        mhccl.mxfp8_scale_bytes(-1, 5120)
    # 2**62 rows: 512 * 2**55 * 40 bytes, beyond int64 (where the C++ twin returns -1)
    with pytest.raises(ValueError, match="exceed int64"):
        mhccl.mxfp8_scale_bytes(2**62, 5120)
    with pytest.raises(ValueError, match=r"^m: expected an int in"):
        mhccl.mxfp8_scale_bytes(2**64, 5120)
    # The largest M that fits: 512 * ceil(M/128) * 1 <= 2**63 - 1 at H = 32.
    top = (2**63 - 1) // 512 * 128
    assert mhccl.mxfp8_scale_bytes(top, 32) == 512 * (top // 128)
    with pytest.raises(ValueError, match="exceed int64"):
        mhccl.mxfp8_scale_bytes(top + 1, 32)


@pytest.mark.parametrize("m,rows", [(0, 0), (1, 4), (3, 4), (4, 4), (5, 8), (129, 132), (1024, 1024)])
def test_fp8_group_scale_rows(m, rows):
    assert mhccl.fp8_group_scale_rows(m) == rows
    assert _api._lib().fp8_group_scale_rows(m) == rows  # the C++ definition agrees


@pytest.mark.parametrize("m,h,want", [(1, 5120, 4 * 4 * 40), (3, 7168, 4 * 4 * 56), (5, 4096, 4 * 8 * 32),
                                      (129, 128, 4 * 132), (1024, 5120, 4 * 1024 * 40), (0, 128, 0)])
def test_fp8_group_scale_bytes(m, h, want):
    assert mhccl.fp8_group_scale_bytes(m, h) == want
    assert _api._lib().fp8_group_scale_bytes(m, h) == want


def test_fp8_group_scale_bytes_argument_checks():
    with pytest.raises(ValueError, match="^hidden: expected a positive multiple of 128, got 5152"):
        mhccl.fp8_group_scale_bytes(4, 5152)  # a multiple of 32, not of 128
    assert _api._lib().fp8_group_scale_bytes(4, 5152) == -1
    with pytest.raises(ValueError, match=r"^hidden: expected an int in \[1, "):
        mhccl.fp8_group_scale_bytes(4, 0)
    with pytest.raises(ValueError, match=r"^m: expected an int in \[0, "):
        mhccl.fp8_group_scale_bytes(-1, 5120)
    with pytest.raises(ValueError, match=r"^m: expected an int in \[0, 4611686018427387904\]"):
        mhccl.fp8_group_scale_rows(2**62 + 1)
    assert _api._lib().fp8_group_scale_rows(2**62 + 1) == -1
    assert mhccl.fp8_group_scale_rows(np.int64(5)) == 8  # __index__ ints
    for m, h, name in [(1.5, 5120, "m"), (True, 5120, "m"), ("4", 5120, "m"), (4, 5120.0, "hidden"),
                       (4, False, "hidden")]:
        with pytest.raises(TypeError, match=f"^{name}: expected an int"):
            mhccl.fp8_group_scale_bytes(m, h)
    with pytest.raises(TypeError, match="^m: expected an int"):
        mhccl.fp8_group_scale_rows(4.0)
    # NumPy arrays have __index__ but refuse it for several elements or floats: still named.
    with pytest.raises(TypeError, match="^m: expected an int, got ndarray"):
        mhccl.fp8_group_scale_bytes(np.zeros(2, np.int64), 5120)
    with pytest.raises(TypeError, match="^hidden: expected an int, got ndarray"):
        mhccl.mxfp8_scale_bytes(4, np.array([128.0]))
    # The C++ domain ends at 2**62 bytes: the largest M that fits at H = 128 (G = 1) and one past.
    top = 2**60
    assert mhccl.fp8_group_scale_bytes(top, 128) == 2**62 == _api._lib().fp8_group_scale_bytes(top, 128)
    with pytest.raises(ValueError, match=r"exceed 2\*\*62"):
        mhccl.fp8_group_scale_bytes(top + 1, 128)
    assert _api._lib().fp8_group_scale_bytes(top + 1, 128) == -1
    with pytest.raises(ValueError, match=r"exceed 2\*\*62"):
        mhccl.fp8_group_scale_bytes(2**62, 5120)


@pytest.mark.parametrize("kwargs,name,want", [
    (dict(hidden_size=5120.0), "hidden_size", "an int"),
    (dict(hc_mult="4"), "hc_mult", "an int"),
    (dict(max_num_tokens=None), "max_num_tokens", "an int"),
    (dict(top_k=6.0), "top_k", "an int"),
    (dict(quantize_layer_input=1), "quantize_layer_input", "a bool"),
    (dict(residual_only="yes"), "residual_only", "a bool"),
    (dict(quantize_layer_input_fp8=1), "quantize_layer_input_fp8", "a bool"),
    (dict(quantize_layer_input_fp8=True, fp8_ue8m0_scales=None), "fp8_ue8m0_scales", "a bool"),
    (dict(two_shot_min_rows=1.5), "two_shot_min_rows", "an int"),
    (dict(nccl_min_finalize_rows=True), "nccl_min_finalize_rows", "an int"),
])
def test_config_type_errors_name_the_argument(kwargs, name, want):
    args = dict(hidden_size=5120, hc_mult=4, max_num_tokens=64, top_k=6, device=0)
    args.update(kwargs)
    with pytest.raises(TypeError, match=f"^{name}: expected {want}, got "):
        mhccl.AllReduceMHC(**args)


def test_config_ints_beyond_the_cpp_types_are_value_errors():
    args = dict(hidden_size=5120, hc_mult=4, max_num_tokens=64, top_k=6, device=0)
    with pytest.raises(ValueError, match=r"^hc_mult: expected an int in \[-2147483648, 2147483647\]"):
        mhccl.AllReduceMHC(**{**args, "hc_mult": 2**40})
    with pytest.raises(ValueError, match=r"^max_num_tokens: expected an int in"):
        mhccl.AllReduceMHC(**{**args, "max_num_tokens": 2**63})
    with pytest.raises(TypeError, match=r"^rank_capacity_bytes: expected an int, got float"):
        mhccl.LamportAllGather(rank_capacity_bytes=4096.0, device=0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(hidden_size=5124), "hidden_size: expected a positive multiple of 8"),
    (dict(hidden_size=5128, quantize_layer_input=True), "multiple of 32"),
    (dict(hc_mult=3), "hc_mult: expected 1, 2, 4 or 8"),
    (dict(hidden_size=5152, quantize_layer_input_fp8=True), "quantize_layer_input_fp8 needs a multiple of 128"),
    (dict(quantize_layer_input=True, quantize_layer_input_fp8=True),
     "quantize_layer_input and quantize_layer_input_fp8: expected at most one quantized"),
    (dict(fp8_ue8m0_scales=True), "fp8_ue8m0_scales: .* needs quantize_layer_input_fp8=true"),
    (dict(top_k=17), "top_k: expected 1..16"),
    (dict(max_num_tokens=0), "max_num_tokens"),
    (dict(two_shot_min_rows=-1), "two_shot_min_rows"),
    (dict(nccl_min_finalize_rows=-3), "nccl_min_rows / nccl_min_finalize_rows: expected >= 0"),
])
def test_config_errors_are_value_errors(kwargs, message):
    args = dict(hidden_size=5120, hc_mult=4, max_num_tokens=64, top_k=6, device=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        mhccl.AllReduceMHC(**args)


def test_all_gather_capacity_error():
    with pytest.raises(ValueError, match="positive multiple of 16"):
        mhccl.LamportAllGather(rank_capacity_bytes=100, device=0)


def _call_args(m=4, h=64, hc=4):
    f32 = np.float32
    return dict(x=np.zeros((m, h), np.uint16), residual=np.zeros((m, hc, h), np.uint16),
                post=np.zeros((m, hc), f32), comb=np.zeros((m, hc, hc), f32),
                pre=np.zeros((m, hc), f32), norm_weight=np.zeros((h,), np.uint16), eps=1e-6,
                residual_out=np.zeros((m, hc, h), np.uint16), layer_input=np.zeros((m, h), np.uint16),
                mxfp8_values=None, mxfp8_scales=None)


def _check_call(**override):
    args = _call_args()
    args.update(override)
    return _api._lib().check_call(64, 4, 16, 6, False, True, 0, **args)


def test_call_argument_errors_name_the_argument():
    # NumPy has no bfloat16: a uint16 x is the wrong dtype, which is checked first.
    with pytest.raises(ValueError, match=r"x: expected dtype bfloat16, got uint16"):
        _check_call()
    with pytest.raises(ValueError, match=r"x: expected dtype bfloat16, got float32"):
        _check_call(x=np.zeros((4, 64), np.float32))


def test_all_gather_argument_errors():
    lib = _api._lib()
    inp = np.zeros((4, 4), np.float32)  # 64 bytes
    out = np.zeros((8, 4), np.float32)
    with pytest.raises(ValueError, match=r"from 16 to 32 \(rank_capacity_bytes\), got 64 bytes"):
        lib.check_all_gather(32, 2, 0, inp, out)
    with pytest.raises(ValueError, match=r"input: expected a CUDA tensor on device cuda:0, got device type 1"):
        lib.check_all_gather(4096, 2, 0, inp, out)
    assert lib.all_gather_accepts(64, inp)
    assert not lib.all_gather_accepts(48, inp)
    assert not lib.all_gather_accepts(4096, np.zeros((3, 3), np.uint16))  # 18 bytes


def test_ops_without_a_gpu_raise_no_device_error():
    try:
        import torch  # noqa: F401
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("a CUDA device is present: the GPU tests cover construction")
    with pytest.raises(mhccl.NoDeviceError, match="no CUDA device") as info:
        mhccl.AllReduceMHC(hidden_size=5120, hc_mult=4, max_num_tokens=64, top_k=6, device=0)
    assert isinstance(info.value, RuntimeError) and info.value.code == "kNoDevice"
    with pytest.raises(mhccl.NoDeviceError, match="no CUDA device"):
        mhccl.LamportAllGather(rank_capacity_bytes=4096, device=0, wait_timeout_ms=1000)


def test_communicator_is_weak_referenceable():
    # A caller (an engine's registry, a test) may hold one weakly; _api's cache holds them
    # strongly (_api._COMMUNICATORS: kept until forget_communicator).
    assert _api._lib().Communicator.__weakrefoffset__ != 0


@pytest.mark.parametrize("device, index", [(0, 0), (3, 3), ("cuda:0", 0), ("cuda:2", 2), (" cuda:1", 1),
                                           (np.int64(1), 1), (np.int32(2), 2), (2**31 - 1, 2**31 - 1)])
def test_device_forms(device, index):
    assert _api._device_index(device) == index


# Beyond the C++ int (2**31 and up), or a digit int() refuses ("²"): named, not nanobind's TypeError.
@pytest.mark.parametrize("device", [-1, "cpu", "cuda:x", "cuda:-1", "gpu", np.int64(-1), 2**31, 2**40,
                                    "cuda:2147483648", "cuda:²"])
def test_bad_devices_are_value_errors(device):
    with pytest.raises(ValueError, match="device: expected a CUDA device"):
        _api._device_index(device)
    with pytest.raises(ValueError, match="device: expected a CUDA device"):
        mhccl.LamportAllGather(rank_capacity_bytes=4096, device=device)


@pytest.mark.parametrize("device", [1.5, None, True, [0]])
def test_devices_of_a_wrong_type_are_type_errors(device):
    with pytest.raises(TypeError, match="^device: expected an int, a 'cuda:N' str or a torch.device"):
        _api._device_index(device)
    with pytest.raises(TypeError, match="^device: expected"):
        mhccl.LamportAllGather(rank_capacity_bytes=4096, device=device)


def test_an_extension_built_for_another_python_is_named(tmp_path):
    """The package with only another Python's extension (docs/USAGE.md's PYTHONPATH=build/python
    from a virtualenv of another version): the error names the file and says why, not only "needs
    the CUDA 13 runtime and NCCL"."""
    import shutil
    import subprocess
    import sys as _sys

    src = os.path.dirname(os.path.abspath(mhccl.__file__))
    pkg = tmp_path / "mhccl"
    pkg.mkdir()
    for f in os.listdir(src):
        if f.endswith(".py"):
            shutil.copy(os.path.join(src, f), pkg / f)
    (pkg / "_mhccl.cpython-27-x86_64-linux-gnu.so").write_bytes(b"")  # no Python 2.7 here
    code = ("import mhccl, mhccl._api as a\n"
            "try:\n    a._lib()\nexcept mhccl.NoDeviceError as e:\n    print(e.code, e)\n")
    out = subprocess.run([_sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, check=True).stdout
    assert out.startswith("kNoDevice "), out
    assert "_mhccl.cpython-27-x86_64-linux-gnu.so, built for another Python than this one" in out, out


class _CountingComm:
    """Stands in for the C++ communicator's rejection count (Communicator.rejected_calls)."""

    def __init__(self):
        self.rejected_calls = 0
        self.launched_calls = 0
        self.streams = []

    def note_rejected_call(self, stream):
        self.rejected_calls += 1
        self.streams.append(stream)


def test_rejected_calls_are_counted_once_on_the_communicator():
    """A call that raises before the C++ op counted it (a check of the package, an allocation)
    counts once; one the C++ op rejected (and counted) is not counted again; a call that goes
    through counts nothing. The count is what every rank's call identity carries."""
    pytest.importorskip("torch")
    from mhccl import _api

    op = types.SimpleNamespace(_comm=_CountingComm())

    def python_check():
        raise ValueError("x: expected shape [M, 5120], got [3, 7]")

    def cxx_rejects():  # as the C++ op does: counts, then throws
        op._comm.note_rejected_call(0)
        raise ValueError("x: expected dtype bfloat16")

    for fn, want in ((python_check, 1), (cxx_rejects, 2), (python_check, 3)):
        with pytest.raises(ValueError):
            _api._counting_rejections(op, fn)
        assert op._comm.rejected_calls == want
    assert _api._counting_rejections(op, lambda a, b=0: a + b, 2, b=3) == 5
    assert op._comm.rejected_calls == 3
    # Nested (the public method over the torch op's implementation): counted once.
    with pytest.raises(ValueError):
        _api._counting_rejections(op, lambda: _api._counting_rejections(op, python_check))
    assert op._comm.rejected_calls == 4
    # Counted on a stream (an op without a device: the legacy default stream, 0).
    assert op._comm.streams == [0, 0, 0, 0]
    # An exception after the call went out (an interrupt once the C++ call returned:
    # launched_calls moved) is not a rejection: that call pairs with its peers'.

    def launched_then_interrupted():
        op._comm.launched_calls += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _api._counting_rejections(op, launched_then_interrupted)
    assert op._comm.rejected_calls == 4
    # An interrupt before the launch is counted, as any exception there.

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _api._counting_rejections(op, interrupted)
    assert op._comm.rejected_calls == 5


def test_rejected_call_counted_while_another_thread_launches():
    """Thread A's call raises in a check while thread B's call of the same communicator
    launches: A's rejection is counted all the same (the communicator's call lock keeps B's
    launch out of A's snapshot), and two threads' rejections count twice. Without the lock A
    saw launched_calls move and counted nothing (a review, 2026-12-05), and a rejection on one
    rank only then shifted the ranks' pairing with no error."""
    pytest.importorskip("torch")
    import threading

    from mhccl import _api

    op = types.SimpleNamespace(_comm=_CountingComm())
    a_inside, b_launched = threading.Event(), threading.Event()

    def a_check():  # a slow check that raises; B's call comes in the meantime, if it can
        a_inside.set()
        b_launched.wait(0.5)
        raise ValueError("eps: expected a finite float")

    def b_launch():
        op._comm.launched_calls += 1
        b_launched.set()

    def thread_b():
        a_inside.wait(5)
        _api._counting_rejections(op, b_launch)

    b = threading.Thread(target=thread_b)
    b.start()
    with pytest.raises(ValueError):
        _api._counting_rejections(op, a_check)
    b.join(5)
    assert (op._comm.rejected_calls, op._comm.launched_calls) == (1, 1)

    def rejected():
        raise ValueError("x: expected dtype bfloat16")

    def reject_in_thread():
        with pytest.raises(ValueError):
            _api._counting_rejections(op, rejected)

    threads = [threading.Thread(target=reject_in_thread) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert op._comm.rejected_calls == 9

    # An interrupt while waiting for the lock another thread's call holds: that call never
    # went out, so it is counted (a review, 2026-12-05: it escaped uncounted).
    class InterruptingLock:
        def acquire(self):
            raise KeyboardInterrupt

        def release(self):
            raise AssertionError("released a lock never acquired")

    held = _api._CALL_LOCKS[id(op._comm)]
    _api._CALL_LOCKS[id(op._comm)] = InterruptingLock()
    try:
        with pytest.raises(KeyboardInterrupt):
            _api._counting_rejections(op, b_launch)
    finally:
        _api._CALL_LOCKS[id(op._comm)] = held
    assert (op._comm.rejected_calls, op._comm.launched_calls) == (10, 1)
