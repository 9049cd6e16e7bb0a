"""A benchmark stopped with SIGTERM unwinds like Ctrl-C: everything it started is stopped."""

from __future__ import annotations

import argparse
import signal

from dlb.bench.cli import _runner

EVENTS: list[str] = []


def _bench(args: argparse.Namespace) -> int:
    """Stands in for a bench: starts something, is SIGTERMed, and must get to stop it."""
    EVENTS.append("started")
    try:
        signal.raise_signal(signal.SIGTERM)
        EVENTS.append("ran on")
        return 0
    finally:
        EVENTS.append("stopped")


def test_sigterm_runs_the_benchs_cleanup_and_exits_143() -> None:
    """Rule: Python's default SIGTERM exits without ``finally``/``__exit__`` (the data plane was left
    running); under a bench the signal unwinds the stack and the command exits 128 + 15."""
    before = signal.getsignal(signal.SIGTERM)
    EVENTS.clear()
    code = _runner(f"{__name__}:_bench")(argparse.Namespace(command_line=None))
    assert EVENTS == ["started", "stopped"] and code == 143
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the bench's only while it runs
