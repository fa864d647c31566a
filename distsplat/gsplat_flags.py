"""gsplat's trainer flags on distsplat's command line (issue 46, point 3): every flag of gsplat
1.5.3's `examples/simple_trainer.py` is taken with gsplat's meaning, or refused with one line
saying why and what to pass instead, and gsplat 1.6's new names are named as such rather than
left to tyro's "Unrecognized options".

Most of gsplat's flags are fields of distsplat's Config under the same name and default (they
need nothing here). What is here:
- DIFFERENT: the fields distsplat takes under gsplat's name whose default or values differ, and
  why (docs/training.md's migration table says the same);
- REFUSED: flags whose non-default value asks for something distsplat does not do, and what
  to do instead; their default (`--no-sparse-grad`, `--compression None`) passes silently;
- the translations done before tyro parses: `--camera_model` (pinhole, or fisheye: captures
  are undistorted on load), `--ckpt a.pt b.pt` (gsplat's list: one value, joined by
  os.pathsep), `--backend cuda` (gsplat 1.6's name for its CUDA kernels);
- NEWER: gsplat 1.6's new names, each refused (or translated) with its gsplat 1.5.3 spelling.

tests/unit/test_gsplat_flags.py holds this against the checked-in field lists of gsplat 1.5.3
and 1.6 (tests/golden/gsplat_*_config_fields.json, scripts/gsplat_config_fields.py): a gsplat
field that is neither taken nor refused with a reason fails it.

The composition root's (beside cli.py): it only rewrites the argument list, so the messages
are the same on every rank (each parses the same arguments).
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

GSPLAT_VERSION = "1.5.3"  # whose simple_trainer flags these are (gsplat_compat.SUPPORTED_GSPLAT)

# Fields of gsplat 1.5.3's Config that distsplat takes under the same name, with another default
# or more values than gsplat's: why. (The test checks that every other shared field has gsplat's default.)
DIFFERENT: Dict[str, str] = {
    "data_dir": "default None, the built-in synthetic scene (gsplat's default is a path on its authors' machines)",
    "result_dir": "default results/default (gsplat: results/garden)",
    "ckpt": ("gsplat's .pt files (one, a list, or one of a distributed run's per-rank files: the others beside "
             "it come too) are scored by --eval_only and rendered by --render_only, as gsplat; without either, "
             "training goes on from their step (gsplat would only evaluate them); a distsplat checkpoint "
             "(R/ckpts/step_N, or R/ckpts for the newest) resumes on any number of ranks"),
    "render_traj_path": "the same paths (interp, ellipse, spiral), rendered by --render_only and, with "
                        "--no-disable-video, after each evaluation",
    "port": "default None: 8080, or a free port when 8080 is taken (gsplat: 8080, and a taken port fails)",
    "ply_steps": "default None: a PLY with each checkpoint (--save_steps); a list: at those steps and the last, as gsplat",
    "save_ply": "default True: the merged PLY of the 3DGS layout is written with each checkpoint (gsplat: False)",
    "disable_video": ("default True: no trajectory video after each evaluation (gsplat renders one); "
                      "--no-disable-video renders it, --render_only renders one from a checkpoint"),
    "init_type": ("default auto: the scene's SfM points when it has them, else random points (gsplat: sfm); "
                  "ply starts from any 3DGS PLY or gsplat .pt files (--init_ply)"),
    "packed": ("default True: the ranks exchange packed (visible-only) pairs whatever the flag; --no-packed "
               "only changes a one-process render (gsplat's default is False)"),
    "strategy": "gsplat's DefaultStrategy / MCMCStrategy with their fields and defaults (verbose off)",
}

_DROP = "drop the flag"
REFUSED: Dict[str, str] = {
    "with_ut": ("3DGUT (gsplat's unscented-transform projection for distorted cameras) is not in distsplat's "
                "renderers: distorted and fisheye captures are undistorted to pinhole cameras on load instead "
                f"(docs/data.md); {_DROP}"),
    "with_eval3d": f"3DGUT's 3D evaluation goes with --with_ut, which distsplat does not have; {_DROP}",
    "patch_size": ("training on random crops is not in distsplat: every rank renders its cameras' whole images; "
                   f"{_DROP} (--data_factor lowers the resolution)"),
    "sparse_grad": ("gsplat's experimental sparse gradients (torch's SparseAdam) are not in distsplat, which keeps "
                    "the optimizer's work small another way: each rank steps a fused Adam on its own chunk of the "
                    "Gaussians (1/W of them), fed by the gradients of their visible pairs only; "
                    f"{_DROP}"),
    "visible_adam": ("Taming 3DGS's visible-only Adam (gsplat's CUDA SelectiveAdam) is not in distsplat: each rank "
                     "steps a fused Adam on its own chunk of the Gaussians (1/W of them, so more GPUs divide "
                     "the optimizer's work), every Gaussian every step as gsplat's default Adam; "
                     f"{_DROP}"),
    "compression": ("PNG compression (gsplat.compression.PngCompression) needs torchpq and PLAS on CUDA and one "
                    "process holding the whole model; `python -m distsplat.convert R/ckpts OUT` writes the model in "
                    f"gsplat's .pt layout for gsplat's compression to read; {_DROP}"),
}

# gsplat 1.6's new Config names (not in 1.5.3): what to pass instead. Prefix entries end in "*".
_V16 = "gsplat 1.6's flag; distsplat takes gsplat 1.5.3's flags"
NEWER: Dict[str, str] = {
    "post_processing": (f"{_V16}: --post_processing bilateral_grid is 1.5.3's --use_bilateral_grid (taken as "
                        "that); PPISP, gsplat 1.6's per-camera ISP (exposure, vignetting, colour, response curve), "
                        "is not in distsplat: pass --use_bilateral_grid, which learns each image's exposure and "
                        "colour too, or --app_opt"),
    "bilateral_grid_fused": f"{_V16} (1.5.3: --use_fused_bilagrid, taken as that)",
    "ppisp_use_controller": f"{_V16}: PPISP (its per-camera ISP) is not in distsplat; {_DROP}",
    "ppisp_controller_distillation": f"{_V16}: PPISP is not in distsplat; {_DROP}",
    "ppisp_controller_activation_num_steps": f"{_V16}: PPISP is not in distsplat; {_DROP}",
    "color_correct_method": (f"{_V16}: distsplat's cc_psnr, cc_ssim and cc_lpips fit gsplat 1.5.3's quadratic "
                             "colour transform (--color_correct_method quadratic); drop the flag"),
    "use_color_correction_metric": (f"{_V16}: distsplat reports cc_psnr, cc_ssim and cc_lpips whenever "
                                    "--use_bilateral_grid is on, as gsplat 1.5.3"),
    "data_type": (f"{_V16}: distsplat reads COLMAP, Blender and nerfstudio folders by the files they hold "
                  "(--data_format chooses when a folder holds several); NCore is not read; drop the flag"),
    "load_exposure": (f"{_V16}: distsplat reads no EXIF exposure (per-image exposure changes are learned: "
                      f"--app_opt); {_DROP}"),
    "sh_fp16": f"{_V16}: distsplat keeps SH coefficients in float32; {_DROP}",
    "ncore_*": f"{_V16}: NCore datasets are not read by distsplat; {_DROP}",
}

# Values of a refused or newer flag that ask for nothing (its default): passed silently.
_DEFAULTS = {"None", "none", "False", "false", "0"}
# Flags handled by the translations below (not by their table entry).
_TRANSLATED = ("camera_model", "backend", "ckpt")


def _post_processing(spelled: str, values: List[str], notes: List[str]) -> List[str]:
    if values == ["bilateral_grid"]:
        return ["--use_bilateral_grid"]
    if all(v in _DEFAULTS for v in values):
        return []
    raise ValueError(f"{spelled} is a flag of gsplat's trainer that distsplat does not take: {NEWER['post_processing']}")


def _bilateral_grid_fused(spelled: str, values: List[str], notes: List[str]) -> List[str]:
    return [] if values else ["--use_fused_bilagrid"]


def _color_correct_method(spelled: str, values: List[str], notes: List[str]) -> List[str]:
    if values == ["quadratic"]:
        return []
    raise ValueError(f"{spelled} is a flag of gsplat's trainer that distsplat does not take: "
                     f"{NEWER['color_correct_method']}")


def _use_color_correction_metric(spelled: str, values: List[str], notes: List[str]) -> List[str]:
    notes.append(f"{spelled}: {NEWER['use_color_correction_metric']}")
    return []


# gsplat 1.6's names for what distsplat does under 1.5.3's: (spelled, values, notes) -> arguments for tyro
_RENAMED_16 = {"post_processing": _post_processing, "bilateral_grid_fused": _bilateral_grid_fused,
               "color_correct_method": _color_correct_method,
               "use_color_correction_metric": _use_color_correction_metric}


def _flag(arg: str) -> Optional[Tuple[str, bool, Optional[str]]]:
    """`--with-ut` -> ("with_ut", False, None); `--no-with-ut` -> ("with_ut", True, None);
    `--compression=png` -> ("compression", False, "png"); None for a value."""
    if not arg.startswith("--"):
        return None
    name, eq, value = arg[2:].partition("=")
    name = name.replace("-", "_")
    negated = name.startswith("no_") and _known(name[3:])
    return (name[3:] if negated else name), negated, (value if eq else None)


def _known(name: str) -> bool:
    return name in REFUSED or _newer(name) is not None or name in _TRANSLATED


def _newer(name: str) -> Optional[str]:
    if name in NEWER:
        return NEWER[name]
    return next((why for k, why in NEWER.items() if k.endswith("*") and name.startswith(k[:-1])), None)


def translate(args: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(the arguments tyro parses, notes for rank 0 to print): gsplat's refused flags and gsplat
    1.6's names raise ValueError naming the flag and what to do (the same on every rank); their
    defaults are dropped; `--camera_model` and `--backend cuda` are translated."""
    args = list(args)
    kept: List[str] = []
    notes: List[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        parsed = _flag(a)
        if parsed is None or not _known(parsed[0]):
            kept.append(a)
            i += 1
            continue
        name, negated, value = parsed
        values = [value] if value is not None else []
        j = i + 1
        if value is None:  # the values that follow, up to the next flag
            while j < len(args) and not args[j].startswith("--"):
                values.append(args[j])
                j += 1
        spelled = " ".join([a, *values[: 3 if value is None else 0]])
        if name == "camera_model":
            notes += _camera_model(spelled, values)
        elif name == "ckpt":  # gsplat's list of .pt files: one value for Config.ckpt (model_files.split_files)
            kept += ["--ckpt", os.pathsep.join(values)] if len(values) > 1 else args[i:j]
        elif name == "backend":
            kept += _backend(spelled, values) or args[i:j]
        elif negated:
            pass  # the default: asks for nothing
        elif name in _RENAMED_16:
            kept += _RENAMED_16[name](spelled, values, notes)
        elif values and all(v in _DEFAULTS for v in values):
            pass  # the default: asks for nothing
        else:
            why = REFUSED.get(name) or _newer(name)
            raise ValueError(f"{spelled} is a flag of gsplat's trainer that distsplat does not take: {why}")
        i = j
    return kept, notes


def _camera_model(spelled: str, values: List[str]) -> List[str]:
    model = values[0] if values else ""
    if model == "pinhole":
        return []
    if model == "fisheye":
        return [f"{spelled}: fisheye captures (COLMAP OPENCV_FISHEYE, nerfstudio's fisheye) are undistorted to "
                "pinhole cameras on load, as the other distortion models; renders and outputs are pinhole"]
    raise ValueError(f"{spelled}: distsplat renders pinhole cameras (gsplat's default); distorted and fisheye "
                     "captures are undistorted to pinhole on load (pass --camera_model pinhole or fisheye, or drop "
                     "the flag); orthographic and other camera models are not in distsplat's renderers")


def _backend(spelled: str, values: List[str]) -> List[str]:
    """gsplat 1.6's `--backend cuda` (its CUDA kernels, one process per GPU) is distsplat's
    `--backend gsplat`; [] for distsplat's own values (passed as written)."""
    if values == ["cuda"]:
        return ["--backend", "gsplat"]
    if values == ["dgx"]:
        raise ValueError(f"{spelled}: gsplat 1.6's single-process multi-GPU backend is not in distsplat, which runs "
                         "one process per GPU under torchrun (torchrun --nproc_per_node=N ...); drop the flag")
    return []
