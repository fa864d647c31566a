"""The trainer's configuration: one dataclass whose fields (and docstrings) are the trainer's
flags of `examples/simple_trainer.py` (distsplat.app adds the viewer's, viewer/config.py), with
gsplat's names and defaults where they overlap so a gsplat user's command line works.
`validate()` turns every bad value into a ValueError naming the flag, raised identically on
every rank before any collective."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import List, Literal, Optional, Tuple, Union

from .model.strategies import DefaultStrategy, MCMCStrategy

GROW_GRAD2D, ABSGRAD_GROW_GRAD2D = 0.0002, 0.0008  # gsplat's thresholds without / with absgrad


@dataclass
class SyntheticConfig:
    """The built-in scene used when no --data_dir is given."""

    kind: Literal["tabletop", "ball"] = "tabletop"
    """tabletop: a ball, a cube and a cylinder on a checkered ground (to look at); ball: random
    Gaussians in a ball (the tests' tiny scene)."""
    num_cameras: int = 32
    """Cameras on a ring around the ground-truth Gaussians."""
    num_gaussians: int = 3000
    """Ground-truth Gaussians of the ball scene (tabletop: ~3600 x --synthetic.detail)."""
    detail: float = 1.0
    """Scales the number of the tabletop scene's Gaussians."""
    width: int = 96
    height: int = 72
    seed: int = 0
    exposure: float = 1.0
    """Scale each training image's brightness by a known factor, log-uniform in [1/E, E] (seeded), as a phone's
    auto exposure changes from frame to frame (for --use_bilateral_grid or --app_opt to learn); the test images
    keep the scene's own colours, which the training images' gains average to (each channel's geometric mean over
    them is 1). 1: no change."""
    white_balance: float = 0.0
    """Scale each training image's channels by known factors uniform in [1 - WB, 1 + WB] (white balance)."""


@dataclass
class Config:
    data_dir: Optional[str] = None
    """Scene folder: COLMAP (images/ + sparse/0/, or a model one folder down such as colmap_sparse/0/), Blender/
    NeRF-synthetic (transforms_train.json, transforms_test.json), nerfstudio or instant-ngp (transforms.json). With
    several, a COLMAP model is read (it has the points) and the log says what else is there. None: the built-in
    synthetic scene."""
    data_format: Literal["auto", "colmap", "blender", "transforms"] = "auto"
    """Which scene description of --data_dir to read when it holds several: colmap (a COLMAP model), blender
    (transforms_train.json) or transforms (transforms.json, nerfstudio or instant-ngp). auto: the first of these found."""
    colmap_dir: Optional[str] = None
    """The COLMAP model folder to read (relative to --data_dir when relative), e.g. colmap_sparse/0; the images
    still come from --data_dir's images/ (images_N/). None: sparse/0, sparse/, or the one found a folder down."""
    skip_missing_images: bool = False
    """Train without the images that the scene's model lists but the folder lacks (one warning naming them) instead
    of stopping. An instant-ngp transforms.json always skips them, as instant-ngp does."""
    data_factor: int = 4
    """Downscale factor of the images (reads images_N/ when present, else resizes on load)."""
    result_dir: str = "results/default"
    """Where stats/, ckpts/, ply/, renders/, tb/ and cfg.yml are written."""
    test_every: int = 8
    """Every N-th image is a test image (when the scene has no test.txt)."""
    normalize_world_space: bool = True
    """Centre and scale the scene like gsplat's parser."""
    global_scale: float = 1.0
    """Scale of the scene-size dependent settings (learning rate of means, pruning)."""

    max_steps: int = 30_000
    steps_scaler: float = 1.0
    """Scales every step count below (and the strategy's schedule)."""
    batch_size: int = 1
    """Cameras per rank per step; the global batch is batch_size x world size."""
    schedule_in_images: bool = False
    """Count every step number (max_steps, eval/save steps, the strategy's refine and reset steps,
    sh_degree_interval) in images seen, as at a global batch of 1: each is divided by the global
    batch, so W GPUs run the 1-GPU schedule in W times fewer steps (gsplat's `--steps_scaler 1/W`,
    made automatic). Combines with --steps_scaler. Off: step numbers are steps, as in gsplat."""
    eval_steps: List[int] = field(default_factory=lambda: [7_000, 30_000])
    save_steps: List[int] = field(default_factory=lambda: [7_000, 30_000])
    save_ply: bool = True
    """Write a merged PLY at every save step (or at --ply_steps)."""
    ply_steps: Optional[List[int]] = None
    """Steps to write the merged PLY at (and the last step), as gsplat; None: with each checkpoint (--save_steps)."""
    keep_ckpts: int = 2
    """Complete checkpoints kept on disk (older ones are removed once a newer one is whole)."""
    ckpt: Optional[str] = None
    """Resume from this checkpoint (R/ckpts/step_N or R/ckpts), on any number of ranks; or gsplat's checkpoint
    files (--ckpt R/ckpts/ckpt_6999_rank0.pt [more .pt]: a distributed run's other ranks' files beside it are
    read too) to score (--eval_only), render (--render_only) or train on from their step; or a 3DGS PLY to score
    or render."""
    resume: bool = True
    """Without --ckpt, resume from the newest checkpoint in --result_dir/ckpts saved with the same flags that change
    the result (docs/robustness.md lists the others): a requeued or restarted job goes on where it stopped, on any
    number of ranks, and a finished run says so and writes nothing. A checkpoint there of other flags is refused,
    naming them. --no-resume starts from step 0 (its saves replace the old checkpoints of the same steps)."""
    save_every_minutes: float = 30.0
    """Also save a checkpoint (without the PLY) once this many minutes have passed since the last save, by rank 0's
    clock, every rank at the same step: a dead rank or node then costs at most this much training. These interim
    checkpoints (and a stop signal's) are pruned once a newer --save_steps or final one is whole, at most
    --keep_ckpts of them kept. 0: off."""

    init_type: Literal["auto", "sfm", "random", "ply"] = "auto"
    """Initial Gaussians: sfm (the scene's sparse points; an error when it has none), random (--init_num_pts
    points in a cube of half-size --init_extent x the cameras' extent), ply (the model of --init_ply), auto: ply
    with --init_ply, else sfm when the scene has points, else random, and the log says which."""
    init_ply: Optional[str] = None
    """The initial model of --init_type ply: any 3DGS PLY (the original implementation's, gsplat's, ours) or
    gsplat's checkpoint .pt files; training starts from step 0 with it."""
    model_frame: Literal["auto", "normalized", "capture"] = "auto"
    """World of a model read from a file (--init_ply, or --ckpt of gsplat's .pt / a PLY): normalized (the world
    this run trains in, gsplat's and distsplat's outputs by default) or capture (the input's own, e.g. COLMAP's,
    as the original 3DGS implementation writes PLYs), moved into the run's world. auto: a distsplat run's PLY as
    its transform.json says, gsplat's .pt and a gsplat run's PLY normalized, any other PLY capture."""
    init_num_pts: int = 100_000
    """Points of a random initialisation."""
    init_extent: float = 3.0
    """Half-size of a random initialisation's cube, in units of the scene scale (the cameras' extent)."""
    init_opa: float = 0.1
    init_scale: float = 1.0
    sh_degree: int = 3
    sh_degree_interval: int = 1000
    """Raise the SH degree in use by one every this many steps."""

    ssim_lambda: float = 0.2
    ssim_impl: Literal["auto", "fused", "torch"] = "auto"
    """The training loss's SSIM: fused-ssim's CUDA kernels (the package gsplat's trainer uses:
    pip install git+https://github.com/rahul-goel/fused-ssim), or PyTorch convolutions; the same
    definition (zero padding). auto: fused on a GPU when the package is installed."""
    opacity_reg: float = 0.0
    """Weight of the mean opacity in the loss (gsplat's MCMC preset: 0.01)."""
    scale_reg: float = 0.0
    """Weight of the mean scale in the loss (gsplat's MCMC preset: 0.01)."""
    near_plane: float = 0.01
    far_plane: float = 1e10
    packed: bool = True
    """Packed (sparse) projection; the distributed exchange always sends packed pairs."""
    antialiased: bool = False
    random_bkgd: bool = False
    """Composite renders on a random background each step (regularizes opacity)."""

    lr_batch_scaling: Literal["visibility", "sqrt", "linear"] = "visibility"
    """How the learning rates grow with the global batch B (train/batch_scaling.py): visibility:
    lr x sqrt(B (1 + (B - 1) p)), p the fraction of the training cameras that see a Gaussian
    (measured as training starts): a batch step moves the Gaussians as far as B one-image steps, from
    lr x B when every view sees everything to gsplat's and Grendel-GS's lr x sqrt(B) when each
    Gaussian is seen by one view of the batch; sqrt, linear: those two limits."""
    means_lr: float = 1.6e-4
    scales_lr: float = 5e-3
    opacities_lr: float = 5e-2
    quats_lr: float = 1e-3
    sh0_lr: float = 2.5e-3
    shN_lr: float = 2.5e-3 / 20

    # Depth loss (issue 18; gsplat's flags and defaults)
    depth_loss: bool = False
    """Add gsplat's disparity loss at each training image's sparse SfM points (COLMAP tracks)."""
    depth_lambda: float = 1e-2
    """Weight of the depth loss."""

    # Pose optimization (issue 18; gsplat's flags and defaults)
    pose_opt: bool = False
    """Learn a pose correction per training camera (gsplat's CameraOptModule)."""
    pose_opt_lr: float = 1e-5
    pose_opt_reg: float = 1e-6
    """Weight decay of the pose corrections."""
    pose_noise: float = 0.0
    """Perturb the training poses (std of gsplat's 9 correction components) to test --pose_opt."""

    # Appearance optimization (issue 18; gsplat's flags and defaults)
    app_opt: bool = False
    """Learn a per-image appearance embedding and a colour MLP (gsplat's AppearanceOptModule); test
    images, paths and the PLY use a zero embedding."""
    app_embed_dim: int = 16
    """Appearance embedding dimension."""
    app_opt_lr: float = 1e-3
    """Learning rate of the colour MLP (the embeddings' is 10x, as gsplat)."""
    app_opt_reg: float = 1e-6
    """Weight decay of the appearance embeddings."""

    # Bilateral grid (issue 46; gsplat's flags and defaults; train/model/bilateral_grid.py)
    use_bilateral_grid: bool = False
    """Learn a bilateral grid per training image (gsplat's): an affine colour transform per cell of (x, y,
    luminance) applied to the image's render before its loss, absorbing per-image exposure and white balance;
    each grid lives on its image's owner rank. The evaluation adds cc_psnr, cc_ssim, cc_lpips (colour-corrected)."""
    bilateral_grid_shape: Tuple[int, int, int] = (16, 16, 8)
    """Cells of each grid along x, y and luminance."""
    use_fused_bilagrid: bool = False
    """gsplat's fused CUDA kernels of the same grid: turns the grid on; distsplat slices it with PyTorch's
    grid_sample (the same trilinear lookup)."""

    strategy: Union[DefaultStrategy, MCMCStrategy] = field(default_factory=DefaultStrategy)
    """Densification: gsplat's DefaultStrategy or MCMCStrategy, run on each rank's Gaussians.
    MCMC's cap_max is the GLOBAL cap, split across ranks."""
    rebalance_ratio: float = 1.5
    """After densification, rebalance when the largest rank holds more than this times the smallest's Gaussians."""
    # Balanced ranks (issue 33; distsplat/train/model/balance.py): a step lasts as long as its slowest rank
    balance_cameras: bool = True
    """Balance the rasterization: once per epoch the ranks agree every camera's cost (its pairs at its last
    render, counted from the projection's own output: one all-reduce per epoch; per step no collective or host
    read, 3 device ops noting the batch cameras' pairs), and in the next epoch every step renders, on every
    rank, own cameras of the same cost stratum (each camera still once per epoch; the sequence a function of
    the seed and the agreed costs, which checkpoints keep). The first
    epoch, with no costs known, keeps the seeded order. Off (--no-balance-cameras): the seeded order always."""
    balance_pairs: bool = True
    """Balance the projection: the initial SfM points are dealt to the ranks in a seeded shuffled order (each
    rank's chunk then samples the whole scene, so every camera's pairs split evenly), and at each epoch's
    agreement the chunk boundaries move so that every rank projects about the same pairs when their max/mean
    passes --balance_pairs_ratio (Gaussians move with their Adam state, as --rebalance_ratio's do; the ranks'
    Gaussian counts stay within half of --rebalance_ratio's spread). Off (--no-balance-pairs): chunks of equal
    Gaussian counts, in the points' own order."""
    balance_pairs_ratio: float = 1.03
    """--balance_pairs moves chunk boundaries when the ranks' projected pairs per step over the last epoch
    differ by more than this max/mean."""

    backend: Literal["auto", "torch", "gsplat"] = "auto"
    """Render backend: gsplat's CUDA kernels on GPU, the PyTorch reference on CPU."""
    cache: Literal["auto", "none", "compressed", "decoded", "gpu"] = "auto"
    """Per-rank image cache (each rank only ever holds its own cameras' images). An explicit
    mode whose share does not fit its memory falls back to the largest that does, with a warning."""
    cache_budget_gb: Optional[float] = None
    """Memory (GiB) one rank's image cache may hold: host RAM, or device memory for --cache gpu.
    None: measured (auto: half of the available RAM, capped by the cgroup limit, / LOCAL_WORLD_SIZE;
    an explicit mode: 90% of it, or of the free CUDA memory for gpu)."""
    memory_limit_gb: Optional[float] = None
    """Memory (GiB) of one rank for densification: a rank whose usage plus the next growth would
    pass --memory_fraction of it stops growing Gaussians (pruning and MCMC relocation continue) and
    says so. None: the GPU's total memory, or min(MemTotal, cgroup limit) / LOCAL_WORLD_SIZE on CPU."""
    memory_fraction: float = 0.9
    """Fraction of --memory_limit_gb that densification may fill."""
    num_workers: int = 4
    """Decode threads per rank."""
    prefetch: int = 2
    """Batches decoded ahead of the step that needs them."""

    # Divergence guard (issue 21; distsplat/train/guards/faults.py)
    max_bad_steps: int = 10
    """A step whose loss or gradients are NaN/Inf on any rank is skipped on every rank (no update); after this
    many in a row the run saves the last good state and stops. 0: no check (one small all-reduce less per step)."""

    # --- Several nodes (issue 20): images staged on each node's local disk (train/node_data.py)
    node_local_data: bool = False
    """Each node holds only the images its ranks own (scripts/stage_nodes.py copies them; COLMAP, Blender,
    nerfstudio, files or tar shards): the scene is read touching one image per camera size, and each rank checks at
    setup that it has every image it owns, naming the missing ones. Off: every rank checks every image."""

    # --- Training from tar shards (issue 20; scripts/pack_shards.py, train/scene_setup.py)
    data_shards: Optional[str] = None
    """index.json of tar shards holding the scene's images (scripts/pack_shards.py; relative to --data_dir when
    relative), read instead of the image files: COLMAP images by their model names (pack images_N/ or images/),
    Blender/nerfstudio frames by their file_path (pack --data_dir). Each rank reads only its own images (their
    headers checked at setup); images at the cameras' full size are downscaled on load when --data_factor > 1."""

    # --- Outputs in known coordinates (issue 32; train/files/coords.py)
    ply_frame: Literal["normalized", "capture"] = "normalized"
    """World of the PLYs and R/cameras.json: normalized (the world the model trains in, as gsplat's PLY; with
    --normalize_world_space the input is centred, rotated and scaled on load) or capture (the input's own, e.g.
    COLMAP's: means, scales, rotations and SH colours transformed back). R/transform.json holds the 4x4 either way."""

    tb_every: int = 100
    """TensorBoard scalars every N steps (rank 0)."""
    tb_save_image: bool = False
    """Also rank 0's training images of the step (ground truth | render) every --tb_every steps, as gsplat."""
    log_every: int = 100
    seed: int = 42

    # --- Scoring and rendering a finished run (eval only, LPIPS, camera-path videos) ---
    eval_only: bool = False
    """Score the checkpoint of --ckpt on the test cameras without training (on any number of ranks):
    stats/val_stepNNNN.json and .csv and the side-by-side renders, as the training's evaluation."""
    render_only: bool = False
    """Render a camera path through the checkpoint of --ckpt (RGB and depth) to R/videos/ as an MP4
    and PNG frames, without training."""
    render_traj_path: Literal["interp", "ellipse", "spiral"] = "interp"
    """Camera path of --render_only (and of the videos of --no-disable-video): interpolated through the training
    cameras, an ellipse around the scene, or a spiral around the mean camera (forward-facing captures)."""
    disable_video: bool = True
    """No trajectory video after each evaluation (gsplat renders one unless --disable_video): --no-disable-video
    renders --render_traj_path's path to R/videos/ after each evaluation, as gsplat."""
    render_traj_frames: int = 120
    """Frames of the --render_only camera path."""
    render_fps: int = 30
    lpips_net: Literal["alex", "vgg"] = "alex"
    """LPIPS backbone (gsplat reports alex)."""
    lpips_weights: Optional[str] = None
    """LPIPS backbone file (torchvision's alexnet-owt-7be5be79.pth / vgg16-397923af.pth). None: torch hub's
    cache, downloaded there once when missing and the machine is online (DISTSPLAT_NO_DOWNLOAD=1: never);
    without it LPIPS is skipped, and the log and JSON say so."""
    lpips_heads: Optional[str] = None
    """LPIPS linear heads (lpips' v0.1 alex.pth / vgg.pth). None: from an installed torchmetrics or lpips,
    or torch hub's cache (downloaded like the backbone)."""

    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def schedule_factor(self, world_size: int) -> float:
        """What every step number is multiplied by on world_size ranks: --steps_scaler, divided by
        the global batch under --schedule_in_images."""
        batch = max(self.batch_size, 1) * world_size  # (a bad --batch_size is validate()'s to report)
        return self.steps_scaler / batch if self.schedule_in_images else self.steps_scaler

    def describe_schedule(self, world_size: int) -> str:
        """One line (rank 0 logs it): the global batch and the schedule in steps and images."""
        B, s = self.batch_size * world_size, self.strategy
        reset = f", opacity reset every {s.reset_every}" if isinstance(s, DefaultStrategy) else ""
        if self.schedule_in_images:
            how = "divided by the global batch: --schedule_in_images"
        else:
            how = "as given" + ("" if B == 1 else "; --schedule_in_images runs the 1-GPU schedule in images")
        return (f"global batch {B} ({world_size} rank(s) x --batch_size {self.batch_size}), {B} image(s) per step: "
                f"{self.max_steps} steps = {self.max_steps * B} images; refine from step {s.refine_start_iter} "
                f"to {s.refine_stop_iter} every {s.refine_every}{reset}; SH degree +1 every "
                f"{self.sh_degree_interval} (step numbers {how})")

    def adjust_steps(self, factor: float) -> None:
        """gsplat's steps_scaler: every schedule scaled by factor (rounded down, as gsplat)."""
        if factor == 1.0:
            return
        self.max_steps = int(self.max_steps * factor)
        self.eval_steps = [int(s * factor) for s in self.eval_steps]
        self.save_steps = [int(s * factor) for s in self.save_steps]
        if self.ply_steps is not None:
            self.ply_steps = [int(s * factor) for s in self.ply_steps]
        self.sh_degree_interval = max(1, int(self.sh_degree_interval * factor))
        s = self.strategy
        s.refine_start_iter = int(s.refine_start_iter * factor)
        s.refine_stop_iter = int(s.refine_stop_iter * factor)
        s.refine_every = max(1, int(s.refine_every * factor))
        if isinstance(s, DefaultStrategy):
            s.reset_every = max(1, int(s.reset_every * factor))

    def validate(self) -> None:
        """ValueError naming the flag; every rank runs it on the same values."""
        checks = [
            (self.batch_size >= 1, "--batch_size", f"must be >= 1, got {self.batch_size}"),
            (self.max_steps >= 1, "--max_steps", f"must be >= 1, got {self.max_steps}"),
            (self.steps_scaler > 0, "--steps_scaler", f"must be > 0, got {self.steps_scaler}"),
            (self.data_factor >= 1, "--data_factor", f"must be >= 1, got {self.data_factor}"),
            (0 <= self.sh_degree <= 4, "--sh_degree", f"must be in 0..4, got {self.sh_degree}"),
            (self.sh_degree_interval >= 1, "--sh_degree_interval", f"must be >= 1, got {self.sh_degree_interval}"),
            (0.0 <= self.ssim_lambda <= 1.0, "--ssim_lambda", f"must be in [0, 1], got {self.ssim_lambda}"),
            (0.0 < self.init_opa < 1.0, "--init_opa", f"must be in (0, 1), got {self.init_opa}"),
            (self.init_scale > 0, "--init_scale", f"must be > 0, got {self.init_scale}"),
            (self.init_num_pts >= 1, "--init_num_pts", f"must be >= 1, got {self.init_num_pts}"),
            (0 < self.near_plane < self.far_plane, "--near_plane/--far_plane",
             f"need 0 < near_plane < far_plane, got {self.near_plane}, {self.far_plane}"),
            (self.rebalance_ratio > 1.0, "--rebalance_ratio", f"must be > 1, got {self.rebalance_ratio}"),
            (self.balance_pairs_ratio > 1.0, "--balance_pairs_ratio", f"must be > 1, got {self.balance_pairs_ratio}"),
            (self.num_workers >= 1 and self.prefetch >= 1, "--num_workers/--prefetch", "must be >= 1"),
            (self.max_bad_steps >= 0, "--max_bad_steps", f"must be >= 0, got {self.max_bad_steps}"),
            (self.keep_ckpts >= 1, "--keep_ckpts", f"must be >= 1, got {self.keep_ckpts}"),
            (math.isfinite(self.save_every_minutes) and self.save_every_minutes >= 0, "--save_every_minutes",
             f"must be >= 0 (0: off), got {self.save_every_minutes}"),
            (all(s >= 0 for s in self.eval_steps + self.save_steps + (self.ply_steps or [])),
             "--eval_steps/--save_steps/--ply_steps", "must be >= 0"),
            (math.isfinite(self.global_scale) and self.global_scale > 0, "--global_scale", "must be > 0"),
            (math.isfinite(self.depth_lambda) and self.depth_lambda >= 0, "--depth_lambda", "must be >= 0"),
            (self.pose_opt_lr >= 0 and self.pose_opt_reg >= 0 and self.pose_noise >= 0,
             "--pose_opt_lr/--pose_opt_reg/--pose_noise", "must be >= 0"),
            (self.app_embed_dim >= 0 and self.app_opt_lr >= 0 and self.app_opt_reg >= 0,
             "--app_embed_dim/--app_opt_lr/--app_opt_reg", "must be >= 0"),
        ]
        for ok, flag, msg in checks:
            if not ok:
                raise ValueError(f"{flag} {msg}")
        for flag, set_ in (("--data_format", self.data_format != "auto"), ("--colmap_dir", self.colmap_dir is not None),
                           ("--skip_missing_images", self.skip_missing_images)):
            if set_ and self.data_dir is None:
                raise ValueError(f"{flag} chooses how --data_dir is read: pass --data_dir too (without it the "
                                 "built-in synthetic scene is trained)")
        if self.colmap_dir is not None and self.data_format not in ("auto", "colmap"):
            raise ValueError(f"--colmap_dir {self.colmap_dir} reads a COLMAP model, --data_format {self.data_format} "
                             "another description: pass one of them")
        if self.data_shards is not None and self.data_dir is None:
            raise ValueError("--data_shards needs --data_dir: the scene's model (COLMAP sparse/, transforms*.json) "
                             "is read from there, the images from the shards")
        from .files.model_import import check_model_flags  # (model_import reads the scene's world: not at import)

        check_model_flags(self)
        for flag, on in (("--eval_only", self.eval_only), ("--render_only", self.render_only)):
            if on and self.ckpt is None:
                raise ValueError(f"{flag} scores or renders a finished run: pass its checkpoint with --ckpt R/ckpts")
        if self.render_traj_frames < 2 or self.render_fps < 1:
            raise ValueError(f"--render_traj_frames must be >= 2 and --render_fps >= 1, got "
                             f"{self.render_traj_frames}, {self.render_fps}")
        # absgrad (issue 18): absolute gradients are larger than summed ones, so gsplat pairs
        # --strategy.absgrad with grow_grad2d 0.0008 (its DefaultStrategy doc, simple_trainer);
        # an explicit other threshold is kept.
        if isinstance(self.strategy, DefaultStrategy) and self.strategy.absgrad \
                and self.strategy.grow_grad2d == GROW_GRAD2D:
            self.strategy.grow_grad2d = ABSGRAD_GROW_GRAD2D
        if not (self.synthetic.exposure >= 1.0 and 0.0 <= self.synthetic.white_balance < 1.0):
            raise ValueError(f"--synthetic.exposure must be >= 1 and --synthetic.white_balance in [0, 1), got "
                             f"{self.synthetic.exposure}, {self.synthetic.white_balance}")
        if self.use_fused_bilagrid:  # gsplat: the fused grid is the grid, in other kernels
            self.use_bilateral_grid = True
        if len(self.bilateral_grid_shape) != 3 or min(self.bilateral_grid_shape) < 2:
            raise ValueError(f"--bilateral_grid_shape must be 3 cell counts >= 2 (x, y, luminance), got "
                             f"{' '.join(map(str, self.bilateral_grid_shape))}")
        if isinstance(self.strategy, DefaultStrategy) and self.strategy.key_for_gradient != "means2d":
            raise ValueError(f"--strategy.key_for_gradient {self.strategy.key_for_gradient}: gsplat's other key "
                             "(gradient_2dgs) is its 2DGS trainer's; distsplat trains 3DGS, whose densification "
                             "reads means2d (the default): drop the flag")
        if isinstance(self.strategy, MCMCStrategy) and self.strategy.cap_max < 1:
            raise ValueError(f"--strategy.cap_max must be >= 1, got {self.strategy.cap_max}")
        for flag, value in (("--cache_budget_gb", self.cache_budget_gb), ("--memory_limit_gb", self.memory_limit_gb)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{flag} must be > 0 (GiB), got {value}")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise ValueError(f"--memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if self.backend == "gsplat" or self.cache == "gpu":
            import torch

            if not torch.cuda.is_available():  # else the first step fails, deep in the renderer
                if self.backend == "gsplat":
                    raise ValueError("--backend gsplat runs gsplat's CUDA kernels, and this machine has no CUDA GPU "
                                     "that torch can use; pass --backend torch (or auto, the default) to train on CPU")
                raise ValueError("--cache gpu keeps each rank's images in GPU memory, and this machine has no CUDA "
                                 "GPU that torch can use; pass --cache decoded (or auto, the default) to cache in RAM")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["strategy"] = {"type": type(self.strategy).__name__, **d["strategy"]}
        d["bilateral_grid_shape"] = list(self.bilateral_grid_shape)  # as cfg.yml and meta.json read it back
        return d


def default_config() -> Config:
    return Config(strategy=DefaultStrategy(verbose=False))


def mcmc_config() -> Config:
    return Config(init_opa=0.5, init_scale=0.1, opacity_reg=0.01, scale_reg=0.01,
                  strategy=MCMCStrategy(verbose=False))
