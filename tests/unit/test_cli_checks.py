"""The checks the CLI runs on every rank before the first collective (the end-to-end
cases are in tests/distributed/test_bad_input_catalog.py): flag values and the result dir."""

import os

import pytest
import torch

from distsplat.train.config import default_config
from distsplat.train.outputs import check_result_dir


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
