"""The id hash and the split's normal samples on a GPU: the same integers as on CPU (int64
arithmetic wraps alike), the same normals to a few ulp (CUDA's log/cos are not the CPU's
bit for bit), so a split draws the same offsets on GPU and CPU ranks."""

import pytest
import torch

from distsplat.train.model.gaussians import derive_ids, hash_keys, initial_ids, normal_samples

pytestmark = pytest.mark.cuda


def test_ids_and_samples_match_the_cpu():
    ids = torch.cat([initial_ids((0, 5000)), derive_ids(torch.arange(5000), step=3, child=2)])
    assert torch.equal(hash_keys(7, ids.cuda()).cpu(), hash_keys(7, ids))
    assert torch.equal(derive_ids(ids.cuda(), 9, 1).cpu(), derive_ids(ids, 9, 1))
    # float64 log and cos: CUDA's libdevice is within 1-2 ulp of the correctly rounded value.
    torch.testing.assert_close(normal_samples(4, 9, ids.cuda(), 6).cpu(), normal_samples(4, 9, ids, 6),
                               rtol=1e-14, atol=1e-14)
