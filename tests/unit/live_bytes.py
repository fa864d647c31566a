"""Peak bytes of the tensors a block of code creates, counted exactly (no RSS noise): a
dispatch mode sees every op's outputs, forward and backward (the autograd engine carries it
into backward), and a weak reference to each new storage subtracts its bytes when it is
freed. Tensors that existed before the block are not counted."""

import weakref
from typing import Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """`with LiveBytes() as live: ...`; then live.peak (bytes at the peak) and live.now."""

    def __init__(self):
        super().__init__()
        self.now = self.peak = 0
        self._refs: Dict[int, weakref.ref] = {}

    def _freed(self, key: int, nbytes: int) -> None:
        self._refs.pop(key, None)
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._refs:  # a new storage (views share their base's)
                    n = storage.nbytes()
                    self._refs[key] = weakref.ref(storage, lambda _r, k=key, n=n: self._freed(k, n))
                    self.now += n
                    self.peak = max(self.peak, self.now)
        return out
