"""distsplat.viewer: the viser live viewer (docs/design.md layer above train).

    LiveViewer.start(ctx, host, port, ...)   rank 0 serves; a bad port fails on every rank
    viewer.on_step                           the trainer hook (trainer.step_hooks)
    attach_live_viewer(cfg, ctx, trainer)    the trainer CLI's extension (distsplat.app)
    viewer.serve(RenderModel)                a finished model (examples/simple_viewer.py)
    render_view(model, camera, device)       the frame callback: distributed render, rank 0's image
    load_model(path, ctx)                    this rank's chunk of a checkpoint or PLY
    training_view(source)                    a browser's first view: the run's first training camera

Never imports torch.distributed: collectives come from distsplat.distributed.
"""

from .camera import PollMessage, ViewCamera, initial_view, render_size, view_camera
from .live import LiveViewer, RenderModel, attach_live_viewer, render_view, trainer_model
from .model import LoadedModel, load_model, model_view, read_ply_chunk, training_view
from .pacing import Pacer
from .server import ViewerServer, check_port, port_error_message

__all__ = [
    "LiveViewer", "LoadedModel", "attach_live_viewer", "Pacer", "PollMessage", "RenderModel", "ViewCamera",
    "ViewerServer", "check_port", "initial_view", "load_model", "model_view",
    "port_error_message", "read_ply_chunk", "render_size", "render_view", "trainer_model",
    "training_view", "view_camera",
]
