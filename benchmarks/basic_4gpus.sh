#!/usr/bin/env bash
# gsplat's benchmarks/basic_4gpus.sh for distsplat: default densification, NGPU ranks,
# each scene trained with torchrun and evaluated, then ONE summary table
# (PSNR / SSIM / time / num_GS / memory per rank) from R/stats/*.json.
#
#   SCENE_DIR=data/360_v2 bash benchmarks/basic_4gpus.sh
#   NGPU=8 SCENE_LIST="garden bicycle" DATA_FACTOR=4 bash benchmarks/basic_4gpus.sh
#
# Environment (defaults): NGPU (4), SCENE_DIR (data/360_v2), SCENE_LIST (the 7 public
# Mip-NeRF 360 scenes), DATA_FACTOR (4), RESULT_DIR (results/benchmark_4gpus),
# STEPS_SCALER (1/NGPU: the global batch is NGPU cameras, so the same number of images
# is seen as 30k steps of one camera, as gsplat's 4-GPU script), EXTRA_ARGS (more
# trainer flags). gsplat trains bonsai/counter/kitchen/room at factor 2; run them
# separately with DATA_FACTOR=2 for the same setting.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

NGPU=${NGPU:-4}
SCENE_DIR=${SCENE_DIR:-data/360_v2}
SCENE_LIST=${SCENE_LIST:-"garden bicycle stump bonsai counter kitchen room"}
DATA_FACTOR=${DATA_FACTOR:-4}
RESULT_DIR=${RESULT_DIR:-results/benchmark_4gpus}
STEPS_SCALER=${STEPS_SCALER:-$(awk -v n="$NGPU" 'BEGIN { print 1 / n }')}
EXTRA_ARGS=${EXTRA_ARGS:-}

# shellcheck disable=SC2086
train_scenes default "$RESULT_DIR" $SCENE_LIST
python "$REPO_ROOT/benchmarks/summarize.py" "${RUN_DIRS[@]}" --title "basic ${NGPU} ranks" || FAILED=1
exit $FAILED
