"""Host -> device copies that never stall the host: the one `to_device` of every layer (the
step's small index tensors, a staged collective's result, the poses of a batch).

Below every layer, as profiling.py: any layer may import it; it imports only torch."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["to_device"]


def to_device(x: Tensor, device: torch.device) -> Tensor:
    """`x` on `device`, without stalling the host. A CPU tensor bound for CUDA is copied from
    pinned memory with non_blocking=True, so the copy is queued on the current stream: `x`
    itself when it is pinned already, else a pinned copy (torch's caching host allocator keeps
    that buffer alive until the copy has run; a pageable source would block until it lands).
    Anything else is `x.to(device)`: `x` itself when it is on `device` already (no copy: the
    caller must not write into the result expecting `x` to stay as it was)."""
    device = torch.device(device)
    if device.type != "cuda" or x.device.type != "cpu":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)
