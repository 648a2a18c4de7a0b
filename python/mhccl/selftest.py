"""The deployment self-test: ``python -m mhccl.selftest`` (or ``torchrun --nproc-per-node N -m
mhccl.selftest`` over a group), or ``mhccl.selftest.run(group)`` from an engine at start-up.

Over the group (alone: TP=1 on the local GPU, the Lamport paths through its own mailbox), for
each path (one-shot and two-shot, streaming on and off, NCCL at TP=2, the automatic choice) and
variant at a few M, the fused op is checked against the CPU reference and the ranks' bits
against each other: the C++ self-test ``mhccl-tune --verify`` runs (tools/tune/verify.h). Exit
code 0 when every case passes, 1 with the reason when one fails, 2 for an argument refused
(before any GPU is looked for) or when there is no CUDA device or the compiled extension cannot
be loaded here (``mhccl.NoDeviceError``: the message carries CUDA's own reason).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional, Sequence, Tuple

from ._errors import ArgumentTypeError, InvalidArgumentError, NoDeviceError


def _env_int(name: str, default: int) -> int:
    """The environment variable ``name`` as a whole number >= 0 (``default`` when unset or empty)."""
    value = os.environ.get(name, "")
    if value == "":
        return default
    if not (value.isascii() and value.isdigit()):
        raise InvalidArgumentError(f"{name}: expected a whole number >= 0, got {value!r}")
    return int(value)


def _list_arg(name: str, value: Any) -> List[Any]:
    """A sequence argument as a list (None: empty); a str, or anything that is not iterable, is an
    ArgumentTypeError naming it. Never its truth value (a numpy array or a tensor has none)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        raise ArgumentTypeError(f"{name}: expected a sequence, got {type(value).__name__} {value!r} "
                                f"(write [{value!r}])")
    try:
        return list(value)
    except TypeError:
        raise ArgumentTypeError(f"{name}: expected a sequence, got {type(value).__name__}") from None


def _comma_ints(text: str) -> List[int]:
    """``--ms``: a comma list of whole numbers (argparse's type: a bad item exits 2 naming it)."""
    try:
        return [int(m) for m in text.split(",") if m]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of whole numbers, got {text!r}") from None


def run(group: Any = None, device: Any = None, *, hidden_size: int = 5120, hc_mult: int = 4, top_k: int = 6,
        variants: Optional[Sequence[str]] = None, ms: Optional[Sequence[int]] = None, tuning_file: str = "",
        print_cases: bool = True) -> Tuple[bool, str, str]:
    """Runs the self-test over ``group`` (as ``AllReduceMHC``'s ``group=``: None is the engine's
    TP group, else torch.distributed's world group, else TP=1) on ``device`` (default: this
    rank's ``LOCAL_RANK``, else 0). Collective: every rank of the group calls it alike. In an
    engine, pass the worker's ``device`` and the model's shape (``hidden_size``, ``hc_mult``,
    ``top_k``): the defaults are DSV4.1's and ``LOCAL_RANK``'s. It builds a communicator of its
    own (collective) and drops it at the end, so that a timeout or divergence inside the test
    leaves the communicator the engine's ops share untouched.

    Returns:
        (ok, report, first_failure): whether every case passed, one line a case and the verdict,
        and the first failing case with its reason ("" when none failed).

    Raises:
        mhccl.ArgumentTypeError (a TypeError) or mhccl.InvalidArgumentError (a ValueError): an
            argument of another type or beyond its C++ type's range (an M in ``ms`` that is
            not an int, a ``variants`` given as one str), named, before the communicator is
            built (so at TP > 1 the peers of a rank that raised it wait out their budget in
            that collective construction, as for any call one rank does not make);
        mhccl.InvalidArgumentError, mhccl.UnsupportedError (ValueErrors): an unknown variant, a
            variant H does not allow, an M out of range, a shape an op refuses: the C++
            self-test's own checks, also made before the communicator is built;
        mhccl.Error (a RuntimeError): no CUDA device (the message says CUDA's reason), NCCL or
            CUDA failures.
    """
    from . import _api

    hidden_size = _api._int_arg("hidden_size", hidden_size)
    hc_mult = _api._int_arg("hc_mult", hc_mult, **_api._INT32)
    top_k = _api._int_arg("top_k", top_k, **_api._INT32)
    variant_list = [_api._str_arg("variants", v) for v in _list_arg("variants", variants)]
    m_list = [_api._int_arg("ms", m) for m in _list_arg("ms", ms)]
    tuning_file = _api._path_str_arg("tuning_file", tuning_file)
    print_cases = _api._bool_arg("print_cases", print_cases)
    lib = _api._lib()
    layout = _api._group_layout(group)
    # The variants, M and the shape, as the C++ self-test checks them first: refused here, before
    # the communicator (and on a machine without a GPU, rather than "no CUDA device").
    lib.self_test_check(hidden_size, hc_mult, top_k, variant_list, m_list, layout[1])
    if device is None:
        device = _env_int("LOCAL_RANK", 0)
    comm = _api._new_communicator(layout, _api._device_index(device))
    try:
        ok, report, first = lib.self_test(comm, hidden_size, hc_mult, top_k, variant_list, m_list, tuning_file,
                                          print_cases)
    finally:
        del comm  # its own, not cached: destroyed here (after its ops, which the test made and dropped)
    return bool(ok), str(report), str(first)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mhccl.selftest", description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=5120, help="H (default 5120)")
    p.add_argument("--hc", type=int, default=4, help="hc (default 4)")
    p.add_argument("--top-k", type=int, default=6, help="top_k of finalize (default 6)")
    p.add_argument("--variants", default="", help="comma list of plain, mxfp8, residual_only, fp8, fp8_ue8m0 "
                                                  "(default: every variant H allows)")
    p.add_argument("--ms", type=_comma_ints, default=[], help="comma list of M (default 1,7,97,300)")
    p.add_argument("--tuning-file", default="", help="build the automatic path's op with this tuning table")
    p.add_argument("--device", default=None, help="CUDA device: N or cuda:N (default: LOCAL_RANK, else 0)")
    a = p.parse_args(argv)
    group = None
    variants = [v for v in a.variants.split(",") if v]
    try:
        world = _env_int("WORLD_SIZE", 1)
        # The arguments first (run() checks them again): refused before torch looks for a GPU.
        from . import _api

        _api._lib().self_test_check(a.hidden, a.hc, a.top_k, variants, a.ms, world)
        if world > 1:  # under torchrun: the world group
            import torch
            import torch.distributed as dist

            local = _env_int("LOCAL_RANK", 0)
            if not torch.cuda.is_available():  # else init_process_group("nccl") raises a ValueError
                raise NoDeviceError("no CUDA device: PyTorch sees none (torch.cuda.is_available() is False), "
                                    "and the group's NCCL process group needs one a rank")
            torch.cuda.set_device(local)
            if not dist.is_initialized():
                dist.init_process_group("nccl")
        device = int(a.device) if a.device is not None and a.device.isascii() and a.device.isdigit() else a.device
        ok, _, first = run(group, device, hidden_size=a.hidden, hc_mult=a.hc, top_k=a.top_k, variants=variants,
                           ms=a.ms, tuning_file=a.tuning_file)
    except NoDeviceError as e:
        print(f"mhccl.selftest: {e}", file=sys.stderr)  # the message says "no CUDA device" and CUDA's reason
        return 2
    except (ValueError, ArgumentTypeError) as e:  # argument errors (mhccl.InvalidArgumentError and the like)
        print(f"mhccl.selftest: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # every other mhccl.Error
        print(f"mhccl.selftest: FAILED: {e}", file=sys.stderr)
        return 1
    if not ok:
        print(f"mhccl.selftest: FAILED: {first}", file=sys.stderr)
        return 1
    print("mhccl.selftest: PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
