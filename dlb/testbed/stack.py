"""A whole data plane on 127.0.0.1 for tests and benchmarks: emulators, leaf agents, a root, Envoys.

Everything is started from the same code paths a user runs (``dlb serve root|leaf`` as child
processes, Envoy with bootstraps from :mod:`dlb.envoy.bootstrap`), with every port picked free, and
:meth:`DataPlane.close` stops every process even when start-up fails half-way.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlb.config import Config, config_from_dict
from dlb.config.model import HostPort
from dlb.config.policy import set_plugins
from dlb.envoy.binary import EnvoyProcess
from dlb.launch.metrics_text import metric_value  # noqa: F401 - re-exported: tests and benches read metrics from here
from dlb.testbed.process import ServiceProcess, free_port


@dataclass
class CellSpec:
    name: str
    servers: int = 1
    emulator: dict[str, Any] = field(default_factory=dict)  # ThreadedEmulator overrides


@dataclass
class DataPlane:
    """Handles to every running part; ``root_url`` is where clients send requests."""

    cfg: Config
    config_path: str
    emulators: dict[str, list[Any]] = field(default_factory=dict)
    leaves: dict[str, ServiceProcess] = field(default_factory=dict)
    leaf_envoys: dict[str, EnvoyProcess] = field(default_factory=dict)
    #: Each cell's further leaf replicas (``leaf_replicas`` > 1): agents and Envoys, replica 1 first.
    more_leaves: dict[str, list[ServiceProcess]] = field(default_factory=dict)
    more_leaf_envoys: dict[str, list[EnvoyProcess]] = field(default_factory=dict)
    root: ServiceProcess | None = None
    root_envoy: EnvoyProcess | None = None
    #: Further root Envoys sharing the root's address (``root_envoys`` > 1, SO_REUSEPORT).
    more_root_envoys: list[EnvoyProcess] = field(default_factory=list)
    #: ``dlb serve control-plane`` when started with ``control_plane=True`` (leaf agents and the root
    #: then run with ``--xds`` against it; the Envoys keep their static bootstraps).
    control_plane: ServiceProcess | None = None
    #: Further active-active replicas (``control_planes`` > 1): the services follow all of them.
    more_control_planes: list[ServiceProcess] = field(default_factory=list)
    root_cell: str = ""
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _tmp: Any = None

    @property
    def root_url(self) -> tuple[str, int]:
        hp = self.cfg.cell(self.root_cell).root.address
        if hp is None:
            raise ValueError(f"cell {self.root_cell!r} has no root address in the config")
        return hp.host, hp.port

    def root_metrics(self) -> str:
        assert self.root is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.root.ready['metrics']}/metrics", timeout=5) as r:
            return r.read().decode()

    def leaf_metrics(self, cell: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.leaves[cell].ready['metrics']}/metrics", timeout=5) as r:
            return r.read().decode()

    def restart_leaf(self, cell: str) -> ServiceProcess:
        self.leaves[cell] = self._restart(self.leaves[cell])
        return self.leaves[cell]

    def restart_root(self) -> ServiceProcess:
        assert self.root is not None
        self.root = self._restart(self.root)
        return self.root

    def restart_control_plane(self) -> ServiceProcess:
        assert self.control_plane is not None
        self.control_plane = self._restart(self.control_plane)
        return self.control_plane

    def _restart(self, old: ServiceProcess) -> ServiceProcess:
        old.stop()
        new = ServiceProcess(old.command, *old.args)
        self._stack.enter_context(new)
        return new

    def close(self) -> None:
        self._stack.close()
        if self._tmp is not None:
            self._tmp.cleanup()


def _leaf_addresses(leaf_ext_proc: bool) -> dict[str, Any]:
    leaf: dict[str, Any] = {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"}
    if leaf_ext_proc:
        leaf["ext_proc"] = f"127.0.0.1:{free_port()}"
    return leaf


def build_config(cells: list[CellSpec], server_addrs: dict[str, list[str]], root_cell: str, endpoint: dict[str, Any] | list[dict[str, Any]],
                 one_way_ms: dict[str, dict[str, float]], leaf_ext_proc: bool, probe: dict[str, Any], leaf_replicas: int = 1) -> dict[str, Any]:
    raw_cells = []
    for c in cells:
        leaf = _leaf_addresses(leaf_ext_proc)
        if leaf_replicas > 1:
            leaf["replicas"] = [_leaf_addresses(leaf_ext_proc) for _ in range(leaf_replicas - 1)]
        item: dict[str, Any] = {"name": c.name, "leaf": leaf, "servers": server_addrs[c.name]}
        if c.name == root_cell:
            item["root"] = {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}
        raw_cells.append(item)
    return {
        "version": 1,
        "cells": raw_cells,
        "network": {"one_way_ms": one_way_ms, "default_one_way_ms": 0},
        "endpoints": endpoint if isinstance(endpoint, list) else [endpoint],
        "probe": probe,
        "services": {"root": {"ext_proc": f"127.0.0.1:{free_port()}", "metrics": f"127.0.0.1:{free_port()}"}},
    }


def start_data_plane(
    cells: list[CellSpec],
    root_cell: str,
    endpoint: dict[str, Any] | list[dict[str, Any]],
    one_way_ms: dict[str, dict[str, float]] | None = None,
    leaf_ext_proc: bool = True,
    emulate_wan: bool = True,
    probe: dict[str, Any] | None = None,
    root_seed: int = 1,
    leaf_args: tuple[str, ...] = (),
    root_args: tuple[str, ...] = (),
    plugins: tuple[dict[str, Any], ...] = (),
    tls: dict[str, str] | None = None,
    control_plane: bool = False,
    control_planes: int = 1,
    root_envoys: int = 1,
    leaf_replicas: int = 1,
    root_service: bool = True,
    root_envoy_xds: bool = False,
) -> DataPlane:
    """Start emulators, leaf agents + leaf Envoys for every cell, and the root + root Envoy of ``root_cell``;
    with ``control_plane`` first a control plane, whose xDS the leaf agents and the root then follow.

    ``plugins`` go into the config's ``policy`` section (each replacing the default of its slot; the
    leaves refit every second unless a ``latency-fit`` plugin says otherwise).
    ``tls`` is the config's ``tls`` section (``{ca, cert, key}``): every gRPC hop then runs mutual TLS.
    ``control_planes`` > 1 starts that many control-plane replicas (the first at the config's address);
    ``root_envoys`` > 1 that many root Envoys sharing the root address; ``leaf_replicas`` > 1 that many
    leaf replicas per cell (``cells[].leaf.replicas``: an agent and an Envoy each, over the same servers).
    ``root_service=False`` starts no root service (an operator baseline: Envoy alone routes);
    ``root_envoy_xds`` bootstraps the root Envoys over ADS from the control plane (``control_plane``
    needed), as ``dlb up`` does, instead of from a static bootstrap.
    """
    if root_envoy_xds and not control_plane:
        raise ValueError("root_envoy_xds needs control_plane=True (the root Envoy's config comes from it)")
    from dlb.emulator.server import ThreadedEmulator
    from dlb.envoy.ads_bootstrap import ads_bootstrap
    from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap, write_bootstrap
    from dlb.envoy.root_token import token_secret

    tmp = tempfile.TemporaryDirectory(prefix="dlb-dataplane-")
    stack = contextlib.ExitStack()
    try:
        emulators: dict[str, list[Any]] = {}
        addrs: dict[str, list[str]] = {}
        for c in cells:
            emulators[c.name] = []
            for k in range(c.servers):
                opts = {"server_id": f"{c.name}-{k}", "profile": "fast-test", **c.emulator}
                emu = stack.enter_context(ThreadedEmulator(**opts))
                emulators[c.name].append(emu)
            addrs[c.name] = [e.address for e in emulators[c.name]]
        raw = build_config(cells, addrs, root_cell, endpoint, one_way_ms or {}, leaf_ext_proc,
                           probe or {"period_ms": 20, "timeout_ms": 200, "stale_after_ms": 600, "backoff_max_ms": 500},
                           leaf_replicas)
        set_plugins(raw, {"type": "latency-fit", "parameters": {"refit_period_s": 1}}, *plugins)
        if tls is not None:
            raw["tls"] = dict(tls)
        for c in raw["cells"]:  # this plane's private directory: two testbeds on one box never share a socket
            c["leaf"].setdefault("access_log", f"unix:{tmp.name}/als-{c['name']}.sock")
            for k, r in enumerate(c["leaf"].get("replicas", []), 1):
                r.setdefault("access_log", f"unix:{tmp.name}/als-{c['name']}-{k}.sock")
        if control_plane:
            raw["services"]["control_plane"] = {"xds": f"127.0.0.1:{free_port()}", "status": f"127.0.0.1:{free_port()}"}
        config_path = str(Path(tmp.name) / "dlb.yaml")
        Path(config_path).write_text(json.dumps(raw, indent=1))  # JSON is YAML
        cfg = config_from_dict(raw, source=config_path)
        plane = DataPlane(cfg=cfg, config_path=config_path, emulators=emulators, root_cell=root_cell, _stack=stack, _tmp=tmp)
        procs = []
        xds: tuple[str, ...] = ()
        if control_plane:
            cp_args = [*(["--emulate-wan"] if emulate_wan else []), *(["--root-reuse-port"] if root_envoy_xds and root_envoys > 1 else [])]
            plane.control_plane = ServiceProcess("control-plane", "--config", config_path, *cp_args)
            stack.callback(lambda: plane.control_plane.stop() if plane.control_plane is not None else None)
            plane.control_plane.start()
            cp_addrs = [raw["services"]["control_plane"]["xds"]]
            for _ in range(control_planes - 1):
                more = ServiceProcess("control-plane", "--config", config_path, "--xds", f"127.0.0.1:{free_port()}",
                                      "--status", f"127.0.0.1:{free_port()}", *cp_args)
                stack.callback(more.stop)
                more.start()
                plane.more_control_planes.append(more)
                cp_addrs.append(more.args[more.args.index("--xds") + 1])
            xds = ("--xds", ",".join(cp_addrs))
        # Each agent reads its own Envoy's health verdicts at that Envoy's admin.
        leaf_admin = {(c.name, k): free_port() for c in cells for k in range(leaf_replicas)}
        for c in cells:
            for k in range(leaf_replicas):
                leaf = ServiceProcess("leaf", "--config", config_path, "--cell", c.name, "--replica", str(k),
                                      "--metrics", f"127.0.0.1:{free_port()}", "--scrape-period-ms", "100", "--seed", str(7 + k),
                                      "--envoy-admin", f"127.0.0.1:{leaf_admin[c.name, k]}", *xds, *leaf_args)
                if k == 0:
                    plane.leaves[c.name] = leaf
                else:
                    plane.more_leaves.setdefault(c.name, []).append(leaf)
                procs.append(leaf)
        if root_service:
            plane.root = ServiceProcess("root", "--config", config_path, "--cell", root_cell, "--metrics", f"127.0.0.1:{free_port()}",
                                        "--seed", str(root_seed), *(["--emulate-wan"] if emulate_wan else []), *xds, *root_args)
            procs.append(plane.root)
        # Start the Python services concurrently (each takes ~1 s to import), then wait for all.
        for p in procs:
            stack.callback(p.stop)
            p.spawn()
        for p in procs:
            p.wait_ready()
        for c in cells:
            for k in range(leaf_replicas):
                admin = leaf_admin[c.name, k]
                boot = leaf_bootstrap(cfg.leaf_replica(c.name, k), c.name, admin_port=admin, emulate_wan=emulate_wan, access_log=True)
                path = write_bootstrap(boot, Path(tmp.name) / f"leaf-{c.name}-{k}.yaml")
                envoy = stack.enter_context(EnvoyProcess(path, admin, base_id=random.randrange(1, 60000)))
                if k == 0:
                    plane.leaf_envoys[c.name] = envoy
                else:
                    plane.more_leaf_envoys.setdefault(c.name, []).append(envoy)
        for k in range(root_envoys):
            admin = free_port()
            if root_envoy_xds:
                boot = ads_bootstrap("root", root_cell, [HostPort("127.0.0.1", int(a.rpartition(":")[2])) for a in xds[1].split(",")], admin,
                                     node_id=f"root-{root_cell}-{k}", tls=cfg.tls, token=token_secret(cfg))
            else:
                boot = root_bootstrap(cfg, root_cell, admin_port=admin, reuse_port=root_envoys > 1)
            path = write_bootstrap(boot, Path(tmp.name) / f"root-{k}.yaml")
            envoy = stack.enter_context(EnvoyProcess(path, admin, base_id=random.randrange(1, 60000)))
            if k == 0:
                plane.root_envoy = envoy
            else:
                plane.more_root_envoys.append(envoy)
        return plane
    except BaseException:
        stack.close()
        tmp.cleanup()
        raise


def request(host: str, port: int, path: str = "/v1/chat/completions", body: dict[str, Any] | None = None,
            headers: dict[str, str] | None = None, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """One POST; returns (status, lower-cased headers, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = json.dumps(body if body is not None else {"model": "dlb-emulated", "messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 4}).encode()
        conn.request("POST", path, body=data, headers={"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def closed_loops(host: str, port: int, clients: int, seconds: float, body: dict[str, Any] | None = None) -> dict[str, int]:
    """``clients`` threads each sending :func:`request` back to back for ``seconds``: the server that
    answered (``x-dlb-server``) or ``status N`` → requests. What a fault test counts before and after."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    counts: dict[str, int] = {}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < end:
            status, headers, _ = request(host, port, body=body, timeout=30)
            key = headers.get("x-dlb-server", "?") if status == 200 else f"status {status}"
            with lock:
                counts[key] = counts.get(key, 0) + 1

    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(loop) for _ in range(clients)]:
            f.result()
    return counts
