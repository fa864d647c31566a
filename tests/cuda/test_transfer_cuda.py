"""transfer.to_device to a GPU: from pinned memory, queued on the current stream (a pinned
source is used as it is), the values those of the source. Needs a GPU."""

import pytest
import torch

from distsplat.transfer import to_device

pytestmark = pytest.mark.cuda


def test_cpu_to_cuda_keeps_values_from_pinned_and_pageable_sources():
    dev = torch.device("cuda", torch.cuda.current_device())
    for x in (torch.arange(1000), torch.arange(1000).pin_memory()):
        y = to_device(x, dev)
        assert y.device == dev and torch.equal(y.cpu(), x)
    g = torch.ones(3, device=dev)
    assert to_device(g, dev) is g
    assert torch.equal(to_device(g, torch.device("cpu")), torch.ones(3))
