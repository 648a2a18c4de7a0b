#!/usr/bin/env bash
# Configures and builds mhccl (library, tests, mhccl-bench, mhccl-launch) into ${BUILD_DIR:-build}.
#   CMAKE_CUDA_ARCHITECTURES (default 90), CMAKE_BUILD_TYPE (default Release), NCCL_ROOT (an
#   NCCL installation to prefer), MHCCL_EXTRA_INCLUDE_DIR (where header-only dependencies live,
#   if not in /usr/include) and MHCCL_BUILD_TESTS (OFF: no tests, no GoogleTest needed) are
#   passed to CMake; JOBS sets the build's parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release})
command -v ninja >/dev/null && args+=(-G Ninja)
[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
[ -n "${NCCL_ROOT:-}" ] && args+=(-DNCCL_ROOT="$NCCL_ROOT")
[ -n "${MHCCL_BUILD_TESTS:-}" ] && args+=(-DMHCCL_BUILD_TESTS="$MHCCL_BUILD_TESTS")
[ -n "${MHCCL_EXTRA_INCLUDE_DIR:-}" ] && args+=(-DMHCCL_EXTRA_INCLUDE_DIR="$(realpath "$MHCCL_EXTRA_INCLUDE_DIR")")
# Configured every time (a second or two once cached), so the variables above always apply.
cmake "${args[@]}" >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}"
