"""``dlb config validate`` (and ``dlb config render``): the command-line face of the config checks."""

from __future__ import annotations

import argparse
import sys

from dlb.config.loader import ConfigError, load_config
from dlb.config.model import Config


def summary(cfg: Config) -> str:
    """A few lines a person can eyeball: cells, arcs, endpoints."""
    n = len(cfg.cells)
    arcs = sum(sum(row) for row in cfg.network.allowed)
    lines = [f"{cfg.source}: valid (version {cfg.version}): {n} cell{'s' * (n != 1)}, {arcs}/{n * n} arcs allowed, "
             f"{len(cfg.endpoints)} endpoint{'s' * (len(cfg.endpoints) != 1)}"]
    for c in cfg.cells:
        dests = [d.name for d in cfg.allowed_destinations(c.name)]
        lines.append(f"  cell {c.name}: {len(c.servers)} server{'s' * (len(c.servers) != 1)}, replicas {c.replicas}, "
                     f"leaf {c.leaf.address}, may send to {'all' if len(dests) == n else ', '.join(dests)}")
    for e in cfg.endpoints:
        p = e.policy
        extras = [x for x, on in (("aversion", p.aversion.enabled), (f"affinity on {p.affinity.header}", p.affinity.enabled)) if on]
        lines.append(f"  endpoint {e.name}: prefix {e.match.prefix}, {p.mechanism.value}-{p.cost.value}"
                     + (f" + {' + '.join(extras)}" if extras else ""))
    return "\n".join(lines)


def run_validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            cfg = load_config(path)
        except ConfigError as exc:
            status = 1
            for p in exc.problems:
                print(p, file=sys.stderr)
            n = len(exc.problems)
            print(f"{path}: invalid: {n} problem{'s' * (n != 1)}", file=sys.stderr)
            continue
        if not args.quiet:
            print(summary(cfg))
    return status


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check DLB config files; report every problem (exit 1 if any)")
    p.add_argument("files", nargs="+", metavar="FILE", help="DLB config YAML")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing when valid")
    p.set_defaults(func=run_validate)
