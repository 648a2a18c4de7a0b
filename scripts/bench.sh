#!/usr/bin/env bash
# Builds what mhccl-bench needs (libmhccl and the bench: no tests, no GoogleTest, no Python
# extension) and runs the main job, mhccl-bench, over every local GPU (arguments pass through,
# e.g. --json results.json, --quick, --tp 2; --info prints the environment report).
# A fresh build tree is configured without tests; one configured already (scripts/test.sh
# configures it with tests) keeps its setting, so that the two commands do not reconfigure each
# other's tree. MHCCL_BUILD_TESTS=ON/OFF sets it either way.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${MHCCL_BUILD_TESTS:-} && ! -f ${BUILD_DIR:-build}/CMakeCache.txt ]]; then export MHCCL_BUILD_TESTS=OFF; fi
scripts/build.sh mhccl-bench
# The commit mhccl-bench records in its JSON (none outside a git checkout).
MHCCL_COMMIT=${MHCCL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}
export MHCCL_COMMIT
exec "${BUILD_DIR:-build}/tools/bench/mhccl-bench" "$@"
