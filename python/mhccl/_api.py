"""The PyTorch-facing classes over the C++ library (``mhccl._mhccl``).

Tensors cross into C++ through DLPack without copies; work goes on PyTorch's current CUDA stream
of the tensors' device, so CUDA-graph capture by PyTorch records it. Argument errors raise
``ValueError`` and system errors (CUDA, NCCL, a peer that never published) ``RuntimeError``, with
the C++ message; both before anything is launched for argument errors.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any, Optional, Tuple

_EXT: Any = None


def _lib():
    """The compiled extension, loaded on first use (so that ``import mhccl`` works anywhere)."""
    global _EXT
    if _EXT is None:
        try:
            _EXT = importlib.import_module("mhccl._mhccl")
        except ImportError as e:  # no CUDA runtime / NCCL library on this machine, or not built
            raise RuntimeError(
                f"mhccl's compiled extension could not be loaded ({e}); it needs the CUDA 13 "
                "runtime and NCCL >= 2.28 (see README.md)") from e
    return _EXT


def mxfp8_scale_bytes(m: int, hidden: int) -> int:
    """Bytes of the swizzled 128x4 UE8M0 scales of an [m, hidden] MXFP8 tensor:
    512 * ceil(m / 128) * ceil(hidden / 32 / 4). ``hidden`` a multiple of 32."""
    if m < 0 or hidden <= 0 or hidden % 32:
        raise ValueError(f"mxfp8_scale_bytes: expected m >= 0 and hidden a positive multiple of 32, "
                         f"got m={m}, hidden={hidden}")
    blocks = hidden // 32
    return 512 * ((m + 127) // 128) * ((blocks + 3) // 4)


def _device_index(device: Any) -> int:
    """The CUDA device number of an int, a torch.device('cuda[:N]') or a 'cuda[:N]' string."""
    bad = ValueError(f"device: expected a CUDA device (torch.device('cuda:N'), 'cuda:N' or N >= 0), "
                     f"got {device!r}")
    if isinstance(device, bool):
        raise bad
    if isinstance(device, int):
        if device < 0:
            raise bad
        return device
    if isinstance(device, str):
        text = device.strip()
    elif getattr(device, "type", None) is not None:  # torch.device
        if device.type != "cuda":
            raise bad
        if device.index is not None:
            return int(device.index)
        text = "cuda"
    else:
        raise bad
    if text.startswith("cuda:"):
        number = text.split(":", 1)[1]
        if not number.isdigit():
            raise bad
        return int(number)
    if text == "cuda":
        import torch

        return torch.cuda.current_device()
    raise bad


def _group_layout(group: Any) -> Tuple[Any, int, int]:
    """(group, tp, rank) of a torch.distributed group; None without torch.distributed: TP=1."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None, 1, 0
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None, 1, 0
        group = dist.group.WORLD
    return group, dist.get_world_size(group), dist.get_rank(group)


# One communicator per (group, device), shared by every op built on it while any is alive.
_COMMUNICATORS: "weakref.WeakValueDictionary[Tuple[int, int], Any]" = weakref.WeakValueDictionary()


def _communicator(group: Any, device: int, wait_timeout_ms: int = 0):
    """The collective construction of a TP group's communicator: rank 0 of ``group`` makes the NCCL
    unique id, the group broadcasts it (torch.distributed), every rank builds its communicator."""
    lib = _lib()
    group, tp, rank = _group_layout(group)
    key = (id(group) if group is not None else 0, device)
    comm = _COMMUNICATORS.get(key)
    if comm is not None:
        return comm
    if tp == 1:
        uid = lib.unique_id()
    else:
        import torch
        import torch.distributed as dist

        box = [lib.unique_id() if rank == 0 else None]
        with torch.cuda.device(device):
            dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        uid = box[0]
    comm = lib.Communicator(uid, rank, tp, device, wait_timeout_ms)
    _COMMUNICATORS[key] = comm
    return comm


def _stream(tensor) -> int:
    import torch

    return torch.cuda.current_stream(tensor.device).cuda_stream


def _bytes_view(t):
    """8-bit tensors (float8_e4m3fn, float8_e8m0fnu, uint8) as uint8, which every DLPack
    version carries."""
    import torch

    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


class AllReduceMHC:
    """Lamport TP all-reduce fused with mHC post-mix, collapse, RMSNorm (and MXFP8).

    ``__call__`` reduces ``x`` across the TP group (FP32, rank order, one BF16 rounding), writes
    the post-mixed hc streams and the normalized collapse of them with the carried pre-mix.
    ``finalize`` does the same for an unfinalized MoE output, folding the top-k reduction and the
    shared expert into the publish. Construction is collective over ``group`` (default: the world
    group of torch.distributed, or TP=1 without it): every rank, the same arguments.

    Args:
        hidden_size: H, a multiple of 8 (of 32 with ``quantize_layer_input``), at most 32768.
        hc_mult: hc, the number of mHC residual streams: 1, 2, 4 or 8.
        max_num_tokens: the most rows (tokens) of a call.
        top_k: routes per token of ``finalize``, 1..16.
        device: the CUDA device of this rank.
        quantize_layer_input: accept ``mxfp8_out`` buffers (MXFP8 copy of the layer input).
        residual_only: accept ``pre`` and ``norm_weight`` of None (write the streams only).
        group: the torch.distributed process group of the TP ranks.
        two_shot_min_rows, two_shot_min_finalize_rows: rows from which two-shot is used (0: the
            measured default for the group's size).
        nccl_min_rows, nccl_min_finalize_rows: opt-in, rows from which the NCCL all-reduce +
            the fused consumer is used (0: never). At TP=2 calls of 4096 rows or more are
            faster that way, but NCCL waits for a dead peer without a time budget (the Lamport
            paths raise instead). ``protocol_for`` says which path a call takes.

    Raises:
        ValueError: a limit above is broken (before any GPU work).
        RuntimeError: no CUDA device, NCCL or CUDA failures.
    """

    def __init__(self, *, hidden_size: int, hc_mult: int, max_num_tokens: int, top_k: int,
                 device: Any, quantize_layer_input: bool = False, residual_only: bool = False,
                 group: Any = None, two_shot_min_rows: int = 0,
                 two_shot_min_finalize_rows: int = 0, nccl_min_rows: int = 0,
                 nccl_min_finalize_rows: int = 0) -> None:
        lib = _lib()
        _, tp, _ = _group_layout(group)
        lib.check_config(hidden_size, hc_mult, max_num_tokens, top_k, quantize_layer_input,
                         residual_only, tp, two_shot_min_rows, two_shot_min_finalize_rows,
                         nccl_min_rows, nccl_min_finalize_rows)
        self.hidden_size = hidden_size
        self.hc_mult = hc_mult
        self.capacity = max_num_tokens
        self.top_k = top_k
        self.quantize_layer_input = quantize_layer_input
        self.residual_only = residual_only
        self._device = _device_index(device)
        self._comm = _communicator(group, self._device)
        self._op = lib.AllReduceMHC(self._comm, hidden_size, hc_mult, max_num_tokens, top_k,
                                    quantize_layer_input, residual_only, two_shot_min_rows,
                                    two_shot_min_finalize_rows, nccl_min_rows,
                                    nccl_min_finalize_rows)
        self.bt_min_rows = self._op.two_shot_min_rows
        self.bt_min_finalize_rows = self._op.two_shot_min_finalize_rows

    def _outputs(self, residual, pre, mxfp8_out):
        import torch

        residual_out = torch.empty_like(residual, memory_format=torch.contiguous_format)
        layer_input = None
        if pre is not None:
            layer_input = torch.empty((residual.shape[0], self.hidden_size), dtype=torch.bfloat16,
                                      device=residual.device)
        values = scales = None
        if mxfp8_out is not None:
            values, scales = (_bytes_view(t) for t in mxfp8_out)
        return residual_out, layer_input, values, scales

    def __call__(self, x, residual, post, comb, pre, norm_weight, norm_eps: float,
                 mxfp8_out: Optional[Tuple[Any, Any]] = None, protocol: str = "auto"):
        """Return (post-mixed residual streams, normalized layer input).

        Args:
            x: [M, H] BF16, this rank's partial sublayer output.
            residual: [M, hc, H] BF16 residual streams.
            post: [M, hc] (or [M, hc, 1]) FP32 post-mix.
            comb: [M, hc, hc] FP32 residual mix, indexed [source, target].
            pre: [M, hc] FP32 carried pre-mix; None together with ``norm_weight`` (built with
                ``residual_only``): only the streams are written, the layer input is None.
            norm_weight: [H] BF16 RMSNorm weight.
            norm_eps: RMSNorm epsilon.
            mxfp8_out: optional ([M, H] float8_e4m3fn or uint8 values, scales of
                ``mxfp8_scale_bytes(M, H)`` bytes) that also receive the layer input as MXFP8
                (built with ``quantize_layer_input``).
            protocol: "auto", or force "one-shot", "two-shot" or "nccl".

        Returns: residual_out [M, hc, H] BF16 and layer_input [M, H] BF16 (or None), new tensors.
        """
        residual_out, layer_input, values, scales = self._outputs(residual, pre, mxfp8_out)
        self._op.call(x, residual, post, comb, pre, norm_weight, float(norm_eps), residual_out,
                      layer_input, values, scales, _stream(residual), protocol)
        return residual_out, layer_input

    def finalize(self, gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx, shared_output,
                 residual, post, comb, pre, norm_weight, norm_eps: float,
                 mxfp8_out: Optional[Tuple[Any, Any]] = None, protocol: str = "auto"):
        """``__call__`` for a MoE output left unfinalized.

        Args:
            gemm2_permuted: [rows, H] BF16 unweighted GEMM2 output in the MoE's permuted order.
            expert_weights: [M, top_k] FP32 routing weights, already scaled.
            expanded_idx_to_permuted_idx: [M, top_k] int32 row of each route, -1 for an expert
                this rank does not hold (any other index outside [0, rows) is skipped and
                reported by ``check_errors()``).
            shared_output: [M, H] BF16 TP-partial shared-expert output.
            residual, post, comb, pre, norm_weight, norm_eps, mxfp8_out, protocol: as ``__call__``.
        """
        residual_out, layer_input, values, scales = self._outputs(residual, pre, mxfp8_out)
        self._op.finalize(gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx, shared_output,
                          residual, post, comb, pre, norm_weight, float(norm_eps), residual_out,
                          layer_input, values, scales, _stream(residual), protocol)
        return residual_out, layer_input

    def protocol_for(self, m: int, finalize: bool = False) -> str:
        """The protocol ("one-shot", "two-shot", "nccl") a call of ``m`` rows takes."""
        return self._op.protocol_for(m, finalize)

    def check_errors(self) -> None:
        """Raise what a kernel of this TP group recorded: a peer timeout (RuntimeError; the
        group is then unusable until rebuilt) or an invalid finalize route (RuntimeError)."""
        self._comm.check_errors()

    @property
    def mailbox_bytes(self) -> int:
        """Device memory of this instance's mailboxes and buffers on this rank, in bytes."""
        return self._op.mailbox_bytes


class LamportAllGather:
    """TP all-gather along dim 0 through Lamport mailboxes over NVLink peer mappings, for inputs
    of up to ``rank_capacity_bytes`` per rank (a positive multiple of 16).

    Construction is collective over ``group``. ``accepts`` decides from the byte size alone, so
    every rank decides alike. 32-bit words equal to 0x80000000 (FP32 -0.0) arrive as 0.
    """

    def __init__(self, *, rank_capacity_bytes: int, device: Any, group: Any = None) -> None:
        lib = _lib()
        lib.check_all_gather_config(rank_capacity_bytes)  # before the collective construction
        self.rank_capacity_bytes = rank_capacity_bytes
        self._device = _device_index(device)
        self._comm = _communicator(group, self._device)
        self.world_size = self._comm.tp
        self._op = lib.LamportAllGather(self._comm, rank_capacity_bytes)

    def accepts(self, inp) -> bool:
        """Whether ``inp`` fits: 16 to ``rank_capacity_bytes`` bytes, a multiple of 16."""
        nbytes = inp.numel() * inp.element_size()
        return 0 < nbytes <= self.rank_capacity_bytes and nbytes % 16 == 0

    def __call__(self, inp):
        """Every rank's ``inp`` concatenated along dim 0 in rank order, on the current stream
        (a non-contiguous or misaligned ``inp`` is copied first)."""
        import torch

        if inp.dim() == 0:
            raise ValueError("inp: expected at least one dimension, got a scalar")
        out = torch.empty((inp.shape[0] * self.world_size, *inp.shape[1:]), dtype=inp.dtype,
                          device=inp.device)
        self._op.call(inp, out, _stream(inp))
        return out

    @property
    def mailbox_bytes(self) -> int:
        return self._op.mailbox_bytes
