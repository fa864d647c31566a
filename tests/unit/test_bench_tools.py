"""The benchmark tools' own logic (benchmarks are not tests; these checks are): the
summary table reads a trainer's stats dir, and the results name no machine's folders
(the scaling model's arithmetic: test_scaling_gpu.py)."""

import json

from benchmarks import paths
from benchmarks import summarize


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_summarize_reads_last_eval_step_and_every_rank(tmp_path):
    run = tmp_path / "default" / "garden"
    _write(run / "stats" / "val_step0100.json", {"psnr": 20.0, "ssim": 0.5, "num_GS": 10, "elapsed": 1.0})
    _write(run / "stats" / "val_step0300.json", {"psnr": 25.5, "ssim": 0.8, "num_GS": 30, "elapsed": 3.0})
    for r, (n, mem) in enumerate([(14, 0.5), (16, 0.75)]):
        _write(run / "stats" / f"train_step0300_rank{r}.json", {"mem": mem, "num_GS": n, "ellipse_time": 3.0})
    _write(run / "stats" / "train_step0100_rank0.json", {"mem": 9.0, "num_GS": 99})
    (run / "wall_s.txt").write_text("12.5\n")
    missing = tmp_path / "default" / "bicycle"

    rows = [summarize.read_run(d, n) for d, n in zip([run, missing], summarize.labels([run, missing]))]
    assert rows[0]["run"] == "garden" and rows[1]["run"] == "bicycle"
    r = rows[0]
    assert (r["ok"], r["step"], r["psnr"], r["num_GS"], r["wall_s"]) == (True, 300, 25.5, 30, 12.5)
    assert r["num_GS_per_rank"] == [14, 16] and r["mem_gb_per_rank"] == [0.5, 0.75]
    assert not rows[1]["ok"]
    text = summarize.table(rows, "t")
    assert "25.500" in text and "14/16" in text and "0.50/0.75" in text and "missing" in text
    assert summarize.main([str(run)]) == 0 and summarize.main([str(run), str(missing)]) == 1


def test_results_name_a_machines_folders_as_placeholders(tmp_path, monkeypatch):
    data, cache, home = tmp_path / "captures", tmp_path / "cache", tmp_path / "home"
    monkeypatch.setenv("DISTSPLAT_DATA", str(data))
    monkeypatch.setenv("DISTSPLAT_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(home))
    assert paths.data_dir() == data
    repo = paths.REPO
    record = {"command": f"python3 b.py --data_dir {data}/thermos --out {repo}/.gsplat_ext/m.so",
              "flags": [f"-I{cache}/build/include", f"{home}/.cache/torch/hub", f"{home}x/kept"],
              "n": 3, "extra": f"{tmp_path}/py/include"}
    assert paths.neutral(record, {f"{tmp_path}/py": "$PY312"}) == {
        "command": "python3 b.py --data_dir $DATA/thermos --out $REPO/.gsplat_ext/m.so",
        "flags": ["-I$DISTSPLAT_CACHE/build/include", "$HOME/.cache/torch/hub", f"{home}x/kept"],
        "n": 3, "extra": "$PY312/include"}
