"""The policy surface: every routing knob as a ``{type, parameters}`` entry, resolved through one registry.

Why one registry (as GIE/llm-d's ``EndpointPickerConfig`` lists plugins): a knob that exists only as a
process flag lets two processes of one deployment disagree and cannot be changed over xDS. Here every
knob is a plugin *type* with a parameters dataclass (defaults) and a checker; each type fills one
*slot* (the leaf's pick rule, its latency fit, an endpoint's mechanism...). A slot left out takes its
default type with default parameters, so an empty ``policy`` behaves as DLB always did.

``policy.plugins`` holds the deployment's slots (leaf and control plane); ``endpoints[].policy.plugins``
an endpoint's. The older endpoint shape (``mechanism``, ``cost``, ``flow``, ``aversion``, ``affinity``)
still loads: its sections are checked by the same types' checkers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from dlb.config.checker import Checker, close, show
from dlb.config.model import (
    PICK_RULES,
    POLICY_API_VERSION,
    AdmissionParams,
    AffinityParams,
    AversionParams,
    BackgroundProbeParams,
    Config,
    Cost,
    DeploymentPolicy,
    FlowParams,
    LatencyFitParams,
    LeafPolicy,
    Mechanism,
    MnlbParams,
    PickParams,
    Policy,
    ShedParams,
)
from dlb.config.yaml_nodes import join
from dlb.core.native_discrete import DEFAULT_PICK, PICKS

DEPLOYMENT, ENDPOINT = "deployment", "endpoint"
HEADER_NAME_RE = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")  # RFC 9110 token, lower case (HTTP/2 form)
SUPPORTED_API_VERSIONS = (POLICY_API_VERSION,)
NATIVE_DISCRETE = "native-discrete"


@dataclass(frozen=True)
class NoParams:
    """A type without parameters."""


@dataclass(frozen=True)
class MechanismParams:
    """An endpoint's mechanism (``discrete`` or ``flow``): the cost it minimises; flow's step settings."""

    cost: Cost = Cost.LATENCY
    flow: FlowParams = field(default_factory=FlowParams)
    #: ``native-discrete``: Envoy's pick over the cells (:data:`dlb.core.native_discrete.PICKS`).
    pick: str = DEFAULT_PICK


@dataclass(frozen=True)
class PluginType:
    """One registry entry: the config's type name, the slot it fills, its parameters and their checker."""

    name: str
    slot: str
    scope: str  # DEPLOYMENT (``policy.plugins``) or ENDPOINT (``endpoints[].policy.plugins``)
    params: type
    check: Callable[[Checker, Any, str], Any]  # (checker, raw parameters, path) -> params instance
    help: str


# -- parameter checkers: each reports problems at the given path and returns usable parameters ------

def _pick(ck: Checker, raw: Any, path: str) -> PickParams:
    m = ck.mapping(raw, path, ("choices",))
    return PickParams(choices=ck.number(m, "choices", path, PickParams.choices, ge=1, le=4096, integer=True))


def _fit(ck: Checker, raw: Any, path: str) -> LatencyFitParams:
    m = ck.mapping(raw, path, ("window_s", "refit_period_s"))
    d = LatencyFitParams()
    return LatencyFitParams(window_s=ck.number(m, "window_s", path, d.window_s, gt=0, le=86_400),
                            refit_period_s=ck.number(m, "refit_period_s", path, d.refit_period_s, gt=0, le=3600))


def _background(ck: Checker, raw: Any, path: str) -> BackgroundProbeParams:
    m = ck.mapping(raw, path, ("min_interval_ms", "max_interval_ms", "budget", "max_tokens", "model"))
    d = BackgroundProbeParams()
    out = BackgroundProbeParams(
        min_interval_ms=ck.number(m, "min_interval_ms", path, d.min_interval_ms, ge=0),
        max_interval_ms=ck.number(m, "max_interval_ms", path, d.max_interval_ms, gt=0),
        budget=ck.number(m, "budget", path, d.budget, gt=0, le=1),
        max_tokens=ck.number(m, "max_tokens", path, d.max_tokens, ge=1, le=1_000_000, integer=True),
        model=ck.string(m, "model", path, None),
    )
    if out.min_interval_ms > 0 and out.max_interval_ms < out.min_interval_ms:
        ck.err(join(path, "max_interval_ms"), f"{out.max_interval_ms:g} must be >= min_interval_ms={out.min_interval_ms:g}")
    return out


def _admission(ck: Checker, raw: Any, path: str) -> AdmissionParams:
    m = ck.mapping(raw, path, ("enabled", "fraction", "window_s", "min_inflight", "slowdown"))
    d = AdmissionParams()
    return AdmissionParams(enabled=ck.boolean(m, "enabled", path, d.enabled),
                           fraction=ck.number(m, "fraction", path, d.fraction, gt=0, le=1),
                           window_s=ck.number(m, "window_s", path, d.window_s, gt=0, le=3600),
                           min_inflight=ck.number(m, "min_inflight", path, d.min_inflight, ge=1, le=1_000_000, integer=True),
                           slowdown=ck.number(m, "slowdown", path, d.slowdown, ge=0, le=100))


def _mnlb(ck: Checker, raw: Any, path: str) -> MnlbParams:
    m = ck.mapping(raw, path, ("period_s", "rho"))
    d = MnlbParams()
    return MnlbParams(period_s=ck.number(m, "period_s", path, d.period_s, gt=0, le=3600),
                      rho=ck.number(m, "rho", path, d.rho, gt=0, le=1))


def _none(ck: Checker, raw: Any, path: str) -> NoParams:
    ck.mapping(raw, path, ())
    return NoParams()


FLOW_KEYS = ("period_ms", "kappa", "warmup_s")
#: Bounds of ``period_ms`` (the flow step's, and native-discrete's weight refresh).
FLOW_PERIOD_MIN_MS, FLOW_PERIOD_MAX_MS = 10.0, 60_000.0


def flow_params(ck: Checker, raw: Any, path: str) -> FlowParams:
    """Flow's step settings (``period_ms``, ``kappa``, ``warmup_s``); also the old shape's ``policy.flow`` section."""
    m = ck.mapping(raw, path, FLOW_KEYS)
    d = FlowParams()
    # A step per millisecond would take a core; one a minute apart is no longer a control loop (and a
    # reload's new period applies only from the next step, FLOW_PERIOD_MAX_MS later at most).
    return FlowParams(period_ms=ck.number(m, "period_ms", path, d.period_ms, ge=FLOW_PERIOD_MIN_MS, le=FLOW_PERIOD_MAX_MS),
                      kappa=ck.number(m, "kappa", path, d.kappa, gt=0, lt=math.pi / 2),
                      warmup_s=ck.number(m, "warmup_s", path, d.warmup_s, ge=0, le=3600))


def _mechanism(flow: bool, native: bool = False) -> Callable[[Checker, Any, str], MechanismParams]:
    """``native``: discrete, with ``period_ms`` the control plane's weight refresh (the flow step's clock)."""
    def check(ck: Checker, raw: Any, path: str) -> MechanismParams:
        keys = ("cost", *FLOW_KEYS) if flow else ("cost", "period_ms", "pick") if native else ("cost",)
        m = ck.mapping(raw, path, keys)
        cost = ck.choice(m, "cost", path, Cost, MechanismParams.cost)
        timing = {k: m[k] for k in FLOW_KEYS if k in m}
        fp = flow_params(ck, timing, path) if flow or native else FlowParams()
        pick = ck.string(m, "pick", path, DEFAULT_PICK)
        if pick not in PICKS:
            ck.err(join(path, "pick"), f"{show(pick)} is not one of: {', '.join(PICKS)}")
            pick = DEFAULT_PICK
        return MechanismParams(cost=cost, flow=fp, pick=pick)
    return check


def aversion_params(ck: Checker, raw: Any, path: str) -> AversionParams:
    m = ck.mapping(raw, path, ("enabled", "margin", "gain", "decay", "max", "period_ms"))
    d = AversionParams()
    return AversionParams(
        enabled=ck.boolean(m, "enabled", path, d.enabled),
        margin=ck.number(m, "margin", path, d.margin, ge=0, le=1),
        gain=ck.number(m, "gain", path, d.gain, gt=0),
        decay=ck.number(m, "decay", path, d.decay, ge=0, le=1),
        max=ck.number(m, "max", path, d.max, ge=0, lt=1),
        period_ms=ck.number(m, "period_ms", path, d.period_ms, gt=0),
    )


def affinity_params(ck: Checker, raw: Any, path: str) -> AffinityParams:
    m = ck.mapping(raw, path, ("enabled", "header", "ttl_s", "max_sessions", "prefix_savings_ms"))
    d = AffinityParams()
    header = ck.string(m, "header", path, d.header, pattern=HEADER_NAME_RE, what="a lower-case HTTP header name")
    if header.startswith("x-dlb-"):
        ck.err(join(path, "header"), f"{header!r}: x-dlb-* headers are internal (stripped from client requests by the root Envoy)")
        header = d.header
    return AffinityParams(
        enabled=ck.boolean(m, "enabled", path, d.enabled),
        header=header,
        ttl_s=ck.timeout(m, "ttl_s", path, d.ttl_s, zero=None),
        max_sessions=ck.number(m, "max_sessions", path, d.max_sessions, ge=1, integer=True),
        prefix_savings_ms=ck.number(m, "prefix_savings_ms", path, d.prefix_savings_ms, ge=0),
    )


def shed_params(ck: Checker, raw: Any, path: str) -> ShedParams:
    m = ck.mapping(raw, path, ("enabled", "fill", "near_fill", "min_error_rate", "max_age_ms", "deadline"))
    d = ShedParams()
    out = ShedParams(
        enabled=ck.boolean(m, "enabled", path, d.enabled),
        fill=ck.number(m, "fill", path, d.fill, gt=0, le=2),
        near_fill=ck.number(m, "near_fill", path, d.near_fill, gt=0, le=2),
        min_error_rate=ck.number(m, "min_error_rate", path, d.min_error_rate, gt=0, le=1),
        max_age_ms=ck.number(m, "max_age_ms", path, d.max_age_ms, gt=0, le=60_000),
        deadline=ck.boolean(m, "deadline", path, d.deadline),
    )
    if out.near_fill > out.fill:
        ck.err(join(path, "near_fill"), f"{out.near_fill:g} must be <= fill={out.fill:g}")
        out = replace(out, near_fill=out.fill)
    return out


#: The one registry: type name -> what it configures. Slots: ``leaf.pick``, ``leaf.fit``,
#: ``leaf.background-probe``, ``weights`` (deployment); ``mechanism``, ``aversion``, ``affinity``, ``shed`` (endpoint).
REGISTRY: dict[str, PluginType] = {t.name: t for t in (
    PluginType("prequal", "leaf.pick", DEPLOYMENT, PickParams, _pick,
               "leaf picks the server with the fewest tokens waiting among probed ones (Prequal pool + hot-cold rule)"),
    PluginType("rif", "leaf.pick", DEPLOYMENT, PickParams, _pick, "leaf picks by power-of-d on requests in flight"),
    PluginType("latency-fit", "leaf.fit", DEPLOYMENT, LatencyFitParams, _fit, "the leaf's latency-model window and refit period"),
    PluginType("background-probe", "leaf.background-probe", DEPLOYMENT, BackgroundProbeParams, _background,
               "requests the leaf sends through its own Envoy while the cell is idle"),
    PluginType("admission", "leaf.admission", DEPLOYMENT, AdmissionParams, _admission,
               "the leaf answers 429 when the picked server would keep a request past a share of the timeout"),
    PluginType("flow-routers", "weights", DEPLOYMENT, NoParams, _none, "fail-open weights from each endpoint's flow routers"),
    PluginType("mnlb", "weights", DEPLOYMENT, MnlbParams, _mnlb,
               "baseline: fail-open weights from the central MNLB LP (for comparisons, not production)"),
    PluginType("rand", "weights", DEPLOYMENT, NoParams, _none,
               "baseline: fail-open weights fixed at the replica split (Rand; for comparisons, not production)"),
    PluginType("lr-global", "weights", DEPLOYMENT, NoParams, _none,
               "operator baseline: no root ext_proc, Envoy LEAST_REQUEST over every allowed cell's leaf"),
    PluginType("locality-failover", "weights", DEPLOYMENT, NoParams, _none,
               "operator baseline: no root ext_proc, Envoy priorities (own cell first, then by RTT)"),
    PluginType("hub-score", "weights", DEPLOYMENT, NoParams, _none,
               "operator baseline: no root ext_proc, all traffic to the best-scored cell (queue, KV, RTT) from probes"),
    PluginType("discrete", "mechanism", ENDPOINT, MechanismParams, _mechanism(False), "the root picks a cell per request"),
    PluginType("flow", "mechanism", ENDPOINT, MechanismParams, _mechanism(True), "the root splits by projected-gradient weights"),
    PluginType(NATIVE_DISCRETE, "mechanism", ENDPOINT, MechanismParams, _mechanism(False, native=True),
               "the root Envoy picks a cell per request itself: its load balancer over cells, weighted from probes (no ext_proc call)"),
    PluginType("aversion", "aversion", ENDPOINT, AversionParams, aversion_params, "skip cells whose error rate is high"),
    PluginType("affinity", "affinity", ENDPOINT, AffinityParams, affinity_params, "conditional session affinity on a header"),
    PluginType("shed", "shed", ENDPOINT, ShedParams, shed_params, "answer 429 + retry-after when every usable cell is saturated"),
)}


def types_for(scope: str) -> list[str]:
    return [t.name for t in REGISTRY.values() if t.scope == scope]


def resolve(ck: Checker, raw: Any, path: str, scope: str) -> dict[str, tuple[str, Any]]:
    """``[{type, parameters}, ...]`` at ``path`` -> ``{slot: (type name, parameters)}``, one entry per slot."""
    out: dict[str, tuple[str, Any]] = {}
    where: dict[str, str] = {}
    for i, item in enumerate(ck.sequence(raw, path)):
        p = f"{path}[{i}]"
        m = ck.mapping(item, p, ("type", "parameters"), required=("type",))
        name = ck.string(m, "type", p, None)
        if name is None:
            continue
        kind = REGISTRY.get(name)
        if kind is None:
            hint = close(name, REGISTRY)
            ck.err(join(p, "type"), f"{show(name)} is not a policy type" + (f" (did you mean {hint!r}?)" if hint else "")
                   + f"; {scope} types: {', '.join(types_for(scope))}")
            continue
        if kind.scope != scope:
            home = "policy.plugins" if kind.scope == DEPLOYMENT else "endpoints[].policy.plugins"
            ck.err(join(p, "type"), f"{name!r} is {'an' if kind.scope[:1] in 'aeiou' else 'a'} {kind.scope} type: it belongs in {home}")
            continue
        params = kind.check(ck, m.get("parameters"), join(p, "parameters"))
        if kind.slot in out:
            ck.err(join(p, "type"), f"{name!r} sets {kind.slot}, already set by {where[kind.slot]} ({out[kind.slot][0]!r})")
            continue
        out[kind.slot] = (name, params)
        where[kind.slot] = p
    return out


POLICY_KEYS = ("apiVersion", "plugins")


def deployment_policy(ck: Checker, raw: Any) -> DeploymentPolicy:
    """The top-level ``policy`` section (``apiVersion`` required, so a future shape is refused, not misread)."""
    m = ck.mapping(raw, "policy", POLICY_KEYS, required=("apiVersion",))
    version = ck.string(m, "apiVersion", "policy", POLICY_API_VERSION)
    if version not in SUPPORTED_API_VERSIONS:
        ck.err("policy.apiVersion", f"{show(version)} is not supported (supported: {', '.join(SUPPORTED_API_VERSIONS)})")
    slots = resolve(ck, m.get("plugins"), "policy.plugins", DEPLOYMENT)
    d = DeploymentPolicy()
    pick, pick_params = slots.get("leaf.pick", (d.leaf.pick, d.leaf.pick_params))
    assert pick in PICK_RULES
    leaf = LeafPolicy(pick=pick, pick_params=pick_params, fit=slots.get("leaf.fit", ("", d.leaf.fit))[1],
                      background_probe=slots.get("leaf.background-probe", ("", d.leaf.background_probe))[1],
                      admission=slots.get("leaf.admission", ("", d.leaf.admission))[1])
    weights, wparams = slots.get("weights", (d.weights, d.mnlb))
    return DeploymentPolicy(api_version=version, leaf=leaf, weights=weights,
                            mnlb=wparams if isinstance(wparams, MnlbParams) else d.mnlb)


OLD_ENDPOINT_KEYS = ("mechanism", "cost", "flow", "aversion", "affinity")


def endpoint_policy(ck: Checker, raw: Any, path: str) -> Policy:
    """``endpoints[].policy``: ``{plugins: [...]}``, or the older ``{mechanism, cost, flow, aversion, affinity}``."""
    if isinstance(raw, dict) and "plugins" in raw:
        m = ck.mapping(raw, path, ("plugins",), unknown="cannot be mixed with plugins (give every knob as a plugin)")
        slots = resolve(ck, m.get("plugins"), join(path, "plugins"), ENDPOINT)
        d = Policy()
        mech_name, mech = slots.get("mechanism", (d.mechanism.value, MechanismParams()))
        native = mech_name == NATIVE_DISCRETE
        affinity = slots.get("affinity", ("", d.affinity))[1]
        shed = slots.get("shed", ("", d.shed))[1]
        if native and not affinity.enabled:  # no root ext_proc (affinity keeps it): nothing would shed
            if "shed" in slots and shed.enabled:  # accepted, then never applied
                at = next((k for k, p in enumerate(m.get("plugins") or []) if isinstance(p, dict) and p.get("type") == "shed"), None)
                ck.err(join(path, f"plugins[{at}]" if at is not None else "plugins"),
                       "shed needs the root ext_proc, which native-discrete removes (Envoy picks the cell): set enabled: false "
                       "or use discrete; the leaves' admission still answers 429")
            shed = replace(shed, enabled=False)
        return Policy(mechanism=Mechanism.DISCRETE if native else Mechanism(mech_name), native=native, native_pick=mech.pick,
                      cost=mech.cost, flow=mech.flow,
                      aversion=slots.get("aversion", ("", d.aversion))[1], affinity=affinity, shed=shed)
    m = ck.mapping(raw, path, OLD_ENDPOINT_KEYS)
    d = Policy()
    mechanism = ck.choice(m, "mechanism", path, Mechanism, d.mechanism)
    return Policy(
        mechanism=mechanism,
        cost=ck.choice(m, "cost", path, Cost, d.cost),
        flow=flow_params(ck, m.get("flow"), join(path, "flow")),
        aversion=aversion_params(ck, m.get("aversion"), join(path, "aversion")),
        affinity=affinity_params(ck, m.get("affinity"), join(path, "affinity")),
    )


def policy_plugins(policy: Policy) -> list[dict[str, Any]]:
    """An endpoint policy in the plugins shape (what ``dlb config validate`` shows and docs/config.md lists)."""
    mech: dict[str, Any] = {"cost": policy.cost.value}
    if policy.mechanism is Mechanism.FLOW:
        mech |= {"period_ms": policy.flow.period_ms, "kappa": policy.flow.kappa}
        if policy.flow.warmup_s is not None:
            mech["warmup_s"] = policy.flow.warmup_s
    elif policy.native:
        mech |= {"period_ms": policy.flow.period_ms, "pick": policy.native_pick}
    a, f, sh = policy.aversion, policy.affinity, policy.shed
    return [{"type": NATIVE_DISCRETE if policy.native else policy.mechanism.value, "parameters": mech},
            {"type": "aversion", "parameters": {"enabled": a.enabled, "margin": a.margin, "gain": a.gain, "decay": a.decay,
                                                "max": a.max, "period_ms": a.period_ms}},
            {"type": "affinity", "parameters": {"enabled": f.enabled, "header": f.header, "ttl_s": f.ttl_s,
                                                "max_sessions": f.max_sessions, "prefix_savings_ms": f.prefix_savings_ms}},
            {"type": "shed", "parameters": {"enabled": sh.enabled, "fill": sh.fill, "near_fill": sh.near_fill,
                                            "min_error_rate": sh.min_error_rate, "max_age_ms": sh.max_age_ms,
                                            "deadline": sh.deadline}}]


def set_plugins(raw: dict[str, Any], *plugins: dict[str, Any]) -> dict[str, Any]:
    """Put ``plugins`` into a config dict's ``policy`` section, each replacing any entry of its slot.

    For programs that write a config (testbeds, benchmarks): what used to be a flag on one process
    becomes a plugin in the file every process of the deployment reads.
    """
    section = raw.setdefault("policy", {})
    section.setdefault("apiVersion", POLICY_API_VERSION)
    current = list(section.get("plugins") or [])
    for plugin in plugins:
        slot = REGISTRY[plugin["type"]].slot
        current = [p for p in current if not (isinstance(p, dict) and p.get("type") in REGISTRY and REGISTRY[p["type"]].slot == slot)]
        current.append(plugin)
    section["plugins"] = current
    return raw


def unused_warmup_warning(cfg: Config) -> str | None:
    """Where ``flow.warmup_s`` was set but no root service will pick for it, or None.

    Why a warning: the cold start is discrete picks by the root service; roots configured by the control
    plane (``dlb up``, ``dlb serve control-plane``) run flow endpoints without affinity in Envoy, whose
    weights start from the replica split, and a discrete endpoint has no flow step. Valid config either way
    (a root with a static bootstrap does pick), so it is said, not refused."""
    eps = [ep.name for ep in cfg.endpoints
           if ep.policy.flow.warmup_s and (ep.policy.mechanism is not Mechanism.FLOW or not ep.policy.affinity.enabled)]
    if not eps:
        return None
    return (f"endpoint(s) {', '.join(eps)}: flow.warmup_s applies only where a root service picks (flow with affinity, "
            "or a root with a static bootstrap); under the control plane, flow without affinity starts from the replica split")
