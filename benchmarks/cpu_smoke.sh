#!/usr/bin/env bash
# The pipeline of basic_4gpus.sh / mcmc_4gpus.sh on CPU: 2 gloo ranks (torch backend),
# short schedules, in a few minutes on a 2-core machine. Trains
#   default / builtin   the trainer's built-in synthetic scene, with densification
#   mcmc    / builtin   the same scene with MCMC (global cap CAP_MAX)
#   default / thermos   $SCENE_DIR/thermos (real COLMAP capture), a few steps; skipped
#                       with a message when the folder is absent
# then prints ONE summary table and writes it to benchmarks/results/cpu_smoke.json.
#
#   bash benchmarks/cpu_smoke.sh
#
# Environment (defaults): NGPU (2 ranks), SCENE_DIR (../shared/data next to the repo),
# DATA_FACTOR (4 for thermos: 236x133; 473x266 at factor 2 costs ~10 s/step here),
# RESULT_DIR (results/cpu_smoke), STEPS_SCALER (1: scales the explicit short schedules
# below, as --steps_scaler scales every step count), CAP_MAX (4500), THERMOS_STEPS (30).
#
# Why explicit schedules instead of a tiny STEPS_SCALER: gsplat's scaled schedule
# degenerates below ~0.01 (refine_every and reset_every round down to a few steps), so the
# smoke runs state their own short schedule and STEPS_SCALER scales that.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

NGPU=${NGPU:-2}
SCENE_DIR=${SCENE_DIR:-$REPO_ROOT/../shared/data}
DATA_FACTOR=${DATA_FACTOR:-4}
RESULT_DIR=${RESULT_DIR:-results/cpu_smoke}
STEPS_SCALER=${STEPS_SCALER:-1}
CAP_MAX=${CAP_MAX:-4500}
THERMOS_STEPS=${THERMOS_STEPS:-30}
COMMON="--num_workers 2 --log_every 50 --tb_every 1000000"

EXTRA_ARGS="$COMMON --max_steps 300 --eval_steps 100 300 --save_steps 300
    --strategy.refine_start_iter 60 --strategy.refine_stop_iter 240
    --strategy.refine_every 30 --strategy.reset_every 150"
train_scenes default "$RESULT_DIR/default" builtin

EXTRA_ARGS="$COMMON --max_steps 200 --eval_steps 200 --save_steps 200
    --strategy.refine_start_iter 40 --strategy.refine_stop_iter 160
    --strategy.refine_every 20 --strategy.cap_max $CAP_MAX"
train_scenes mcmc "$RESULT_DIR/mcmc" builtin

if [ -d "$SCENE_DIR/thermos/sparse" ]; then
    EXTRA_ARGS="$COMMON --max_steps $THERMOS_STEPS --eval_steps $THERMOS_STEPS --save_steps $THERMOS_STEPS"
    train_scenes default "$RESULT_DIR/default" thermos
else
    echo "=== skipping thermos: $SCENE_DIR/thermos not found (set SCENE_DIR to the folder holding it)"
fi

NOTE="CPU smoke run: $NGPU gloo processes on a $(nproc)-core machine, torch backend, no GPU. \
Short explicit schedules (builtin: 300 steps default / 200 steps MCMC with densification; \
thermos: $THERMOS_STEPS steps at data_factor $DATA_FACTOR, no densification yet), STEPS_SCALER=$STEPS_SCALER. \
The quality numbers only show that the pipeline trains end to end; times are CPU times. \
mem is the peak RSS of each rank process (GiB)."
BENCH_COMMAND="NGPU=$NGPU DATA_FACTOR=$DATA_FACTOR STEPS_SCALER=$STEPS_SCALER CAP_MAX=$CAP_MAX THERMOS_STEPS=$THERMOS_STEPS bash benchmarks/cpu_smoke.sh" \
python "$REPO_ROOT/benchmarks/summarize.py" "${RUN_DIRS[@]}" \
    --title "cpu smoke, $NGPU ranks (CPU, gloo)" --json cpu_smoke --note "$NOTE" || FAILED=1
exit $FAILED
