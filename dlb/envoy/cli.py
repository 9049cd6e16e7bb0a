"""``dlb config xds-bootstrap`` (write an Envoy bootstrap that takes everything from the control plane) and
``dlb envoy drain`` (a pod's preStop: :mod:`dlb.envoy.drain`)."""

from __future__ import annotations

import argparse
import sys

import yaml

from dlb.config.model import HostPort
from dlb.errors import UsageError
from dlb.load.argtypes import output_file, port_number, port_or_zero

#: Where a pod's Envoy answers readiness probes (admin, at 9901 by convention, stays on 127.0.0.1).
DEFAULT_READY_PORT = 9902


def register_bootstrap(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("xds-bootstrap", help="write an Envoy bootstrap that takes everything from the control plane")
    p.add_argument("--role", choices=["root", "leaf"], required=True, help="which Envoy of the cell")
    p.add_argument("--cell", required=True, help="the cell this Envoy serves")
    p.add_argument("--xds", required=True, help="control plane xDS address host:port")
    p.add_argument("--admin-port", type=port_number, required=True, help="Envoy admin port (127.0.0.1)")
    p.add_argument("--node-id", default=None, help="xDS node id (default ROLE-CELL-PID)")
    p.add_argument("--replica", type=int, default=0, help="leaf: which leaf replica (k: cells[].leaf.replicas[k-1]; default 0)")
    p.add_argument("--delta", action="store_true", help="use incremental xDS (DELTA_GRPC)")
    p.add_argument("--ready-port", type=port_or_zero, default=DEFAULT_READY_PORT,
                   help=f"port of the dlb_ready listener on 0.0.0.0 answering GET /ready (default {DEFAULT_READY_PORT}; 0 = none)")
    p.add_argument("--config", default=None, help="DLB config whose tls section gives mTLS to the control plane and whose "
                   "root_token_file a root reads (docs/security.md)")
    p.add_argument("--root-token-file", default=None, help="root: the token file (overrides --config's)")
    p.add_argument("--tls-secret-dir", default=None, help="mTLS to the control plane with the kubernetes.io/tls Secret "
                   "mounted here (ca.crt, tls.crt, tls.key; not read now), reloaded on renewal through SDS files in "
                   "DIR-sds; overrides --config's tls")
    p.add_argument("--write-sds", default=None, metavar="FOLDER", help="with --tls-secret-dir: also write those SDS files here")
    p.add_argument("-o", "--output", type=output_file, default="-", help="file to write (default stdout)")
    p.set_defaults(func=run_bootstrap)


def run_bootstrap(args: argparse.Namespace) -> int:
    from dlb.envoy.ads_bootstrap import ads_bootstrap
    from dlb.envoy.bootstrap import ready_port_clash

    host, _, port = args.xds.rpartition(":")
    if not host or not port.isdigit():
        print(f"--xds: {args.xds!r} is not host:port", file=sys.stderr)
        return 2
    clash = ready_port_clash(args.admin_port, args.ready_port)
    if clash:
        raise UsageError(clash)
    from dlb.envoy.root_token import token_file_secret, token_secret

    tls = token = None
    if args.config is not None:
        from dlb.config import load_config

        cfg = load_config(args.config)
        if args.cell not in cfg.cell_names:  # else a bootstrap nothing is served to: its Envoy would wait without a word
            from dlb.config import ConfigError
            from dlb.config.loader import Problem

            raise ConfigError([Problem(args.config, "--cell", f"no cell named {args.cell!r} (cells: {', '.join(cfg.cell_names)})")])
        tls, token = cfg.tls, token_secret(cfg)
    if args.root_token_file is not None:
        token = token_file_secret(args.root_token_file)
    if args.tls_secret_dir is not None:
        from dlb.config.model import TlsFiles
        from dlb.config.schema import secret_dir_sds, secret_dir_tls

        tls = TlsFiles(**secret_dir_tls(args.tls_secret_dir), envoy_sds=secret_dir_sds(args.tls_secret_dir))
    if args.write_sds is not None:
        if args.tls_secret_dir is None:
            raise UsageError("--write-sds: give --tls-secret-dir (the SDS files name its files)")
        import os

        from dlb.envoy.tls import sds_files

        assert tls is not None
        os.makedirs(args.write_sds, exist_ok=True)
        for name, content in sds_files(tls).items():
            with open(os.path.join(args.write_sds, name), "w", encoding="utf-8") as fh:
                yaml.safe_dump(content, fh, sort_keys=False)
    if args.role == "root" and token is None:
        raise UsageError("--role root: give --root-token-file or --config (the root token is never sent over xDS)")
    text = yaml.safe_dump(ads_bootstrap(args.role, args.cell, HostPort(host.strip("[]"), int(port)), args.admin_port,
                                        args.node_id, args.delta, args.ready_port or None, tls=tls, token=token,
                                        leaf_replica=args.replica if args.role == "leaf" else 0), sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


def _run_drain(args: argparse.Namespace) -> int:
    import urllib.error

    from dlb.envoy.drain import drain

    if args.deadline < 0:
        raise UsageError("dlb envoy drain: --deadline must be >= 0 seconds")
    try:
        result = drain(args.admin_port, args.deadline, poll_s=args.poll_s)
    except (urllib.error.URLError, OSError) as e:
        print(f"dlb envoy drain: admin 127.0.0.1:{args.admin_port} unreachable: {e}", file=sys.stderr)
        return 1
    if result.drained:
        print(f"drained: {result.active_at_start} requests in flight at the start, 0 after {result.waited_s:.1f} s")
        return 0
    print(f"deadline {args.deadline:g} s passed with {result.active_at_end} requests in flight "
          f"({result.active_at_start} at the start)", file=sys.stderr)
    return 1


def register_drain(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("drain", help="preStop: fail health checks, drain listeners, wait for requests in flight")
    p.add_argument("--admin-port", type=port_number, required=True, help="the Envoy's admin port (on 127.0.0.1)")
    p.add_argument("--deadline", type=float, required=True,
                   help="seconds to wait at most (keep it under the pod's terminationGracePeriodSeconds)")
    p.add_argument("--poll-s", type=float, default=0.1, help="how often to read the in-flight gauge")
    p.set_defaults(func=_run_drain)
