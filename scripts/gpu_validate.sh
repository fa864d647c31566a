#!/usr/bin/env bash
# The GPU validation in ONE call on a GPU machine (issue 29). Ours (one H100 or H200, torch
# 2.11.0+cu130, Python 3.12, nvcc 13.0, no internet, bare at every start) is lent for 15 minutes
# in all, its start, idle time and closing included: one prepared call of about 9 minutes, and a
# short rerun at most. Prepare on a machine without a GPU (scripts/gpu_prepare.sh's header):
#     DISTSPLAT_DATA=/path/to/data bash scripts/gpu_prepare.sh   # .whl/ .gpu_data/ .gsplat_ext/ .gsplat_peer/, then the carry check
# then, on the GPU machine, with those four folders copied beside the repository, from its root
# (a limit of about 560 s on the command leaves room for the archives):
#     bash scripts/gpu_validate.sh
# A rerun of named checks on the same machine (setup runs first, always):
#     bash scripts/gpu_validate.sh tests,syncs
# `bash scripts/gpu_validate.sh --budget` prints the table below from the code.
#
# The checks, in priority order. Each runs under its own limit and starts only when what is left
# of DEADLINE_S (less RESERVE_S for the archives) covers its `start` column: otherwise it is
# SKIPped with a line saying so, and a later, shorter check may still run. A limit longer than
# what is left is cut to the deadline. `expected` is what the work took on one H100 in earlier
# calls (benchmarks/results/, named below as the call writes them; the committed snapshots are
# <name>_h100_2026-11-23*.json), or an estimate where the check is new (marked ~, with its basis).
#
#   check               limit start expected  where the expected time comes from
#   setup                  60     0     ~15   no record: the carried wheels' install, then one import of torch,
#                                             fused-ssim and the prebuilt gsplat .so (fails fast, with the reason)
#   tests                  75    40      36   tests_cuda.json "seconds" 36.29 (tests/cuda, 46 passed, no skip)
#   syncs                  80    30     ~70   host_syncs_cuda.json: 29 s after tests_cuda.json in the same call;
#                                             now + gsplat's own step in a process of its own (~20 s: see peer_*)
#                                             + the shared-GPU W = 2 step: 2 rank processes, each its own setup
#                                             (~20 s, estimate: W = 1's setup and steps in the 29 s above)
#   default_7k            140   100     105   runs/default_thermos_7000{,_rerun}.json launch_to_exit_s 99 and 110
#   peer_default          110    90     ~92   gsplat_peer_default.json wall_seconds 74.7, + ~17 s of process start
#                                             (gsplat_peer_mcmc.json: 95 s between its date and the run before it,
#                                             wall_seconds 78.2)
#   scaling               110    45     ~60   new form (W trainer ranks on the GPU, W 1 and 4, batch 1 and 4, 10
#                                             timed steps); the old form took 20 s + 8 s setup (scaling_gpu.json)
#   step_vs_gsplat         75    40     ~40   not run on a GPU yet: ours 70 steps of ~15 ms (profile_gpu_cuda.json)
#                                             + setup, gsplat's probe ~20 s (as syncs)
#   vs_gsplat              30    10       8   vs_gsplat_cuda.json: 8 s after host_syncs_cuda.json
#   step_vs_garden        120    80     ~90   not run yet: the 1.1M-Gaussian garden capture written, both trainers'
#                                             setup with k-NN on 1.1M points, 70 steps each
#   --- core: expected 516 s of DEADLINE_S 540 less RESERVE_S 15; what follows runs only if time is left
#   peer_default_reset    110    90     ~92   as peer_default (gsplat's trainer with its opacity reset repaired)
#   profile               140   120    ~130   profile_gpu_cuda.json: 130 s after mcmc_thermos_7000.json's date
#   mcmc_7k               150   110     110   runs/mcmc_thermos_7000{,_rerun}.json launch_to_exit_s 104 and 117
#   peer_mcmc             110    90     ~95   gsplat_peer_mcmc.json wall_seconds 78.2, + ~17 s of process start
#
# So one call runs 1-6 of issue 29 (setup, tests, syncs, thermos 7000 steps ours then gsplat's as
# released, scaling, the step and render ratios); gsplat with its reset repaired, the profile and
# mcmc need time that is not left, or a second call: `bash scripts/gpu_validate.sh extra`.
#
# No JIT: gsplat's ops must come from the carried .gsplat_ext (setup fails in seconds, saying why,
# when they cannot), and for the rest of the call nvcc is a stub that fails, so a process that
# would fall back to gsplat's JIT build fails at once instead of compiling for minutes; a check
# whose log shows a JIT attempt is failed. fused-ssim must import and run, or setup fails: the
# trainings also pass --ssim_impl fused, so none silently trains with the PyTorch SSIM.
#
# $OUT (default ./gpu_out) gets, after every check (so a cut call still returns them; at most 8
# files come back from a call): summary.txt (a line per check: PASS, FAIL or SKIP, its time, limit
# and expected time, then its result's line), logs.tgz (every check's log, env.txt, machine.json,
# the tests' junit XML) and results.tgz (benchmarks/results/... written by this call under plain
# names, to unpack in the repository root and file as dated snapshots: python
# benchmarks/results_index.py file PATH...). The exit code is non-zero when a check failed, or a
# core check was skipped.
#
# Environment: OUT, DEADLINE_S (540), RESERVE_S (15), STEPS (7000: the trainings), DATA_FACTOR (1:
# thermos at 946x532). GPU_VALIDATE_DRY_RUN=1: no GPU, the same call with each GPU command answered
# by scripts/gpu_validate_fake_python.sh (it sleeps the check's expected time and writes fake
# results); GPU_VALIDATE_TIME_SCALE (1; 0.01 in a dry run) multiplies every limit, start, expected
# time and the deadline; GPU_VALIDATE_DRY_HANG / _DRY_FAIL / _DRY_JIT (check names, comma-separated)
# make the stand-in hang, fail or print a JIT fallback. GPU_VALIDATE_WORK: the scratch folder
# (default a new /tmp/gpu_validate.*). tests/unit/test_gpu_validate.py runs the dry call.
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

# ------------------------------------------------------------------------------ the budget
# name                limit start expected group (core: issue 29's items 1-6; extra: if time is left)
BUDGET="
setup                  60     0    15  core
tests                  75    40    36  core
syncs                  80    30    70  core
default_7k            140   100   105  core
peer_default          110    90    92  core
scaling               110    45    60  core
step_vs_gsplat         75    40    40  core
vs_gsplat              30    10     8  core
step_vs_garden        120    80    90  core
peer_default_reset    110    90    92  extra
profile               140   120   130  extra
mcmc_7k               150   110   110  extra
peer_mcmc             110    90    95  extra
"
declare -A LIMIT START EXPECT GROUP
ORDER=()
while read -r n l s e g; do
    [ -n "${n:-}" ] || continue
    ORDER+=("$n"); LIMIT[$n]=$l; START[$n]=$s; EXPECT[$n]=$e; GROUP[$n]=$g
done <<< "$BUDGET"
DEADLINE_S="${DEADLINE_S:-540}"
RESERVE_S="${RESERVE_S:-15}"   # the last archives, a killed check's --kill-after, the last records
KILL_AFTER_S=5

if [ "${1:-}" = "--budget" ]; then
    core=0
    printf '%-20s %5s %5s %8s  %s\n' check limit start expected group
    for n in "${ORDER[@]}"; do
        printf '%-20s %5s %5s %8s  %s\n' "$n" "${LIMIT[$n]}" "${START[$n]}" "${EXPECT[$n]}" "${GROUP[$n]}"
        [ "${GROUP[$n]}" = core ] && core=$((core + EXPECT[$n]))
    done
    echo "core expected: $core s of DEADLINE_S $DEADLINE_S less RESERVE_S $RESERVE_S"
    exit 0
fi

# Which checks: all (the default), core, extra, or names (setup always first).
ARG="${1:-all}"
CHECKS=()
IFS=',' read -r -a WANTED <<< "$ARG"
for w in "${WANTED[@]}"; do
    case "$w" in
    all) CHECKS+=("${ORDER[@]}") ;;
    core|extra) for n in "${ORDER[@]}"; do [ "${GROUP[$n]}" = "$w" ] && CHECKS+=("$n"); done ;;
    *) if [ -z "${LIMIT[$w]+x}" ]; then
           echo "gpu_validate.sh: unknown check '$w' (all, core, extra, or: ${ORDER[*]})" >&2; exit 2
       fi
       CHECKS+=("$w") ;;
    esac
done
NAMED=1; [ "$ARG" = all ] && NAMED=0
RUNLIST=(setup)   # setup first, once; the rest in the order asked
for c in "${CHECKS[@]}"; do
    case " ${RUNLIST[*]} " in *" $c "*) ;; *) RUNLIST+=("$c") ;; esac
done

# ------------------------------------------------------------------------------ time
DRY="${GPU_VALIDATE_DRY_RUN:-0}"
SCALE="${GPU_VALIDATE_TIME_SCALE:-$([ "$DRY" = 1 ] && echo 0.01 || echo 1)}"
PPM=$(awk -v k="$SCALE" 'BEGIN { printf "%d", k * 1000000 + 0.5 }')
ms() { echo $(( $1 * PPM / 1000 )); }                  # budget seconds -> scaled milliseconds
now() { NOW=$(( ${EPOCHREALTIME/[.,]/} / 1000 )); }    # wall clock, ms
sec() {  # ms -> "12.3" ("0.12" in a dry run, whose times are small)
    if [ "$PPM" -lt 1000000 ]; then printf '%d.%02d' $(( $1 / 1000 )) $(( ($1 % 1000) / 10 ))
    else printf '%d.%d' $(( $1 / 1000 )) $(( ($1 % 1000) / 100 )); fi
}
sec3() { printf '%d.%03d' $(( $1 / 1000 )) $(( $1 % 1000 )); }       # ms -> "12.345" (timeout, sleep)
now; T0=$NOW
DEADLINE_MS=$(ms "$DEADLINE_S"); RESERVE_MS=$(ms "$RESERVE_S"); KILL_MS=$(ms "$KILL_AFTER_S")

# ------------------------------------------------------------------------------ where things go
OUT="${OUT:-$ROOT/gpu_out}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
rm -f "$OUT/logs.tgz" "$OUT/results.tgz"
WORK="${GPU_VALIDATE_WORK:-$(mktemp -d /tmp/gpu_validate.XXXXXX)}"
LOGS="$WORK/logs"            # -> logs.tgz
TREE="$WORK/tree"            # benchmarks/results/... of this call -> results.tgz
RUNS="$WORK/runs"            # the trainers' result dirs (their stats become the run records)
rm -rf "$LOGS" "$TREE" "$RUNS"
mkdir -p "$LOGS" "$TREE/benchmarks/results/runs" "$RUNS"
export BENCH_RESULTS="$TREE/benchmarks/results"   # benchmarks/common.py's write_result writes here
export GPU_VALIDATE_MACHINE="$LOGS/machine.json"
FAILED=0
declare -A STATUS

note() { echo "$*" | tee -a "$SUMMARY"; }
detail() { [ -n "$*" ] && note "  $*"; return 0; }
publish() {  # the archives, rewritten after every check: a call cut at any point still returns them
    tar -czf "$OUT/logs.tgz.part" -C "$WORK" logs 2>/dev/null && mv -f "$OUT/logs.tgz.part" "$OUT/logs.tgz"
    if [ -n "$(find "$TREE/benchmarks/results" -type f -print -quit)" ]; then
        tar -czf "$OUT/results.tgz.part" -C "$TREE" benchmarks 2>/dev/null && mv -f "$OUT/results.tgz.part" "$OUT/results.tgz"
    fi
}
trap 'note "INTERRUPTED (signal) at $(now; sec $((NOW - T0))) s"; publish; exit 1' TERM INT

# grant NAME: the limit NAME gets now (GRANT_MS, and GRANT_S in real seconds for the checks'
# own limits), or a SKIP line and status 1 when what is left of the deadline is under its start.
grant() {
    local n=$1 left
    now; left=$(( DEADLINE_MS - (NOW - T0) - RESERVE_MS ))
    GRANT_MS=$(ms "${LIMIT[$n]}"); CUT=""
    if [ "$left" -lt "$(ms "${START[$n]}")" ]; then
        note "SKIP $n (needs $(sec "$(ms "${START[$n]}")") s to start, $(sec $(( left > 0 ? left : 0 ))) s left of DEADLINE_S; at $(sec $((NOW - T0))) s)"
        STATUS[$n]=SKIP
        if [ "${GROUP[$n]}" = core ] || [ "$NAMED" = 1 ]; then FAILED=1; fi
        publish
        return 1
    fi
    if [ "$GRANT_MS" -gt "$left" ]; then GRANT_MS=$left; CUT=", cut to the deadline"; fi
    GRANT_S=$(( GRANT_MS * 1000 / PPM ))
    return 0
}
sub() { local v=$(( GRANT_S - $1 )); echo $(( v > 10 ? v : 10 )); }   # a check's inner limit, seconds

# reap TOKEN: kills what a check left running (a child in a session of its own, e.g. a rank that
# outlived its killed parent and still holds the GPU): the processes whose environment has the token.
reap() {
    local pids p
    pids=$(grep -l -s -z -x "GPU_VALIDATE_TOKEN=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\n' ' ')
    for p in $pids; do [ "$p" != "$$" ] && kill -KILL "$p" 2>/dev/null; done
    [ -n "${pids// /}" ] && echo "gpu_validate.sh: killed what this check left running: $pids"
    return 0
}

JIT_SIGNS="falling back to gsplat's JIT build|gsplat: Setting up CUDA|nvcc is disabled in this call"
# run NAME CMD...: CMD under the granted limit, its output in logs/NAME.log, a PASS or FAIL line.
run() {
    local n=$1 start rc took how
    shift
    now; start=$NOW
    env GPU_VALIDATE_CHECK="$n" GPU_VALIDATE_EXPECT_S="$(sec3 "$(ms "${EXPECT[$n]}")")" GPU_VALIDATE_TOKEN="gv$$-$n" \
        timeout --kill-after="$(sec3 "$KILL_MS")" "$(sec3 "$GRANT_MS")" "$@" > "$LOGS/$n.log" 2>&1
    rc=$?
    local reaped; reaped=$(reap "gv$$-$n")
    [ -n "$reaped" ] && echo "$reaped" >> "$LOGS/$n.log"
    now; took=$(( NOW - start )); TOOK_S=$(( took * 1000 / PPM ))
    how="$(sec "$took") s, limit $(sec "$GRANT_MS") s$CUT, expected $(sec "$(ms "${EXPECT[$n]}")") s; at $(sec $((NOW - T0))) s"
    if [ "$rc" -eq 0 ] && ! grep -qE "$JIT_SIGNS" "$LOGS/$n.log"; then
        note "PASS $n ($how)"; STATUS[$n]=PASS
    else
        if grep -qE "$JIT_SIGNS" "$LOGS/$n.log"; then
            note "FAIL $n (gsplat's JIT build was attempted: the prebuilt ops were not used; exit $rc; $how)"
        elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            note "FAIL $n (cut at its limit: exit $rc; $how)"
        else
            note "FAIL $n (exit $rc; $how)"
        fi
        STATUS[$n]=FAIL; FAILED=1
        echo "---- last lines of logs/$n.log"; tail -n 20 "$LOGS/$n.log"; echo "----"
    fi
    detail "$reaped"
    publish
    [ "$rc" -eq 0 ]
}
last_line() { grep -a -E "$1" "$LOGS/$2.log" 2>/dev/null | tail -n 1; }

# ------------------------------------------------------------------------------ environment
export PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export DISTSPLAT_DATA="$ROOT/.gpu_data"
export DISTSPLAT_GSPLAT_EXT="$ROOT/.gsplat_ext"
export GSPLAT_PEER="$ROOT/.gsplat_peer"
export MAX_JOBS="${MAX_JOBS:-14}"
if [ -f .gpu_data/COMMIT ]; then DISTSPLAT_COMMIT="$(cat .gpu_data/COMMIT)"; export DISTSPLAT_COMMIT; fi
HOST_PY="$(command -v python3)"   # the bookkeeping between checks (no GPU, no torch)
if [ "$DRY" = 1 ]; then PY="$ROOT/scripts/gpu_validate_fake_python.sh"; else PY="$HOST_PY"; fi
THERMOS="$DISTSPLAT_DATA/thermos"
STEPS="${STEPS:-7000}"
DATA_FACTOR="${DATA_FACTOR:-1}"

note "gpu_validate: ${RUNLIST[*]}; commit ${DISTSPLAT_COMMIT:-unknown}; DEADLINE_S $DEADLINE_S; $(date -u +%FT%TZ)$([ "$DRY" = 1 ] && echo "; DRY RUN (no GPU; stand-ins sleep their expected time), time scale $SCALE")"


# From here on nvcc (and CUDA_HOME) are a stub that fails at once: a process that would fall back
# to gsplat's JIT build (minutes of compiling, in every rank) fails in seconds instead, and says so.
NOJIT="$WORK/nojit"
mkdir -p "$NOJIT/bin"
{ [ "$DRY" = 1 ] || nvcc --version 2>&1 | tail -n 1; } >> "$LOGS/env.txt"
printf '#!/bin/sh\necho "gpu_validate.sh: nvcc is disabled in this call: gsplat must load the carried .gsplat_ext, never build by JIT" >&2\nexit 1\n' > "$NOJIT/bin/nvcc"
chmod +x "$NOJIT/bin/nvcc"
export CUDA_HOME="$NOJIT" CUDA_PATH="$NOJIT" PATH="$NOJIT/bin:$PATH" TORCH_EXTENSIONS_DIR="$WORK/torch_extensions"

# ------------------------------------------------------------------------------ the checks
check_setup() {
    grant setup || return 1
    run setup env GPU_VALIDATE_PY="$PY" GPU_VALIDATE_LOGS="$LOGS" GPU_VALIDATE_DRY_RUN="$DRY" bash scripts/gpu_setup.sh
    local rc=$?
    while read -r line; do detail "${line#setup: }"; done < <(grep -a '^setup: ' "$LOGS/setup.log")
    return $rc
}

train() {  # train CHECK STRATEGY: examples/simple_trainer.py on thermos, W = 1, --cache gpu
    local n=$1 strategy=$2 rdir args rec
    rdir="$RUNS/${strategy}_thermos_${STEPS}"
    args="$strategy --data_dir $THERMOS --data_factor $DATA_FACTOR --max_steps $STEPS --eval_steps $STEPS --save_steps $STEPS --cache gpu --ssim_impl fused"
    grant "$n" || return 1
    # One process, no torchrun (W = 1 needs none; the trainer runs unchanged under python): a cut
    # run then leaves no worker behind in a session of its own, and gsplat's trainer is run alike.
    # shellcheck disable=SC2086
    run "$n" "$PY" examples/simple_trainer.py $args --disable_viewer --result_dir "$rdir"
    rec=$("$HOST_PY" scripts/gpu_records.py run "$rdir" "$BENCH_RESULTS/runs/${strategy}_thermos_${STEPS}.json" \
          "$TOOK_S" "$LOGS/$n.log" "$args" 2>&1)
    detail "${strategy}_thermos_${STEPS}: $rec"
    publish
}

peer() {  # peer CHECK STRATEGY RESET: gsplat's own simple_trainer.py on the same capture
    local n=$1 strategy=$2 reset=$3 name ours
    name="gsplat_peer_${strategy}$([ "$reset" = 1 ] && echo _reset)"
    grant "$n" || return 1
    run "$n" env PEER_RESET="$reset" "$PY" benchmarks/gsplat_peer.py "$strategy" --data_dir "$THERMOS" \
        --data_factor "$DATA_FACTOR" --max_steps "$STEPS" --eval_steps "$STEPS" --save_steps "$STEPS" \
        --disable_viewer --disable_video --result_dir "$RUNS/peer_${strategy}_$reset"
    detail "$(last_line '^gsplat_peer: \{' "$n")"
    ours="$BENCH_RESULTS/runs/${strategy}_thermos_${STEPS}.json"
    if [ -f "$ours" ] && [ -f "$BENCH_RESULTS/$name.json" ]; then
        detail "goal: $("$HOST_PY" scripts/gpu_records.py compare "$ours" "$BENCH_RESULTS/$name.json" 2>&1)"
    fi
}

run_check() {
    local n=$1
    case "$n" in
    setup) check_setup ;;
    tests)  # every CUDA test must run: a skip (no data, no GPU) fails here; pytest-timeout stops a hung test
        grant tests || return 1
        # -o addopts=: one process (pyproject's -n auto needs pytest-xdist, not carried; CUDA tests share one GPU)
        run tests env DISTSPLAT_FAIL_ON_SKIP=1 "$PY" -m pytest tests/cuda -o addopts= -v -rA -p no:cacheprovider \
            --timeout 60 --junitxml="$LOGS/tests_cuda.xml"
        detail "$(last_line '[0-9]+ (passed|failed|errors?)' tests)"
        detail "$("$HOST_PY" scripts/gpu_records.py tests "$LOGS/tests_cuda.xml" "$BENCH_RESULTS/tests_cuda.json" 2>&1)"
        publish ;;
    syncs)  # host syncs of the trainer's step (W = 1, then W = 2 sharing the GPU) and of gsplat's trainer's step
        grant syncs || return 1
        run syncs env PEER_TIMEOUT_S="$(sub 35)" TIME_LIMIT_S="$(sub 5)" "$PY" benchmarks/studies/steps/count_syncs.py
        detail "$(last_line '^host syncs' syncs)" ;;
    default_7k) train default_7k default ;;
    mcmc_7k) train mcmc_7k mcmc ;;
    peer_default) peer peer_default default 0 ;;
    peer_default_reset) peer peer_default_reset default 1 ;;
    peer_mcmc) peer peer_mcmc mcmc 0 ;;
    scaling)  # W trainer ranks taking turns on the one GPU; TIME_LIMIT_S: no new W past it
        grant scaling || return 1
        run scaling env WS=1,4 BATCHES=1,4 SCALING_WARMUP=3 SCALING_STEPS=10 TIME_LIMIT_S="$(sub 35)" \
            "$PY" benchmarks/scaling_gpu.py
        detail "$(tail -n 1 "$LOGS/scaling.log")" ;;
    step_vs_gsplat)  # one step of Trainer.train_step vs one of gsplat's simple_trainer, thermos: step_vs_gsplat_cuda_thermos
        grant step_vs_gsplat || return 1
        run step_vs_gsplat env SCENE="$THERMOS" DATA_FACTOR=1 PEER_TIMEOUT_S="$(sub 25)" \
            "$PY" benchmarks/bench_step_vs_gsplat.py
        detail "$(last_line '^step_vs_gsplat:' step_vs_gsplat)" ;;
    step_vs_garden)  # the same on the 1.1M-Gaussian garden capture (scaling_gpu's scene): step_vs_gsplat_cuda_garden
        grant step_vs_garden || return 1
        run step_vs_garden bash -c '"$1" scripts/make_garden_capture.py "$2" && SCENE="$2" DATA_FACTOR=1 PEER_TIMEOUT_S="$3" "$1" benchmarks/bench_step_vs_gsplat.py' \
            _ "$PY" "$WORK/garden" "$(sub 40)"
        detail "$(last_line '^step_vs_gsplat:' step_vs_garden)" ;;
    vs_gsplat)  # one render's forward + backward, 1M Gaussians: distributed_rasterize at W = 1 vs gsplat
        grant vs_gsplat || return 1
        run vs_gsplat "$PY" benchmarks/bench_vs_gsplat.py
        detail "$(tail -n 1 "$LOGS/vs_gsplat.log")" ;;
    profile)  # where a W = 1 step's time goes (the trainer timed before the profiler attaches)
        grant profile || return 1
        run profile "$PY" benchmarks/studies/steps/profile_gpu.py "$LOGS/profile_tables"
        detail "$(tail -n 1 "$LOGS/profile.log")" ;;
    esac
}

for c in "${RUNLIST[@]}"; do
    run_check "$c"
    if [ "$c" = setup ] && [ "${STATUS[setup]:-}" != PASS ]; then
        note "setup failed: nothing else can run (the reason is above, and in logs.tgz: logs/setup.log)"
        FAILED=1
        break
    fi
done

count() { local k=0 n; for n in "${!STATUS[@]}"; do [ "${STATUS[$n]}" = "$1" ] && k=$((k + 1)); done; echo $k; }
now
note "done in $(sec $((NOW - T0))) s: $(count PASS) passed, $(count FAIL) failed, $(count SKIP) skipped$([ "$FAILED" = 0 ] && echo '' || echo ' -- SOME CHECKS FAILED OR A CORE CHECK WAS SKIPPED')"
publish
exit "$FAILED"
