"""``dlb sim`` with policy variants (``Flow-Grad[pick=two-choice]``) beside the registered policies.

Registers each variant named in ``--policies`` (research/routing-stress/probe.py's syntax: FlowConfig
fields in brackets; a variant draws its base policy's random numbers) and runs the ``dlb sim`` command
line unchanged otherwise, so the records, the normalisation and ``benchmark.json`` are dlb sim's own.

Usage: python research/routing-stress/flowpick_sim.py sim --experiment baseline --seed 67 ...
       --policies "Rand,Flow-Grad,Flow-Grad[pick=two-choice]"
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import probe

import dlb.sim.cli as sim_cli
import dlb.sim.policies as sim_policies
from dlb.cli import main


def register(argv: list[str]) -> None:
    for k, arg in enumerate(argv):
        if arg == "--policies" and k + 1 < len(argv):
            for name in argv[k + 1].split(","):
                if "[" in name:
                    probe.register_variant(name.strip())
    extra = tuple(p for p in sim_policies.REGISTRY if "[" in p)
    sim_cli.POLICIES = (*sim_cli.POLICIES, *extra)  # type: ignore[misc]  # what --policies accepts, this run only


if __name__ == "__main__":
    register(sys.argv[1:])
    sys.exit(main(sys.argv[1:]))
