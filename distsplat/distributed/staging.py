"""Host staging of collectives (shared-GPU mode) and the count of device->host syncs.

NCCL refuses two ranks on one GPU. Shared-GPU mode (`init_distributed(shared_gpu=True)`
or DISTSPLAT_SHARED_GPU=1) runs W ranks on ONE GPU with a gloo group instead, for
correctness checks only (its speed means nothing). gloo reduces host memory, so every
collective of this package stages its device tensor explicitly: device -> pinned host
buffer (one sync: gloo reads the buffer on the CPU next), the gloo collective on the CPU,
then host -> device by transfer.to_device (non_blocking from pinned memory: no sync). Nothing here
relies on gloo's own CUDA support.

The same code runs on CPU tensors, where the copies are plain host copies; the private
switch `_force_staging` (tests only) stages a CPU gloo group, so CPU tests walk the
staged path.

`host_syncs()` counts the device->host transfers this package makes (the count exchange,
and each staged collective). On CPU tensors they cost nothing but are counted at the
same places, so a CPU run reports the count a CUDA run has. The counter is process-wide:
a backward that runs on the autograd engine's device thread is counted too.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

logger = logging.getLogger(__name__)

# The device every rank of this process group shares (shared-GPU mode), else None.
_shared_device: Optional[torch.device] = None
# Tests only: stage collectives of a gloo group although its tensors are on the CPU.
_force_staging = False
_syncs = 0


def set_shared_device(device: Optional[torch.device]) -> None:
    """Called by init_distributed: enters (a CUDA device) or leaves (None) shared-GPU mode."""
    global _shared_device
    _shared_device = device


def shared_device() -> Optional[torch.device]:
    """The one GPU all ranks share in shared-GPU mode; None otherwise."""
    return _shared_device


def staged(group: Optional[dist.ProcessGroup] = None) -> bool:
    """True when collectives of `group` go through host memory: a gloo group in
    shared-GPU mode (or with the tests' `_force_staging`)."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    if _shared_device is None and not _force_staging:
        return False
    return dist.get_backend(group) == "gloo"


def count_sync() -> None:
    """Records one device->host transfer (a stream sync on CUDA)."""
    global _syncs
    _syncs += 1


def host_syncs() -> int:
    """Device->host transfers made by distsplat.distributed so far in this process."""
    return _syncs


def host_empty(shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialized host buffer for data headed to `device`: pinned for CUDA, so the
    copy to the device can be asynchronous."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def to_host(x: Tensor) -> Tensor:
    """`x`'s values in a new host tensor a gloo collective may read or write: ONE counted
    device->host transfer (pinned buffer, then a sync of x's stream, because gloo reads
    the buffer on the CPU right after). A CPU `x` is copied, so a forced CPU run moves
    real buffers through the same steps."""
    count_sync()
    x = x.detach()
    if x.device.type == "cpu":
        return x.clone()
    host = host_empty(tuple(x.shape), x.dtype, x.device)
    host.copy_(x, non_blocking=True)
    torch.cuda.current_stream(x.device).synchronize()
    return host
