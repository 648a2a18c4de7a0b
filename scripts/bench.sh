#!/usr/bin/env bash
# Builds mhccl and runs the main job, mhccl-bench, over every local GPU (arguments pass through,
# e.g. --json results.json, --quick, --tp 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# The commit mhccl-bench records in its JSON (none outside a git checkout).
MHCCL_COMMIT=${MHCCL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}
export MHCCL_COMMIT
exec "${BUILD_DIR:-build}/tools/bench/mhccl-bench" "$@"
