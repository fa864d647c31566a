"""Writes the 1M-Gaussian garden capture that benchmarks/scaling_gpu.py trains (test_garden's
SfM points x REPLICAS jittered copies, 64 cameras at 1296x840, random images) as a COLMAP
folder, so that benchmarks/bench_step_vs_gsplat.py can time one step of both trainers on it
(SCENE=FOLDER): the same scene as the scaling model's, by the same function.

    DISTSPLAT_DATA=.gpu_data python3 scripts/make_garden_capture.py FOLDER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    from benchmarks.scaling_gpu import write_garden_scene

    info = write_garden_scene(Path(sys.argv[1]), small=False)
    print(f"garden capture in {sys.argv[1]}: {json.dumps(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
