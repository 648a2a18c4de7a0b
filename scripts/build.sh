#!/usr/bin/env bash
# Configures and builds mhccl into ${BUILD_DIR:-build}: everything configured (library, tools,
# tests, the Python extension where nanobind is found), or only the targets given as arguments
# (scripts/bench.sh: mhccl-bench).
#   CMAKE_CUDA_ARCHITECTURES (default 90), CMAKE_BUILD_TYPE (default Release), NCCL_ROOT (an
#   NCCL installation to prefer), MHCCL_EXTRA_INCLUDE_DIR (where header-only dependencies live,
#   if not in /usr/include), MHCCL_BUILD_TESTS (OFF: no tests, no GoogleTest needed),
#   MHCCL_BUILD_PYTHON (ON, OFF or AUTO, the default: where the Python found has nanobind) and
#   MHCCL_NVTX (OFF: no NVTX ranges) are passed to CMake; JOBS sets the build's parallelism.
# CMake's output goes to ${BUILD_DIR:-build}/configure.log; its mhccl lines (what was found, what
# is built and why) and any warning are printed, and the whole log when configuring fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release})
command -v ninja >/dev/null && [ ! -f "$build/Makefile" ] && args+=(-G Ninja)
[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
[ -n "${NCCL_ROOT:-}" ] && args+=(-DNCCL_ROOT="$NCCL_ROOT")
[ -n "${MHCCL_BUILD_TESTS:-}" ] && args+=(-DMHCCL_BUILD_TESTS="$MHCCL_BUILD_TESTS")
[ -n "${MHCCL_BUILD_PYTHON:-}" ] && args+=(-DMHCCL_BUILD_PYTHON="$MHCCL_BUILD_PYTHON")
[ -n "${MHCCL_NVTX:-}" ] && args+=(-DMHCCL_NVTX="$MHCCL_NVTX")
[ -n "${MHCCL_EXTRA_INCLUDE_DIR:-}" ] && args+=(-DMHCCL_EXTRA_INCLUDE_DIR="$(realpath "$MHCCL_EXTRA_INCLUDE_DIR")")
# Configured every time (a second or two once cached), so the variables above always apply.
mkdir -p "$build"
log="$build/configure.log"
if ! cmake "${args[@]}" > "$log" 2>&1; then
  cat "$log" >&2
  echo "build.sh: configuring failed (CMake's output above, and in $log)" >&2
  exit 1
fi
grep -E '^-- mhccl: ' "$log" || true
# Warnings, with the lines that explain them (a block ends at the next blank line after its text).
awk '/^CMake (Warning|Deprecation Warning)/ {w = 1} w {print} w && /^$/ && ++blank == 2 {w = 0; blank = 0}' "$log"
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" ${targets[@]+"${targets[@]}"}
