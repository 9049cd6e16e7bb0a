"""``dlb demo``: argument parsing only; the work is in :mod:`dlb.testbed.demo` (``dlb up`` is in :mod:`dlb.launch.cli`)."""

from __future__ import annotations

import argparse


def register_demo(subparsers: argparse._SubParsersAction) -> None:
    from dlb.testbed.demo import add_demo_arguments

    p = subparsers.add_parser("demo", help="the whole stack on an embedded emulated fleet, a workload and a live view")
    add_demo_arguments(p)
