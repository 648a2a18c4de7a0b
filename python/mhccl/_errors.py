"""mhccl's exceptions: one class per ``mhccl::ErrorCode`` a caller acts on (``mhccl/error.h``).

Every failure mhccl reports is an ``mhccl.Error``, a ``RuntimeError`` whose ``code`` is the C++
enumerator's name (``"kPeerTimeout"``) and whose ``peer``, ``call_index`` and ``op`` say, where
the C++ library knows them, which rank, which call of the protocol and which op (None where it
does not). The argument errors are also ``ValueError`` (``InvalidArgumentError``,
``UnsupportedError``) or ``TypeError`` (``ArgumentTypeError``), so that code written against
Python's own classes keeps working, and ``except mhccl.Error`` catches every one of them.

Every class pickles with its class, message and attributes (torch.multiprocessing and Ray pass
exceptions between processes that way).

Imports nothing of mhccl: the extension's exception translator (python/src/bindings.cpp)
imports this module, whatever state the package is in.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Type

__all__ = ["Error", "InvalidArgumentError", "UnsupportedError", "ArgumentTypeError",
           "NoDeviceError", "CudaError", "NcclError", "PeerError", "PeerTimeoutError",
           "DivergenceError", "UnusableError", "InvalidRouteError"]


class Error(RuntimeError):
    """Every error mhccl raises.

    Attributes:
        code: the C++ ``mhccl::ErrorCode`` enumerator's name, e.g. ``"kPeerTimeout"``
            (``"kInvalidArgument"`` for the Python layer's own argument errors).
        peer: the rank the error names (the rank waited for, or the rank that stopped the group),
            or None.
        call_index: this rank's index of the protocol call that saw it, or None.
        op: the op that saw it (e.g. ``"AllReduceMHC.call"``), or None.

    A subclass says what to do; this class itself is raised only for a code this version of the
    package has no class for (a newer extension than the package).
    """

    #: The code of instances built without one (each subclass names its own).
    default_code: str = "kUnknown"

    def __init__(self, message: str = "", *, code: Optional[str] = None, peer: Optional[int] = None,
                 call_index: Optional[int] = None, op: Optional[str] = None) -> None:
        super().__init__(message)
        self.code: str = code if code is not None else type(self).default_code
        self.peer: Optional[int] = peer
        self.call_index: Optional[int] = call_index
        self.op: Optional[str] = op

    @property
    def message(self) -> str:
        """The message alone (``str(error)``)."""
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...], Dict[str, Any]]:
        # The attributes travel as keyword arguments of the rebuild, not as instance state, so
        # that the class's __init__ runs on the other side (what a subclass sets there is set).
        return (_rebuild, (type(self), self.message, self.code, self.peer, self.call_index, self.op),
                dict(self.__dict__))

    def __repr__(self) -> str:
        extras = "".join(f", {k}={v!r}" for k, v in (("peer", self.peer), ("call_index", self.call_index),
                                                       ("op", self.op)) if v is not None)
        return f"{type(self).__name__}({self.message!r}, code={self.code!r}{extras})"


def _rebuild(cls: Type[Error], message: str, code: str, peer: Optional[int],
             call_index: Optional[int], op: Optional[str]) -> Error:
    return cls(message, code=code, peer=peer, call_index=call_index, op=op)


class InvalidArgumentError(Error, ValueError):
    """``kInvalidArgument``: an argument is wrong (a shape, dtype, device, alignment, overlap, M
    outside [1, max_num_tokens], a value out of range); the message names it, what was expected
    and what was given. Raised before anything is launched: the op stays usable.

    What to do: fix the call. Make the same call on every rank: a call rejected on some ranks only
    makes the others' next call a ``DivergenceError``.
    """

    default_code = "kInvalidArgument"


class UnsupportedError(Error, ValueError):
    """``kUnsupported``: valid in general, but not built or not supported here: a variant the op
    was not built with (``quantize_layer_input``, ``quantize_layer_input_fp8``,
    ``residual_only``), or hc, tp, H or top_k outside the limits. Nothing was launched.

    What to do: build the op with that variant, or keep the unfused path for that shape.
    """

    default_code = "kUnsupported"


class ArgumentTypeError(Error, TypeError):
    """An argument of the wrong Python type (raised by the Python layer, before the C++ library
    sees the call; ``code`` is ``"kInvalidArgument"``). The message names the argument and the type
    expected.

    What to do: pass the type the message names.
    """

    default_code = "kInvalidArgument"


class NoDeviceError(Error):
    """``kNoDevice``: no CUDA device (a CPU-only machine, ``CUDA_VISIBLE_DEVICES`` empty), or the
    driver cannot be used; the message carries CUDA's own reason. Also raised by the package when
    its compiled extension cannot be loaded here (no CUDA runtime or NCCL library, or built for
    another Python).

    What to do: check the driver and ``CUDA_VISIBLE_DEVICES``, and run ``python -m mhccl.info``;
    or take the unfused path on this machine.
    """

    default_code = "kNoDevice"


class CudaError(Error):
    """``kCuda``: a CUDA runtime call failed (an allocation that failed though the memory was free
    when checked, a launch that failed; an op whose buffers do not fit the free memory is refused
    before anything is allocated, as ``InvalidArgumentError``).

    What to do: a launch that failed after a call's first kernel went out leaves the communicator
    unusable: destroy the ops and the communicator and build them again. Report it with
    ``python -m mhccl.info``.
    """

    default_code = "kCuda"


class NcclError(Error):
    """``kNccl``: an NCCL call failed (communicator initialization, window registration), or the
    NCCL library loaded is older than the headers mhccl was built with, or of another major
    version.

    What to do: use an NCCL 2.x at least as new as the build's; ``NCCL_DEBUG=INFO`` says more.
    """

    default_code = "kNccl"


class PeerError(Error):
    """A peer of the TP group failed, or the ranks disagree: the base of ``PeerTimeoutError`` and
    ``DivergenceError``. After either, no kernel of any op of that communicator stores into a
    peer's memory again, and the communicator is unusable.

    What to do: destroy the ops and the communicator on every rank and build them again (or
    restart the workers). Destroying them waits for no peer.

    Never raised itself (``code`` names the subclass's code): catch it for both.
    """


class PeerTimeoutError(PeerError):
    """``kPeerTimeout``: a wait on a peer ran past its budget (``wait_timeout_ms``, 30 s by
    default; ``MHCCL_WAIT_TIMEOUT_MS``): the peer ``peer`` died, hung or never arrived, here or on
    a rank that then stopped the group. Host-side waits (construction, barriers, teardown, the
    NCCL fallback's watchdog) raise it too, naming the wait. The communicator is unusable.

    What to do: rebuild the communicator and its ops on every rank (or restart the workers). If
    the ranks are only slow (a first compile, a long prefill), raise the budget.
    """

    default_code = "kPeerTimeout"


class DivergenceError(PeerError):
    """``kDivergence``: the ranks made different calls at the same point (another M, ``__call__``
    against ``finalize``, another op or variant, a call rejected on some ranks only), found by
    the call identity every rank's contribution carries; ``peer`` is the rank whose contribution
    differed (or that stopped the group). The communicator is unusable.

    What to do: make every rank issue the same sequence of calls with the same M; rebuild the
    communicator and its ops.
    """

    default_code = "kDivergence"


class UnusableError(Error):
    """``kUnusable``: an earlier fatal error (a timeout, a divergence, a failed launch or
    construction) made this communicator unusable; every call and op construction on it raises
    this, with the first error's message.

    What to do: destroy the ops and the communicator and build them again.
    """

    default_code = "kUnusable"


class InvalidRouteError(Error):
    """``kInvalidRoute``: ``check_errors()`` reports a ``finalize`` route index outside
    [-1, rows of gemm2_permuted); that route was skipped, never read. The communicator stays
    usable.

    What to do: fix the MoE routing that produced it.
    """

    default_code = "kInvalidRoute"


#: The class of each C++ ErrorCode (its enumerator's name); tests check that every code the
#: extension reports (``mhccl._mhccl._error_codes()``) is here.
CLASS_OF_CODE: Dict[str, Type[Error]] = {
    "kInvalidArgument": InvalidArgumentError,
    "kUnsupported": UnsupportedError,
    "kNoDevice": NoDeviceError,
    "kCuda": CudaError,
    "kNccl": NcclError,
    "kPeerTimeout": PeerTimeoutError,
    "kDivergence": DivergenceError,
    "kUnusable": UnusableError,
    "kInvalidRoute": InvalidRouteError,
}


def from_cpp(code: str, message: str, peer: int = -1, call_index: int = -1, op: str = "") -> Error:
    """The exception for an ``mhccl::Error`` (the extension's translator calls this): its code's
    class (``Error`` for a code without one), -1 and "" (unknown) as None."""
    cls = CLASS_OF_CODE.get(code, Error)
    return cls(message, code=code, peer=None if peer < 0 else peer,
               call_index=None if call_index < 0 else call_index, op=op or None)
