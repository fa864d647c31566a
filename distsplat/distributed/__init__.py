"""distsplat.distributed: the only package that talks to torch.distributed.

    init_distributed / DistContext   process layout from torchrun's environment
    CameraBatcher                    shared-seed batches, fixed camera -> owner rank
    chunk_bounds / local_chunk       contiguous Gaussian chunks
    distributed_rasterize            project -> packed all-to-all -> rasterize own cameras
    raise_together / describe_failure  agree on setup errors; name the rank that failed
    staging                          shared-GPU mode (DISTSPLAT_SHARED_GPU=1: W ranks on one
                                     GPU over gloo, correctness only) and the host-sync count
"""

from .batcher import CameraBatch, CameraBatcher
from .context import (
    DistContext,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    broadcast,
    destroy,
    init_distributed,
    rank,
    setup_logging,
    world_size,
)
from .failures import (PeerFailure, describe_failure, failure_recorded, is_peer_failure, raise_together,
                       record_for_launcher)
from .partition import chunk_bounds, gather_counts, local_chunk, move_rows
from .render import distributed_rasterize
from . import staging  # noqa: E402  (a module, for staging.host_syncs())

__all__ = [
    "CameraBatch", "CameraBatcher", "DistContext", "all_reduce_max", "all_reduce_sum",
    "barrier", "broadcast", "chunk_bounds", "destroy", "distributed_rasterize", "init_distributed",
    "gather_counts", "local_chunk", "move_rows", "rank", "setup_logging", "world_size",
    "PeerFailure", "describe_failure", "failure_recorded", "is_peer_failure", "raise_together",
    "record_for_launcher",
]
