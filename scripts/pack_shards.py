"""Packs a folder of images into tar shards plus an index (shard, offset, length per image
name) that distsplat reads by offset, without scanning the tars.

    python scripts/pack_shards.py data/garden/images_4 data/garden/shards_4 --shard-size-mb 256

Names in the index are paths relative to FOLDER (what COLMAP's images.bin calls them).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distsplat.data.shards import pack_shards  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="folder of images (searched recursively)")
    ap.add_argument("out", type=Path, help="output folder for shard-NNNNN.tar and index.json")
    ap.add_argument("--shard-size-mb", type=float, default=256.0, help="largest shard size in MiB (default 256)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    index = pack_shards(args.folder, args.out, args.shard_size_mb)
    print(index)


if __name__ == "__main__":
    main()
