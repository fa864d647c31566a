"""Replays the fuzzer's seeds and every crasher it found (tests/fuzz/corpus, tests/fuzz/crashers)
through each parser of user files (issue 21): each must parse or raise its documented error
with a message, nothing else. Runs in CI without atheris (tests/fuzz/fuzz.py is the fuzzer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import targets  # noqa: E402

CASES = [(name, p) for name in targets.TARGETS for kind in ("corpus", "crashers")
         for p in sorted((HERE / kind / name).glob("*")) if p.is_file()]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_replay")
    targets.prepare(d)
    return d


def test_every_target_has_seeds():
    assert {name for name, p in CASES if p.parent.parent.name == "corpus"} == set(targets.TARGETS)


@pytest.mark.parametrize("name, path", CASES, ids=[f"{n}/{p.parent.parent.name}/{p.name[:24]}" for n, p in CASES])
def test_replay(scratch, name, path):
    targets.run_one(name, path.read_bytes(), scratch)


def test_seeds_parse_without_error(scratch):
    """The seeds are valid files: the parsers accept them (so the fuzzer starts deep inside)."""
    for name, path in CASES:
        if path.parent.parent.name == "corpus":
            target = targets.TARGETS[name]
            (scratch / target.file).write_bytes(path.read_bytes())
            target.parse(scratch)
