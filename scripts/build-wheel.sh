#!/usr/bin/env bash
# Builds the Python wheel into ${WHEEL_DIR:-dist} (pip's isolated build: it fetches
# scikit-build-core, nanobind and the nvidia-nccl-cu13 wheel whose headers and library the wheel
# is built against; see pyproject.toml). Kernels for sm_90 and sm_100 by default;
# CMAKE_CUDA_ARCHITECTURES=90 builds sm_90 alone (development: 110 s instead of about 145 s with
# JOBS=2 on 2 cores). PYTHON picks the interpreter (3.12 or newer: one abi3 wheel for every
# CPython >= 3.12; older: a wheel for that version only). JOBS sets the build's parallelism.
# Where auditwheel is installed (install-deps.sh --wheel), the linux_x86_64 wheel is repaired to
# the manylinux tag its symbols allow, grafting nothing: libnccl.so.2 and libcudart.so.13 stay
# the nvidia wheels' (found through the RUNPATH), the point of linking them.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${WHEEL_DIR:-dist}
mkdir -p "$out"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
args=()
[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ] && args+=(-Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} "$py" -m pip wheel -q --no-deps -w "$raw" "${args[@]}" .
wheel=$(ls "$raw"/mhccl-*.whl)
aw=()
for p in "$py" python3; do
  if "$p" -m auditwheel --version > /dev/null 2>&1; then aw=("$p" -m auditwheel); break; fi
done
if ((${#aw[@]})); then
  "${aw[@]}" repair --exclude libnccl.so.2 --exclude libcudart.so.13 -w "$out" "$wheel"
else
  echo "build-wheel: no auditwheel (install-deps.sh --wheel): the wheel keeps the linux_x86_64 tag" >&2
  cp "$wheel" "$out/"
fi
ls -1 "$out"/mhccl-*.whl
