"""The tuning table's Python face and the self-test, without a GPU: ``tuning_file=`` reaches the
C++ constructor (docs/TUNING.md), and ``python -m mhccl.selftest`` says "no CUDA device" with
CUDA's own reason and exits non-zero."""

import os
import subprocess
import sys

import pytest

import mhccl
from mhccl import _api


class _FakeComm:
    tp = 1
    peers_reachable = False


class _FakeOp:
    def __init__(self, comm, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.two_shot_min_rows = 2**63 - 1
        self.two_shot_min_finalize_rows = 2**63 - 1
        self.tuning_source = "tuning table " + kwargs.get("tuning_file", "")


class _FakeLib:
    ops = []

    def check_config(self, *args, **kwargs):
        pass

    def unique_id(self):
        return bytes(128)

    def Communicator(self, *args, **kwargs):
        return _FakeComm()

    def AllReduceMHC(self, *args, **kwargs):
        op = _FakeOp(*args, **kwargs)
        self.ops.append(op)
        return op


@pytest.fixture
def fake_lib(monkeypatch):
    lib = _FakeLib()
    monkeypatch.setattr(_api, "_EXT", lib)
    monkeypatch.setattr(_api, "_COMMUNICATORS", {})
    monkeypatch.setattr(_api._ops, "ensure_registered", lambda: None)
    monkeypatch.setattr(_api, "_device_index", lambda d: 0)
    return lib


def _build(**kw):
    return mhccl.AllReduceMHC(hidden_size=5120, hc_mult=4, max_num_tokens=64, top_k=6, device=0, **kw)


def test_tuning_file_reaches_the_constructor(fake_lib, tmp_path):
    path = str(tmp_path / "table.json")
    op = _build(tuning_file=path)
    assert fake_lib.ops[-1].kwargs["tuning_file"] == path
    assert op.tuning_source == "tuning table " + path
    _build(tuning_file=tmp_path / "table.json")  # an os.PathLike too
    assert fake_lib.ops[-1].kwargs["tuning_file"] == path
    _build()
    assert fake_lib.ops[-1].kwargs["tuning_file"] == ""  # the default: MHCCL_TUNING_FILE, if set


def test_tuning_file_of_the_wrong_type_is_named(fake_lib):
    with pytest.raises(TypeError, match="tuning_file: expected a str"):
        _build(tuning_file=3)


def test_the_extension_takes_tuning_file():
    ext = pytest.importorskip("mhccl._mhccl")
    assert "tuning_file" in ext.AllReduceMHC.__init__.__doc__
    assert "self_test" in dir(ext)


def _cuda_devices():
    try:
        from mhccl import _mhccl

        _mhccl.Communicator(bytes(128), 0, 1, 0)
    except RuntimeError as e:
        if "no CUDA device" in str(e):
            return 0, str(e)
    except Exception:
        pass
    return 1, ""


def test_selftest_under_torchrun_without_a_gpu_says_why():
    """Under torchrun (WORLD_SIZE > 1) with no GPU: exit 2, "no CUDA device", not the exit 1 of
    torch's ValueError from init_process_group("nccl") (a new user's trial, 2026-12-05)."""
    pytest.importorskip("torch")
    count, _ = _cuda_devices()
    if count:
        pytest.skip("a CUDA device is present")
    env = {k: v for k, v in os.environ.items() if k != "MHCCL_TUNING_FILE"}
    env.update(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    out = subprocess.run([sys.executable, "-m", "mhccl.selftest"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("mhccl.selftest: ") and "no CUDA device" in out.stderr, out.stderr


def test_selftest_without_a_gpu_says_why():
    pytest.importorskip("mhccl._mhccl")
    count, why = _cuda_devices()
    if count:
        pytest.skip("a CUDA device is present (the GPU machine runs the self-test itself)")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "MHCCL_TUNING_FILE")}
    out = subprocess.run([sys.executable, "-m", "mhccl.selftest"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("mhccl.selftest: ") and "no CUDA device" in out.stderr, out.stderr
    assert out.stderr.count("no CUDA device") == 1, out.stderr  # said once
    reason = why[why.index("(") + 1:why.rindex(")")]  # CUDA's own reason, as the Communicator gives it
    assert reason and reason in out.stderr, (reason, out.stderr)


@pytest.mark.parametrize("kwargs,cls,name", [
    (dict(hidden_size="5120"), mhccl.ArgumentTypeError, "hidden_size"),
    (dict(hc_mult=2**31), mhccl.InvalidArgumentError, "hc_mult"),
    (dict(top_k=6.0), mhccl.ArgumentTypeError, "top_k"),
    (dict(variants="plain"), mhccl.ArgumentTypeError, "variants"),
    (dict(variants=["plain", 1]), mhccl.ArgumentTypeError, "variants"),
    (dict(ms=[1, 7.5]), mhccl.ArgumentTypeError, "ms"),
    (dict(tuning_file=3), mhccl.ArgumentTypeError, "tuning_file"),
    (dict(print_cases=1), mhccl.ArgumentTypeError, "print_cases"),
    (dict(ms=5), mhccl.ArgumentTypeError, "ms"),
    (dict(variants=5), mhccl.ArgumentTypeError, "variants"),
    # The C++ self-test's own checks, made before the communicator too (a new user's trial,
    # 2026-12-05: without a GPU these said "no CUDA device").
    (dict(hc_mult=3), mhccl.UnsupportedError, "hc_mult"),
    (dict(hidden_size=5121), mhccl.InvalidArgumentError, "hidden_size"),
    (dict(variants=["mxfp9"]), mhccl.InvalidArgumentError, "mxfp9"),
    (dict(hidden_size=4104, variants=["fp8"]), mhccl.InvalidArgumentError, "fp8: not built at H=4104"),
    (dict(ms=[0]), mhccl.InvalidArgumentError, "every M")])
def test_selftest_refuses_an_argument_before_its_communicator(monkeypatch, kwargs, cls, name):
    """``mhccl.selftest.run``'s arguments are checked, and named, before its collective
    communicator is built: until 2026-12-05 (a review) an M of 7.5 ran as 7, a ``variants`` str
    as its letters, and a wrong type reached the binding after the collective construction (a
    nameless TypeError, with the peers gone on into the test's collectives)."""
    from mhccl import selftest

    def collective(*args, **kwargs):
        raise AssertionError("the communicator was built")
    monkeypatch.setattr(_api, "_new_communicator", collective)
    with pytest.raises(cls, match=name):
        selftest.run(device=0, **kwargs)


def test_selftest_takes_any_sequence_and_names_a_bad_local_rank(monkeypatch):
    """A numpy array (or a tensor) of M is a sequence like any other: its truth value was asked
    for (a raw ValueError, "ambiguous"); LOCAL_RANK=abc gave int()'s ValueError, the variable
    unnamed (a review, 2026-12-05)."""
    import numpy as np
    from mhccl import selftest

    built = []

    def collective(*args, **kwargs):
        built.append(args)
        raise AssertionError("the communicator was built")
    monkeypatch.setattr(_api, "_new_communicator", collective)
    with pytest.raises(AssertionError, match="the communicator was built"):
        selftest.run(device=0, ms=np.array([1, 7]), variants=("plain",))
    with pytest.raises(mhccl.ArgumentTypeError, match="ms"):
        selftest.run(device=0, ms=np.array([1.5]))
    monkeypatch.setenv("LOCAL_RANK", "abc")
    with pytest.raises(mhccl.InvalidArgumentError, match="LOCAL_RANK"):
        selftest.run()
    assert len(built) == 1


@pytest.mark.parametrize("args,env,code,says", [
    (["--ms", "1,x"], {}, 2, "--ms: expected a comma list of whole numbers"),
    (["--hc", "3"], {}, 2, "hc_mult: expected 1, 2, 4 or 8"),
    (["--variants", "mxfp9"], {}, 2, "got 'mxfp9'"),
    (["--device", "-1"], {}, 2, "device: expected a CUDA device"),
    ([], {"WORLD_SIZE": "two"}, 2, "WORLD_SIZE: expected a whole number"),
    # Under torchrun too, the arguments before torch looks for a GPU.
    (["--hc", "3"], {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, 2, "hc_mult: expected 1, 2, 4 or 8"),
    ([], {"WORLD_SIZE": "3", "RANK": "1", "LOCAL_RANK": "1"}, 2, "tp: expected 1, 2, 4 or 8")])
def test_selftest_command_line_names_a_bad_value(args, env, code, says):
    pytest.importorskip("mhccl._mhccl")
    full = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "MHCCL_TUNING_FILE")}
    full.update(env)
    out = subprocess.run([sys.executable, "-m", "mhccl.selftest", *args], capture_output=True, text=True, env=full,
                         timeout=300)
    assert out.returncode == code, out.stdout + out.stderr
    assert says in out.stderr, out.stderr
