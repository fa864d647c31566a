"""distsplat.data: scenes and images, up to the point where a rank's own images sit on its
device (docs/design.md, the rank-sharded loader).

    parse (colmap / blender / nerfstudio / synthetic) -> Scene (all cameras; images by reference)
    Scene.images: ImageSource (folder, tar shards, in-memory)
    ImageCache(own_cameras, mode) -> ImageLoader(schedule) -> Batch of own images on the device

Never imports distsplat.render or torch.distributed: ownership (which cameras this rank
reads) comes in from the distributed batcher as a plain sequence of camera indices.
"""

from .blender import load_blender, write_blender
from .cache import CACHE_MODES, ImageCache, choose_mode, fit_mode, mem_available, mem_total, ram_budget
from .colmap import load_colmap
from .decode import ImageSpec, check_images, decode_into
from .errors import DataError, OwnershipError
from .loader import Batch, ImageLoader
from .nerfstudio import load_nerfstudio
from .scene import Scene
from .shards import TarShardSource, pack_shards
from .sources import ArraySource, FolderSource, ImageSource
from .synthetic import make_synthetic_scene

__all__ = [
    "ArraySource", "Batch", "CACHE_MODES", "DataError", "FolderSource", "ImageCache", "ImageLoader", "ImageSource",
    "ImageSpec", "OwnershipError", "Scene", "TarShardSource", "check_images", "choose_mode", "decode_into",
    "fit_mode", "mem_available", "mem_total",
    "load_blender", "load_colmap", "load_nerfstudio", "make_synthetic_scene", "pack_shards", "ram_budget", "write_blender",
]
