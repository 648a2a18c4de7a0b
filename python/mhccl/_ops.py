"""mhccl's ops as PyTorch ops (``torch.library``), so that torch.compile traces through them
(no graph break) and CUDA graphs (cudagraph trees, ``torch.cuda.graph``) record them.

An op instance (an ``AllReduceMHC`` or ``LamportAllGather``) reaches a torch op as an int
*handle*: a key into a registry of the live instances of this process. Dynamo carries an int as
a constant (guarded), where it could not carry the nanobind object. A handle dies with its
instance; calling an op with a dead handle raises ``mhccl.InvalidArgumentError``.

The ops, each a functional form (new outputs) and a mutating out-variant (``mutates_args``;
outputs the caller owns, which may include ``residual_out`` being ``residual``):

    mhccl::all_reduce_mhc(handle, x, residual, post, comb, pre?, norm_weight?, eps,
                          protocol="auto", with_mxfp8=False, with_fp8=False) -> Tensor[]
    mhccl::all_reduce_mhc_out(handle, x, residual, post, comb, pre?, norm_weight?, eps, protocol,
                              residual_out!, layer_input!?, mxfp8_values!?, mxfp8_scales!?,
                              fp8_values!?, fp8_scales!?) -> ()
    mhccl::all_reduce_mhc_finalize(handle, gemm2_permuted, expert_weights,
                                   expanded_idx_to_permuted_idx, shared_output, <as above>)
    mhccl::all_reduce_mhc_finalize_out(handle, gemm2_permuted, ..., <as above>)
    mhccl::all_gather(handle, inp) -> Tensor
    mhccl::all_gather_out(handle, inp, out!) -> ()

A functional form returns [residual_out, layer_input (unless pre is None), mxfp8 values and
scales (with_mxfp8), fp8 values and scales (with_fp8)], in that order; an out-variant takes None
for an output not wanted (the C++ checks say which the call needs, and refuse both quantized
pairs at once). The functional form's fp8 outputs: values [M, H] float8_e4m3fn, scales the
MN-major [M, G] float32 view with strides (1, Mp) over a buffer of Mp * G floats (G = H / 128,
Mp = ceil(M / 4) * 4; ``mhccl.fp8_group_scales_view``), the tensor DeepGEMM takes; the fake
implementations give the same shape and strides. A further output pair would go at the end of
both forms in the same way (two optional mutable arguments without default, see ``outs_mut``,
and a trailing bool flag).

The implementations are registered for every device type, not only CUDA, so that a CPU tensor
reaches the C++ checks and raises their InvalidArgumentError (a ValueError: "expected a CUDA
tensor on device cuda:N") rather than the dispatcher's "no kernel for CPU". The fake implementations refuse tensors on
different devices: a meta tensor among real ones sends a call to them (the Meta key outranks
the others), which would otherwise launch nothing and raise nothing. An exception an
implementation raises in eager mode reaches the caller as it was raised (its class, message and
attributes: the dispatcher passes Python exceptions through).

The ops are registered at ``import mhccl`` where PyTorch can be imported (``register_at_import``),
so that code compiled or traced before any instance exists can name ``torch.ops.mhccl.*``; without
PyTorch ``import mhccl`` still works, and building an op says why it cannot (``ensure_registered``,
run again by every construction, registers them once).
"""

import itertools
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from ._errors import InvalidArgumentError

_T = TypeVar("_T")

_INSTANCES: Dict[int, "weakref.ref[Any]"] = {}  # handle -> a live AllReduceMHC / LamportAllGather
_HANDLES = itertools.count(1)
_LOCK = threading.Lock()
_REGISTERED = False

# MXFP8 outputs of the functional forms: E4M3 values, UE8M0 scale bytes as uint8 (every torch
# version has it; float8_e8m0fnu only from 2.7).
_MXFP8_BLOCK = 32
# Per-token-group FP8 outputs: groups of 128 elements, FP32 scales in columns of Mp floats.
_FP8_GROUP = 128


def register_instance(obj: Any) -> int:
    """A new handle for ``obj``, valid while ``obj`` lives."""
    with _LOCK:
        handle = next(_HANDLES)
        _INSTANCES[handle] = weakref.ref(obj)
    weakref.finalize(obj, _INSTANCES.pop, handle, None)
    return handle


def instance(handle: int, kind: str) -> Any:
    """The live instance of ``handle``, an instance of the class named ``kind`` ("AllReduceMHC" or
    "LamportAllGather"); InvalidArgumentError when it is gone, of the other kind, or ``handle``
    is no int."""
    ref = None if isinstance(handle, bool) else _INSTANCES.get(handle)
    obj = ref() if ref is not None else None
    if obj is None:
        raise InvalidArgumentError(
            f"mhccl: op handle {handle} names no live instance (the AllReduceMHC or "
            "LamportAllGather was destroyed, or the handle comes from another "
            "process)")
    # By what the op reads of it (AllReduceMHC's row check, LamportAllGather's size check), so
    # that a stand-in with both serves the tests of both.
    if not hasattr(obj, {"AllReduceMHC": "_rows", "LamportAllGather": "_check_size"}[kind]):
        raise InvalidArgumentError(
            f"mhccl: op handle {handle} names a {type(obj).__name__}, not the {kind} this op takes")
    return obj


def same_device(**tensors: Optional[Any]) -> None:
    """Every tensor argument on one device. For the fake implementations, which also run for meta
    tensors among real ones (the dispatcher's Meta key outranks CUDA's), where a call would
    otherwise launch nothing and raise nothing (say with a weight never materialized); and for the
    classes while torch.compile traces them, where an error of a fake implementation reaches the
    caller as torch's TorchRuntimeError, not counted as a rejected call."""
    named = [(name, t) for name, t in tensors.items() if t is not None]
    first, device = named[0][0], named[0][1].device
    for name, t in named[1:]:
        if t.device != device:
            raise InvalidArgumentError(
                f"{name}: expected a tensor on {device} ({first}'s device), "
                f"got {t.device}")


def count_if_run_on_meta(handle: Any, kind: str, lead: Any) -> None:
    """A fake implementation run as the op's meta kernel, on plain meta tensors rather than a
    trace's fake or functional ones (a compiled graph, or the torch op itself, run on meta
    tensors; the classes refuse such a call eagerly), stands for a call that launches nothing.
    It is counted as a rejected call on the instance's communicator: where the peers made the
    call for real, every rank's next call is then a DivergenceError instead of this rank's next
    call pairing with the peers' call of this one (SPEC.md, "Ranks that diverge get an error";
    an adversarial review, 2026-12-05). Where every rank runs it on meta tensors, the counts
    stay equal."""
    import torch

    if type(lead) not in (torch.Tensor, torch.nn.Parameter) or not lead.is_meta:
        return
    op = instance(handle, kind)
    comm = getattr(op, "_comm", None)  # None: an instance without its C++ side (the CPU tests')
    if comm is not None:
        from ._api import _rejection_stream

        comm.note_rejected_call(_rejection_stream(op))


def _scale_bytes(m: int, hidden: int) -> int:
    # mxfp8_scale_bytes for fake tensors, where m may be symbolic.
    return 512 * ((m + 127) // 128) * ((hidden // _MXFP8_BLOCK + 3) // 4)


def _fp8_scale_rows(m: int) -> int:
    # fp8_group_scale_rows's arithmetic, for fake tensors too, where m may be symbolic.
    return (m + 3) // 4 * 4


def ensure_registered() -> None:
    """Define the mhccl torch ops once per process (imports torch)."""
    global _REGISTERED
    with _LOCK:
        if _REGISTERED:
            return
        _define()
        _REGISTERED = True


def register_at_import() -> None:
    """The torch ops, at ``import mhccl``, where PyTorch imports. Where it does not (not installed,
    or broken: a missing CUDA library), nothing: ``import mhccl`` works without PyTorch, and
    building an op raises PyTorch's own error (``ensure_registered`` imports it again)."""
    try:
        import torch  # noqa: F401
    except Exception:  # ImportError, or OSError / RuntimeError from a broken installation
        return
    try:
        ensure_registered()
    except Exception as e:  # a PyTorch too old for torch.library.custom_op, say
        import warnings

        warnings.warn(f"mhccl: the torch ops could not be registered at import ({type(e).__name__}: "
                      f"{e}); building an AllReduceMHC or LamportAllGather will raise it",
                      RuntimeWarning, stacklevel=3)


def _define() -> None:
    import torch
    from torch import Tensor

    bf16 = torch.bfloat16
    epilogue_outputs = ("residual_out", "layer_input", "mxfp8_values", "mxfp8_scales",
                        "fp8_values", "fp8_scales")
    # Schemas spelled out rather than inferred: the handle is an ``int`` (inference would make it
    # a SymInt, which Dynamo could turn symbolic, and a symbolic handle names no instance).
    epilogue = "Tensor residual, Tensor post, Tensor comb, Tensor? pre, Tensor? norm_weight, float eps"
    # The optional outputs have no default: torch's custom_op drops trailing arguments equal to
    # their default before it bumps the version counters of the mutated ones, and then indexes
    # past the end (IndexError, torch 2.11). Callers pass None for an output they do not want.
    outs_mut = ("Tensor(a!) residual_out, Tensor(b!)? layer_input, "
                "Tensor(c!)? mxfp8_values, Tensor(d!)? mxfp8_scales, "
                "Tensor(e!)? fp8_values, Tensor(f!)? fp8_scales")
    call_in = f"int handle, Tensor x, {epilogue}"
    finalize_in = ("int handle, Tensor gemm2_permuted, Tensor expert_weights, "
                   f"Tensor expanded_idx_to_permuted_idx, Tensor shared_output, {epilogue}")
    functional = 'str protocol="auto", bool with_mxfp8=False, bool with_fp8=False) -> Tensor[]'

    def new_outputs(op: Any, m: Any, device: Any, has_pre: bool, with_mxfp8: bool,
                    with_fp8: bool, empty: Callable[..., Tensor]) -> List[Tensor]:
        """The functional forms' outputs, real (torch.empty) and fake alike. The fp8 scales: the
        MN-major [M, G] view (strides (1, Mp)) of a buffer of Mp * G floats, whose padding rows
        the kernels write."""
        h, hc = op.hidden_size, op.hc_mult
        if with_mxfp8 and with_fp8:
            raise InvalidArgumentError(
                "with_mxfp8 and with_fp8: expected at most one quantized layer input "
                "(MXFP8 or per-token-group FP8), got both")
        outs = [empty((m, hc, h), dtype=bf16, device=device)]
        if has_pre:
            outs.append(empty((m, h), dtype=bf16, device=device))
        if with_mxfp8:
            outs.append(empty((m, h), dtype=torch.float8_e4m3fn, device=device))
            outs.append(empty((_scale_bytes(m, h),), dtype=torch.uint8, device=device))
        if with_fp8:
            groups, mp = h // _FP8_GROUP, _fp8_scale_rows(m)
            outs.append(empty((m, h), dtype=torch.float8_e4m3fn, device=device))
            outs.append(empty((mp * groups,), dtype=torch.float32, device=device)
                        .as_strided((m, groups), (1, mp)))
        return outs

    def checked_rows(op: Any, name: str, lead: Tensor, eps: float) -> Any:
        """For the fake implementations: what the real ones check before any launch and that a
        fake tensor shows (the leading [M, H] tensor's shape and M's range, eps), so that a trace
        of a bad call fails as the call would; the C++ checks of the rest run with real tensors."""
        from . import _api

        _api._eps_arg("norm_eps", eps)
        return op._rows(name, lead)

    def counted(op: Any, fn: Callable[..., _T], *args: Any) -> _T:
        """The real implementations' work, rejections counted on the instance's communicator
        (_api._counting_rejections: a call rejected on some ranks only is an error on every rank)."""
        from ._api import _counting_rejections

        return _counting_rejections(op, fn, *args)

    def split(outs: List[Tensor], has_pre: bool, with_mxfp8: bool,
              with_fp8: bool) -> Tuple[Optional[Tensor], ...]:
        residual_out = outs[0]
        layer_input = outs[1] if has_pre else None
        first = 2 if has_pre else 1
        values, scales = (outs[first], outs[first + 1]) if with_mxfp8 else (None, None)
        first += 2 if with_mxfp8 else 0
        fp8_values, fp8_scales = (outs[first], outs[first + 1]) if with_fp8 else (None, None)
        return residual_out, layer_input, values, scales, fp8_values, fp8_scales

    # --- AllReduceMHC.__call__ ---------------------------------------------------------------
    @torch.library.custom_op("mhccl::all_reduce_mhc_out", mutates_args=epilogue_outputs,
                             schema=f"({call_in}, str protocol, {outs_mut}) -> ()")
    def all_reduce_mhc_out(handle: int, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor,
                           pre: Optional[Tensor], norm_weight: Optional[Tensor], eps: float,
                           protocol: str, residual_out: Tensor, layer_input: Optional[Tensor],
                           mxfp8_values: Optional[Tensor], mxfp8_scales: Optional[Tensor],
                           fp8_values: Optional[Tensor], fp8_scales: Optional[Tensor]) -> None:
        op = instance(handle, "AllReduceMHC")
        counted(op, op._launch_call, x, residual, post, comb, pre, norm_weight, eps, protocol,
                residual_out, layer_input, mxfp8_values, mxfp8_scales, fp8_values, fp8_scales)

    @all_reduce_mhc_out.register_fake
    def _(handle: Any, x: Any, residual: Any, post: Any, comb: Any, pre: Any, norm_weight: Any,
          eps: Any, protocol: Any, residual_out: Any, layer_input: Any, mxfp8_values: Any,
          mxfp8_scales: Any, fp8_values: Any, fp8_scales: Any) -> Any:
        count_if_run_on_meta(handle, "AllReduceMHC", x)  # a run, not a trace, on meta tensors
        same_device(x=x, residual=residual, post=post, comb=comb, pre=pre, norm_weight=norm_weight,
                    residual_out=residual_out, layer_input=layer_input, mxfp8_values=mxfp8_values,
                    mxfp8_scales=mxfp8_scales, fp8_values=fp8_values, fp8_scales=fp8_scales)
        checked_rows(instance(handle, "AllReduceMHC"), "x", x, eps)
        return None

    @torch.library.custom_op("mhccl::all_reduce_mhc", mutates_args=(),
                             schema=f"({call_in}, {functional}")
    def all_reduce_mhc(handle: int, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor,
                       pre: Optional[Tensor], norm_weight: Optional[Tensor], eps: float,
                       protocol: str = "auto", with_mxfp8: bool = False,
                       with_fp8: bool = False) -> List[Tensor]:
        op = instance(handle, "AllReduceMHC")

        def run() -> List[Tensor]:
            outs = new_outputs(op, op._rows("x", x), x.device, pre is not None, with_mxfp8,
                               with_fp8, torch.empty)
            op._launch_call(x, residual, post, comb, pre, norm_weight, eps, protocol,
                            *split(outs, pre is not None, with_mxfp8, with_fp8))
            return outs
        return counted(op, run)

    @all_reduce_mhc.register_fake
    def _(handle: Any, x: Any, residual: Any, post: Any, comb: Any, pre: Any, norm_weight: Any,
          eps: Any, protocol: Any = "auto", with_mxfp8: Any = False, with_fp8: Any = False) -> Any:
        count_if_run_on_meta(handle, "AllReduceMHC", x)  # a run, not a trace, on meta tensors
        same_device(x=x, residual=residual, post=post, comb=comb, pre=pre, norm_weight=norm_weight)
        op = instance(handle, "AllReduceMHC")
        return new_outputs(op, checked_rows(op, "x", x, eps), x.device, pre is not None,
                           with_mxfp8, with_fp8, torch.empty)

    # --- AllReduceMHC.finalize ---------------------------------------------------------------
    @torch.library.custom_op("mhccl::all_reduce_mhc_finalize_out", mutates_args=epilogue_outputs,
                             schema=f"({finalize_in}, str protocol, {outs_mut}) -> ()")
    def all_reduce_mhc_finalize_out(handle: int, gemm2_permuted: Tensor, expert_weights: Tensor,
                                    expanded_idx_to_permuted_idx: Tensor, shared_output: Tensor,
                                    residual: Tensor, post: Tensor, comb: Tensor,
                                    pre: Optional[Tensor], norm_weight: Optional[Tensor],
                                    eps: float, protocol: str, residual_out: Tensor,
                                    layer_input: Optional[Tensor],
                                    mxfp8_values: Optional[Tensor],
                                    mxfp8_scales: Optional[Tensor],
                                    fp8_values: Optional[Tensor],
                                    fp8_scales: Optional[Tensor]) -> None:
        op = instance(handle, "AllReduceMHC")
        counted(op, op._launch_finalize, gemm2_permuted, expert_weights,
                expanded_idx_to_permuted_idx, shared_output, residual, post, comb, pre,
                norm_weight, eps, protocol, residual_out, layer_input, mxfp8_values, mxfp8_scales,
                fp8_values, fp8_scales)

    @all_reduce_mhc_finalize_out.register_fake
    def _(handle: Any, gemm2_permuted: Any, expert_weights: Any, expanded_idx_to_permuted_idx: Any,
          shared_output: Any, residual: Any, post: Any, comb: Any, pre: Any, norm_weight: Any,
          eps: Any, protocol: Any, residual_out: Any, layer_input: Any, mxfp8_values: Any,
          mxfp8_scales: Any, fp8_values: Any, fp8_scales: Any) -> Any:
        count_if_run_on_meta(handle, "AllReduceMHC", shared_output)  # a run, not a trace, on meta tensors
        same_device(shared_output=shared_output, gemm2_permuted=gemm2_permuted,
                    expert_weights=expert_weights,
                    expanded_idx_to_permuted_idx=expanded_idx_to_permuted_idx, residual=residual,
                    post=post, comb=comb, pre=pre, norm_weight=norm_weight,
                    residual_out=residual_out, layer_input=layer_input, mxfp8_values=mxfp8_values,
                    mxfp8_scales=mxfp8_scales, fp8_values=fp8_values, fp8_scales=fp8_scales)
        checked_rows(instance(handle, "AllReduceMHC"), "shared_output", shared_output, eps)
        return None

    @torch.library.custom_op("mhccl::all_reduce_mhc_finalize", mutates_args=(),
                             schema=f"({finalize_in}, {functional}")
    def all_reduce_mhc_finalize(handle: int, gemm2_permuted: Tensor, expert_weights: Tensor,
                                expanded_idx_to_permuted_idx: Tensor, shared_output: Tensor,
                                residual: Tensor, post: Tensor, comb: Tensor,
                                pre: Optional[Tensor], norm_weight: Optional[Tensor], eps: float,
                                protocol: str = "auto", with_mxfp8: bool = False,
                                with_fp8: bool = False) -> List[Tensor]:
        op = instance(handle, "AllReduceMHC")

        def run() -> List[Tensor]:
            m = op._rows("shared_output", shared_output)
            outs = new_outputs(op, m, shared_output.device, pre is not None, with_mxfp8, with_fp8,
                               torch.empty)
            op._launch_finalize(gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx,
                                shared_output, residual, post, comb, pre, norm_weight, eps,
                                protocol, *split(outs, pre is not None, with_mxfp8, with_fp8))
            return outs
        return counted(op, run)

    @all_reduce_mhc_finalize.register_fake
    def _(handle: Any, gemm2_permuted: Any, expert_weights: Any, expanded_idx_to_permuted_idx: Any,
          shared_output: Any, residual: Any, post: Any, comb: Any, pre: Any, norm_weight: Any,
          eps: Any, protocol: Any = "auto", with_mxfp8: Any = False, with_fp8: Any = False) -> Any:
        count_if_run_on_meta(handle, "AllReduceMHC", shared_output)  # a run, not a trace, on meta tensors
        same_device(shared_output=shared_output, gemm2_permuted=gemm2_permuted,
                    expert_weights=expert_weights,
                    expanded_idx_to_permuted_idx=expanded_idx_to_permuted_idx, residual=residual,
                    post=post, comb=comb, pre=pre, norm_weight=norm_weight)
        op = instance(handle, "AllReduceMHC")
        return new_outputs(op, checked_rows(op, "shared_output", shared_output, eps),
                           shared_output.device, pre is not None, with_mxfp8, with_fp8, torch.empty)

    # --- LamportAllGather --------------------------------------------------------------------
    def gathered(op: Any, inp: Tensor, empty: Callable[..., Tensor]) -> Tensor:
        return empty((inp.shape[0] * op.world_size, *inp.shape[1:]), dtype=inp.dtype,
                     device=inp.device)

    @torch.library.custom_op("mhccl::all_gather_out", mutates_args=("out",),
                             schema="(int handle, Tensor inp, Tensor(a!) out) -> ()")
    def all_gather_out(handle: int, inp: Tensor, out: Tensor) -> None:
        op = instance(handle, "LamportAllGather")

        def run() -> None:
            op._check_size(inp)
            op._launch(inp, out)
        counted(op, run)

    def checked_gather(op: Any, inp: Tensor) -> None:
        """For the fake implementations: the input's dimensions always, its size where no
        dimension is symbolic and no trace runs, as the real implementation checks them."""
        if not torch.compiler.is_compiling() and all(isinstance(d, int) for d in inp.shape):
            op._check_size(inp)
        elif not 1 <= inp.dim() <= 16:
            raise InvalidArgumentError(f"inp: expected 1 to 16 dimensions, got {inp.dim()}")

    @all_gather_out.register_fake
    def _(handle: Any, inp: Any, out: Any) -> Any:
        count_if_run_on_meta(handle, "LamportAllGather", inp)  # a run, not a trace, on meta tensors
        same_device(inp=inp, out=out)
        checked_gather(instance(handle, "LamportAllGather"), inp)
        return None

    @torch.library.custom_op("mhccl::all_gather", mutates_args=(),
                             schema="(int handle, Tensor inp) -> Tensor")
    def all_gather(handle: int, inp: Tensor) -> Tensor:
        op = instance(handle, "LamportAllGather")

        def run() -> Tensor:
            op._check_size(inp)
            out = gathered(op, inp, torch.empty)
            op._launch(inp, out)
            return out
        return counted(op, run)

    @all_gather.register_fake
    def _(handle: Any, inp: Any) -> Any:
        count_if_run_on_meta(handle, "LamportAllGather", inp)  # a run, not a trace, on meta tensors
        op = instance(handle, "LamportAllGather")
        checked_gather(op, inp)
        return gathered(op, inp, torch.empty)

    # Every op is a collective: its call is one of the rank's sequence of calls that pair with the
    # peers' (SPEC.md, "Ranks that diverge"), so torch.compile must make it even where nothing
    # reads its outputs. Without this, a call whose results go unused (fresh `_out` buffers too)
    # was removed as dead code by aot_eager and Inductor: not launched and not counted, and where
    # the ranks traced different code (a result used on some ranks only) the ranks' calls paired
    # wrongly from then on (a review, 2026-12-05; measured with torch 2.11, the CPU tests).
    # torch.fx's side-effect registry is what FX's dead-code elimination and Inductor's scheduler
    # both read (torch._library.utils.is_impure, torch 2.11; an older Inductor may read only
    # whether the schema mutates, USAGE.md says so).
    from torch.fx.node import has_side_effect

    for collective in (all_reduce_mhc_out, all_reduce_mhc, all_reduce_mhc_finalize_out,
                       all_reduce_mhc_finalize, all_gather_out, all_gather):
        packet = getattr(torch.ops.mhccl, collective._name)
        for overload in packet.overloads():
            has_side_effect(getattr(packet, overload))
