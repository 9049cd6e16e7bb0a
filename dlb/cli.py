"""The ``dlb`` command line.

Each command lives in the module that owns it and exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit
code). This file only lists them, so adding a command is one line here and nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (group, "module:function"). group None = top-level command; otherwise a command group such as
# ``serve`` or ``bench`` that the registered command is nested under.
_COMMANDS: list[tuple[str | None, str]] = [
    ("config", "dlb.config.cli:register"),
    ("config", "dlb.envoy.cli:register_bootstrap"),
    ("serve", "dlb.control_plane.cli:register_serve"),
    ("bench", "dlb.bench.envoy_push:register"),
    ("bench", "dlb.bench.pick:register"),
    ("serve", "dlb.emulator.cli:register"),
    ("serve", "dlb.ext_proc.root_serve:register"),
    ("serve", "dlb.ext_proc.leaf:register"),
    ("bench", "dlb.bench.overhead:register"),
    ("bench", "dlb.bench.xds_scale:register"),
    (None, "dlb.sim.cli:register"),
    (None, "dlb.core.theory:register"),
    ("bfio", "dlb.bench.bfio_study:register"),
    ("bfio", "dlb.bench.bfio_dataplane:register"),
]

_GROUP_HELP = {
    "serve": "run a DLB service",
    "bench": "run a benchmark",
    "config": "work with DLB config files",
    "bfio": "BF-IO rank balancing for data-parallel servers: study and decision-cost benchmark",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlb", description="DLB: distributed load balancing for GenAI inference on Envoy")
    parser.add_argument("--log-level", default=None, help="log level (default INFO, or $DLB_LOG_LEVEL)")
    parser.add_argument("--log-format", choices=["json", "console"], default=None, help="log format (default json)")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for group, target in _COMMANDS:
        module_name, func_name = target.split(":")
        register = getattr(importlib.import_module(module_name), func_name)
        if group is None:
            register(top)
            continue
        if group not in groups:
            gp = top.add_parser(group, help=_GROUP_HELP.get(group, group))
            groups[group] = gp.add_subparsers(dest=f"{group}_command", metavar="SUBCOMMAND")
            gp.set_defaults(func=lambda _a, _gp=gp: (_gp.print_help(), 2)[1])
        register(groups[group])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from dlb import log

    log.configure(level=args.log_level, fmt=args.log_format)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
