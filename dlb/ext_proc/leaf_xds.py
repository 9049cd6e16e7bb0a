"""Leaf agent following the control plane: server set from EDS, fleet prior from DLB resources.

``dlb serve leaf --config F --cell C --xds HOST:PORT`` subscribes (as node ``cluster=dlb-leaf``,
``locality.zone=C``, i.e. the ``dlb-leaf/C`` snapshot) to:

- Envoy's own ``ClusterLoadAssignment`` for the ``servers`` cluster — the same endpoints the leaf
  Envoy load-balances over, so the agent's server picks and scrapes always cover the same servers;
- ``dlb.v1.CellLatencyModel`` of its cell — its ``fleet_prior`` is what the latency fit shrinks toward;
- ``dlb.v1.DpGroups`` of its cell — its data-parallel servers (ranks, rank policy, horizon, decode
  model, slots), applied as the config file's ``servers[].dp_ranks`` etc. would be.

The config file still gives the agent its own addresses. An update that cannot be applied (no
endpoints, duplicate addresses, a prior outside the model's domain) is NACKed and the agent keeps
its last good state; in-flight requests are never dropped (their records follow their server).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf.message import Message

from dlb.config import resources as dr
from dlb.config.model import LeafPolicy
from dlb.config.tls import TlsIdentity
from dlb.envoy.contract import LEAF_SERVERS_CLUSTER
from dlb.ext_proc.leaf_setup import dp_balancer, rank_addresses
from dlb.ext_proc.leaf_state import LeafState
from dlb.log import get_logger
from dlb.proto import resources_pb2 as pb
from dlb.xds import types
from dlb.xds.client import ResourceValidationError, XdsClient

log = get_logger("dlb.leaf.xds")


def servers_from_cla(cla: endpoint_pb2.ClusterLoadAssignment) -> list[tuple[str, float]]:
    out = []
    for loc in cla.endpoints:
        for lb in loc.lb_endpoints:
            sa = lb.endpoint.address.socket_address
            if not sa.address or not sa.port_value:
                raise ResourceValidationError(f"{cla.cluster_name}: an endpoint without an address and port")
            weight = lb.load_balancing_weight.value if lb.HasField("load_balancing_weight") else 1
            host = f"[{sa.address}]" if ":" in sa.address else sa.address
            out.append((f"{host}:{sa.port_value}", float(weight)))
    return out


class LeafXdsSync:
    def __init__(self, state: LeafState, target: str, cell: str, *, delta: bool = False, node_id: str | None = None,
                 tls: TlsIdentity | None = None, on_policy: Callable[[LeafPolicy], None] | None = None) -> None:
        self.state = state
        self.cell = cell
        #: Told every accepted leaf policy, for what lives outside the state (the background probes' settings).
        self.on_policy = on_policy
        node = base_pb2.Node(id=node_id or f"leaf-service-{cell}-{os.getpid()}", cluster="dlb-leaf",
                             locality=base_pb2.Locality(zone=cell))
        self.client = XdsClient(target, node, delta=delta, credentials=tls.channel_credentials() if tls is not None else None,
                                renewed=tls.renewal() if tls is not None else None)
        self.updates = 0
        self.client.subscribe(types.ENDPOINT, endpoint_pb2.ClusterLoadAssignment, self._on_endpoints, names=[LEAF_SERVERS_CLUSTER])
        self.client.subscribe(dr.CELL_LATENCY_MODEL, pb.CellLatencyModel, self._on_models, names=[cell])
        self.client.subscribe(dr.DP_GROUPS, pb.DpGroups, self._on_dp_groups, names=[cell])
        self.client.subscribe(dr.LEAF_POLICY, pb.LeafPolicy, self._on_policy, names=[cell])

    async def start(self) -> LeafXdsSync:
        await self.client.start()
        return self

    async def stop(self) -> None:
        await self.client.stop()

    def _on_endpoints(self, resources: dict[str, Message]) -> None:
        cla = resources.get(LEAF_SERVERS_CLUSTER)
        if cla is None:
            return  # withdrawn: keep serving with the servers we have
        servers = servers_from_cla(cla)
        try:
            self.state.set_servers(servers)
        except ValueError as e:
            raise ResourceValidationError(str(e)) from e
        self.updates += 1
        log.info("leaf_servers", cell=self.cell, servers=[a for a, _ in servers])

    def _on_models(self, resources: dict[str, Message]) -> None:
        msg = resources.get(self.cell)
        if msg is None or not msg.HasField("fleet_prior"):
            return
        try:
            prior = dr.model_from_pb(msg.fleet_prior, f"CellLatencyModel {self.cell}.fleet_prior")
        except dr.ResourceError as e:
            raise ResourceValidationError(str(e)) from e
        self.state.set_prior(prior)
        self.updates += 1

    def _on_policy(self, resources: dict[str, Message]) -> None:
        """A new leaf policy (the config's ``policy.plugins``): the next pick uses its rule, no restart."""
        msg = resources.get(self.cell)
        if msg is None:
            return  # withdrawn: keep the policy we have
        try:
            policy = dr.leaf_policy_from_pb(msg, f"LeafPolicy {self.cell}")
            self.state.set_policy(policy.pick, policy.pick_params.choices, policy.fit.window_s, policy.fit.refit_period_s)
            self.state.set_admission(policy.admission.to_core(msg.admission_deadline_s))
            if self.on_policy is not None:
                self.on_policy(policy)
        except (dr.ResourceError, ValueError) as e:
            raise ResourceValidationError(str(e)) from e
        self.updates += 1
        log.info("leaf_policy", cell=self.cell, pick=policy.pick, choices=policy.pick_params.choices,
                 window_s=policy.fit.window_s, refit_period_s=policy.fit.refit_period_s)

    def _on_dp_groups(self, resources: dict[str, Message]) -> None:
        msg = resources.get(self.cell)
        if msg is None:
            return  # withdrawn: keep the groups we have
        try:
            groups = [(dp_balancer(g), rank_addresses(host, port, g.ranks)) for host, port, g in dr.dp_groups_from_pb(msg)]
            self.state.set_dp_groups(groups)
        except (dr.ResourceError, ValueError, OSError) as e:
            raise ResourceValidationError(str(e)) from e
        self.updates += 1
        log.info("leaf_dp_groups", cell=self.cell, groups=[(m[0], b.ranks, b.policy, b.horizon) for b, m in groups])
