#!/usr/bin/env bash
# Builds mhccl with its tests and runs every test this machine can run, then says which suites
# ran and which were skipped, and why:
#   C++ CPU tests     tests/cpu (GoogleTest), also with an NVTX tool attached, and no iostream in
#                     libmhccl.so (tests/check_no_iostreams.cmake)
#   GPU tests         tests/gpu at TP=1 and, through mhccl-launch, TP=2, the dead-peer tests, and
#                     the Python package's GPU tests (skipped without a CUDA device, saying CUDA's reason)
#   Python CPU tests  python/tests/test_*cpu.py but the torch ones (need the Python extension:
#                     nanobind, which scripts/install-deps.sh installs), and python-mypy (mypy
#                     --strict over the built package and python/tests/typing_public_api.py)
#   torch tests       python/tests/test_torch_*cpu.py (need PyTorch: scripts/install-deps.sh --torch)
#   Tool tests        the tools: bench/ab_table.py and ab-trees.sh (need Python, bash, git), and
#                     mhccl-bench / mhccl-tune refusing bad options before they look for a GPU
# Arguments go to ctest (e.g. -R cpu). The summary is also written to ${BUILD_DIR:-build}/test-summary.txt.
# Exit code: ctest's (skipped suites do not fail it; the summary names them).
set -euo pipefail
cd "$(dirname "$0")/.."
MHCCL_BUILD_TESTS=ON scripts/build.sh
build=${BUILD_DIR:-build}
# Every test configured (before the run: `ctest -N` rewrites LastTest.log).
registered=$(ctest --test-dir "$build" -N | sed -n -E 's/^ *Test +#[0-9]+: (.*)$/\1/p')
out="$build/ctest-output.txt"
status=0
ctest --test-dir "$build" --output-on-failure "$@" 2>&1 | tee "$out" || status=${PIPESTATUS[0]}
log="$build/Testing/Temporary/LastTest.log"
python_status=$(sed -n 's/^MHCCL_PYTHON_STATUS:INTERNAL=//p' "$build/CMakeCache.txt")

# Test `$1`'s ctest verdict in this run (Passed, Skipped, Failed, Timeout, Not Run, ...), or "".
verdict() {
  sed -n -E "s/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: $1 \.+ *(\*\*\*)?([A-Za-z]+( Run)?).*/\2/p" "$out" | head -1
}
# Test `$1`'s output in this run.
output() {
  [ -f "$log" ] || return 0
  awk -v t="$1" '$0 ~ "^[0-9]+/[0-9]+ Test: " {f = (substr($0, index($0, ": ") + 2) == t)} f && /^<end of output>/ {f = 0} f' "$log"
}
# What ran in test `$1`: GoogleTest's or pytest's counts.
counts() {
  local o; o=$(output "$1")
  local g; g=$(sed -n -E 's/^\[  PASSED  \] ([0-9]+) tests?\..*/\1 passed/p' <<< "$o" | tail -1)
  local s; s=$(sed -n -E 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below:.*/, \1 skipped/p' <<< "$o" | tail -1)
  local p; p=$(grep -E '^[0-9]+ (passed|failed|skipped|errors?|deselected)' <<< "$o" | tail -1 | sed -E 's/ in [0-9.]+s.*//' || true)
  if [ -n "$g" ]; then echo "$g$s"; elif [ -n "$p" ]; then echo "$p"; fi
}
# Why test `$1` (or cases of it) skipped: pytest's most frequent reason (its "SKIPPED [n] file:
# line: why" lines, the largest n; how many other reasons there are, and where they are listed),
# else the first
# SKIPPED line of its output, without its prefix. GoogleTest prints a GTEST_SKIP's message on the
# line after "<file>:<line>: Skipped".
skip_reason() {
  local o; o=$(output "$1")
  local r; r=$(grep -E 'SKIPPED \[[0-9]+\] [^ ]+: ' <<< "$o" | sed -E 's/.*SKIPPED \[([0-9]+)\] [^ ]+: /\1\t/' |
    awk -F'\t' '{n[$2] += $1} END {for (w in n) {k++; if (n[w] > best) {best = n[w]; r = w}} if (k > 1) {o = k - 1; r = r " (and " o " other reason" (o > 1 ? "s" : "") ": " where ")"}; print r}' where="${log#"$PWD"/}" || true)
  [ -n "$r" ] || r=$(grep -m1 -E 'SKIPPED: ' <<< "$o" | sed -E 's/.*SKIPPED: //' || true)
  [ -n "$r" ] || r=$(grep -m1 -A1 -E ': Skipped$' <<< "$o" | sed -n 2p || true)
  echo "$r"
}

summary() {
  echo "test summary ($(date -u '+%Y-%m-%d %H:%M UTC'); ctest ${*:-(every test)}):"
  local suite pattern
  while IFS='|' read -r suite pattern; do
    local names; names=$(grep -E "$pattern" <<< "$registered" || true)
    if [ -z "$names" ]; then
      if [[ $suite == *Python* || $suite == torch* ]]; then
        echo "  $suite: skipped: the Python extension was not built: ${python_status#OFF: }"
      else
        echo "  $suite: skipped: not built"
      fi
      continue
    fi
    local lines="" ran=0 skipped=0 failed=0 unselected=0 reasons=""
    while read -r t; do
      local v; v=$(verdict "$t")
      local c; c=$(counts "$t")
      local why; why=$(skip_reason "$t")
      case "$v" in
        Passed) ran=$((ran + 1)); lines+="    $t: passed${c:+ ($c)}${why:+; skipped cases: $why}"$'\n' ;;
        Skipped) skipped=$((skipped + 1)); [ -n "$why" ] && reasons+="$why"$'\n'
                 lines+="    $t: skipped${why:+: $why}"$'\n' ;;
        "") unselected=$((unselected + 1)); lines+="    $t: not run (not selected by the ctest arguments)"$'\n' ;;
        *) failed=$((failed + 1)); lines+="    $t: FAILED ($v${c:+; $c})"$'\n' ;;
      esac
    done <<< "$names"
    # The suite's reason: the one most of its skipped tests give (the first of them on a tie).
    local first_reason=""
    [ -n "$reasons" ] && first_reason=$(awk 'NF {n[$0]++; if (!($0 in at)) at[$0] = NR}
      END {for (r in n) if (n[r] > best || (n[r] == best && at[r] < first)) {best = n[r]; first = at[r]; w = r}; print w}' <<< "$reasons")
    # Said once, on the suite's line: its tests that skipped for it say so in two words.
    # (Whole reasons only: the text up to the line's end, so that a longer reason it begins stays.)
    [ -n "$first_reason" ] && lines=${lines//": $first_reason"$'\n'/": as above"$'\n'}
    if ((failed)); then
      echo "  $suite: FAILED"
    elif ((ran && skipped)); then
      echo "  $suite: ran in part ($skipped of $((ran + skipped)) skipped${first_reason:+: $first_reason})"
    elif ((ran)); then
      echo "  $suite: ran"
    elif ((skipped)); then
      echo "  $suite: skipped${first_reason:+: $first_reason}"
    else
      echo "  $suite: not run (not selected by the ctest arguments)"
      continue
    fi
    printf "%s" "$lines"
  done <<'SUITES'
C++ CPU tests|^(cpu|library-without-iostreams)
GPU tests|^(gpu_|python_gpu$)
Python CPU tests|^(python_cpu|python-mypy|python-extension-without-iostreams)$
torch tests|^python_torch$
Tool tests|^(bench|tune)-
SUITES
}
echo
summary "$@" | tee "$build/test-summary.txt"
exit "$status"
