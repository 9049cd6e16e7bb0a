"""``dlb config xds-bootstrap``: write an Envoy bootstrap that takes everything from the control plane."""

from __future__ import annotations

import argparse
import sys

import yaml

from dlb.config.model import HostPort

#: Where a pod's Envoy answers readiness probes (admin, at 9901 by convention, stays on 127.0.0.1).
DEFAULT_READY_PORT = 9902


def register_bootstrap(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("xds-bootstrap", help="write an Envoy bootstrap that takes everything from the control plane")
    p.add_argument("--role", choices=["root", "leaf"], required=True)
    p.add_argument("--cell", required=True)
    p.add_argument("--xds", required=True, help="control plane xDS address host:port")
    p.add_argument("--admin-port", type=int, required=True)
    p.add_argument("--node-id", default=None)
    p.add_argument("--delta", action="store_true", help="use incremental xDS (DELTA_GRPC)")
    p.add_argument("--ready-port", type=int, default=DEFAULT_READY_PORT,
                   help=f"port of the dlb_ready listener on 0.0.0.0 answering GET /ready (default {DEFAULT_READY_PORT}; 0 = none)")
    p.add_argument("--config", default=None, help="DLB config whose tls section gives mTLS to the control plane (docs/security.md)")
    p.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    p.set_defaults(func=run_bootstrap)


def run_bootstrap(args: argparse.Namespace) -> int:
    from dlb.envoy.ads_bootstrap import ads_bootstrap

    host, _, port = args.xds.rpartition(":")
    if not host or not port.isdigit():
        print(f"--xds: {args.xds!r} is not host:port", file=sys.stderr)
        return 2
    tls = None
    if args.config is not None:
        from dlb.config import load_config

        tls = load_config(args.config).tls
    text = yaml.safe_dump(ads_bootstrap(args.role, args.cell, HostPort(host.strip("[]"), int(port)), args.admin_port,
                                        args.node_id, args.delta, args.ready_port or None, tls=tls), sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0
