"""A config problem (file, line, field path, reason) and the error that carries all of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dlb.errors import DlbError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file."""

    file: str
    path: str  # field path, e.g. ``cells[1].leaf.probe``; "" for the whole document
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path or '(document)'}: {self.reason}"


class ConfigError(DlbError, ValueError):
    """An invalid config; ``problems`` lists every problem found (services refuse to start on it)."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: tuple[Problem, ...] = tuple(problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in config:\n" + "\n".join(str(p) for p in self.problems))

