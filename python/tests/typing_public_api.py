"""The public API as a user's code calls it, for the type checker only (ctest python-mypy,
python/tests/mypy_check.py; never run, never collected by pytest: no test_ prefix).

Each function below is what an engine's code would write; mypy --strict must accept it, and must
reject the calls marked ``# type: ignore[...]`` (warn_unused_ignores, part of strict, fails the
check where a rejection is lost). Where PyTorch is not installed its types are Any, and only the
checks that do not involve tensors remain.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

import mhccl


def build_ops(device: int) -> Tuple[mhccl.AllReduceMHC, mhccl.LamportAllGather]:
    ar = mhccl.AllReduceMHC(hidden_size=7168, hc_mult=4, max_num_tokens=256, top_k=8,
                            device=torch.device("cuda", device), quantize_layer_input=True,
                            wait_timeout_ms=60_000, watchdog=True, tuning_file="mhccl-tuning.json")
    source: str = ar.tuning_source
    del source
    ag = mhccl.LamportAllGather(rank_capacity_bytes=1 << 20, device=f"cuda:{device}",
                                wait_timeout_ms=None, force_nccl_fallback=False)
    budget: int = ar.wait_timeout_ms + ag.wait_timeout_ms
    flags: List[bool] = [ar.watchdog, ar.force_nccl_fallback, ag.watchdog, ag.force_nccl_fallback]
    mailboxes: int = ar.mailbox_bytes + ag.mailbox_bytes
    del budget, flags, mailboxes
    return ar, ag


def decode_step(ar: mhccl.AllReduceMHC, x: torch.Tensor, residual: torch.Tensor,
                post: torch.Tensor, comb: torch.Tensor, pre: torch.Tensor,
                norm_weight: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    m = x.shape[0]
    values = torch.empty((m, 7168), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((mhccl.mxfp8_scale_bytes(m, 7168),), dtype=torch.uint8, device=x.device)
    protocol: str = ar.protocol_for(m)
    residual_out, layer_input = ar(x, residual, post, comb, pre, norm_weight, 1e-6,
                                   mxfp8_out=(values, scales), protocol=protocol)
    ar.check_errors()
    return residual_out, layer_input


def moe_step(ar: mhccl.AllReduceMHC, gemm2: torch.Tensor, weights: torch.Tensor,
             idx: torch.Tensor, shared: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> torch.Tensor:
    m = shared.shape[0]
    fp8_scales = mhccl.empty_fp8_group_scales(m, 7168, device=shared.device)
    fp8_values = torch.empty((m, 7168), dtype=torch.float8_e4m3fn, device=shared.device)
    residual_out, _ = ar.finalize(gemm2, weights, idx, shared, residual, post, comb, None, None,
                                  1e-6, fp8_out=(fp8_values, fp8_scales))
    view: torch.Tensor = mhccl.fp8_group_scales_view(fp8_scales, m, 7168)
    del view
    return residual_out


def gather(ag: mhccl.LamportAllGather, inp: torch.Tensor) -> Optional[torch.Tensor]:
    return ag(inp) if ag.accepts(inp) else None


def scale_sizes(m: int) -> int:
    return (mhccl.mxfp8_scale_bytes(m, 4096) + mhccl.fp8_group_scale_bytes(m, 4096)
            + mhccl.fp8_group_scale_rows(m))


def rebuild(group: Optional[object], device: int) -> mhccl.AllReduceMHC:
    forgotten: int = mhccl.forget_communicator(group, device)
    del forgotten
    return mhccl.AllReduceMHC(hidden_size=5120, hc_mult=4, max_num_tokens=256, top_k=6, device=device)


def handle(ar: mhccl.AllReduceMHC, x: torch.Tensor) -> Optional[str]:
    try:
        ar.protocol_for(x.shape[0])
    except mhccl.InvalidArgumentError as e:  # also a ValueError
        value_error: ValueError = e
        del value_error
        return e.code
    except mhccl.PeerTimeoutError as e:
        peer: Optional[int] = e.peer
        call: Optional[int] = e.call_index
        op: Optional[str] = e.op
        del peer, call, op
        raise
    except mhccl.PeerError:  # PeerTimeoutError's and DivergenceError's base
        raise
    except (mhccl.UnsupportedError, mhccl.NoDeviceError, mhccl.CudaError, mhccl.NcclError,
            mhccl.UnusableError, mhccl.InvalidRouteError, mhccl.ArgumentTypeError) as e:
        message: str = e.message
        return message
    except mhccl.Error as e:
        runtime_error: RuntimeError = e
        del runtime_error
        return e.code
    return None


version: str = mhccl.__version__


def start_up_check() -> bool:  # the deployment self-test, as an engine calls it
    import mhccl.selftest

    ok, report, first_failure = mhccl.selftest.run(None, 0, variants=["plain"], ms=[1, 64])
    del report, first_failure
    return ok


# What the annotations reject (each must stay an error: warn_unused_ignores).
def rejected(ar: mhccl.AllReduceMHC) -> None:
    mhccl.AllReduceMHC(hidden_size="7168", hc_mult=4, max_num_tokens=256,  # type: ignore[arg-type]
                       top_k=8, device=0)
    mhccl.AllReduceMHC(7168, 4, 256, 8, 0)  # type: ignore[call-arg]
    mhccl.LamportAllGather(rank_capacity_bytes=1 << 20, device=0,
                           wait_timeout_ms="30s")  # type: ignore[arg-type]
    ar.protocol_for(8, finalize="yes")  # type: ignore[arg-type]
    nothing: int = ar.protocol_for(8)  # type: ignore[assignment]
    code: int = mhccl.Error("boom").code  # type: ignore[assignment]
    del nothing, code
