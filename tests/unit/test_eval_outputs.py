"""What an evaluation writes (distsplat/train/scoring/metrics.py): the JSON, the per-image CSV and
TensorBoard's scalars and side-by-side renders."""

import csv
import json
import math

import numpy as np
import pytest
import torch

from distsplat.train.scoring.metrics import render_name
from distsplat.train.scoring.metrics import report_eval
from distsplat.train.files.outputs import save_image


class FakeTB:
    def __init__(self):
        self.calls = []

    def scalars(self, step, values):
        self.calls.append(("scalars", step, values))

    def image(self, tag, png, step):
        self.calls.append(("image", tag, png.name, step))


def test_json_csv_and_tensorboard(tmp_path):
    names = ["a", "b", "c"]
    per_image = {"psnr": np.array([20.0, 30.0, 25.0]), "ssim": np.array([0.5, 0.9, 0.7]),
                 "lpips": np.array([0.3, 0.1, 0.2])}
    stats = {k: float(v.mean()) for k, v in per_image.items()} | {"num_GS": 7, "step": 5}
    for n in names[:2]:
        save_image(render_name(tmp_path / "renders", 5, n), torch.rand(4, 8, 3))
    tb = FakeTB()
    out = report_eval(tmp_path, 5, stats, per_image, names, None, tb, num_renders=2)
    assert json.loads((tmp_path / "stats" / "val_step0005.json").read_text()) == out
    assert out["lpips"] == stats["lpips"] and "lpips_skipped" not in out
    with open(tmp_path / "stats" / "val_step0005.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == names
    assert [float(r["psnr"]) for r in rows] == [20.0, 30.0, 25.0]
    assert [float(r["lpips"]) for r in rows] == [0.3, 0.1, 0.2]
    assert tb.calls[0] == ("scalars", 5, {"val/psnr": 25.0, "val/ssim": stats["ssim"], "val/lpips": stats["lpips"]})
    assert tb.calls[1:] == [("image", "val/a", "val_step0005_a_gt-vs-render.png", 5),
                             ("image", "val/b", "val_step0005_b_gt-vs-render.png", 5)]


def test_skipped_lpips_is_null_with_the_reason(tmp_path):
    per_image = {"psnr": np.array([20.0]), "ssim": np.array([0.5]), "lpips": np.array([math.nan])}
    stats = {"psnr": 20.0, "ssim": 0.5, "lpips": math.nan, "step": 1}
    out = report_eval(tmp_path, 1, stats, per_image, ["a"], "LPIPS skipped: no weights", None, 0)
    saved = json.loads((tmp_path / "stats" / "val_step0001.json").read_text())  # valid JSON: no NaN
    assert saved["lpips"] is None and saved["lpips_skipped"] == "LPIPS skipped: no weights" and saved == out
    with open(tmp_path / "stats" / "val_step0001.csv") as f:
        assert list(csv.DictReader(f))[0]["lpips"] == ""


def test_render_names_say_which_half_is_ground_truth(tmp_path):
    assert render_name(tmp_path, 300, "input_0001.jpg").name == "val_step0300_input_0001_gt-vs-render.png"


def test_a_skipped_lpips_is_one_short_log_line():
    from distsplat.train.scoring.lpips import load_lpips, short_lpips_note

    _, note = load_lpips("alex", min_side=8)
    assert short_lpips_note(note).startswith("LPIPS skipped: the images' smaller side (8 px) is below")
    long = "LPIPS skipped: no alex backbone weights in /x/" + "y" * 300 + "; pass --lpips_weights ..."
    short = short_lpips_note(long)
    assert len(short) < 240 and "pass --lpips_weights" not in short and "val_stepNNNN.json" in short


def test_cfg_yml_is_yaml_that_reads_back_as_the_config(tmp_path):
    """cfg.yml is YAML (as gsplat's), not JSON, and every value reads back with its type."""
    yaml = pytest.importorskip("yaml")
    from distsplat.train.config import default_config, mcmc_config
    from distsplat.train.files.outputs import write_yaml

    for cfg in (default_config(), mcmc_config()):
        cfg.ckpt, cfg.lpips_weights, cfg.means_lr = "R/ckpts", 'odd "name": here', 1e-05
        cfg.far_plane = float("inf")
        write_yaml(tmp_path / "cfg.yml", cfg.to_dict())
        text = (tmp_path / "cfg.yml").read_text()
        assert not text.lstrip().startswith("{") and "\nstrategy:\n  type: " in text
        assert yaml.safe_load(text) == cfg.to_dict()
