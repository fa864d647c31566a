"""The GPU benchmarks time the trainer's own step (CONVENTIONS.md 10), checked on the CPU:
the step each benchmark runs gives exactly the parameters of `Trainer.train_step` run
directly after 3 steps, and every benchmark's GPU-only path runs here in its plumbing mode
(FAKE_GSPLAT / DRY_RUN / SMALL, gsplat's trainer replaced by a stand-in peer loop), writing
its JSON into a temporary folder (BENCH_RESULTS). scaling_gpu's W = 2 run (two gloo processes)
is in tests/distributed/test_bench_scaling.py."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_step_vs_gsplat as bsg
from benchmarks import gsplat_peer
from benchmarks import scaling_gpu as sg
from benchmarks import step_ranges as sr
from distsplat.distributed import init_distributed
from distsplat.train.config import SyntheticConfig, default_config
from distsplat.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def _plain_params(cfg, steps):
    """Trainer.setup and Trainer.train_step for `steps`, nothing else: the reference."""
    t = Trainer(cfg, init_distributed(device=CPU))
    t.setup()
    try:
        for s in steps:
            t.train_step(s)
        return {k: v.detach().clone() for k, v in t.params.items()}
    finally:
        t.cleanup()


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs"


def test_step_vs_gsplat_runs_the_trainers_default_config():
    """ours = what `simple_trainer.py default` parses, but for the scene, the run's length and
    no eval/save inside it: packed, --ssim_impl auto (fused-ssim on a GPU), fused Adam by default."""
    cfg = bsg.ours_config("/data/x", 1, 61, 1, "/tmp/r")
    want, got = default_config().to_dict(), cfg.to_dict()
    changed = {k for k in want if want[k] != got[k]}
    assert changed <= {"data_dir", "data_factor", "max_steps", "sh_degree_interval", "result_dir", "eval_steps",
                       "save_steps", "save_ply"}
    assert (cfg.packed, cfg.ssim_impl) == (default_config().packed, "auto")


def test_step_vs_gsplat_names_each_scenes_result_and_make_report_finds_them(tmp_path):
    from benchmarks import make_report

    assert bsg.scene_label("/x/.gpu_data/thermos") == "thermos"
    assert bsg.scene_label("/tmp/gpu_validate.ab12/garden/") == "garden"  # gpu_validate's garden capture
    assert bsg.scene_label("builtin") == "builtin" and bsg.scene_label("/x/thermos", "my scene/2") == "my-scene-2"
    with pytest.raises(ValueError):
        bsg.scene_label("/", None)
    for scene in ("thermos", "garden"):
        name = bsg.result_name("cuda", scene)
        assert name == f"step_vs_gsplat_cuda_{scene}"
        # make_report finds its newest snapshot by that name
        assert make_report.load(name, "gpu", tmp_path) is None
        (tmp_path / f"{name}_h100_2026-11-23.json").write_text('{"date": "2026-11-23", "commit": "abc"}')
        assert make_report.newest(name, "gpu", tmp_path).name == f"{name}_h100_2026-11-23.json"


def test_step_vs_gsplat_ours_gives_the_trainers_parameters_after_3_steps(tmp_path):
    cfg = bsg.ours_config(None, 1, 20, 1, str(tmp_path / "r"))
    cfg.synthetic = SyntheticConfig(kind="ball", num_cameras=8, num_gaussians=200, width=24, height=16, seed=1)
    cfg.backend = "torch"
    ours = bsg.run_ours(copy.deepcopy(cfg), warmup=1, reps=1, profile=1, device=CPU, keep_params=True)
    cfg.validate()
    _assert_same(ours["params"], _plain_params(cfg, range(3)))
    prof = ours["profiled"]
    assert prof["steps"] == 1 and set(sr.STEP_RANGES) <= set(prof["ranges_ms"])
    assert len(ours["step_ms"]) == 1 and ours["ssim_impl"] == "torch" and ours["packed"]


def test_scaling_rank_step_gives_the_trainers_parameters_after_3_steps(tmp_path, monkeypatch):
    """scaling_gpu's rank (W = 1, in this process): the setup served from its memo, the steps
    under the profiler with its comm capture; against a setup that reads the scene itself."""
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "test_garden.npz").is_file():  # write_garden_scene makes the scene from it
        pytest.skip(f"{SHARED_DATA / 'test_garden.npz'} not found (set DISTSPLAT_DATA; see tests/conftest.py)")
    monkeypatch.setenv("SMALL_SIZE", "300,24,16")
    describe = sg.write_garden_scene(tmp_path / "scene", small=True)
    assert describe["gaussians"] == 300
    job = {"data_dir": str(tmp_path / "scene"), "data_factor": 1, "batches": [1], "first_step": 3, "warmup": 1,
           "steps": 2, "result_dir": str(tmp_path / "runs"), "memo": sg.SetupMemo(),
           "threads": torch.get_num_threads(), "return_params": True}
    ((res,),) = sg.run_world(1, job)
    cfg = sg.bench_config(job["data_dir"], 1, 1, str(tmp_path / "plain"))
    _assert_same(res["params"], _plain_params(cfg, range(3, 6)))
    assert job["memo"].scene is not None and job["memo"].init is not None
    assert len(res["steps"]) == 2
    for st in res["steps"]:
        assert set(sr.STEP_RANGES) <= set(st["seen"]) and st["comm"]["pairs_projected"] > 0
    rec = sg.step_records([res], 1)
    row = sg.summarize(rec, 1, 1)
    assert row["per_rank_ms"][0]["A"] > 0 and row["predicted"]["ours"]["nvlink_h100"]["exchange_ms"] == 0.0


def test_gsplat_peer_probe_times_its_loop_from_the_loop(tmp_path):
    """The probe of gsplat's own trainer (gsplat_peer.py, a subprocess), on a stand-in peer: warm-up,
    timed steps, profiled steps and one counted step, from the loop's own iteration."""
    peer = gsplat_peer.write_standin(tmp_path / "peer")
    res = gsplat_peer.run_probe("default", str(tmp_path), 1, str(tmp_path / "out"), warmup=2, steps=3, profile=2,
                                count_syncs=True, peer=peer, timeout_s=120)
    assert res["returncode"] == 0, res
    assert res["loop_found"] and res["standin"] and res["iterations_started"] == res["iterations_needed"] == 9
    assert len(res["step_ms"]) == 3 and all(ms > 0 for ms in res["step_ms"])
    assert len(res["profiled"]) == 2 and all(p["step_ms"] > 0 for p in res["profiled"])
    assert res["syncs"]["count"] == 0  # no CUDA here: nothing to report, the plumbing ran


def _run(script, env, tmp_path, *args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_RESULTS": str(tmp_path), **env}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_count_syncs_dry_run(tmp_path):
    """W = 1, gsplat's step (a stand-in) and W = 2 (two gloo CPU ranks walking the staged path of
    shared-GPU mode): no sync is reported on a CPU, but the staged transfers are marked in their
    ranges, and distsplat's own counter leaves the one an NCCL run makes (the count transfer)."""
    out = _run("studies/steps/count_syncs.py", {"DRY_RUN": "1", "WARMUP": "1"}, tmp_path)
    assert "host syncs per step: trainer 0, ours_render 0, gsplat_step 0, shared_gpu_w2 [0, 0] per rank " \
           "(of which staged by design [3, 3]: NCCL-equivalent [1, 1] by distsplat)" in out
    d = json.loads((tmp_path / "host_syncs_dry.json").read_text())
    assert d["syncs"]["trainer"]["by_range"] == {} and "DRY RUN" in d["syncs"]["gsplat_step"]["what"]
    assert d["syncs"]["trainer"]["distsplat_host_syncs"] == 0  # W = 1: nothing to exchange
    w2 = d["syncs"]["shared_gpu_w2"]
    assert w2["context"] == {"device": "cpu", "backend": "gloo", "shared_gpu": False, "staged": True,
                             "staging_forced": True}
    assert [r["rank"] for r in w2["ranks"]] == [0, 1]
    assert w2["staged"] == w2["distsplat_host_syncs"] == [4, 4] and w2["staged_extra"] == [3, 3]
    assert w2["nccl_equivalent"] == [None, None] and w2["distsplat_nccl_equivalent"] == [1, 1]
    for r in w2["ranks"]:
        assert r["count"] == 0 and r["ranges_missing"] == []
        # forward: the count exchange (NCCL has it too) and the payload; backward: the payload's
        # gradient; the divergence check's all-reduce
        assert r["staged"]["by_range"] == {"distsplat/count_exchange": 1, "distsplat/payload_exchange": 1,
                                           "distsplat/payload_exchange_backward": 1, "train/divergence": 1}
        assert r["staged_extra"]["by_range"] == {k: 1 for k in ("distsplat/payload_exchange",
                                                                "distsplat/payload_exchange_backward",
                                                                "train/divergence")}


def test_profile_gpu_dry_run(tmp_path):
    _run("studies/steps/profile_gpu.py", {"DRY_RUN": "1", "PROFILE_WARM": "1", "PROFILE_STEPS": "2", "PROFILE_RANGE_STEPS": "2"},
         tmp_path, str(tmp_path / "tables"))
    d = json.loads((tmp_path / "profile_gpu_dry.json").read_text())
    assert set(d["trainer"]) == {"none", "decoded"}
    # every variant timed before any profiler attached: the profiled one ("none" in a dry run) last
    assert d["run_order"] == ["decoded", "none"]
    assert all(r["timed_without_profiler"] for r in d["trainer"].values())
    ranges = d["trainer"]["none"]["ranges"]
    assert set(sr.STEP_RANGES) <= set(ranges["ranges_ms"]) and ranges["steps"] == 2
    assert "train/backward" in (tmp_path / "tables" / "trainer_ranges.txt").read_text()
    # the profiler's top-20 table as rows (by self CPU time on a CPU), as its text table ranks them
    top = ranges["profiler_top20"]
    assert top["sort_by"] == "self_cpu_time_total" and top["steps"] == 2 and len(top["rows"]) == 20
    self_ms = [r["self_cpu_ms"] for r in top["rows"]]
    assert self_ms == sorted(self_ms, reverse=True) and self_ms[0] > 0
    assert all(r["calls"] >= 1 and r["cpu_total_ms"] >= r["self_cpu_ms"] - 1e-3 for r in top["rows"])
    assert any(r["name"].startswith("aten::") for r in top["rows"]) and "profiler_top20_self_cpu" not in ranges


def test_profile_gpu_top_table_ranks_by_self_device_time_on_cuda():
    """profile_gpu's rows of the profiler's table on a made-up CUDA profile (the CPU has none): by
    self device time, 20 rows at most; torch before 2.4 named device times `cuda`."""
    from types import SimpleNamespace

    from benchmarks.studies.steps import profile_gpu

    def ev(key, self_dev, old=False):
        dev = {"self_cuda_time_total": self_dev, "cuda_time_total": 2 * self_dev} if old else \
            {"self_device_time_total": self_dev, "device_time_total": 2 * self_dev}
        return SimpleNamespace(key=key, count=3, self_cpu_time_total=1000.0, cpu_time_total=1500.0, **dev)

    events = [ev(f"k{i}", 100.0 * i, old=i % 2) for i in range(25)]
    top = profile_gpu.top_table(events, "device", steps=5)
    assert top["sort_by"] == "self_device_time_total" and top["steps"] == 5
    assert [r["name"] for r in top["rows"]] == [f"k{i}" for i in range(24, 4, -1)]
    assert top["rows"][0] == {"name": "k24", "calls": 3, "self_cpu_ms": 1.0, "cpu_total_ms": 1.5,
                              "self_device_ms": 2.4, "device_total_ms": 4.8}
    assert top["rows"][1]["self_device_ms"] == 2.3  # an old torch's name


@pytest.mark.slow
def test_step_vs_gsplat_fake_run(tmp_path):
    out = _run("bench_step_vs_gsplat.py", {"FAKE_GSPLAT": "1", "SCENE": "builtin", "WARMUP": "1", "REPS": "2",
                                           "STEP_PROFILE_STEPS": "1"}, tmp_path)
    assert "step_vs_gsplat: ours" in out
    d = json.loads((tmp_path / "step_vs_gsplat_fake_builtin.json").read_text())  # the scene's own name
    assert len(d["ours"]["step_ms"]) == len(d["gsplat"]["step_ms"]) == 2 and d["ratio_ours_over_gsplat"] > 0
    assert d["gsplat"]["standin"] and d["gsplat"]["profiled_summary"]["steps"] == 1
