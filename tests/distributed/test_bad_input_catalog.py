"""The bad-input catalog (issue 9): the real CLI under torchrun with 2 CPU ranks, fed one
broken input at a time (data, config, checkpoints, result dir, viewer port).

Every case must end within 60 s with a non-zero exit and one `distsplat: error...` line
on stderr that names the file or flag and what to do, from rank 0 (`distsplat: error:`)
or naming the failing rank (`rank 1`); no Python traceback (aside from torchrun's own
ChildFailedError summary, and a collective failing on a rank whose peer, the one that
reported the error, has exited); and the result dir exactly as it was (a stats file and,
for checkpoint cases, a checkpoint folder are there before the run; nothing changes,
nothing appears; an error found mid-training may leave what setup wrote, cfg.yml, cameras.json,
transform.json and tb/).

Scenes are tiny (12 cameras of 32x24): a good COLMAP and a good Blender scene are built
once per module and copied into each case's own folder, where the case breaks them. The
cases' runs are started ahead, two at a time (`launched`); each test asserts on its own.

A torchrun launch costs ~10 s of CPU, nearly all of a case refused at setup, so only the
cases in TORCHRUN (one of each way an error reaches the user: the command line, a flag,
data and checkpoints refused by every rank, an error only one rank sees, the result dir, the
viewer) launch torchrun; the others run as one batch on 2 gloo ranks through the CLI's
entry point (catalog_workers.py: the same command line, environment and code, each rank's
stderr, exit code and torchrun error-file line captured), where the test also checks that
both ranks exited with the same code and left the same line for torchrun's summary.
With DISTSPLAT_CATALOG_LOG=path, each case appends {"case", "seconds", "message"} to path
(JSON lines), the observed messages listed in the issue's closing note.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

import numpy as np
import pytest
import torch
from PIL import Image

from distsplat.data import colmap_io, write_blender
from distsplat.data.synthetic import make_synthetic_scene, splat_points
from tests.unit.data_helpers import colmap_to_nerfstudio, scene_to_model
from torchrun_cli import TINY_FLAGS, torchrun

if TYPE_CHECKING:
    from concurrent.futures import Future

pytestmark = pytest.mark.slow

TIME_LIMIT_S = 60.0
COLLECTIVE_TIMEOUT_S = 30  # a rank left waiting in a collective errors out well within the limit
NUM_CAMERAS, WIDTH, HEIGHT = 12, 32, 24  # test_every 8: 10 train + 2 test cameras
BROKEN = "synthetic_00003.jpg"  # a train camera (cameras 0 and 8 are test cameras)
KEEP = {"stats/val_step0001.json": b'{"psnr": 1.0}\n'}  # a result of an earlier run

# Every case runs these; --disable_viewer unless the case is about the viewer.
COMMON = ["--max_steps", "5", "--num_workers", "1", "--prefetch", "1", "--sh_degree", "1",
          "--init_num_pts", "300"]


# ------------------------------------------------------------------ scenes built once

def _scene():
    return make_synthetic_scene(num_cameras=NUM_CAMERAS, num_gaussians=200, width=WIDTH, height=HEIGHT)


def build_colmap(root: Path) -> Path:
    """root/{sparse/0/*.bin, images/*.jpg}: the synthetic scene's points as a COLMAP capture."""
    scene = _scene()
    colmap_io.write_model_bin(scene_to_model(scene), root / "sparse" / "0")
    (root / "images").mkdir(parents=True)
    for i, name in enumerate(scene.names):
        Image.fromarray(splat_points(scene, i)).save(root / "images" / f"{name}.jpg", quality=90)
    return root


def build_blender(root: Path) -> Path:
    """root/{transforms_train.json, transforms_test.json, train/r_i.png, test/r_i.png}."""
    scene = _scene()
    images = [splat_points(scene, i, alpha=True) for i in range(scene.num_cameras)]
    return write_blender(root, scene.camtoworlds, float(scene.Ks[0, 0, 0]), images, scene.train, scene.test)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """The good COLMAP and Blender scenes and a checkpoint of a 2-rank run on the COLMAP
    one (which shows the good scene trains: any failure below is the broken input's)."""
    root = tmp_path_factory.mktemp("catalog")
    colmap, blender = build_colmap(root / "colmap"), build_blender(root / "blender")
    run = root / "good"
    p = torchrun(["default", *COMMON, "--max_steps", "2", "--save_steps", "2", "--eval_steps", "2",
                  "--data_dir", str(colmap), "--data_factor", "1", "--result_dir", str(run),
                  "--disable_viewer"], collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    return {"colmap": colmap, "blender": blender, "ckpt": run / "ckpts" / "step_000002"}


# ------------------------------------------------------------------ a case's workbench

@dataclass
class Bench:
    tmp: Path
    out: Path  # the result dir, holding KEEP before the run
    base: Dict[str, Path]
    viewer: bool = False  # leave the viewer on (the port case)
    started: bool = False  # the error comes mid-training: the run's setup outputs may appear
    port: int = 0  # the port someone else serves on (the port case)

    def colmap(self) -> Path:
        dst = self.tmp / "scene"
        shutil.copytree(self.base["colmap"], dst)
        return dst

    def blender(self) -> Path:
        dst = self.tmp / "scene"
        shutil.copytree(self.base["blender"], dst)
        return dst

    def ckpt(self) -> Path:
        """An existing checkpoint in the result dir (part of what must stay untouched);
        returns its ckpts/ folder."""
        shutil.copytree(self.base["ckpt"], self.out / "ckpts" / self.base["ckpt"].name)
        return self.out / "ckpts"


def colmap_args(scene: Path, *more: str) -> List[str]:
    return ["--data_dir", str(scene), "--data_factor", "1", *more]


def blender_args(scene: Path, *more: str) -> List[str]:
    return ["--data_dir", str(scene), "--init_type", "random", *more]


def edit_model(scene: Path, change: Callable[[colmap_io.Model], None]) -> None:
    model_dir = scene / "sparse" / "0"
    model = colmap_io.read_model(model_dir)
    change(model)
    colmap_io.write_model_bin(model, model_dir)


def image_named(model: colmap_io.Model, name: str) -> colmap_io.Image:
    return next(im for im in model.images.values() if im.name == name)


def cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# ------------------------------------------------------------------ the cases
# Each builds its broken input and returns the CLI arguments (subcommand first, else
# `default`); the expected substring of the error line is the parametrize column.

CASES: Dict[str, tuple] = {}


def case(message: str, *marks):
    def register(build):
        CASES[build.__name__] = (build, message, marks)
        return build
    return register


# What a run that got past setup has written (rank 0, at the end of setup) when an error
# only the owning rank's decode can see ends it: these may appear, nothing else.
STARTED = {"cfg.yml", "tb", "cameras.json", "transform.json"}


# --- images
@case(f"images/{BROKEN} is missing (1 of 12 images missing); restore it, remove it from ")
def missing_image(b: Bench):
    scene = b.colmap()
    (scene / "images" / BROKEN).unlink()
    return colmap_args(scene)


@case(f"images/{BROKEN}: not a readable image")
def garbage_image(b: Bench):
    scene = b.colmap()
    (scene / "images" / BROKEN).write_bytes(np.random.default_rng(0).bytes(2000))
    return colmap_args(scene)


@case(f"images/{BROKEN}: truncated JPEG")
def truncated_jpeg(b: Bench):
    scene = b.colmap()
    cut(scene / "images" / BROKEN)
    return colmap_args(scene)


@case("train/r_3.png: truncated PNG")
def truncated_png(b: Bench):
    scene = b.blender()
    cut(scene / "train" / "r_3.png", 0.8)
    return blender_args(scene)


@case("train/r_3.png: cannot decode image")
def corrupt_png_pixels(b: Bench):
    """Header and trailer intact, pixel data garbage: only a full decode finds it, on the
    rank that owns the camera, at its first use (mid-training)."""
    b.started = True
    scene = b.blender()
    path = scene / "train" / "r_3.png"
    data = bytearray(path.read_bytes())
    at = data.index(b"IDAT")
    n = int.from_bytes(data[at - 4:at], "big")
    data[at + 4:at + 4 + n] = b"\xff" * n
    path.write_bytes(bytes(data))
    return blender_args(scene)


@case("images_2")
def no_images_folder(b: Bench):
    scene = b.colmap()
    shutil.rmtree(scene / "images")
    return ["--data_dir", str(scene), "--data_factor", "2"]


@case(f"images/{BROKEN}: image is 32x32 but its camera is 32x24")
def image_of_wrong_size(b: Bench):
    scene = b.colmap()
    Image.new("RGB", (32, 32)).save(scene / "images" / BROKEN)
    return colmap_args(scene)


# --- COLMAP model
@case("cameras.bin: truncated")
def truncated_cameras_bin(b: Bench):
    scene = b.colmap()
    cut(scene / "sparse" / "0" / "cameras.bin")
    return colmap_args(scene)


@case("images.bin: truncated")
def truncated_images_bin(b: Bench):
    scene = b.colmap()
    cut(scene / "sparse" / "0" / "images.bin")
    return colmap_args(scene)


@case("points3D.bin")
def garbage_points3d(b: Bench):
    scene = b.colmap()
    (scene / "sparse" / "0" / "points3D.bin").write_bytes(np.random.default_rng(1).bytes(5000))
    return colmap_args(scene)


@case("cameras.bin: camera 1 has unknown camera model id 99")
def unknown_camera_model_id(b: Bench):
    scene = b.colmap()
    path = scene / "sparse" / "0" / "cameras.bin"
    data = bytearray(path.read_bytes())
    data[12:16] = struct.pack("<i", 99)  # after the camera count (Q) and the camera id (i)
    path.write_bytes(bytes(data))
    return colmap_args(scene)


@case("cameras.txt:2: camera 1 has unknown camera model 'PINHOLE_X'")
def unknown_camera_model_name(b: Bench):
    scene = b.colmap()
    model_dir = scene / "sparse" / "0"
    colmap_io.write_model_txt(colmap_io.read_model(model_dir), model_dir)
    for f in model_dir.glob("*.bin"):
        f.unlink()
    cams = model_dir / "cameras.txt"
    cams.write_text(cams.read_text().replace(" PINHOLE ", " PINHOLE_X "))
    return colmap_args(scene)


@case("--init_type sfm: the scene has no sparse points")
def empty_point_cloud(b: Bench):
    scene = b.colmap()

    def empty(model):
        model.points = colmap_io.Points(np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), np.zeros(0))
    edit_model(scene, empty)
    return colmap_args(scene, "--init_type", "sfm")


@case(f"images.bin: image '{BROKEN}' has a non-finite pose")
def nan_pose_colmap(b: Bench):
    scene = b.colmap()

    def nan(model):
        image_named(model, BROKEN).tvec[1] = float("nan")
    edit_model(scene, nan)
    return colmap_args(scene)


@case("points3D.bin")
def nan_points(b: Bench):
    scene = b.colmap()

    def nan(model):
        model.points.xyz[5] = (float("nan"), 0.0, float("inf"))
    edit_model(scene, nan)
    return colmap_args(scene)


@case("cameras.bin: camera 1 (PINHOLE) has width 9223372036854775808, outside 1..1048576")
def huge_camera_width(b: Bench):
    """Issue 36: a value the reader took as it came, then an OverflowError in colmap.py."""
    scene = b.colmap()
    path = scene / "sparse" / "0" / "cameras.bin"
    data = bytearray(path.read_bytes())
    data[16:24] = struct.pack("<Q", 2**63)  # after the count (Q), the id and model (ii)
    path.write_bytes(bytes(data))
    return colmap_args(scene)


@case("points3D.bin: 1 of 200 points have coordinates beyond +-1e+10 (first: point 6 at [1e+200, ")
def absurd_points(b: Bench):
    """Issue 36: finite but absurd, then numpy's eigh failing while normalising."""
    scene = b.colmap()

    def far(model):
        model.points.xyz[5, 0] = 1e200
    edit_model(scene, far)
    return colmap_args(scene)


@case("cameras.bin: camera 1 uses model FOV, which distsplat does not support")
def unsupported_camera_model(b: Bench):
    """A model distsplat cannot undistort (issue 16: the distorted ones it can are trained)."""
    scene = b.colmap()

    def fov(model):
        model.cameras[1] = colmap_io.Camera(1, "FOV", WIDTH, HEIGHT, np.array([30.0, 30.0, 16.0, 12.0, 0.1]))
    edit_model(scene, fov)
    return colmap_args(scene)


@case("train/r_3.png: image is 32x32, the others 32x24 (one camera_angle_x describes all frames)")
def blender_mixed_sizes(b: Bench):
    """Mixed image sizes train from COLMAP and nerfstudio captures (issue 16), whose cameras
    carry their own size; a Blender scene's one camera_angle_x cannot describe frames of
    two sizes, so it stays refused."""
    scene = b.blender()
    Image.new("RGBA", (WIDTH, WIDTH), (128, 128, 128, 255)).save(scene / "train" / "r_3.png")
    return blender_args(scene)


# --- nerfstudio
@case("transforms.json: frame 0 has no 'fl_y'")
def nerfstudio_missing_intrinsic(b: Bench):
    ns = colmap_to_nerfstudio(b.colmap(), b.tmp / "ns")
    path = ns / "transforms.json"
    meta = json.loads(path.read_text())
    del meta["fl_y"]
    path.write_text(json.dumps(meta))
    return ["--data_dir", str(ns), "--data_factor", "1"]


@case("transforms.json, or pass --skip_missing_images to train without the missing images")
def nerfstudio_missing_image(b: Bench):
    """A nerfstudio file (it has a camera_model) keeps the error for an absent image, naming
    the file it read; an instant-ngp file would skip the frame, as instant-ngp does."""
    ns = colmap_to_nerfstudio(b.colmap(), b.tmp / "ns")
    (ns / "images" / BROKEN).unlink()
    return ["--data_dir", str(ns), "--data_factor", "1"]


# --- scene discovery
@case("--colmap_dir nope: ")
def colmap_dir_without_model(b: Bench):
    return colmap_args(b.colmap(), "--colmap_dir", "nope")


@case("--data_format transforms: --data_dir ")
def data_format_absent(b: Bench):
    return colmap_args(b.colmap(), "--data_format", "transforms")


# --- Blender
@case("transforms_train.json: malformed JSON")
def blender_invalid_json(b: Bench):
    scene = b.blender()
    path = scene / "transforms_train.json"
    path.write_text(path.read_text()[:-40])
    return blender_args(scene)


@case("transforms_train.json: expected an object with a non-empty 'frames' list")
def blender_no_frames(b: Bench):
    scene = b.blender()
    path = scene / "transforms_train.json"
    meta = json.loads(path.read_text())
    del meta["frames"]
    path.write_text(json.dumps(meta))
    return blender_args(scene)


@case("train/r_3.png is missing")
def blender_missing_image(b: Bench):
    scene = b.blender()
    (scene / "train" / "r_3.png").unlink()
    return blender_args(scene)


@case("transforms_train.json: frame 3 (train/r_3.png) transform_matrix")
def blender_nan_pose(b: Bench):
    scene = b.blender()
    path = scene / "transforms_train.json"
    meta = json.loads(path.read_text())
    meta["frames"][3]["transform_matrix"][0][3] = float("nan")  # json writes NaN, Python reads it
    path.write_text(json.dumps(meta))
    return blender_args(scene)


# --- flags
@case("--backend gsplat", pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"))
def gsplat_without_cuda(b: Bench):
    return colmap_args(b.colmap(), "--backend", "gsplat")


@case("--cache gpu keeps each rank's images in GPU memory, and this machine has no CUDA GPU",
      pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"))
def gpu_cache_without_cuda(b: Bench):
    return colmap_args(b.colmap(), "--cache", "gpu")


@case("initial Gaussians need")
def too_little_memory_for_the_initial_gaussians(b: Bench):
    """10000 Gaussians per rank need ~2.5 MiB at SH degree 1; the limit flag stands in for a small GPU."""
    return colmap_args(b.colmap(), "--init_type", "random", "--init_num_pts", "20000", "--memory_limit_gb", "0.001")


@case("--sh_degree must be in 0..4, got -1")
def negative_sh_degree(b: Bench):
    return colmap_args(b.colmap(), "--sh_degree", "-1")


@case("--data_factor must be >= 1, got 0")
def data_factor_zero(b: Bench):
    return ["--data_dir", str(b.colmap()), "--data_factor", "0"]


@case("--with_ut is a flag of gsplat's trainer that distsplat does not take: 3DGUT (gsplat's unscented-transform projection")
def gsplat_only_flag(b: Bench):
    return [*TINY_FLAGS, "--with_ut"]


@case("--batch_size must be >= 1, got 0")
def batch_size_zero(b: Bench):
    return [*TINY_FLAGS, "--batch_size", "0"]


@case("--batch_size 6")
def batch_larger_than_a_ranks_cameras(b: Bench):
    """10 train cameras on 2 ranks: 5 each, so 6 per rank per step cannot be drawn."""
    return colmap_args(b.colmap(), "--batch_size", "6")


@case("--init_type sfm: the scene has no sparse points; use --init_type random")
def blender_with_sfm_init(b: Bench):
    """An explicit --init_type sfm on a Blender scene, which has no sparse points (auto, the default, goes random)."""
    return ["--data_dir", str(b.blender()), "--init_type", "sfm"]


@case("does not exist")
def data_dir_missing(b: Bench):
    return ["--data_dir", str(b.tmp / "no_such_scene")]


@case("is not a scene: expected a COLMAP capture")
def data_dir_not_a_scene(b: Bench):
    (b.tmp / "photos").mkdir()
    Image.new("RGB", (WIDTH, HEIGHT)).save(b.tmp / "photos" / "a.jpg")
    return ["--data_dir", str(b.tmp / "photos")]


# --- tar shards (--data_shards, issue 20)
def shards_of(b: Bench, scene: Path, cut_image: bool = False, drop: str = "") -> List[str]:
    """The scene's images packed into scene/shards (BROKEN cut, or `drop` left out)."""
    from distsplat.data import pack_shards

    folder = b.tmp / "to_pack"
    shutil.copytree(scene / "images", folder)
    if cut_image:
        cut(folder / BROKEN)
    if drop:
        (folder / drop).unlink()
    pack_shards(folder, scene / "shards", shard_size_mb=0.01)
    return colmap_args(scene, "--data_shards", "shards/index.json")


@case("--data_shards shards/index.json: no shard index at")
def data_shards_missing(b: Bench):
    return colmap_args(b.colmap(), "--data_shards", "shards/index.json")


@case(f"1 of the scene's 12 images are not in the shards: '{BROKEN}'")
def data_shards_lack_an_image(b: Bench):
    return shards_of(b, b.colmap(), drop=BROKEN)


@case(f"{BROKEN} in ")  # found at setup by the one rank that owns it: "NAME in SHARD at offset O: truncated JPEG"
def data_shards_truncated_jpeg(b: Bench):
    return shards_of(b, b.colmap(), cut_image=True)


# --- checkpoints
@case("was written for another scene")
def ckpt_of_another_scene(b: Bench):
    return [*TINY_FLAGS, "--ckpt", str(b.ckpt())]


@case("rank_0000.pt does not match its checksum")
def ckpt_truncated_shard(b: Bench):
    """Rank 0's shard: the rank that reads it finds the damage (rank 0, same W)."""
    ckpts = b.ckpt()
    cut(next(ckpts.iterdir()) / "rank_0000.pt")
    return colmap_args(b.colmap(), "--ckpt", str(ckpts))


@case("rank 1: ")
def ckpt_shard_only_rank1_reads(b: Bench):
    """Rank 1's shard, flipped in the middle: only rank 1 reads it, yet rank 0 must stop
    too, with the same line naming rank 1 (setup's agreement), not wait in a collective."""
    ckpts = b.ckpt()
    shard = next(ckpts.iterdir()) / "rank_0001.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    return colmap_args(b.colmap(), "--ckpt", str(ckpts))


@case("holds colours of SH degree 1, this run asks for --sh_degree 3; pass --sh_degree 1")
def ckpt_of_another_sh_degree(b: Bench):
    return colmap_args(b.colmap(), "--ckpt", str(b.ckpt()), "--sh_degree", "3")


@case("meta.json is truncated or corrupt (not valid JSON); start without --ckpt")
def ckpt_corrupt_meta(b: Bench):
    ckpts = b.ckpt()
    meta = next(ckpts.iterdir()) / "meta.json"
    meta.write_text(meta.read_text()[:100])
    return colmap_args(b.colmap(), "--ckpt", str(ckpts))


@case("no complete checkpoint at")
def ckpt_folder_without_checkpoint(b: Bench):
    b.ckpt()
    (b.tmp / "empty").mkdir()
    return colmap_args(b.colmap(), "--ckpt", str(b.tmp / "empty"))


# --- where results go, and the viewer
@case("--result_dir")
def result_dir_under_a_file(b: Bench):
    """A path through a regular file: not writable, even for root."""
    (b.tmp / "afile").write_text("not a folder\n")
    return [*TINY_FLAGS, "--result_dir", str(b.tmp / "afile" / "run")]


@case("--result_dir", pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                                         reason="root writes into a read-only folder"))
def result_dir_read_only(b: Bench):
    b.out.chmod(0o555)
    return TINY_FLAGS


@case("is already in use; pass a free --port or --disable_viewer")
def viewer_port_in_use(b: Bench):
    b.viewer = True
    return [*(f for f in TINY_FLAGS if f != "--disable_viewer"), "--port", str(b.port)]


# The cases launched under torchrun; the rest run in one batch (run_batch). One case per way
# an error reaches the user through the launcher: the command line (a gsplat flag, refused
# while parsing), an input every rank refuses at setup (a missing image: config checks, data,
# the result dir and most checkpoint errors end the same way), an error only the rank that
# owns a camera sees (at setup in a shard, mid-training in a PNG), checkpoints (rank 0's
# shard; rank 1's, which rank 0 learns of by agreement), a read-only result dir (chmod) and
# the viewer's port (a server in rank 0's process).
TORCHRUN = {"gsplat_only_flag", "missing_image", "corrupt_png_pixels", "data_shards_truncated_jpeg",
            "ckpt_truncated_shard", "ckpt_shard_only_rank1_reads", "result_dir_read_only", "viewer_port_in_use"}


# ------------------------------------------------------------------ the test

def snapshot(root: Path) -> Dict[str, Optional[bytes]]:
    """Every file (with its bytes) and folder under root."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def error_line(stderr: str, message: str) -> Optional[str]:
    """The `distsplat: error` line with the message, rank 0's (or the one naming no rank
    suffix) first."""
    lines = [line for line in stderr.splitlines() if line.startswith("distsplat: error") and message in line]
    lines.sort(key=lambda line: not line.startswith("distsplat: error: "))
    return lines[0] if lines else None


def unexplained_tracebacks(stderr: str) -> List[str]:
    """Python tracebacks in stderr, except torchrun's own (the launcher re-raising the
    failure as ChildFailedError before its summary). A rank whose collective broke because
    the reporter exited prints one line naming it, no traceback (test_rank_failure.py)."""
    lines, found = stderr.splitlines(), []
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        prefix = line[: line.index("Traceback")]  # torch prefixes a rank's uncaught error with "[rankN]: "
        block = [line]
        for later in lines[i + 1:]:
            if prefix and not later.startswith(prefix):
                continue  # another process's line, printed in between
            block.append(later)
            if later[len(prefix):][:1] not in (" ", "\t"):
                break  # the exception line
        if "ChildFailedError" in block[-1]:
            continue
        found.append("\n".join(block))
    return found


def log_case(case_id: str, seconds: float, message: Optional[str]) -> None:
    path = os.environ.get("DISTSPLAT_CATALOG_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"case": case_id, "seconds": round(seconds, 1), "message": message}) + "\n")


@dataclass
class Outcome:
    """One case's run: the bench it broke, the CLI's result, how long it took and the
    result dir before and after; for a batched case, every rank's exit code and the line
    each left for torchrun's summary."""
    bench: Bench
    proc: subprocess.CompletedProcess
    seconds: float
    before: Dict[str, Optional[bytes]]
    after: Dict[str, Optional[bytes]]
    rank_codes: Optional[List[int]] = None
    rank_recorded: Optional[List[Optional[str]]] = None


def prepare(scenes: Dict[str, Path], tmp: Path, build: Callable[[Bench], List[str]]):
    """Builds the case's broken input under tmp: (bench, CLI arguments, listener or None)."""
    out = tmp / "run"
    for rel, data in KEEP.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    b = Bench(tmp, out, scenes)
    listener = None
    if build is viewer_port_in_use:  # someone else serves on the port
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        b.port = listener.getsockname()[1]
    args = build(b)
    if args[:1] not in (["default"], ["mcmc"]):
        args = ["default", *args]
    args = [*args[:1], *COMMON, "--result_dir", str(out), *args[1:]]
    if not b.viewer and "--disable_viewer" not in args:
        args.append("--disable_viewer")
    return b, args, listener


def run_case(scenes: Dict[str, Path], tmp: Path, build: Callable[[Bench], List[str]]) -> Outcome:
    """Builds the case's broken input under tmp and runs the CLI on it under torchrun."""
    if build.__name__ not in TORCHRUN:
        return run_batch(scenes, {build.__name__: tmp})[build.__name__]
    out = tmp / "run"
    listener = None
    try:
        b, args, listener = prepare(scenes, tmp, build)
        before = snapshot(out)
        t0 = time.monotonic()
        p = torchrun(args, timeout=3 * TIME_LIMIT_S, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
        seconds = time.monotonic() - t0
    finally:
        if listener is not None:
            listener.close()
        if out.exists():
            out.chmod(0o755)
    return Outcome(b, p, seconds, before, snapshot(out))


def run_batch(scenes: Dict[str, Path], tmps: Dict[str, Path]) -> Dict[str, Outcome]:
    """{case id: its Outcome} for cases outside TORCHRUN (each with its own folder in
    `tmps`), run one after another on one pair of gloo ranks (catalog_workers.py). Rank 0's
    stderr is the run's (a rank that defers to rank 0 prints nothing, as under torchrun);
    the exit code is rank 0's, each rank's is in rank_codes."""
    from harness import run_workers

    benches, befores, cases = {}, {}, []
    for case_id, tmp in tmps.items():
        b, args, listener = prepare(scenes, tmp, CASES[case_id][0])
        assert listener is None, f"{case_id} needs a listener: run it under torchrun"
        benches[case_id], befores[case_id] = b, snapshot(b.out)
        cases.append((case_id, args, str(tmp / "torchrun_error")))
    # A case takes a second or two here (the harness's collective timeout turns a hang into an error):
    # a batch past this is a hang, killed and failed in minutes, not at 41 cases x TIME_LIMIT_S.
    ranks = run_workers("catalog_workers:run_cli_cases", 2, cases, timeout_s=3 * TIME_LIMIT_S + 5.0 * len(cases))
    outcomes = {}
    for case_id, b in benches.items():
        r0 = ranks[0][case_id]
        proc = subprocess.CompletedProcess(["distsplat.app.main"], r0["code"], "",
                                           "".join(r[case_id]["stderr"] for r in ranks))
        outcomes[case_id] = Outcome(b, proc, max(r[case_id]["seconds"] for r in ranks), befores[case_id],
                                    snapshot(b.out), [r[case_id]["code"] for r in ranks],
                                    [r[case_id]["recorded"] for r in ranks])
    return outcomes


# Cases run two at a time: a case is mostly process start-up and exit (torchrun's launcher,
# then its ranks, then the launcher again), phases in which one of CI's two cores idles.
AHEAD = 2


@dataclass
class _Part:
    """One case's share of the batch's future."""
    batch: "Future"
    case_id: str

    def result(self) -> Outcome:
        return self.batch.result()[self.case_id]


@pytest.fixture(scope="module")
def launched(scenes, request, tmp_path_factory):
    """{case id: Future of its Outcome}: every case this session runs (as selected, and not
    skipped), started in collection order, AHEAD at a time, so that the next case's
    run overlaps the current one. Each case still has its own folders and its own run,
    and its test asserts on that run alone."""
    from concurrent.futures import ThreadPoolExecutor

    def skipped(item) -> bool:
        return any(item.iter_markers("skip")) or any(m.args and m.args[0] for m in item.iter_markers("skipif"))

    ids = [item.callspec.id for item in request.session.items
           if item.module is request.module and getattr(item, "originalname", "") == "test_bad_input"
           and not skipped(item)]
    pool = ThreadPoolExecutor(max_workers=AHEAD, thread_name_prefix="catalog")
    batched = [i for i in ids if i not in TORCHRUN]
    futures = {}
    if batched:  # first: the batch's ranks run beside the torchrun cases
        batch = pool.submit(run_batch, scenes, {i: tmp_path_factory.mktemp(i) for i in batched})
        futures.update({i: _Part(batch, i) for i in batched})
    futures.update({i: pool.submit(run_case, scenes, tmp_path_factory.mktemp(i), CASES[i][0])
                    for i in ids if i in TORCHRUN})
    try:
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize(
    "build, message",
    [pytest.param(build, message, id=name, marks=marks) for name, (build, message, marks) in CASES.items()],
)
def test_bad_input(launched, scenes, tmp_path, request, build, message):
    case_id = request.node.callspec.id
    run = launched[case_id].result() if case_id in launched else run_case(scenes, tmp_path, build)
    p, seconds, before, after = run.proc, run.seconds, run.before, run.after
    line = error_line(p.stderr, message)
    log_case(case_id, seconds, line or next(
        (x for x in p.stderr.splitlines() if x.startswith("distsplat: error")), None))
    tail = p.stderr[-4000:]
    assert p.returncode != 0, tail
    assert seconds < TIME_LIMIT_S, f"took {seconds:.1f} s\n{tail}"
    assert line is not None, f"no `distsplat: error` line with {message!r}\n{tail}"
    assert line.startswith("distsplat: error: ") or "rank 1" in line, line  # rank 0's, or names the rank
    if run.rank_codes is not None:  # a batched case: every rank ended alike, as torchrun's summary shows them
        assert len(set(run.rank_codes)) == 1, f"ranks exited with {run.rank_codes}\n{tail}"
        recorded = [r and json.loads(r)["message"]["message"] for r in run.rank_recorded]  # (not its timestamp)
        assert recorded[0] is not None and len(set(recorded)) == 1 and line in recorded[0], (recorded, line)
    unexplained = unexplained_tracebacks(p.stderr)
    assert not unexplained, unexplained[0]
    if run.bench.started:  # the run got past setup; what it wrote then may stay, nothing else
        after = {k: v for k, v in after.items() if k.split("/")[0] not in STARTED}
    changed = sorted(k for k in set(after) | set(before) if after.get(k, 0) != before.get(k, 0))
    assert not changed, f"the result dir changed: {changed}"
