#!/usr/bin/env bash
# Builds what mhccl-bench needs (libmhccl and the bench: no tests, no GoogleTest, no Python
# extension) and runs the main job, mhccl-bench, over every local GPU (arguments pass through,
# e.g. --json results.json, --quick, --tp 2; --info prints the environment report).
# MHCCL_BUILD_TESTS=ON keeps the build tree's tests configured (scripts/test.sh sets it ON).
set -euo pipefail
cd "$(dirname "$0")/.."
MHCCL_BUILD_TESTS=${MHCCL_BUILD_TESTS:-OFF} scripts/build.sh mhccl-bench
# The commit mhccl-bench records in its JSON (none outside a git checkout).
MHCCL_COMMIT=${MHCCL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}
export MHCCL_COMMIT
exec "${BUILD_DIR:-build}/tools/bench/mhccl-bench" "$@"
