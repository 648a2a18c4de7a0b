#!/usr/bin/env bash
# Configures and builds mhccl (library, tests, mhccl-bench, mhccl-launch) into ${BUILD_DIR:-build}.
#   CMAKE_CUDA_ARCHITECTURES (default 90), NCCL_ROOT (an NCCL installation to prefer) and
#   MHCCL_EXTRA_INCLUDE_DIR (where header-only dependencies live, if not in /usr/include) are
#   passed through.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release})
command -v ninja >/dev/null && args+=(-G Ninja)
[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
[ -n "${NCCL_ROOT:-}" ] && args+=(-DNCCL_ROOT="$NCCL_ROOT")
[ -n "${MHCCL_EXTRA_INCLUDE_DIR:-}" ] && args+=(-DMHCCL_EXTRA_INCLUDE_DIR="$(realpath "$MHCCL_EXTRA_INCLUDE_DIR")")
if [ ! -f "$build/CMakeCache.txt" ] || [ CMakeLists.txt -nt "$build/CMakeCache.txt" ]; then
  cmake "${args[@]}" >/dev/null
fi
cmake --build "$build" -j "${JOBS:-$(nproc)}"
