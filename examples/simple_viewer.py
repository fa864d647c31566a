"""Open a finished model in the browser, on one process or many:

    python examples/simple_viewer.py --ckpt results/garden/ckpts            # newest checkpoint
    python examples/simple_viewer.py --ckpt results/garden/ply/point_cloud_30000.ply
    torchrun --standalone --nproc_per_node=4 examples/simple_viewer.py --ckpt results/garden/ckpts

Each rank loads its chunk of the Gaussians (a checkpoint written by any number of ranks is
re-chunked); frames are rendered with the distributed render. Then open
http://127.0.0.1:8080 (through `ssh -L 8080:127.0.0.1:8080 HOST` on a remote machine).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Literal, Optional

from distsplat.distributed import destroy, init_distributed, setup_logging
from distsplat.viewer import LiveViewer, RenderModel, load_model, model_view, training_view

log = logging.getLogger("distsplat.viewer")


@dataclass
class Args:
    ckpt: str
    """A checkpoint (R/ckpts/step_N, or R/ckpts for the newest) or a 3DGS PLY file."""
    port: int = 8080
    viewer_host: str = "127.0.0.1"
    """Address to serve on; 0.0.0.0 exposes the viewer to the network."""
    viewer_res: int = 1024
    """Longest side of the rendered frames in pixels (the panel changes it)."""
    backend: Literal["auto", "torch", "gsplat"] = "auto"
    seconds: Optional[float] = None
    """Stop after this many seconds (default: until Ctrl-C)."""


def main(args: Args) -> None:
    ctx = init_distributed()
    setup_logging(ctx)
    viewer = None
    try:
        model = load_model(args.ckpt, ctx)
        # The run's first training camera (R/cameras.json), else a view framing every Gaussian
        view = training_view(model.source) or model_view(model.params["means"])
        viewer = LiveViewer.start(ctx, args.viewer_host, args.port, max_side=args.viewer_res)
        info = (f"model: `{model.source}`  \nGaussians: {model.n_all:,} on {ctx.world_size} "
                f"rank(s)  \nSH degree: {model.sh_degree}")
        if ctx.is_main:
            log.info("%s: %d Gaussians, SH degree %d", model.source, model.n_all, model.sh_degree)
        render = RenderModel(model.activated, model.sh_degree,
                             {**model.render_kwargs, "backend": args.backend})
        viewer.serve(render, seconds=args.seconds, info=info, view=view)
    except ValueError as e:
        print(f"distsplat: error{f' on rank {ctx.rank}' if ctx.rank else ''}: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        pass
    finally:
        if viewer is not None:
            viewer.close()
        destroy(ctx)


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
