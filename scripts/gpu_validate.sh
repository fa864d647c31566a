#!/usr/bin/env bash
# The GPU validation, in three device calls of under 10 minutes each, on a bare GPU machine
# (torch with CUDA preinstalled, no internet). Prepare on the CPU machine first:
#     bash scripts/gpu_prepare.sh        # wheels -> .whl/, data -> .gpu_data/, gsplat -> .gsplat_ext/
# then, on the device, from the repository root, with .whl .gpu_data .gsplat_ext carried:
#     bash scripts/gpu_validate.sh 1     # correctness and the step: gsplat loads, tests/cuda with
#                                        # no skip, host syncs, one step vs gsplat's, the profile,
#                                        # NCCL W=1 and shared-GPU W=2 trainings, bench_vs_gsplat
#                                        # (carry .gsplat_peer too: syncs and step_vs_gsplat run
#                                        # gsplat's own trainer's step next to ours)
#     bash scripts/gpu_validate.sh 2     # thermos 7000 steps: default and mcmc, ours and gsplat's
#                                        # own trainer (also with its opacity reset repaired)
#     bash scripts/gpu_validate.sh 3     # the scaling model (W trainer ranks on the GPU), 1000 steps of thermos
#     bash scripts/gpu_validate.sh tests,profile,default_7k   # named checks (see run_check)
# Everything lands in $OUT (default: ./gpu_out): summary.txt (one line per check, PASS/FAIL),
# logs.tgz (every check's log: at most 8 files come back from a device call), and
# results.tgz (benchmarks/results/*.json written by this run). The exit code
# is non-zero when any check failed. Each check runs under `timeout` so that a hang costs its
# own budget, never the whole call.
#
# Environment: OUT, DEADLINE_S (570: the whole call's time; checks are cut or skipped to
# leave the archives time), STEPS (the default_7k / mcmc_7k trainings, default 7000), TRAIN_LIMIT (their
# time limit, 240 s), DATA_FACTOR (thermos, 1 = 946x532). The benchmarks read prefixed names of
# their own (profile_gpu: PROFILE_STEPS/PROFILE_WARM; scaling_gpu: SCALING_STEPS/SCALING_WARMUP;
# SCALING_LIMIT_S is its time limit here), so STEPS reaches the trainings only.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PART="${1:-1}"
OUT="${OUT:-$PWD/gpu_out}"
LOGS="$OUT/logs"
mkdir -p "$OUT" "$LOGS"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0
T0=$(date +%s)

note() { echo "$*" | tee -a "$SUMMARY"; }

# check NAME SECONDS CMD...: runs CMD with a time limit, its output in $LOGS/NAME.log.
check() {
    local name="$1" limit="$2" start rc left
    shift 2
    start=$(date +%s)
    # The whole call ends by DEADLINE_S (the device's per-call limit): a check gets what is
    # left of it, less the time to pack the archives, or is skipped.
    left=$(( ${DEADLINE_S:-570} - (start - T0) - 15 ))
    if [ "$left" -lt 20 ]; then
        note "SKIP $name (the call's ${DEADLINE_S:-570} s are nearly spent)"; FAILED=1; return 124
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        note "PASS $name ($(( $(date +%s) - start )) s)"
    else
        note "FAIL $name (exit $rc$([ "$rc" -eq 124 ] && echo ", timed out after ${limit} s"), $(( $(date +%s) - start )) s; see $name.log)"
        tail -n 30 "$LOGS/$name.log"
        FAILED=1
    fi
    return "$rc"
}

# ------------------------------------------------------------------ environment
export PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DISTSPLAT_DATA="$PWD/.gpu_data"
export DISTSPLAT_GSPLAT_EXT="$PWD/.gsplat_ext"
# gsplat's JIT fallback builds here: inside the repository copy, kept while the machine stays warm.
export TORCH_EXTENSIONS_DIR="$PWD/.torch_extensions"
export MAX_JOBS="${MAX_JOBS:-14}"
if [ -f .gpu_data/COMMIT ]; then DISTSPLAT_COMMIT="$(cat .gpu_data/COMMIT)"; export DISTSPLAT_COMMIT; fi
PY=python3
if [ -d .whl ] && ! $PY -c "import tyro, viser, gsplat" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { note "FAIL install of the carried wheels"; exit 1; }
fi
# fused-ssim (the training loss's --ssim_impl fused, picked by auto on a GPU; tests/cuda checks it):
# the build in a carried .gsplat_peer (scripts/prepare_gsplat_peer.sh, sm_90), when none is installed.
if ! $PY -c "import fused_ssim" 2>/dev/null && ls .gsplat_peer/site/fused_ssim_cuda*.so >/dev/null 2>&1; then
    mkdir -p /tmp/site && cp -r .gsplat_peer/site/fused_ssim .gsplat_peer/site/fused_ssim_cuda*.so /tmp/site/
fi
{
    echo "part $PART, commit ${DISTSPLAT_COMMIT:-unknown}, $(date -u +%FT%TZ)"
    $PY -c "import fused_ssim; print('fused-ssim', fused_ssim.__file__)" 2>/dev/null \
        || echo "fused-ssim: not importable (carry .gsplat_peer): the trainings use the PyTorch SSIM"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0))"
    nvcc --version 2>&1 | tail -1
} | tee "$LOGS/env.txt"
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'" || { note "FAIL no CUDA GPU visible to torch"; exit 1; }

# One process loads the prebuilt extension (or JIT-builds it once) before anything else,
# so no two ranks ever build concurrently.
check gsplat_ops 420 $PY -m distsplat.render.gsplat_ext || { note "gsplat's ops are missing: nothing else can run"; exit 1; }
note "  $(tail -n 1 "$LOGS/gsplat_ops.log")"

THERMOS="$DISTSPLAT_DATA/thermos"
train() {  # train NAME LIMIT NPROC [ENV=VAL ...] -- TRAINER ARGS...
    local name="$1" limit="$2" nproc="$3"
    shift 3
    local envs=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local t0=$(date +%s)
    check "$name" "$limit" env "${envs[@]}" $PY -m torch.distributed.run --standalone --nproc_per_node="$nproc" \
        examples/simple_trainer.py "$@" --disable_viewer --result_dir "/tmp/runs/$name"
    local wall=$(( $(date +%s) - t0 )) stats
    stats=$(ls /tmp/runs/"$name"/stats/val_step*.json 2>/dev/null | tail -n 1)
    [ -n "$stats" ] || return 0
    # The run's record: the eval stats, rank 0's peak GPU memory, the launch-to-exit time.
    mkdir -p benchmarks/results/runs
    note "  $name: $($PY - "$stats" "benchmarks/results/runs/$name.json" "$wall" "$*" <<'PYEOF'
import glob, json, os, sys
stats, out, wall, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
d = json.load(open(stats))
train = sorted(glob.glob(os.path.join(os.path.dirname(stats), "train_step*_rank0.json")))
if train:
    d["peak_gpu_mem_gib"] = json.load(open(train[-1])).get("mem")
sys.path.insert(0, os.getcwd())
from benchmarks.common import machine
from datetime import datetime, timezone
d.update(benchmark=os.path.basename(out)[:-5], date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
         machine=machine(), launch_to_exit_s=wall, trainer_args=args, commit=os.environ.get("DISTSPLAT_COMMIT"))
json.dump(d, open(out, "w"), indent=2)
print({k: d[k] for k in ("step", "psnr", "ssim", "num_GS", "elapsed", "peak_gpu_mem_gib", "launch_to_exit_s") if k in d})
PYEOF
)"
    return 0
}

run_check() {  # one named check (or group) of the validation
    case "$1" in
    tests)  # every CUDA test must run: a skip (no data, no GPU) is a failure here;
            # pytest-timeout (on the device image) stops a hung test at 90 s
        check tests_cuda 240 env DISTSPLAT_FAIL_ON_SKIP=1 $PY -m pytest tests/cuda -v -rA -p no:cacheprovider \
            --timeout 90 --junitxml="$LOGS/tests_cuda.xml"
        note "  $(grep -E '[0-9]+ (passed|failed|errors?)( |,)' "$LOGS/tests_cuda.log" | tail -n 1)" ;;
    syncs)  # the trainer's step by range, and gsplat's own trainer's step (.gsplat_peer; skipped without it)
        check host_syncs 150 $PY benchmarks/count_syncs.py
        note "  $(tail -n 1 "$LOGS/host_syncs.log")" ;;
    small)  # NCCL at W=1 (one GPU), then W=2 sharing the GPU over gloo (correctness only)
        train nccl_w1 90 1 -- default --data_dir "$THERMOS" --data_factor 4 --max_steps 200 \
            --eval_steps 200 --save_steps 200 --cache gpu
        train shared_w2 100 2 DISTSPLAT_SHARED_GPU=1 -- default --data_dir "$THERMOS" --data_factor 4 \
            --max_steps 200 --eval_steps 200 --save_steps 200 --cache decoded ;;
    vs_gsplat)
        check vs_gsplat_synthetic 80 $PY benchmarks/bench_vs_gsplat.py
        note "  $(tail -n 1 "$LOGS/vs_gsplat_synthetic.log")" ;;
    step_vs_gsplat)  # Trainer.train_step against gsplat's own simple_trainer step (.gsplat_peer), thermos
        check step_vs_gsplat 180 $PY benchmarks/bench_step_vs_gsplat.py
        note "  $(tail -n 1 "$LOGS/step_vs_gsplat.log")" ;;
    profile)  # where a W=1 step's time goes: the trainer's ranges, kernels, data wait and host
        check profile 150 $PY benchmarks/profile_gpu.py "$LOGS"
        note "  $(tail -n 1 "$LOGS/profile.log")" ;;
    scaling)  # issue 15: W trainer ranks on the one GPU taking turns, timed by range (profiler)
        check scaling_gpu 240 env TIME_LIMIT_S="${SCALING_LIMIT_S:-180}" $PY benchmarks/scaling_gpu.py
        note "  $(tail -n 1 "$LOGS/scaling_gpu.log")" ;;
    default_1k)
        train default_thermos_1k 100 1 -- default --data_dir "$THERMOS" --data_factor 1 --max_steps 1000 \
            --eval_steps 1000 --save_steps 1000 --cache gpu ;;
    default_7k|mcmc_7k)  # issue 14's training: thermos at full resolution, W=1
        local strategy=${1%_7k}
        train "${strategy}_thermos_${STEPS:-7000}" "${TRAIN_LIMIT:-240}" 1 -- "$strategy" --data_dir "$THERMOS" \
            --data_factor "${DATA_FACTOR:-1}" --max_steps "${STEPS:-7000}" --eval_steps "${STEPS:-7000}" \
            --save_steps "${STEPS:-7000}" --cache gpu ;;
    peer_default|peer_mcmc|peer_default_reset)  # gsplat's own simple_trainer on the same capture
            # (benchmarks/gsplat_peer.py; carry .gsplat_peer too). peer_default_reset: with the opacity
            # reset that gsplat 1.5.3's DefaultStrategy never performs repaired (PEER_RESET=1), as ours
        local name=${1#peer_} strategy reset=0
        strategy=${name%_reset}
        [ "$name" != "$strategy" ] && reset=1
        check "gsplat_peer_${name}" "${TRAIN_LIMIT:-240}" env PEER_RESET=$reset $PY benchmarks/gsplat_peer.py \
            "$strategy" --data_dir "$THERMOS" --data_factor "${DATA_FACTOR:-1}" --max_steps "${STEPS:-7000}" \
            --eval_steps "${STEPS:-7000}" --save_steps "${STEPS:-7000}" --disable_viewer --disable_video \
            --result_dir "/tmp/runs/peer_${name}"
        note "  $(grep -a '^gsplat_peer: {' "$LOGS/gsplat_peer_${name}.log" | tail -n 1)" ;;
    1) for c in tests syncs step_vs_gsplat profile small vs_gsplat; do run_check $c; done ;;
    2) for c in default_7k peer_default peer_default_reset mcmc_7k peer_mcmc; do run_check $c; done ;;
    3) for c in scaling default_1k; do run_check $c; done ;;
    *) echo "unknown check '$1' (tests syncs small vs_gsplat step_vs_gsplat profile scaling default_1k default_7k mcmc_7k peer_default peer_mcmc peer_default_reset, or 1, 2, 3)" >&2
       FAILED=1 ;;
    esac
}
IFS=',' read -r -a CHECKS <<< "$PART"
for c in "${CHECKS[@]}"; do run_check "$c"; done

# At most 8 files come back from a device call: the logs travel as one archive.
tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
tar -czf "$OUT/results.tgz" benchmarks/results 2>/dev/null
rm -rf "$LOGS"
note "part $PART done in $(( $(date +%s) - T0 )) s; $([ "$FAILED" = 0 ] && echo 'all checks passed' || echo 'SOME CHECKS FAILED')"
exit "$FAILED"
