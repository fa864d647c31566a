"""Mutation fuzzing of a whole COLMAP capture (issue 36): a real model (thermos by default)
is damaged one mutation at a time and loaded as the trainer loads it (`load_colmap`,
normalised, images checked). Each case must either load, with finite cameras and points,
or raise DataError naming a file of the capture; anything else is an escape.

The atheris fuzzer (fuzz.py) drives each reader alone on tiny files; this one reaches what
only a whole load does: the sizes, intrinsics and poses that a reader passes on and that
fail later (the scene's arrays, the undistortion plan, the normalisation). Mutations are
half byte-level (a flipped bit, random bytes, a cut, an insertion, a deletion anywhere in a
file) and half value-level: one field of one record of cameras.bin, images.bin or
points3D.bin (the record layout is parsed from the file) set to a value of its type that
parsers stumble on (NaN, +-inf, 1e300, a denormal, 0, -1, 2^63, 2^64 - 1, random bits, the
value scaled by 1e10, ...).

    nice -n 10 python tests/fuzz/colmap_mutations.py [--cases 2000] [--seed 0] [--data DIR] [--record]

`--record` writes benchmarks/results/fuzz_colmap_<scene>_<cases>.json; every escape is
saved as a JSON spec (the mutation, not the 3 MB file) under tests/fuzz/crashers/colmap_model/,
which test_colmap_mutations.py replays. A case is reproduced by (seed, index) alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO)]

from benchmarks.paths import data_dir  # noqa: E402
from distsplat.data.colmap import load_colmap  # noqa: E402
from distsplat.data.colmap_io import CAMERA_MODELS  # noqa: E402
from distsplat.data.errors import DataError  # noqa: E402

THERMOS = data_dir() / "thermos"
CRASHERS = HERE / "crashers" / "colmap_model"
FILES = ("cameras.bin", "images.bin", "points3D.bin")
CASE_SECONDS = 20  # a case running longer is a hang (an escape)
MEMORY_LIMIT = 4 << 30  # address space of main()'s process: an absurd allocation is a MemoryError (an escape)

Field = Tuple[int, str, str]  # (byte offset, struct code, name)


# ---------------------------------------------------------------- record layouts
def layout(name: str, buf: bytes) -> List[List[Field]]:
    """Per record of a COLMAP .bin file: its fields (offset, struct code, name); the count
    at offset 0 is a record of its own. Stops quietly at the end of the buffer."""
    records: List[List[Field]] = [[(0, "Q", "count")]]
    n = struct.unpack_from("<Q", buf, 0)[0]
    pos = 8
    try:
        for i in range(n):
            fields: List[Field] = []
            if name == "cameras.bin":
                mid = struct.unpack_from("<i", buf, pos + 4)[0]
                fields += [(pos, "i", "camera_id"), (pos + 4, "i", "model_id"), (pos + 8, "Q", "width"),
                           (pos + 16, "Q", "height")]
                pos += 24
                for k in range(CAMERA_MODELS.get(mid, ("", 0))[1]):
                    fields.append((pos, "d", f"params[{k}]"))
                    pos += 8
            elif name == "images.bin":
                fields += [(pos, "i", "image_id")] + [(pos + 4 + 8 * k, "d", f"qvec[{k}]") for k in range(4)]
                fields += [(pos + 36 + 8 * k, "d", f"tvec[{k}]") for k in range(3)] + [(pos + 60, "i", "camera_id")]
                end = buf.index(b"\0", pos + 64)
                fields.append((end + 1, "Q", "num_points2D"))
                n2d = struct.unpack_from("<Q", buf, end + 1)[0]
                pos = end + 9
                for k in range(min(n2d, 2)):  # a couple of observations: the rest look alike
                    fields += [(pos + 24 * k, "d", f"points2D[{k}].x"), (pos + 24 * k + 16, "q", f"points2D[{k}].id")]
                pos += 24 * n2d
            else:
                fields += [(pos, "Q", "point3D_id")] + [(pos + 8 + 8 * k, "d", f"xyz[{k}]") for k in range(3)]
                fields += [(pos + 32 + k, "B", f"rgb[{k}]") for k in range(3)]
                fields += [(pos + 35, "d", "error"), (pos + 43, "Q", "track_length")]
                track = struct.unpack_from("<Q", buf, pos + 43)[0]
                pos += 51
                if track:
                    fields += [(pos, "i", "track[0].image_id"), (pos + 4, "i", "track[0].point2D_idx")]
                pos += 8 * track
            if pos > len(buf):
                break
            records.append(fields)
    except (struct.error, ValueError):
        pass
    return records


SPECIAL = {
    "d": [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e300, -1e300, 1e-310, 5e-324, 1.7976931348623157e308,
          -1.0, 1e12, -1e12, 1e20],
    "Q": [0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**40, 10**6, 10**9],
    "q": [0, -1, 2**63 - 1, -(2**63), 2**31],
    "i": [0, -1, 2**31 - 1, -(2**31), 1, 2, 3, 4, 5, 7, 8, 11, 12, 1000],  # 0-11: the camera model ids too
    "B": [0, 255, 128],
}
RANGE = {"d": None, "Q": (0, 2**64 - 1), "q": (-(2**63), 2**63 - 1), "i": (-(2**31), 2**31 - 1), "B": (0, 255)}


def _value(rng: random.Random, code: str, old) -> object:
    """A value of struct type `code` that parsers stumble on, or a nearby one."""
    r = rng.random()
    if r < 0.55:
        return rng.choice(SPECIAL[code])
    if code == "d":
        if r < 0.7:
            return struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]  # random bits
        if r < 0.85:
            return old * rng.choice([1e10, -1.0, 1e-10, 1e100, 1e-100])
        return rng.uniform(-1, 1) * 10.0 ** rng.randint(-320, 308)
    lo, hi = RANGE[code]
    if r < 0.8:
        return rng.randint(lo, hi)
    return min(max(old + rng.choice([-2, -1, 1, 2, 100]), lo), hi)


def value_mutation(rng: random.Random, name: str, buf: bytes, records: List[List[Field]]) -> List[list]:
    """One field of one record (the count record rarely: it mostly means truncation)."""
    k = 0 if len(records) == 1 or rng.random() < 0.03 else rng.randrange(1, len(records))
    off, code, field = rng.choice(records[k])
    old = struct.unpack_from("<" + code, buf, off)[0]
    new = struct.pack("<" + code, _value(rng, code, old))
    return [["write", name, off, new.hex(), f"record {k} {field}"]]  # the 5th item: what the value is


def byte_mutation(rng: random.Random, name: str, size: int, records: List[List[Field]]) -> List[list]:
    kind = rng.choice(["flip", "byte", "bytes8", "cut", "insert", "delete"])
    # Half of the offsets inside a record's fixed fields (points2D is most of images.bin, never read).
    fields = [f for rec in records for f in rec]
    if fields and rng.random() < 0.5:
        off, code, _ = rng.choice(fields)
        off += rng.randrange(struct.calcsize(code))
    else:
        off = rng.randrange(max(size, 1))
    if kind == "flip":
        return [["xor", name, off, format(1 << rng.randrange(8), "02x")]]
    if kind == "byte":
        return [["write", name, off, format(rng.randrange(256), "02x")]]
    if kind == "bytes8":
        return [["write", name, off, rng.getrandbits(64).to_bytes(8, "little").hex()]]
    if kind == "cut":
        return [["truncate", name, off]]
    if kind == "insert":
        return [["insert", name, off, rng.getrandbits(8 * 8).to_bytes(8, "little")[: rng.randint(1, 8)].hex()]]
    return [["delete", name, off, rng.randint(1, 64)]]


def make_case(seed: int, index: int, originals: Dict[str, bytes], layouts: Dict[str, list]) -> List[list]:
    """The mutation of case `index` (a list of ops), the same for the same (seed, index)."""
    rng = random.Random(f"{seed}/{index}")
    name = rng.choice(FILES)
    if rng.random() < 0.5:
        return value_mutation(rng, name, originals[name], layouts[name])
    return byte_mutation(rng, name, len(originals[name]), layouts[name])


def apply(ops: List[list], originals: Dict[str, bytes]) -> Dict[str, bytes]:
    """{file: mutated bytes} for the files the ops touch."""
    out: Dict[str, bytearray] = {}
    for op in ops:
        kind, name, off = op[0], op[1], op[2]
        b = out.setdefault(name, bytearray(originals[name]))
        off = min(off, len(b))
        if kind == "write":
            data = bytes.fromhex(op[3])
            b[off:off + len(data)] = data
        elif kind == "xor":
            if off < len(b):
                b[off] ^= int(op[3], 16)
        elif kind == "truncate":
            del b[off:]
        elif kind == "insert":
            b[off:off] = bytes.fromhex(op[3])
        elif kind == "delete":
            del b[off:off + op[3]]
        else:
            raise ValueError(f"unknown op {kind}")
    return {k: bytes(v) for k, v in out.items()}


# ---------------------------------------------------------------- running a case
class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {CASE_SECONDS} s")


class Capture:
    """A scratch copy of a capture: the model files copied (mutated in place per case), the
    image folders linked."""

    def __init__(self, data: Path, scratch: Path, factor: int):
        self.data, self.root, self.factor = data, scratch / "capture", factor
        model = data / "sparse" / "0"
        (self.root / "sparse" / "0").mkdir(parents=True)
        self.originals = {f: (model / f).read_bytes() for f in FILES}
        self.layouts = {f: layout(f, b) for f, b in self.originals.items()}
        for f, b in self.originals.items():
            (self.root / "sparse" / "0" / f).write_bytes(b)
        for p in data.iterdir():
            if p.name != "sparse":
                (self.root / p.name).symlink_to(p)

    def run(self, ops: List[list]) -> Tuple[str, str]:
        """(outcome, detail): outcome "load", "DataError" or "escape"."""
        files = apply(ops, self.originals)
        model = self.root / "sparse" / "0"
        for f, b in files.items():
            (model / f).write_bytes(b)
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(CASE_SECONDS)
        try:
            scene = load_colmap(self.root, factor=self.factor, normalize=True)
            problem = _scene_problem(scene)
            return ("escape", f"loaded: {problem}") if problem else ("load", "")
        except DataError as e:
            msg = str(e)
            if str(self.root) not in msg:
                return "escape", f"DataError naming no file of the capture: {msg[:300]}"
            return "DataError", msg[:300]
        except Exception as e:  # noqa: BLE001 - every other exception is a finding
            tb = traceback.extract_tb(e.__traceback__)
            at = next((f"{Path(fr.filename).relative_to(REPO)}:{fr.lineno}" for fr in reversed(tb)
                       if fr.filename.startswith(str(REPO / "distsplat"))), "?")
            return "escape", f"{type(e).__name__}: {str(e)[:200]} at {at}"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
            for f in files:
                (model / f).write_bytes(self.originals[f])


def _scene_problem(scene) -> Optional[str]:
    """Why a loaded scene cannot be trained on, or None: every array finite, sizes positive."""
    checks = {"camtoworlds": scene.camtoworlds, "Ks": scene.Ks, "points": scene.points,
              "transform": scene.transform}
    for name, a in checks.items():
        if not np.isfinite(np.asarray(a, dtype=np.float64)).all():
            return f"non-finite {name}"
    if not (np.asarray(scene.widths) > 0).all() or not (np.asarray(scene.heights) > 0).all():
        return "a size is not positive"
    if not (np.asarray(scene.Ks)[:, [0, 1], [0, 1]] > 0).all():
        return "a focal length is not positive"
    return None


def run_cases(data: Path, cases: int, seed: int, factor: int = 2, first: int = 0, progress: bool = False,
              specs: Optional[List[List[list]]] = None) -> Dict:
    """Runs cases first .. first + cases - 1 of `seed` (or the given `specs`); a summary."""
    scratch = Path(tempfile.mkdtemp(prefix="colmap_mutations_"))
    try:
        cap = Capture(Path(data), scratch, factor)
        counts: Counter = Counter()
        kinds: Counter = Counter()
        escapes = []
        todo = specs if specs is not None else [make_case(seed, i, cap.originals, cap.layouts)
                                                for i in range(first, first + cases)]
        t0 = time.monotonic()
        for k, ops in enumerate(todo):
            outcome, detail = cap.run(ops)
            counts[outcome] += 1
            kinds[f"{ops[0][1]} {'value' if len(ops[0]) == 5 else ops[0][0]}"] += 1
            if outcome == "escape":
                escapes.append({"index": first + k if specs is None else k, "ops": ops, "what": detail})
                if progress:
                    print(f"case {first + k}: ESCAPE {detail} {ops}", flush=True)
            if progress and (k + 1) % 100 == 0:
                print(f"{k + 1} cases, {dict(counts)}, {time.monotonic() - t0:.0f} s", flush=True)
        return {"cases": len(todo), "seed": seed, "first": first, "outcomes": dict(counts),
                "mutations": dict(sorted(kinds.items())), "escapes": escapes,
                "seconds": round(time.monotonic() - t0, 1)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=THERMOS, help="a COLMAP capture (sparse/0/*.bin, images/)")
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0, help="index of the first case")
    ap.add_argument("--factor", type=int, default=2, help="--data_factor of the load")
    ap.add_argument("--record", action="store_true", help="write the result JSON and save escapes as crashers")
    args = ap.parse_args()
    import logging

    logging.disable(logging.WARNING)  # the loader's warnings per case drown the progress
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))
    summary = run_cases(args.data, args.cases, args.seed, args.factor, args.first, progress=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "escapes"}), flush=True)
    for e in summary["escapes"]:
        print("escape", e["index"], e["what"], json.dumps(e["ops"]))
    if args.record:
        CRASHERS.mkdir(parents=True, exist_ok=True)
        for e in summary["escapes"]:
            (CRASHERS / f"seed{args.seed}-case{e['index']}.json").write_text(
                json.dumps({"scene": args.data.name, "ops": e["ops"], "found": e["what"]}) + "\n")
        sys.path.insert(0, str(REPO))
        from benchmarks.common import write_result

        load = os.getloadavg()
        path = write_result(f"fuzz_colmap_{args.data.name}_{args.cases}", {
            "what": "mutations of a real COLMAP model loaded as the trainer loads it (load_colmap, normalised, "
                    "images checked): each must load with finite arrays or raise DataError naming a file",
            "scene": args.data.name, "factor": args.factor, "case_seconds_limit": CASE_SECONDS,
            "load_at_end": load, **{k: v for k, v in summary.items()}})
        print("wrote", path)


if __name__ == "__main__":
    main()
