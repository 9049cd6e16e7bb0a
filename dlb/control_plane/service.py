"""``dlb serve control-plane``: the DLB config turned into xDS snapshots, kept current.

Per cell it keeps two snapshots, keyed ``dlb-root/<cell>`` and ``dlb-leaf/<cell>`` (the node key is
``node.cluster/node.locality.zone``, which the bootstraps set), so every Envoy and DLB service of a
cell shares one snapshot and a node can read nothing of another cell's. Root snapshots hold the root
Envoy resources plus DLB's policy, topology, latency models, aversion rates and flow weights; leaf
snapshots the leaf Envoy resources plus policies (for the latency prior) and the cell's own model.

Loops:
- the *probe client* (the root's own, :mod:`dlb.probe.client`) polls every leaf;
- the *flow loop* (every ``flow.period_ms`` of the fastest flow endpoint) steps
  :class:`FlowController` and rebuilds the root snapshots, so new weights reach Envoy by RDS;
- the *state loop* (every second) republishes latency models and aversion rates, quantised so that
  noise does not produce a new version each time (the cache drops identical content).

Static resources (listeners, clusters, endpoints, policy, topology) are packed once per config; a
flow step re-packs only the route configuration and the FlowWeights resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from aiohttp import web
from envoy.config.core.v3 import base_pb2

from dlb.config import resources as dr
from dlb.config import tls_live
from dlb.config.bound_at_start import restart_only_changes
from dlb.config.discovery import dns_names, expand
from dlb.config.model import Config
from dlb.config.tls import CONTROL_PLANE, NODE_CLUSTER, node_admission
from dlb.config.tls_live import component_identity
from dlb.control_plane import envoy_resources as er
from dlb.control_plane.dns import DnsStats, Resolver, dns_families, resolve_all, resolve_names
from dlb.control_plane.flow_controller import FlowController, FlowEndpoint
from dlb.control_plane.hub_score import HubScoreLoop
from dlb.control_plane.mnlb import MnlbLoop
from dlb.control_plane.reload_stats import ReloadStats
from dlb.core.latency_model import LatencyParams
from dlb.core.native_discrete import NativeWeights
from dlb.core.router import Mechanism
from dlb.envoy.bootstrap import NATIVE_CLUSTER_PREFIX
from dlb.envoy.operator_pool import POOL_KINDS
from dlb.envoy.tracing import EnvoyTracing
from dlb.log import get_logger
from dlb.probe import replica_dns
from dlb.probe.client import ProbeClient, ProbeTiming
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2
from dlb.service.health import WATCH_PATH, HealthState, h2_health_routes, health_handler
from dlb.service.metrics import CallbackCollector
from dlb.xds.cache import SnapshotCache
from dlb.xds.server import XdsServer
from dlb.xds.snapshot import Resource, Snapshot
from dlb.xds.status import StatusRegistry, StatusServer

log = get_logger("dlb.control_plane")

ROOT_GROUP = NODE_CLUSTER["root"]  # "dlb-root"; the mTLS identity spiffe://dlb/root/<cell> maps to it
LEAF_GROUP = NODE_CLUSTER["leaf"]  # "dlb-leaf"


def dlb_node_key(node: base_pb2.Node) -> str:
    """``<node.cluster>/<node.locality.zone>``: the tier and the cell of an Envoy or DLB service; a leaf
    replica k > 0 of the cell (``locality.sub_zone`` k, ``cells[].leaf.replicas``) adds ``#k``."""
    sub = node.locality.sub_zone
    return f"{node.cluster}/{node.locality.zone}" + (f"#{sub}" if sub and sub != "0" else "")


def root_key(cell: str) -> str:
    return f"{ROOT_GROUP}/{cell}"


def leaf_key(cell: str, replica: int = 0) -> str:
    return f"{LEAF_GROUP}/{cell}" + (f"#{replica}" if replica else "")


def _q(v: float, digits: int = 3) -> float:
    """Round to ``digits`` significant digits (publishing noise-free values keeps versions stable)."""
    if v == 0 or not math.isfinite(v):
        return v
    return round(v, digits - 1 - int(math.floor(math.log10(abs(v)))))


@dataclass
class _Static:
    """Per-config packed resources."""

    root: dict[str, list[Resource]]
    leaf: dict[str, list[Resource]]
    root_sets: dict[str, er.ResourceSet]


class ControlPlane:
    """Builds and serves the snapshots; ``start``/``stop`` run the xDS server and the loops."""

    def __init__(self, config: Config, *, emulate_wan: bool = False, clock: Callable[[], float] = time.monotonic,
                 probe: bool = True, flow_loop: bool = True,
                 serve_cells: Iterable[str] | None = None, resolver: Resolver = resolve_all,
                 root_reuse_port: bool = False, tracing: EnvoyTracing | None = None, xds_transport: str = "h2") -> None:
        self.tracing = tracing  # the Envoys' OpenTelemetry tracer (dlb.envoy.tracing); None: off
        self.cache = SnapshotCache(node_key=dlb_node_key)
        # mTLS (the config's ``tls``): clients need a certificate from the CA, and the (role, cell) it
        # names is the only snapshot its streams may read. Fixed at start: a reload cannot turn it off.
        self.tls = component_identity(config.tls, CONTROL_PLANE, source=config.source)
        # xDS on DLB's HTTP/2 transport (``h2``) or grpc.aio (``grpc``); see dlb.xds.server.
        on_grpc = xds_transport == "grpc"
        self.server = XdsServer(self.cache, admission=node_admission(dlb_node_key) if self.tls is not None else None,
                                credentials=self.tls.server_credentials() if self.tls is not None and on_grpc else None,
                                ssl_context=self.tls.server_ssl_context() if self.tls is not None and not on_grpc else None,
                                transport=xds_transport, status=StatusRegistry(served_types=dr.SERVED_TYPES))
        self.health = HealthState()
        self.clock = clock
        self.emulate_wan = emulate_wan
        self.probe_enabled = probe
        #: Root listeners with SO_REUSEPORT: several root Envoys of a cell on one host share its address, so
        #: killing one loses only its in-flight requests (``dlb up --root-envoys``; pods have their own IPs).
        self.root_reuse_port = root_reuse_port
        self.flow_loop_enabled = flow_loop  # off: snapshots change only on rebuild()/reload() calls
        #: ``--serve-cells``: snapshots and flow loops for these cells only (None = every cell). One
        #: control plane per Kubernetes cluster serves its own cells, so a WAN partition never cuts a
        #: region off from xDS; it still probes every leaf, since its roots' costs need them all.
        self.serve_cells = frozenset(serve_cells) if serve_cells is not None else None
        if self.serve_cells is not None:
            unknown = sorted(self.serve_cells - set(config.cell_names))
            if unknown:
                raise ValueError(f"serve cells {unknown} are not in {config.source} (cells: {', '.join(config.cell_names)})")
        #: Server discovery: DNS name → its addresses at the last resolution (``discovery.dns_period_s``).
        self.resolver = resolver
        self.resolved: dict[str, tuple[str, ...]] = {}
        #: ``leaf.replicas: dns``: probe name → the leaf pods' addresses at the last resolution, each probed.
        self.probe_resolved: dict[str, tuple[str, ...]] = {}
        self.dns_stats = DnsStats()
        self.push_log: list[tuple[float, str, str]] = []  # (monotonic time, key, version) of the last pushes
        self._tasks: list[asyncio.Task] = []
        self._flow_wake = asyncio.Event()  # set by reload(): the flow loop takes a new period at once
        #: The native-discrete weights last pushed: endpoint → source cell index → per-cell weights.
        self.native_pushed: dict[str, dict[int, NativeWeights]] = {}
        self._probes: ProbeClient | None = None
        #: Ready (``/readyz``) = a config is loaded (the constructor's, or it raised) and xDS is listening.
        self.xds_listening = False
        self.status_server = StatusServer(self.server.status, lambda: len(self.cache.keys()),
                                          extra_routes=[web.get("/fleet", self._fleet)], ready=lambda: self.xds_listening)
        self.status_server.registry.register(CallbackCollector(lambda: dns_families(self.dns_stats)))
        self.status_server.registry.register(CallbackCollector(lambda: self.server.transport_families("dlb_xds")))
        if self.tls is not None:
            self.status_server.registry.register(CallbackCollector(lambda: tls_live.COUNTS.families("dlb_xds")))
        #: Reloads by outcome, and what the running config is: an operator alerts on a refused or
        #: half-applied reload, and compares replicas' digests (a stranger found neither in /metrics).
        self.reloads = ReloadStats()
        self.status_server.registry.register(CallbackCollector(self.reloads.families))
        self.flow: FlowController | None = None
        self._load(config)
        self.reloads.loaded(config)

    # -- config -------------------------------------------------------------------------------------
    def serves(self, cell: str) -> bool:
        """Whether this instance builds snapshots for ``cell`` (``--serve-cells``)."""
        return self.serve_cells is None or cell in self.serve_cells

    def _load(self, config: Config) -> None:
        if self.serve_cells is not None and not self.serve_cells & set(config.cell_names):
            log.warning("serve_cells_not_in_config", serve_cells=sorted(self.serve_cells), source=config.source)
        #: The config as loaded; ``config`` is it with server names expanded to their addresses.
        self.base_config = config
        config = expand(config, self.resolved)
        self.config = config
        topo = config.topology()
        # Flow endpoints, and native-discrete ones (their routers' costs become the root Envoys' EDS weights).
        flow_eps = [FlowEndpoint(ep.name, ep.policy.to_core(config.probe), ep.latency_prior.to_core(), ep.cell_priors(), ep.policy.native,
                                 ep.policy.native_pick)
                    for ep in config.endpoints if ep.policy.mechanism is Mechanism.FLOW or ep.policy.native]
        # Root snapshots (and flow routers) exist for cells where root Envoys run: those with a root address.
        self.sources = [c.index for c in config.cells if c.root.address is not None and self.serves(c.name)]
        prev_flow = self.flow
        self.flow = FlowController(topo, flow_eps, self.sources) if flow_eps else None
        if self.flow is not None and prev_flow is not None:
            self.flow.carry_over(prev_flow)  # a reload keeps what the loop learned (splits, probes, memory)
        #: MNLB baseline (the ``mnlb`` policy plugin): every endpoint's fail-open weights come from the central
        #: LP (:mod:`dlb.control_plane.mnlb`) instead of the flow routers; for comparisons, not production.
        #: Rand (the ``rand`` plugin) is MNLB's starting split, never solved: the replica split, fixed.
        self.mnlb_enabled = config.policy.weights in ("mnlb", "rand")
        self.weights_frozen = config.policy.weights == "rand"
        mp = config.policy.mnlb
        mnlb_eps = [ep.name for ep in flow_eps if not ep.native]
        self.mnlb = (MnlbLoop(topo, mnlb_eps, self.sources, period_s=mp.period_s, rho=mp.rho)
                     if self.mnlb_enabled and mnlb_eps else None)
        #: hub-score (an operator baseline): every endpoint's fail-open route all on the best-scored cell,
        #: re-pushed when a probe changes it (:mod:`dlb.control_plane.hub_score`). lr-global and
        #: locality-failover need no state here: their root resources route to a pool cluster.
        self.hub = (HubScoreLoop(topo, [ep.name for ep in config.endpoints], self.sources)
                    if config.policy.weights == "hub-score" else None)
        self.flow_period_s = min((ep.policy.flow.period_s for ep in flow_eps), default=0.2)
        #: Each cell's prior (the first endpoint's, as the leaves' cell-wide model uses): the leaves' fleet prior
        #: and the roots' curve for a cell with no model yet.
        self.priors = {c: config.endpoints[0].prior_for(c).to_core() for c in config.cell_names}
        self.models: dict[str, tuple[LatencyParams, float, int]] = {}
        #: Each cell's last probe as ``/fleet`` shows it when no flow endpoint keeps probe state (the flow
        #: controller's is shown when there is one): an operator saw only nulls for a discrete-only config.
        self.last_probe: dict[str, dict[str, float | bool]] = {}
        self._static = self._pack_static(config)
        versions = self.rebuild()
        for key in set(self.cache.keys()) - set(versions):
            # A cell left the config: its Envoys keep their last config (xDS has no "go away"), but
            # nothing new is served to it and a reconnecting node of that cell gets nothing.
            self.cache.clear_snapshot(key)

    def reload(self, config: Config) -> None:
        """Swap in a new (already validated) config; snapshots follow, unchanged resources keep versions."""
        log.info("config_reloaded", source=config.source, cells=len(config.cells), endpoints=len(config.endpoints))
        stale = restart_only_changes(self.base_config, config)
        self.reloads.count["needs_restart" if stale else "applied"] += 1
        if stale:
            # Bound at start: say so, or an operator who moved a port reads "reloaded" and finds nothing there.
            log.warning("config_reload_needs_restart", source=config.source, fields=stale)
        restart_probes = self._probes is not None
        self._load(config)
        self._flow_wake.set()  # the loop may sleep on the old period: take the new one now
        if restart_probes:
            self._tasks.append(asyncio.ensure_future(self._restart_probes()))
        self.reloads.loaded(config)

    def _pack_static(self, config: Config) -> _Static:
        common = [Resource.from_message(m, name=n, type_url=t) for t, items in dr.config_resources(config).items() for n, m in items]
        root, leaf, root_sets = {}, {}, {}
        for cell in config.cells:
            if not self.serves(cell.name):
                continue
            if cell.root.address is not None:
                rs = er.root_resources(config, cell.name, reuse_port=self.root_reuse_port, tracing=self.tracing)
                root_sets[cell.name] = rs
                # Native-discrete clusters' endpoints change with every weight refresh: rebuild() adds them.
                static_eps = [m for m in rs.endpoints if not m.cluster_name.startswith(NATIVE_CLUSTER_PREFIX)]
                root[cell.name] = common + [Resource.from_message(m) for m in (*rs.listeners, *rs.clusters, *static_eps)]
            if not cell.runs_dlb_leaf:
                continue  # no leaf Envoy or agent of ours there
            for k in range(len(cell.leaf.all_replicas())):  # each replica's Envoy: its own listener, agent and access log
                ls = er.leaf_resources(config.leaf_replica(cell.name, k), cell.name, emulate_wan=self.emulate_wan, tracing=self.tracing)
                rs_k = common + [Resource.from_message(m) for m in (*ls.listeners, *ls.clusters, *ls.endpoints, *ls.routes)]
                rs_k.append(Resource.from_message(dr.dp_groups(config, cell.name), name=cell.name, type_url=dr.DP_GROUPS))
                rs_k.append(Resource.from_message(dr.leaf_policy(config), name=cell.name, type_url=dr.LEAF_POLICY))
                leaf[leaf_key(cell.name, k)] = rs_k
        return _Static(root, leaf, root_sets)

    async def refresh_dns(self) -> bool:
        """Resolve the config's server names once; on a change push the new endpoints. True if changed.

        Only the packed resources are rebuilt when the replica counts stay the same (flow state is kept);
        a cell whose unset ``replicas`` follows its server count changes the topology, so then the whole
        config is loaded again, as a reload would.
        """
        names = dns_names(self.base_config)
        resolved = await resolve_names(names, self.resolver, self.resolved, self.dns_stats) if names else {}
        if resolved == self.resolved:
            return False
        self.resolved = resolved
        new = expand(self.base_config, resolved)
        log.info("servers_discovered", servers={c.name: [str(s.address) for s in c.servers] for c in new.cells})
        if [c.replicas for c in new.cells] != [c.replicas for c in self.config.cells]:
            self._load(self.base_config)
        else:
            self.config = new
            self._static = self._pack_static(new)
            self.rebuild()
        return True

    async def _dns_loop(self) -> None:
        while True:
            try:
                await self.refresh_dns()
                await self._refresh_replica_dns()
            except Exception:  # a bad resolution must not stop the control plane; the last endpoints stay
                log.exception("dns_refresh_failed")
            await asyncio.sleep(self.config.discovery.dns_period_s)

    # -- snapshots ----------------------------------------------------------------------------------
    def _state_resources(self) -> list[Resource]:
        out = []
        names = self.config.cell_names
        aversion = self.flow.aversion if self.flow is not None else np.zeros(len(names))
        for i, name in enumerate(names):
            model, conf, _samples = self.models.get(name, (self.priors[name], 0.0, 0))
            q = LatencyParams(_q(model.a), _q(model.b), _q(model.c), _q(model.s))
            msg = dr.cell_latency_model(name, q, self.priors[name], round(conf, 2), 0, 0)
            out.append(Resource.from_message(msg, name=name, type_url=dr.CELL_LATENCY_MODEL))
            err = self.flow.cells[i].error_rate if self.flow is not None else 0.0
            out.append(Resource.from_message(dr.cell_aversion(name, round(err, 2), round(float(aversion[i]), 2)),
                                             name=name, type_url=dr.CELL_AVERSION))
        return out

    def rebuild(self) -> dict[str, str]:
        """Install every cell's snapshots from the current state; returns key → version in effect."""
        cfg = self.config
        weights: Mapping[str, Mapping[int, np.ndarray]]
        if self.hub is not None:
            weights = self.hub.weights()
        elif cfg.policy.weights in POOL_KINDS:
            weights = {}  # the routes name the pool cluster; Envoy balances
        else:
            weights = self.mnlb.weights() if self.mnlb is not None else self.flow.weights() if self.flow is not None else {}
        native = self.flow.native_weights(self.clock()) if self.flow is not None else {}
        self.native_pushed = native  # /fleet shows them: nothing else outside the root Envoys' admin did
        state = self._state_resources()
        versions = {}
        for cell in cfg.cells:
            if not self.serves(cell.name):
                continue
            for k in range(len(cell.leaf.all_replicas()) if cell.runs_dlb_leaf else 0):  # a cell without a DLB leaf has none to configure
                key = leaf_key(cell.name, k)
                versions[key] = self._set(key, list(self._static.leaf[key]) + state)
            if cell.name not in self._static.root_sets:
                continue
            per_ep = {ep: x[cell.index] for ep, x in weights.items() if cell.index in x}
            rs = self._static.root_sets[cell.name]
            if per_ep:
                routes = tuple(type(r).FromString(r.SerializeToString()) for r in rs.routes)
                patched = er.ResourceSet(rs.listeners, routes, rs.clusters, rs.endpoints)
                er.set_flow_weights(patched, cfg, cell.name, per_ep, require_flow=self.hub is None)
            else:
                patched = rs
            items: list = list(self._static.root[cell.name])
            items += [Resource.from_message(r) for r in patched.routes]
            items += [Resource.from_message(m) for m in self._native_endpoints(rs, cell.index, native)]
            items += [Resource.from_message(dr.flow_weights(ep, cell.name, cfg.cell_names, x), name=dr.flow_weights_name(ep, cell.name),
                                            type_url=dr.FLOW_WEIGHTS) for ep, x in per_ep.items()]
            items += state
            versions[root_key(cell.name)] = self._set(root_key(cell.name), items)
        return versions

    def _native_endpoints(self, rs: er.ResourceSet, src: int, native: dict[str, dict[int, NativeWeights]]) -> list:
        """The native-discrete clusters' ClusterLoadAssignments of one root, with this refresh's weights."""
        out = []
        for cla in rs.endpoints:
            if not cla.cluster_name.startswith(NATIVE_CLUSTER_PREFIX):
                continue
            w = native.get(cla.cluster_name.removeprefix(NATIVE_CLUSTER_PREFIX), {}).get(src)
            out.append(er.native_assignment(cla, self.config, src, w) if w is not None else cla)
        return out

    def _set(self, key: str, items: Iterable) -> str:
        before = self.cache.get_snapshot(key)
        version = self.cache.set_snapshot(key, Snapshot.build(items))
        if before is None or before.version != version:
            self.push_log.append((time.monotonic(), key, version))
            del self.push_log[:-256]
        return version

    # -- probes -------------------------------------------------------------------------------------
    def _on_probe(self, target: ProbeTarget, resp: probe_pb2.ProbeResponse | None, now: float) -> None:
        # A leaf that reports 0 healthy servers answers, but its cell cannot serve.
        serving = resp is not None and not (resp.HasField("healthy_replicas") and resp.healthy_replicas == 0)
        self.last_probe[target.name] = ({"available": serving} if resp is None else
                                        {"available": serving, "rif": resp.rif, "error_rate": resp.error_rate})
        if self.hub is not None:
            healthy = float(resp.healthy_replicas) if resp is not None and resp.HasField("healthy_replicas") else None
            changed = (self.hub.on_probe_failure(target.index) if resp is None
                       else self.hub.on_probe(target.index, resp.rif, resp.waiting, resp.kv_usage, healthy))
            if changed:
                self.rebuild()  # as fresh as the probes: Envoy gets the new best cell now, not at the next flow step
        if self.mnlb is not None:
            if resp is None:
                self.mnlb.on_probe_failure(target.index)
            else:
                model = self._remember_model(target.name, resp) if resp.HasField("model") else None
                healthy = (resp.healthy_replicas / resp.replicas if resp.HasField("healthy_replicas") and resp.replicas
                           else 1.0)
                self.mnlb.on_probe(target.index, resp.completed_by_source, model, healthy)
        if self.flow is None:
            if resp is not None and resp.HasField("model"):
                self._remember_model(target.name, resp)
            return
        if resp is None or not serving:
            # The flow weights (and the fail-open routes Envoy applies natively) must move off it now.
            self.flow.on_probe_failure(target.index)
            return
        model = None
        if resp.HasField("model"):
            model = self._remember_model(target.name, resp)
        self.flow.on_probe(target.index, now, resp.rif, float(resp.healthy_replicas) if resp.HasField("healthy_replicas") else None, model,
                           resp.model.confidence if resp.HasField("model") else 0.0, resp.model.samples,
                           resp.error_rate, float(resp.completed), resp.errors)

    def _remember_model(self, cell: str, resp: probe_pb2.ProbeResponse) -> LatencyParams | None:
        try:
            p = dr.model_from_pb(resp.model, f"probe of {cell}")
        except dr.ResourceError as e:
            log.warning("probe_model_invalid", cell=cell, error=str(e))
            return None
        self.models[cell] = (p, resp.model.confidence, resp.model.samples)
        return p

    async def _refresh_replica_dns(self) -> None:
        """Re-resolve the probe names of ``leaf.replicas: dns`` cells; probe the new set of pods if it changed."""
        targets = self._probe_targets()
        if not any(t.resolve for t in targets):
            return
        resolved = await replica_dns.resolve_targets(targets, self.resolver, self.probe_resolved)
        if resolved != self.probe_resolved:
            self.probe_resolved = resolved
            if self._probes is not None:
                await self._restart_probes()

    def _probe_targets(self) -> list[ProbeTarget]:
        """Every leaf replica of every cell (a ``dns`` one by name until resolved)."""
        return [ProbeTarget(c.index, c.name, str(leaf.probe), source=c.leaf.source, scrape=c.scrape_addresses(), replica=k,
                            resolve=c.leaf.replicas_dns)
                for c in self.config.cells for k, leaf in enumerate(c.leaf.all_replicas())]

    async def _restart_probes(self) -> None:
        if self._probes is not None:
            await self._probes.stop()
        self._start_probes()

    def _start_probes(self) -> None:
        p = self.config.probe
        self._probes = ProbeClient(
            targets=replica_dns.expand(self._probe_targets(), self.probe_resolved),
            on_result=self._on_probe,
            timing=ProbeTiming(period_s=max(p.period_ms / 1000.0, 0.05), timeout_s=p.timeout_ms / 1000.0,
                               backoff_max_s=p.backoff_max_ms / 1000.0),
            source_cell="control-plane",
            clock=self.clock,
            credentials=self.tls.channel_credentials() if self.tls is not None else None,
            renewal=self.tls.renewal if self.tls is not None else None,
            prior_of=lambda cell: self.config.endpoints[0].prior_for(cell).to_core(),
        )
        self._probes.start()

    # -- loops --------------------------------------------------------------------------------------
    async def _flow_loop(self) -> None:
        while True:
            # Woken by a reload: it slept on the period it read, so a reload from 10 min back to 200 ms left
            # the weights frozen until then (a stranger's native root kept a dead cell at weight 1000).
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returned the wake when a stop's cancel
            # came in the same turn (a SIGTERM just after a SIGHUP), and the control plane never exited.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flow_period_s):
                    await self._flow_wake.wait()
            self._flow_wake.clear()
            try:
                if self.hub is not None:
                    pass  # hub-score pushes from the probes (_on_probe); nothing to step
                elif self.mnlb is not None:
                    if not self.weights_frozen:
                        self.mnlb.step(self.clock())
                elif self.flow is not None:
                    self.flow.step(self.clock())
                self.rebuild()
            except Exception:  # a bad step must not stop the control plane; the last snapshots stay
                log.exception("flow_step_failed")

    async def _fleet(self, _req: web.Request) -> web.Response:
        out: dict = {"cells": {}, "flow_weights": {}}
        for i, name in enumerate(self.config.cell_names):
            st = self.flow.cells[i] if self.flow is not None else None
            seen = self.last_probe.get(name, {})
            model = self.models.get(name)
            out["cells"][name] = {
                "available": st.available if st else seen.get("available"), "rif": st.rif if st else seen.get("rif"),
                "error_rate": st.error_rate if st else seen.get("error_rate"),
                "aversion": float(self.flow.aversion[i]) if self.flow is not None else 0.0,
                "model": None if model is None else {"a_s": model[0].a, "b_s": model[0].b, "c": model[0].c, "s": model[0].s,
                                                      "confidence": model[1], "samples": model[2]},
            }
        if self.mnlb is not None:
            out["mnlb"] = {"demand_rps": dict(zip(self.config.cell_names, self.mnlb.demand.tolist(), strict=True)),
                           "capacity_rps": dict(zip(self.config.cell_names, self.mnlb.capacity.tolist(), strict=True)),
                           "solves": self.mnlb.solves}
        if self.flow is not None:
            for ep, per_src in (self.mnlb.weights() if self.mnlb is not None else self.flow.weights()).items():
                out["flow_weights"][ep] = {self.config.cell_names[s]: dict(zip(self.config.cell_names, map(float, x), strict=True))
                                           for s, x in per_src.items()}
            out["throughput_rps"] = self.flow.throughput
        names = self.config.cell_names
        out["native_weights"] = {ep: {names[src]: {names[j]: {"weight": w, "healthy": h}
                                                   for j, (w, h) in enumerate(zip(nw.weights, nw.healthy, strict=True)) if w}
                                      for src, nw in per_src.items()}
                                 for ep, per_src in self.native_pushed.items()}
        return web.json_response(out)

    async def start(self, xds_address: str | None = None, status_address: str | None = None) -> tuple[int, int]:
        """Serve xDS and the status endpoint; start probing and the flow loop. Returns (xds, status) ports."""
        cp = self.config.services.control_plane
        # grpc.health.v1 next to xDS: Envoys and orchestrators can check the control plane like any DLB service.
        xds_port = await self.server.start(xds_address or str(cp.xds), extra_handlers=[health_handler(self.health)],
                                           extra_routes=h2_health_routes(self.health))
        self.health.listeners.append(lambda reply: self.server.notify(WATCH_PATH, reply))
        self.xds_listening = True
        host, _, port = (status_address or str(cp.status)).rpartition(":")
        status_port = await self.status_server.start(host.strip("[]"), int(port))
        if self.probe_enabled:
            self._start_probes()
        if self.flow_loop_enabled:
            self._tasks.append(asyncio.create_task(self._flow_loop(), name="flow-loop"))
        self._tasks.append(asyncio.create_task(self._dns_loop(), name="dns-discovery"))
        log.info("control_plane_started", xds_port=xds_port, status_port=status_port, cells=len(self.config.cells),
                 flow_endpoints=[ep.name for ep in (self.flow.endpoints if self.flow else [])])
        return xds_port, status_port

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        self.xds_listening = False
        if self._probes is not None:
            await self._probes.stop()
            self._probes = None
        await self.status_server.stop()
        await self.server.stop()
