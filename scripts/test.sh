#!/usr/bin/env bash
# Builds mhccl and runs every test: the CPU tests, then the GPU tests at TP=1 and (through
# mhccl-launch) TP=2. Without a GPU the GPU tests are skipped and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build=${BUILD_DIR:-build}
status=0
ctest --test-dir "$build" --output-on-failure "$@" || status=$?
# Say why each skipped test was skipped (ctest's summary only lists them).
log="$build/Testing/Temporary/LastTest.log"
if [ -f "$log" ] && grep -q "SKIPPED" "$log"; then
  echo "skip reasons:"
  grep -h -v "Regex" "$log" | grep -E -o "SKIPPED(: | \[[0-9]+\] ).*" | sort -u | sed 's/^/  /'
fi
exit $status
