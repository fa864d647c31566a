"""A hundred million images on paper: bench_million.py's measured per-image costs at 100k
and 1M images, extrapolated to 100M images at W = 8, 64 and 512 (a prediction, with its
assumptions in the output; docs/many_images.md shows the table).

Model, per rank, each rank on its own core (the W = 2 measurements on 2 cores):
- time to the first step T(N, W) = c0 + a N + b N / W: `a` every rank's per-camera work
  (the model's table, poses, ownership, the trainer's camera tensors and digest), `b` the
  per-own-image work (the up-front check of a rank's own images and its cache set-up), `c0`
  the rest (launch, imports, the Gaussians, the first step). `b` comes from the per-rank
  measures (check_s + cache_init_s per own image, 1M capture); `a` and `c0` from two starts
  measured in the same run (W = 2: the 1,000-image capture's and the 1M capture's later
  start, the model's binary copy read); the 100k capture's measured starts check the model.
- memory per rank besides the image cache M(N) = m0 + beta N, from the per-rank resident
  memory after the table, index and ownership (100k and 1M); the image cache holds the
  rank's share of the dataset (dataset / W) at most, as measured (1.00x).

    python benchmarks/studies/many_images/million_paper.py     # the newest million_100000_* and million_1000000_* snapshots

Writes a million_paper_<device>_<date>.json snapshot and prints the markdown table.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.results_index import device_label, newest, result_path  # noqa: E402
TARGET = 100_000_000
WS = (8, 64, 512)
RANKS_PER_NODE = 8
IMAGE_KB = 200  # an assumed ~1-megapixel JPEG: a drone or street capture after --data_factor
MODEL_BYTES = 94  # images.bin bytes per image without 2D points (64-byte head + name + count); SfM's 2D points add 24 B each


def per_rank(result: dict, W: int, key: str) -> float:
    ranks = next(r["ranks"] for r in result["ranks"] if r["W"] == W)
    return sum(r[key] for r in ranks) / len(ranks)


def later_start(result: dict, W: int) -> float:
    return min(r["time_to_first_step_s"] for r in result["start"] if r["W"] == W and r["start"] == "later")


def fit(small: dict, big: dict) -> dict:
    """The model's coefficients: time from the big capture's JSON alone (its later starts at
    a million images and the 1,000-image capture's starts, measured in the same run, so under
    the same load), memory from both captures (resident memory does not depend on the load).
    The small capture's (100k) measured starts check the time model."""
    n1, n2 = small["N"], big["N"]
    own2 = per_rank(big, 2, "own")
    b = (per_rank(big, 2, "check_s") + per_rank(big, 2, "cache_init_s")) / own2  # s per own image
    n0 = big["small"]  # the 1,000-image capture of the same run
    t0 = min(r["time_to_first_step_s"] for r in big["training"] + [big.get("epochs", {})]
             if r.get("images") == n0 and r.get("W") == 2 and r.get("time_to_first_step_s"))
    t2 = later_start(big, 2)
    a = (t2 - t0 - b * (n2 - n0) / 2) / (n2 - n0)  # s per camera, every rank
    c0 = t0 - a * n0 - b * n0 / 2
    m1, m2 = per_rank(small, 2, "index_ownership_mb"), per_rank(big, 2, "index_ownership_mb")
    beta = (m2 - m1) / (n2 - n1) * 2**20  # bytes per camera, every rank
    m0 = m1 * 2**20 - beta * n1
    check = {str(W): {"measured_s": later_start(small, W),
                      "model_s": c0 + a * n1 + b * n1 / W} for W in (2, 4) if any(r["W"] == W for r in small["start"])}
    return {"a_s_per_camera": a, "b_s_per_own_image": b, "c0_s": c0, "beta_bytes_per_camera": beta, "m0_bytes": m0,
            "parse_s_per_camera": per_rank(big, 2, "parse_s") / n2,
            "measured": {"start_w2_s": {str(n0): t0, str(n2): t2}, "tables_mb_w2": {str(n1): m1, str(n2): m2},
                         "load": {"big": big.get("load_before"), "small": small.get("load_before")}},
            "check_at_100k": check,
            "sources": {str(n1): {"commit": small["commit"], "date": small["date"]},
                        str(n2): {"commit": big["commit"], "date": big["date"]}}}


def predict(m: dict, n: int) -> list:
    rows = []
    for W in WS:
        own = n / W
        rows.append({
            "W": W, "nodes": -(-W // RANKS_PER_NODE), "own_images": own,
            "start_s": m["c0_s"] + m["a_s_per_camera"] * n + m["b_s_per_own_image"] * own,
            "start_replicated_s": m["a_s_per_camera"] * n, "start_own_s": m["b_s_per_own_image"] * own,
            "tables_gb_per_rank": (m["m0_bytes"] + m["beta_bytes_per_camera"] * n) / 2**30,
            "tables_gb_per_node": (m["m0_bytes"] + m["beta_bytes_per_camera"] * n) * min(W, RANKS_PER_NODE) / 2**30,
            "cache_share_gb_per_rank": n * IMAGE_KB * 1e3 / W / 2**30,
        })
    return rows


def table(rows: list, m: dict, n: int) -> str:
    out = ["| W (nodes of 8) | own images per rank | time to the first step | of which every rank's per-camera work "
           "| camera tables per rank / per node | compressed image share per rank |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['W']} ({r['nodes']}) | {r['own_images'] / 1e6:.2f} M | {r['start_s'] / 60:.1f} min "
                   f"| {r['start_replicated_s'] / 60:.1f} min | {r['tables_gb_per_rank']:.1f} GB / "
                   f"{r['tables_gb_per_node']:.0f} GB | {r['cache_share_gb_per_rank']:.0f} GB |")
    return "\n".join(out)


def main() -> None:
    small_path, big_path = newest("million_100000", "cpu"), newest("million_1000000", "cpu")
    small, big = json.loads(small_path.read_text()), json.loads(big_path.read_text())
    m = fit(small, big)
    rows = predict(m, TARGET)
    out = {"benchmark": "million_paper", "prediction": True, "images": TARGET, "model": m, "rows": rows,
           "assumptions": {"ranks_per_node": RANKS_PER_NODE, "image_kb": IMAGE_KB, "one_core_per_rank": True,
                           "model_bytes_per_image": MODEL_BYTES,
                           "costs": "linear in the images (fitted at 100k and 1M), as measured on this machine's cores and "
                                    "local disk; a network file system's per-file latency adds to b"},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": "python benchmarks/studies/many_images/million_paper.py"}
    out["inputs"] = [small_path.name, big_path.name]
    out["machine"] = big["machine"]  # where the costs were measured
    path = result_path("million_paper", device_label(big["machine"]), out["date"])
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(table(rows, m, TARGET))
    print(json.dumps(m, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
