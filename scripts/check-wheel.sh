#!/usr/bin/env bash
# Checks a built wheel on a CPU-only machine (CI): the RUNPATH of each of its libraries stays
# inside the wheel and the nvidia-nccl-cu13 / nvidia-cuda-runtime wheels; installed with its
# dependencies into a fresh virtualenv, `import mhccl` works, the version is the metadata's,
# the stubs are there, the extension loads libnccl and libcudart from those wheels, and the
# Python CPU tests (python -m mhccl.info among them) pass against the installed package.
#   scripts/check-wheel.sh dist/mhccl-*.whl     (VENV: where the virtualenv goes)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in -h|--help) sed -n '2,7p' "$0"; exit 0 ;; esac
[ -f "${1:-}" ] || { echo "check-wheel.sh: expected the path of a wheel, got '${1:-}'" >&2; exit 2; }
wheel=$(realpath "${1:?usage: check-wheel.sh WHEEL}")
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "check-wheel: $(basename "$wheel")"
# 1. RUNPATH: $ORIGIN (the package) and the two nvidia wheels beside it, nothing else.
mkdir "$work/unzipped" && (cd "$work/unzipped" && "$py" -m zipfile -e "$wheel" .)
allowed='^\$ORIGIN(/\.\./nvidia/(nccl|cu13)/lib)?$'
status=0
while IFS= read -r so; do
  rel=${so#"$work/unzipped/"}
  runpath=$(readelf -d "$so" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  echo "  $rel: RUNPATH [$runpath], NEEDED $needed"
  IFS=: read -ra entries <<< "$runpath"
  for e in "${entries[@]}"; do
    [[ $e =~ $allowed ]] || { echo "check-wheel: $rel has RUNPATH entry '$e' outside the wheel and the nvidia wheels" >&2; status=1; }
  done
  if readelf -d "$so" | grep -q "(RPATH)"; then echo "check-wheel: $rel has a DT_RPATH (expected DT_RUNPATH)" >&2; status=1; fi
done < <(find "$work/unzipped" -name "*.so*" -type f)
for f in mhccl/py.typed mhccl/_mhccl.pyi mhccl/_version.py; do
  [ -f "$work/unzipped/$f" ] || { echo "check-wheel: $f missing from the wheel" >&2; status=1; }
done
((status == 0)) || exit 1

# 2. A fresh virtualenv with the wheel and its dependencies (nvidia-nccl-cu13, nvidia-cuda-runtime).
venv=${VENV:-$work/venv}
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel[test]"
cd "$work"  # not the source tree: `import mhccl` must find the installed package
"$venv/bin/python" - "$src" <<'PY'
import importlib.metadata, os, sys
import mhccl
src = os.path.realpath(sys.argv[1])
assert not os.path.realpath(mhccl.__file__).startswith(src), mhccl.__file__
assert mhccl.__version__ == importlib.metadata.version("mhccl"), (mhccl.__version__, importlib.metadata.version("mhccl"))
print(f"  import mhccl {mhccl.__version__} from {os.path.dirname(mhccl.__file__)}")
import mhccl._mhccl  # loads libmhccl, libnccl and libcudart (no GPU needed)
site = os.path.dirname(os.path.dirname(os.path.realpath(mhccl.__file__)))
maps = {line.split()[-1] for line in open("/proc/self/maps") if len(line.split()) >= 6}
for lib, where in (("libnccl.so", "nvidia/nccl/lib"), ("libcudart.so", "nvidia/cu13/lib")):
    paths = sorted(p for p in maps if os.path.basename(p).startswith(lib))
    print(f"  loaded {lib}: {paths}")
    assert len(paths) == 1 and paths[0].startswith(os.path.join(site, where)), (lib, paths)
PY
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$src/python/tests/test_cpu.py" "$src/python/tests/test_info_cpu.py"
echo "check-wheel: ok"
