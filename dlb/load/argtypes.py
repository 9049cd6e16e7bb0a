"""argparse types shared by the commands that take rates, durations and timeouts (no heavy imports: ``dlb up --help`` uses them)."""

from __future__ import annotations

import argparse
import math


def positive_float(text: str) -> float:
    """argparse type for rates, durations and load fractions: a bad value is reported against the option
    the user typed (``argument --rate: ...``), not later as the internal field (``rate_rps``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v
