"""The COLMAP mutation fuzz in CI (issue 36; tests/fuzz/colmap_mutations.py is the long
run): the mutations that once escaped the DataError contract on thermos are replayed, and
a short seeded run over a generated capture (always) and over thermos (when
$DISTSPLAT_DATA holds it: tests/conftest.py) must end every case in a load or a DataError naming a file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))  # appended: a test folder on the front of sys.path shadows other folders' modules

import colmap_mutations as cm  # noqa: E402

FOUND = sorted((HERE / "crashers" / "colmap_model").glob("*.json"))
needs_thermos = pytest.mark.skipif(not cm.THERMOS.is_dir(), reason=f"{cm.THERMOS} is absent")


def _escapes(summary):
    return [(e["index"], e["what"], e["ops"]) for e in summary["escapes"]]


@needs_thermos
def test_the_mutations_that_escaped_now_end_in_a_data_error():
    specs = [json.loads(p.read_text()) for p in FOUND]
    assert len(specs) >= 10
    summary = cm.run_cases(cm.THERMOS, 0, 0, specs=[s["ops"] for s in specs])
    assert _escapes(summary) == []
    assert summary["outcomes"] == {"DataError": len(specs)}, summary["outcomes"]


def test_mutations_of_a_generated_capture(tmp_path):
    from tests.unit.data_helpers import make_colmap_dataset

    data = make_colmap_dataset(tmp_path / "capture", num_cameras=8, width=48, height=32, factors=(2,))
    summary = cm.run_cases(data, 150, seed=7)
    assert _escapes(summary) == []
    assert summary["outcomes"].get("DataError", 0) > 30 and summary["outcomes"].get("load", 0) > 30


@needs_thermos
def test_mutations_of_thermos():
    summary = cm.run_cases(cm.THERMOS, 100, seed=3)
    assert _escapes(summary) == []
