#!/usr/bin/env bash
# The built wheel on a GPU machine with a CUDA 13 PyTorch (its nvidia-nccl-cu13 and
# nvidia-cuda-runtime wheels installed), without a registry: installs the wheel beside torch
# (pip --no-deps --no-index), then
#   1. imports mhccl._mhccl alone and says which libnccl/libcudart its RUNPATH found;
#   2. in one process: torch.distributed (NCCL backend, TP=1) runs an all-reduce, then an mhccl
#      communicator and an AllReduceMHC call (checked loosely against PyTorch math); says every
#      libnccl mapped (/proc/self/maps): exactly one, torch's;
#   3. every Python test (CPU and GPU, TP=1; TP=2 where 2 GPUs) against the installed package.
#   scripts/check-wheel-gpu.sh .whl/mhccl-*.whl      (PYTHON: the interpreter with torch; OUT: logs)
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in -h|--help) sed -n '2,10p' "$0"; exit 0 ;; esac
[ -f "${1:-}" ] || { echo "check-wheel-gpu.sh: expected the path of a wheel, got '${1:-}'" >&2; exit 2; }
wheel=$(realpath "${1:?usage: check-wheel-gpu.sh WHEEL}")
py=${PYTHON:-python3}
OUT=${OUT:-/tmp/mhccl-wheel-gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
status=0
step() { echo "== $*"; }

step "install $(basename "$wheel") with $("$py" --version)"
"$py" -m pip install -q --no-deps --no-index --force-reinstall "$wheel" || exit 1
cd /tmp  # not the source tree: the installed package

step "1. mhccl._mhccl alone (no torch in the process)"
"$py" - <<'PY' || status=1
import os, sys
import mhccl, mhccl._mhccl
assert "torch" not in sys.modules
print("mhccl", mhccl.__version__, "at", os.path.dirname(mhccl.__file__))
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if len(l.split()) >= 6})
site = os.path.dirname(os.path.dirname(os.path.realpath(mhccl.__file__)))
for lib, where in (("libnccl.so", "nvidia/nccl/lib"), ("libcudart.so", "nvidia/cu13/lib")):
    paths = [p for p in maps if os.path.basename(p).startswith(lib)]
    print(" ", lib, paths)
    assert len(paths) == 1 and paths[0].startswith(os.path.join(site, where)), \
        f"{lib}: expected the wheel's in {os.path.join(site, where)} (is mhccl beside the nvidia wheels?)"
PY

step "2. torch.distributed (NCCL) and mhccl in one process"
"$py" - <<'PY' || status=1
import os, sys, tempfile
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
init = tempfile.mktemp()
dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1, device_id=dev)
t = torch.ones(8, device=dev)
dist.all_reduce(t)
torch.cuda.synchronize()
print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version())
import mhccl
M, H, hc = 4, 5120, 4
op = mhccl.AllReduceMHC(hidden_size=H, hc_mult=hc, max_num_tokens=16, top_k=6, device=dev)
g = torch.Generator(device="cpu").manual_seed(1)
bf = torch.bfloat16
x = torch.randn(M, H, generator=g).to(bf).to(dev)
res = torch.randn(M, hc, H, generator=g).to(bf).to(dev)
post = (2 * torch.sigmoid(torch.randn(M, hc, generator=g))).to(dev)
comb = torch.softmax(torch.randn(M, hc, hc, generator=g), -1).to(dev)
pre = (torch.sigmoid(torch.randn(M, hc, generator=g)) + 1e-6).to(dev)
w = (1 + 0.1 * torch.randn(H, generator=g)).to(bf).to(dev)
out, li = op(x, res, post, comb, pre, w, 1e-6)
torch.cuda.synchronize()
# The call's math in FP32 (SPEC.md; bf16 roundings at the same points): a loose check that the
# kernels ran (the bitwise checks are the GPU tests).
y = x.float()
ro = (post[..., None] * y[:, None, :] + torch.einsum("mst,msh->mth", comb, res.float())).to(bf)
p = torch.einsum("mt,mth->mh", pre, ro.float()).to(bf).float()
want = (p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(bf)
print("AllReduceMHC TP=1: residual_out max |diff|", (out.float() - ro.float()).abs().max().item(),
      "layer_input max |diff|", (li.float() - want.float()).abs().max().item())
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if len(l.split()) >= 6})
nccl = [p for p in maps if os.path.basename(p).startswith("libnccl.so")]
print("libnccl mapped:", nccl)
print("libcudart mapped:", [p for p in maps if os.path.basename(p).startswith("libcudart.so")])
print("torch's nvidia-nccl-cu13:", [p for p in sys.path if os.path.isdir(os.path.join(p, "nvidia/nccl/lib"))])
dist.destroy_process_group()
assert len(nccl) == 1, f"{len(nccl)} libnccl in the process: {nccl}"
close = dict(rtol=1 / 64, atol=1 / 64)  # a bf16 ulp or two apart at most
assert torch.allclose(out.float(), ro.float(), **close) and torch.allclose(li.float(), want.float(), **close)
print("one libnccl, shared: ok")
PY

step "3. Python tests against the installed package (every python/tests/test_*.py)"
for t in $(cd "$src/python/tests" && ls test_*.py | sed 's/\.py$//'); do
  timeout 500 "$py" -m pytest -p no:cacheprovider -q -rs "$src/python/tests/$t.py" > "$OUT/pytest-$t.log" 2>&1
  rc=$?; echo "pytest $t rc=$rc"; tail -6 "$OUT/pytest-$t.log"; ((rc == 0)) || status=1
done
echo "check-wheel-gpu: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
