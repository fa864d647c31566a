# Shared by basic_4gpus.sh, mcmc_4gpus.sh and cpu_smoke.sh (source it; not a script).
#
# train_scenes STRATEGY OUT_DIR SCENE...   trains each scene with
#     torchrun --standalone --nproc_per_node=$NGPU examples/simple_trainer.py STRATEGY ...
# into OUT_DIR/SCENE, and appends each run dir to the RUN_DIRS array for summarize.py.
# The scene `builtin` is the trainer's built-in synthetic scene (no --data_dir); any other
# name is read from $SCENE_DIR/NAME with --data_factor $DATA_FACTOR. A scene that fails
# is reported (its row in the summary says so) and the loop goes on.
#
# Environment: NGPU, SCENE_DIR, DATA_FACTOR, STEPS_SCALER, EXTRA_ARGS (more trainer flags,
# word-split), TORCHRUN (default: torchrun). Nothing here depends on the device: torchrun
# starts NGPU processes, and the trainer picks nccl on GPUs and gloo on CPU.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
RUN_DIRS=()
FAILED=0

train_scenes() {
    local strategy="$1" out="$2"
    shift 2
    local scene run data_args start end rc
    # On a GPU, load (prebuilt, $DISTSPLAT_GSPLAT_EXT) or JIT-build gsplat's CUDA ops once here,
    # so the torchrun ranks below find them instead of compiling concurrently.
    if python3 -c 'import torch; print(torch.cuda.is_available())' 2>/dev/null | grep -qx True; then
        python3 -m distsplat.render.gsplat_ext || { echo "=== gsplat's CUDA ops unavailable; not training"; FAILED=1; return 1; }
    fi
    for scene in "$@"; do
        run="$out/$scene"
        if [ "$scene" = "builtin" ]; then
            data_args=()
        else
            data_args=(--data_dir "$SCENE_DIR/$scene" --data_factor "$DATA_FACTOR")
        fi
        mkdir -p "$run"
        echo "=== $strategy / $scene: $NGPU ranks, steps_scaler $STEPS_SCALER -> $run"
        start=$(date +%s.%N)
        # shellcheck disable=SC2086  # EXTRA_ARGS is a list of flags on purpose
        ${TORCHRUN:-torchrun} --standalone --nproc_per_node="$NGPU" "$REPO_ROOT/examples/simple_trainer.py" \
            "$strategy" "${data_args[@]}" --steps_scaler "$STEPS_SCALER" --packed --disable_viewer \
            --result_dir "$run" $EXTRA_ARGS 2>&1 | tee "$run/train.log"
        rc=${PIPESTATUS[0]}
        end=$(date +%s.%N)
        awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f\n", b - a }' > "$run/wall_s.txt"
        if [ "$rc" -ne 0 ]; then
            echo "=== $strategy / $scene FAILED (exit $rc); see $run/train.log"
            FAILED=1
        fi
        RUN_DIRS+=("$run")
    done
}
