"""``dlb up``: every DLB component of a config on this machine, under one supervisor.

Tiers, started in this order and stopped in the reverse (:mod:`dlb.launch.supervisor`):

1. ``control-plane`` — ``dlb serve control-plane`` (xDS, flow loop, ``/status``, ``/fleet``);
2. ``leaves`` — per cell with a DLB leaf (not ``leaf.source: vllm`` or ``gie``), and per leaf replica of it
   (``leaf.replicas``), the leaf agent (``dlb serve leaf --xds --replica k``) and the leaf Envoy, whose
   bootstrap names only the control plane (:func:`dlb.envoy.ads_bootstrap.ads_bootstrap`): its
   listener, clusters, access log and WAN delay come over ADS;
3. ``roots`` — per cell with a ``root:`` the root service (``dlb serve root --xds``) and the root
   Envoy, likewise bootstrapped from the control plane only.

(``dlb demo`` puts its emulated servers in a ``servers`` tier before all of these.)

A root is *ready* only when its Envoy is LIVE, its listener accepts connections and its service has
fresh probe state for every cell it may send to — so the first request a user sends after the URLs
are printed is routed, instead of the ``503 dlb: no usable cell`` of a root that has not heard from
its leaves yet (what the hand-started sequence of docs/data-plane.md produced for ~5 s). A cell whose
leaf answers that it cannot serve stops counting after a grace (:func:`_root_ready`), so ``dlb up``
starts during one cell's outage.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlb.config.bound_at_start import restart_only_changes
from dlb.config.hostport import parse_hostport
from dlb.config.model import WILDCARD_HOSTS, Config, HostPort
from dlb.envoy.bootstrap import root_has_ext_proc
from dlb.launch.run_secrets import run_env
from dlb.launch.supervisor import Child, Supervisor
from dlb.procutil import free_port, log_tail, reserve_ports

ENVOY_LOG_LEVEL = "warning"


def http_get(url: str, timeout: float = 1.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return int(r.status), r.read().decode(errors="replace")


def tcp_open(hp: HostPort, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((hp.host, hp.port), timeout=timeout):
            return True
    except OSError:
        return False


def root_ports(cfg: Config) -> dict[str, tuple[HostPort, HostPort]]:
    """Each source cell's (root service metrics, root Envoy admin): ``services.root.metrics``/``.admin``
    plus the root's position among the config's roots, so a run's Prometheus targets never move."""
    m, a = cfg.services.root.metrics, cfg.services.root.admin
    roots = [c.name for c in cfg.cells if c.root.address is not None]
    return {name: (HostPort(m.host, m.port + k), HostPort(a.host, a.port + k)) for k, name in enumerate(roots)}


def listen_addresses(cfg: Config, root_services: bool = True) -> list[tuple[str, HostPort]]:
    """Every (field path, address) ``dlb up`` will listen on, in file order.

    A ``listen`` equal to its ``address`` (a loopback address binds as it is) is listed once, under
    ``address``: one port in use was reported twice, once under a field the user never wrote.
    """
    root_services = root_services and root_has_ext_proc(cfg, native_flow=True)  # as :func:`plan` starts them
    cp = cfg.services.control_plane
    out = [("services.control_plane.xds", cp.xds), ("services.control_plane.status", cp.status)]
    for i, cell in enumerate(cfg.cells):
        # The Envoys bind ``listen`` (default 0.0.0.0:<port>), and here roots reach them at ``address``: check both.
        for k, leaf in enumerate(cell.leaf.all_replicas()):
            lp = f"cells[{i}].leaf" + (f".replicas[{k - 1}]" if k else "")
            if cell.runs_dlb_leaf:  # a foreign or InferencePool cell's leaf addresses are its own gateway's or servers'
                out.append((f"{lp}.address", leaf.address))
                if leaf.bind != leaf.address:
                    out.append((f"{lp}.listen", leaf.bind))
                out.append((f"{lp}.probe", leaf.probe))
                als = parse_hostport(leaf.access_log) if leaf.access_log and not leaf.access_log.startswith("unix:") else None
                if als is not None:  # the agent listens there for its Envoy's access log
                    out.append((f"{lp}.access_log", als))
            if leaf.ext_proc is not None:
                out.append((f"{lp}.ext_proc", leaf.ext_proc))
        if cell.root.address is not None:
            out.append((f"cells[{i}].root.address", cell.root.address))
            if cell.root.bind not in (None, cell.root.address):
                out.append((f"cells[{i}].root.listen", cell.root.bind or cell.root.address))
            if root_services:
                field_path = f"cells[{i}].root.ext_proc" if cell.root.ext_proc is not None else f"services.root.ext_proc (root {cell.name})"
                out.append((field_path, cell.root.ext_proc or cfg.services.root.ext_proc))
    for k, (cell_name, (metrics, admin)) in enumerate(root_ports(cfg).items()):
        plus = f" + {k}" if k else ""
        if root_services:
            out.append((f"services.root.metrics{plus} (root {cell_name})", metrics))
        out.append((f"services.root.admin{plus} (root {cell_name} Envoy)", admin))
    return out


def _same_listener(a: str, b: str) -> bool:
    """``X.address`` and ``X.listen``: how others reach one Envoy listener and where it binds (not a clash)."""
    (pa, _, fa), (pb, _, fb) = a.rpartition("."), b.rpartition(".")
    return pa == pb and {fa, fb} == {"address", "listen"}


def shared_listeners(cfg: Config, root_services: bool = True) -> list[str]:
    """``field: address X is also used by other field`` for each address ``dlb up`` would listen on twice:
    the second listener could not bind, or, worse, its readiness check would reach the first."""
    owner: dict[HostPort, str] = {}
    wild: dict[int, tuple[HostPort, str]] = {}  # port -> the first 0.0.0.0 / [::] bind of it
    out = []
    for field_path, hp in listen_addresses(cfg, root_services):
        other = owner.get(hp)
        # Every interface's port clashes with any address's (a stranger's 0.0.0.0:P beside 127.0.0.1:P
        # passed, and the second child died on a bind error naming no field).
        if other is None and hp.host in WILDCARD_HOSTS:
            other = next((f"{f} ({h})" for h, f in owner.items() if h.port == hp.port and not _same_listener(f, field_path)), None)
        elif other is None and hp.port in wild and not _same_listener(wild[hp.port][1], field_path):
            other = f"{wild[hp.port][1]} ({wild[hp.port][0]})"
        if other is not None:
            out.append(f"{field_path}: address {hp} is also used by {other}")
            continue
        owner[hp] = field_path
        if hp.host in WILDCARD_HOSTS:
            wild.setdefault(hp.port, (hp, field_path))
    return out


def listen_problems(cfg: Config, config_path: str, root_services: bool = True) -> list[str]:
    """Addresses of ``cfg`` this machine cannot listen on, one line each naming the file and field.

    Why before starting: an Envoy whose xDS listener cannot bind does not exit — it NACKs the
    listener and stays up, so the supervisor would wait its whole ready timeout and then name only
    the Envoy (the reason, e.g. ``Address already in use`` from an earlier ``dlb up``, sat in its log).
    """
    problems = [f"{config_path}: {msg}" for msg in shared_listeners(cfg, root_services)]
    tried: set[HostPort] = set()
    for field_path, hp in listen_addresses(cfg, root_services):
        if hp in tried:  # a second field on one address: reported just above
            continue
        tried.add(hp)
        try:
            infos = socket.getaddrinfo(hp.host, hp.port, type=socket.SOCK_STREAM)
            family, _, _, _, sockaddr = infos[0]
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Envoy and gRPC do: TIME_WAIT is no conflict
                s.bind(sockaddr)
        except OSError as e:
            problems.append(f"{config_path}: {field_path}: cannot listen on {hp.host}:{hp.port} on this machine: "
                            f"{e.strerror or e}")
    return problems


def _ready_file(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _envoy_live(admin_port: int) -> bool:
    try:
        return http_get(f"http://127.0.0.1:{admin_port}/ready", 0.5)[1].strip() == "LIVE"
    except OSError:
        return False


def _envoy_listening(admin_port: int, listener: HostPort) -> bool:
    """The Envoy itself holds a listener on ``listener``'s port (its admin ``/listeners``). Why not only a
    connect: a listener Envoy could not bind is NACKed and dropped while the Envoy stays LIVE, and a
    connect then reaches whatever else holds the port."""
    try:
        doc = json.loads(http_get(f"http://127.0.0.1:{admin_port}/listeners?format=json", 0.5)[1])
    except (OSError, ValueError):
        return False
    return any(((ls.get("local_address") or {}).get("socket_address") or {}).get("port_value") == listener.port
               for ls in doc.get("listener_statuses", []))


def _envoy_waiting(admin_port: int, listener: HostPort, xds: HostPort) -> str:
    """What a starting Envoy lacks: its admin saying LIVE, or the listener it takes from the control plane."""
    if not _envoy_live(admin_port):
        return f"its admin http://127.0.0.1:{admin_port}/ready to answer LIVE (config from the control plane at {xds})"
    if not _envoy_listening(admin_port, listener):
        return (f"its listener on port {listener.port}: the Envoy holds none yet (from the control plane at {xds}; "
                "a refused bind shows in its log)")
    return f"its listener {listener} to accept a connection"


def _fetch(url: str) -> str | None:
    try:
        return http_get(url, 1.0)[1]
    except OSError:
        return None


def _root_waiting(ready_file: Path, metrics_url: str, dep: Deployment, cell: str) -> str:
    """What a root service lacks before it is ready: its listener, or usable cells (and why each is not),
    by the config running now (``dep.cfg``, replaced on reload)."""
    from dlb.launch.waiting import last_probe_failures, root_waiting

    cfg, leaf_metrics = dep.cfg, dep.leaf_metrics
    if not ready_file.exists():
        return "its ext_proc listener (ready file not written yet)"
    text = _fetch(metrics_url)
    if text is None:
        return f"its metrics at {metrics_url}"
    dests = {d.name for d in cfg.allowed_destinations(cell)}
    return root_waiting(text, cfg, cell, {c: _fetch(url) for c, url in leaf_metrics.items() if c in dests},
                        last_probe_failures(log_tail(ready_file.parent / f"root-{cell}.log", 1000)))


@dataclass
class RootInfo:
    cell: str
    base_url: str
    admin_url: str
    metrics_url: str
    ready_file: Path


@dataclass
class Deployment:
    """What ``dlb up`` started: the supervisor and the URLs a user (or the demo) needs."""

    cfg: Config
    config_path: str
    supervisor: Supervisor
    status_url: str
    roots: dict[str, RootInfo] = field(default_factory=dict)
    leaf_metrics: dict[str, str] = field(default_factory=dict)
    leaf_admin: dict[str, str] = field(default_factory=dict)
    #: Admin URLs of each cell's further root Envoys (``--root-envoys`` > 1), drawn free like the leaves'.
    more_root_admin: dict[str, list[str]] = field(default_factory=dict)
    #: Every control-plane replica's (xDS, status) address, the config's first.
    control_planes: list[tuple[HostPort, HostPort]] = field(default_factory=list)
    #: How long a root waits for a cell known to be down before it starts without it, and since when
    #: each root has waited (its ready file written).
    down_grace_s: float = 30.0
    root_wait_since: dict[str, float] = field(default_factory=dict)
    #: Root cell -> the cells it started without, until each joins (:meth:`report_joined` says so).
    started_without: dict[str, set[str]] = field(default_factory=dict)

    def report_joined(self) -> None:
        """Say when a cell a root started without becomes usable for every endpoint: the console said the
        root started without it and that it would join, and a stranger waited for a line saying it had."""
        from dlb.launch.waiting import joined

        for cell, pending in self.started_without.items():
            root = self.roots.get(cell)
            if not pending or root is None or not root.metrics_url:
                continue
            status, text = http_get(root.metrics_url, 1.0)
            if status != 200:
                continue
            for d in joined(text, self.cfg, cell, pending):
                pending.discard(d)
                self.supervisor.say(f"root {cell} service", f"cell {d} joined: usable for every endpoint")

    def ports_text(self) -> str:
        """Every address this run listens on, before anything starts: the config's by field, then the
        leaves' metrics and Envoy admin ports drawn free for this run (not in the config)."""
        lines = [f"  {hp}  {field}" for field, hp in listen_addresses(self.cfg)]
        lines += [f"  {hp}  control plane {k + 2} {what} (drawn)" for k, pair in enumerate(self.control_planes[1:])
                  for what, hp in zip(("xds", "status"), pair, strict=True)]
        lines += [f"  {leaf.rsplit('//', 1)[1].split('/')[0]}  leaf {cell} metrics (drawn)" for cell, leaf in self.leaf_metrics.items()]
        lines += [f"  {url.rsplit('//', 1)[1].split('/')[0]}  leaf {cell} Envoy admin (drawn)" for cell, url in self.leaf_admin.items()]
        lines += [f"  {url.rsplit('//', 1)[1].split('/')[0]}  root {cell} Envoy {k + 2} admin (drawn)"
                  for cell, urls in self.more_root_admin.items() for k, url in enumerate(urls)]
        return "\n".join(lines)

    def urls_text(self) -> str:
        lines = [f"control plane: {self.status_url}/status  fleet: {self.status_url}/fleet  metrics: {self.status_url}/metrics"]
        # Every replica's: a /status lists only the nodes streaming from that replica, and after one restarts
        # they all stay on the other (a stranger read the first one's empty list as an outage).
        lines += [f"control plane {k + 2}: http://{status}/status  fleet: http://{status}/fleet  metrics: http://{status}/metrics"
                  for k, (_, status) in enumerate(self.control_planes[1:])]
        for r in self.roots.values():
            more = "".join(f"  admin {k + 2} {url}" for k, url in enumerate(self.more_root_admin.get(r.cell, [])))
            lines.append(f"root {r.cell}: base_url {r.base_url}  metrics {r.metrics_url or 'none'}  admin {r.admin_url}{more}")
        for cell, url in self.leaf_metrics.items():
            lines.append(f"leaf {cell}: metrics {url}  admin {self.leaf_admin[cell]}")
        return "\n".join(lines)


def _python() -> list[str]:
    return [sys.executable, "-m", "dlb.cli"]


def _envoy_child(sup: Supervisor, role: str, cell: str, xds: list[HostPort], listener: HostPort, run_dir: Path,
                 cfg: Config, admin: int | None = None, replica: int = 1) -> tuple[Child, int]:
    """One cell's root or leaf Envoy, bootstrapped over ADS, in the roots' or leaves' stop tier (admin on
    ``admin``, default a free port); ``replica`` > 1 names a further root Envoy sharing the same listener,
    or the leaf replica ``replica - 1`` of the cell (``cells[].leaf.replicas``) with its own."""
    from dlb.envoy.ads_bootstrap import ads_bootstrap
    from dlb.envoy.root_token import token_secret

    suffix = "" if replica == 1 else f" {replica}"
    name, tier = f"{role} {cell} envoy{suffix}", f"{role}s" if role == "root" else "leaves"
    from dlb.envoy.binary import envoy_binary

    admin = admin or free_port()
    boot = run_dir / f"{name.replace(' ', '-')}.bootstrap.json"
    boot.write_text(json.dumps(ads_bootstrap(role, cell, xds, admin, node_id=f"{role}-{cell}{suffix.replace(' ', '-')}",
                                             tls=cfg.tls, token=token_secret(cfg), leaf_replica=replica - 1 if role == "leaf" else 0),
                               indent=1))
    argv = [envoy_binary(), "-c", str(boot), "--log-level", ENVOY_LOG_LEVEL, "--disable-hot-restart",
            "--concurrency", "1", "--base-id", str(random.randrange(1, 1 << 30))]
    child = Child(name, tier, argv, run_dir / f"{name.replace(' ', '-')}.log",
                  ready=lambda: _envoy_live(admin) and _envoy_listening(admin, listener) and tcp_open(listener),
                  waiting=functools.partial(_envoy_waiting, admin, listener, xds[0]))
    return sup.add(child), admin


def probes_fresh(metrics_url: str, cfg: Config, cell: str) -> bool:
    """Every cell the root of ``cell`` may send to is usable (fresh probe, available) for every endpoint."""
    from dlb.launch.waiting import unusable

    return not unusable(http_get(metrics_url, 1.0)[1], cfg, cell)


def _root_ready(ready_file: Path, metrics_url: str, dep: Deployment, cell: str) -> bool:
    """By the config running now: a root restarted after a reload changed the cells it may use waited,
    forever, for a cell it no longer uses (a stranger's report). After ``dep.down_grace_s`` of waiting, a
    cell whose leaf answers that it cannot serve no longer blocks (:func:`dlb.launch.waiting.blocking`):
    ``dlb up`` started during one cell's outage serves from the others and says so."""
    from dlb.launch.waiting import blocking, cell_reason

    if not ready_file.exists():
        return False
    now = time.monotonic()
    since = dep.root_wait_since.setdefault(cell, now)
    text = http_get(metrics_url, 1.0)[1]
    waiting, without = blocking(text, dep.cfg, cell, now - since >= dep.down_grace_s)
    if waiting:
        return False
    dep.started_without[cell] = set(without)
    for d in without:
        leaf = _fetch(dep.leaf_metrics[d]) if d in dep.leaf_metrics else None
        dep.supervisor.say(f"root {cell} service", f"starts without cell {d}, which waits for {cell_reason(text, dep.cfg, d, leaf)}; "
                                                   "the cell joins when its probes say it is usable")
    return True


def _control_plane_ready(status_url: str, xds: HostPort) -> bool:
    return http_get(f"{status_url}/status")[0] == 200 and tcp_open(xds)


def http_ok(url: str) -> bool:
    return http_get(url, 0.5)[0] == 200


def plan(cfg: Config, config_path: str, sup: Supervisor, emulate_wan: bool = False,
         leaf_args: list[str] | None = None, root_args: list[str] | None = None,
         control_plane_args: list[str] | None = None, root_services: bool = True, control_planes: int = 1,
         root_envoys: int = 1) -> Deployment:
    """Add the control plane, every leaf and every root of ``cfg`` to ``sup`` (nothing is started yet).

    ``root_services=False`` starts the root Envoys without their ext_proc service: every request then
    takes Envoy's fail-open route, the control plane's ``weighted_clusters`` (``dlb demo --compare``
    runs Rand this way: flow endpoints, weights frozen at the replica split by ``--no-probe``).
    """
    run_dir = sup.run_dir
    # No root Envoy with an ext_proc (an operator baseline, or every endpoint native): no root service to
    # start. One would only probe every leaf the control plane already probes for the native weights.
    root_services = root_services and root_has_ext_proc(cfg, native_flow=True)
    # The config's ports are not bound until their services start: an admin or metrics port drawn
    # below must not be one of them (the config may come from another process's free_port()).
    reserve_ports(hp.port for _, hp in listen_addresses(cfg, root_services))
    cp = cfg.services.control_plane
    status_url = f"http://{cp.status.host}:{cp.status.port}"
    wan = ["--emulate-wan"] if emulate_wan else []
    shared_roots = ["--root-reuse-port"] if root_envoys > 1 else []
    # Replica 1 listens where the config says; the others on free ports of the same host. Every Envoy
    # and service is given all of them (active-active: each replica probes and builds the same snapshots).
    replicas = [(cp.xds, cp.status)] + [(HostPort(cp.xds.host, free_port()), HostPort(cp.status.host, free_port()))
                                        for _ in range(control_planes - 1)]
    xds_all = [x for x, _ in replicas]
    xds_arg = ",".join(str(x) for x in xds_all)
    for k, (xds, status) in enumerate(replicas):
        name = "control-plane" if k == 0 else f"control-plane {k + 1}"
        url = f"http://{status.host}:{status.port}"
        sup.add(Child(name, "control-plane",
                      [*_python(), "serve", "control-plane", "--config", config_path, "--xds", str(xds), "--status", str(status),
                       *wan, *shared_roots, *(control_plane_args or [])],
                      run_dir / f"{name.replace(' ', '-')}.log",
                      ready=functools.partial(_control_plane_ready, url, xds),
                      waiting=functools.partial(str, f"{url}/status to answer 200 and xDS at {xds} to accept")))
    dep = Deployment(cfg=cfg, config_path=config_path, supervisor=sup, status_url=status_url, control_planes=replicas)
    for cell in cfg.cells:
        if not cell.runs_dlb_leaf:
            continue  # a cell DLB does not run (its roots probe its metrics), or an InferencePool's (its EPP answers)
        for k, leaf in enumerate(cell.leaf.all_replicas()):  # each replica: an agent and an Envoy over the same servers
            who = cell.name + (f" replica {k}" if k else "")
            file = f"leaf-{cell.name}" + (f"-{k}" if k else "")
            ready_path = run_dir / f"{file}.ready.json"
            metrics_port, admin = free_port(), free_port()
            sup.add(Child(f"leaf {who} agent", "leaves",
                          [*_python(), "serve", "leaf", "--config", config_path, "--cell", cell.name, "--replica", str(k),
                           "--xds", xds_arg, "--metrics", f"127.0.0.1:{metrics_port}", "--ready-file", str(ready_path),
                           "--envoy-admin", f"127.0.0.1:{admin}", *(leaf_args or [])],
                          run_dir / f"{file}.log", ready=functools.partial(ready_path.exists),
                          waiting=functools.partial(str, f"its probe service {leaf.probe} (ready file not written yet)"),
                          before_start=functools.partial(ready_path.unlink, missing_ok=True)))
            _envoy_child(sup, "leaf", cell.name, xds_all, leaf.address, run_dir, cfg, admin, replica=k + 1)
            dep.leaf_metrics[who] = f"http://127.0.0.1:{metrics_port}/metrics"
            dep.leaf_admin[who] = f"http://127.0.0.1:{admin}/"
    for cell in cfg.cells:
        if cell.root.address is None:
            continue  # not a source cell: no clients enter here
        ready_path = run_dir / f"root-{cell.name}.ready.json"
        metrics, admin_hp = root_ports(cfg)[cell.name]
        metrics_url = f"http://{metrics.host}:{metrics.port}/metrics"
        if root_services:
            sup.add(Child(f"root {cell.name} service", "roots",
                          [*_python(), "serve", "root", "--config", config_path, "--cell", cell.name, "--xds", xds_arg,
                           "--metrics", str(metrics), "--ready-file", str(ready_path), *wan, *(root_args or [])],
                          run_dir / f"root-{cell.name}.log",
                          ready=functools.partial(_root_ready, ready_path, metrics_url, dep, cell.name),
                          waiting=functools.partial(_root_waiting, ready_path, metrics_url, dep, cell.name),
                          before_start=functools.partial(ready_path.unlink, missing_ok=True)))
        else:
            metrics_url = ""
        admin = admin_hp.port
        for k in range(root_envoys):  # a second one shares the listener (SO_REUSEPORT): a kill loses only in-flight
            _, port = _envoy_child(sup, "root", cell.name, xds_all, cell.root.address, run_dir, cfg,
                                   admin_hp.port if k == 0 else None, replica=k + 1)
            if k:
                dep.more_root_admin.setdefault(cell.name, []).append(f"http://127.0.0.1:{port}/")
        addr = cell.root.address
        dep.roots[cell.name] = RootInfo(cell.name, f"http://{addr.host}:{addr.port}/v1", f"http://127.0.0.1:{admin}/",
                                        metrics_url, ready_path)
    return dep


class StopFlag:
    """SIGINT/SIGTERM set a flag the supervisor loop checks (the handlers do nothing else). With ``reload``,
    SIGHUP counts a reload ``dlb up`` passes on to its control planes: unhandled, it ended ``dlb up`` at
    once and the kernel SIGKILLed every child (no ordered stop) when an operator meant the control
    plane's reload."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.reloads = 0

    def install(self, reload: bool = False) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._set)
        if reload:
            signal.signal(signal.SIGHUP, self._reload)
        return self

    def _set(self, signum: int, _frame: Any) -> None:
        self.signal = signum

    def _reload(self, _signum: int, _frame: Any) -> None:
        self.reloads += 1

    def __call__(self) -> bool:
        return self.signal is not None


def default_run_dir(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def load_with_env(text: str, source: str, env: dict[str, str]) -> Config:
    """The config as the children load it: with the run's variables (tokens, the config's folder) set for
    the parse only (the children get them from their Child.env; this process's environment stays as it was)."""
    from dlb.config import parse_config

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return parse_config(text, source)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def write_snapshot(run_dir: Path, text: str) -> Path:
    """The config the children start from: the text ``dlb up`` last accepted, in the run folder.

    Why not the operator's file: a child the supervisor restarts re-reads its config, and a file whose
    edit a SIGHUP refused would crash-loop every restarted child (measured: a cell's clients got 503s
    until the file was put back). Replaced atomically, so a starting child never reads half of it."""
    path = run_dir / SNAPSHOT
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # private from the first byte
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


#: The accepted config's copy in the run folder (:func:`write_snapshot`).
SNAPSHOT = "config.yaml"


def started_processes(cfg: Config) -> dict[str, object]:
    """What :func:`plan` starts from ``cfg``, each with what it is started with: two configs that differ
    here need different processes, which ``dlb up`` starts only when it starts."""
    out: dict[str, object] = {}
    for cell in cfg.cells:
        if cell.runs_dlb_leaf:
            for k, leaf in enumerate(cell.leaf.all_replicas()):
                out[f"leaf {cell.name}" + (f" replica {k}" if k else "")] = (
                    leaf.address, leaf.bind, leaf.probe, leaf.ext_proc, leaf.access_log_address())
        if cell.root.address is not None:
            out[f"root {cell.name}"] = (cell.root.address, cell.root.bind, cell.root.ext_proc)
    out[ROOT_SERVICES] = root_has_ext_proc(cfg, native_flow=True)
    out["services.root"] = cfg.services.root
    return out


#: ``started_processes``' entry for whether the root services run, and what a change of it means.
ROOT_SERVICES = "root services"
_ROOT_SERVICES_CHANGE = {
    True: "the root services would start (an endpoint now decides on the root's ext_proc)",
    False: "the root services would stop (no root Envoy keeps an ext_proc: an operator baseline or every endpoint native)",
}


def process_changes(running: Config, new: Config) -> list[str]:
    """What ``new`` would change in the processes ``dlb up`` started from ``running``: cells whose leaf or
    root would be added, removed or bound elsewhere, the shared services' addresses, and what a control
    plane binds at start (its own listeners, TLS). A reload cannot apply these: the control planes would
    route to a leaf nobody started, or to an address nothing binds."""
    old, now = started_processes(running), started_processes(new)
    return ([f"{who} added" for who in now if who not in old] + [f"{who} removed" for who in old if who not in now]
            + [_ROOT_SERVICES_CHANGE[bool(now[who])] if who == ROOT_SERVICES else f"{who} changed"
               for who in old if who in now and old[who] != now[who]]
            + [f"{field} changed" for field in restart_only_changes(running, new)])


def reload_check(config_path: str, env: dict[str, str], running: Config) -> tuple[Config, str] | str:
    """The file a SIGHUP asks to reload, as (config, text) when it loads and changes no process ``dlb up``
    started from ``running``; otherwise what is wrong with it.

    The control planes refuse a malformed file and keep serving the running config, but say so only in
    their own logs: ``dlb up``'s console would claim a reload that never happened. The text is read once,
    so what is checked is what the snapshot then holds."""
    from dlb.config import ConfigError, read_config_text

    try:
        text = read_config_text(config_path)
        new = load_with_env(text, config_path, env)
    except ConfigError as e:
        return str(e)
    except Exception as e:  # a loader bug must refuse the reload, never reach run_up's start-up handler (stop all)
        return f"{config_path}: could not be read as a config ({type(e).__name__}: {e})"
    changes = process_changes(running, new)
    if changes:
        return (f"{config_path}: dlb up starts its processes only when it starts, so restart it to apply: "
                + "; ".join(changes))
    return new, text


def run_up(config_path: str, run_dir: Path | None, emulate_wan: bool, ready_timeout_s: float, duration_s: float | None,
           insecure: bool = False, service_args: list[str] | None = None, control_planes: int = 2,
           root_envoys: int = 2) -> int:
    """Start, wait until ready, serve until Ctrl-C or ``duration_s``. ``service_args`` go to every root and
    leaf service and the control plane (the tracing flags: the control plane puts the tracer in the Envoys)."""
    from dlb.config import ConfigError, parse_config, read_config_text
    from dlb.config.checker import CONFIG_DIR_ENV
    from dlb.envoy.root_token import forgeable_token_warning

    try:
        text = read_config_text(config_path)
        cfg = parse_config(text, config_path)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 1
    problems = listen_problems(cfg, config_path)
    if problems:
        print(f"dlb up: {len(problems)} address(es) in use or not local:\n" + "\n".join(problems), file=sys.stderr)
        return 1
    stop = StopFlag().install(reload=True)
    sup = Supervisor(run_dir or default_run_dir("up"))
    print(f"dlb up: {len(cfg.cells)} cells, logs in {sup.run_dir}", flush=True)
    token_env, said = run_env(cfg, sup.run_dir, insecure)
    for line in said:
        print(f"dlb up: {line}", flush=True)
    # The children read the snapshot; its relative paths stay the operator's file's.
    token_env = {**token_env, CONFIG_DIR_ENV: os.path.dirname(os.path.abspath(config_path))}
    cfg = load_with_env(text, config_path, token_env)
    snapshot = write_snapshot(sup.run_dir, text)
    from dlb.config.policy import unused_warmup_warning
    from dlb.config.priors import unused_prior_warning
    from dlb.config.tls_check import plaintext_warning

    for warning in (forgeable_token_warning(cfg), unused_warmup_warning(cfg), unused_prior_warning(cfg), plaintext_warning(cfg)):
        if warning:
            print(f"dlb up: warning: {warning}", file=sys.stderr, flush=True)
    dep = plan(cfg, str(snapshot), sup, emulate_wan=emulate_wan, leaf_args=service_args, root_args=service_args,
               control_planes=control_planes, root_envoys=root_envoys, control_plane_args=service_args)
    for child in sup.children:
        child.env.update(token_env)
    dep.down_grace_s = min(30.0, ready_timeout_s / 3)
    print("dlb up: listening on\n" + dep.ports_text(), flush=True)
    code = 0
    try:
        sup.start(ready_timeout_s, should_stop=stop)
        print("dlb up: ready\n" + dep.urls_text(), flush=True)
        print("Ctrl-C stops everything.", flush=True)
        end = None if duration_s is None else time.monotonic() + duration_s
        reloads = 0
        joined_at = 0.0
        while not stop() and (end is None or time.monotonic() < end):
            sup.poll()
            if any(dep.started_without.values()) and time.monotonic() - joined_at >= 2.0:
                joined_at = time.monotonic()
                dep.report_joined()
            if stop.reloads != reloads:
                reloads = stop.reloads
                checked = reload_check(config_path, token_env, cfg)
                if isinstance(checked, str):
                    print(f"dlb up: SIGHUP: not reloaded, the control planes keep the running config; {checked}", flush=True)
                    continue
                try:  # a reload that fails here (the run folder unwritable) must not stop what runs
                    write_snapshot(sup.run_dir, checked[1])  # what the control planes reload, and restarted children read
                except OSError as e:
                    print(f"dlb up: SIGHUP: not reloaded, the control planes keep the running config; cannot write the run "
                          f"copy: {e}", flush=True)
                    continue
                cfg, _ = checked
                dep.cfg = cfg  # what a restarted root's readiness is judged by
                n = sup.signal_ready("control-plane", signal.SIGHUP)
                print(f"dlb up: SIGHUP: {n} control plane(s) reload {config_path}", flush=True)
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    except Exception as e:  # start-up failure: say which child and where its log is, then stop the rest
        print(f"dlb up: {e}", file=sys.stderr, flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the ordered stop
        t0 = time.monotonic()
        sup.stop()
        print(f"dlb up: stopped in {time.monotonic() - t0:.1f}s", flush=True)
    return code
