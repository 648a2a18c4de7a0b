"""``python -m mhccl.info`` and the no-device error, without a GPU: the report names the
versions, and says "no CUDA device" with CUDA's own reason, which these tests ask the CUDA runtime
for themselves (through ctypes, from the libcudart the report names)."""

import ctypes
import os
import re
import subprocess
import sys

import pytest

import mhccl


def _info(**env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-m", "mhccl.info"], capture_output=True, text=True, env=full,
                          timeout=300)


@pytest.fixture(scope="module")
def report():
    out = _info(MHCCL_INFO_TEST="on", NCCL_INFO_TEST="7")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _cuda_reason(report):
    """cudaGetDeviceCount through ctypes, from the library the report says the runtime is: None
    when there is a device, else CUDA's error name and string (inside "no NVIDIA driver is
    installed (...)" where cudaDriverGetVersion gives 0)."""
    m = re.search(r"^CUDA runtime [0-9.]+ \((\S+)\)$", report, re.M)
    assert m, report
    cudart = ctypes.CDLL(m.group(1))
    cudart.cudaGetErrorName.restype = ctypes.c_char_p
    cudart.cudaGetErrorString.restype = ctypes.c_char_p
    n = ctypes.c_int(0)
    st = cudart.cudaGetDeviceCount(ctypes.byref(n))
    if st == 0:
        return None if n.value > 0 else "cudaGetDeviceCount found 0 devices"
    cuda = (f"cudaGetDeviceCount returned {cudart.cudaGetErrorName(st).decode()}: "
            f"{cudart.cudaGetErrorString(st).decode()}")
    driver = ctypes.c_int(-1)  # 0: no driver installed (CUDA then calls it insufficient, error 35)
    if st == 35 and cudart.cudaDriverGetVersion(ctypes.byref(driver)) == 0 and driver.value == 0:
        return f"no NVIDIA driver is installed ({cuda})"
    return cuda


def test_info_names_the_versions(report):
    assert report.startswith(f"mhccl {mhccl.__version__}"), report
    assert re.search(r"^  built with CUDA \d+\.\d+, NCCL headers \d+\.\d+\.\d+, CUDA architectures \S", report, re.M)
    assert re.search(r"^CUDA runtime \d+\.\d+ \(\S*libcudart\S*\)$", report, re.M), report
    assert re.search(r"^NCCL library \d+\.\d+\.\d+ \(\S*libnccl\S*\), headers \d+\.\d+\.\d+: accepted$",
                     report, re.M), report
    assert re.search(r"^CUDA driver: ", report, re.M), report
    assert f"mhccl package {mhccl.__version__} (" in report
    assert re.search(r"^Python \d+\.\d+\.\d+ ", report, re.M), report
    assert re.search(r"^NCCL libraries loaded in this process: \S*libnccl", report, re.M), report


def test_info_says_why_there_is_no_gpu(report):
    why = _cuda_reason(report)
    if why is None:
        pytest.skip("a CUDA device is present (the GPU machine's run lists it)")
    assert f"\nGPUs: no CUDA device: {why}\n" in report, report


def test_info_lists_the_variables(report):
    assert "\n  MHCCL_INFO_TEST=on\n" in report and "\n  NCCL_INFO_TEST=7\n" in report, report


def test_info_names_torch_when_importable(report):
    try:
        import torch
    except ImportError:
        assert "\nPyTorch: not importable (" in report, report
        return
    assert re.search(rf"^PyTorch {re.escape(torch.__version__)} \(.*\): CUDA {torch.version.cuda}, NCCL ",
                     report, re.M), report


def test_the_no_device_error_says_why(report):
    why = _cuda_reason(report)
    if why is None:
        pytest.skip("a CUDA device is present")
    from mhccl import _mhccl

    with pytest.raises(RuntimeError) as e:
        _mhccl.Communicator(bytes(128), 0, 1, 0)
    assert str(e.value) == (f"Communicator: no CUDA device ({why}): mhccl needs an NVIDIA GPU (sm_90+) "
                            "with a driver; python -m mhccl.info or mhccl-bench --info says more")


def test_info_reports_a_variable_that_is_not_utf8():
    # The bug-report tool on the odd environment it should report (a review, 2026-12-05: a
    # traceback with UnicodeDecodeError, exit 1).
    env = dict(os.environb)
    env[b"MHCCL_DEBUG"] = b"\xff\xfe"
    out = subprocess.run([sys.executable, "-m", "mhccl.info"], capture_output=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert b"MHCCL_DEBUG=\\xff\\xfe" in out.stdout, out.stdout


def test_info_has_help_and_refuses_an_unknown_option():
    # `--help` and `--json` printed the report and exited 0 (a new user's trial, 2026-12-05).
    out = subprocess.run([sys.executable, "-m", "mhccl.info", "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m mhccl.info"), out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-m", "mhccl.info", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "unrecognized arguments: --json" in out.stderr, out.stdout + out.stderr
