"""Every flag of gsplat's trainer on distsplat's command line (issue 46, point 3; distsplat/gsplat_flags.py),
held against gsplat's own field lists, checked in because CI has no internet
(tests/golden/gsplat_1_5_3_config_fields.json and _1_6_0_, made by scripts/gsplat_config_fields.py
from gsplat's examples/simple_trainer.py): a gsplat field that distsplat neither takes nor refuses
with a reason fails here, and so does one it takes with another default that no reason explains."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from distsplat.gsplat_flags import DIFFERENT, NEWER, REFUSED, translate

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
V153 = json.loads((GOLDEN / "gsplat_1_5_3_config_fields.json").read_text())
V160 = json.loads((GOLDEN / "gsplat_1_6_0_config_fields.json").read_text())
TRANSLATED = {"camera_model"}  # handled before tyro parses (gsplat_flags.translate): no Config field
# A value of each refused flag that asks for the missing feature.
ASKS = {"compression": ["png"], "patch_size": ["128"]}
# gsplat 1.6's names of 1.5.3's flags: (1.6 arguments, what tyro gets)
RENAMED_16 = {"post_processing": (["--post_processing", "bilateral_grid"], ["--use_bilateral_grid"]),
              "bilateral_grid_fused": (["--bilateral_grid_fused"], ["--use_fused_bilagrid"]),
              "color_correct_method": (["--color_correct_method", "quadratic"], []),
              "use_color_correction_metric": (["--use_color_correction_metric"], [])}


def app_defaults(subcommand: str = "default"):
    from distsplat.app import CONFIGS

    return CONFIGS[subcommand][1]


def parse(args):
    from distsplat.app import CONFIGS
    from distsplat.cli import parse as cli_parse

    return cli_parse(args, CONFIGS)


def normal(v):
    return list(v) if isinstance(v, (tuple, list)) else v


def spelled(name: str, value) -> list:
    """gsplat's value of a field on the command line, as a user types it."""
    if isinstance(value, bool):  # tyro's negation: --no-x, --strategy.no-x
        prefix, _, leaf = name.rpartition(".")
        return [f"--{name}"] if value else [f"--{prefix + '.' if prefix else ''}no-{leaf.replace('_', '-')}"]
    if isinstance(value, list):
        return [f"--{name}", *map(str, value)]
    return [f"--{name}", str(value)]


def test_the_golden_lists_are_gsplat_1_5_3_and_1_6_0_and_the_installed_strategies_are_1_5_3s():
    import gsplat
    from scripts.gsplat_config_fields import strategy_fields

    assert V153["gsplat_version"] == "1.5.3" and V160["gsplat_version"] == "1.6.0"
    assert gsplat.__version__.split("+")[0] == "1.5.3"
    assert json.loads(json.dumps(strategy_fields())) == V153["strategies"]
    assert len(V153["config"]) == 63 and V153["config"][0]["name"] == "disable_viewer"


def test_every_gsplat_1_5_3_flag_is_taken_with_gsplats_default_or_a_reason_or_refused_with_one():
    ours = {f.name for f in dataclasses.fields(app_defaults())}
    defaults = app_defaults()
    unhandled, unexplained = [], []
    for field in V153["config"]:
        name = field["name"]
        if name in REFUSED:
            assert name not in ours and len(REFUSED[name]) > 40, name  # refused means not taken, and says why
        elif name in TRANSLATED:
            assert name not in ours
        elif name in ours:
            if "value" in field and normal(getattr(defaults, name)) != normal(field["value"]) and name not in DIFFERENT:
                unexplained.append(f"{name}: ours {getattr(defaults, name)!r}, gsplat's {field['value']!r}")
        else:
            unhandled.append(name)
    assert not unhandled, f"gsplat 1.5.3 flags neither taken nor refused (distsplat/gsplat_flags.py): {unhandled}"
    assert not unexplained, f"other defaults than gsplat's with no reason in gsplat_flags.DIFFERENT: {unexplained}"
    gsplat_names = {f["name"] for f in V153["config"]}
    assert set(DIFFERENT) <= gsplat_names & ours and set(REFUSED) <= gsplat_names
    assert all(len(why) > 30 for why in DIFFERENT.values())


def test_the_check_above_fails_on_a_flag_that_is_neither():
    """The mutation check: a gsplat field with no Config field and no refusal is reported."""
    with pytest.raises(AssertionError, match=r"neither taken nor refused.*\['sparse_grad'\]"):
        saved = REFUSED.pop("sparse_grad")
        try:
            test_every_gsplat_1_5_3_flag_is_taken_with_gsplats_default_or_a_reason_or_refused_with_one()
        finally:
            REFUSED["sparse_grad"] = saved
    with pytest.raises(AssertionError, match="no reason in gsplat_flags.DIFFERENT.*save_ply"):
        saved = DIFFERENT.pop("save_ply")
        try:
            test_every_gsplat_1_5_3_flag_is_taken_with_gsplats_default_or_a_reason_or_refused_with_one()
        finally:
            DIFFERENT["save_ply"] = saved


@pytest.mark.parametrize("subcommand", ["default", "mcmc"])
def test_a_command_line_of_every_gsplat_flag_at_gsplats_default_parses_to_gsplats_values(subcommand):
    """gsplat 1.5.3's whole Config spelled out at its defaults (the refused flags too: their
    defaults ask for nothing) parses, and every field distsplat takes holds gsplat's value;
    `mcmc` is gsplat's mcmc preset."""
    preset = {"init_opa": 0.5, "init_scale": 0.1, "opacity_reg": 0.01, "scale_reg": 0.01} if subcommand == "mcmc" else {}
    args, expected = [subcommand], {}
    for field in V153["config"]:
        if "value" not in field:  # the strategy: its fields are compared below
            continue
        value = preset.get(field["name"], field["value"])
        args += spelled(field["name"], value)
        expected[field["name"]] = value
    cfg = parse(args)
    cfg.validate()
    for name, value in expected.items():
        if hasattr(cfg, name):
            assert normal(getattr(cfg, name)) == normal(value), name
    for name, value in preset.items():  # and without spelling them out
        assert getattr(parse([subcommand]), name) == value
    gsplat_strategy = V153["strategies"]["MCMCStrategy" if subcommand == "mcmc" else "DefaultStrategy"]
    assert type(cfg.strategy).__name__ == ("MCMCStrategy" if subcommand == "mcmc" else "DefaultStrategy")
    for f in gsplat_strategy:  # every field of gsplat's strategy, at gsplat's default (verbose: ours is quiet)
        if f["name"] != "verbose":
            assert getattr(cfg.strategy, f["name"]) == f["value"], f["name"]
    strategy_args = [subcommand] + [a for f in gsplat_strategy for a in spelled(f"strategy.{f['name']}", f["value"])]
    assert dataclasses.asdict(parse(strategy_args).strategy) == {f["name"]: f["value"] for f in gsplat_strategy}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_flag_names_itself_and_what_to_do_in_every_spelling(name):
    dashed = name.replace("_", "-")
    for flag in (f"--{name}", f"--{dashed}"):
        args = ["default", "--max_steps", "5", flag, *ASKS.get(name, []), "--sh_degree", "1"]
        with pytest.raises(ValueError) as e:
            translate(args)
        shown = " ".join([flag, *ASKS.get(name, [])])
        assert str(e.value) == f"{shown} is a flag of gsplat's trainer that distsplat does not take: {REFUSED[name]}"
    for default in ([f"--no-{dashed}"], [f"--no_{name}"], [f"--{name}", "None"], [f"--{name}=False"]):
        assert translate(["default", *default, "--max_steps", "5"]) == (["default", "--max_steps", "5"], [])


def test_camera_models_and_other_arguments():
    kept, notes = translate(["default", "--data_dir", "d", "--camera_model", "pinhole", "--camera-model=fisheye",
                             "--max_steps", "5", "--strategy.refine_every", "100", "--no-disable-viewer"])
    assert kept == ["default", "--data_dir", "d", "--max_steps", "5", "--strategy.refine_every", "100",
                    "--no-disable-viewer"]
    assert len(notes) == 1 and notes[0].startswith("--camera-model=fisheye: fisheye captures")
    assert "undistorted to pinhole cameras on load" in notes[0]
    with pytest.raises(ValueError, match="^--camera_model ortho: distsplat renders pinhole cameras .*orthographic"):
        translate(["default", "--camera_model", "ortho"])
    assert translate(["mcmc", "--help"]) == (["mcmc", "--help"], [])


def test_gsplat_1_6_names_are_named_as_such():
    """Each of gsplat 1.6's new fields gets one line naming it as gsplat 1.6's (tyro would say
    "Unrecognized options"); `--backend cuda` is distsplat's `--backend gsplat`."""
    new = [f for f in V160["config"] if f["name"] not in {g["name"] for g in V153["config"]}]
    assert len(new) == 20
    for field in new:
        name = field["name"]
        if name == "backend":
            assert translate(["default", "--backend", "cuda"]) == (["default", "--backend", "gsplat"], [])
            assert translate(["default", "--backend=torch"]) == (["default", "--backend=torch"], [])
            with pytest.raises(ValueError, match="^--backend dgx: gsplat 1.6's single-process multi-GPU backend"):
                translate(["default", "--backend", "dgx"])
            continue
        if name in RENAMED_16:  # gsplat 1.5.3's flag under its 1.6 name: taken as that
            args, kept = RENAMED_16[name]
            assert translate(["default", *args])[0] == ["default", *kept], name
            if name != "use_color_correction_metric":
                continue
        value = {"post_processing": ["ppisp"], "data_type": ["ncore"], "color_correct_method": ["affine"],
                 "ncore_camera_ids": ["a", "b"]}.get(name, [] if isinstance(field.get("value"), bool) else ["7"])
        if name == "use_color_correction_metric":  # a note: cc_* come with the grid
            assert "whenever --use_bilateral_grid is on" in translate(["default", f"--{name}"])[1][0]
            continue
        with pytest.raises(ValueError, match=f"^--{name}.* is a flag of gsplat's trainer that distsplat does not "
                                             "take: gsplat 1.6's flag; distsplat takes gsplat 1.5.3's flags"):
            translate(["default", f"--{name}", *value])
    assert all(len(why) > 60 for why in NEWER.values())


def test_gsplat_readme_command_lines_parse(tmp_path):
    """gsplat's documented command lines (its README and examples/benchmarks): one GPU, and 4
    GPUs with --steps_scaler 0.25, for both strategies."""
    for args in (["default", "--data_dir", "data/360_v2/garden/", "--data_factor", "4", "--result_dir",
                  "./results/garden"],
                 ["mcmc", "--data_dir", "data/360_v2/garden/", "--data_factor", "4", "--result_dir",
                  "./results/garden", "--steps_scaler", "0.25", "--disable_viewer", "--packed",
                  "--strategy.cap-max", "1000000", "--render_traj_path", "ellipse"]):
        cfg = parse(args)
        cfg.validate()
        assert cfg.data_dir == "data/360_v2/garden/" and cfg.data_factor == 4
    assert cfg.strategy.cap_max == 1_000_000 and cfg.steps_scaler == 0.25


def test_gsplats_list_of_checkpoint_files_is_one_value():
    """gsplat's `--ckpt a.pt b.pt` (a list) reaches Config.ckpt joined by os.pathsep, which
    train/model_files.split_files splits again; one value passes as typed."""
    import os

    from distsplat.train.files.model_files import split_files

    kept, _ = translate(["default", "--ckpt", "r/ckpt_9_rank0.pt", "r/ckpt_9_rank1.pt", "--eval_only"])
    assert kept == ["default", "--ckpt", os.pathsep.join(["r/ckpt_9_rank0.pt", "r/ckpt_9_rank1.pt"]), "--eval_only"]
    cfg = parse(kept)
    assert split_files(cfg.ckpt) == ["r/ckpt_9_rank0.pt", "r/ckpt_9_rank1.pt"] and cfg.eval_only
    assert translate(["default", "--ckpt", "R/ckpts"]) == (["default", "--ckpt", "R/ckpts"], [])


def test_key_for_gradient_of_2dgs_is_refused():
    cfg = parse(["default", "--strategy.key_for_gradient", "gradient_2dgs"])
    with pytest.raises(ValueError, match="--strategy.key_for_gradient gradient_2dgs: gsplat's other key"):
        cfg.validate()
