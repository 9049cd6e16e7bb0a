"""A whole DLB deployment across network namespaces: what a multi-host (or multi-pod) fleet sees.

Hosts of a :class:`~dlb.testbed.netns.Lab`: ``cp`` and ``cp2`` (two active-active control-plane
replicas; every Envoy and service is given both), ``root`` (root Envoy + root
service: one source cell's "pod"), ``client``, and one host per cell with its emulated servers,
leaf Envoy and leaf agent. Every service binds its host's bridge address; the only loopback
addresses are Envoy's admin (as in a pod) and the root's ext_proc hop (``cells[].root.ext_proc``,
the in-pod hop from the root Envoy to its service). So a request, a probe or an xDS stream that
works here crossed the bridge the way it would cross a network between pods or machines.

:func:`netns_config` is pure (addresses in, config dict out); :func:`plan` adds the processes to a
:class:`~dlb.launch.supervisor.Supervisor`, each run with ``ip netns exec`` and each readiness
check made from inside its host (:func:`dlb.testbed.netns.entered`).
"""

from __future__ import annotations

import functools
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlb.config.model import HostPort
from dlb.launch.supervisor import Child, Supervisor
from dlb.launch.up import _control_plane_ready, _envoy_live, http_get, probes_fresh, tcp_open
from dlb.testbed.netns import Host, Lab, entered, listeners

ADMIN_PORT = 9901  # Envoy admin, on 127.0.0.1 of its host (each host has its own loopback)
XDS_PORT, STATUS_PORT = 18000, 18001
ROOT_PORT, ROOT_EXT_PROC_PORT, ROOT_METRICS_PORT = 10000, 18080, 19080
LEAF_PORT, PROBE_PORT, LEAF_EXT_PROC_PORT, LEAF_METRICS_PORT = 10010, 9010, 9011, 19010
SERVER_PORT = 8000


@dataclass(frozen=True)
class NetnsPlan:
    """What to deploy: cells (the first is the source cell whose root clients use), servers per cell."""

    cells: tuple[str, ...] = ("east", "central", "west")
    servers_per_cell: int = 2
    profile: str = "fast-test"
    stale_after_ms: int = 1000
    control_planes: int = 2

    @property
    def cp_hosts(self) -> list[str]:
        return ["cp"] + [f"cp{k + 1}" for k in range(1, self.control_planes)]

    @property
    def host_names(self) -> list[str]:
        return [*self.cp_hosts, "root", "client", *self.cells]


def netns_config(p: NetnsPlan, ip: dict[str, str]) -> dict[str, Any]:
    """The DLB config of ``p`` with each host at ``ip[name]`` (pure)."""
    cells = []
    for k, name in enumerate(p.cells):
        a = ip[name]
        item: dict[str, Any] = {
            "name": name,
            "leaf": {"address": f"{a}:{LEAF_PORT}", "probe": f"{a}:{PROBE_PORT}", "ext_proc": f"{a}:{LEAF_EXT_PROC_PORT}"},
            "servers": [f"{a}:{SERVER_PORT + s}" for s in range(p.servers_per_cell)],
        }
        if k == 0:
            item["root"] = {"address": f"{ip['root']}:{ROOT_PORT}", "ext_proc": f"127.0.0.1:{ROOT_EXT_PROC_PORT}"}
        cells.append(item)
    names = list(p.cells)
    return {
        "version": 1,
        "cells": cells,
        "network": {"one_way_ms": {a: {b: 2.0 * (j - i) for j, b in enumerate(names) if j > i} for i, a in enumerate(names[:-1])}},
        # RIF cost: the cells are alike, so requests spread over all of them (what the test needs to see).
        "endpoints": [{"name": "completions", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"},
                       "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 8, "s": 1}, "timeout_s": 60}],
        "probe": {"period_ms": 50, "timeout_ms": 300, "stale_after_ms": p.stale_after_ms, "backoff_max_ms": 1000},
        "services": {
            "control_plane": {"xds": f"{ip['cp']}:{XDS_PORT}", "status": f"{ip['cp']}:{STATUS_PORT}"},
            "root": {"ext_proc": f"127.0.0.1:{ROOT_EXT_PROC_PORT}", "metrics": f"{ip['root']}:{ROOT_METRICS_PORT}"},
        },
    }


def in_host(host: Host, check: Callable[[], bool]) -> bool:
    with entered(host):
        return check()


@dataclass
class NetnsDeployment:
    plan: NetnsPlan
    lab: Lab
    supervisor: Supervisor
    config: dict[str, Any]
    config_path: Path
    #: Supervised children per host name (to stop one cell's processes).
    children: dict[str, list[Child]] = field(default_factory=dict)

    def host(self, name: str) -> Host:
        return self.lab.hosts[name]

    @property
    def root_url(self) -> tuple[str, int]:
        return self.host("root").ip, ROOT_PORT

    @property
    def status_url(self) -> str:
        return f"http://{self.host('cp').ip}:{STATUS_PORT}"

    @property
    def status_urls(self) -> list[str]:
        """Every control-plane replica's status URL (``cp`` first)."""
        return [f"http://{self.host(h).ip}:{STATUS_PORT}" for h in self.plan.cp_hosts]

    @property
    def root_metrics_url(self) -> str:
        return f"http://{self.host('root').ip}:{ROOT_METRICS_PORT}/metrics"

    def get(self, host: str, url: str, timeout: float = 2.0) -> tuple[int, str]:
        """GET ``url`` from inside ``host`` (the only way in: the machine's namespace has no route)."""
        with entered(self.host(host)):
            return http_get(url, timeout)


def _python(host: Host, *args: str) -> list[str]:
    return host.argv([sys.executable, "-m", "dlb.cli", *args])


def _envoy(sup: Supervisor, dep: NetnsDeployment, host: Host, tier: str, role: str, cell: str, listener: HostPort) -> Child:
    from dlb.config import config_from_dict
    from dlb.envoy.ads_bootstrap import ads_bootstrap
    from dlb.envoy.binary import envoy_binary
    from dlb.envoy.root_token import token_secret

    xds = [HostPort(dep.host(h).ip, XDS_PORT) for h in dep.plan.cp_hosts]
    boot = sup.run_dir / f"{role}-{cell}.bootstrap.json"
    token = token_secret(config_from_dict(dep.config, source=str(dep.config_path)))
    boot.write_text(json.dumps(ads_bootstrap(role, cell, xds, ADMIN_PORT, node_id=f"{role}-{cell}", token=token), indent=1))
    argv = host.argv([envoy_binary(), "-c", str(boot), "--log-level", "warning", "--disable-hot-restart",
                      "--concurrency", "1", "--base-id", str(random.randrange(1, 1 << 30))])
    ready = functools.partial(in_host, host, lambda: _envoy_live(ADMIN_PORT) and tcp_open(listener))
    return sup.add(Child(f"{role} {cell} envoy", tier, argv, sup.run_dir / f"{role}-{cell}-envoy.log", ready=ready))


def plan(lab: Lab, p: NetnsPlan, sup: Supervisor) -> NetnsDeployment:
    """Write the config and add every process to ``sup`` in tiers (servers, control plane, leaves, root)."""
    ip = {name: h.ip for name, h in lab.hosts.items()}
    cfg = netns_config(p, ip)
    path = sup.run_dir / "dlb.yaml"
    path.write_text(json.dumps(cfg, indent=1))
    dep = NetnsDeployment(p, lab, sup, cfg, path)
    conf = str(path)
    xds = ",".join(f"{lab.hosts[h].ip}:{XDS_PORT}" for h in p.cp_hosts)

    def add(host: str, child: Child) -> None:
        dep.children.setdefault(host, []).append(sup.add(child))

    for cell in p.cells:
        h = lab.hosts[cell]
        for s in range(p.servers_per_cell):
            hp = HostPort(h.ip, SERVER_PORT + s)
            add(cell, Child(f"server {cell}/{s}", "servers",
                            _python(h, "serve", "emulator", "--host", h.ip, "--port", str(hp.port), "--profile", p.profile,
                                    "--server-id", f"{cell}/{s}"),
                            sup.run_dir / f"server-{cell}-{s}.log", ready=functools.partial(in_host, h, functools.partial(tcp_open, hp))))
    for name, status_url in zip(p.cp_hosts, dep.status_urls, strict=True):
        cp = lab.hosts[name]
        add(name, Child(f"control-plane {name}", "control-plane",
                        _python(cp, "serve", "control-plane", "--config", conf, "--emulate-wan",
                                "--xds", f"{cp.ip}:{XDS_PORT}", "--status", f"{cp.ip}:{STATUS_PORT}"),
                        sup.run_dir / f"control-plane-{name}.log",
                        ready=functools.partial(in_host, cp, functools.partial(_control_plane_ready, status_url, HostPort(cp.ip, XDS_PORT)))))
    for cell in p.cells:
        h = lab.hosts[cell]
        ready_path = sup.run_dir / f"leaf-{cell}.ready.json"
        add(cell, Child(f"leaf {cell} agent", "leaves",
                        _python(h, "serve", "leaf", "--config", conf, "--cell", cell, "--xds", xds,
                                "--metrics", f"{h.ip}:{LEAF_METRICS_PORT}", "--ready-file", str(ready_path),
                                "--envoy-admin", f"127.0.0.1:{ADMIN_PORT}"),
                        sup.run_dir / f"leaf-{cell}.log", ready=functools.partial(ready_path.exists),
                        before_start=functools.partial(ready_path.unlink, missing_ok=True)))
        dep.children[cell].append(_envoy(sup, dep, h, "leaves", "leaf", cell, HostPort(h.ip, LEAF_PORT)))
    root, src = lab.hosts["root"], p.cells[0]
    ready_path = sup.run_dir / "root.ready.json"
    from dlb.config import config_from_dict

    typed = config_from_dict(cfg)
    add("root", Child(f"root {src} service", "roots",
                      _python(root, "serve", "root", "--config", conf, "--cell", src, "--xds", xds,
                              "--metrics", f"{root.ip}:{ROOT_METRICS_PORT}", "--ready-file", str(ready_path), "--emulate-wan"),
                      sup.run_dir / "root.log",
                      ready=functools.partial(in_host, root, lambda: ready_path.exists() and probes_fresh(dep.root_metrics_url, typed, src)),
                      before_start=functools.partial(ready_path.unlink, missing_ok=True)))
    dep.children["root"].append(_envoy(sup, dep, root, "roots", "root", src, HostPort(root.ip, ROOT_PORT)))
    return dep


def unexpected_loopback(dep: NetnsDeployment) -> list[str]:
    """Listeners on loopback other than Envoy admin and the root's in-pod ext_proc hop, one line each.

    Loopback is private to a host (a pod): a service bound there that another host should reach is
    unreachable in a real deployment, which one shared 127.0.0.1 hides.
    """
    bad = []
    for name, host in dep.lab.hosts.items():
        for ln in listeners(host):
            if not ln.address.startswith("127.") and ln.address != "::1":
                continue
            envoy_admin = ln.port == ADMIN_PORT and "envoy" in ln.cmdline
            ext_proc_hop = name == "root" and ln.port == ROOT_EXT_PROC_PORT and "serve root" in ln.cmdline
            if not (envoy_admin or ext_proc_hop):
                bad.append(f"{name}: {ln.address}:{ln.port} ({ln.cmdline[:120]})")
    return bad
