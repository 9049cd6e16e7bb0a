"""DLB's own xDS resources (``dlb.v1`` protos): built from the config, and decoded by the services.

The control plane serves, next to Envoy's types:

| type URL (``type.googleapis.com/…``) | name | consumer |
| --- | --- | --- |
| ``dlb.v1.RoutingPolicy`` | endpoint name | root services |
| ``dlb.v1.Topology`` | ``topology`` | root services |
| ``dlb.v1.CellLatencyModel`` | cell name | root services (fallback model), leaves (fleet prior) |
| ``dlb.v1.CellAversion`` | cell name | root services |
| ``dlb.v1.FlowWeights`` | ``<endpoint>/<source cell>`` | root services (the weights Envoy got) |
| ``dlb.v1.DpGroups`` | cell name | leaves (data-parallel servers: ranks, rank policy, horizon) |
| ``dlb.v1.LeafPolicy`` | cell name | leaves (pick rule, choices, latency fit, background probes), applied live |

Decoding validates: a resource that would put a service in a bad state raises
:class:`ResourceError`, which the xDS client turns into a NACK, so the service keeps its last good
state and the operator sees the reason in the control plane's status.
"""

from __future__ import annotations

import math

import numpy as np
from google.protobuf.message import Message

from dlb.config.model import (
    DP_POLICIES,
    PICK_RULES,
    POLICY_API_VERSION,
    AdmissionParams,
    AffinityParams,
    AversionParams,
    BackgroundProbeParams,
    Config,
    DpGroup,
    Endpoint,
    FlowParams,
    LatencyFitParams,
    LeafPolicy,
    PickParams,
    Policy,
    ProbeParams,
    ShedParams,
    leaf_deadline_s,
)
from dlb.core.costs import Cost
from dlb.core.hold_queue import MAX_HOLD_S
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig
from dlb.core.topology import Topology
from dlb.errors import DlbError
from dlb.proto import probe_pb2
from dlb.proto import resources_pb2 as pb
from dlb.xds import types

ROUTING_POLICY = types.type_url_of("dlb.v1.RoutingPolicy")
TOPOLOGY = types.type_url_of("dlb.v1.Topology")
CELL_LATENCY_MODEL = types.type_url_of("dlb.v1.CellLatencyModel")
CELL_AVERSION = types.type_url_of("dlb.v1.CellAversion")
FLOW_WEIGHTS = types.type_url_of("dlb.v1.FlowWeights")
DP_GROUPS = types.type_url_of("dlb.v1.DpGroups")
LEAF_POLICY = types.type_url_of("dlb.v1.LeafPolicy")
#: Every type URL the control plane serves: Envoy's and DLB's own (what its /status and /metrics name one by one).
SERVED_TYPES = frozenset({*types.SHORT_NAMES, ROUTING_POLICY, TOPOLOGY, CELL_LATENCY_MODEL, CELL_AVERSION, FLOW_WEIGHTS,
                          DP_GROUPS, LEAF_POLICY})
TOPOLOGY_NAME = "topology"

_MECH = {Mechanism.DISCRETE: pb.RoutingPolicy.DISCRETE, Mechanism.FLOW: pb.RoutingPolicy.FLOW}
_COST = {Cost.RIF: pb.RoutingPolicy.RIF, Cost.LATENCY: pb.RoutingPolicy.LATENCY, Cost.GRADIENT: pb.RoutingPolicy.GRADIENT}


class ResourceError(DlbError, ValueError):
    """A DLB resource that must be rejected (NACKed)."""


def model_to_pb(p: LatencyParams, confidence: float = 0.0, samples: int = 0) -> probe_pb2.LatencyModel:
    return probe_pb2.LatencyModel(a_s=p.a, b_s=p.b, c=p.c, s=p.s, confidence=confidence, samples=samples)


def model_from_pb(m: probe_pb2.LatencyModel, what: str) -> LatencyParams:
    try:
        return LatencyParams(m.a_s, m.b_s, m.c, m.s)
    except ValueError as e:
        raise ResourceError(f"{what}: {e}") from e


# -- build (control plane) --------------------------------------------------------------------------
def routing_policy(config: Config, ep: Endpoint) -> pb.RoutingPolicy:
    pol = ep.policy
    return pb.RoutingPolicy(
        endpoint=ep.name,
        path_prefix=ep.match.prefix,
        mechanism=_MECH[pol.mechanism],
        cost=_COST[pol.cost],
        flow=pb.RoutingPolicy.Flow(period_ms=pol.flow.period_ms, kappa=pol.flow.kappa, warmup_s=pol.flow.warmup_s),
        aversion=pb.RoutingPolicy.Aversion(enabled=pol.aversion.enabled, margin=pol.aversion.margin, gain=pol.aversion.gain,
                                           decay=pol.aversion.decay, max=pol.aversion.max, period_ms=pol.aversion.period_ms),
        affinity=pb.RoutingPolicy.Affinity(enabled=pol.affinity.enabled, header=pol.affinity.header, ttl_s=pol.affinity.ttl_s,
                                           max_sessions=pol.affinity.max_sessions, prefix_savings_ms=pol.affinity.prefix_savings_ms),
        latency_prior=model_to_pb(ep.latency_prior.to_core()),
        latency_prior_by_cell={c: model_to_pb(p) for c, p in ep.cell_priors().items()},
        stale_after_ms=config.probe.stale_after_ms,
        shed=pb.RoutingPolicy.Shed(disabled=not pol.shed.enabled, fill=pol.shed.fill, near_fill=pol.shed.near_fill,
                                   min_error_rate=pol.shed.min_error_rate, max_age_ms=pol.shed.max_age_ms,
                                   deadline=pol.shed.deadline, deadline_s=ep.timeout_s),
    )


def topology(config: Config) -> pb.Topology:
    msg = pb.Topology()
    for c in config.cells:
        msg.cells.add(name=c.name, replicas=c.replicas, probe_address=str(c.leaf.probe), leaf_address=str(c.leaf.address),
                      probe_source=c.leaf.source, scrape_addresses=list(c.scrape_addresses()),
                      replica_probe_addresses=[str(r.probe) for r in c.leaf.replicas], replicas_dns=c.leaf.replicas_dns)
    for i in range(len(config.cells)):
        msg.rows.add(one_way_ms=list(config.network.one_way_ms[i]), allowed=list(config.network.allowed[i]))
    return msg


def cell_latency_model(cell: str, model: LatencyParams, prior: LatencyParams, confidence: float, samples: int, observed_ns: int) -> pb.CellLatencyModel:
    return pb.CellLatencyModel(cell=cell, model=model_to_pb(model, confidence, samples), fleet_prior=model_to_pb(prior),
                               observed_unix_ns=observed_ns)


def cell_aversion(cell: str, error_rate: float, aversion_rate: float) -> pb.CellAversion:
    return pb.CellAversion(cell=cell, error_rate=error_rate, aversion_rate=aversion_rate)


def flow_weights(endpoint: str, source: str, names: tuple[str, ...], x: np.ndarray) -> pb.FlowWeights:
    return pb.FlowWeights(endpoint=endpoint, source_cell=source, weights={n: float(v) for n, v in zip(names, x, strict=True) if v > 0})


def dp_groups(config: Config, cell: str) -> pb.DpGroups:
    """The cell's data-parallel servers as its leaf applies them (every cell gets one, maybe empty:
    an empty list withdraws groups a previous config had)."""
    msg = pb.DpGroups(cell=cell)
    for s in config.cell(cell).servers:
        if s.dp is not None:
            msg.groups.add(server=str(s.address), ranks=s.dp.ranks, policy=s.dp.policy, horizon=s.dp.horizon,
                           mean_decode_tokens=s.dp.mean_decode_tokens, max_num_seqs=s.dp.max_num_seqs,
                           hold_queue=s.dp.hold_queue, hold_deadline_ms=s.dp.hold_deadline_ms,
                           hold_early=s.dp.hold_early)
    return msg


def dp_groups_from_pb(msg: pb.DpGroups) -> list[tuple[str, int, DpGroup]]:
    """``(host, port of rank 0, group)`` per group; a field out of its domain raises :class:`ResourceError` naming it."""
    out = []
    seen: set[tuple[str, int]] = set()
    for i, g in enumerate(msg.groups):
        what = f"DpGroups {msg.cell}.groups[{i}]"
        host, _, port_s = g.server.rpartition(":")
        if not host or not port_s.isdigit() or not 0 < int(port_s) <= 65535:
            raise ResourceError(f"{what}.server: expected host:port, got {g.server!r}")
        if g.ranks < 1 or int(port_s) + g.ranks - 1 > 65535:
            raise ResourceError(f"{what}.ranks: must be >= 1 with every rank port <= 65535, got {g.ranks}")
        if g.policy not in DP_POLICIES:
            raise ResourceError(f"{what}.policy: must be one of {', '.join(DP_POLICIES)}, got {g.policy!r}")
        if not math.isfinite(g.mean_decode_tokens) or g.mean_decode_tokens < 1.0:
            raise ResourceError(f"{what}.mean_decode_tokens: must be a finite number >= 1, got {g.mean_decode_tokens}")
        key = (host.strip("[]"), int(port_s))
        if key in seen:
            raise ResourceError(f"{what}.server: {g.server} is listed twice")
        seen.add(key)
        if g.hold_queue > 100_000:
            raise ResourceError(f"{what}.hold_queue: must be <= 100000, got {g.hold_queue}")
        deadline = g.hold_deadline_ms or DpGroup.hold_deadline_ms
        if not 1 <= deadline <= MAX_HOLD_S * 1000:
            raise ResourceError(f"{what}.hold_deadline_ms: must be in 1..{MAX_HOLD_S * 1000:g}, got {deadline}")
        early = g.hold_early if g.HasField("hold_early") else DpGroup.hold_early
        if not 0.0 <= early <= 0.99:
            raise ResourceError(f"{what}.hold_early: must be in 0..0.99, got {early}")
        out.append((key[0], key[1], DpGroup(ranks=g.ranks, policy=g.policy, horizon=g.horizon,
                                            mean_decode_tokens=g.mean_decode_tokens, max_num_seqs=g.max_num_seqs,
                                            hold_queue=g.hold_queue, hold_deadline_ms=deadline, hold_early=early)))
    return out


def leaf_policy(config: Config) -> pb.LeafPolicy:
    """The leaves' routing knobs (the config's ``policy.plugins``), one resource per cell."""
    lp, bg, adm = config.policy.leaf, config.policy.leaf.background_probe, config.policy.leaf.admission
    return pb.LeafPolicy(api_version=config.policy.api_version, pick=lp.pick, choices=lp.pick_params.choices,
                         window_s=lp.fit.window_s, refit_period_s=lp.fit.refit_period_s,
                         background_min_interval_ms=bg.min_interval_ms, background_max_interval_ms=bg.max_interval_ms,
                         background_budget=bg.budget, background_max_tokens=bg.max_tokens, background_model=bg.model or "",
                         admission=adm.enabled, admission_fraction=adm.fraction, admission_window_s=adm.window_s,
                         admission_min_inflight=adm.min_inflight, admission_deadline_s=leaf_deadline_s(config.endpoints),
                         admission_slowdown=adm.slowdown)


def leaf_policy_from_pb(msg: pb.LeafPolicy, what: str = "LeafPolicy") -> LeafPolicy:
    """Decode and check a LeafPolicy; a value a leaf cannot apply raises :class:`ResourceError` (a NACK)."""
    if msg.api_version != POLICY_API_VERSION:
        raise ResourceError(f"{what}.api_version: {msg.api_version!r} is not supported (this leaf speaks {POLICY_API_VERSION})")
    if msg.pick not in PICK_RULES:
        raise ResourceError(f"{what}.pick: must be one of {', '.join(PICK_RULES)}, got {msg.pick!r}")
    if msg.choices < 1:
        raise ResourceError(f"{what}.choices: must be >= 1, got {msg.choices}")
    for name in ("window_s", "refit_period_s", "background_max_interval_ms", "background_budget"):
        v = getattr(msg, name)
        if not (math.isfinite(v) and v > 0):
            raise ResourceError(f"{what}.{name}: must be a finite number > 0, got {v}")
    if not (math.isfinite(msg.background_min_interval_ms) and msg.background_min_interval_ms >= 0) or msg.background_budget > 1:
        raise ResourceError(f"{what}: background_min_interval_ms must be >= 0 and background_budget <= 1")
    if msg.background_max_tokens < 1:
        raise ResourceError(f"{what}.background_max_tokens: must be >= 1, got {msg.background_max_tokens}")
    admission = AdmissionParams()
    if msg.admission_fraction or msg.admission_window_s or msg.admission_min_inflight:  # unset: an older control plane
        if not (0 < msg.admission_fraction <= 1 and math.isfinite(msg.admission_window_s) and msg.admission_window_s > 0
                and msg.admission_min_inflight >= 1 and math.isfinite(msg.admission_deadline_s) and msg.admission_deadline_s >= 0
                and 0 <= msg.admission_slowdown <= 100):
            raise ResourceError(f"{what}: admission_fraction must be in (0, 1], admission_window_s > 0, "
                                "admission_min_inflight >= 1, admission_deadline_s >= 0 and admission_slowdown in [0, 100]")
        # An older control plane sends no slowdown (0): its leaves keep the deadline-only rule it meant.
        admission = AdmissionParams(msg.admission, msg.admission_fraction, msg.admission_window_s, msg.admission_min_inflight,
                                    msg.admission_slowdown)
    return LeafPolicy(pick=msg.pick, pick_params=PickParams(choices=msg.choices),
                      fit=LatencyFitParams(window_s=msg.window_s, refit_period_s=msg.refit_period_s),
                      background_probe=BackgroundProbeParams(
                          min_interval_ms=msg.background_min_interval_ms, max_interval_ms=msg.background_max_interval_ms,
                          budget=msg.background_budget, max_tokens=msg.background_max_tokens, model=msg.background_model or None),
                      admission=admission)


def flow_weights_name(endpoint: str, source: str) -> str:
    return f"{endpoint}/{source}"


def config_resources(config: Config) -> dict[str, list[tuple[str, Message]]]:
    """The static part of the DLB resources (policies and topology) as (name, message) by type URL."""
    return {
        ROUTING_POLICY: [(ep.name, routing_policy(config, ep)) for ep in config.endpoints],
        TOPOLOGY: [(TOPOLOGY_NAME, topology(config))],
    }


# -- decode (services) ------------------------------------------------------------------------------
def policy_from_pb(msg: pb.RoutingPolicy) -> tuple[PolicyConfig, LatencyParams, dict[str, LatencyParams]]:
    """The routing core's policy, the endpoint's prior and the cells' own priors carried by a RoutingPolicy resource."""
    what = f"RoutingPolicy {msg.endpoint!r}"
    if not msg.endpoint:
        raise ResourceError("RoutingPolicy without an endpoint name")
    mech = {v: k for k, v in _MECH.items()}.get(msg.mechanism)
    cost = {v: k for k, v in _COST.items()}.get(msg.cost)
    if mech is None or cost is None:
        raise ResourceError(f"{what}: mechanism and cost must be set (got {msg.mechanism}, {msg.cost})")
    # Decode into the config model's dataclasses and let them convert, so units and defaults (an unset
    # proto3 field is 0) are exactly those of a config file.
    a, f, sh = msg.aversion, msg.affinity, msg.shed
    try:
        policy = Policy(
            mechanism=mech,
            cost=cost,
            flow=FlowParams(period_ms=msg.flow.period_ms or FlowParams.period_ms, kappa=msg.flow.kappa or FlowParams.kappa,
                            warmup_s=msg.flow.warmup_s if msg.flow.HasField("warmup_s") else None),
            aversion=AversionParams(a.enabled, a.margin, a.gain, a.decay, a.max, a.period_ms or AversionParams.period_ms),
            affinity=AffinityParams(f.enabled, f.header or AffinityParams.header, f.ttl_s or AffinityParams.ttl_s,
                                    f.max_sessions or AffinityParams.max_sessions, f.prefix_savings_ms),
            shed=ShedParams(not sh.disabled, sh.fill or ShedParams.fill, sh.near_fill or ShedParams.near_fill,
                            sh.min_error_rate or ShedParams.min_error_rate, sh.max_age_ms or ShedParams.max_age_ms,
                            deadline=sh.deadline),
        ).to_core(ProbeParams(stale_after_ms=msg.stale_after_ms or ProbeParams.stale_after_ms), sh.deadline_s)
    except ValueError as e:
        raise ResourceError(f"{what}: {e}") from e
    by_cell = {c: model_from_pb(m, f"{what}.latency_prior_by_cell[{c!r}]") for c, m in sorted(msg.latency_prior_by_cell.items())}
    return policy, model_from_pb(msg.latency_prior, f"{what}.latency_prior"), by_cell


def topology_from_pb(msg: pb.Topology) -> Topology:
    n = len(msg.cells)
    if n == 0 or len(msg.rows) != n or any(len(r.one_way_ms) != n or len(r.allowed) != n for r in msg.rows):
        raise ResourceError(f"Topology: {n} cells need {n} rows of {n} latencies and {n} allowed flags")
    try:
        return Topology(
            names=tuple(c.name for c in msg.cells),
            replicas=np.array([c.replicas for c in msg.cells], dtype=float),
            tau=np.array([list(r.one_way_ms) for r in msg.rows], dtype=float) / 1000.0,
            allowed=np.array([list(r.allowed) for r in msg.rows], dtype=bool),
        )
    except ValueError as e:
        raise ResourceError(f"Topology: {e}") from e


def weights_from_pb(msg: pb.FlowWeights, names: tuple[str, ...]) -> np.ndarray:
    unknown = set(msg.weights) - set(names)
    if unknown:
        raise ResourceError(f"FlowWeights {msg.endpoint}/{msg.source_cell}: unknown cells {sorted(unknown)}")
    x = np.array([msg.weights.get(n, 0.0) for n in names])
    if np.any(x < 0) or x.sum() <= 0:
        raise ResourceError(f"FlowWeights {msg.endpoint}/{msg.source_cell}: weights must be >= 0 with a positive sum")
    return x / x.sum()
