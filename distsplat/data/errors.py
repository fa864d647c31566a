"""Errors of the data layer. Every bad input (missing or corrupt image, malformed model
or index) is raised as `DataError` naming the file, while the scene is parsed and the
images checked, i.e. before the trainer enters its first collective."""

from __future__ import annotations


class DataError(ValueError):
    """A dataset file is missing, malformed or inconsistent; the message names the file."""


class OwnershipError(KeyError):
    """A rank asked its image cache for a camera it does not own (DESIGN.md invariant 3)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""
