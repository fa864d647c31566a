"""distsplat: multi-GPU distributed 3D Gaussian Splatting training."""

__version__ = "0.1.0"
