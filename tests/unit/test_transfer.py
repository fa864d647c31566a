"""The one host -> device copy (distsplat/transfer.py): a tensor already where it goes is
itself (no copy), a copy keeps values and dtype; tests/cuda/test_transfer_cuda.py checks the
pinned, queued path to a GPU."""

import torch

from distsplat.transfer import to_device


def test_a_tensor_already_there_is_itself():
    x = torch.arange(5)
    assert to_device(x, torch.device("cpu")) is x
    assert to_device(x, "cpu") is x


def test_a_copy_to_another_device_keeps_values_and_dtype():
    x = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    y = to_device(x, torch.device("meta"))  # a non-CUDA device: plain x.to(device)
    assert y.device.type == "meta" and y.dtype == x.dtype and y.shape == x.shape
