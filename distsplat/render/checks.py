"""Input validation for the render entry points: every bad input becomes a ValueError
that names the argument and what was expected, before any work (or any collective in the
distributed render, which calls the same checks) is done."""

from __future__ import annotations

import numbers
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

Dim = Union[int, str]

BACKENDS = ("auto", "torch", "gsplat")
RASTERIZE_MODES = ("classic", "antialiased")
RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
MAX_SH_DEGREE = 4


class ShapeChecker:
    """Checks tensors against symbolic shapes like ("N", 3), binding each letter on first
    sight so that later tensors must agree ("mismatched N")."""

    def __init__(self, fn: str):
        self.fn = fn
        self.dims: Dict[str, Tuple[int, str]] = {}  # letter -> (size, first argument)
        self.ref: Optional[Tuple[str, Tensor]] = None  # dtype/device reference

    def fail(self, msg: str) -> None:
        raise ValueError(f"{self.fn}: {msg}")

    def __call__(self, name: str, t: object, shape: Sequence[Dim], floating: bool = True) -> Tensor:
        want = "[" + ", ".join(str(d) for d in shape) + "]"
        if not isinstance(t, Tensor):
            self.fail(f"`{name}` must be a torch.Tensor of shape {want}, got {type(t).__name__}")
        if t.dim() != len(shape):
            self.fail(f"`{name}` must have shape {want}, got {tuple(t.shape)}")
        for size, d in zip(t.shape, shape):
            if isinstance(d, int):
                if size != d:
                    self.fail(f"`{name}` must have shape {want}, got {tuple(t.shape)}")
            elif d in self.dims and self.dims[d][0] != size:
                first_size, first = self.dims[d]
                self.fail(
                    f"mismatched {d}: `{name}` has {d}={size} (shape {tuple(t.shape)}) "
                    f"but `{first}` has {d}={first_size}"
                )
            else:
                self.dims.setdefault(d, (size, name))
        if floating:
            if not t.is_floating_point():
                self.fail(f"`{name}` must be a floating-point tensor, got {t.dtype}")
            if self.ref is None:
                self.ref = (name, t)
            else:
                ref_name, ref = self.ref
                if t.dtype != ref.dtype or t.device != ref.device:
                    self.fail(
                        f"`{name}` is {t.dtype} on {t.device} but `{ref_name}` is "
                        f"{ref.dtype} on {ref.device}; pass all tensors with one dtype "
                        "on one device"
                    )
        return t

    def dim(self, letter: str) -> int:
        return self.dims[letter][0]


def nonfinite(named: Sequence[Tuple[str, Tensor]]) -> List[str]:
    """The names of the tensors holding NaN or Inf: one host sync for all of them."""
    if not named:
        return []
    flags = torch.stack([torch.isfinite(t.detach()).all() for _, t in named]).tolist()
    return [name for (name, _), ok in zip(named, flags) if not ok]


def check_finite(fn: str, named: Sequence[Tuple[str, Tensor]]) -> None:
    """One host sync for all tensors: names every argument holding NaN or Inf."""
    bad = nonfinite(named)
    if bad:
        raise ValueError(
            f"{fn}: {', '.join('`' + b + '`' for b in bad)} contain NaN or Inf values; "
            "check the parameters (a diverged optimizer step or a bad input file)"
        )


def check_image_size(fn: str, width: object, height: object) -> None:
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
            raise ValueError(f"{fn}: `{name}` must be a positive int, got {v!r}")


def check_choice(fn: str, name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{fn}: unknown {name} {value!r}; expected one of {', '.join(choices)}")


def check_colors(
    check: ShapeChecker, colors: object, sh_degree: Optional[int]
) -> None:
    """colors [N, D] when sh_degree is None, SH coefficients [N, K, 3] otherwise."""
    if sh_degree is None:
        check("colors", colors, ("N", "D"))
        return
    if isinstance(sh_degree, bool) or not isinstance(sh_degree, int) or not (
        0 <= sh_degree <= MAX_SH_DEGREE
    ):
        check.fail(f"`sh_degree` must be an int in 0..{MAX_SH_DEGREE} or None, got {sh_degree!r}")
    check("colors", colors, ("N", "K", 3))
    k = check.dim("K")
    if k < (sh_degree + 1) ** 2:
        check.fail(
            f"`colors` holds K={k} SH coefficients but sh_degree={sh_degree} needs "
            f"at least {(sh_degree + 1) ** 2}: pass colors of shape [N, {(sh_degree + 1) ** 2}, 3] "
            "or lower sh_degree"
        )


def resolve_backend(fn: str, backend: str, device: torch.device) -> str:
    """'auto' -> gsplat on CUDA, torch otherwise; gsplat on CPU tensors is an error."""
    check_choice(fn, "backend", backend, BACKENDS)
    if backend == "auto":
        return "gsplat" if device.type == "cuda" else "torch"
    if backend == "gsplat" and device.type != "cuda":
        raise ValueError(
            f"{fn}: backend 'gsplat' runs gsplat's CUDA kernels and needs CUDA tensors, "
            f"got tensors on {device}; use backend='torch' (or 'auto') on CPU"
        )
    return backend
