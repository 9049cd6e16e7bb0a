"""One harness for every benchmark: the run record, its JSON writer, the verdict and the ``--json`` option.

Why one: each benchmark had its own argparse, JSON writer and pass/fail rule, and four wrote no
commit, so a results file could not say which code or how busy a box produced it. Here a run starts
with :func:`start` (commit and load average read *before* the work: a commit made during a long run
must not get its numbers), ends with :func:`finish` (load average after, the file, the exit status).

Results files keep the shape each benchmark always wrote — a list of rows or one object — and gain
the stamp fields (``commit``, ``command_line``, ``loadavg_start``, ``loadavg_end``, ``target_verdicts``, ``pass``):
on an object once, on a list in every row. A field the benchmark already writes is never overwritten.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlb.finite_json import dumps as json_dumps
from dlb.provenance import git_commit


@dataclass(frozen=True)
class Target:
    """One verdict rule of a benchmark: its text, whether it held (``None``: not measured this run), the figure."""

    rule: str
    holds: bool | None
    measured: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "pass": self.holds, "measured": self.measured}


@dataclass
class BenchRecord:
    """What one benchmark run produced and under which conditions."""

    command_line: str
    commit: str
    loadavg_start: tuple[float, float, float]
    loadavg_end: tuple[float, float, float] | None = None
    figures: Any = None
    targets: list[Target] = field(default_factory=list)

    def missed(self) -> list[Target]:
        """The targets that did not hold (a target not measured is not missed)."""
        return [t for t in self.targets if t.holds is False]

    def passed(self) -> bool:
        return not self.missed()

    def stamp(self) -> dict[str, Any]:
        """The fields every results file carries, whatever its benchmark."""
        return {"commit": self.commit, "command_line": self.command_line, "loadavg_start": list(self.loadavg_start),
                "loadavg_end": list(self.loadavg_end) if self.loadavg_end is not None else None,
                "target_verdicts": [t.as_json() for t in self.targets], "pass": self.passed()}

    def as_json(self) -> Any:
        """The benchmark's own figures with the stamp added where it names nothing the figures already name."""
        stamp = self.stamp()
        if isinstance(self.figures, dict):
            return {**stamp, **self.figures}
        if isinstance(self.figures, list) and all(isinstance(r, dict) for r in self.figures):
            return [{**r, **{k: v for k, v in stamp.items() if k not in r}} for r in self.figures]
        return {**stamp, "figures": self.figures}


#: The command line of the benchmark this process runs, set by :func:`invoked_as` (``dlb.bench.cli``).
_invoked: list[str] = []


def invoked_as(command: str | None) -> None:
    """Remember how the running benchmark was invoked (``dlb bench pick --decisions 100``)."""
    _invoked[:] = [command] if command else []


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed, for the record: the one :func:`invoked_as` noted, else this process's argv."""
    if argv is None and _invoked:
        return _invoked[0]
    return shlex.join(["dlb", *(sys.argv[1:] if argv is None else argv)])


def start(command: str | None = None) -> BenchRecord:
    """A record stamped now: the commit and the box's load before the benchmark adds its own."""
    return BenchRecord(command_line=command if command is not None else command_line(), commit=git_commit(),
                       loadavg_start=os.getloadavg())


def write_json(path: str | Path, record: BenchRecord) -> None:
    """The one results writer: indented JSON, newline-terminated, null for a NaN figure (bare NaN is not JSON)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json_dumps(record.as_json(), indent=1) + "\n", encoding="utf-8")


def verdict(record: BenchRecord) -> int:
    """Exit status of a benchmark: 1 naming each missed target on stderr, 0 when every target held."""
    for t in record.missed():
        print(f"missed target: {t.rule}" + (f" (measured {t.measured})" if t.measured else ""), file=sys.stderr)
    return 1 if record.missed() else 0


def finish(record: BenchRecord, figures: Any, targets: list[Target] | None = None, json_path: str | None = None) -> int:
    """Close a run: load average after, figures and targets in, the file written, the exit status."""
    record.loadavg_end = os.getloadavg()
    record.figures = figures
    record.targets = list(targets or [])
    if json_path:
        try:
            write_json(json_path, record)
        except OSError as e:  # the run's results are not lost to a file system that refused them at the end
            print(f"dlb: cannot write --json {json_path}: {e.strerror or e}; the record follows on stdout", file=sys.stderr)
            print(json_dumps(record.as_json(), indent=1))
            return 2
    return verdict(record)


def add_json_option(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    """``--json FILE``, the same for every benchmark."""
    from dlb.load.argtypes import output_file

    parser.add_argument("--json", type=output_file, default=None, metavar="FILE",
                        help=f"write {what} to FILE, with the commit, the command line, the box's load average before "
                             "and after, and each target's rule and verdict; the exit status is 1 naming each missed target")
