#!/usr/bin/env bash
# gsplat's MCMC benchmark for distsplat on NGPU ranks: MCMC densification up to CAP_MAX
# Gaussians in total (split across ranks), then ONE summary table
# (PSNR / SSIM / time / num_GS / memory per rank) from R/stats/*.json.
#
#   SCENE_DIR=data/360_v2 bash benchmarks/mcmc_4gpus.sh
#
# Environment (defaults): NGPU (4), SCENE_DIR (data/360_v2), SCENE_LIST (the 7 public
# Mip-NeRF 360 scenes), DATA_FACTOR (4), RESULT_DIR (results/benchmark_mcmc_4gpus),
# CAP_MAX (1000000), STEPS_SCALER (1/NGPU), EXTRA_ARGS (more trainer flags).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

NGPU=${NGPU:-4}
SCENE_DIR=${SCENE_DIR:-data/360_v2}
SCENE_LIST=${SCENE_LIST:-"garden bicycle stump bonsai counter kitchen room"}
DATA_FACTOR=${DATA_FACTOR:-4}
RESULT_DIR=${RESULT_DIR:-results/benchmark_mcmc_4gpus}
CAP_MAX=${CAP_MAX:-1000000}
STEPS_SCALER=${STEPS_SCALER:-$(awk -v n="$NGPU" 'BEGIN { print 1 / n }')}
EXTRA_ARGS="--strategy.cap_max $CAP_MAX ${EXTRA_ARGS:-}"

# shellcheck disable=SC2086
train_scenes mcmc "$RESULT_DIR" $SCENE_LIST
python "$REPO_ROOT/benchmarks/summarize.py" "${RUN_DIRS[@]}" --title "mcmc ${NGPU} ranks, cap ${CAP_MAX}" || FAILED=1
exit $FAILED
