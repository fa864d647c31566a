"""Results as dated snapshots (benchmarks/results_index.py): names, the newest of a name,
what archive/ takes, and make_report's reading of them."""

import json

from benchmarks import make_report
from benchmarks.results_index import (device_label, file_record, newest, parse, result_path, snapshots,
                                      superseded)


def _write(folder, name, date, device=None, gpu=None):
    d = {"date": date, "commit": "abc1234", "machine": {"cpu_count": 2, "gpu": gpu}, "device": device}
    path = result_path(name, device_label(d["machine"], device), date, folder)
    path.write_text(json.dumps(d))
    return path


def test_device_labels_from_the_machine_field():
    assert device_label({"cpu_count": 2, "gpu": None}) == "cpu2"
    assert device_label({"cpu_count": 16, "gpu": "NVIDIA H100 80GB HBM3"}) == "h100"
    assert device_label({"cpu_count": 16, "gpu": "NVIDIA H200"}) == "h200"
    assert device_label({"gpu": "NVIDIA GeForce RTX 4090"}) == "rtx4090"
    assert device_label({"cpu_count": 16, "gpu": "NVIDIA H100 80GB HBM3"}, "cpu") == "cpu16"  # a CPU measurement
    assert device_label("vm x86_64, 2 cores") == "cpu2"  # older records say it in words
    assert device_label({"cores": 2}) == "cpu2"


def test_names_sort_by_time_and_are_never_reused(tmp_path):
    a = _write(tmp_path, "step_ops", "2026-11-26T02:00:25+00:00")
    b = _write(tmp_path, "step_ops", "2026-11-26T03:16:36+00:00")
    c = _write(tmp_path, "step_ops", "2026-11-27T01:00:00+00:00")
    assert [p.name for p in (a, b, c)] == ["step_ops_cpu2_2026-11-26.json", "step_ops_cpu2_2026-11-26T031636.json",
                                           "step_ops_cpu2_2026-11-27.json"]
    assert parse(b) == ("step_ops", "cpu2", "2026-11-26T031636")
    assert parse(tmp_path / "step_ops.json") is None
    assert newest("step_ops", folder=tmp_path) == c
    same_second = result_path("step_ops", "cpu2", "2026-11-26T03:16:36+00:00", tmp_path)
    assert same_second.name == "step_ops_cpu2_2026-11-26T031636-2.json" and parse(same_second)[0] == "step_ops"


def test_newest_by_device_and_the_superseded_go_to_archive(tmp_path):
    cpu = _write(tmp_path, "vs_gsplat", "2026-11-23T03:31:25+00:00", device="cpu")
    old = _write(tmp_path, "vs_gsplat", "2026-11-23T07:15:10+00:00", gpu="NVIDIA H100 80GB HBM3")
    gpu = _write(tmp_path, "vs_gsplat", "2026-11-23T07:51:57+00:00", gpu="NVIDIA H100 80GB HBM3")
    other = _write(tmp_path, "vs_gsplat_extra", "2026-11-24T00:00:00+00:00")  # another name, not a newer vs_gsplat
    assert newest("vs_gsplat", "cpu", tmp_path) == cpu and newest("vs_gsplat", "cpu2", tmp_path) == cpu
    assert newest("vs_gsplat", "gpu", tmp_path) == gpu and newest("vs_gsplat", "h100", tmp_path) == gpu
    assert newest("vs_gsplat", folder=tmp_path) == gpu and newest("nothing", folder=tmp_path) is None
    assert superseded(tmp_path) == [old]
    assert snapshots(tmp_path, "vs_gsplat_extra") == [other]
    # archive/ is not searched, but its names are not reused
    (tmp_path / "archive").mkdir()
    old.rename(tmp_path / "archive" / old.name)
    assert result_path("vs_gsplat", "h100", "2026-11-23T09:00:00", tmp_path).name == "vs_gsplat_h100_2026-11-23T090000.json"


def test_file_record_names_a_plain_record_from_its_contents(tmp_path):
    plain = tmp_path / "million_1000000.json"
    body = json.dumps({"date": "2026-11-26T07:51:06Z", "machine": "vm x86_64, 2 cores"})
    plain.write_text(body)
    dst = file_record(plain)
    assert dst.name == "million_1000000_cpu2_2026-11-26.json" and dst.read_text() == body and not plain.exists()
    other = tmp_path / "loader_host_cpu.json"
    other.write_text(body)
    assert file_record(other, "loader_host").name == "loader_host_cpu2_2026-11-26.json"


def test_make_report_shows_the_newest_with_date_device_and_commit_and_no_stale_marks():
    report = make_report.REPORT.read_text()
    assert "STALE" not in report
    quick = make_report.load("quickstart")
    assert quick["_file"].startswith("quickstart_cpu2_") and quick["psnr"] > 32
    assert f"({make_report.src(quick)}, {quick['date'][:10]})" in report
    files = make_report.section_files()
    for path in snapshots(make_report.RESULTS):
        name, device, date = parse(path)
        if newest(name, device, make_report.RESULTS) == path:
            assert f"| `{path.name}` | {name} | {device} | {date[:10]} |" in files
    archived = list((make_report.RESULTS / "archive").glob("*.json"))
    assert archived and all(f"`{p.name}`" in files for p in archived)
    assert not superseded(make_report.RESULTS), "move superseded snapshots: python benchmarks/results_index.py archive"
