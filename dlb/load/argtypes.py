"""argparse types shared by the commands that take rates, durations and timeouts (no heavy imports: ``dlb up --help`` uses them)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable


def float_arg(text: str) -> float:
    """The number ``text`` holds, or argparse's error naming the option; each bounded type checks its range."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def float_in(low: float, high: float, why: str = "") -> Callable[[str], float]:
    """An argparse type: a number in [low, high] (0 or a negative mean decode length was a ZeroDivisionError
    or a traceback from numpy deep inside a run); ``why`` follows the refusal."""

    def parse(text: str) -> float:
        v = float_arg(text)
        if not low <= v <= high:  # also NaN
            raise argparse.ArgumentTypeError(f"must be in [{low:g}, {high:g}]{why}, got {text}")
        return v

    return parse


def positive_float(text: str) -> float:
    """argparse type for rates, durations and load fractions: a bad value is reported against the option
    the user typed (``argument --rate: ...``), not later as the internal field (``rate_rps``)."""
    v = float_arg(text)
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def _int(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return v


def positive_int(text: str) -> int:
    """argparse type for counts (group sizes, picks, decisions): an integer >= 1."""
    return _int(text, 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """argparse type for lengths that may be off (a horizon, a queue): an integer >= 0."""
    return _int(text, 0, "an integer >= 0")


def port_number(text: str) -> int:
    """argparse type for a TCP port to bind or reach: 1..65535 (99999 and -5 were written into bootstraps
    Envoy then refused)."""
    v = _int(text, 1, "a port in 1..65535")
    if v > 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535, got {text}")
    return v


def port_or_zero(text: str) -> int:
    """argparse type for an optional listener's port: 0 (none) or 1..65535."""
    return 0 if text.strip() == "0" else port_number(text)


def rng_seed(text: str) -> int:
    """argparse type for RNG seeds: numpy takes only non-negative integers (``-3`` was a traceback)."""
    return non_negative_int(text)


def _writable_ancestor(path: str) -> str | None:
    """Why files cannot be made at ``path`` (its nearest existing ancestor is no writable directory), or None."""
    probe = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"directory {probe} is not writable"
    return None


def output_file(text: str) -> str:
    """argparse type for a file a command writes (``-``: stdout): refused now if it cannot be written,
    not after the run (a bench's ``--json`` into a missing directory was a traceback at its end).
    Missing directories are made by the writer."""
    if text == "-":
        return text
    if not text or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file name" if text else "empty file name")
    if why := _writable_ancestor(text):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {why}")
    if os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: not writable")
    return text


def output_dir(text: str) -> str:
    """argparse type for a directory a command writes into (made if missing): refused now if it cannot be."""
    if not text:
        raise argparse.ArgumentTypeError("empty directory name")
    if os.path.exists(text):
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
        if not os.access(text, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"cannot write into {text}: not writable")
    elif why := _writable_ancestor(os.path.join(text, "x")):
        raise argparse.ArgumentTypeError(f"cannot make {text}: {why}")
    return text
