#!/usr/bin/env bash
# The header-only dependencies a GPU machine's build needs and cannot download (it reaches no
# package registry): CLI11, nlohmann-json and DLPack copied from this machine's /usr/include
# (scripts/install-deps.sh installs them) into .deps/include, which is ignored by git and so
# travels to the GPU machine only when named in the call's carried paths. Idempotent.
#   scripts/device-deps.sh      then carry .deps with the GPU machine's calls
set -euo pipefail
cd "$(dirname "$0")/.."
src=${MHCCL_DEPS_FROM:-/usr/include}
mkdir -p .deps/include
for d in CLI nlohmann dlpack; do
  if [[ ! -d $src/$d ]]; then
    echo "device-deps.sh: $src/$d missing: run scripts/install-deps.sh first" >&2
    exit 1
  fi
  rm -rf ".deps/include/$d"
  cp -r "$src/$d" .deps/include/
done
echo "device-deps.sh: .deps/include holds $(ls .deps/include | tr '\n' ' ')($(du -sh .deps/include | cut -f1))"
