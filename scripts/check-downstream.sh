#!/usr/bin/env bash
# The installed C++ package as a user's project sees it: `cmake --install` of a build tree
# (${BUILD_DIR:-build}, built already), then tests/downstream configured with
# find_package(mhccl REQUIRED) against that prefix, built (with the README's C++ snippet,
# examples/cpp_snippet.cpp, which must be the README's text) and run (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The README's snippet is examples/cpp_snippet.cpp, to the character.
awk '/^## Using it from C\+\+/{s=1} s&&/^```c\+\+$/{c=1;next} c&&/^```$/{exit} c' README.md > "$work/readme_snippet.cpp"
if ! diff -u examples/cpp_snippet.cpp "$work/readme_snippet.cpp"; then
  echo "check-downstream: README.md's C++ snippet differs from examples/cpp_snippet.cpp (above)" >&2
  exit 1
fi

cmake --install "$build" --prefix "$work/prefix" > /dev/null
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S tests/downstream -B "$work/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
grep -E "Found (NCCL|CUDAToolkit|DLPack)" "$work/configure.log" | sed 's/^/  /'
cmake --build "$work/build" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/build/downstream"
echo "check-downstream: ok (find_package(mhccl) against cmake --install, the README snippet and the finalize and all-gather example compiled)"
