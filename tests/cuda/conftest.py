"""gsplat's compiled ops for every CUDA test, loaded once per session before any test calls
gsplat directly (gsplat.rasterization, the relocation kernel): the prebuilt extension from
$DISTSPLAT_GSPLAT_EXT, else gsplat's JIT build, once, in this process."""

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def gsplat_ops():
    if torch.cuda.is_available():
        from distsplat.render.gsplat_ext import ensure_gsplat_ops

        print(f"gsplat ops: {ensure_gsplat_ops()}")
