"""A whole DLB deployment across network namespaces, in the shape ``deploy/k8s`` gives it: pods on hosts.

Hosts of a :class:`~dlb.testbed.netns.Lab`, each one pod (a namespace with its own address and
loopback): ``cp``, ``cp2`` (two active-active control-plane replicas), ``root``, ``root2`` (the source
cell's two root pods: root Envoy + root service each), per cell ``<cell>-leaf`` and ``<cell>-leaf2``
(two leaf pods: leaf Envoy + leaf agent each, over the same servers), ``<cell>`` (the cell's emulated
servers), ``client`` and ``dns``. Every process is a container of a pod template that
:mod:`dlb.testbed.k8s_pods` renders from ``deploy/k8s`` (``kubectl kustomize``): the same command
line, environment and readiness probe, the pod's volumes as folders and its ``/tmp`` scratch as a
mount of its own. Nothing is restated here but the config (``dlb.yaml``) and the servers.

Names are resolved by DNS as in a cluster: a stub DNS server on the bridge (:mod:`dlb.testbed.stub_dns`;
why a server and not ``/etc/hosts``: there) answers the control-plane Service's name with both
replicas, ``leaf-pods.<cell>`` (the headless Service behind ``leaf.replicas: dns``) and ``leaf.<cell>``
(the cell's leaf address) with the cell's leaf pods, and ``root.<cell>`` (the root Service clients
dial) with the root pods, rotating the records per query. A Service's virtual IP (kube-proxy) has no
stand-in: where a client in a cluster dials one address, here it resolves the name to every pod.

:func:`netns_config` and :func:`zone` are pure (addresses in); :func:`plan` adds the processes to a
:class:`~dlb.launch.supervisor.Supervisor`, each run with ``ip netns exec`` and each readiness check
made from inside its host (:func:`dlb.testbed.netns.entered`).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlb.config.model import HostPort
from dlb.launch.supervisor import Child, Supervisor
from dlb.launch.up import http_get, probes_fresh, tcp_open
from dlb.testbed import stub_dns
from dlb.testbed.k8s_pods import Container, Readiness, bootstraps, containers, pod_templates, render
from dlb.testbed.netns import Host, Lab, entered, listeners

#: Ports and names the rendered manifests use (a container's ports, the control-plane Service's name).
ADMIN_PORT = 9901  # Envoy admin, on 127.0.0.1 of its pod
XDS_PORT, STATUS_PORT = 18000, 18001
ROOT_PORT, ROOT_EXT_PROC_PORT, ROOT_METRICS_PORT = 10000, 18080, 19080
LEAF_PORT, PROBE_PORT, LEAF_METRICS_PORT = 10010, 9010, 19010
SERVER_PORT = 8000
CONTROL_PLANE_NAME = "dlb-control-plane.dlb-system.svc"
DOMAIN = "dlb.example.com"


def leaf_name(cell: str) -> str:
    return f"leaf.{cell}.{DOMAIN}"


def leaf_pods_name(cell: str) -> str:
    return f"leaf-pods.{cell}.{DOMAIN}"


def root_name(cell: str) -> str:
    return f"root.{cell}.{DOMAIN}"


@dataclass(frozen=True)
class NetnsPlan:
    """What to deploy: cells (the first is the source cell whose roots clients use), servers per cell, replicas."""

    cells: tuple[str, ...] = ("east", "central", "west")
    servers_per_cell: int = 2
    profile: str = "fast-test"
    stale_after_ms: int = 1000
    control_planes: int = 2
    leaf_replicas: int = 2
    root_replicas: int = 2

    @staticmethod
    def _numbered(base: str, n: int) -> list[str]:
        return [base] + [f"{base}{k + 1}" for k in range(1, n)]

    @property
    def cp_hosts(self) -> list[str]:
        return self._numbered("cp", self.control_planes)

    @property
    def root_hosts(self) -> list[str]:
        return self._numbered("root", self.root_replicas)

    def leaf_hosts(self, cell: str) -> list[str]:
        return self._numbered(f"{cell}-leaf", self.leaf_replicas)

    def cell_hosts(self, cell: str) -> list[str]:
        """The cell's servers host and its leaf pods."""
        return [cell, *self.leaf_hosts(cell)]

    @property
    def host_names(self) -> list[str]:
        return ["dns", *self.cp_hosts, *self.root_hosts, "client", *(h for c in self.cells for h in self.cell_hosts(c))]


def netns_config(p: NetnsPlan, ip: dict[str, str], token_file: str) -> dict[str, Any]:
    """The DLB config of ``p``: the servers at ``ip[cell]``, every other address a DNS name (pure)."""
    cells = []
    for k, name in enumerate(p.cells):
        item: dict[str, Any] = {
            "name": name,
            "leaf": {"address": f"{leaf_name(name)}:{LEAF_PORT}", "probe": f"{leaf_pods_name(name)}:{PROBE_PORT}", "replicas": "dns"},
            "servers": [f"{ip[name]}:{SERVER_PORT + s}" for s in range(p.servers_per_cell)],
        }
        if k == 0:
            item["root"] = {"address": f"{root_name(name)}:{ROOT_PORT}", "ext_proc": f"127.0.0.1:{ROOT_EXT_PROC_PORT}"}
        cells.append(item)
    names = list(p.cells)
    return {
        "version": 1,
        "cells": cells,
        "network": {"one_way_ms": {a: {b: 2.0 * (j - i) for j, b in enumerate(names) if j > i} for i, a in enumerate(names[:-1])}},
        # RIF cost: the cells are alike, so requests spread over all of them (what the tests need to see).
        "endpoints": [{"name": "completions", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"},
                       "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 8, "s": 1}, "timeout_s": 60}],
        # Every root and control-plane pod probes every leaf pod (4 x 6 here): at 50 ms that was 480 probes/s
        # of Python on a 2-core box, which starved the fleet it measured.
        "probe": {"period_ms": 100, "timeout_ms": 300, "stale_after_ms": p.stale_after_ms, "backoff_max_ms": 1000},
        "root_token_file": token_file,
        "services": {
            "control_plane": {"xds": f"{CONTROL_PLANE_NAME}:{XDS_PORT}", "status": f"{CONTROL_PLANE_NAME}:{STATUS_PORT}"},
            "root": {"ext_proc": f"127.0.0.1:{ROOT_EXT_PROC_PORT}", "metrics": f"0.0.0.0:{ROOT_METRICS_PORT}"},
        },
    }


def zone(p: NetnsPlan, ip: dict[str, str]) -> dict[str, list[str]]:
    """The stub DNS server's records: each Service name -> its pods' addresses (pure)."""
    out = {CONTROL_PLANE_NAME: [ip[h] for h in p.cp_hosts], root_name(p.cells[0]): [ip[h] for h in p.root_hosts]}
    for c in p.cells:
        out[leaf_name(c)] = out[leaf_pods_name(c)] = [ip[h] for h in p.leaf_hosts(c)]
    return out


def in_host(host: Host, check: Callable[[], bool]) -> bool:
    with entered(host):
        return check()


def _ready(host: Host, r: Readiness) -> bool:
    """A kubelet's readiness probe: to the pod's address, from inside its host."""
    hp = HostPort(host.ip, r.port)
    if r.path is None:
        return tcp_open(hp)
    try:
        return http_get(f"http://{hp}{r.path}", 1.0)[0] == 200
    except OSError:
        return False


@dataclass
class NetnsDeployment:
    plan: NetnsPlan
    lab: Lab
    supervisor: Supervisor
    config: dict[str, Any]
    config_path: Path
    #: Supervised children per host name (a pod's containers; a cell host's servers).
    children: dict[str, list[Child]] = field(default_factory=dict)

    def host(self, name: str) -> Host:
        return self.lab.hosts[name]

    def cell_children(self, cell: str) -> list[Child]:
        """Every process of a cell: its servers, leaf Envoys and leaf agents."""
        return [c for h in self.plan.cell_hosts(cell) for c in self.children.get(h, [])]

    @property
    def root_url(self) -> tuple[str, int]:
        """The first root pod's address (the tests that connect by address)."""
        return self.host(self.plan.root_hosts[0]).ip, ROOT_PORT

    @property
    def root_service_name(self) -> tuple[str, int]:
        """What clients dial: the root Service's name, which the stub DNS resolves to every root pod."""
        return root_name(self.plan.cells[0]), ROOT_PORT

    @property
    def status_url(self) -> str:
        return f"http://{self.host('cp').ip}:{STATUS_PORT}"

    @property
    def status_urls(self) -> list[str]:
        """Every control-plane replica's status URL (``cp`` first)."""
        return [f"http://{self.host(h).ip}:{STATUS_PORT}" for h in self.plan.cp_hosts]

    @property
    def root_metrics_url(self) -> str:
        return self.root_metrics_urls[0]

    @property
    def root_metrics_urls(self) -> list[str]:
        return [f"http://{self.host(h).ip}:{ROOT_METRICS_PORT}/metrics" for h in self.plan.root_hosts]

    def get(self, host: str, url: str, timeout: float = 2.0) -> tuple[int, str]:
        """GET ``url`` from inside ``host`` (the only way in: the machine's namespace has no route)."""
        with entered(self.host(host)):
            return http_get(url, timeout)

    def serving(self) -> bool:
        """Every root pod's service has fresh probes of every cell (readiness says only that it listens)."""
        from dlb.config import config_from_dict

        typed = config_from_dict(self.config, source=str(self.config_path))
        try:
            return all(in_host(self.host("client"), functools.partial(probes_fresh, url, typed, self.plan.cells[0]))
                       for url in self.root_metrics_urls)
        except OSError:
            return False


def _programs() -> dict[str, list[str]]:
    from dlb.envoy.binary import envoy_binary

    return {"dlb": [sys.executable, "-m", "dlb.cli"], "envoy": [envoy_binary()]}


def plan(lab: Lab, p: NetnsPlan, sup: Supervisor, overlay: Path | None = None) -> NetnsDeployment:
    """Write the config and add every process to ``sup`` in tiers (the stub DNS, servers, control plane,
    leaves, roots); the pods' containers come from ``overlay`` (default :data:`k8s_pods.OVERLAY`)."""
    docs = render(overlay) if overlay is not None else render()
    templates, boots = pod_templates(docs), bootstraps(docs)
    ip = {name: h.ip for name, h in lab.hosts.items()}
    lab.use_nameserver(lab.hosts["dns"].ip)
    # The pods' volumes, as folders outside /tmp (each pod's /tmp is its own scratch mount).
    vol = {name: lab.scratch / name for name in ("config", "root-token", "bootstrap-root", "bootstrap-leaf")}
    for folder in vol.values():
        folder.mkdir(parents=True, exist_ok=True)
    (vol["root-token"] / "token").write_text("netns-testbed-root-token-0123456789\n")
    cfg = netns_config(p, ip, str(vol["root-token"] / "token"))
    path = vol["config"] / "dlb.yaml"
    path.write_text(json.dumps(cfg, indent=1))
    dep = NetnsDeployment(p, lab, sup, cfg, path)
    programs = _programs()

    def add(host: str, child: Child) -> None:
        dep.children.setdefault(host, []).append(sup.add(child))

    dns, records = lab.hosts["dns"], zone(p, ip)
    add("dns", Child("stub-dns", "dns", stub_dns.argv(dns, records), sup.run_dir / "stub-dns.log",
                     ready=functools.partial(in_host, dns, lambda: bool(stub_dns.answers(dns.ip, CONTROL_PLANE_NAME)))))

    def pod(host_name: str, base: str, pod_name: str, cell: str, tier: str) -> None:
        host = lab.hosts[host_name]
        tmp = lab.scratch / "pods" / pod_name
        tmp.mkdir(parents=True, exist_ok=True)
        role = base.removeprefix("dlb-")
        if role in boots:  # the tier's bootstrap ConfigMap, its paths those of this pod's volumes
            (vol[f"bootstrap-{role}"] / "bootstrap.yaml").write_text(boots[role].replace("/etc/dlb-root-token/", f"{vol['root-token']}/"))
        volumes = {"config": vol["config"], "root-token": vol["root-token"]}
        if role in boots:
            volumes["bootstrap"] = vol[f"bootstrap-{role}"]
        values = {"POD_NAME": pod_name, "POD_IP": host.ip, "DLB_CELL": cell, "DLB_SERVE_CELLS": ",".join(p.cells)}
        for c in containers(templates[base], values, volumes, programs):
            add(host_name, _child(sup, host, pod_name, c, tier, tmp))

    for cell in p.cells:
        h = lab.hosts[cell]
        for s in range(p.servers_per_cell):
            hp = HostPort(h.ip, SERVER_PORT + s)
            add(cell, Child(f"server {cell}/{s}", "servers",
                            h.argv([sys.executable, "-m", "dlb.cli", "serve", "emulator", "--host", h.ip, "--port", str(hp.port),
                                    "--profile", p.profile, "--server-id", f"{cell}/{s}"]),
                            sup.run_dir / f"server-{cell}-{s}.log", ready=functools.partial(in_host, h, functools.partial(tcp_open, hp))))
    for k, name in enumerate(p.cp_hosts):
        pod(name, "dlb-control-plane", f"dlb-control-plane-{k}", "", "control-plane")
    for cell in p.cells:
        for k, name in enumerate(p.leaf_hosts(cell)):
            pod(name, "dlb-leaf", f"dlb-leaf-{cell}-{k}", cell, "leaves")
    for k, name in enumerate(p.root_hosts):
        pod(name, "dlb-root", f"dlb-root-{p.cells[0]}-{k}", p.cells[0], "roots")
    return dep


def _child(sup: Supervisor, host: Host, pod_name: str, c: Container, tier: str, tmp: Path) -> Child:
    ready = functools.partial(in_host, host, functools.partial(_ready, host, c.ready)) if c.ready is not None else None
    return Child(f"{pod_name} {c.name}", tier, host.pod_argv(c.argv, tmp), sup.run_dir / f"{pod_name}-{c.name}.log", ready=ready)


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
            ext_proc_hop = name.startswith("root") and ln.port == ROOT_EXT_PROC_PORT and "serve root" in ln.cmdline
            if not (envoy_admin or ext_proc_hop):
                bad.append(f"{name}: {ln.address}:{ln.port} ({ln.cmdline[:120]})")
    return bad
