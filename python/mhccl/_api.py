"""The PyTorch-facing classes over the C++ library (``mhccl._mhccl``).

Tensors cross into C++ through DLPack without copies (an input that is not contiguous or not
16-byte aligned is copied first); work goes on PyTorch's current CUDA stream of the tensors'
device, so CUDA-graph capture by PyTorch records it. Every error is an ``mhccl.Error``
(``mhccl/_errors.py``): a wrong Python type ``ArgumentTypeError`` (a ``TypeError``) naming the
argument, argument errors ``InvalidArgumentError`` / ``UnsupportedError`` (each a
``ValueError``), raised before anything is launched, and system errors (CUDA, NCCL, a peer that never published)
the class of their C++ code, with the C++ message.
"""

from __future__ import annotations

import functools
import importlib
import os
import operator
import sys
import threading
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, SupportsIndex, Tuple,
                    TypeVar, Union)

from . import _ops
from ._errors import ArgumentTypeError, Error, InvalidArgumentError, NoDeviceError

if TYPE_CHECKING:  # PyTorch is not a dependency: its types for the annotations only
    import torch
    from torch import Tensor
    from torch.distributed import ProcessGroup

    #: What ``device=`` takes: an int (NumPy's too), "cuda:N" or "cuda", a torch.device("cuda", N).
    Device = Union[SupportsIndex, str, torch.device]
    #: An optional (values, scales) pair of quantized outputs.
    OutputPair = Optional[Tuple[Tensor, Tensor]]

_T = TypeVar("_T")
_EXT: Any = None


def _lib() -> Any:
    """The compiled extension, loaded on first use (so that ``import mhccl`` works anywhere).
    NoDeviceError where it cannot be loaded: this machine cannot run mhccl as built."""
    global _EXT
    if _EXT is None:
        try:
            _EXT = importlib.import_module("mhccl._mhccl")
        except ImportError as e:  # no CUDA runtime / NCCL library on this machine, or not built
            here = os.path.dirname(os.path.abspath(__file__))
            built = sorted(f for f in os.listdir(here) if f.startswith("_mhccl.") and f.endswith(".so"))
            tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
            if built and not any(tag in f or ".abi3." in f for f in built):
                raise NoDeviceError(
                    f"mhccl's compiled extension could not be loaded ({e}): {here} holds "
                    f"{', '.join(built)}, built for another Python than this one "
                    f"({sys.version.split()[0]}); build it for this interpreter (scripts/test.sh "
                    "with its virtualenv active, or pip install . with it)") from e
            raise NoDeviceError(
                f"mhccl's compiled extension could not be loaded ({e}); it needs the CUDA 13 "
                "runtime and NCCL >= 2.28 (see README.md)") from e
    return _EXT


_INT64_MAX = 2**63 - 1
_INT32 = dict(lo=-(2**31), hi=2**31 - 1)  # _int_arg's bounds for a C++ int


def _is_boolish(value: Any) -> bool:
    """A bool, NumPy's bool_ or a bool tensor/array (which have __index__ and __float__). An int
    or a float is answered without getattr, which Dynamo cannot trace on a dynamic size or a
    dynamic float (an int or a float to it)."""
    if isinstance(value, (int, float)):
        return isinstance(value, bool)
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def _is_symint(value: Any) -> bool:
    """A torch.SymInt: a size of a trace with dynamic shapes (torch already imported then)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.SymInt)


def _int_arg(name: str, value: Any, lo: int = -(2**63), hi: int = _INT64_MAX) -> int:
    """``value`` as an int for argument ``name``: TypeError for anything but an integer (bool,
    NumPy's bool_, bool tensors and float included), ValueError outside [lo, hi] (the C++ type's
    range unless narrower). A torch.SymInt (a dynamic size while torch.compile traces) is
    returned as it is: its range is not known until the compiled code runs."""
    if _is_symint(value):
        return value  # type: ignore[no-any-return]
    if _is_boolish(value) or not hasattr(type(value), "__index__"):
        raise ArgumentTypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    try:
        v = operator.index(value)
    except TypeError:  # e.g. a float tensor or an array of several elements, which have __index__
        raise ArgumentTypeError(
            f"{name}: expected an int, got {type(value).__name__} {value!r}") from None
    except Exception as e:  # any other failure of its __index__: a meta tensor (RuntimeError), ...
        raise ArgumentTypeError(
            f"{name}: expected an int, got {type(value).__name__} {value!r}, whose conversion "
            f"failed: {type(e).__name__}: {e}") from e
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{name}: expected an int in [{lo}, {hi}], got {v}")
    return v


def _bool_arg(name: str, value: Any) -> bool:
    """A bool (NumPy's bool_ too); not an int, not a tensor."""
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return value


def _float_arg(name: str, value: Any) -> float:
    """An int or float (not bool, not str, not a bool tensor, not a complex: NumPy's would give
    its real part) as a float."""
    # An int or a float first, without getattr (Dynamo cannot trace one on a dynamic float).
    plain = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not plain and (_is_boolish(value) or isinstance(value, (str, bytes, complex)) or
                      not hasattr(type(value), "__float__") or "complex" in str(getattr(value, "dtype", ""))):
        raise ArgumentTypeError(f"{name}: expected a float, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:  # e.g. an int beyond the float range
        raise InvalidArgumentError(
            f"{name}: expected a finite float, got {type(value).__name__} beyond the "
            "float range") from None
    except (TypeError, ValueError, RuntimeError):  # a tensor of several elements, a meta tensor
        raise ArgumentTypeError(
            f"{name}: expected a float, got {type(value).__name__} {value!r}") from None
    except Exception as e:  # any other failure of its __float__
        raise ArgumentTypeError(
            f"{name}: expected a float, got {type(value).__name__} {value!r}, whose conversion "
            f"failed: {type(e).__name__}: {e}") from e


_FLT_MAX = 3.4028234663852886e38  # the largest finite float32 (the C++ API's eps is a float)


def _eps_arg(name: str, value: Any) -> float:
    """The RMSNorm epsilon: a float in [0, FLT_MAX], checked before the float32 conversion (a
    tiny negative would round to -0.0 and pass, a value beyond FLT_MAX would be undefined)."""
    eps = _float_arg(name, value)
    if not 0.0 <= eps <= _FLT_MAX:  # NaN fails both
        raise InvalidArgumentError(
            f"{name}: expected a finite RMSNorm epsilon >= 0 (at most {_FLT_MAX:.7g}, "
            f"a float32), got {eps!r}")
    return eps


def _str_arg(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name}: expected a str, got {type(value).__name__} {value!r}")
    return value


def _path_str_arg(name: str, value: Any) -> str:
    """A str or an ``os.PathLike`` of one, which the C++ API takes as a path: encodable as UTF-8
    (``os.fspath`` of a name that is not, e.g. from bytes on a POSIX file system, holds lone
    surrogates, which the binding's conversion refuses with an unnamed TypeError)."""
    if isinstance(value, os.PathLike):
        try:
            value = os.fspath(value)
        except TypeError:  # its __fspath__ returned neither str nor bytes
            raise ArgumentTypeError(f"{name}: expected a str path, got {type(value).__name__}") from None
        except Exception as e:  # its __fspath__ failed otherwise (an OSError, ...)
            raise ArgumentTypeError(
                f"{name}: expected a str path, got {type(value).__name__}, whose os.fspath "
                f"failed: {type(e).__name__}: {e}") from e
    path = _str_arg(name, value)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name}: expected a path encodable as UTF-8, got {path!r}") from None
    return path


def _tensor_arg(name: str, value: Any, optional: bool = False) -> Any:
    import torch

    if value is None and optional:
        return None
    if not isinstance(value, torch.Tensor):
        want = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise ArgumentTypeError(f"{name}: expected {want}, got {type(value).__name__}")
    # What DLPack cannot carry (the kernels read dense strided memory of a plain dtype): named here,
    # not left to a conversion's own error.
    if value.layout != torch.strided or value.is_nested:
        kind = "nested" if value.is_nested else str(value.layout).replace("torch.", "")
        raise InvalidArgumentError(f"{name}: expected a dense (strided) tensor, got a {kind} tensor")
    if _is_opaque_dtype(value.dtype):
        raise InvalidArgumentError(f"{name}: expected a tensor of a plain dtype, got {value.dtype}")
    return value


_OPAQUE_DTYPES: Optional[frozenset[Any]] = None


def _is_opaque_dtype(dtype: Any) -> bool:
    """A quantized dtype (torch.quint8, qint8, qint32, quint4x2, quint2x4: a tensor of one need
    not be is_quantized, e.g. a uint8 tensor's .view) or torch's bits* dtypes: no DLPack dtype
    carries them. (A set lookup: every tensor argument of every call asks.)"""
    global _OPAQUE_DTYPES
    if _OPAQUE_DTYPES is None:  # by name (no dir(): Dynamo traces this the first time, maybe)
        import torch

        names = ("quint8", "qint8", "qint32", "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8",
                 "bits16")
        _OPAQUE_DTYPES = frozenset(d for d in (getattr(torch, n, None) for n in names) if d is not None)
    return dtype in _OPAQUE_DTYPES


def _pair_arg(name: str, value: Any) -> Tuple[Any, Any]:
    """An optional (values, scales) output pair."""
    if value is None:
        return None, None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ArgumentTypeError(f"{name}: expected a (values, scales) pair of tensors or None, "
                                f"got {type(value).__name__}")
    return _tensor_arg(f"{name}[0] (values)", value[0]), _tensor_arg(f"{name}[1] (scales)", value[1])


def mxfp8_scale_bytes(m: int, hidden: int) -> int:
    """Bytes of the swizzled 128x4 UE8M0 scales of an [m, hidden] MXFP8 tensor:
    512 * ceil(m / 128) * ceil(hidden / 32 / 4).

    Args:
        m: rows, an int >= 0.
        hidden: elements a row, a positive multiple of 32.

    Raises:
        TypeError: ``m`` or ``hidden`` is not an int (bool and float are refused).
        ValueError: out of range, or a result beyond int64 (where the C++ ``mxfp8_scale_bytes``
            of ``mhccl/mxfp8.h`` returns -1).
    """
    m = _int_arg("m", m, 0)
    hidden = _int_arg("hidden", hidden, 1)
    if hidden % 32:
        raise InvalidArgumentError(f"hidden: expected a positive multiple of 32, got {hidden}")
    n = _ops._scale_bytes(m, hidden)
    if not _is_symint(n) and n > _INT64_MAX:
        raise InvalidArgumentError(f"mxfp8_scale_bytes({m}, {hidden}): {n} bytes exceed int64")
    return n


_FP8_GROUP = 128  # elements a per-token FP8 group (one FP32 scale)
_FP8_MAX_BYTES = 2**62  # the domain of the C++ fp8_group_scale_bytes (mhccl/fp8_groups.h)


def fp8_group_scale_rows(m: int) -> int:
    """Rows of each column of the per-token-group FP8 scales: Mp = ceil(m / 4) * 4 (16-byte
    aligned columns, DeepGEMM's TMA alignment).

    Args:
        m: rows, an int in [0, 2**62].

    Raises:
        TypeError: ``m`` is not an int (bool and float are refused).
        ValueError: out of range (where the C++ ``fp8_group_scale_rows`` returns -1).
    """
    return _ops._fp8_scale_rows(_int_arg("m", m, 0, 2**62))


def fp8_group_scale_bytes(m: int, hidden: int) -> int:
    """Bytes of the FP32 per-token-group FP8 scales of an [m, hidden] tensor, in DeepGEMM's
    MN-major TMA-aligned layout (scale(r, g) at float offset g * Mp + r, padding rows 0):
    4 * Mp * G, Mp = ``fp8_group_scale_rows(m)``, G = hidden / 128.

    Args:
        m: rows, an int >= 0.
        hidden: elements a row, a positive multiple of 128.

    Raises:
        TypeError: ``m`` or ``hidden`` is not an int (bool and float are refused).
        ValueError: out of range, or a result beyond 2**62 (where the C++
            ``fp8_group_scale_bytes`` of ``mhccl/fp8_groups.h`` returns -1).
    """
    m = _int_arg("m", m, 0)
    hidden = _int_arg("hidden", hidden, 1)
    if hidden % _FP8_GROUP:
        raise InvalidArgumentError(f"hidden: expected a positive multiple of 128, got {hidden}")
    n = 4 * _ops._fp8_scale_rows(m) * (hidden // _FP8_GROUP)
    if not _is_symint(n) and n > _FP8_MAX_BYTES:
        raise InvalidArgumentError(f"fp8_group_scale_bytes({m}, {hidden}): {n} bytes exceed 2**62")
    return n


def fp8_group_scales_view(scales: Tensor, m: int, hidden: int) -> Tensor:
    """The MN-major [m, G] view (strides (1, Mp)) of per-token-group FP8 scales, the float32
    tensor DeepGEMM's and vLLM's FP8 block-scaled GEMMs take (G = hidden / 128,
    Mp = ``fp8_group_scale_rows(m)``).

    Args:
        scales: a contiguous float32 torch.Tensor of Mp * G elements (any shape, e.g. the flat
            buffer or [G, Mp], but not a row-major [m, G] or [Mp, G], whose [r, g] is not
            scale(r, g); where the shape is also [G, Mp] it is taken as [G, Mp]), or
            that view already (returned as it is), over storage of at least its extent
            (G - 1) * Mp + m floats (vLLM's TMA-aligned scales at m % 4 != 0 end there).
        m, hidden: the rows and the width of the quantized tensor (as ``fp8_group_scale_bytes``).

    Returns: ``scales.as_strided((m, G), (1, Mp))``, sharing its storage.

    Raises:
        TypeError: ``scales`` is not a tensor, or ``m`` / ``hidden`` not ints.
        ValueError: a dtype other than float32, a wrong element count, a non-contiguous tensor
            other than the view, the view over storage short of its extent, or ``m`` /
            ``hidden`` out of range.
    """
    import torch

    floats = fp8_group_scale_bytes(m, hidden) // 4
    scales = _tensor_arg("scales", scales)
    mp, groups = fp8_group_scale_rows(m), hidden // _FP8_GROUP
    if scales.dtype != torch.float32:
        raise InvalidArgumentError(f"scales: expected dtype float32, got {scales.dtype}")
    if _is_fp8_scales_view(scales, m, groups, mp):
        _fp8_scales_for_kernel(scales, m, hidden, "scales")  # over storage of its extent at least
        return scales
    m_by_g = tuple(scales.shape) == (m, groups) and m > 1 and groups > 1
    if m_by_g and scales.stride(0) == 1:  # MN-major, but columns not Mp floats apart
        raise InvalidArgumentError(
            f"scales: expected the MN-major view [{m}, {groups}] with strides (1, {mp}) "
            f"(columns of Mp = fp8_group_scale_rows({m}) = {mp} floats, 16-byte aligned "
            "as DeepGEMM's TMA-aligned layout; vLLM's tma_aligned_scales=True) or the "
            f"flat buffer of {floats} floats, got column stride {scales.stride(1)}")
    # A row-major [m, G], or the padded [Mp, G] (m % 4 != 0): its [r, g] is not scale(r, g).
    # Where the shape is also [G, Mp] (rows == G == Mp, e.g. m = 40 at hidden = 5120), the
    # storage order itself, the two cannot be told apart: taken as [G, Mp], as the C++ check does.
    rows = scales.shape[0] if scales.dim() == 2 else 0
    if (rows in (m, mp) and rows > 1 and tuple(scales.shape) == (rows, groups) and groups > 1
            and not rows == groups == mp and scales.is_contiguous()):
        raise InvalidArgumentError(
            f"scales: expected the flat buffer of {floats} floats, [G, Mp] = [{groups}, {mp}], "
            f"or the MN-major view [{m}, {groups}] with strides (1, {mp}), got the row-major "
            f"shape [{rows}, {groups}] with strides {tuple(scales.stride())}, whose element "
            "[r, g] would not be scale(r, g) (at g * Mp + r)")
    if scales.numel() != floats or not scales.is_contiguous():
        raise InvalidArgumentError(
            f"scales: expected a contiguous tensor of {floats} float32 elements "
            f"(fp8_group_scale_rows({m}) * {groups}) or the view [{m}, {groups}] with "
            f"strides (1, {mp}), got shape {list(scales.shape)} with strides "
            f"{tuple(scales.stride())}")
    return scales.as_strided((m, groups), (1, mp))


def empty_fp8_group_scales(m: int, hidden: int,
                           device: Union[str, torch.device, int, None] = None) -> Tensor:
    """Uninitialized per-token-group FP8 scales for an [m, hidden] layer input: the MN-major
    [m, G] float32 view with strides (1, Mp) of a new buffer of Mp * G floats (what
    ``fp8_out`` takes and the kernels fill, padding rows included, and what DeepGEMM reads).

    Args:
        m, hidden: as ``fp8_group_scale_bytes``.
        device: any device torch.empty takes (e.g. "cuda:0"; None: torch's default device).

    Raises: as ``fp8_group_scale_bytes``.
    """
    import torch

    floats = fp8_group_scale_bytes(m, hidden) // 4
    buf = torch.empty((floats,), dtype=torch.float32, device=device)
    return buf.as_strided((m, hidden // _FP8_GROUP), (1, fp8_group_scale_rows(m)))


def _is_fp8_scales_view(t: Tensor, m: int, groups: int, mp: int) -> bool:
    """Whether ``t`` is the MN-major [m, G] view with strides (1, Mp) (a stride of a dimension
    of size 1 does not matter, as in the C++ check)."""
    return (t.dim() == 2 and tuple(t.shape) == (m, groups) and (m == 1 or t.stride(0) == 1)
            and (groups == 1 or t.stride(1) == mp))


def _fp8_scales_for_kernel(scales: Optional[Tensor], m: int, hidden: int,
                           name: str = "fp8 scales") -> Optional[Tensor]:
    """The FP8 scales as the C++ call gets them. The MN-major [m, G] view (strides (1, Mp)):
    the flat buffer of Mp * G floats where the view is the whole of a storage of exactly that
    size, from its start (``empty_fp8_group_scales``, or [G, Mp] storage of its own): every
    padding row is then written 0, as for the flat buffer. Else the view itself, over storage
    of at least its extent (G - 1) * Mp + m floats (vLLM's TMA-aligned scales at m % 4 != 0 end
    there), and the last column's padding rows, beyond the view, are not written: storage
    beyond the extent may belong to another tensor (a view carved from a workspace). Anything
    else goes to the C++ check as it is (which cannot see storage through DLPack)."""
    import torch

    if scales is None or scales.dtype != torch.float32 or hidden % _FP8_GROUP:
        return scales  # the C++ checks name what is wrong
    mp, groups = _ops._fp8_scale_rows(m), hidden // _FP8_GROUP
    if not _is_fp8_scales_view(scales, m, groups, mp):
        return scales  # a flat tensor: the C++ check counts its elements
    if torch.compiler.is_compiling():
        return scales  # Dynamo cannot trace storage; the op's implementation runs this again
    stored = scales.untyped_storage().nbytes() // 4
    if scales.storage_offset() == 0 and stored == mp * groups:
        return scales.as_strided((mp * groups,), (1,))
    held = stored - scales.storage_offset()
    extent = (groups - 1) * mp + m
    if held < extent:
        raise InvalidArgumentError(
            f"{name}: the view [{m}, {groups}] with strides (1, {mp}) must lie over at "
            f"least {extent} floats ((G - 1) * Mp + M), its storage holds {held} from "
            "its offset (allocate with mhccl.empty_fp8_group_scales)")
    return scales


def _device_index(device: Any) -> int:
    """The CUDA device number of an int (NumPy's too), a torch.device('cuda[:N]') or a 'cuda[:N]'
    string, in [0, 2**31) (the C++ API's int)."""
    bad = InvalidArgumentError(
        f"device: expected a CUDA device (torch.device('cuda:N'), 'cuda:N' or N >= 0), "
        f"got {device!r}")
    is_int = not isinstance(device, (bool, str)) and hasattr(type(device), "__index__")
    if isinstance(device, bool) or not (is_int or isinstance(device, str)
                                        or getattr(device, "type", None) is not None):
        raise ArgumentTypeError(f"device: expected an int, a 'cuda:N' str or a torch.device, "
                                f"got {type(device).__name__} {device!r}")
    if is_int:
        index = _int_arg("device", device)
        if not 0 <= index < 2**31:
            raise bad
        return index
    if isinstance(device, str):
        text = device.strip()
    else:  # torch.device
        if device.type != "cuda":
            raise bad
        given = getattr(device, "index", None)  # a device-like object may lack it
        if given is not None:
            return _int_arg("device.index", given, 0, 2**31 - 1)
        text = "cuda"
    if text.startswith("cuda:"):
        number = text.split(":", 1)[1]
        if not (number.isascii() and number.isdigit()) or int(number) >= 2**31:  # not "²"
            raise bad
        return int(number)
    if text == "cuda":
        try:
            import torch
        except ImportError as e:  # 'cuda' names PyTorch's current device
            raise InvalidArgumentError("device: 'cuda' means PyTorch's current CUDA device, and PyTorch is "
                                       "not installed; give the device number ('cuda:N' or N)") from e
        try:
            return int(torch.cuda.current_device())
        except (RuntimeError, AssertionError) as e:  # no driver or no device: torch's own error
            raise NoDeviceError(f"device: 'cuda' (the current CUDA device): no CUDA device ({e})") from e
    raise bad


def _engine_tp_group() -> Any:
    """vLLM's TP device group when vLLM's parallel state is initialized in this process, else None.

    Only a vLLM already imported is asked (its parallel state cannot be initialized otherwise), so
    mhccl never imports vLLM itself. An uninitialized state raises AssertionError in vLLM's
    ``get_tp_group``; its group is ``None`` while the state is torn down."""
    vllm_distributed = sys.modules.get("vllm.distributed")
    if vllm_distributed is None:
        return None
    try:
        return vllm_distributed.get_tp_group().device_group
    except (AssertionError, AttributeError):
        return None


def _resolve_group(group: Any) -> Any:
    """The TP group ``group`` stands for: itself (a torch.distributed ProcessGroup, checked), or for
    None the engine's TP group when vLLM's parallel state is initialized
    (``vllm.distributed.get_tp_group().device_group``, as the reference module does), else
    torch.distributed's world group when it is initialized, else None (TP=1). Asks
    torch.distributed nothing about a group given, which may have been destroyed since."""
    try:
        import torch.distributed as dist
    except ImportError:
        if group is not None:
            raise
        return None
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = _engine_tp_group()
        return dist.group.WORLD if group is None else group
    if not isinstance(group, getattr(dist, "ProcessGroup", ())):
        raise ArgumentTypeError(f"group: expected a torch.distributed ProcessGroup or None, "
                                f"got {type(group).__name__}")
    return group


def _group_layout(group: Any) -> Tuple[Any, int, int]:
    """(group, tp, rank) of the TP group (``_resolve_group``; None, 1, 0 for TP=1 without
    torch.distributed)."""
    group = _resolve_group(group)
    if group is None:
        return None, 1, 0
    import torch.distributed as dist

    try:
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
    except (ValueError, RuntimeError) as e:  # torch.distributed not (or no longer) initialized
        raise InvalidArgumentError(f"group: torch.distributed cannot use it ({e})") from e
    if rank < 0:
        raise InvalidArgumentError(f"group: this process is not a member of it (a group of {tp} ranks)")
    return group, tp, rank


_MAX_WAIT_TIMEOUT_MS = 24 * 3600 * 1000  # the C++ bound (src/comm/communicator.cpp): a day


def _options_args(wait_timeout_ms: Any, watchdog: Any, force_nccl_fallback: Any
                  ) -> Tuple[Optional[int], bool, bool]:
    """The communicator options of a constructor, checked as the C++ constructor checks them, but
    before anything is built: wait_timeout_ms None (the default) or an int in [1, 86400000]."""
    if wait_timeout_ms is not None:
        wait_timeout_ms = _int_arg("wait_timeout_ms", wait_timeout_ms, 1, _MAX_WAIT_TIMEOUT_MS)
    return (wait_timeout_ms, _bool_arg("watchdog", watchdog),
            _bool_arg("force_nccl_fallback", force_nccl_fallback))


def _config_error(tp: int, check: Callable[[], None]) -> Optional[Error]:
    """Runs a constructor's configuration check (the C++ one). At TP=1 its error is raised at
    once, before anything is built. At TP > 1 it is returned instead, for the constructor to
    raise after the collective construction: the peers wait for this rank in the configuration
    agreement, so a rank that raised alone before it (its value unlike theirs) would leave them
    to wait out their budget and abort the group's communicator. Given the same values, the C++
    constructor raises this error (naming the field) after the agreement, and the peers raise
    that another rank's configuration is invalid; the communicator stays usable (SPEC: a
    mismatch raises on every rank, never a hang)."""
    try:
        check()
    except Error as e:
        if tp <= 1:
            raise
        return e
    return None


def _held_arg(tp: int, held: List[Error], convert: Callable[[], _T], placeholder: _T) -> _T:
    """A configuration argument converted (``_int_arg``, ``_bool_arg``, ``_str_arg``). At TP=1
    its error (a wrong Python type, or a value outside the C++ type's range) is raised at once.
    At TP > 1 it is held in ``held`` and ``placeholder`` returned instead, so that the rank
    still takes part in the configuration agreement, as ``_config_error`` lets a value that
    breaks a limit: its constructor passes a configuration the C++ check refuses, every rank
    raises there (its peers that another rank's configuration is invalid) and the group's
    communicator stays usable; the rank itself then raises the held error."""
    try:
        return convert()
    except (ArgumentTypeError, InvalidArgumentError) as e:
        if tp <= 1:
            raise
        held.append(e)
        return placeholder


def _construct(build: Callable[[], _T], held: List[Error], local_error: Optional[Error]) -> _T:
    """A constructor's collective part, ``build()`` (the communicator and the C++ op, whose
    configuration agreement every rank joins), then this rank's own errors, in this order: the
    first held argument error (``_held_arg``; chained to the collective's error where it
    failed, which the refused placeholder configuration caused, or any other), then the
    configuration check's (``_config_error``; the C++ constructor raises it after the agreement
    already, so this is reached only where ``build`` did not run the real constructor)."""
    try:
        built = build()
    except Exception as e:  # an Error of the agreement, or torch.distributed's own
        if held:
            raise held[0] from e
        raise
    if held:
        raise held[0]
    if local_error is not None:
        raise local_error
    return built


# One communicator per (group, device, options), shared by every op built with them and kept
# until forget_communicator: its rejected-call count and its unusable state are theirs in
# common. Whether a construction finds it or builds a new one (a collective) has to be the same
# on every rank, so it depends only on the sequence of constructions and forget_communicator
# calls, which every rank makes alike, and never on which old ops happen to be alive: garbage
# collection differs from rank to rank, and while the cache held its communicators weakly an
# old op kept alive on one rank only (by a traceback, say) made that rank reuse the communicator
# while its peers built a new one, and the ranks met in different collectives (a review,
# 2026-12-05). The key holds the group's id(); the entry holds the group itself, so that no
# other group is made at that address while the entry stands.
_COMMUNICATORS: "Dict[Tuple[Any, ...], Tuple[Any, Any]]" = {}


def _group_id(group: Any) -> int:
    """A resolved group's part of a _COMMUNICATORS key (0: TP=1 without torch.distributed)."""
    return id(group) if group is not None else 0


def _new_communicator(layout: Tuple[Any, int, int], device: int, wait_timeout_ms: Optional[int] = None,
                      watchdog: bool = True, force_nccl_fallback: bool = False) -> Any:
    """The collective construction of a TP group's communicator: rank 0 of the group makes the
    NCCL unique id, the group broadcasts it (torch.distributed), every rank builds its
    communicator. ``layout``: the group's (group, tp, rank), as _group_layout gives it. Not
    cached (_communicator caches)."""
    lib = _lib()
    group, tp, rank = layout
    if tp == 1:
        uid = lib.unique_id()
    else:
        import torch
        import torch.distributed as dist

        box = [lib.unique_id() if rank == 0 else None]
        with torch.cuda.device(device):
            dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        uid = box[0]
    return lib.Communicator(uid, rank, tp, device, wait_timeout_ms=wait_timeout_ms,
                            watchdog=watchdog, force_nccl_fallback=force_nccl_fallback)


_DEFAULT_WAIT_TIMEOUT_MS = 30000  # CommunicatorOptions::wait_timeout_ms's default


def _budget_key(wait_timeout_ms: Optional[int]) -> Any:
    """The wait budget a communicator built with ``wait_timeout_ms`` gets, as a _COMMUNICATORS
    key: None and 30000 are one budget, and so is every value while ``MHCCL_WAIT_TIMEOUT_MS`` is
    set (it wins over them). Keyed as given, a rank that passed None for one op and 30000 for
    the next built a second communicator, a collective its peers did not join (a review,
    2026-12-05)."""
    env = os.environ.get("MHCCL_WAIT_TIMEOUT_MS")
    if env is not None:
        return ("MHCCL_WAIT_TIMEOUT_MS", env)
    return _DEFAULT_WAIT_TIMEOUT_MS if wait_timeout_ms is None else wait_timeout_ms


def _communicator(group: Any, device: int, wait_timeout_ms: Optional[int] = None,
                  watchdog: bool = True, force_nccl_fallback: bool = False) -> Any:
    """The group's communicator for these options: the cached one (_COMMUNICATORS), else a new
    one (_new_communicator: collective), kept. Ops of other options get a communicator of their
    own (every rank passes the same options, so every rank builds it)."""
    layout = _group_layout(group)
    key = (_group_id(layout[0]), device, _budget_key(wait_timeout_ms), watchdog, force_nccl_fallback)
    entry = _COMMUNICATORS.get(key)
    if entry is not None:
        return entry[0]
    comm = _new_communicator(layout, device, wait_timeout_ms, watchdog, force_nccl_fallback)
    _COMMUNICATORS[key] = (comm, layout[0])
    return comm


def forget_communicator(group: Any = None, device: Any = None) -> int:
    """Makes the next op built for ``group`` build a new communicator rather than share the one
    its earlier ops use: the Python side of "destroy the communicator and its ops, and build them
    again", the recovery after an error that made the group's communicator unusable
    (``PeerTimeoutError``, ``DivergenceError``, a failed launch; ``UnusableError`` after it).

    Ops share one communicator per (group, device, options), kept from the first op built with
    them until this is called, so without this a new op finds the unusable one again and raises
    ``UnusableError``. (It is kept rather than dropped with the last op: whether an op finds it
    or builds a new one, a collective, then depends only on the calls every rank makes alike,
    not on which old ops a rank's garbage collection left alive.) Building the new communicator
    is collective, as the first was: every rank of the group calls this (with the same
    arguments), then builds its ops again. The old ops keep the old communicator and raise
    ``UnusableError`` if called; drop them (its memory goes with the last of them). A healthy
    communicator may be forgotten too (its memory goes once its ops are gone), on every rank:
    before ``torch.distributed.destroy_process_group()`` or vLLM's ``destroy_model_parallel()``,
    for one, since the cache keeps the group object beside its communicator (after them, pass
    the group object itself: None then means another group, or TP=1).

    Args:
        group: the TP group, as the ops' ``group`` (None: the same default).
        device: only the communicators of this device (as the ops' ``device``); None: every one
            of the group on this process.

    Returns:
        How many communicators were forgotten (0 where the group had none).
    """
    # The group as given, not asked of torch.distributed: a group destroyed since is still found
    # (the cache keeps the group object beside its communicator).
    index = None if device is None else _device_index(device)
    gid = _group_id(_resolve_group(group))
    forgotten = 0
    for key in list(_COMMUNICATORS):  # a copy: another thread's op may change it
        if key[0] == gid and (index is None or key[1] == index):
            forgotten += _COMMUNICATORS.pop(key, None) is not None
    return forgotten


def _torch_ops() -> Any:
    """torch.ops.mhccl (registered when the first instance was built)."""
    import torch

    return torch.ops.mhccl


def _stream(device: int) -> int:
    """PyTorch's current stream of the op's device (not of a tensor's: a tensor on the wrong
    device then reaches the C++ checks, which name it)."""
    import torch

    return int(torch.cuda.current_stream(device).cuda_stream)


def _bytes_view(t: Optional[Tensor], name: str, fp8: str) -> Optional[Tensor]:
    """``t`` as uint8 where its dtype is ``torch.<fp8>`` (float8_e4m3fn values, float8_e8m0fnu
    MXFP8 scales), which every DLPack version carries. Another 8-bit float is refused here (as
    uint8 it would pass the C++ check, which takes raw bytes); other dtypes go to the C++ checks
    as they are (which take uint8/int8 and refuse the rest)."""
    import torch

    if t is None or not t.dtype.is_floating_point or t.element_size() != 1:
        return t
    if t.dtype != getattr(torch, fp8, None):
        raise InvalidArgumentError(f"{name}: expected dtype {fp8} (or uint8/int8), got {t.dtype}")
    return t.view(torch.uint8)


def _packed(t: Optional[Tensor], shape: Optional[Sequence[Optional[int]]] = None) -> Any:
    """An input as the kernels read it: contiguous and 16-byte aligned, else a copy (the
    reference module's ``.flatten()`` copies a non-contiguous tensor the same way). ``shape``:
    the shape the C++ check will ask for (None: any size of that dimension); a tensor of
    another shape is passed on uncopied, so that an expanded tensor (stride 0) standing for far
    more elements than it holds is refused by the check, not copied first."""
    import torch

    if t is None:
        return t
    lazy = t.is_conj() or t.is_neg()  # torch's lazy conjugate / negation: DLPack carries the memory only
    if not lazy and t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    if shape is not None and (t.dim() != len(shape) or any(
            want is not None and got != want for got, want in zip(t.shape, shape))):
        return t  # the C++ check names the shape it expected
    if shape is not None and any(want is None and got >= 2**31 for got, want in zip(t.shape, shape)):
        return t  # a free dimension beyond the C++ API's int (gemm2's rows): its check names it, no copy first
    if lazy:
        t = t.resolve_conj().resolve_neg()
        if t.is_contiguous() and t.data_ptr() % 16 == 0:
            return t
    return t.clone(memory_format=torch.contiguous_format)


def _written(**outputs: Optional[Tensor]) -> None:
    """Refuses an output with torch's lazy conjugate or negative bit (``z.conj()``,
    ``z.conj().imag``): the kernels write its memory, which such a view reads conjugated or
    negated. DLPack has no such bit (torch refuses to export it, nanobind then takes the raw
    memory), so nothing else would notice."""
    for name, t in outputs.items():
        if t is not None and (t.is_conj() or t.is_neg()):
            raise InvalidArgumentError(
                f"{name}: expected a tensor without the lazy conjugate or negative bit "
                "(the call writes its memory), got a conjugated or negated view: pass "
                "a tensor of its own (e.g. torch.empty_like) and conjugate after")


def _by_count(t: Optional[Tensor], shape: Sequence[int]) -> Any:
    """A mix tensor of ``prod(shape)`` elements in any shape (the reference module checks mixes by
    element count and reads them flat), as ``shape``. Other counts go to the C++ checks as given,
    whose message names the expected shape."""
    n = 1
    for d in shape:
        n *= d
    if t is None or t.numel() != n or tuple(t.shape) == tuple(shape):
        return t
    return t.reshape(shape)


def _mix_count_error(name: str, t: Optional[Tensor], shape: Sequence[int]) -> None:
    n = 1
    for d in shape:
        n *= d
    if t is not None and t.numel() != n:
        dims = ", ".join(str(d) for d in shape)
        raise InvalidArgumentError(
            f"{name}: expected {n} elements ([{dims}] in any shape), got shape "
            f"{list(t.shape)} ({t.numel()} elements)")


# One lock a communicator (by id(); an entry outlives its communicator, harmlessly: a later one
# at the same address shares an unused lock), held over a call's checks and launch by
# _counting_rejections, so that another thread's call of the same communicator cannot move its
# counts between the snapshot and the check (a review, 2026-12-05: thread A's rejected call,
# its conversion still running while thread B's call launched, was taken for launched and never
# counted, and two concurrent rejections counted once). Re-entrant: the public method runs
# the torch op's implementation, which counts again inside it.
_CALL_LOCKS: "Dict[int, threading.RLock]" = {}
_CALL_LOCKS_GUARD = threading.Lock()


def _call_lock(comm: Any) -> "threading.RLock":
    """The lock of ``comm``'s calls (_CALL_LOCKS)."""
    lock = _CALL_LOCKS.get(id(comm))
    if lock is None:
        with _CALL_LOCKS_GUARD:
            lock = _CALL_LOCKS.setdefault(id(comm), threading.RLock())
    return lock


def _counting_rejections(op: Any, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``, a call of ``op`` (an AllReduceMHC or LamportAllGather). Where it raises before the C++
    op counted it as rejected (a check of this package, a torch allocation or copy, the binding's
    conversions), the call is counted here: every rank's contribution to a call carries its
    count of rejected calls, so that a call rejected on some ranks only is an error on every
    rank at the next call (a RuntimeError from the C++ kDivergence) instead of the ranks' calls
    pairing wrongly from then on (SPEC.md, "Ranks that diverge get an error"). Under
    torch.compile (fullgraph=False) a check that raises while Dynamo traces the call breaks the
    graph there, and Dynamo runs this function eagerly instead (measured with torch 2.11): the
    eager branch below counts it, once a call, as it counts an eager call's; where the trace
    does not fall back so (non-strict torch.export runs the code "compiling"), the handler of
    the compiling branch counts it, outside any graph."""
    comm = getattr(op, "_comm", None)  # None: an instance without its C++ side (the CPU tests')
    if comm is None:
        return fn(*args, **kwargs)
    if _compiling():
        # No rejected_calls read here (a graph break on a valid call's trace); a check of this
        # package that raises: counted by a function torch.compile leaves out of the graph.
        try:
            return fn(*args, **kwargs)
        except Error:
            _note_rejected_while_compiled(op, comm)
            raise
    # Neither count moved: the call raised before it reached the C++ op's launch, which counted
    # nothing (an interrupt after the launch, KeyboardInterrupt included, moved launched_calls:
    # that call went out and pairs with its peers', so it is not counted as rejected). Under the
    # communicator's call lock, so that only this call moves them (_CALL_LOCKS); the C++ op
    # serializes a communicator's calls anyway, and a thread waiting here releases the GIL.
    lock = _call_lock(comm)
    try:
        lock.acquire()
    except BaseException:  # an interrupt while another thread's call held it: this one never went out
        comm.note_rejected_call(_rejection_stream(op))
        raise
    try:
        before = (comm.rejected_calls, comm.launched_calls)
        try:
            return fn(*args, **kwargs)
        except BaseException:
            if (comm.rejected_calls, comm.launched_calls) == before:
                comm.note_rejected_call(_rejection_stream(op))
            raise
    finally:
        lock.release()


def _note_rejected_while_compiled(op: Any, comm: Any) -> None:
    """The count of a call rejected while torch.compile traced it (``_counting_rejections``),
    kept out of the compiled graph."""
    import torch

    def note() -> None:
        comm.note_rejected_call(_rejection_stream(op))

    # torch.compiler.disable is untyped in torch's annotations: taken as what it is here.
    disable: Callable[[Callable[[], None]], Callable[[], None]] = getattr(torch.compiler, "disable")
    disable(note)()


def _rejection_stream(op: Any) -> int:
    """The stream a rejected call of ``op`` was made on: PyTorch's current stream of the op's
    device, where the count of rejected calls advances (in stream order, so that the next call
    enqueued there carries it); the legacy default stream where there is none to be had."""
    device = getattr(op, "_device", None)
    if device is None:
        return 0
    try:
        return _stream(device)
    except Exception:  # no usable CUDA here: the legacy default stream
        return 0


def _compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


def _not_meta(name: str, t: Tensor) -> None:
    """Refuses a call made outside torch.compile's tracing whose leading tensor is a meta tensor.
    Such a call would reach only the fake implementation (the meta kernel torch dispatches meta
    tensors to): it would return meta outputs with no error and no call counted, so this rank's
    next real call would pair with its peers' call of this one (SPEC.md, "Ranks that diverge
    get an error"). Raised here, it is counted as a rejected call like any other. A meta tensor
    among CUDA ones is refused by the fake implementation's device check (also counted)."""
    if t.is_meta and not _compiling():
        raise InvalidArgumentError(
            f"{name}: a meta tensor; the op runs on CUDA tensors (meta tensors reach only the shapes "
            "torch.compile traces)")


class AllReduceMHC:
    """Lamport TP all-reduce fused with mHC post-mix, collapse, RMSNorm (and MXFP8 or
    per-token-group FP8).

    ``__call__`` reduces ``x`` across the TP group (FP32, rank order, one BF16 rounding), writes
    the post-mixed hc streams and the normalized collapse of them with the carried pre-mix
    (rounded to BF16 before the norm, as the reference module and unfused engines do).
    ``finalize`` does the same for an unfinalized MoE output, folding the top-k reduction and the
    shared expert (added last) into the publish. Construction is collective over the TP group:
    every rank, the same arguments.

    Args:
        hidden_size: H, a multiple of 8 (of 32 with ``quantize_layer_input``, of 128 with
            ``quantize_layer_input_fp8``), at most 32768.
        hc_mult: hc, the number of mHC residual streams: 1, 2, 4 or 8.
        max_num_tokens: the most rows (tokens) of a call.
        top_k: routes per token of ``finalize``, 1..16.
        device: the CUDA device of this rank (an int, ``torch.device("cuda", N)`` or "cuda:N").
        quantize_layer_input: accept ``mxfp8_out`` buffers (MXFP8 copy of the layer input).
        residual_only: accept ``pre`` and ``norm_weight`` of None (write the streams only).
        quantize_layer_input_fp8: accept ``fp8_out`` buffers (per-token-group FP8 copy of the
            layer input: groups of 128, FP32 scales in DeepGEMM's MN-major TMA-aligned layout,
            for Hopper's FP8 block-scaled GEMMs). Not together with ``quantize_layer_input``.
        fp8_ue8m0_scales: with ``quantize_layer_input_fp8``, power-of-two scales
            (s = 2^ceil(log2(s)), the UE8M0 rule of DeepGEMM's newer recipes and vLLM's
            ``use_ue8m0``).
        group: the torch.distributed process group of the TP ranks. None (the default): the
            engine's TP group when vLLM's parallel state is initialized in this process
            (``vllm.distributed.get_tp_group().device_group``, as the reference module uses),
            else torch.distributed's world group when it is initialized, else TP=1.
        two_shot_min_rows, two_shot_min_finalize_rows: rows from which two-shot is used (0: the
            measured default for the group's size).
        nccl_min_rows, nccl_min_finalize_rows: opt-in, rows from which the NCCL all-reduce +
            the fused consumer is used (0: never). At TP=2 calls of 4096 rows or more are
            faster that way, but NCCL waits for a dead peer without a time budget (the Lamport
            paths raise instead). ``protocol_for`` says which path a call takes.
        wait_timeout_ms: the budget of every wait on a peer, in milliseconds: an int in
            [1, 86400000] (24 h), or None (the default) for 30000. Each Lamport wait of a call,
            the host-side waits (construction, barriers, teardown) and the NCCL fallback's
            operations (through the watchdog) end after it with ``PeerTimeoutError`` naming
            the peer, instead of waiting for a dead one. ``MHCCL_WAIT_TIMEOUT_MS``, where set,
            wins over this argument and the default alike (the C++ constructor applies it over
            any value; the attribute ``wait_timeout_ms`` says the budget in effect). Give every
            rank the same budget; ranks must start within it of one another.
        watchdog: the NCCL fallback's watchdog thread (default True): from the first fallback
            call on, a background thread aborts the NCCL communicator when a fallback operation
            made no progress for the budget, so that a synchronization stuck behind a dead peer
            returns and the next call raises ``PeerTimeoutError``. False: only calls and
            ``check_errors()`` look (teardown still starts it for its own synchronizations).
            Keep it on where the fallback runs inside CUDA graphs.
        force_nccl_fallback: take the NCCL fallback (ncclAllReduce + the same fused consumer)
            even where every peer's memory is reachable (default False).
        tuning_file: a tuning table written by ``mhccl-tune`` (docs/TUNING.md): the entry for
            this GPU, group and variant sets the thresholds left at their defaults above and the
            streaming call's launch shapes. "" (the default): the file ``MHCCL_TUNING_FILE``
            names, if set; no matching entry: the built-in defaults. ``tuning_source`` says
            which was used.

        Ops built on the same group and device with the same ``wait_timeout_ms``, ``watchdog``
        and ``force_nccl_fallback`` share one communicator (C++ ``CommunicatorOptions``), kept
        until ``mhccl.forget_communicator``; other values build another one (collectively: pass
        the same on every rank).

    Attributes:
        bt_min_rows, bt_min_finalize_rows: as in the reference module, the least M from which a
            call (finalize) uses the two-shot protocol; ``capacity + 1`` (capacity:
            ``max_num_tokens``, as the module's attribute of that name) when two-shot is not
            built (TP=1, a threshold above ``max_num_tokens``, peers reached through NCCL only).
        wait_timeout_ms, watchdog, force_nccl_fallback: the communicator's options in effect
            (read only; ``wait_timeout_ms`` with ``MHCCL_WAIT_TIMEOUT_MS`` applied).
        tuning_source: where the thresholds came from: the tuning table's entry, or the
            built-in defaults.

    Raises:
        ArgumentTypeError: (a TypeError) an argument of the wrong Python type, named.
        InvalidArgumentError, UnsupportedError: (ValueErrors) a limit above is broken, checked
            before anything is built. At TP > 1 a rank whose configuration argument is refused
            (a limit, a wrong Python type, a value outside the C++ type's range) still takes part
            in the construction's configuration agreement first, so that every rank raises (its
            peers that another rank's configuration is invalid) and the group's communicator
            stays usable. ``device``, ``group`` and the communicator options are checked at
            once: they choose the communicator the agreement runs on.
        NoDeviceError: no CUDA device (or the compiled extension cannot be loaded here).
        CudaError, NcclError: a CUDA or NCCL failure.
        PeerTimeoutError: a rank did not join the construction within the budget.
        UnusableError: an earlier error made the group's communicator unusable.
    """

    def __init__(self, *, hidden_size: int, hc_mult: int, max_num_tokens: int, top_k: int,
                 device: Device, quantize_layer_input: bool = False, residual_only: bool = False,
                 group: Optional[ProcessGroup] = None, two_shot_min_rows: int = 0,
                 two_shot_min_finalize_rows: int = 0, nccl_min_rows: int = 0,
                 nccl_min_finalize_rows: int = 0, quantize_layer_input_fp8: bool = False,
                 fp8_ue8m0_scales: bool = False, wait_timeout_ms: Optional[int] = None,
                 watchdog: bool = True, force_nccl_fallback: bool = False,
                 tuning_file: str = "") -> None:
        _, tp, _ = _group_layout(group)
        # The configuration's arguments: at TP > 1 a wrong type or a value outside the C++
        # type's range is held (_held_arg), and the rank agrees on a refused configuration.
        held: List[Error] = []
        hidden_size = _held_arg(tp, held, lambda: _int_arg("hidden_size", hidden_size), 0)
        hc_mult = _held_arg(tp, held, lambda: _int_arg("hc_mult", hc_mult, **_INT32), 4)
        max_num_tokens = _held_arg(tp, held, lambda: _int_arg("max_num_tokens", max_num_tokens), 1)
        top_k = _held_arg(tp, held, lambda: _int_arg("top_k", top_k, **_INT32), 1)
        quantize_layer_input = _held_arg(
            tp, held, lambda: _bool_arg("quantize_layer_input", quantize_layer_input), False)
        residual_only = _held_arg(tp, held, lambda: _bool_arg("residual_only", residual_only), False)
        quantize_layer_input_fp8 = _held_arg(
            tp, held, lambda: _bool_arg("quantize_layer_input_fp8", quantize_layer_input_fp8), False)
        fp8_ue8m0_scales = _held_arg(tp, held, lambda: _bool_arg("fp8_ue8m0_scales", fp8_ue8m0_scales), False)
        tuning_file = _held_arg(tp, held, lambda: _path_str_arg("tuning_file", tuning_file), "")
        fp8 = dict(quantize_layer_input_fp8=quantize_layer_input_fp8,
                   fp8_ue8m0_scales=fp8_ue8m0_scales)
        thresholds = [_held_arg(tp, held, functools.partial(_int_arg, n, v), 0) for n, v in (
            ("two_shot_min_rows", two_shot_min_rows),
            ("two_shot_min_finalize_rows", two_shot_min_finalize_rows),
            ("nccl_min_rows", nccl_min_rows), ("nccl_min_finalize_rows", nccl_min_finalize_rows))]
        if held:
            hidden_size = 0  # a configuration the C++ check refuses, on this rank alone
        options = _options_args(wait_timeout_ms, watchdog, force_nccl_fallback)
        lib = _lib()
        local_error = _config_error(tp, lambda: lib.check_config(
            hidden_size, hc_mult, max_num_tokens, top_k, quantize_layer_input, residual_only, tp,
            *thresholds, **fp8))
        self.hidden_size = hidden_size
        self.hc_mult = hc_mult
        self.capacity = max_num_tokens
        self.top_k = top_k
        self.quantize_layer_input = quantize_layer_input
        self.residual_only = residual_only
        self.quantize_layer_input_fp8 = quantize_layer_input_fp8
        self.fp8_ue8m0_scales = fp8_ue8m0_scales
        self._device = _device_index(device)

        def build() -> Tuple[Any, Any]:
            comm = _communicator(group, self._device, *options)
            return comm, lib.AllReduceMHC(comm, hidden_size, hc_mult, max_num_tokens, top_k,
                                          quantize_layer_input, residual_only, *thresholds, **fp8,
                                          tuning_file=tuning_file)
        self._comm, self._op = _construct(build, held, local_error)
        # Where the thresholds came from: the tuning table's entry, or the built-in defaults.
        self.tuning_source: str = self._op.tuning_source
        # Two-shot exists only between peers that reach each other's memory (TP > 1, not the
        # NCCL fallback) and for a threshold a call can reach.
        bt_built = self._comm.tp > 1 and self._comm.peers_reachable
        never = max_num_tokens + 1
        self.bt_min_rows = min(self._op.two_shot_min_rows, never) if bt_built else never
        self.bt_min_finalize_rows = (min(self._op.two_shot_min_finalize_rows, never)
                                     if bt_built else never)
        # Calls dispatch through torch ops (mhccl/_ops.py), which reach this instance by handle.
        _ops.ensure_registered()
        self._handle = _ops.register_instance(self)

    # The checks and the outputs of a call, in Python where the reference module's interface is
    # wider than the C++ API's (mixes by element count, inputs of any strides); every other check
    # is the C++ one, run before the first launch.
    def _outputs(self, m: int, residual: Tensor, pre: Optional[Tensor], residual_out: Any,
                 layer_input: Any, mxfp8_out: Any, fp8_out: Any) -> Tuple[Any, ...]:
        import torch

        values, scales = _pair_arg("mxfp8_out", mxfp8_out)
        fp8_values, fp8_scales = _pair_arg("fp8_out", fp8_out)
        residual_out = _tensor_arg("residual_out", residual_out, optional=True)
        layer_input = _tensor_arg("layer_input", layer_input, optional=True)
        if residual_out is None:
            residual_out = torch.empty((m, self.hc_mult, self.hidden_size), dtype=torch.bfloat16,
                                       device=residual.device)
        if layer_input is None and pre is not None:
            layer_input = torch.empty((m, self.hidden_size), dtype=torch.bfloat16,
                                      device=residual.device)
        return residual_out, layer_input, values, scales, fp8_values, fp8_scales

    def _rows(self, name: str, t: Tensor) -> int:
        """M of a call from its leading [M, H] tensor, in [1, max_num_tokens]: checked as the C++
        check does, but before any output is allocated or input copied (an expanded tensor of
        many rows, stride 0, would otherwise be allocated for and copied first). M's range is not
        checked while Dynamo traces or where M is symbolic (it would guard on M and raise at
        compile time): the op's real implementation checks it when the compiled code runs."""
        import torch

        if t.dim() != 2 or t.shape[1] != self.hidden_size:
            got = "a scalar" if t.dim() == 0 else str(list(t.shape))
            raise InvalidArgumentError(f"{name}: expected shape [M, {self.hidden_size}], got {got}")
        m: int = t.shape[0]  # an int to the type checker, a SymInt where M is dynamic
        symbolic = not isinstance(m, int)  # a SymInt: fake tensors of a trace with dynamic M
        if not symbolic and not torch.compiler.is_compiling() and not 1 <= m <= self.capacity:
            raise InvalidArgumentError(
                f"{name}: expected M (rows) in [1, {self.capacity}] (max_num_tokens), "
                f"got M={m}")
        return m

    def _epilogue_inputs(self, m: int, residual: Any, post: Any, comb: Any, pre: Any,
                         norm_weight: Any, norm_eps: Any) -> Tuple[Any, ...]:
        residual = _tensor_arg("residual", residual)
        post = _tensor_arg("post", post)
        comb = _tensor_arg("comb", comb)
        pre = _tensor_arg("pre", pre, optional=True)
        norm_weight = _tensor_arg("norm_weight", norm_weight, optional=True)
        eps = _eps_arg("norm_eps", norm_eps)
        hc = self.hc_mult
        _mix_count_error("post", post, (m, hc))
        _mix_count_error("comb", comb, (m, hc, hc))
        _mix_count_error("pre", pre, (m, hc))
        return residual, post, comb, pre, norm_weight, eps

    def _packed_epilogue(self, m: int, residual: Tensor, post: Tensor, comb: Tensor,
                         pre: Optional[Tensor], norm_weight: Optional[Tensor]) -> Tuple[Any, ...]:
        """The epilogue's inputs as the C++ API takes them (run where the kernels are launched)."""
        hc, h = self.hc_mult, self.hidden_size
        # Mixes of the right count are [M, hc(, hc)] after _by_count ([M, hc, 1] post too).
        return (_packed(residual, (m, hc, h)), _packed(_by_count(post, (m, hc)), (m, hc)),
                _packed(_by_count(comb, (m, hc, hc)), (m, hc, hc)),
                _packed(_by_count(pre, (m, hc)), (m, hc)), _packed(norm_weight, (h,)))

    def _kernel_outputs(self, m: int, residual_out: Tensor, layer_input: Optional[Tensor],
                        values: Optional[Tensor], scales: Optional[Tensor],
                        fp8_values: Optional[Tensor], fp8_scales: Optional[Tensor]
                        ) -> Tuple[Tuple[Any, ...], Optional[Tensor]]:
        """The outputs as the C++ call takes them (run where the kernels are launched): none with
        a lazy conjugate/negative bit (``_written``), the 8-bit ones as bytes (``_bytes_view``),
        and the FP8 scales as ``_fp8_scales_for_kernel`` gives them. Returns (the mxfp8 values,
        the mxfp8 scales and the fp8 values, as bytes; fp8_scales)."""
        _written(residual_out=residual_out, layer_input=layer_input, mxfp8_values=values,
                 mxfp8_scales=scales, fp8_values=fp8_values, fp8_scales=fp8_scales)
        fp8_scales = _fp8_scales_for_kernel(fp8_scales, m, self.hidden_size)
        quantized = (_bytes_view(values, "mxfp8 values", "float8_e4m3fn"),
                     _bytes_view(scales, "mxfp8 scales", "float8_e8m0fnu"),
                     _bytes_view(fp8_values, "fp8 values", "float8_e4m3fn"))
        return quantized, fp8_scales

    def _launch_call(self, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor,
                     pre: Optional[Tensor], norm_weight: Optional[Tensor], eps: float, protocol: str,
                     residual_out: Tensor, layer_input: Optional[Tensor], values: Optional[Tensor],
                     scales: Optional[Tensor], fp8_values: Optional[Tensor] = None,
                     fp8_scales: Optional[Tensor] = None) -> None:
        m = self._rows("x", x)
        eps = _eps_arg("norm_eps", eps)
        quantized, fp8_scales = self._kernel_outputs(m, residual_out, layer_input, values, scales,
                                                     fp8_values, fp8_scales)
        ins = self._packed_epilogue(m, residual, post, comb, pre, norm_weight)
        self._op.call(_packed(x, (m, self.hidden_size)), *ins, eps, residual_out, layer_input,
                      *quantized, fp8_scales, _stream(self._device), protocol)

    def _launch_finalize(self, gemm2_permuted: Tensor, expert_weights: Tensor,
                         expanded_idx_to_permuted_idx: Tensor, shared_output: Tensor,
                         residual: Tensor, post: Tensor, comb: Tensor, pre: Optional[Tensor],
                         norm_weight: Optional[Tensor], eps: float, protocol: str,
                         residual_out: Tensor, layer_input: Optional[Tensor],
                         values: Optional[Tensor], scales: Optional[Tensor],
                         fp8_values: Optional[Tensor] = None,
                         fp8_scales: Optional[Tensor] = None) -> None:
        m, k, h = self._rows("shared_output", shared_output), self.top_k, self.hidden_size
        eps = _eps_arg("norm_eps", eps)
        quantized, fp8_scales = self._kernel_outputs(m, residual_out, layer_input, values, scales,
                                                     fp8_values, fp8_scales)
        ins = self._packed_epilogue(m, residual, post, comb, pre, norm_weight)
        self._op.finalize(_packed(gemm2_permuted, (None, h)),
                          _packed(_by_count(expert_weights, (m, k)), (m, k)),
                          _packed(_by_count(expanded_idx_to_permuted_idx, (m, k)), (m, k)),
                          _packed(shared_output, (m, h)), *ins, eps, residual_out, layer_input,
                          *quantized, fp8_scales, _stream(self._device), protocol)

    def __call__(self, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor,
                 pre: Optional[Tensor], norm_weight: Optional[Tensor], norm_eps: float,
                 mxfp8_out: OutputPair = None, protocol: str = "auto", *,
                 residual_out: Optional[Tensor] = None, layer_input: Optional[Tensor] = None,
                 fp8_out: OutputPair = None) -> Tuple[Tensor, Optional[Tensor]]:
        """Return (post-mixed residual streams, normalized layer input).

        Args:
            x: [M, H] BF16, this rank's partial sublayer output.
            residual: [M, hc, H] BF16 residual streams.
            post: FP32 post-mix, M * hc elements ([M, hc] or [M, hc, 1]).
            comb: FP32 residual mix, M * hc * hc elements ([M, hc, hc]), indexed [source, target].
            pre: FP32 carried pre-mix, M * hc elements ([M, hc]); None together with
                ``norm_weight`` (built with ``residual_only``): only the streams are written, the
                layer input is None.
            norm_weight: [H] BF16 RMSNorm weight.
            norm_eps: RMSNorm epsilon (a float >= 0).
            mxfp8_out: optional ([M, H] float8_e4m3fn or uint8 values, scales of
                ``mxfp8_scale_bytes(M, H)`` bytes, float8_e8m0fnu or uint8) that also receive
                the layer input as MXFP8 (built with ``quantize_layer_input``).
            protocol: "auto", or force "one-shot", "two-shot" or "nccl".
            residual_out: optional [M, hc, H] BF16 output of the streams (may be ``residual``
                itself: an in-place update).
            layer_input: optional [M, H] BF16 output of the layer input.
            fp8_out: optional (values, scales) that also receive the layer input as
                per-token-group FP8 (built with ``quantize_layer_input_fp8``; not with
                ``mxfp8_out``): values [M, H] float8_e4m3fn or uint8, E4M3(layer_input / s) of
                each group of 128 elements; scales float32, s = max(amax, 1e-10) / 448 (a power of
                two with ``fp8_ue8m0_scales``), either the MN-major [M, G] view with strides
                (1, Mp) over a buffer of Mp * G floats (``mhccl.empty_fp8_group_scales``; DeepGEMM's
                layout) or a contiguous tensor of Mp * G floats (``fp8_group_scales_view`` gives
                the view of it); G = H / 128, Mp = ``fp8_group_scale_rows(M)``, padding rows
                written 0 where the view is the whole of a storage of exactly Mp * G floats
                (as ``empty_fp8_group_scales`` allocates). Both 16-byte aligned. Any other view
                over at least its extent, (G - 1) * Mp + M floats, is accepted too (vLLM's
                ``tma_aligned_scales=True``, whose storage ends at its last element at M % 4 !=
                0, or a view into a workspace): the call writes that extent only, and the last
                column's padding rows, beyond it, keep what they held. Under torch.compile a
                backend that functionalizes the op without re-inplacing it (``aot_eager``)
                copies back only the view's M x G elements, so no padding row of the caller's
                buffer is written; Inductor re-inplaces it.

        Inputs of any strides or alignment are accepted (copied first when not contiguous and
        16-byte aligned), and mixes by element count, as the reference module does. Stricter than
        it, where it would read or write out of bounds or lose a result: dtypes, devices and the
        shapes of x, residual and norm_weight ([H] exactly) are checked; outputs must be
        contiguous and 16-byte aligned (the module's ``.flatten()`` of a non-contiguous output
        writes into a copy). Outputs may not overlap the inputs or each other, except
        ``residual_out`` being ``residual`` itself (an in-place update): an overlap is an
        InvalidArgumentError (the C++ check compares the byte ranges).

        Returns: (residual_out [M, hc, H] BF16, layer_input [M, H] BF16 or None): the given
        outputs, else new tensors.

        Raises:
            ArgumentTypeError: (a TypeError) an argument of the wrong Python type, named.
            InvalidArgumentError: (a ValueError) a shape, dtype, device or layout the op does not
                take (the op stays usable; nothing was launched). Every rank should make the
                same call: a call rejected on some ranks only is a DivergenceError at the others'
                next call.
            UnsupportedError: (a ValueError) a variant the op was not built with.
            PeerTimeoutError, DivergenceError: a peer died or hung, or the ranks' calls differ:
                the group is then unusable; rebuild the ops and their communicator
                (``mhccl.forget_communicator`` on every rank, then new ops).
            UnusableError: an earlier such error made the group unusable; rebuild.
            CudaError, NcclError: a CUDA or NCCL failure.
        """
        return _counting_rejections(self, self._call, x, residual, post, comb, pre, norm_weight,
                                    norm_eps, mxfp8_out, protocol, residual_out=residual_out,
                                    layer_input=layer_input, fp8_out=fp8_out)

    # The body of the public method above (which counts its rejections).
    def _call(self, x: Any, residual: Any, post: Any, comb: Any, pre: Any, norm_weight: Any,
              norm_eps: Any, mxfp8_out: Any = None, protocol: Any = "auto", *,
              residual_out: Any = None, layer_input: Any = None,
              fp8_out: Any = None) -> Tuple[Tensor, Optional[Tensor]]:
        x = _tensor_arg("x", x)
        m = self._rows("x", x)
        residual, post, comb, pre, norm_weight, eps = self._epilogue_inputs(
            m, residual, post, comb, pre, norm_weight, norm_eps)
        protocol = _str_arg("protocol", protocol)
        ops = _torch_ops()
        if residual_out is None and layer_input is None and mxfp8_out is None and fp8_out is None:
            _not_meta("x", x)
            if _compiling():  # here, not in the fake implementation: a rejection counted (_counting_rejections)
                _ops.same_device(x=x, residual=residual, post=post, comb=comb, pre=pre, norm_weight=norm_weight)
            outs = ops.all_reduce_mhc(self._handle, x, residual, post, comb, pre, norm_weight, eps,
                                      protocol, False, False)
            return outs[0], (outs[1] if pre is not None else None)
        res_out, li, values, scales, fp8_values, fp8_scales = self._outputs(
            m, residual, pre, residual_out, layer_input, mxfp8_out, fp8_out)
        _not_meta("x", x)
        if _compiling():  # as above
            _ops.same_device(x=x, residual=residual, post=post, comb=comb, pre=pre, norm_weight=norm_weight,
                             residual_out=res_out, layer_input=li, mxfp8_values=values, mxfp8_scales=scales,
                             fp8_values=fp8_values, fp8_scales=fp8_scales)
        ops.all_reduce_mhc_out(self._handle, x, residual, post, comb, pre, norm_weight, eps,
                               protocol, res_out, li, values, scales, fp8_values, fp8_scales)
        return res_out, li

    def finalize(self, gemm2_permuted: Tensor, expert_weights: Tensor,
                 expanded_idx_to_permuted_idx: Tensor, shared_output: Tensor, residual: Tensor,
                 post: Tensor, comb: Tensor, pre: Optional[Tensor], norm_weight: Optional[Tensor],
                 norm_eps: float, mxfp8_out: OutputPair = None, protocol: str = "auto", *,
                 residual_out: Optional[Tensor] = None, layer_input: Optional[Tensor] = None,
                 fp8_out: OutputPair = None) -> Tuple[Tensor, Optional[Tensor]]:
        """``__call__`` for a MoE output left unfinalized: this rank's x is
        ``bf16(sum over valid routes of weight * gemm2 row + shared_output)`` (the shared expert
        added last, one rounding).

        Args:
            gemm2_permuted: [rows, H] BF16 unweighted GEMM2 output in the MoE's permuted order.
            expert_weights: FP32 routing weights, already scaled, M * top_k elements ([M, top_k]).
            expanded_idx_to_permuted_idx: int32 row of each route, M * top_k elements
                ([M, top_k]), -1 for an expert this rank does not hold (any other index outside
                [0, rows) is skipped, never read, and reported by ``check_errors()``: the
                reference module would read out of bounds).
            shared_output: [M, H] BF16 TP-partial shared-expert output; M is its rows.
            residual, post, comb, pre, norm_weight, norm_eps, mxfp8_out, protocol, residual_out,
            layer_input, fp8_out: as ``__call__``.

        Returns and raises as ``__call__``.
        """
        return _counting_rejections(self, self._finalize, gemm2_permuted, expert_weights,
                                    expanded_idx_to_permuted_idx, shared_output, residual, post, comb, pre, norm_weight, norm_eps,
                                    mxfp8_out, protocol, residual_out=residual_out,
                                    layer_input=layer_input, fp8_out=fp8_out)

    # The body of the public method above (which counts its rejections).
    def _finalize(self, gemm2_permuted: Any, expert_weights: Any, expanded_idx_to_permuted_idx: Any,
                  shared_output: Any, residual: Any, post: Any, comb: Any, pre: Any,
                  norm_weight: Any, norm_eps: Any, mxfp8_out: Any = None, protocol: Any = "auto",
                  *, residual_out: Any = None, layer_input: Any = None,
                  fp8_out: Any = None) -> Tuple[Tensor, Optional[Tensor]]:
        gemm2_permuted = _tensor_arg("gemm2_permuted", gemm2_permuted)
        expert_weights = _tensor_arg("expert_weights", expert_weights)
        idx = _tensor_arg("expanded_idx_to_permuted_idx", expanded_idx_to_permuted_idx)
        shared_output = _tensor_arg("shared_output", shared_output)
        m = self._rows("shared_output", shared_output)
        _mix_count_error("expert_weights", expert_weights, (m, self.top_k))
        _mix_count_error("expanded_idx_to_permuted_idx", idx, (m, self.top_k))
        residual, post, comb, pre, norm_weight, eps = self._epilogue_inputs(
            m, residual, post, comb, pre, norm_weight, norm_eps)
        protocol = _str_arg("protocol", protocol)
        ops = _torch_ops()
        lead = dict(shared_output=shared_output, gemm2_permuted=gemm2_permuted, expert_weights=expert_weights,
                    expanded_idx_to_permuted_idx=idx)
        if residual_out is None and layer_input is None and mxfp8_out is None and fp8_out is None:
            _not_meta("shared_output", shared_output)
            if _compiling():  # as in _call
                _ops.same_device(**lead, residual=residual, post=post, comb=comb, pre=pre, norm_weight=norm_weight)
            outs = ops.all_reduce_mhc_finalize(self._handle, gemm2_permuted, expert_weights, idx,
                                               shared_output, residual, post, comb, pre,
                                               norm_weight, eps, protocol, False, False)
            return outs[0], (outs[1] if pre is not None else None)
        res_out, li, values, scales, fp8_values, fp8_scales = self._outputs(
            m, residual, pre, residual_out, layer_input, mxfp8_out, fp8_out)
        _not_meta("shared_output", shared_output)
        if _compiling():  # as in _call
            _ops.same_device(**lead, residual=residual, post=post, comb=comb, pre=pre, norm_weight=norm_weight,
                             residual_out=res_out, layer_input=li, mxfp8_values=values, mxfp8_scales=scales,
                             fp8_values=fp8_values, fp8_scales=fp8_scales)
        ops.all_reduce_mhc_finalize_out(self._handle, gemm2_permuted, expert_weights, idx,
                                        shared_output, residual, post, comb, pre, norm_weight,
                                        eps, protocol, res_out, li, values, scales, fp8_values,
                                        fp8_scales)
        return res_out, li

    def protocol_for(self, m: int, finalize: bool = False) -> str:
        """The protocol ("one-shot", "two-shot", "nccl") a call of ``m`` rows takes.

        Raises: ArgumentTypeError (``m`` not an int, ``finalize`` not a bool),
        InvalidArgumentError (``m`` outside [1, max_num_tokens], which no call takes).
        """
        return str(self._op.protocol_for(_int_arg("m", m, 1, self.capacity),
                                         _bool_arg("finalize", finalize)))

    def check_errors(self) -> None:
        """Raise what a kernel of this TP group recorded since the last check: PeerTimeoutError or
        DivergenceError (the group is then unusable until rebuilt; UnusableError after that) or
        InvalidRouteError (a finalize route skipped; the group stays usable). Under CUDA graphs,
        where a replayed call cannot raise, call it after replays (once per decode step)."""
        self._comm.check_errors()

    @property
    def mailbox_bytes(self) -> int:
        """Device memory of this instance's mailboxes and buffers on this rank, in bytes."""
        return int(self._op.mailbox_bytes)

    @property
    def wait_timeout_ms(self) -> int:
        """The communicator's budget of every wait on a peer in effect, in milliseconds (the
        constructor's ``wait_timeout_ms``, its default, or ``MHCCL_WAIT_TIMEOUT_MS`` where set)."""
        return int(self._comm.wait_timeout_ms)

    @property
    def watchdog(self) -> bool:
        """Whether the communicator's NCCL fallback watchdog thread is on."""
        return bool(self._comm.watchdog)

    @property
    def force_nccl_fallback(self) -> bool:
        """Whether the communicator was built with the NCCL fallback forced."""
        return bool(self._comm.force_nccl_fallback)


class LamportAllGather:
    """TP all-gather along dim 0 through Lamport mailboxes over NVLink peer mappings, for inputs
    of up to ``rank_capacity_bytes`` per rank (a positive multiple of 16).

    Construction is collective over ``group`` (None: the TP group chosen as ``AllReduceMHC``
    chooses it). ``accepts`` decides from the byte size alone, so every rank decides alike.
    Every byte arrives as sent, for every dtype (0x80000000 words, FP32 -0.0 and int32
    INT32_MIN among them).

    Args:
        rank_capacity_bytes: the most bytes of one rank's input, a positive multiple of 16.
        device, group: as ``AllReduceMHC``'s.
        wait_timeout_ms, watchdog, force_nccl_fallback: the communicator's options, as
            ``AllReduceMHC``'s: the budget of every wait on a peer in milliseconds ([1, 86400000];
            None, the default: 30000; ``MHCCL_WAIT_TIMEOUT_MS``, where set, wins over it), the NCCL
            fallback's watchdog (default True), the NCCL fallback forced (ncclAllGather; default
            False). An ``AllReduceMHC`` of the same group, device and options shares the
            communicator.

    Attributes:
        world_size: the TP group's size.
        wait_timeout_ms, watchdog, force_nccl_fallback: the communicator's options in effect.

    Raises: as ``AllReduceMHC``'s constructor.
    """

    def __init__(self, *, rank_capacity_bytes: int, device: Device,
                 group: Optional[ProcessGroup] = None,
                 wait_timeout_ms: Optional[int] = None, watchdog: bool = True,
                 force_nccl_fallback: bool = False) -> None:
        _, tp, _ = _group_layout(group)
        held: List[Error] = []  # as AllReduceMHC's: 0 is a capacity the C++ check refuses
        rank_capacity_bytes = _held_arg(
            tp, held, lambda: _int_arg("rank_capacity_bytes", rank_capacity_bytes), 0)
        options = _options_args(wait_timeout_ms, watchdog, force_nccl_fallback)
        lib = _lib()
        local_error = _config_error(tp, lambda: lib.check_all_gather_config(rank_capacity_bytes))
        self.rank_capacity_bytes = rank_capacity_bytes
        self._device = _device_index(device)

        def build() -> Tuple[Any, Any]:
            comm = _communicator(group, self._device, *options)
            return comm, lib.LamportAllGather(comm, rank_capacity_bytes)
        self._comm, self._op = _construct(build, held, local_error)
        self.world_size = self._comm.tp
        _ops.ensure_registered()
        self._handle = _ops.register_instance(self)

    def accepts(self, inp: Tensor) -> bool:
        """Whether ``inp`` fits: a dense tensor of a plain dtype, 1 to 16 dimensions, 16 to
        ``rank_capacity_bytes`` bytes, a multiple of 16 (what the call checks). False, not an
        error, for a sparse, nested or quantized tensor or torch's bits* dtypes, which the call
        refuses."""
        import torch

        if (isinstance(inp, torch.Tensor) and (inp.layout != torch.strided or inp.is_nested or inp.is_quantized
                                               or _is_opaque_dtype(inp.dtype))):
            return False
        inp = _tensor_arg("inp", inp)
        nbytes = inp.numel() * inp.element_size()
        return bool(1 <= inp.dim() <= 16 and 0 < nbytes <= self.rank_capacity_bytes
                    and nbytes % 16 == 0)

    def _check_size(self, inp: Tensor) -> None:
        """What ``accepts`` decides, as the C++ check says it, but before the output is allocated
        or ``inp`` copied (an expanded ``inp``, stride 0, may stand for far more bytes than it
        holds)."""
        if inp.dim() == 0:
            raise InvalidArgumentError("inp: expected at least one dimension, got a scalar")
        if inp.dim() > 16:
            raise InvalidArgumentError(f"inp: expected at most 16 dimensions, got {inp.dim()}")
        if not self.accepts(inp):
            raise InvalidArgumentError(
                f"inp: expected a multiple of 16 bytes, from 16 to "
                f"{self.rank_capacity_bytes} (rank_capacity_bytes), got "
                f"{inp.numel() * inp.element_size()} bytes: {list(inp.shape)} {inp.dtype}")

    def _launch(self, inp: Tensor, out: Tensor) -> None:
        """The C++ call; the torch ops check ``inp``'s size first (``_check_size``)."""
        _written(out=out)
        self._op.call(_packed(inp), out, _stream(self._device))

    def __call__(self, inp: Tensor) -> Tensor:
        """Every rank's ``inp`` concatenated along dim 0 in rank order, on the current stream
        (a non-contiguous or misaligned ``inp`` is copied first).

        Returns: a new tensor [world_size * inp.shape[0], *inp.shape[1:]] of inp's dtype.
        Raises: ArgumentTypeError (not a tensor), InvalidArgumentError (a size ``accepts``
        refuses, a scalar, a CPU tensor or another device), PeerTimeoutError / DivergenceError /
        UnusableError (as ``AllReduceMHC.__call__``), CudaError, NcclError.
        """
        return _counting_rejections(self, self._gather, inp)

    def check_errors(self) -> None:
        """As ``AllReduceMHC.check_errors``: raise what a kernel of this TP group recorded."""
        self._comm.check_errors()

    # The body of the public method above (which counts its rejections).
    def _gather(self, inp: Any) -> Tensor:
        inp = _tensor_arg("inp", inp)
        if inp.dim() == 0:
            raise InvalidArgumentError("inp: expected at least one dimension, got a scalar")
        if inp.dim() > 16:  # here too, not only in the fake implementation (as _call's devices)
            raise InvalidArgumentError(f"inp: expected at most 16 dimensions, got {inp.dim()}")
        _not_meta("inp", inp)
        out: Tensor = _torch_ops().all_gather(self._handle, inp)  # checks the size (real and fake)
        return out

    @property
    def mailbox_bytes(self) -> int:
        """Device memory of this instance's Lamport mailbox on this rank, in bytes."""
        return int(self._op.mailbox_bytes)

    @property
    def wait_timeout_ms(self) -> int:
        """The communicator's budget of every wait on a peer in effect, in milliseconds (the
        constructor's ``wait_timeout_ms``, its default, or ``MHCCL_WAIT_TIMEOUT_MS`` where set)."""
        return int(self._comm.wait_timeout_ms)

    @property
    def watchdog(self) -> bool:
        """Whether the communicator's NCCL fallback watchdog thread is on."""
        return bool(self._comm.watchdog)

    @property
    def force_nccl_fallback(self) -> bool:
        """Whether the communicator was built with the NCCL fallback forced."""
        return bool(self._comm.force_nccl_fallback)
