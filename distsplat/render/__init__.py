"""distsplat.render: one-process projection, SH and tile rasterization behind one
interface with two backends (`torch`: pure PyTorch, any device; `gsplat`: CUDA kernels).

    rasterize = project (Gaussians x cameras -> packed Pairs) + rasterize_pairs (Pairs -> images)
"""

from .api import check_inputs, make_meta, project, rasterize, rasterize_pairs
from .pairs import Pairs

__all__ = ["Pairs", "check_inputs", "make_meta", "project", "rasterize", "rasterize_pairs"]
