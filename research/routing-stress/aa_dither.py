"""``dlb sim`` with every leaf estimator's dither drawn from another random stream: an A/A arm.

The estimators dither their published time scale (±5 %) from a stream seeded per (scenario, trial, cell,
generation). Running the same code with that stream salted changes nothing but the dither's draws, so
the difference between this arm and a plain one is what a model's noise alone moves a run by — the bound
a no-harm rule for an estimator change needs (censored-prior-131-rule.md). Every other random stream
(arrivals, probes, routing) is untouched; the simulator forks its workers, so they inherit the salt.

Usage: python research/routing-stress/aa_dither.py SIM-ARGS...  (as ``dlb sim SIM-ARGS...``)
"""

from __future__ import annotations

import random
import sys
import types

import dlb.sim.engine as sim_engine
from dlb.cli import main


class SaltedRandom(random.Random):
    """A ``random.Random`` whose string seeds (the estimators' only) are salted; integer seeds are kept."""

    def __init__(self, x: object = None) -> None:
        super().__init__(f"aa-{x}" if isinstance(x, str) else x)  # type: ignore[arg-type]


sim_engine.random = types.SimpleNamespace(Random=SaltedRandom)  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(main(["sim", *sys.argv[1:]]))
