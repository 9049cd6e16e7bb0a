"""Root service configured over xDS: subscribe to the control plane's DLB resources, hot-reload.

``dlb serve root --xds HOST:PORT --cell C`` needs no config file. The service subscribes (ADS, as node
``cluster=dlb-root``, ``locality.zone=C``, i.e. the control plane's ``dlb-root/C`` snapshot) to:

- ``dlb.v1.Topology`` and ``dlb.v1.RoutingPolicy`` → :meth:`RootService.configure` (routers rebuilt,
  probe state carried over) and the probe client re-targeted when the leaves change;
- ``dlb.v1.CellLatencyModel`` → the curve used for a cell whose leaf has no confident model yet;
- ``dlb.v1.FlowWeights`` → the starting vector of a flow router created by a reload.

A resource that cannot be applied (unknown cost, this root's cell missing from the topology, a
latency prior outside the model's domain…) raises, which the xDS client turns into a NACK carrying
the reason: the service keeps routing with its last good configuration. Until the first good
configuration arrives, the service answers "continue" and Envoy routes by its fail-open weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence

import numpy as np
from envoy.config.core.v3 import base_pb2
from google.protobuf.message import Message

from dlb.config import resources as dr
from dlb.config.model import LEAF_SOURCES, Config
from dlb.config.tls import TlsIdentity
from dlb.core.router import Mechanism
from dlb.core.topology import Topology
from dlb.ext_proc.root import EndpointSpec, RootService
from dlb.log import get_logger
from dlb.probe import replica_dns
from dlb.probe.client import ProbeClient, ProbeTiming
from dlb.probe.replica_dns import Resolver, resolve_all
from dlb.probe.target import CellProbe, ProbeTarget
from dlb.proto import resources_pb2 as pb
from dlb.xds.client import ResourceValidationError, XdsClient

log = get_logger("dlb.root.xds")


def probe_targets(topology: Topology, cell: str, probes: Sequence[CellProbe], emulate_wan: bool) -> list[ProbeTarget]:
    """The cells a root in ``cell`` probes: its allowed destinations (with the testbed's WAN delay)."""
    src = topology.index(cell)
    return [ProbeTarget(j, topology.names[j], address, float(topology.tau[src, j]) if emulate_wan else 0.0,
                        source=probes[j].source, scrape=probes[j].scrape, replica=k, resolve=probes[j].resolve)
            for j in topology.out_neighbors(src) for k, address in enumerate((probes[j].address, *probes[j].replicas))]


def config_probes(cfg: Config) -> list[CellProbe]:
    """How each cell of ``cfg`` is probed, in cell order."""
    return [CellProbe(str(c.leaf.probe), c.leaf.source, c.scrape_addresses(), tuple(str(r.probe) for r in c.leaf.replicas),
                      c.leaf.replicas_dns) for c in cfg.cells]


class ProbeManager:
    """Owns the service's probe client and replaces it when the set of targets changes (a config, or the
    addresses of a ``leaf.replicas: dns`` name, re-resolved every :data:`~dlb.probe.replica_dns.PERIOD_S`)."""

    def __init__(self, service: RootService, timing: ProbeTiming, source_cell: str, tls: TlsIdentity | None = None,
                 resolver: Resolver = resolve_all, dns_period_s: float = replica_dns.PERIOD_S) -> None:
        self.service = service
        self.tls = tls
        self.timing = timing
        self.source_cell = source_cell
        self.targets: list[ProbeTarget] = []  # as probed (replica names expanded)
        self.wanted: list[ProbeTarget] = []  # as configured
        self.resolver = resolver
        self.dns_period_s = dns_period_s
        self.resolved: dict[str, tuple[str, ...]] = {}
        self._dns_task: asyncio.Task | None = None

    async def retarget(self, targets: list[ProbeTarget]) -> None:
        self.wanted = targets
        if any(t.resolve for t in targets):
            self.resolved = await replica_dns.resolve_targets(targets, self.resolver, self.resolved)
            if self._dns_task is None:
                self._dns_task = asyncio.create_task(self._dns_loop(), name="replica-dns")
        await self._use(replica_dns.expand(targets, self.resolved))

    async def _dns_loop(self) -> None:
        while True:
            await asyncio.sleep(self.dns_period_s)
            try:
                self.resolved = await replica_dns.resolve_targets(self.wanted, self.resolver, self.resolved)
                await self._use(replica_dns.expand(self.wanted, self.resolved))
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad resolution stop the loop
                log.exception("replica_dns_loop_error")

    async def _use(self, targets: list[ProbeTarget]) -> None:
        if targets == self.targets and self.service.probe_client is not None:
            return
        old = self.service.probe_client
        if old is not None:
            await old.stop()
        client = ProbeClient(targets, self.service.on_probe, self.timing, source_cell=self.source_cell,
                             credentials=self.tls.channel_credentials() if self.tls is not None else None,
                             renewal=self.tls.renewal if self.tls is not None else None, prior_of=self.service.cell_prior)
        self.service.probe_client = client
        self.targets = targets
        client.start()
        log.info("probe_targets", cell=self.source_cell, targets=[f"{t.name}@{t.address}" for t in targets])

    async def stop(self) -> None:
        if self._dns_task is not None:
            self._dns_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dns_task
            self._dns_task = None
        if self.service.probe_client is not None:
            await self.service.probe_client.stop()


def specs_from_policies(resources: Mapping[str, Message]) -> list[EndpointSpec]:
    """Endpoint specs in a stable order: longest prefix first, so the most specific endpoint matches."""
    specs = []
    for name, msg in resources.items():
        policy, prior, cell_priors = dr.policy_from_pb(msg)
        if name != msg.endpoint:
            raise dr.ResourceError(f"RoutingPolicy resource {name!r} carries endpoint {msg.endpoint!r}")
        specs.append(EndpointSpec(msg.endpoint, msg.path_prefix, policy, prior, cell_priors))
    return sorted(specs, key=lambda s: (-len(s.prefix), s.name))


class RootXdsSync:
    """Keeps a :class:`RootService` in step with the control plane's resources."""

    def __init__(self, service: RootService, target: str, cell: str, probes: ProbeManager, *, emulate_wan: bool = False,
                 delta: bool = False, node_id: str | None = None) -> None:
        self.service = service
        tls = probes.tls  # one identity per root: the one it probes leaves with
        self.cell = cell
        self.probes = probes
        self.emulate_wan = emulate_wan
        node = base_pb2.Node(id=node_id or f"root-service-{cell}-{os.getpid()}", cluster="dlb-root",
                             locality=base_pb2.Locality(zone=cell))
        self.client = XdsClient(target, node, delta=delta, credentials=tls.channel_credentials() if tls is not None else None,
                                renewed=tls.renewal() if tls is not None else None)
        self.topology: pb.Topology | None = None
        self.specs: list[EndpointSpec] | None = None
        self.weights: dict[str, pb.FlowWeights] = {}
        self.reloads = 0
        self.client.subscribe(dr.TOPOLOGY, pb.Topology, self._on_topology)
        self.client.subscribe(dr.ROUTING_POLICY, pb.RoutingPolicy, self._on_policies)
        self.client.subscribe(dr.CELL_LATENCY_MODEL, pb.CellLatencyModel, self._on_models)
        self.client.subscribe(dr.FLOW_WEIGHTS, pb.FlowWeights, self._on_weights)

    async def start(self) -> RootXdsSync:
        await self.client.start()
        return self

    async def stop(self) -> None:
        await self.client.stop()

    # -- callbacks (raise = NACK) -----------------------------------------------------------------
    async def _on_topology(self, resources: dict[str, Message]) -> None:
        msg = resources.get(dr.TOPOLOGY_NAME)
        if msg is None:
            raise ResourceValidationError(f"no {dr.TOPOLOGY_NAME!r} resource")
        await self._apply(msg, self.specs)

    async def _on_policies(self, resources: dict[str, Message]) -> None:
        try:
            specs = specs_from_policies(resources)
        except dr.ResourceError as e:
            raise ResourceValidationError(str(e)) from e
        await self._apply(self.topology, specs)

    def _on_weights(self, resources: dict[str, Message]) -> None:
        self.weights = {m.endpoint: m for m in resources.values() if m.source_cell == self.cell}
        # A flow router that has heard no probe yet routes by x (warm start): give it these weights,
        # which may arrive after the topology and policies that built it.
        names = self.service.cell_names
        for ep in self.service.endpoints:
            m = self.weights.get(ep.name)
            if m is None or ep.router.probed or ep.router.policy.mechanism is not Mechanism.FLOW:
                continue
            try:
                x = np.where(ep.router.allowed, dr.weights_from_pb(m, names), 0.0)
            except dr.ResourceError:
                continue  # weights of another topology: keep the replica split
            if x.sum() > 0:
                ep.router.x = x / x.sum()

    def _on_models(self, resources: dict[str, Message]) -> None:
        """Use the control plane's model for cells this root has no confident model of."""
        names = self.service.cell_names
        for name, msg in resources.items():
            if name not in names:
                continue
            try:
                p = dr.model_from_pb(msg.model, f"CellLatencyModel {name}")
            except dr.ResourceError as e:
                raise ResourceValidationError(str(e)) from e
            j = names.index(name)
            for ep in self.service.endpoints:
                r = ep.router
                if r.view.confidence[j] < msg.model.confidence:
                    r.set_model(j, p)

    async def _apply(self, topo_msg: pb.Topology | None, specs: list[EndpointSpec] | None) -> None:
        if topo_msg is None or specs is None:
            # Remember what arrived; configure once both halves are here.
            if topo_msg is not None:
                self._check_topology(topo_msg)
                self.topology = topo_msg
            if specs is not None:
                self.specs = specs
            return
        topology = self._check_topology(topo_msg)
        initial = {}
        for ep, m in self.weights.items():
            try:
                initial[ep] = dr.weights_from_pb(m, topology.names)
            except dr.ResourceError:
                continue  # weights of an older topology: routers start from Rand's split
        try:
            self.service.configure(topology, specs, initial)
        except ValueError as e:
            raise ResourceValidationError(f"cannot apply configuration: {e}") from e
        self.topology, self.specs = topo_msg, specs
        self.reloads += 1
        probes = [CellProbe(c.probe_address, c.probe_source or "dlb", tuple(c.scrape_addresses), tuple(c.replica_probe_addresses),
                            c.replicas_dns) for c in topo_msg.cells]
        await self.probes.retarget(probe_targets(topology, self.cell, probes, self.emulate_wan))
        log.info("root_reconfigured", cell=self.cell, reload=self.reloads, cells=list(topology.names),
                 endpoints=[s.name for s in specs])

    def _check_topology(self, msg: pb.Topology) -> Topology:
        try:
            topology = dr.topology_from_pb(msg)
        except dr.ResourceError as e:
            raise ResourceValidationError(str(e)) from e
        if self.cell not in topology.names:
            raise ResourceValidationError(f"this root's cell {self.cell!r} is not in the topology {list(topology.names)}")
        bad = [c.name for c in msg.cells if not c.probe_address]
        if bad:
            raise ResourceValidationError(f"cells without a probe address: {bad}")
        bad = [c.name for c in msg.cells if c.probe_source not in ("", "dlb") and (c.probe_source not in LEAF_SOURCES or not c.scrape_addresses)]
        if bad:
            raise ResourceValidationError(f"cells with an unknown probe source or nothing to scrape: {bad}")
        return topology

