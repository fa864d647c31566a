"""The checks the CLI runs on every rank before the first collective (the end-to-end
cases are in tests/distributed/test_bad_input_catalog.py): flag values and the result dir."""

import os

import pytest
import torch

from distsplat.train.config import default_config
from distsplat.train.files.outputs import check_result_dir


def test_result_dir_may_exist_or_be_created(tmp_path):
    check_result_dir(str(tmp_path))
    check_result_dir(str(tmp_path / "new" / "deeper"))
    assert not (tmp_path / "new").exists()  # a check creates nothing


def test_result_dir_under_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"--result_dir .*afile/run: .*afile is a file, not a folder"):
        check_result_dir(str(tmp_path / "afile" / "run"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_result_dir_not_writable(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    try:
        with pytest.raises(ValueError, match=r"--result_dir .*ro/run: .*ro is not writable by this user"):
            check_result_dir(str(tmp_path / "ro" / "run"))
    finally:
        (tmp_path / "ro").chmod(0o755)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gsplat_backend_without_cuda_is_refused():
    cfg = default_config()
    cfg.backend = "gsplat"
    with pytest.raises(ValueError, match="--backend gsplat runs gsplat's CUDA kernels, and this machine has no CUDA GPU"):
        cfg.validate()


@pytest.mark.parametrize("flag", ["eval_only", "render_only"])
def test_eval_and_render_only_need_a_checkpoint(flag):
    cfg = default_config()
    setattr(cfg, flag, True)
    with pytest.raises(ValueError, match=f"--{flag} scores or renders a finished run: pass its checkpoint with --ckpt"):
        cfg.validate()
    cfg.ckpt = "results/x/ckpts"
    cfg.validate()


def test_a_batch_too_large_for_the_ranks_names_the_flags():
    from distsplat.train.scene_setup import check_batch_size

    check_batch_size(10, 2, 5)
    with pytest.raises(ValueError) as e:
        check_batch_size(10, 2, 6)
    assert str(e.value) == ("--batch_size 6 on 2 rank(s) needs 12 distinct training cameras per step, and the scene "
                            "has 10 (5 per rank): pass --batch_size 5 or less, or run on fewer ranks")
    with pytest.raises(ValueError, match=r"has 3 \(0 per rank\): run on at most 3 ranks \(--nproc_per_node\) "
                                         r"with --batch_size 1$"):
        check_batch_size(3, 4, 1)


def test_viewer_flags_are_the_viewers_composed_by_the_app(tmp_path):
    """The viewer's settings live in viewer/config.py, not in the trainer's Config (train never
    sees a viewer flag); the app's command line takes them under their gsplat names, validates
    them with the trainer's, and writes them into cfg.yml."""
    import dataclasses

    from distsplat.app import CONFIGS, AppConfig
    from distsplat.cli import parse
    from distsplat.train.config import Config
    from distsplat.train.files.outputs import write_yaml
    from distsplat.viewer.config import ViewerConfig

    viewer_flags = {f.name for f in dataclasses.fields(ViewerConfig)}
    assert viewer_flags == {"disable_viewer", "port", "viewer_keep_open", "viewer_host", "viewer_res", "viewer_budget"}
    assert not viewer_flags & {f.name for f in dataclasses.fields(Config)}
    cfg = parse(["mcmc", "--disable_viewer", "--port", "0", "--viewer_res", "64", "--viewer_budget", "0.5",
                 "--max_steps", "7"], CONFIGS)
    assert isinstance(cfg, AppConfig)
    assert (cfg.disable_viewer, cfg.port, cfg.viewer_res, cfg.viewer_budget, cfg.max_steps) == (True, 0, 64, 0.5, 7)
    assert cfg.init_opa == 0.5 and type(cfg.strategy).__name__ == "MCMCStrategy"  # the trainer's mcmc defaults
    cfg.validate()
    write_yaml(tmp_path / "cfg.yml", cfg.to_dict())
    text = (tmp_path / "cfg.yml").read_text()
    assert "viewer_res: 64" in text and "max_steps: 7" in text
    for bad, match in ((dict(port=70000), "--port must be in 0..65535"), (dict(viewer_res=8), "--viewer_res must be >= 16"),
                       (dict(viewer_budget=1.0), r"--viewer_budget must be in \(0, 1\)"),
                       (dict(max_steps=0), "--max_steps must be >= 1")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(cfg, **bad).validate()
    with pytest.raises(SystemExit):  # the trainer's own command line has no viewer
        parse(["default", "--disable_viewer"])
