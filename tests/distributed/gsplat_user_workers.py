"""Workers for test_gsplat_users.py (issue 46): the Trainer as a gsplat user's flags drive it."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import numpy as np

from distsplat.train.files import outputs
from distsplat.train.trainer import Trainer


class RecordingWriter:
    """Stands in for TensorBoard's SummaryWriter (not installed in CI): what add_image got."""

    def __init__(self) -> None:
        self.images: List[Dict[str, Any]] = []

    def add_image(self, tag, image, step, dataformats="CHW") -> None:
        self.images.append({"tag": tag, "image": np.array(image), "step": step, "dataformats": dataformats})

    def add_scalar(self, *args) -> None:
        pass

    def close(self) -> None:
        pass


def train_outputs(ctx, cfg) -> Dict[str, Any]:
    """Trains cfg with a recording TensorBoard writer on rank 0; returns its images, the
    rank's own training images (uint8, by scene index) and the files of the result dir."""
    writers: List[RecordingWriter] = []
    init = outputs.TensorBoard.__init__

    def recording_init(self, result_dir, ctx_):
        init(self, result_dir, ctx_)
        if ctx_.is_main:
            self.writer = RecordingWriter()
            writers.append(self.writer)

    outputs.TensorBoard.__init__ = recording_init
    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        trainer.train()
        own = [int(trainer.train_idx[p]) for p in trainer.batcher.own_cameras(ctx.rank).tolist()]
        images = {}
        for i in own:
            out = np.empty((trainer.heights[i], trainer.widths[i], 3), dtype=np.uint8)
            trainer.cache.read_into(i, out)
            images[i] = out
        return {"images": writers[0].images if writers else [], "own": images, "n_all": trainer.n_all}
    finally:
        outputs.TensorBoard.__init__ = init
        trainer.cleanup()


def run(ctx, cfg, setup_only: bool = False) -> Dict[str, Any]:
    """Sets up (a --ckpt or --init_ply model loads there), then trains, evaluates (--eval_only) or
    stops; returns the metrics, the step it started from, this rank's parameters."""
    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        out = {"start_step": trainer.start_step, "n_all": trainer.n_all,
               "initial": {k: v.detach().clone() for k, v in trainer.params.items()}}
        if not setup_only:
            out["metrics"] = trainer.eval_only() if cfg.eval_only else trainer.train()
        out["params"] = {k: v.detach().clone() for k, v in trainer.params.items()}
        return out
    finally:
        trainer.cleanup()


def convert(ctx, src: str, out: str, to: str = "gsplat") -> str:
    """distsplat.convert on this rank (python -m distsplat.convert SRC OUT --to TO)."""
    from distsplat.convert import Args, convert as convert_model

    return str(convert_model(ctx, Args(src=src, out=out, to=to)))
