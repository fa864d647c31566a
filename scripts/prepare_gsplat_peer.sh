#!/usr/bin/env bash
# Rebuilds .gsplat_peer/ (git-ignored, never committed): gsplat 1.5.3's own
# examples/simple_trainer.py and what it imports that the GPU machine lacks, so that
# benchmarks/gsplat_peer.py can run it there as the PEER reference (issue 14). Made on a
# machine WITHOUT a GPU, from the public sources at the pins below:
#   examples/   gsplat v1.5.3: simple_trainer.py utils.py gsplat_viewer.py datasets/{colmap,normalize,traj}.py
#   site/pycolmap   rmbrualla/pycolmap @ cc7ea4b (examples/requirements.txt's pin), pure Python;
#                   ONE edit for numpy >= 2 (the GPU machine has numpy 2.5): `np.uint64(-1)` raises
#                   OverflowError there; it becomes np.uint64(np.iinfo(np.uint64).max), the
#                   value numpy 1 wrapped -1 to
#   site/nerfview   nerfstudio-project/nerfview @ 4538024 (the pin), pure Python
#   site/splines    splines 0.3.3 from PyPI (nerfview imports it; unpinned upstream), pure Python
#   site/fused_ssim + fused_ssim_cuda*.so   rahul-goel/fused-ssim @ 328dc98 (the pin), built
#                   here for sm_90 only with nvcc and CPython 3.12 + torch 2.11.0+cu130 from the
#                   cache site (gpu_prepare.sh MAKE_TORCH312_SITE=1), upstream's nvcc flags
#   BUILD.json      origins, commits, edits, sha256 of every file
# Idempotent: nothing is rebuilt when BUILD.json matches this script and the pins.
#
# Where the four git sources come from, for each: a local git repository you name (a clone,
# bare or not, holding the pinned commit: GSPLAT_SRC, PYCOLMAP_SRC, NERFVIEW_SRC, FUSED_SSIM_SRC),
# else the pinned commit alone is fetched from GitHub ($GITHUB/<owner>/<name>) into
# $DISTSPLAT_CACHE/sources/ (once; later runs need no network). Offline and without the variable,
# the script stops naming both ways. E.g. on a machine without internet:
#   git clone https://github.com/nerfstudio-project/gsplat /data/src/gsplat    # where you have internet
#   GSPLAT_SRC=/data/src/gsplat PYCOLMAP_SRC=... NERFVIEW_SRC=... FUSED_SSIM_SRC=... scripts/prepare_gsplat_peer.sh
#
#   scripts/prepare_gsplat_peer.sh                  # the build
#   scripts/prepare_gsplat_peer.sh --check-sources  # only: resolve (fetch) the four sources, list every one missing
#
# Environment (defaults): OUT_DIR (<repo>/.gsplat_peer), GSPLAT_SRC / PYCOLMAP_SRC / NERFVIEW_SRC /
# FUSED_SSIM_SRC (unset: fetched), GITHUB (https://github.com), DISTSPLAT_CACHE ($HOME/.cache/distsplat),
# PY312 (the prefix of the `python3.12` on PATH; e.g. `pyenv prefix 3.12.1`),
# TORCH_SITE ($DISTSPLAT_CACHE/py312-torch-site), CUDA_HOME (/usr/local/cuda), FORCE (0).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${OUT_DIR:-$REPO_ROOT/.gsplat_peer}"
CACHE="${DISTSPLAT_CACHE:-$HOME/.cache/distsplat}"
GITHUB="${GITHUB:-https://github.com}"
py312_prefix() { command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys; print(sys.base_prefix)' 2>/dev/null || true; }
PY312="${PY312:-$(py312_prefix)}"
TORCH_SITE="${TORCH_SITE:-$CACHE/py312-torch-site}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

GSPLAT_REF=v1.5.3
PYCOLMAP_REF=cc7ea4b7301720ac29287dbe450952511b32125e
NERFVIEW_REF=4538024fe0d15fd1a0e4d760f3695fc44ca72787
FUSED_SSIM_REF=328dc9836f513d00c4b5bc38fe30478b4435cbb5
SPLINES_VERSION=0.3.3  # examples/requirements.txt leaves it unpinned; the newest on PyPI today
EXAMPLE_FILES=(examples/simple_trainer.py examples/utils.py examples/gsplat_viewer.py
               examples/datasets/colmap.py examples/datasets/normalize.py examples/datasets/traj.py)

die() { echo "prepare_gsplat_peer.sh: $*" >&2; exit 1; }
# source_git VAR OWNER/NAME REF: prints a git directory holding REF: $VAR when set (it must hold
# REF), else a bare repository in the cache, REF fetched into it from GitHub when missing. On
# failure: the reason, with both ways to supply the source, on stderr, and status 1.
source_git() {
    local var=$1 repo=$2 ref=$3 given=${!1:-} d spec
    if [ -n "$given" ]; then
        if git -C "$given" rev-parse -q --verify "$ref^{commit}" >/dev/null 2>&1; then echo "$given"; return 0; fi
        echo "$var=$given is not a git repository holding $repo at $ref: name a clone of $GITHUB/$repo that has it, or unset $var to fetch it from there" >&2
        return 1
    fi
    d="$CACHE/sources/${repo/\//+}.git"
    if ! git -C "$d" rev-parse -q --verify "$ref^{commit}" >/dev/null 2>&1; then
        mkdir -p "$CACHE/sources"
        [ -d "$d" ] || git init -q --bare "$d"
        spec="$ref:refs/pins/$ref"  # a commit: kept under a ref, so no gc drops it
        [[ $ref =~ ^[0-9a-f]{40}$ ]] || spec="refs/tags/$ref:refs/tags/$ref"
        if ! git -C "$d" fetch -q --depth 1 "$GITHUB/$repo" "$spec" >"$d/fetch.log" 2>&1 \
           || ! git -C "$d" rev-parse -q --verify "$ref^{commit}" >/dev/null 2>&1; then
            echo "$repo at $ref: could not fetch it from $GITHUB/$repo ($(grep -v '^$' "$d/fetch.log" | tail -n 1)); with no internet here, clone it where there is one and pass the clone: $var=/path/to/${repo#*/}" >&2
            return 1
        fi
    fi
    echo "$d"
}
SOURCE_VARS=(GSPLAT_SRC PYCOLMAP_SRC NERFVIEW_SRC FUSED_SSIM_SRC)
SOURCE_REPOS=(nerfstudio-project/gsplat rmbrualla/pycolmap nerfstudio-project/nerfview rahul-goel/fused-ssim)
SOURCE_REFS=("$GSPLAT_REF" "$PYCOLMAP_REF" "$NERFVIEW_REF" "$FUSED_SSIM_REF")
SOURCE_GITS=()
problems=0
for i in "${!SOURCE_VARS[@]}"; do
    SOURCE_GITS+=("$(source_git "${SOURCE_VARS[$i]}" "${SOURCE_REPOS[$i]}" "${SOURCE_REFS[$i]}")") || problems=$((problems + 1))
done
[ "$problems" = 0 ] || die "$problems of the ${#SOURCE_VARS[@]} sources are not available (above)"
GSPLAT_GIT=${SOURCE_GITS[0]} PYCOLMAP_GIT=${SOURCE_GITS[1]} NERFVIEW_GIT=${SOURCE_GITS[2]} FUSED_SSIM_GIT=${SOURCE_GITS[3]}
if [ "${1:-}" = --check-sources ]; then
    for i in "${!SOURCE_VARS[@]}"; do echo "== ${SOURCE_REPOS[$i]} @ ${SOURCE_REFS[$i]:0:12}: ${SOURCE_GITS[$i]}"; done
    exit 0
fi
[ -z "${1:-}" ] || die "unknown argument '$1' (none or --check-sources)"
[ -n "$PY312" ] && [ -x "$PY312/bin/python3.12" ] || die "no CPython 3.12 at '$PY312': set PY312 to its prefix (e.g. PY312=\$(pyenv prefix 3.12.1)), or put python3.12 on PATH"
[ -d "$TORCH_SITE/torch" ] || die "no torch for Python 3.12 at $TORCH_SITE: run scripts/gpu_prepare.sh (MAKE_TORCH312_SITE=1, its default, makes it)"
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc at $CUDA_HOME/bin/nvcc (set CUDA_HOME)"

# What the build depends on: this script and the pins. Same key -> nothing to do.
KEY=$(cat "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
if [ "${FORCE:-0}" != 1 ] && [ -f "$OUT_DIR/BUILD.json" ] \
   && grep -q "\"builder_key\": \"$KEY\"" "$OUT_DIR/BUILD.json" \
   && ls "$OUT_DIR"/site/fused_ssim_cuda*.so >/dev/null 2>&1; then
    echo "== $OUT_DIR is current (builder_key $KEY)"
    exit 0
fi

TMP=$(mktemp -d /tmp/gsplat_peer_build.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
NEW="$TMP/out"
mkdir -p "$NEW/site"

echo "== gsplat $GSPLAT_REF examples"
git -C "$GSPLAT_GIT" archive "$GSPLAT_REF" "${EXAMPLE_FILES[@]}" 2>"$TMP/archive.err" | tar -x -C "$NEW" \
    || { cat "$TMP/archive.err"; die "git archive of gsplat $GSPLAT_REF failed"; }
GSPLAT_COMMIT=$(git -C "$GSPLAT_GIT" rev-parse "$GSPLAT_REF^{commit}")

echo "== pycolmap @ ${PYCOLMAP_REF:0:7}"
git -C "$PYCOLMAP_GIT" archive "$PYCOLMAP_REF" pycolmap LICENSE.txt | tar -x -C "$NEW/site"
mv "$NEW/site/LICENSE.txt" "$NEW/site/pycolmap/LICENSE.txt"
SM="$NEW/site/pycolmap/scene_manager.py"
OLD_LINE='    INVALID_POINT3D = np.uint64(-1)'
NEW_LINE='    INVALID_POINT3D = np.uint64(np.iinfo(np.uint64).max)  # distsplat peer build: was np.uint64(-1), an OverflowError on numpy >= 2'
[ "$(grep -cxF "$OLD_LINE" "$SM")" = 1 ] || die "$SM: the line to edit ($OLD_LINE) is not there exactly once"
OLD_LINE="$OLD_LINE" NEW_LINE="$NEW_LINE" python3 - "$SM" <<'EOF'
import os, sys
p = sys.argv[1]
s = open(p).read()
open(p, "w").write(s.replace(os.environ["OLD_LINE"] + "\n", os.environ["NEW_LINE"] + "\n", 1))
EOF
grep -q "iinfo(np.uint64).max" "$SM" || die "edit of $SM failed"

echo "== nerfview @ ${NERFVIEW_REF:0:7}"
git -C "$NERFVIEW_GIT" archive "$NERFVIEW_REF" nerfview | tar -x -C "$NEW/site"

# nerfview's render_panel imports splines (pure Python, needs numpy): the PyPI wheel.
echo "== splines==$SPLINES_VERSION (PyPI wheel, nerfview imports it)"
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"
SPLINES_WHL=$(ls "$WHEELS"/splines-"$SPLINES_VERSION"-py3-none-any.whl 2>/dev/null | head -1 || true)
if [ -z "$SPLINES_WHL" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" "splines==$SPLINES_VERSION" 2>&1 \
        | grep -v "^WARNING: Location" || true
    SPLINES_WHL=$(ls "$WHEELS"/splines-"$SPLINES_VERSION"-py3-none-any.whl | head -1) || die "could not download splines==$SPLINES_VERSION"
fi
unzip -q -o "$SPLINES_WHL" 'splines/*' -d "$NEW/site"

echo "== fused-ssim @ ${FUSED_SSIM_REF:0:7}: building for sm_90 (CPython 3.12, torch from $TORCH_SITE)"
# Built once per pin in the cache (the compile takes minutes here); the log stays beside it.
SRC="$CACHE/fused-ssim-${FUSED_SSIM_REF:0:7}-sm90"
mkdir -p "$SRC"
git -C "$FUSED_SSIM_GIT" archive "$FUSED_SSIM_REF" ssim.cu ssim.h ext.cpp fused_ssim LICENSE | tar -x -C "$SRC"
# Upstream's setup.py with its nvcc flags; its arch detection (-arch=sm_XY of the GPU present,
# else sm_75/80/89) is replaced by TORCH_CUDA_ARCH_LIST=9.0 (H100/H200; no GPU here).
cat > "$SRC/build.py" <<'EOF'
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="fused_ssim",
    packages=["fused_ssim"],
    ext_modules=[CUDAExtension(name="fused_ssim_cuda", sources=["ssim.cu", "ext.cpp"],
                               extra_compile_args={"cxx": ["-O3"],
                                                   "nvcc": ["-O3", "--maxrregcount=32", "--use_fast_math"]})],
    cmdclass={"build_ext": BuildExtension},
    script_args=["build_ext", "--inplace"],
)
EOF
[ -f "$SRC/.built" ] && ls "$SRC"/fused_ssim_cuda*.so >/dev/null 2>&1 || ( cd "$SRC" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=1 PYTHONPATH="$TORCH_SITE" nice -n 10 "$PY312/bin/python3.12" build.py ) \
    > "$SRC/build.log" 2>&1 || { tail -n 40 "$SRC/build.log"; die "fused-ssim build failed"; }
SO=$(ls "$SRC"/fused_ssim_cuda*.so | head -1)
strip --strip-unneeded "$SO"
touch "$SRC/.built"
cp "$SO" "$NEW/site/"
cp -r "$SRC/fused_ssim" "$NEW/site/"
cp "$SRC/LICENSE" "$NEW/site/fused_ssim/LICENSE"
ARCHS=$(grep -o "arch=compute_[0-9a-z]*,code=[a-z_0-9]*" "$SRC/build.log" | sort -u | tr '\n' ' ')
[ "$ARCHS" = "arch=compute_90,code=sm_90 " ] || die "the fused-ssim build targeted '$ARCHS', not only sm_90 (see its nvcc line)"
# Importing needs torch's libraries, not a GPU.
PYTHONPATH="$NEW/site:$TORCH_SITE" "$PY312/bin/python3.12" -c "import fused_ssim, fused_ssim_cuda; print('   fused_ssim imports on Python 3.12:', fused_ssim_cuda.__file__.rsplit('/', 1)[-1])" \
    || die "the built fused_ssim does not import"

# Provenance.
KEY="$KEY" GSPLAT_COMMIT="$GSPLAT_COMMIT" GSPLAT_REF="$GSPLAT_REF" PYCOLMAP_REF="$PYCOLMAP_REF" \
NERFVIEW_REF="$NERFVIEW_REF" SPLINES_VERSION="$SPLINES_VERSION" FUSED_SSIM_REF="$FUSED_SSIM_REF" NVCC="$("$CUDA_HOME/bin/nvcc" --version | tail -1)" \
TORCH_VERSION="$(PYTHONPATH="$TORCH_SITE" "$PY312/bin/python3.12" -c 'import torch; print(torch.__version__)')" \
python3 - "$NEW" <<'EOF'
import datetime, hashlib, json, os, pathlib, sys
root = pathlib.Path(sys.argv[1])
e = os.environ
info = {
    "what": "gsplat 1.5.3's examples/simple_trainer.py and its missing deps, run as a peer by benchmarks/gsplat_peer.py",
    "builder": "scripts/prepare_gsplat_peer.sh", "builder_key": e["KEY"],
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "sources": {
        "examples": {"repo": "github:nerfstudio-project/gsplat", "ref": e["GSPLAT_REF"], "commit": e["GSPLAT_COMMIT"]},
        "pycolmap": {"repo": "github:rmbrualla/pycolmap", "commit": e["PYCOLMAP_REF"],
                     "edits": ["scene_manager.py: INVALID_POINT3D = np.uint64(-1) -> np.uint64(np.iinfo(np.uint64).max) "
                               "(numpy >= 2 raises OverflowError on the former; same value as numpy 1 gave)"]},
        "nerfview": {"repo": "github:nerfstudio-project/nerfview", "commit": e["NERFVIEW_REF"]},
        "splines": {"pypi": "splines==" + e["SPLINES_VERSION"]},
        "fused_ssim": {"repo": "github:rahul-goel/fused-ssim", "commit": e["FUSED_SSIM_REF"],
                       "build": {"arch": "TORCH_CUDA_ARCH_LIST=9.0", "nvcc_flags": ["-O3", "--maxrregcount=32", "--use_fast_math"],
                                 "nvcc": e["NVCC"], "python": "cpython-312", "torch": e["TORCH_VERSION"]}},
    },
    "files": {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted(root.rglob("*")) if p.is_file()},
}
(root / "BUILD.json").write_text(json.dumps(info, indent=2) + "\n")
EOF
rm -rf "$OUT_DIR.old"
[ -d "$OUT_DIR" ] && mv "$OUT_DIR" "$OUT_DIR.old"
mv "$NEW" "$OUT_DIR"
rm -rf "$OUT_DIR.old"
echo "== $OUT_DIR ready: $(du -sh "$OUT_DIR" | cut -f1)"
