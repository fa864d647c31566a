"""Open a finished model in the browser, on one process or many:

    python examples/simple_viewer.py --ckpt results/garden/ckpts            # newest checkpoint
    python examples/simple_viewer.py --ckpt results/garden/ply/point_cloud_30000.ply
    python examples/simple_viewer.py --ckpt results/garden/ckpts/ckpt_29999_rank0.pt    # gsplat's
    torchrun --standalone --nproc_per_node=4 examples/simple_viewer.py --ckpt results/garden/ckpts

Each rank loads its chunk of the Gaussians (a checkpoint written by any number of ranks is
re-chunked); frames are rendered with the distributed render. Then open the URL it prints:
http://127.0.0.1:8080, or another port when 8080 is taken (through `ssh -L PORT:127.0.0.1:PORT
HOST` on a remote machine). Bad input is one `distsplat: error` line (rank 0's), exit code 2.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import List, Literal, Optional, Union

from distsplat.distributed import destroy, init_distributed, raise_together, setup_logging
from distsplat.cli import exit_bad_input
from distsplat.viewer import LiveViewer, RenderModel, load_model, model_view, training_view

log = logging.getLogger("distsplat.viewer")


@dataclass
class Args:
    ckpt: Union[str, List[str]]
    """A checkpoint (R/ckpts/step_N, or R/ckpts for the newest), gsplat's checkpoint .pt files (as gsplat's
    simple_viewer.py takes them: a list, or one of a distributed run's per-rank files) or a 3DGS PLY file."""
    port: Optional[int] = None
    """Port to serve on. None: 8080, or a free port when 8080 is taken (the log says which);
    an explicit port that is taken is an error."""
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
        error = None
        try:  # every rank reads the same file: agreed, so that rank 0 alone says what is wrong
            model = load_model(args.ckpt if isinstance(args.ckpt, str) else os.pathsep.join(args.ckpt), ctx)
        except Exception as e:  # noqa: BLE001 - every rank must reach the agreement
            error = e
        raise_together(ctx, error, "loading the model")
        # The run's first training camera (R/cameras.json), else a view framing every Gaussian
        view = training_view(model.source) or model_view(model.params["means"])
        viewer = LiveViewer.start(ctx, args.viewer_host, args.port, max_side=args.viewer_res,
                                  port_hint="pass a free --port, or none for 8080 or a free port")
        info = (f"model: `{model.source}`  \nGaussians: {model.n_all:,} on {ctx.world_size} "
                f"rank(s)  \nSH degree: {model.sh_degree}")
        if ctx.is_main:
            log.info("%s: %d Gaussians, SH degree %d", model.source, model.n_all, model.sh_degree)
        render = RenderModel(model.activated, model.sh_degree,
                             {**model.render_kwargs, "backend": args.backend})
        viewer.serve(render, seconds=args.seconds, info=info, view=view)
    except ValueError as e:  # a bad --ckpt or a taken --port: one line, exit 2
        exit_bad_input(e)
    except KeyboardInterrupt:
        pass
    finally:
        if viewer is not None:
            viewer.close()
        destroy(ctx)


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
