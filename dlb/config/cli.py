"""``dlb config validate`` (and ``dlb config render``): the command-line face of the config checks."""

from __future__ import annotations

import argparse
import sys

from dlb.config.hostport import is_ip
from dlb.config.loader import ConfigError, load_config
from dlb.config.model import Cell, Config, loopback_name
from dlb.config.policy import unused_warmup_warning
from dlb.config.priors import unused_prior_warning
from dlb.config.tls_check import plaintext_warning
from dlb.envoy.root_token import forgeable_token_warning
from dlb.load.argtypes import output_file, port_number, port_or_zero


def _leaf_text(c: Cell) -> str:
    if c.leaf.source == "vllm":
        return "no DLB leaf: its servers' /metrics probed, requests to the servers"
    if c.leaf.source == "gie":
        return f"no DLB leaf: endpoint picker {c.leaf.probe} probed, requests to gateway {c.leaf.address}"
    more = f" (+{len(c.leaf.replicas)} replica{'s' if len(c.leaf.replicas) > 1 else ''})" if c.leaf.replicas else ""
    return f"leaf {c.leaf.address}{more}"


def summary(cfg: Config) -> str:
    """A few lines a person can eyeball: cells, arcs, endpoints."""
    n = len(cfg.cells)
    arcs = sum(sum(row) for row in cfg.network.allowed)
    lines = [f"{cfg.source}: valid (version {cfg.version}): {n} cell{'s' * (n != 1)}, {arcs}/{n * n} arcs allowed, "
             f"{len(cfg.endpoints)} endpoint{'s' * (len(cfg.endpoints) != 1)}"]
    for c in cfg.cells:
        dests = [d.name for d in cfg.allowed_destinations(c.name)]
        servers = f"InferencePool {c.inference_pool.name}'s ready pods" if c.inference_pool else \
            f"{len(c.servers)} server{'s' * (len(c.servers) != 1)}"
        lines.append(f"  cell {c.name}: {servers}, replicas {c.replicas}, "
                     f"{_leaf_text(c)}, may send to {'all' if len(dests) == n else ', '.join(dests)}")
    lp = cfg.policy.leaf
    dlb_cells = [c for c in cfg.cells if not c.leaf.foreign]
    with_ext_proc = [c.name for c in dlb_cells if c.leaf.ext_proc is not None]
    # Without leaf.ext_proc a cell's Envoy picks by LEAST_REQUEST and the policy's rule is never run there.
    if len(with_ext_proc) == len(dlb_cells):
        where = ""
    elif with_ext_proc:
        where = f" in {', '.join(with_ext_proc)} (leaf.ext_proc), elsewhere the leaf Envoy's LEAST_REQUEST"
    else:
        where = " in no cell (none sets leaf.ext_proc: each leaf Envoy's LEAST_REQUEST picks)"
    lines.append(f"  policy {cfg.policy.api_version}: leaf pick {lp.pick} (choices {lp.pick_params.choices}){where}, latency fit window "
                 f"{lp.fit.window_s:g} s / refit {lp.fit.refit_period_s:g} s, weights from {cfg.policy.weights}")
    for e in cfg.endpoints:
        p = e.policy
        extras = [x for x, on in (("aversion", p.aversion.enabled), (f"affinity on {p.affinity.header}", p.affinity.enabled)) if on]
        mech = f"native-discrete-{p.cost.value} (pick {p.native_pick})" if p.native else f"{p.mechanism.value}-{p.cost.value}"
        lines.append(f"  endpoint {e.name}: prefix {e.match.prefix}, {mech}"
                     + (f" + {' + '.join(extras)}" if extras else ""))
    return "\n".join(lines)


def envoy_problems(cfg: Config) -> list[str]:
    """Render every cell's root (if it has root.address) and leaf bootstrap and run ``envoy --mode validate``.

    The config checks cannot know everything Envoy will refuse (a DNS name where Envoy needs an IP, a
    future Envoy's stricter validation); this asks the real binary, once per bootstrap.
    """
    import tempfile
    from pathlib import Path

    from dlb.envoy.binary import validate
    from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap, write_bootstrap

    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dlb-validate-") as tmp:
        for c in cfg.cells:
            boots = [("leaf", leaf_bootstrap(cfg, c.name, admin_port=9901, emulate_wan=True, access_log=True))] if c.runs_dlb_leaf else []
            if c.root.address is not None:
                boots.append(("root", root_bootstrap(cfg, c.name, admin_port=9901)))
            for role, boot in boots:
                path = write_bootstrap(boot, Path(tmp) / f"{role}-{c.name}.yaml")
                result = validate(path)
                if result.returncode != 0:
                    detail = (result.stderr or result.stdout).strip().splitlines()
                    out.append(f"{cfg.source}: cells[{c.index}] ({c.name}): Envoy rejects the {role} bootstrap: "
                               + (_clip(detail[-1]) if detail else f"exit {result.returncode}"))
    return out


#: Envoy's parse errors end with the whole rendered bootstrap on the same line (tens of KB): the reason
#: comes first, so the line is cut here.
MAX_ENVOY_DETAIL = 400


def _clip(line: str) -> str:
    return line if len(line) <= MAX_ENVOY_DETAIL else f"{line[:MAX_ENVOY_DETAIL]} ... ({len(line) - MAX_ENVOY_DETAIL:,} more characters)"


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
        if args.envoy:
            bad = envoy_problems(cfg)
            if bad:
                status = 1
                print("\n".join(bad), file=sys.stderr)
                continue
        if not args.quiet:
            print(summary(cfg) + ("\n  envoy --mode validate: every root and leaf bootstrap OK" if args.envoy else ""))
        for warning in (forgeable_token_warning(cfg), unused_warmup_warning(cfg), unused_prior_warning(cfg), plaintext_warning(cfg)):
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        from dlb.launch.up import shared_listeners

        for clash in shared_listeners(cfg):  # fine on separate hosts (pods), fatal under dlb up
            print(f"warning: on one host (dlb up) two listeners clash: {clash}", file=sys.stderr)
    return status


def run_render(args: argparse.Namespace) -> int:
    from dlb.config.loader import parse_hostport
    from dlb.envoy.bootstrap import leaf_bootstrap, ready_port_clash, root_bootstrap, write_bootstrap

    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.cell not in cfg.cell_names:
        print(f"{args.file}: no cell {args.cell!r} (cells: {', '.join(cfg.cell_names)})", file=sys.stderr)
        return 1
    listen = parse_hostport(args.listen) if args.listen else None
    if args.listen and listen is None:
        print(f"--listen {args.listen!r} is not host:port", file=sys.stderr)
        return 2
    if listen is not None and not is_ip(listen.host) and not loopback_name(listen.host):
        # As a config's ``listen`` is refused: a name is how others reach a listener; binding it would
        # silently mean every interface.
        print(f"--listen {args.listen!r}: {listen.host!r} is not an IP address: a listener binds an interface "
              "(0.0.0.0 for all, 127.0.0.1 for this host)", file=sys.stderr)
        return 2
    clash = ready_port_clash(args.admin_port, args.ready_port)
    if clash:
        print(clash, file=sys.stderr)
        return 2
    try:
        if args.role == "root":
            boot = root_bootstrap(cfg, args.cell, admin_port=args.admin_port, listen=listen, native_flow=args.native_flow,
                                  ready_port=args.ready_port or None)
        else:
            boot = leaf_bootstrap(cfg.leaf_replica(args.cell, args.replica), args.cell, admin_port=args.admin_port, listen=listen,
                                  emulate_wan=args.emulate_wan, access_log=args.access_log, ready_port=args.ready_port or None)
    except ValueError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 1
    except KeyError as exc:  # no such leaf replica: the message names the file and field
        print(exc.args[0], file=sys.stderr)
        return 1
    taken = [f"{lst['name']} listener" for lst in boot["static_resources"]["listeners"]
             if lst["address"]["socket_address"]["port_value"] == args.admin_port]
    if taken:  # admin binds 127.0.0.1: one port for both is a file Envoy refuses at start
        print(f"--admin-port {args.admin_port} is also the port of this Envoy's {', '.join(taken)}: give admin another port",
              file=sys.stderr)
        return 2
    if args.output == "-":
        from dlb.envoy.bootstrap import dump_bootstrap

        sys.stdout.write(dump_bootstrap(boot))
    else:
        write_bootstrap(boot, args.output)
    return 0


def run_check_envoy(args: argparse.Namespace) -> int:
    """Every mismatch between hand-edited Envoy files and the DLB config, with its path; exit 1 if any."""
    import yaml

    from dlb.envoy.check import check_bootstrap

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    status = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                boot = yaml.safe_load(fh)
        except OSError as exc:
            print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
            status = 1
            continue
        except (UnicodeDecodeError, yaml.YAMLError) as exc:
            print(f"{path}: cannot read as YAML: {exc}", file=sys.stderr)
            status = 1
            continue
        found = check_bootstrap(boot, cfg, role=args.role, cell=args.cell)
        for m in found:
            print(f"{path}: {m}", file=sys.stderr)
        if found:
            status = 1
            print(f"{path}: {len(found)} mismatch{'es' * (len(found) != 1)} with {args.config}", file=sys.stderr)
        elif not args.quiet:
            print(f"{path}: agrees with {args.config}")
    return status


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check DLB config files; report every problem (exit 1 if any)")
    p.add_argument("files", nargs="+", metavar="FILE", help="DLB config YAML")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing when valid")
    p.add_argument("--envoy", action="store_true", help="also render every cell's Envoy bootstraps and run envoy --mode validate")
    p.set_defaults(func=run_validate)

    c = subparsers.add_parser("check-envoy", help="check hand-edited Envoy bootstraps against the DLB config (exit 1 on a mismatch)")
    c.add_argument("files", nargs="+", metavar="ENVOY.yaml", help="root or leaf Envoy bootstrap")
    c.add_argument("--config", required=True, help="DLB config YAML")
    c.add_argument("--role", choices=["root", "leaf"], default=None, help="default: the file's node.cluster (dlb-root / dlb-leaf)")
    c.add_argument("--cell", default=None, help="default: the file's node.locality.zone")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing when every file agrees")
    c.set_defaults(func=run_check_envoy)

    r = subparsers.add_parser("render", help="write the Envoy bootstrap of one cell's root or leaf")
    r.add_argument("file", metavar="FILE", help="DLB config YAML")
    r.add_argument("role", choices=["root", "leaf"], help="which Envoy of the cell")
    r.add_argument("cell", help="cell name")
    r.add_argument("--replica", type=int, default=0, help="leaf: which leaf replica (k: cells[].leaf.replicas[k-1]; default 0)")
    r.add_argument("--admin-port", type=port_number, required=True, help="Envoy admin port (bound to 127.0.0.1)")
    r.add_argument("--listen", help="listener host:port (default: cells[].root.listen / cells[].leaf.listen, "
                                    "else 0.0.0.0:<port of the address>)")
    r.add_argument("--ready-port", type=port_or_zero, default=9902,
                   help="port of the dlb_ready listener (GET /ready, Envoy's stats) on the traffic listener's address "
                        "(default 9902; 0 = none; two Envoys on one host need two)")
    r.add_argument("--emulate-wan", action="store_true", help="leaf: delay requests by the source cell's RTT (testbeds)")
    r.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                   help="leaf: send Envoy's gRPC access log to the leaf agent (default on: without it the agent never "
                        "learns a request finished, so the cell's requests in flight only grow)")
    r.add_argument("--native-flow", action="store_true", help="root: no ext_proc on flow endpoints without affinity")
    r.add_argument("-o", "--output", type=output_file, default="-", help="output file (default stdout)")
    r.set_defaults(func=run_render)


class _Moved(argparse.Action):
    """A flag whose knob moved into the config: using it stops the command and says where the knob lives."""

    def __init__(self, option_strings: list[str], dest: str, where: str = "", **kw: object) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        self.where = where

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string} is no longer a flag: routing knobs live in the DLB config, as {self.where} "
                     "in its `policy: {apiVersion: dlb.v1, plugins: [...]}` section (docs/config.md, policy surface); "
                     "every process of the deployment then agrees, and xDS can change it live")


def add_moved_flags(parser: argparse.ArgumentParser, moved: dict[str, str]) -> None:
    """Keep each removed routing flag as a hidden one that fails with where its knob lives now."""
    for flag, where in moved.items():
        parser.add_argument(flag, action=_Moved, where=where)
