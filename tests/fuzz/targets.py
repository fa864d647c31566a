"""The parsers of user files that the fuzzer drives (issue 21), as one table shared by the
atheris harness (tests/fuzz/fuzz.py, run by hand with atheris installed) and the replay
test (tests/fuzz/test_replay.py, CI, no atheris).

Each target writes the fuzzer's bytes as one file into a scratch folder laid out as the
parser expects, calls the parser, and lets through only its documented error: DataError
for the data readers, CheckpointError for meta.json, ValueError naming the file for the
viewer's PLY import. Anything else escapes and is a finding.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Callable, Dict, NamedTuple, Tuple, Type

import numpy as np

from distsplat.data import colmap_io
from distsplat.data.errors import DataError
from distsplat.train.files import checkpoint as ck


class Target(NamedTuple):
    file: str  # the fuzzed file's path inside the scratch folder
    parse: Callable[[Path], object]  # called with the scratch folder
    allowed: Tuple[Type[BaseException], ...]  # the documented errors


def _blender(d: Path):
    from distsplat.data.blender import load_blender

    return load_blender(d, check=False)


def _shards(d: Path):
    from distsplat.data.shards import TarShardSource

    return TarShardSource(d / "index.json")


def _nerfstudio(d: Path):
    from distsplat.data.nerfstudio import load_nerfstudio

    return load_nerfstudio(d, check=False)


def _nerfstudio_ply(d: Path):
    from distsplat.data.nerfstudio import read_ply_points

    return read_ply_points(d / "points.ply")


def _ply(d: Path):
    from distsplat.viewer.model import read_ply_chunk

    return read_ply_chunk(d / "point_cloud.ply", 0, 1)


TARGETS: Dict[str, Target] = {
    "colmap_cameras_bin": Target("cameras.bin", lambda d: colmap_io.read_cameras_bin(d / "cameras.bin"), (DataError,)),
    "colmap_images_bin": Target("images.bin", lambda d: colmap_io.read_images_bin(d / "images.bin"), (DataError,)),
    # the array reader load_colmap uses (million-image captures), on the same inputs
    "colmap_images_bin_table": Target("images.bin", lambda d: colmap_io.read_images_bin_table(d / "images.bin"),
                                      (DataError,)),
    "colmap_points_bin": Target("points3D.bin", lambda d: colmap_io.read_points_bin(d / "points3D.bin"), (DataError,)),
    "colmap_cameras_txt": Target("cameras.txt", lambda d: colmap_io.read_cameras_txt(d / "cameras.txt"), (DataError,)),
    "colmap_images_txt": Target("images.txt", lambda d: colmap_io.read_images_txt(d / "images.txt"), (DataError,)),
    "colmap_points_txt": Target("points3D.txt", lambda d: colmap_io.read_points_txt(d / "points3D.txt"), (DataError,)),
    "blender_transforms": Target("transforms_train.json", _blender, (DataError,)),
    "nerfstudio_transforms": Target("transforms.json", _nerfstudio, (DataError,)),
    "nerfstudio_ply": Target("points.ply", _nerfstudio_ply, (DataError,)),
    "shard_index": Target("index.json", _shards, (DataError,)),
    "checkpoint_meta": Target("step_000001/meta.json", lambda d: ck.read_meta(d / "step_000001"), (ck.CheckpointError,)),
    "viewer_ply": Target("point_cloud.ply", _ply, (ValueError,)),
}


def prepare(scratch: Path) -> None:
    """The files around the fuzzed one: a 4x4 PNG for Blender and nerfstudio frames, a tar
    shard, the PLY a nerfstudio transforms.json names."""
    from PIL import Image

    scratch.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (10, 20, 30)).save(scratch / "r_0.png")
    (scratch / "step_000001").mkdir(exist_ok=True)
    (scratch / "sparse_pc.ply").write_bytes(b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n"
                                           b"property float y\nproperty float z\nend_header\n0 0 0\n")
    if not (scratch / "shard-00000.tar").exists():  # two images in one shard, as pack_shards writes them
        from distsplat.data.shards import pack_shards

        images = scratch / "to_pack"
        images.mkdir(exist_ok=True)
        for name in ("a.png", "b.png"):
            shutil.copy(scratch / "r_0.png", images / name)
        pack_shards(images, scratch / "packed")
        shutil.copy(scratch / "packed" / "shard-00000.tar", scratch / "shard-00000.tar")


def run_one(name: str, data: bytes, scratch: Path) -> None:
    """Parses `data` as target `name`'s file; raises only what the target does not allow."""
    target = TARGETS[name]
    path = scratch / target.file
    path.write_bytes(data)
    try:
        target.parse(scratch)
    except target.allowed as e:
        if not str(e).strip():
            raise AssertionError(f"{name}: {type(e).__name__} without a message") from e


def seeds(scratch: Path) -> Dict[str, Dict[str, bytes]]:
    """Valid files of every target, written by distsplat's own writers: {target: {seed name: bytes}}."""
    from distsplat.data.blender import write_blender  # noqa: F401  (layout reference)
    from distsplat.train.files.export import write_ply

    import torch

    prepare(scratch)
    out: Dict[str, Dict[str, bytes]] = {}
    model = colmap_io.Model(
        cameras={1: colmap_io.Camera(1, "PINHOLE", 4, 4, np.array([3.0, 3.0, 2.0, 2.0])),
                 2: colmap_io.Camera(2, "OPENCV", 8, 6, np.array([6.0, 6.5, 4, 3, 0.01, -0.002, 0.001, 0.0005]))},
        images={1: colmap_io.Image(1, np.array([1.0, 0, 0, 0]), np.array([0.0, 0, 1]), 1, "a.png"),
                2: colmap_io.Image(2, np.array([0.9, 0.1, 0, 0]), np.array([1.0, 0, 1]), 2, "b.jpg")},
        points=colmap_io.Points(np.array([1, 2]), np.array([[0.0, 0, 0], [1, 2, 3]]),
                                np.array([[1, 2, 3], [250, 0, 9]], np.uint8), np.array([0.5, 1.0])),
    )
    for kind, writer in (("bin", colmap_io.write_model_bin), ("txt", colmap_io.write_model_txt)):
        d = scratch / kind
        writer(model, d)
        for stem, target in (("cameras", "cameras"), ("images", "images"), ("points3D", "points")):
            out.setdefault(f"colmap_{target}_{kind}", {})["model"] = (d / f"{stem}.{kind}").read_bytes()
    # a binary image with a points2D track, and a point with a track: the skipped fields
    out["colmap_images_bin"]["track"] = (struct.pack("<Q", 1) + struct.pack("<i7di", 3, 1, 0, 0, 0, 0, 0, 0, 1)
                                         + b"c.png\0" + struct.pack("<Q", 1) + struct.pack("<ddq", 1.0, 2.0, -1))
    out["colmap_points_bin"]["track"] = (struct.pack("<Q", 1) + struct.pack("<Q3d3BdQ", 7, 1, 2, 3, 4, 5, 6, 0.1, 2)
                                         + struct.pack("<iiii", 1, 0, 2, 5))
    out["colmap_images_bin_table"] = dict(out["colmap_images_bin"])
    out["colmap_images_txt"]["track"] = b"# c\n3 1 0 0 0 0 0 0 1 c.png\n1.0 2.0 -1 3.0 4.0 7\n"
    out["blender_transforms"] = {
        "angle": b'{"camera_angle_x": 0.69, "frames": [{"file_path": "./r_0", "transform_matrix": '
                 b'[[1,0,0,0],[0,1,0,0],[0,0,1,4],[0,0,0,1]]}]}',
        "intrinsics": b'{"fl_x": 3.0, "fl_y": 3.5, "cx": 2, "cy": 2, "frames": [{"file_path": "r_0.png", '
                      b'"transform_matrix": [[1,0,0,0],[0,1,0,0],[0,0,1,4],[0,0,0,1]]}]}',
    }
    frame = (b'{"file_path": "r_0.png", "transform_matrix": [[1,0,0,0],[0,1,0,0],[0,0,1,4],[0,0,0,1]]')
    out["nerfstudio_transforms"] = {
        "global": b'{"fl_x": 3.0, "fl_y": 3.5, "cx": 2, "cy": 2, "w": 4, "h": 4, "camera_model": "OPENCV", '
                  b'"k1": 0.01, "k2": 0, "p1": 0, "p2": 0, "frames": [' + frame + b'}], '
                  b'"applied_transform": [[1,0,0,0],[0,0,1,0],[0,-1,0,0]]}',
        "per_frame": b'{"camera_model": "OPENCV_FISHEYE", "frames": [' + frame + b', "fl_x": 3, "fl_y": 3, '
                     b'"cx": 2, "cy": 2, "w": 4, "h": 4, "k1": 0.01, "k2": 0, "k3": 0, "k4": 0}], '
                     b'"ply_file_path": "sparse_pc.ply", "test_filenames": []}',
    }
    out["nerfstudio_ply"] = {
        "ascii": b"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\n"
                 b"property float z\nproperty uchar red\nproperty uchar green\nproperty uchar blue\n"
                 b"end_header\n0 0 0 1 2 3\n1 2 3 250 0 9\n",
        "binary": b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty float x\n"
                  b"property float y\nproperty float z\nend_header\n" + struct.pack("<3f", 1, 2, 3),
    }
    out["shard_index"] = {"index": (scratch / "packed" / "index.json").read_bytes()}
    # a real checkpoint's meta.json (2 shards), written by checkpoint.finalize
    root = scratch / "ckpts"
    params = torch.nn.ParameterDict({"means": torch.nn.Parameter(torch.zeros(3, 3))})
    ck.begin(root, 1)
    for r in range(2):
        ck.write_shard(root, 1, r, ck.shard_payload(params, {}))
    ck.finalize(root, 1, [3, 3], {"config": {"sh_degree": 1}, "batcher": {"epoch": 0, "step": 1}})
    out["checkpoint_meta"] = {"meta": (ck.step_dir(root, 1) / ck.META).read_bytes()}
    g = torch.Generator().manual_seed(0)
    ply_params = {"means": torch.randn(3, 3, generator=g), "scales": torch.randn(3, 3, generator=g),
                  "quats": torch.randn(3, 4, generator=g), "opacities": torch.randn(3, generator=g),
                  "sh0": torch.randn(3, 1, 3, generator=g), "shN": torch.randn(3, 3, 3, generator=g)}
    out["viewer_ply"] = {"sh1": write_ply(scratch / "p.ply", ply_params).read_bytes()}
    shutil.rmtree(scratch / "bin")
    return out
