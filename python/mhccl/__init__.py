"""mhccl: fused tensor-parallel collectives for mHC models (DeepSeek V4.1 decode).

Lamport all-reduce fused with the mHC post-mix, the collapse with the carried pre-mix, RMSNorm and
an optional MXFP8 or per-token-group FP8 layer input (``AllReduceMHC``, also with the MoE finalize folded into its
publish), and a Lamport all-gather (``LamportAllGather``), over the NVLink GPUs of one node.
The interface is the one of the DSV4.1 engine modules these replace: change the import.

``import mhccl`` needs neither a GPU nor PyTorch; the ops need both (PyTorch tensors in and out,
CUDA devices, and ``torch.distributed`` for the collective construction). Where PyTorch can be
imported, ``import mhccl`` imports it and registers the torch ops (``torch.ops.mhccl.*``), so
that compiled code can name them before any op is built. The compiled extension is loaded when
first needed.

Every error is an ``mhccl.Error`` (a ``RuntimeError``) with the C++ code's name as ``.code``; its
subclasses say what happened and what to do (``InvalidArgumentError``, ``PeerTimeoutError``, ...).
"""

from . import _ops
from ._api import (AllReduceMHC, LamportAllGather, empty_fp8_group_scales, forget_communicator,
                   fp8_group_scale_bytes, fp8_group_scale_rows, fp8_group_scales_view, mxfp8_scale_bytes)
from ._errors import (ArgumentTypeError, CudaError, DivergenceError, Error, InvalidArgumentError,
                      InvalidRouteError, NcclError, NoDeviceError, PeerError, PeerTimeoutError,
                      UnsupportedError, UnusableError)

try:
    from ._version import __version__ as __version__  # written by the build from project()
except ImportError:  # the source tree, never built
    __version__ = "0+unknown"

__all__ = ["AllReduceMHC", "LamportAllGather", "empty_fp8_group_scales", "forget_communicator",
           "fp8_group_scale_bytes", "fp8_group_scale_rows", "fp8_group_scales_view", "mxfp8_scale_bytes",
           "Error", "InvalidArgumentError", "UnsupportedError", "ArgumentTypeError",
           "NoDeviceError", "CudaError", "NcclError", "PeerError", "PeerTimeoutError",
           "DivergenceError", "UnusableError", "InvalidRouteError"]

_ops.register_at_import()
