#!/usr/bin/env bash
# Builds mhccl and runs the main job, mhccl-bench, over every local GPU (arguments pass through,
# e.g. --json results.json, --quick, --tp 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec "${BUILD_DIR:-build}/tools/bench/mhccl-bench" "$@"
