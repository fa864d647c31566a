"""Errors of the data layer. Every bad input (missing or corrupt image, malformed model
or index) is raised as `DataError` naming the file, while the scene is parsed and the
images checked, i.e. before the trainer enters its first collective."""

from __future__ import annotations


class DataError(ValueError):
    """A dataset file is missing, malformed or inconsistent; the message names the file."""


class OwnershipError(KeyError):
    """A rank asked its image cache for a camera it does not own (docs/design.md invariant 3)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


REPAIR_FILE = "re-copy or re-export the file"


class Where(str):
    """Where an image is (what an error names), carrying how to repair a damaged one: an
    image file is re-copied or re-exported; one inside a tar shard is fixed by packing the
    shards again (shards.py). A plain str stands for a file."""

    repair: str = REPAIR_FILE

    def __new__(cls, text: str, repair: str = REPAIR_FILE) -> "Where":
        self = super().__new__(cls, text)
        self.repair = repair
        return self


def repair_of(where: str) -> str:
    """How to repair the image at `where` (REPAIR_FILE unless a Where says otherwise)."""
    return getattr(where, "repair", REPAIR_FILE)
