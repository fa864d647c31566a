#!/usr/bin/env bash
# Check `setup` of scripts/gpu_validate.sh (which runs it under the check's limit, from the
# repository root): the carried folders are there, the carried wheels install into /tmp/site,
# fused-ssim's sm_90 build is put beside them, the versions go to logs/env.txt, and
# scripts/gpu_setup_check.py checks the GPU, fused-ssim and gsplat's prebuilt ops (no JIT).
# Every failure is one line "setup: FAIL <what>: <why>" and a non-zero exit.
# Environment (from gpu_validate.sh): GPU_VALIDATE_PY, GPU_VALIDATE_MACHINE, GPU_VALIDATE_LOGS,
# GPU_VALIDATE_DRY_RUN.
set -uo pipefail
PY="${GPU_VALIDATE_PY:-python3}"
LOGS="${GPU_VALIDATE_LOGS:-/tmp}"
if [ "${GPU_VALIDATE_DRY_RUN:-0}" != 1 ]; then
    for d in .whl .gpu_data .gsplat_ext .gsplat_peer; do
        [ -d "$d" ] || { echo "setup: FAIL carry: $d is missing: the call must carry .whl .gpu_data .gsplat_ext .gsplat_peer (scripts/gpu_prepare.sh makes them)"; exit 1; }
    done
    [ -d .gpu_data/thermos/images ] || { echo "setup: FAIL carry: .gpu_data/thermos/images (full resolution) is missing"; exit 1; }
    if ! "$PY" -c "import tyro, viser, gsplat, plyfile" 2>/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            || { echo "setup: FAIL wheels: the carried .whl/*.whl did not install into /tmp/site"; exit 1; }
    fi
    echo "setup: ok wheels (tyro, viser, gsplat, plyfile import)"
    # fused-ssim: the sm_90 build in .gsplat_peer/site (scripts/prepare_gsplat_peer.sh), when none is installed
    if ! "$PY" -c "import fused_ssim" 2>/dev/null && ls .gsplat_peer/site/fused_ssim_cuda*.so >/dev/null 2>&1; then
        mkdir -p /tmp/site && cp -r .gsplat_peer/site/fused_ssim .gsplat_peer/site/fused_ssim_cuda*.so /tmp/site/
    fi
    { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
      "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|gsplat|numpy|tyro|viser|pytest-timeout) '
    } >> "$LOGS/env.txt" 2>&1
fi
exec "$PY" scripts/gpu_setup_check.py "${GPU_VALIDATE_MACHINE:-/tmp/machine.json}"
