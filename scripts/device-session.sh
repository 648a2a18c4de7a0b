#!/usr/bin/env bash
# A run on a GPU machine (one call of a few minutes): builds there, runs the GPU tests at
# TP=1 and TP=2 and mhccl-bench, and leaves every log under $OUT. Stages: build, tests, deadpeer,
# python, sanitize, profile, bench, ab, abtree, sweep, envsweep, agsweep, peers, example, tune (default:
# build tests bench). Extra bench arguments via BENCH_ARGS. Each step has its own timeout, in its
# own process group: a `timeout` around this script that ends first stops the script but not the
# step (GPU tests went on beside the next command, 2026-12-05), so give the call the stages' time.
# The script archives $OUT into $OUT/logs.tgz at its end: archive nothing there after it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mhccl-out}
mkdir -p "$OUT"
# NVLink multicast stays off on shared hosts (mhccl never uses it; NCCL must not either).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The commit mhccl-bench records in its JSON: the device's copy of the tree has no .git, so pass
# MHCCL_COMMIT=<sha> in the run's command.
export MHCCL_COMMIT=${MHCCL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
stages=${*:-build tests bench}
known=" build tests deadpeer python sanitize profile bench ab abtree sweep envsweep agsweep peers example tune "
for s in $stages; do
  if [[ "$known" != *" $s "* ]]; then
    echo "device-session.sh: unknown stage '$s'; stages:$known(default: build tests bench)" >&2; exit 2
  fi
done
B=${BUILD_DIR:-build-dev}
N=${NRANKS:-2}  # ranks of the GPU tests (1 on a one-GPU machine: the TP=2 cases skip)
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# Older trees (each e.g. `git archive <commit> | tar -x -C .ab-<commit>`), their mhccl-bench
# built into <tree>/build-old, all at once (once a call: a tree built already is kept).
build_trees() {
  stamp "build trees: $*"
  local gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
  for t in "$@"; do
    [[ -x $t/build-old/tools/bench/mhccl-bench ]] && continue
    (cmake -S "$t" -B "$t/build-old" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMHCCL_EXTRA_INCLUDE_DIR="$(pwd)/.deps/include" &&
       cmake --build "$t/build-old" -j 16 --target mhccl-bench) > "$OUT/build-${t//[\/.]/}.log" 2>&1 &
  done
  wait
  for t in "$@"; do
    [[ -x $t/build-old/tools/bench/mhccl-bench ]] || { echo "$t did not build"; grep -E "error" "$OUT/build-${t//[\/.]/}.log" | head -20; exit 1; }
  done
}

if [[ " $stages " == *" build "* ]]; then
  { nvidia-smi -L; nvidia-smi topo -m; nvcc --version | tail -1; ls -la /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>&1;
    python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__path__[0]))' 2>&1; cmake --version | head -1; } > "$OUT/env.txt" 2>&1
  stamp "build"
  if ! MHCCL_EXTRA_INCLUDE_DIR=.deps/include BUILD_DIR=$B JOBS=32 scripts/build.sh > "$OUT/build.log" 2>&1; then
    grep -E "error|Error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1
  fi
  grep -h "mhccl: NCCL" "$B/CMakeFiles/CMakeOutput.log" 2>/dev/null | head -1
  cmake -L -N "$B" 2>/dev/null | grep -E "^NCCL_(LIBRARY|INCLUDE_DIR)" 
fi
if [[ " $stages " == *" tests "* ]]; then
  stamp "cpu tests"
  # GTEST_FILTER selects GPU tests only (gtest reads the variable too: unset for the CPU suite).
  env -u GTEST_FILTER "$B/tests/mhccl_cpu_tests" --gtest_brief=1 > "$OUT/cpu.log" 2>&1; echo "cpu tests rc=$?"; tail -2 "$OUT/cpu.log"
  # First, the concurrent harness with no earlier test in its process (FRESH=0 skips it; it
  # ignores GTEST_FILTER): with CUDA's lazy loading its first scenarios once depended on kernels
  # an earlier test had loaded (DEVICE-RUNS.md, 2026-12-04, night).
  if [[ ${FRESH:-1} == 1 ]]; then
    stamp "gpu tests: the divergence suite at TP=2 alone in a fresh process"
    timeout 120 "$B/tests/gpu/mhccl_gpu_tests" --gtest_brief=1 \
      --gtest_filter='Tp/ConcurrentRanks.DivergentCallsGetAnErrorNeverAWrongValue/tp2' > "$OUT/gpu-fresh.log" 2>&1
    echo "gpu tests (fresh process) rc=$?"; grep -E "Failure|tp=2|FAILED|PASSED" "$OUT/gpu-fresh.log" | head -10
  fi
  stamp "gpu tests (TP=1 and TP=2 as $N ranks)"
  timeout 500 "$B/tools/mhccl-launch" -n $N --timeout 480 -- "$B/tests/gpu/mhccl_gpu_tests" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > "$OUT/gpu.log" 2>&1
  echo "gpu tests rc=$?"
  grep -E "^\[rank [01]\] (\[  (FAILED|PASSED) |.*Failure|.*error|.*Expected|.*Which is|.*differs|.* ranks differ|.*tests ran|stress TP|.*kinds of bad)" "$OUT/gpu.log" | head -60
  grep -E "^\[rank 0\] \[       OK \] .* \([0-9]{5,} ms\)" "$OUT/gpu.log" | head -12  # the slow ones
  # mhccl-bench's own checks (the FP8 baseline kernel among them): the A/B stages time with
  # --no-check, and a check the bench alone makes went unrun from 5a2bbe7 to 412366f (DEVICE-RUNS, 2026-12-01).
  stamp "mhccl-bench --check-only"
  timeout 200 "$B/tools/bench/mhccl-bench" --check-only > "$OUT/bench-check.log" 2>&1
  echo "bench checks rc=$?"; grep -E "FAIL|failed|error" "$OUT/bench-check.log" | head -20
fi
if [[ " $stages " == *" deadpeer "* ]]; then
  # Modes: the Lamport paths, the NCCL fallback eagerly and replayed as a CUDA graph (its watchdog),
  # and the fallback's teardown with the watchdog off.
  for mode in lamport fallback fallback-graph fallback-teardown; do
    stamp "dead peer ($mode): rank 1 SIGKILLs itself; rank 0 must report it and exit"
    timeout 200 "$B/tools/mhccl-launch" -n 2 --grace 60 --timeout 180 -- "$B/tests/gpu/mhccl_dead_peer_test" $mode > "$OUT/deadpeer-$mode.log" 2>&1
    echo "dead peer ($mode) launcher rc=$? (137: the dead rank's SIGKILL)"; grep -E "dead peer:|dying|mhccl-launch" "$OUT/deadpeer-$mode.log" | head -8
  done
fi
if [[ " $stages " == *" python "* ]]; then
  # The package as a user installs it (no registry there: no isolation, no dependency fetch),
  # beside PyTorch and its nvidia-nccl-cu13 / nvidia-cuda-runtime wheels, which the package's
  # RUNPATH ($ORIGIN/../nvidia/...) finds; its GPU tests (TP=1 in process, TP=2 spawned), and
  # the example under torchrun. (scripts/check-wheel-gpu.sh checks a wheel built elsewhere.)
  stamp "python: pip install ."
  CMAKE_ARGS="-DMHCCL_EXTRA_INCLUDE_DIR=$(pwd)/.deps/include -DCMAKE_CUDA_ARCHITECTURES=90" python3 -m pip install -q \
    --no-build-isolation --no-deps --force-reinstall . > "$OUT/pip.log" 2>&1
  echo "pip rc=$?"; tail -3 "$OUT/pip.log"
  pkg=$(cd /tmp && python3 -c 'import mhccl, os; print(os.path.dirname(mhccl.__file__))')
  # What the wheel's library carries of the C++ runtime itself (expected: nothing; it should
  # take std:: from libstdc++.so.6), and the environment's flags.
  { env | grep -E "FLAGS|^CC=|^CXX=|CUDAHOSTCXX" ; readelf -d $pkg/libmhccl.so | grep -E "NEEDED|RUNPATH";
    echo "std:: symbols defined in the wheel's libmhccl.so: $(nm -DC --defined-only $pkg/libmhccl.so | grep -cE 'std::(basic_ostream|locale|ios_base)')";
    echo "... in the build's libmhccl.so: $(nm -DC --defined-only $B/libmhccl.so | grep -cE 'std::(basic_ostream|locale|ios_base)')"; } > "$OUT/wheel-lib.txt" 2>&1
  tail -4 "$OUT/wheel-lib.txt"
  # The environment report as a user runs it (it lists this machine's GPUs), a native crash's
  # Python stack included.
  (cd /tmp && timeout 120 python3 -X faulthandler -m mhccl.info) > "$OUT/mhccl-info.txt" 2>&1
  echo "python -m mhccl.info rc=$?"; head -30 "$OUT/mhccl-info.txt"
  stamp "python: pytest"
  for t in $(cd python/tests && ls test_*.py | sed 's/\.py$//'); do
    timeout 400 python3 -m pytest -p no:cacheprovider -q -rs python/tests/$t.py > "$OUT/pytest-$t.log" 2>&1
    rc=$?; echo "pytest $t rc=$rc"; grep -vE "^\s+File|^\s*$" "$OUT/pytest-$t.log" | tail -12
    if [[ $rc -ge 128 ]]; then  # a crash: the native stack of it (cuda-gdb debugs host code too)
      timeout 200 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args \
        python3 -m pytest -p no:cacheprovider -q -x python/tests/$t.py > "$OUT/gdb-$t.log" 2>&1
      grep -E "^#[0-9]+ " "$OUT/gdb-$t.log" | head -25
    fi
  done
  if [[ $N -ge 2 ]]; then
    stamp "python: example"
    timeout 120 torchrun --nproc-per-node 2 examples/dsv41_decode_boundary.py \
      --tokens 16 > "$OUT/example.log" 2>&1
    echo "example rc=$?"; tail -6 "$OUT/example.log"
  fi
fi
if [[ " $stages " == *" sanitize "* ]]; then
  # compute-sanitizer on the GPU tests (Firecracker machines only): memcheck, racecheck and
  # synccheck (SAN_TOOLS) at TP=1 and TP=2 (SAN_TPS); filters SAN_FILTER (memcheck) and RS_FILTER.
  # Each pattern gets tpN appended, so it selects the names that end so: the plain instance
  # (.../tp1), not .../tp1_fp8 (call compute-sanitizer directly for those, as DEVICE-RUNS' 2026-12-01 run at 2c129f5 did).
  # API errors are not reported: NCCL's init probes kernels with cudaFuncGetAttributes and gets
  # cudaErrorNoKernelImageForDevice for images it does not carry (handled inside NCCL).
  SAN_FILTER=${SAN_FILTER:-*Dsv41EveryVariantEveryM*:*ProtocolsGiveIdenticalBits*:*InvalidRoute*:*StreamingConsumerEqualsRowPerCta*:*AllGather.SizesAgainstReference*:*AllGather.StridedAndMisaligned*}
  san() {  # tool tp filter
    local log="$OUT/sanitize-$1-tp$2.log"
    local cmd=(compute-sanitizer --tool "$1" --report-api-errors no --error-exitcode 9 --print-limit 20 "$B/tests/gpu/mhccl_gpu_tests" --gtest_brief=1 "--gtest_filter=$3")
    stamp "compute-sanitizer --tool $1 at TP=$2"
    if [[ $2 == 1 ]]; then MHCCL_WAIT_TIMEOUT_MS=120000 timeout ${SAN_TIMEOUT:-200} "${cmd[@]}" > "$log" 2>&1
    else MHCCL_WAIT_TIMEOUT_MS=120000 timeout ${SAN_TIMEOUT:-200} "$B/tools/mhccl-launch" -n $2 --timeout $(( ${SAN_TIMEOUT:-200} - 10 )) -- "${cmd[@]}" > "$log" 2>&1; fi
    echo "sanitize $1 tp$2 rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$log" | sort | uniq -c | head -8
  }
  if [[ " ${SAN_TOOLS:-memcheck racecheck synccheck} " == *" memcheck "* ]]; then
    for tp in ${SAN_TPS:-$(seq 1 $N)}; do san memcheck $tp "$(echo "$SAN_FILTER" | sed "s/\([^:]*\)/\1tp$tp/g")"; done
    # TP = 2, 4 and 8 simulated on one GPU (the phased path only: its kernels wait for no kernel
    # beside them): out-of-bounds accesses of the rank-dependent indexing at every tp.
    stamp "compute-sanitizer --tool memcheck: simulated ranks (phased)"
    MHCCL_SIM_PHASED_ONLY=1 timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool memcheck --report-api-errors no \
      --error-exitcode 9 --print-limit 20 "$B/tests/gpu/mhccl_gpu_tests" --gtest_brief=1 \
      --gtest_filter='*SimulatedRanks.EveryProtocolPathAgainstReference*' > "$OUT/sanitize-memcheck-simulated.log" 2>&1
    echo "sanitize memcheck simulated rc=$?"; grep -E "ERROR SUMMARY|tests ran|PASSED|FAILED|simulated TP" "$OUT/sanitize-memcheck-simulated.log" | head -8
  fi
  RS_FILTER=${RS_FILTER:-*Dsv41EveryVariantEveryM*:*StreamingConsumerEqualsRowPerCta*:*ProtocolsGiveIdenticalBits*:*AllGather.SizesAgainstReference*}
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    [[ $tool == memcheck ]] && continue
    for tp in ${SAN_TPS:-$(seq 1 $N)}; do san $tool $tp "$(echo "$RS_FILTER" | sed "s/\([^:]*\)/\1tp$tp/g")"; done
  done
fi
if [[ " $stages " == *" profile "* ]]; then
  # PROFILE_KERNEL (a regex, default mhc_consumer_kernel): the kernel whose launches are
  # profiled (PROFILE_SKIP of them skipped first, then PROFILE_COUNT), in the test PROFILE_FILTER,
  # or in mhccl-bench with PROFILE_BENCH_ARGS where that is set (e.g. PROFILE_KERNEL=owner_reduce_kernel
  # PROFILE_BENCH_ARGS="--tp 1 --ops twoshot --no-check --quick": the two-shot's owners at the
  # bench's first M). PROFILE_TREES: older trees (as AB_TREES; built as the abtree stage builds
  # them) whose mhccl-bench is profiled the same way after this build's. PROFILE_SECTIONS: ncu's
  # sections (default: speed of light, warp states, launch, instructions, scheduler, memory);
  # PROFILE_METRICS: metrics besides them (a comma list). PROFILE_SOURCE=1: also the warp
  # stall sampling of every SASS instruction (ncu's SourceCounters section, sampling every 32
  # cycles; the report kept as ncu-TAG.ncu-rep and its source page as ncu-src-TAG.csv), to see
  # which instructions a few hundred nanoseconds of difference between two builds wait at.
  # ncu runs kernels one at a time: what PDL overlaps is not measured, each kernel's own stalls are.
  # PROFILE_NAME_BASE=demangled: PROFILE_KERNEL is matched against the demangled name with its
  # template arguments, to pick one instantiation, e.g. the direct call's streaming consumer at
  # hc = 4, plain: PROFILE_KERNEL='streaming_kernel<.int.4, [^,]*Input.1, [^,]*Variant.0,'
  # (with PROFILE_BENCH_ARGS="--tp 1 --ops allreduce --rows 1024 --no-check --calls-per-graph 1 --repeats 1").
  pk=${PROFILE_KERNEL:-mhc_consumer_kernel}
  sections=()
  for sec in ${PROFILE_SECTIONS:-SpeedOfLight WarpStateStats LaunchStats InstructionStats SchedulerStats MemoryWorkloadAnalysis}; do
    sections+=(--section "$sec")
  done
  [[ -n ${PROFILE_METRICS:-} ]] && sections+=(--metrics "$PROFILE_METRICS")  # e.g. sm__cycles_active.min,sm__cycles_active.max
  [[ ${PROFILE_SOURCE:-0} == 1 ]] && sections+=(--section SourceCounters --section WarpStateStats --warp-sampling-interval 0)
  ptrees=(${PROFILE_TREES:-})
  [[ ${#ptrees[@]} -gt 0 ]] && build_trees "${ptrees[@]}"
  for which in new "${ptrees[@]}"; do
    tag=${which//[\/.]/}; bdir=$B; [[ $which != new ]] && bdir=$which/build-old
    target=("$bdir/tests/gpu/mhccl_gpu_tests" --gtest_filter="${PROFILE_FILTER:-Tp/AllReduceMHCTest.PdlOnOffBitwiseEqual/tp1}")
    [[ -n ${PROFILE_BENCH_ARGS:-} ]] && target=("$bdir/tools/bench/mhccl-bench" $PROFILE_BENCH_ARGS)
    stamp "ncu ($which): $pk in ${target[*]:1}"
    # With PROFILE_SOURCE the report is exported (ncu then prints no results) and read back.
    rep=(); [[ ${PROFILE_SOURCE:-0} == 1 ]] && rep=(--export "$OUT/ncu-$tag" --force-overwrite)
    timeout ${PROFILE_TIMEOUT:-240} ncu --clock-control none --kernel-name-base ${PROFILE_NAME_BASE:-function} \
      -k "regex:$pk" --launch-skip ${PROFILE_SKIP:-0} \
      --launch-count ${PROFILE_COUNT:-2} "${sections[@]}" "${rep[@]}" "${target[@]}" > "$OUT/ncu-$tag.txt" 2>&1
    echo "ncu ($which) rc=$?"
    if [[ ${PROFILE_SOURCE:-0} == 1 ]]; then
      timeout 120 ncu --import "$OUT/ncu-$tag.ncu-rep" --page details >> "$OUT/ncu-$tag.txt" 2>&1
      timeout 120 ncu --import "$OUT/ncu-$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu-src-$tag.csv" 2>&1
      echo "ncu source page ($which) rc=$? ($(wc -l < "$OUT/ncu-src-$tag.csv") lines)"
    fi
    grep -E "$pk|Context [0-9]+, Stream|Duration|Executed Instructions  |Warp Cycles Per Issued|Grid Size|Block Size|DRAM Throughput|Registers Per${PROFILE_METRICS:+|${PROFILE_METRICS//,/|}}" \
      "$OUT/ncu-$tag.txt" | head -${PROFILE_LINES:-80}
  done
fi
if [[ " $stages " == *" bench "* ]]; then
  stamp "mhccl-bench ${BENCH_ARGS:-}"
  timeout 400 "$B/tools/bench/mhccl-bench" --json "$OUT/bench.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  grep -E "FAIL|failed|error" "$OUT/bench.log" | head -20
  grep -E "^  (call|finalize) +plain +(1|8|64|128) |all checks|FAILED" "$OUT/bench.log" | head -30
fi
if [[ " $stages " == *" ab "* ]]; then
  # A/B of the AllReduceMHC kernels at TP=2 in one run, alternated (new, old, AB_ROUNDS times):
  # "new" is the build's default; "old" sets the variables in AB_OLD_ENV (e.g.
  # AB_OLD_ENV="MHCCL_STREAMING_MIN_ROWS=0"; empty: the same build twice, a noise check).
  for i in $(seq ${AB_ROUNDS:-1}); do
    for which in new old; do
      stamp "ab: $which ($i)"
      envs=(); [[ $which == old ]] && envs=(${AB_OLD_ENV:-})
      env "${envs[@]}" timeout ${AB_TIMEOUT:-120} "$B/tools/bench/mhccl-bench" --tp 2 --ops ${AB_OPS:-allreduce,twoshot} --no-check \
        --json "$OUT/ab-$which-$i.json" > "$OUT/ab-$which-$i.log" 2>&1
      echo "bench rc=$?"
      grep -E "^  (call|finalize) +(plain|mxfp8) +(1|8|64|128) one|^  (call|finalize) +(128|256|1024|4096|8192) " "$OUT/ab-$which-$i.log" | awk -v w="$which$i" '{print w, $0}'
    done
  done
fi
if [[ " $stages " == *" abtree "* ]]; then
  # A/B of builds in one run, alternated: this tree's build ($B) against older trees carried
  # in AB_TREES (default .ab-old; made by scripts/ab-trees.sh NAME=REV, untracked and copied to
  # the GPU machine with the tree), each built (mhccl-bench only, all at once) into its
  # build-old. AB_ARGS: the bench's arguments (default: TP=1, the all-reduce ops, no checks).
  # Then bench/ab_table.py's table of every round (abtree-table.md, differences to AB_BASE: a
  # build's name, default this tree's), its rows at AB_TABLE_M (default 1,8,64) printed.
  trees=(${AB_TREES:-.ab-old})
  build_trees "${trees[@]}"
  for i in $(seq ${AB_ROUNDS:-2}); do
    for which in new "${trees[@]}"; do
      bin="$B/tools/bench/mhccl-bench"; [[ $which != new ]] && bin="$which/build-old/tools/bench/mhccl-bench"
      tag=${which//[\/.]/}
      # The commit each build's JSON records: a tree's own (.ab-<commit>: its name), not this one's.
      commit=$MHCCL_COMMIT; [[ $which != new ]] && commit=${tag#ab-}
      stamp "abtree: $which ($i)"
      MHCCL_COMMIT=$commit timeout ${AB_TIMEOUT:-150} "$bin" ${AB_ARGS:---tp 1 --ops allreduce,twoshot --no-check} \
        --json "$OUT/abtree-$tag-$i.json" > "$OUT/abtree-$tag-$i.log" 2>&1
      echo "bench rc=$?"
      grep -E "^  (call|finalize) +(plain|mxfp8|residual_only) +(1|8|64|128|1024|4096) " "$OUT/abtree-$tag-$i.log" | awk -v w="$tag$i" '{print w, $0}' | head -${AB_LINES:-40}
    done
  done
  python3 bench/ab_table.py --base "${AB_BASE:-$MHCCL_COMMIT}" "$OUT"/abtree-*-[0-9]*.json > "$OUT/abtree-table.md" 2>&1
  echo "ab_table rc=$?"
  python3 bench/ab_table.py --base "${AB_BASE:-$MHCCL_COMMIT}" --m "${AB_TABLE_M:-1,8,64}" "$OUT"/abtree-*-[0-9]*.json 2>&1 | head -60
fi
if [[ " $stages " == *" sweep "* ]]; then
  # Tiling experiment: CTAs per row forced for every M (MHCCL_CTAS_PER_ROW), all-reduce only.
  for cl in ${SWEEP_CTAS:-1 2 4 5}; do
    stamp "sweep: MHCCL_CTAS_PER_ROW=$cl"
    MHCCL_CTAS_PER_ROW=$cl timeout 120 "$B/tools/bench/mhccl-bench" --tp 2 1 --ops allreduce --quick --no-check \
      --json "$OUT/sweep-cl$cl.json" > "$OUT/sweep-cl$cl.log" 2>&1
    grep -E "^  call +plain " "$OUT/sweep-cl$cl.log" | awk -v cl=$cl '{print "cl=" cl, $0}' | head -12
  done
fi
if [[ " $stages " == *" envsweep "* ]]; then
  # Launch-shape experiments of the large-M table (one-shot vs two-shot vs NCCL + consumer):
  # SWEEP_ENVS holds settings separated by spaces, each a comma list of VAR=value
  # (e.g. "MHCCL_STREAM_PUBLISHERS=8 MHCCL_STREAM_PUBLISHERS=32,MHCCL_STREAM_REDUCERS=8"); SWEEP_TP
  # the group size (default 2; 1: the TP=1 self-test table, through the own mailbox).
  for set in ${SWEEP_ENVS:-none}; do
    stamp "envsweep: $set"
    envs=(); [[ $set != none ]] && IFS=, read -ra envs <<< "$set"
    env "${envs[@]}" timeout ${SWEEP_TIMEOUT:-120} "$B/tools/bench/mhccl-bench" --tp ${SWEEP_TP:-2} --ops twoshot --no-check \
      --json "$OUT/envsweep-${set//[,=]/_}.json" > "$OUT/envsweep-${set//[,=]/_}.log" 2>&1
    echo "bench rc=$?"; grep -E "M=(128|256|1024|4096|8192) " "$OUT/envsweep-${set//[,=]/_}.log" | awk -v s="$set" '{print s, $0}'
  done
fi
if [[ " $stages " == *" agsweep "* ]]; then
  # All-gather launch shape: packs a CTA takes at least (MHCCL_ALLGATHER_PACKS_PER_CTA), with
  # the bench's checks on, and the all-gather GPU tests at each value.
  for per in ${SWEEP_PACKS:-256 64 32 16}; do
    stamp "agsweep: MHCCL_ALLGATHER_PACKS_PER_CTA=$per"
    MHCCL_ALLGATHER_PACKS_PER_CTA=$per timeout 120 "$B/tools/bench/mhccl-bench" --tp 2 --ops allgather \
      --json "$OUT/agsweep-$per.json" > "$OUT/agsweep-$per.log" 2>&1
    echo "bench rc=$?"; grep -E "FAIL|B/rank +mhccl" "$OUT/agsweep-$per.log" | awk -v p=$per '{print "per=" p, $0}'
    MHCCL_ALLGATHER_PACKS_PER_CTA=$per timeout 120 "$B/tools/mhccl-launch" -n 2 --timeout 110 -- \
      "$B/tests/gpu/mhccl_gpu_tests" --gtest_brief=1 --gtest_filter='*AllGather*' > "$OUT/agsweep-tests-$per.log" 2>&1
    echo "all-gather tests rc=$?"; grep -E "PASSED|FAILED" "$OUT/agsweep-tests-$per.log" | head -4
  done
fi
if [[ " $stages " == *" peers "* ]]; then
  # bench/peers.py: the fused boundary (AllReduceMHC call and finalize, plain, mxfp8 and fp8)
  # against what a PyTorch user runs instead (eager and torch.compile; at TP=2 also NCCL and
  # symmetric-memory one-shot all-reduce + the compiled epilogue, FlashInfer where it imports;
  # fp8 also against mhccl plain + a torch.compile'd per-token-group quantization), each checked
  # first (--check), then timed; JSON rows and a PNG plot per TP. PEERS_ARGS: more arguments
  # (e.g. "--tokens 1,64,1024,4096 --eager-roundings", "--variants plain,fp8"). The timeouts
  # leave room for the fp8 rows' compiles (not yet measured).
  if ! (cd /tmp && python3 -c "import mhccl") 2>/dev/null; then  # the python stage installs it
    stamp "peers: pip install ."
    CMAKE_ARGS="-DMHCCL_EXTRA_INCLUDE_DIR=$(pwd)/.deps/include -DCMAKE_CUDA_ARCHITECTURES=90" python3 -m pip install -q \
      --no-build-isolation --no-deps --force-reinstall . > "$OUT/pip-peers.log" 2>&1
    echo "pip rc=$?"; tail -3 "$OUT/pip-peers.log"
  fi
  stamp "peers: TP=1"
  PYTHONUNBUFFERED=1 timeout 480 python3 bench/peers.py --check \
    --json "$OUT/peers-tp1.json" --plot "$OUT/peers-tp1.png" ${PEERS_ARGS:-} > "$OUT/peers-tp1.log" 2>&1
  echo "peers tp1 rc=$?"; grep -E "FAIL|DIFFER|skipped|failed|Error" "$OUT/peers-tp1.log" | head -20
  sed -n '/^TP=1, H=/,$p' "$OUT/peers-tp1.log" | head -70
  if [[ $N -ge 2 ]]; then
    stamp "peers: TP=2 (torchrun)"
    PYTHONUNBUFFERED=1 timeout 540 torchrun --nproc-per-node 2 bench/peers.py --check \
      --json "$OUT/peers-tp2.json" --plot "$OUT/peers-tp2.png" ${PEERS_ARGS:-} > "$OUT/peers-tp2.log" 2>&1
    echo "peers tp2 rc=$?"; grep -E "FAIL|DIFFER|skipped|failed|Error" "$OUT/peers-tp2.log" | head -20
    sed -n '/^TP=2, H=/,$p' "$OUT/peers-tp2.log" | head -70
  fi
fi
if [[ " $stages " == *" example "* ]]; then
  # examples/dsv41_decode_step.py: L DSV4.1 decoder layers (stand-in attention and MoE GEMMs of
  # the real hidden size) with mhccl at every boundary against the unfused model, both compiled
  # and replayed as CUDA graphs: agreement after L layers and the decode-step time at M = 1, 8,
  # 64, 256. EXAMPLE_ARGS: more arguments (e.g. "--layers 8").
  if ! (cd /tmp && python3 -c "import mhccl") 2>/dev/null; then  # the python stage installs it
    stamp "example: pip install ."
    CMAKE_ARGS="-DMHCCL_EXTRA_INCLUDE_DIR=$(pwd)/.deps/include -DCMAKE_CUDA_ARCHITECTURES=90" python3 -m pip install -q \
      --no-build-isolation --no-deps --force-reinstall . > "$OUT/pip-example.log" 2>&1
    echo "pip rc=$?"; tail -3 "$OUT/pip-example.log"
  fi
  stamp "example: decode step, TP=1"
  PYTHONUNBUFFERED=1 timeout 300 python3 examples/dsv41_decode_step.py \
    --json "$OUT/example-tp1.json" ${EXAMPLE_ARGS:-} > "$OUT/example-tp1.log" 2>&1
  echo "example tp1 rc=$?"; grep -vE "^\s+File|^\s*$|^W[0-9]{4} " "$OUT/example-tp1.log" | tail -22
  if [[ $N -ge 2 ]]; then
    stamp "example: decode step, TP=2 (torchrun)"
    PYTHONUNBUFFERED=1 timeout 360 torchrun --nproc-per-node 2 examples/dsv41_decode_step.py \
      --json "$OUT/example-tp2.json" ${EXAMPLE_ARGS:-} > "$OUT/example-tp2.log" 2>&1
    echo "example tp2 rc=$?"; grep -vE "^\s+File|^\s*$|^W[0-9]{4} " "$OUT/example-tp2.log" | tail -22
  fi
fi
if [[ " $stages " == *" tune "* ]]; then
  # mhccl-tune at TP=1 through the own mailbox (H=5120, hc=4, every variant; TUNE_ARGS: more
  # arguments, e.g. "--quick" or "--variants plain --max-m 1024"), timed: its wall time, the
  # table ($OUT/tuning-tp1.json, outside the archive), the summary's verdicts (the tuned choice
  # against the defaults at every swept M, measured again on the ops a user builds) and the rows
  # where the path changed or a measured row is slower. Then the self-test with the table, the
  # self-test with a path broken on purpose (MHCCL_TEST_BREAK_PATH, test only: must exit 1), and
  # the tuning GPU tests in a process of their own (they run mhccl-tune themselves).
  stamp "tune: mhccl-tune --tp 1 --hidden 5120 --hc 4 ${TUNE_ARGS:-}"
  t=$(date +%s)
  timeout ${TUNE_TIMEOUT:-480} "$B/tools/tune/mhccl-tune" --tp 1 --hidden 5120 --hc 4 --out "$OUT/tuning-tp1.json" \
    ${TUNE_ARGS:-} > "$OUT/tune.log" 2>&1
  echo "mhccl-tune rc=$? wall $(( $(date +%s) - t )) s"
  grep -E "^mhccl-tune: (TP=|wrote|the sweep failed|nothing)|^  [a-z_0-9]+: two-shot from|gain over the defaults|error|Error" "$OUT/tune.log" | head -20
  grep -E "^    (call|finalize) +[0-9]+\*|SLOWER" "$OUT/tune.log" | head -${TUNE_LINES:-40}
  stamp "tune: mhccl-tune --verify with the table"
  timeout 120 "$B/tools/tune/mhccl-tune" --tp 1 --verify --tuning-file "$OUT/tuning-tp1.json" > "$OUT/tune-verify.log" 2>&1
  echo "verify rc=$? (expected 0)"; grep -E "FAIL|mhccl-tune --verify:" "$OUT/tune-verify.log" | head -10
  stamp "tune: mhccl-tune --verify, MHCCL_TEST_BREAK_PATH=two-shot (test only)"
  MHCCL_TEST_BREAK_PATH=two-shot timeout 120 "$B/tools/tune/mhccl-tune" --tp 1 --verify > "$OUT/tune-verify-broken.log" 2>&1
  rc=$?; echo "verify (broken) rc=$rc (expected 1): $([[ $rc == 1 ]] && echo PASS || echo FAIL)"
  grep -E "mhccl-tune --verify:|^  FAIL" "$OUT/tune-verify-broken.log" | head -6
  stamp "tune: GPU tests Tuning.*"
  timeout 300 "$B/tests/gpu/mhccl_gpu_tests" --gtest_filter='Tuning.*' > "$OUT/tune-tests.log" 2>&1
  echo "tuning tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  SKIPPED \] [0-9]|Failure|Expected|Which is|automatic calls" "$OUT/tune-tests.log" | head -20
fi
stamp "done"
# Only a few files come back from the GPU machine: every log goes back in one archive (the
# tune stage's table beside it).
( cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -vE '^(logs\.tgz|tuning-.*\.json)$') )
