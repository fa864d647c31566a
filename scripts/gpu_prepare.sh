#!/usr/bin/env bash
# Prepares, on a machine WITHOUT a GPU, everything a GPU machine needs beside the repo for
# scripts/gpu_validate.sh (ours is bare at every start, has no internet, and receives only the
# repo plus the git-ignored folders copied with it, 64 MiB in all):
#   .whl/         wheels the GPU machine's image lacks (cp312, manylinux x86_64, --no-deps)
#   .gpu_data/    what the CUDA tests and GPU benchmarks read (test_garden.npz, thermos)
#   .gsplat_ext/  gsplat's CUDA extension built ahead of time (scripts/build_gsplat_ext.sh)
#   .gsplat_peer/ gsplat's own examples/simple_trainer.py + its deps, run as the peer reference by
#                 benchmarks/gsplat_peer.py (scripts/prepare_gsplat_peer.sh; never committed)
# then checks what travels (check_carry below) and stops, saying why, when the call could not
# run: over 64 MiB, or thermos' full-resolution images (the thermos trainings read them at
# --data_factor 1) or another piece the call needs missing. Idempotent: what is present and
# current is kept.
#
#   DISTSPLAT_DATA=/path/to/data bash scripts/gpu_prepare.sh   # the whole preparation, then the carry check
#   bash scripts/gpu_prepare.sh --check-sources  # only: are the git sources .gsplat_peer is built from available?
#   bash scripts/gpu_prepare.sh --check-carry    # only: the carry check of the folders as they are
#
# The data: DISTSPLAT_DATA, the folder holding test_garden.npz and thermos/ (default: shared/data
# beside the repository checkout, as for the tests). The git sources of .gsplat_peer
# (nerfstudio-project/gsplat, rmbrualla/pycolmap, nerfstudio-project/nerfview,
# rahul-goel/fused-ssim at pinned commits) are fetched from GitHub, or read from local clones
# named by GSPLAT_SRC, PYCOLMAP_SRC, NERFVIEW_SRC, FUSED_SSIM_SRC (scripts/prepare_gsplat_peer.sh);
# the wheels and torch come from PyPI. The whole preparation stops at once, naming what is missing
# and both ways to supply it, when .gsplat_peer must be built and a source is not available.
#
# On the GPU machine, one command from the repository root, with the four folders copied beside
# the repo (scripts/gpu_validate.sh's header has the checks and their budget):
#   bash scripts/gpu_validate.sh     # copy [".whl", ".gpu_data", ".gsplat_ext", ".gsplat_peer"]; ~9 min
#
# Environment (defaults): DISTSPLAT_DATA (<repo>/../shared/data), PY312 (the prefix of the
# `python3.12` on PATH, e.g. `pyenv prefix 3.12.1`; used to build and to test the install),
# SKIP_INSTALL_TEST (0), LIMIT_MIB (64), GSPLAT_SRC / PYCOLMAP_SRC / NERFVIEW_SRC / FUSED_SSIM_SRC
# (unset: fetched from GitHub), NO_BUILD (0: build the extension when missing or stale),
# MAKE_TORCH312_SITE (1: install torch 2.11.0+cu130 for Python 3.12 into the cache, ~2.6 GB once:
# the peer's fused-ssim build and the extension's load test need it; 0: neither runs, and
# .gsplat_peer is not built).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
DATA="${DISTSPLAT_DATA:-$(cd "$REPO_ROOT/.." && pwd)/shared/data}"
py312_prefix() { command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys; print(sys.base_prefix)' 2>/dev/null || true; }
PY312="${PY312:-$(py312_prefix)}"
export PY312
LIMIT_MIB="${LIMIT_MIB:-64}"
CARRY=(.whl .gpu_data .gsplat_ext .gsplat_peer)

die() { echo "gpu_prepare.sh: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
bytes_of() { # total bytes of the files under the given paths (missing ones count 0)
    { find "$@" -type f -printf '%s\n' 2>/dev/null || true; } | awk '{ s += $1 } END { print s + 0 }'
}
# What files weigh in a tar (a 512-byte header each, data in 512-byte blocks): what travels is
# counted so, a little over the bytes, so that a carry judged to fit does fit.
tar_sizes() { awk '{ s += 512 + int(($1 + 511) / 512) * 512 } END { print s + 0 }'; }
tar_bytes_of() { { find "$@" -type f -printf '%s\n' 2>/dev/null || true; } | tar_sizes; }

peer_current() {  # .gsplat_peer made by this prepare_gsplat_peer.sh (its own test of the same)
    local key
    key=$(sha256sum scripts/prepare_gsplat_peer.sh | cut -c1-16)
    [ -f .gsplat_peer/BUILD.json ] && grep -q "\"builder_key\": \"$key\"" .gsplat_peer/BUILD.json \
        && ls .gsplat_peer/site/fused_ssim_cuda*.so >/dev/null 2>&1
}

# ---------------------------------------------------------------------------------------
# The carry check: what one device call needs, and that it travels (64 MiB: the tracked and
# untracked-not-ignored files, shared/ where the checkout has one, the carried folders).
# Stops with every problem listed; never drops anything to make room.
check_carry() {
    local problems=() names n total repo shared=0 d
    # thermos at full resolution (the trainings, --data_factor 1) and halved (count_syncs, images_2)
    if [ -f .gpu_data/thermos/train.txt ] && [ -f .gpu_data/thermos/test.txt ]; then
        names=$(cat .gpu_data/thermos/train.txt .gpu_data/thermos/test.txt | tr -d '\r' | grep -v '^$' || true)
        for d in images images_2; do
            local missing=() total_names=0
            while read -r n; do
                total_names=$((total_names + 1))
                [ -s ".gpu_data/thermos/$d/$n" ] || missing+=("$n")
            done <<< "$names"
            if [ ! -d ".gpu_data/thermos/$d" ]; then
                problems+=("thermos' $([ $d = images ] && echo 'full-resolution images' || echo 'halved images') are not in the carry: .gpu_data/thermos/$d/ is missing (copy $DATA/thermos/$d; the thermos $([ $d = images ] && echo 'trainings read them at --data_factor 1' || echo 'sync count reads them at --data_factor 2'))")
            elif [ ${#missing[@]} -gt 0 ]; then
                problems+=("thermos' $d/ lacks ${#missing[@]} of the $total_names images train.txt and test.txt name (first: ${missing[0]})")
            fi
        done
    else
        problems+=("thermos is not in the carry: .gpu_data/thermos/train.txt or test.txt is missing")
    fi
    for f in .gpu_data/thermos/sparse/0/cameras.bin .gpu_data/thermos/sparse/0/images.bin \
             .gpu_data/thermos/sparse/0/points3D.bin .gpu_data/test_garden.npz .gpu_data/COMMIT \
             .gsplat_ext/build_info.json .gsplat_peer/BUILD.json .gsplat_peer/examples/simple_trainer.py; do
        [ -s "$f" ] || problems+=("$f is missing")
    done
    ls .gsplat_ext/*.so >/dev/null 2>&1 || problems+=(".gsplat_ext has no .so (scripts/build_gsplat_ext.sh)")
    ls .gsplat_peer/site/fused_ssim_cuda*.so >/dev/null 2>&1 \
        || problems+=(".gsplat_peer/site has no fused_ssim_cuda*.so (scripts/prepare_gsplat_peer.sh): without it the call stops at setup")
    ls .whl/gsplat-*.whl >/dev/null 2>&1 || problems+=(".whl has no gsplat wheel")
    # the size
    repo=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | tar_sizes)
    [ -d shared ] && shared=$(tar_bytes_of shared)
    echo "== what travels (limit $LIMIT_MIB MiB; each file counted as in a tar):"
    printf '   %-12s %s\n' "repo" "$(mib "$repo") ($(git ls-files -co --exclude-standard | wc -l) files)"
    [ -d shared ] && printf '   %-12s %s\n' "shared/" "$(mib "$shared")"
    total=$((repo + shared))
    for d in "${CARRY[@]}"; do
        printf '   %-12s %s\n' "$d" "$(mib "$(tar_bytes_of "$d")")"
        total=$((total + $(tar_bytes_of "$d")))
    done
    printf '   %-12s %s (thermos/images: %s)\n' "total" "$(mib "$total")" "$(mib "$(tar_bytes_of .gpu_data/thermos/images)")"
    if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
        problems+=("what travels is $(mib "$total"), over $LIMIT_MIB MiB; thermos' full-resolution images are not dropped to fit (the call's thermos runs need them): make room elsewhere (the largest are listed above)")
    fi
    if [ ${#problems[@]} -gt 0 ]; then
        echo "gpu_prepare.sh: the carry is not ready for the device call:" >&2
        for p in "${problems[@]}"; do echo "  - $p" >&2; done
        return 1
    fi
    echo "== the carry is ready: $(mib $((LIMIT_MIB * 1048576 - total))) to spare; carry [\".whl\", \".gpu_data\", \".gsplat_ext\", \".gsplat_peer\"]"
}

case "${1:-}" in
--check-carry) check_carry; exit $? ;;
--check-sources) exec scripts/prepare_gsplat_peer.sh --check-sources ;;
"") ;;
*) die "unknown argument '$1' (none, --check-carry or --check-sources)" ;;
esac
# Fail fast, before any download: .gsplat_peer needs building and its sources are not available.
if [ "${NO_BUILD:-0}" != 1 ] && [ "${MAKE_TORCH312_SITE:-1}" = 1 ] && ! peer_current; then
    scripts/prepare_gsplat_peer.sh --check-sources >/dev/null \
        || die ".gsplat_peer must be built and its sources are not available (above)"
fi

# ---------------------------------------------------------------------------------------
# 1. Wheels. The GPU machine's image has torch 2.11, numpy,
#    scipy, pillow, tqdm, rich, requests, imageio, jaxtyping, ninja, pytest, matplotlib.
#    Missing: gsplat and what tyro, viser and plyfile need (checked with
#    `unzip -p W '*/METADATA' | grep ^Requires-Dist`). Versions are the ones the CPU CI
#    machine runs. Left out: pycolmap and selenium (dev extras; their tests skip without
#    them and need no GPU).
WHEELS=(
    gsplat==1.5.3               # needs jaxtyping, ninja, numpy, rich, torch: on the device
    tyro==1.0.17                # needs docstring-parser, typeguard, typing-extensions
    docstring-parser==0.18.0
    typeguard==4.6.0            # needs typing-extensions
    typing-extensions==4.15.0   # typeguard 4.6 / tyro 1.0 want a recent one; the device's version is unknown
    viser==1.1.1                # needs imageio numpy requests rich tqdm (device) + msgspec trimesh websockets zstandard
    msgspec==0.22.0
    trimesh==5.2.0              # needs numpy
    websockets==16.1.1
    zstandard==0.25.0
    plyfile==1.1.5              # needs numpy
)
PIP_DL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p .whl
wanted_files=()
for spec in "${WHEELS[@]}"; do
    name=${spec%%==*}; ver=${spec##*==}
    norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
    have=$(find .whl -maxdepth 1 -iname "${norm}-${ver}-*.whl" | head -1)
    if [ -z "$have" ]; then
        echo "== downloading $spec"
        "${PIP_DL[@]}" -d .whl "$spec" 2>&1 | grep -v "^WARNING: Location" || true
        have=$(find .whl -maxdepth 1 -iname "${norm}-${ver}-*.whl" | head -1)
        [ -n "$have" ] || die "no cp312 manylinux x86_64 wheel found for $spec"
    fi
    wanted_files+=("$(basename "$have")")
done
# One version of each: any other wheel in .whl would make the device's install fail.
for f in .whl/*.whl; do
    keep=0
    for w in "${wanted_files[@]}"; do [ "$(basename "$f")" = "$w" ] && keep=1; done
    if [ $keep = 0 ]; then echo "== removing $f (not in the list)"; rm -f "$f"; fi
done

# ---------------------------------------------------------------------------------------
# 2. Data: test_garden.npz (tests/cuda) and the thermos scene (GPU benchmarks).
for f in test_garden.npz thermos; do
    [ -e "$DATA/$f" ] || die "$DATA/$f not found: set DISTSPLAT_DATA to the folder holding test_garden.npz and thermos/"
done
mkdir -p .gpu_data/thermos
if [ "$(realpath "$DATA")" != "$(realpath .gpu_data)" ]; then  # (DISTSPLAT_DATA=.gpu_data: already there)
    cp -u "$DATA"/test_garden.* .gpu_data/
    # The full-resolution and halved images (--data_factor 1 and 2), the COLMAP model, the split lists.
    for p in images images_2 sparse train.txt test.txt SOURCE.md; do
        cp -ru "$DATA/thermos/$p" .gpu_data/thermos/
    done
fi
# The commit the results will be credited to (scripts/gpu_validate.sh reads it; .git does
# not travel). "-dirty" when the working tree has uncommitted changes.
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD 2>/dev/null || echo -dirty)" > .gpu_data/COMMIT

# ---------------------------------------------------------------------------------------
# 3. gsplat's extension, rebuilt when missing or stale (other torch/gsplat, changed builder,
#    a .so that no longer matches its sha256).
ext_current() {
    python3 - <<'EOF'
import hashlib, json, pathlib, sys
d = pathlib.Path(".gsplat_ext")
try:
    info = json.loads((d / "build_info.json").read_text())
    so = d / info["file"]
    ok = (info["torch_version"] == "2.11.0+cu130" and info["gsplat_version"] == "1.5.3"
          and hashlib.sha256(so.read_bytes()).hexdigest() == info["sha256"])
    builder = hashlib.sha256(b"".join(pathlib.Path(p).read_bytes() for p in
                            ("scripts/build_gsplat_ext.sh", "scripts/build_gsplat_ext.py"))).hexdigest()
    ok = ok and info.get("builder_sha256") == builder
except (OSError, KeyError, ValueError):
    ok = False
sys.exit(0 if ok else 1)
EOF
}
if ext_current; then
    echo "== .gsplat_ext is current ($(python3 -c 'import json; print(json.load(open(".gsplat_ext/build_info.json"))["file"])'))"
elif [ "${NO_BUILD:-0}" = 1 ]; then
    echo "== .gsplat_ext missing or stale; NO_BUILD=1: not building"
else
    echo "== building gsplat's CUDA extension (scripts/build_gsplat_ext.sh, JOBS files at once: 4.6 min with 2 here)"
    scripts/build_gsplat_ext.sh
fi

# ---------------------------------------------------------------------------------------
# 3a. MAKE_TORCH312_SITE=1 (the default): torch 2.11.0+cu130 for CPython 3.12 in the cache
#     (importing it needs no GPU), which the peer's fused-ssim build (3b) and the load test (5) use.
torch_site="${DISTSPLAT_CACHE:-$HOME/.cache/distsplat}/py312-torch-site"
if [ "${MAKE_TORCH312_SITE:-1}" = 1 ] && [ "${NO_BUILD:-0}" != 1 ] && [ ! -d "$torch_site/torch" ] \
   && [ -x "$PY312/bin/python3.12" ]; then
    echo "== installing torch==2.11.0 and its CUDA libraries for Python 3.12 into $torch_site (~2.6 GB)"
    "$PY312/bin/python3.12" -m pip install -q --no-cache-dir --no-compile --target "$torch_site" torch==2.11.0 2>&1 \
        | grep -v "^WARNING: Location\|WARNING: Running pip as\|pip version\|pip install --upgrade" || true
    [ -d "$torch_site/torch" ] || die "could not install torch==2.11.0 for Python 3.12 into $torch_site"
fi

# ---------------------------------------------------------------------------------------
# 3b. gsplat's own trainer as the peer reference (issue 14), rebuilt when missing or stale
#     (the script is idempotent; it needs the git sources of gsplat, the pycolmap fork,
#     nerfview and fused-ssim, and the Python 3.12 torch site).
if [ "${NO_BUILD:-0}" = 1 ]; then
    [ -f .gsplat_peer/BUILD.json ] || echo "== .gsplat_peer missing; NO_BUILD=1: not building (benchmarks/gsplat_peer.py cannot run)"
elif [ ! -d "$torch_site/torch" ]; then
    echo "== .gsplat_peer not built: no Python 3.12 torch at $torch_site (MAKE_TORCH312_SITE=0); gsplat_peer.py and the fused-ssim tests cannot run"
else
    OUT_DIR="$REPO_ROOT/.gsplat_peer" scripts/prepare_gsplat_peer.sh 2>&1 | grep -v "UserWarning: Failed to initialize NumPy\|_conversion_method_template" \
        || die "scripts/prepare_gsplat_peer.sh failed"
fi

# ---------------------------------------------------------------------------------------
# 4. What travels, and that the call has what it needs (check_carry above): stops here if not.
check_carry || exit 1

# ---------------------------------------------------------------------------------------
# 5. The device's install command, tried here with CPython 3.12 (everything but torch).
# Stand-ins for what the GPU machine's image already has (never carried), so that viser, tyro
# and plyfile import here as they will there.
STAND_INS=(numpy==2.4.6 rich==14.3.4 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.20.0 requests==2.34.2
           urllib3==2.7.0 idna==3.13 certifi==2026.5.20 charset-normalizer==3.4.7 imageio==2.38.1
           pillow==13.0.0 tqdm==4.70.1 jaxtyping==0.3.11 wadler-lindig==0.1.8)
if [ "${SKIP_INSTALL_TEST:-0}" != 1 ] && [ -x "$PY312/bin/python3.12" ]; then
    cache="${DISTSPLAT_CACHE:-$HOME/.cache/distsplat}/device-stand-ins"
    mkdir -p "$cache"
    if [ ! -f "$cache/.done-${#STAND_INS[@]}" ]; then
        "${PIP_DL[@]}" -d "$cache" "${STAND_INS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
        touch "$cache/.done-${#STAND_INS[@]}"
    fi
    site=$(mktemp -d /tmp/gpu_prepare_site.XXXXXX)
    quiet() { grep -v "^WARNING: Location\|WARNING: Running pip as\|pip version\|pip install --upgrade" || true; }
    "$PY312/bin/python3.12" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        "$cache"/*.whl 2>&1 | quiet
    # The device's own command, unchanged.
    "$PY312/bin/python3.12" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl 2>&1 | quiet
    PYTHONPATH="$site" "$PY312/bin/python3.12" -c "
import tyro, viser, plyfile, trimesh, websockets, zstandard, msgspec
print('   imports on Python 3.12 from the carried wheels: tyro', tyro.__version__, 'viser', viser.__version__,
      'plyfile trimesh websockets zstandard msgspec')" || die "the carried wheels do not import on Python 3.12"
    # With a CPython 3.12 torch 2.11.0+cu130 (importing it needs no GPU): gsplat imports, and
    # the prebuilt extension loads through distsplat's gsplat_ext as on the device
    # (scripts/load_test_gsplat_ext.py; recorded in benchmarks/results/gsplat_compile_sm90.json).
    if [ -d "$torch_site/torch" ] && [ -f .gsplat_ext/build_info.json ]; then
        PYTHONPATH="$site:$torch_site:$REPO_ROOT" "$PY312/bin/python3.12" -c "import gsplat; print('   gsplat', gsplat.__version__, 'imports on Python 3.12')" \
            || die "gsplat does not import on Python 3.12 from the carried wheels"
        PYTHONPATH="$site:$torch_site:$REPO_ROOT" "$PY312/bin/python3.12" scripts/load_test_gsplat_ext.py --if-needed > /tmp/gpu_prepare_load_test.log 2>&1 \
            && echo "   the prebuilt extension loads on Python 3.12 + torch 2.11.0+cu130: $(tail -n 1 /tmp/gpu_prepare_load_test.log | cut -c1-60)..." \
            || { cat /tmp/gpu_prepare_load_test.log; die "the prebuilt extension did not load (see above)"; }
    else
        echo "   (no Python 3.12 torch at $torch_site: gsplat import and the extension's load test skipped; MAKE_TORCH312_SITE=1, the default, makes one)"
    fi
    rm -rf "$site"
fi
echo "== ready. On the GPU machine, from the repository root with .whl .gpu_data .gsplat_ext .gsplat_peer"
echo "   copied beside it: bash scripts/gpu_validate.sh (about 9 minutes)"
