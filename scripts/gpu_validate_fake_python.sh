#!/usr/bin/env bash
# Stands in for python3 in `GPU_VALIDATE_DRY_RUN=1 bash scripts/gpu_validate.sh` (no GPU): it
# answers each GPU command of the call (the setup check, pytest tests/cuda, the trainings, gsplat's
# peer, the benchmarks) by printing its arguments and the environment that steers it, sleeping the
# check's expected time (GPU_VALIDATE_EXPECT_S, already scaled), and writing fake results where
# the real command writes them ($BENCH_RESULTS, --result_dir, --junitxml, the machine JSON), so the
# call's order, limits, deadline and $OUT handling can be proven on a CPU. Any other command is an
# error (the call must not run something this stand-in does not know).
# GPU_VALIDATE_DRY_HANG / _DRY_FAIL / _DRY_JIT: comma-separated check names that hang (cut by their
# limit), fail, or print gsplat's JIT fallback warning.
set -u
n="${GPU_VALIDATE_CHECK:-?}"
echo "fake python [$n]: $*"
for v in WS BATCHES SCALING_STEPS SCALING_WARMUP TIME_LIMIT_S PEER_TIMEOUT_S PEER_RESET SCENE DATA_FACTOR \
         DISTSPLAT_FAIL_ON_SKIP DISTSPLAT_GSPLAT_EXT CUDA_HOME; do
    [ -n "${!v+x}" ] && echo "fake python [$n]: env $v=${!v}"
done
listed() { case ",$1," in *",$n,"*) return 0 ;; esac; return 1; }
if listed "${GPU_VALIDATE_DRY_HANG:-}"; then
    # as torchrun's workers do, a child in a session of its own, which the limit's kill misses
    setsid sleep 100000 < /dev/null > /dev/null 2>&1 &
    echo "fake python [$n]: hanging (a child in its own session: $!)"
    sleep 100000
fi
# the check's expected time goes to its main command (the garden capture's writer is part of it)
[ "${1:-}" = scripts/make_garden_capture.py ] || sleep "${GPU_VALIDATE_EXPECT_S:-0}"
if listed "${GPU_VALIDATE_DRY_JIT:-}"; then
    echo "WARNING distsplat.render.gsplat_ext: DISTSPLAT_GSPLAT_EXT=x not used: (dry run); falling back to gsplat's JIT build"
fi
if listed "${GPU_VALIDATE_DRY_FAIL:-}"; then
    [ "$n" = setup ] && echo "setup: FAIL gsplat ops: the prebuilt extension cannot be used: (dry run)"
    echo "fake python [$n]: failing as asked (GPU_VALIDATE_DRY_FAIL)"; exit 1
fi
R="${BENCH_RESULTS:?BENCH_RESULTS must be set}"
mkdir -p "$R"
arg() { local want=$1 prev=""; shift; for a in "$@"; do [ "$prev" = "$want" ] && { echo "$a"; return; }; prev=$a; done; }
case "${1:-}" in
scripts/gpu_setup_check.py)
    printf '{"machine": {"gpu": "none (dry run)"}, "gsplat_ops": "dry run"}\n' > "$2"
    echo "setup: ok GPU none (dry run)"; echo "setup: ok fused-ssim (dry run)"; echo "setup: ok gsplat ops (dry run)" ;;
examples/simple_trainer.py)
    steps=$(arg --max_steps "$@"); rdir=$(arg --result_dir "$@")
    mkdir -p "$rdir/stats"
    printf '{"psnr": 34.2, "ssim": 0.956, "num_GS": 153343, "elapsed": 80.5, "step": %s}\n' "$steps" \
        > "$rdir/stats/val_step$steps.json"
    printf '{"mem": 0.5, "ellipse_time": 80.5}\n' > "$rdir/stats/train_step${steps}_rank0.json"
    echo "INFO distsplat.train.trainer: step $steps/$steps: loss 0.0200, 87.50 steps/s, 153343 Gaussians" ;;
-m)
    case "$2" in
    pytest)
        xml=""; for a in "$@"; do case "$a" in --junitxml=*) xml=${a#--junitxml=} ;; esac; done
        [ -n "$xml" ] && printf '<testsuites><testsuite name="pytest" time="36.3"><testcase classname="tests.cuda.test_fake" name="test_a"/><testcase classname="tests.cuda.test_fake" name="test_b"/></testsuite></testsuites>\n' > "$xml"
        echo "============================== 2 passed in 36.30s ==============================" ;;
    *) echo "fake python: no stand-in for: $*" >&2; exit 2 ;;
    esac ;;
benchmarks/studies/steps/count_syncs.py)
    printf '{"dry_run": true}\n' > "$R/host_syncs_cuda.json"
    echo "host syncs per step: trainer 1, ours_render 1, gsplat_step 2 (dry run) -> $R/host_syncs_cuda.json" ;;
benchmarks/gsplat_peer.py)
    name="gsplat_peer_$2$([ "${PEER_RESET:-0}" = 1 ] && echo _reset)"
    printf '{"summary": {"psnr": 33.85, "ssim": 0.954, "num_GS": 184712, "train_seconds": 69.1, "wall_seconds": 74.7}}\n' > "$R/$name.json"
    echo "gsplat_peer: {'psnr': 33.85, 'train_seconds': 69.1} (dry run) -> $R/$name.json" ;;
benchmarks/scaling_gpu.py)
    printf '{"dry_run": true}\n' > "$R/scaling_gpu.json"
    echo "scaling_gpu: W=4 batch 4: 3.9x (dry run) -> $R/scaling_gpu.json" ;;
scripts/make_garden_capture.py)
    mkdir -p "$2/sparse/0" "$2/images"; echo "garden capture in $2 (dry run)" ;;
benchmarks/bench_step_vs_gsplat.py)  # one result per scene, named as the script names it
    out="$R/step_vs_gsplat_cuda_${SCENE_NAME:-$(basename "${SCENE:?SCENE must be set}")}.json"
    printf '{"scene": "%s"}\n' "${SCENE:-}" > "$out"
    echo "step_vs_gsplat: ours 14.00 ms, gsplat 15.00 ms per step (0.933x) (dry run) -> $out" ;;
benchmarks/bench_vs_gsplat.py)
    printf '{"dry_run": true}\n' > "$R/vs_gsplat.json"
    echo "vs_gsplat: ours_w1 / gsplat 1.05 (dry run) -> $R/vs_gsplat.json" ;;
benchmarks/studies/steps/profile_gpu.py)
    mkdir -p "$2"; printf 'fake table\n' > "$2/table.txt"
    printf '{"dry_run": true}\n' > "$R/profile_gpu_cuda.json"
    echo "profile_gpu: (dry run) -> $R/profile_gpu_cuda.json" ;;
*)
    echo "fake python: no stand-in for: $*" >&2; exit 2 ;;
esac
