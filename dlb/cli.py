"""The ``dlb`` command line.

Each command lives in the module that owns it and exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit
code). This file only lists them, with the one-line help ``dlb --help`` shows.

Registration is lazy: only the module of the command being run is imported; every other command
gets a placeholder parser carrying its help line. Importing every command module to build the
parser cost ~1.7 s per call on an idle box (scipy, the xDS server, grpc) and 10 s on a loaded one,
paid by commands that use none of it (issue 10).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import signal
import sys
from collections.abc import Sequence

from dlb.errors import DlbError

# (group, name, help, "module:function"). group None = top-level command; otherwise a command group
# such as ``serve`` or ``bench`` that the command is nested under. Several rows may share a target
# when one register() adds several commands (config validate/render).
_COMMANDS: list[tuple[str | None, str, str, str]] = [
    ("config", "validate", "check DLB config files; report every problem", "dlb.config.cli:register"),
    ("config", "render", "write the Envoy bootstrap of one cell's root or leaf", "dlb.config.cli:register"),
    ("config", "check-envoy", "check hand-edited Envoy bootstraps against the DLB config", "dlb.config.cli:register"),
    ("config", "xds-bootstrap", "write an Envoy bootstrap that takes everything from the control plane",
     "dlb.envoy.cli:register_bootstrap"),
    ("envoy", "drain", "preStop: fail health checks, drain an Envoy's listeners, wait for requests in flight",
     "dlb.envoy.cli:register_drain"),
    ("serve", "control-plane", "serve xDS to root/leaf Envoys and DLB services; run the flow loop",
     "dlb.control_plane.cli:register_serve"),
    ("serve", "emulator", "run an emulated OpenAI-compatible GPU inference server", "dlb.emulator.cli:register"),
    ("serve", "root", "root ext_proc service: picks a cell per request", "dlb.ext_proc.cli:register_root"),
    ("serve", "leaf", "leaf agent: picks servers in a cell, measures it, answers probes", "dlb.ext_proc.cli:register_leaf"),
    ("serve", "epp", "Gateway API Inference Extension endpoint picker for one pool", "dlb.epp.cli:register"),
    ("bench", "envoy-push", "time from a flow-weight change to a real Envoy applying it", "dlb.bench.cli:register_envoy_push"),
    ("bench", "pick", "per-request decision cost of the root router vs a numpy baseline", "dlb.bench.cli:register_pick"),
    ("bench", "overhead", "added latency/throughput/CPU of the root (and leaf) ext_proc hop", "dlb.bench.cli:register_overhead"),
    ("bench", "xds", "xDS server scale: push-to-ACK latency and memory per stream", "dlb.bench.cli:register_xds"),
    ("bench", "faults", "each fault under load through real Envoys: requests lost, detect and recover times",
     "dlb.bench.cli:register_faults"),
    ("bench", "load", "does `dlb load` keep up with a target rate without skewing what it measures", "dlb.bench.cli:register_load"),
    ("bench", "hostile", "resource-exhaustion attacks against live services while real traffic flows: RSS, loop block, "
     "real p50/errors", "dlb.bench.cli:register_hostile"),
    ("bench", "emulator-fidelity", "the emulated server's measured latency vs its own model, and its CPU per token",
     "dlb.bench.cli:register_emulator_fidelity"),
    ("bench", "sim-twin", "the simulator on the demo's fleet vs a real `dlb demo --compare` run", "dlb.bench.cli:register_sim_twin"),
    (None, "up", "run every DLB component of a config on this machine (supervised)", "dlb.launch.cli:register_up"),
    (None, "demo", "the whole stack on an embedded emulated fleet, a workload and a live view",
     "dlb.testbed.cli:register_demo"),
    (None, "load", "open-loop OpenAI load generator (Poisson/constant, streaming, sessions, traces)",
     "dlb.load.cli:register"),
    (None, "sim", "run the paper's simulation experiments", "dlb.sim.cli:register"),
    (None, "theory", "fluid-model check: routers vs independently solved equilibria", "dlb.theory.cli:register"),
    ("bfio", "study", "BF-IO vs round robin / JSQ / least-KV on a simulated DP decode group", "dlb.bench.cli:register_bfio_study"),
    ("bfio", "bench", "request-path decision cost of the BF-IO pick (G=32)", "dlb.bench.cli:register_bfio_bench"),
    ("bfio", "dataplane", "BF-IO vs JSQ rank picks through a real leaf Envoy on a DP emulator",
     "dlb.bench.cli:register_bfio_dataplane"),
    ("bfio", "placement", "BF-IO vs JSQ when ranks are chosen at arrival (the leaf) or at slot-free time",
     "dlb.bench.cli:register_bfio_placement"),
    ("bfio", "heldrun", "a data-path run with the leaf's hold queue, replayed in the study's step model",
     "dlb.bench.cli:register_bfio_heldrun"),
]

_GROUP_HELP = {
    "serve": "run a DLB service",
    "bench": "run a benchmark",
    "config": "work with DLB config files",
    "envoy": "operate a running Envoy (through its admin port)",
    "bfio": "BF-IO rank balancing for data-parallel servers: study and decision-cost benchmark",
}

#: Top-level options that take a value (skipped when finding the command in argv).
_VALUE_OPTIONS = {"--log-level", "--log-format"}


def _selected(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """(first, second) positional words of ``argv``: the command, or the group and its command."""
    words: list[str] = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in _VALUE_OPTIONS:
            skip = True
            continue
        if tok.startswith("-"):
            if not words:
                continue
            break  # options of the command itself: the words before them are the command
        words.append(tok)
        if len(words) == 2:
            break
    return (words[0] if words else None), (words[1] if len(words) > 1 else None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv`` only the command it names is imported (``None``: every command)."""
    parser = argparse.ArgumentParser(prog="dlb", description="DLB: distributed load balancing for GenAI inference on Envoy")
    parser.add_argument("--log-level", default=None, help="log level (default INFO, or $DLB_LOG_LEVEL)")
    parser.add_argument("--log-format", choices=["json", "console"], default=None, help="log format (default json)")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    first, second = _selected(argv) if argv is not None else (None, None)
    groups: dict[str, argparse._SubParsersAction] = {}
    registered: set[str] = set()
    for group, name, help_text, target in _COMMANDS:
        if group is None:
            sub = top
        else:
            if group not in groups:
                gp = top.add_parser(group, help=_GROUP_HELP.get(group, group))
                groups[group] = gp.add_subparsers(dest=f"{group}_command", metavar="SUBCOMMAND")
                gp.set_defaults(func=lambda _a, _gp=gp: (_gp.print_help(), 2)[1])
            sub = groups[group]
        wanted = argv is None or (name == first if group is None else (group == first and name == second))
        if target in registered:
            continue
        if wanted:
            module_name, func_name = target.split(":")
            getattr(importlib.import_module(module_name), func_name)(sub)
            registered.add(target)
        elif not any(t == target and (argv is None or (g is None and n == first) or (g == first and n == second))
                     for g, n, _h, t in _COMMANDS):
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    from dlb import log

    log.configure(level=args.log_level, fmt=args.log_format)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    if hasattr(args, "provenance_commit") and args.provenance_commit is None:
        from dlb.provenance import git_commit  # a command whose results file records the commit, computed here

        args.provenance_commit = git_commit()
    if hasattr(args, "command_line") and args.command_line is None:  # a benchmark records how it was run
        args.command_line = shlex.join(["dlb", *argv])
    if hasattr(args, "provenance_code") and args.provenance_code is None:
        from dlb.provenance import code_tree

        args.provenance_code = code_tree()
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away (``| head``) is seen here, not at exit
        return code
    except DlbError as exc:  # libraries raise; only the command line turns an error into an exit
        msg = str(exc)  # a message that already names its command ("dlb sim: ...") gets no second "dlb:"
        print(msg if msg.startswith("dlb ") else f"dlb: {msg}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader of our output closed it (``dlb config validate | head -1``): stop quietly, as a tool
        # killed by SIGPIPE does, and point stdout at /dev/null so the flush at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
