"""What a bug report needs to say about this machine and mhccl: ``python -m mhccl.info``.

Prints the C++ library's environment report (``mhccl/info.h``: mhccl's version, the CUDA runtime
and driver, NCCL compiled against and loaded, the GPUs with compute capability and their P2P
matrix, the CUDA architectures of the build, the ``MHCCL_*`` and ``NCCL_*`` variables in effect),
then the Python side: the interpreter, the package and its extension, PyTorch's version and its
CUDA and NCCL versions when PyTorch can be imported, and the NCCL libraries the process has
loaded (one, where mhccl shares PyTorch's). Needs no GPU; exits 1 only when the extension cannot
be loaded (the report then says why).
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
from typing import List, Optional, Tuple


def _nccl_libraries() -> List[str]:
    """The libnccl files mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libnccl"))


def _torch_lines() -> List[str]:
    try:
        import torch
    except ImportError as e:
        return [f"PyTorch: not importable ({e})"]
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:  # a build without NCCL, or one that cannot load it
        nccl = f"unknown ({type(e).__name__}: {e})"
    return [f"PyTorch {torch.__version__} ({os.path.dirname(torch.__file__)}): CUDA {torch.version.cuda}, "
            f"NCCL {nccl}, torch.cuda.is_available(): {torch.cuda.is_available()}"]


def report() -> Tuple[str, bool]:
    """The report, and whether mhccl's extension could be loaded."""
    from . import __version__

    lines = []
    try:
        ext = importlib.import_module("mhccl._mhccl")
    except ImportError as e:  # not built for this Python, or no CUDA runtime / NCCL library here
        ext = None
        lines.append(f"mhccl's extension (mhccl._mhccl) could not be loaded: {e}")
    if ext is not None:
        lines.append(ext.environment_report().rstrip("\n"))
    lines.append(f"Python {platform.python_version()} ({sys.executable})")
    lines.append(f"mhccl package {__version__} ({os.path.dirname(os.path.abspath(__file__))})"
                 + (f", extension {ext.__file__}" if ext is not None else ""))
    lines += _torch_lines()
    libs = _nccl_libraries()
    lines.append("NCCL libraries loaded in this process: " + (", ".join(libs) if libs else "none")
                 + (" (more than one: mhccl and PyTorch do not share NCCL)" if len(libs) > 1 else ""))
    return "\n".join(lines) + "\n", ext is not None


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m mhccl.info", description=(__doc__ or "\n\n").split("\n\n")[1].replace("\n", " "),
                            epilog="Exit: 0 the report printed; 1 the extension could not be loaded (the report "
                                   "says why); 2 a bad command line.").parse_args(argv)
    text, loaded = report()
    sys.stdout.write(text)
    return 0 if loaded else 1


if __name__ == "__main__":
    sys.exit(main())
