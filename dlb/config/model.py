"""The DLB config as frozen dataclasses: what services, the testbed and the Envoy renderer read.

A config is parsed and checked once (``dlb.config.loader``); everything downstream works on these
immutable objects, so a service can never observe a half-valid config. Field names match the YAML keys
(docs/config.md) and are kept stable: other modules build on them. Cells are indexed 0..n-1 in file
order; matrices are stored as tuples (hashable, immutable) and exposed as numpy arrays on demand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import math
from dataclasses import dataclass, field

import numpy as np

# The routing core's enums are the config's enums: a loaded policy compares equal to router constants.
from dlb.core.admission import AdmissionConfig
from dlb.core.affinity import AffinityConfig
from dlb.core.aversion import AversionConfig
from dlb.core.costs import Cost
from dlb.core.flow import FlowConfig
from dlb.core.latency_model import LatencyParams
from dlb.core.native_discrete import DEFAULT_PICK
from dlb.core.router import Mechanism, PolicyConfig
from dlb.core.shedding import ShedConfig
from dlb.core.topology import Topology

#: Envoy cluster name of a cell on a root Envoy: ``cell-<name>``.
CELL_CLUSTER_PREFIX = "cell-"


@dataclass(frozen=True, order=True)
class HostPort:
    """A TCP address ``host:port``; ``host`` may be a name, an IPv4 or an IPv6 address (no brackets)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """Only this host can reach it: ``localhost`` or a loopback IP (the access log's channel, a leaf a
        derived root token is safe on)."""
        if loopback_name(self.host):
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False


DP_POLICIES = ("bf-io", "jsq", "round-robin", "least-kv")
#: What answers a cell's probes (``cells[].leaf.source``; dlb.probe.foreign reads the foreign ones).
LEAF_SOURCES = ("dlb", "vllm", "gie")


@dataclass(frozen=True)
class DpGroup:
    """A data-parallel server's ranks and how the leaf picks among them (docs/bfio.md).

    Rank r listens on the server's port + r, as vLLM's external DP load balancing deploys them.
    """

    ranks: int
    policy: str = "bf-io"  # one of DP_POLICIES
    horizon: int = 10  # BF-IO look-ahead in decode steps
    mean_decode_tokens: float = 256.0  # mean of the geometric decode-length model
    max_num_seqs: int = 0  # running sequences per rank (vLLM's per-rank --max-num-seqs); 0 = unknown
    hold_queue: int = 0  # requests the leaf holds while no rank can admit (0: off, send at once)
    hold_deadline_ms: float = 5000.0  # a held request's longest wait; then 503
    hold_early: float = 0.25  # BF-IO holds once at most this share of the slots is free (0: only when none is)


@dataclass(frozen=True)
class Server:
    """One inference server (OpenAI-compatible HTTP) behind a cell's leaf Envoy."""

    address: HostPort
    weight: int = 1
    dp: DpGroup | None = None  # set for a data-parallel server (``dp_ranks`` > 1)

    def rank_addresses(self) -> tuple[HostPort, ...]:
        """Every HTTP endpoint of this server: its ranks' for a DP server, else just its address."""
        if self.dp is None:
            return (self.address,)
        return tuple(HostPort(self.address.host, self.address.port + r) for r in range(self.dp.ranks))


#: Names that mean this host's loopback wherever they resolve (RFC 6761 §6.3): a listener given one binds
#: 127.0.0.1 — an operator who writes ``localhost`` means "this host only", not every interface.
LOOPBACK_NAMES = frozenset({"localhost"})


def loopback_name(host: str) -> bool:
    return host.lower().rstrip(".") in LOOPBACK_NAMES


#: Hosts a listener binds every interface with: a port bound there is taken on every address of the machine.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


def bind_address(advertised: HostPort, listen: HostPort | None) -> HostPort:
    """Where a listener advertised at ``advertised`` binds: ``listen`` if set, else every interface, same port.

    Why not the advertised address itself: it is how *others* reach the listener (a DNS name, a
    Service or LoadBalancer IP), and inside a pod that address is on no interface, so binding it fails.
    A loopback address is the exception: only this host can use it, and binding every interface
    instead would expose a leaf (which trusts ``x-dlb-server``) to the network for nothing.
    """
    if listen is not None:
        return listen
    if advertised.loopback:  # a loopback IP binds as it is; a loopback name binds 127.0.0.1
        return HostPort("127.0.0.1", advertised.port) if loopback_name(advertised.host) else advertised
    return HostPort("::" if ":" in advertised.host else "0.0.0.0", advertised.port)


@dataclass(frozen=True)
class Leaf:
    """A cell's leaf tier: the leaf Envoy that roots send to, and the leaf agent."""

    address: HostPort  # leaf Envoy HTTP listener as roots reach it; roots' ``cell-<name>`` cluster points here
    probe: HostPort  # leaf agent gRPC probe service (dlb.v1)
    ext_proc: HostPort | None = None  # optional leaf ext_proc (server picking); None = Envoy LEAST_REQUEST
    listen: HostPort | None = None  # where the leaf Envoy binds; None = bind_address() of address
    #: Where the agent takes the leaf Envoy's access log: ``unix:/path`` or a loopback ``host:port``; never the
    #: probe address, which roots reach across the network (docs/security.md). None = :meth:`access_log_address`'s default.
    access_log: str | None = None
    #: What answers the roots' probes: ``dlb`` (this leaf's agent at ``probe``), or a cell DLB does not run —
    #: ``vllm`` (the cell's servers' ``/metrics``, and the roots send to the servers directly) or ``gie`` (the
    #: GIE/llm-d endpoint picker's ``/metrics`` at ``probe``; the roots send to its gateway at ``address``).
    source: str = "dlb"
    #: Further leaf replicas over the same servers (``leaf.replicas``): each a leaf Envoy + agent with
    #: addresses of its own; roots send to every replica's Envoy and probe every agent (dlb.core.leaf_replicas).
    replicas: tuple[Leaf, ...] = ()
    #: ``leaf.replicas: dns``: every address ``probe`` (and ``address``) resolves to is a replica (a headless Service).
    replicas_dns: bool = False

    @property
    def bind(self) -> HostPort:
        return bind_address(self.address, self.listen)

    @property
    def replicated(self) -> bool:
        """More than one leaf replica may answer for this cell (listed, or found in DNS)."""
        return bool(self.replicas) or self.replicas_dns

    def all_replicas(self) -> tuple[Leaf, ...]:
        """Replica 0 (this leaf's own addresses) then the further ones, each without ``replicas``."""
        return (dataclasses.replace(self, replicas=()), *self.replicas)

    @property
    def foreign(self) -> bool:
        """No DLB leaf in this cell: ``dlb up`` starts nothing for it and the control plane pushes it nothing."""
        return self.source != "dlb"


    def access_log_address(self) -> str:
        """The access-log channel: a Unix socket named after the probe address by default, so the agent
        and the Envoy bootstrap (static or pushed by the control plane) agree on it from the config alone."""
        if self.access_log:
            return self.access_log
        name = f"{self.probe.host.strip('[]').replace(':', '_')}-{self.probe.port}"
        if len(name) > 64:  # a Unix socket path has at most 107 bytes; long DNS names are hashed
            name = hashlib.sha256(name.encode()).hexdigest()[:32]
        # A directory of its own (the agent makes it 0700 or refuses one it does not own), in /tmp: in
        # Kubernetes the leaf Envoy and agent containers share it (an emptyDir, deploy/k8s).
        return f"unix:/tmp/dlb-als-{name}/als.sock"


@dataclass(frozen=True)
class Root:
    """A cell's root tier (optional): where that cell's clients enter and its root ext_proc listens."""

    address: HostPort | None = None  # root Envoy HTTP listener as this cell's clients reach it
    ext_proc: HostPort | None = None  # this cell's root ext_proc; None = services.root.ext_proc
    listen: HostPort | None = None  # where the root Envoy binds; None = bind_address() of address

    @property
    def bind(self) -> HostPort | None:
        return None if self.address is None else bind_address(self.address, self.listen)


#: GIE's InferencePool API groups, each with the version DLB reads (``cells[].inference_pool.group``).
INFERENCE_POOL_GROUPS: dict[str, str] = {"inference.networking.k8s.io": "v1", "inference.networking.x-k8s.io": "v1alpha2"}


@dataclass(frozen=True)
class InferencePoolRef:
    """A cell whose servers are a Kubernetes InferencePool's ready pods, which ``dlb serve epp`` follows:
    the file lists no servers, so every reader of it agrees there are none to render or resolve."""

    name: str
    namespace: str | None = None  # None: the EPP pod's own namespace
    group: str = "inference.networking.k8s.io"


@dataclass(frozen=True)
class Cell:
    name: str
    index: int  # position in the file, 0..n-1; the row/column in every matrix
    replicas: int  # k_j; defaults to the number of servers
    leaf: Leaf
    servers: tuple[Server, ...]
    root: Root = field(default_factory=Root)
    #: ``replicas`` was not set in the file: it follows the server count, discovered ones included.
    replicas_auto: bool = False
    #: The servers are this InferencePool's ready pods (``servers`` is then empty).
    inference_pool: InferencePoolRef | None = None

    @property
    def runs_dlb_leaf(self) -> bool:
        """A DLB leaf (Envoy + agent) serves this cell. Not a foreign cell, nor an InferencePool's: there
        ``dlb serve epp`` picks behind the pool's own GIE gateway, which the roots send to."""
        return not self.leaf.foreign and self.inference_pool is None

    @property
    def cluster_name(self) -> str:
        """Envoy cluster of this cell on root Envoys; also the value the root ext_proc puts in x-dlb-cell."""
        return CELL_CLUSTER_PREFIX + self.name

    def upstreams(self) -> tuple[tuple[HostPort, int], ...]:
        """Where root Envoys send this cell's requests, with weights: its leaf Envoy (or foreign gateway), or
        for a ``vllm`` cell its servers themselves."""
        if self.leaf.source == "vllm":
            return tuple((a, s.weight) for s in self.servers for a in s.rank_addresses())
        return tuple((r.address, 1) for r in self.leaf.all_replicas())

    def scrape_addresses(self) -> tuple[str, ...]:
        """What a prober reads for a foreign cell: each server's ``/metrics`` (``vllm``); the EPP's, then the
        gateway it checks accepts connections (``gie``)."""
        if self.leaf.source == "vllm":
            return tuple(str(a) for s in self.servers for a in s.rank_addresses())
        if self.leaf.source == "gie":
            return str(self.leaf.probe), str(self.leaf.address)
        return ()


@dataclass(frozen=True)
class Network:
    """Resolved network model: every pair filled in (defaults, symmetry applied)."""

    one_way_ms: tuple[tuple[float, ...], ...]  # [i][j] = τ_ij, one-way, milliseconds
    allowed: tuple[tuple[bool, ...], ...]  # [i][j] = traffic entering cell i may be served by cell j


@dataclass(frozen=True)
class FlowParams:
    """Flow mechanism (projected gradient descent): step every ``period_ms``; ``kappa`` < π/2 scales η;
    ``warmup_s`` the cold start of discrete picks (None: the cost's default, 20 s for gradient, else 0)."""

    period_ms: float = 200.0
    kappa: float = FlowConfig.kappa  # one default for config and core
    warmup_s: float | None = None

    def to_core(self) -> FlowConfig:
        return FlowConfig(kappa=self.kappa, period_s=self.period_ms / 1000.0, warmup_s=self.warmup_s)


@dataclass(frozen=True)
class AversionParams:
    """Error aversion: skip probability a_j raised by ``gain``·gap above ``e_min + margin``, decays otherwise."""

    enabled: bool = True
    margin: float = 0.02
    gain: float = 0.5  # a_j settles at the excess error rate (dlb/core/aversion.py: 2.0 herded the fleet)
    decay: float = 0.5
    max: float = 0.9
    period_ms: float = 1000.0

    def to_core(self) -> AversionConfig:
        return AversionConfig(self.enabled, self.margin, self.gain, self.decay, max_rate=self.max, period_s=self.period_ms / 1000.0)


@dataclass(frozen=True)
class AffinityParams:
    """Conditional session affinity keyed by a request header (bounded LRU with TTL)."""

    enabled: bool = False
    header: str = "x-session-id"
    ttl_s: float = 600.0
    max_sessions: int = 100_000
    prefix_savings_ms: float = 0.0

    def to_core(self, cost: Cost) -> AffinityConfig:
        # Savings are a time for every cost: the router compares expected latencies (core/router.py).
        savings = self.prefix_savings_ms / 1000.0
        return AffinityConfig(self.enabled, self.header, self.ttl_s, self.max_sessions, prefix_savings=savings)


@dataclass(frozen=True)
class ShedParams:
    """Early shedding: 429 + ``retry-after`` when every usable cell is saturated (dlb/core/shedding.py)."""

    enabled: bool = True
    fill: float = ShedConfig.fill
    near_fill: float = ShedConfig.near_fill
    min_error_rate: float = ShedConfig.min_error_rate
    max_age_ms: float = ShedConfig.max_age_s * 1000.0
    #: Also shed when every usable cell's model puts the request past the endpoint's ``timeout_s``.
    deadline: bool = ShedConfig.deadline

    def to_core(self, timeout_s: float = 0.0) -> ShedConfig:
        """``timeout_s``: the endpoint's request timeout, the clients' deadline (0: none)."""
        return ShedConfig(self.enabled, self.fill, self.near_fill, self.min_error_rate, self.max_age_ms / 1000.0,
                          deadline=self.deadline, deadline_s=timeout_s if timeout_s > 0 else math.inf)


@dataclass(frozen=True)
class Policy:
    mechanism: Mechanism = Mechanism.DISCRETE
    cost: Cost = Cost.LATENCY
    flow: FlowParams = field(default_factory=FlowParams)
    aversion: AversionParams = field(default_factory=AversionParams)
    affinity: AffinityParams = field(default_factory=AffinityParams)
    shed: ShedParams = field(default_factory=ShedParams)
    #: ``native-discrete``: the discrete mechanism run by the root Envoy itself (its load balancer over the
    #: cells, weights from the control plane's probes; :mod:`dlb.core.native_discrete`).
    native: bool = False
    #: ``native-discrete``'s ``pick`` (:data:`dlb.core.native_discrete.PICKS`).
    native_pick: str = DEFAULT_PICK

    def to_core(self, probe: ProbeParams, timeout_s: float = 0.0) -> PolicyConfig:
        """The routing core's policy object (seconds, its own field names) for this endpoint;
        ``timeout_s``: the endpoint's request timeout (0: none), the deadline shedding compares with."""
        return PolicyConfig(
            mechanism=self.mechanism,
            cost=self.cost,
            flow=self.flow.to_core(),
            aversion=self.aversion.to_core(),
            affinity=self.affinity.to_core(self.cost),
            shed=self.shed.to_core(timeout_s),
            stale_after_s=probe.stale_after_ms / 1000.0,
        )


@dataclass(frozen=True)
class LatencyPrior:
    """Fleet prior of ℓ(N) = a + b·s·softplus((N − c)/s); seconds for a and b, requests for c and s."""

    a_s: float = 1.0
    b_s: float = 0.05
    c: float = 8.0
    s: float = 1.0

    def to_core(self) -> LatencyParams:
        return LatencyParams(a=self.a_s, b=self.b_s, c=self.c, s=self.s)


@dataclass(frozen=True)
class Match:
    """Which requests belong to an endpoint on the root Envoy (first endpoint that matches wins)."""

    prefix: str


@dataclass(frozen=True)
class Endpoint:
    name: str
    match: Match
    policy: Policy = field(default_factory=Policy)
    latency_prior: LatencyPrior = field(default_factory=LatencyPrior)
    #: ``(cell, prior)`` where an operator knows a cell differs (a slower region, older GPUs); others use ``latency_prior``.
    latency_prior_by_cell: tuple[tuple[str, LatencyPrior], ...] = ()
    timeout_s: float = 600.0  # whole-request limit on the root route (0 = none); generation is long
    idle_timeout_s: float = 300.0  # no bytes either way for this long ends the stream


    def prior_for(self, cell: str) -> LatencyPrior:
        """The prior of this endpoint in ``cell``: its own entry in ``latency_prior_by_cell``, else ``latency_prior``."""
        return next((p for c, p in self.latency_prior_by_cell if c == cell), self.latency_prior)

    def cell_priors(self) -> dict[str, LatencyParams]:
        """The routing core's prior of every cell with one of its own."""
        return {c: p.to_core() for c, p in self.latency_prior_by_cell}


@dataclass(frozen=True)
class ProbeParams:
    period_ms: float = 20.0
    timeout_ms: float = 200.0
    stale_after_ms: float = 1000.0
    #: A probe of a dead leaf is one refused connect; 0.5 s keeps a restarted leaf's return to the
    #: roots' view under 1 s (5 s + gRPC's own 5-s reconnect backoff made it 7-8 s, issue 13).
    backoff_max_ms: float = 500.0


#: The policy surface's version (``policy.apiVersion``); a file naming another is refused, not guessed at.
POLICY_API_VERSION = "dlb.v1"
#: The leaf's server-pick rules (``policy.plugins[].type``): tokens waiting (Prequal) or power-of-d on RIF.
PICK_RULES = ("prequal", "rif")
#: What operators run instead of DLB (DESIGN §3), served as Envoy-native root configuration: no root
#: ext_proc, the fail-open route goes to one pool cluster (``lr-global``, ``locality-failover``) or to
#: the weights the control plane sets from its probes (``hub-score``).
OPERATOR_BASELINES = ("lr-global", "locality-failover", "hub-score")
#: The control plane's source of the fail-open weights: the flow routers, or a baseline: the central MNLB LP,
#: Rand (the replica split, never changed) or an operator baseline.
WEIGHT_SOURCES = ("flow-routers", "mnlb", "rand", *OPERATOR_BASELINES)


@dataclass(frozen=True)
class PickParams:
    """Parameters of a leaf pick rule (``prequal`` or ``rif``)."""

    choices: int = 2  # servers probed per pick (power-of-d's d; >= servers = least loaded)


@dataclass(frozen=True)
class LatencyFitParams:
    """The leaf's latency-model fit (``latency-fit``): a shorter window forgets a past slowdown sooner."""

    window_s: float = 60.0
    refit_period_s: float = 5.0


@dataclass(frozen=True)
class BackgroundProbeParams:
    """The leaf's background probe requests on an idle cell (``background-probe``); ``min_interval_ms: 0`` = off."""

    min_interval_ms: float = 1000.0
    max_interval_ms: float = 15000.0
    budget: float = 0.008  # largest share of the cell's request capacity idle probing may use
    max_tokens: int = 16  # tokens each probe generates: shorter than the traffic ends sooner but reads faster than its model
    model: str | None = None  # ``model`` field of the probe request


@dataclass(frozen=True)
class MnlbParams:
    """The MNLB baseline (``mnlb``): the central LP solved every ``period_s`` at utilisation ``rho``."""

    period_s: float = 10.0
    rho: float = 0.85


@dataclass(frozen=True)
class AdmissionParams:
    """The leaf's admission (``admission``): refuse what the picked server would keep past ``fraction`` of
    the endpoints' longest ``timeout_s`` and past ``slowdown`` × its uncongested stay (dlb/core/admission.py)."""

    enabled: bool = AdmissionConfig.enabled
    fraction: float = AdmissionConfig.fraction
    window_s: float = AdmissionConfig.window_s
    min_inflight: int = AdmissionConfig.min_inflight
    slowdown: float = AdmissionConfig.slowdown

    def to_core(self, deadline_s: float = 0.0) -> AdmissionConfig:
        """``deadline_s``: the clients' timeout (0: none, never refuse)."""
        return AdmissionConfig(self.enabled, deadline_s if deadline_s > 0 else math.inf, self.fraction, self.window_s,
                               self.min_inflight, self.slowdown)


def leaf_deadline_s(endpoints: tuple[Endpoint, ...]) -> float:
    """The deadline a leaf's admission compares with: the longest endpoint ``timeout_s`` (0: some endpoint has
    none, or there is no endpoint), so no client is refused a request it would still wait for."""
    t = [ep.timeout_s for ep in endpoints]
    return 0.0 if not t or min(t) <= 0 else max(t)


@dataclass(frozen=True)
class LeafPolicy:
    """Every leaf's routing knobs; served to leaves as ``dlb.v1.LeafPolicy`` and applied live."""

    pick: str = "prequal"  # one of PICK_RULES
    pick_params: PickParams = field(default_factory=PickParams)
    fit: LatencyFitParams = field(default_factory=LatencyFitParams)
    background_probe: BackgroundProbeParams = field(default_factory=BackgroundProbeParams)
    admission: AdmissionParams = field(default_factory=AdmissionParams)


@dataclass(frozen=True)
class DeploymentPolicy:
    """The config's ``policy`` section: the knobs that are not per endpoint (docs/config.md, policy surface)."""

    api_version: str = POLICY_API_VERSION
    leaf: LeafPolicy = field(default_factory=LeafPolicy)
    weights: str = "flow-routers"  # one of WEIGHT_SOURCES
    mnlb: MnlbParams = field(default_factory=MnlbParams)


@dataclass(frozen=True)
class Discovery:
    """Server discovery: a ``servers[].address`` that is a DNS name stands for all of its A/AAAA records."""

    dns_period_s: float = 5.0  # how often the control plane re-resolves server names (and pushes EDS on a change)


@dataclass(frozen=True)
class ControlPlaneAddrs:
    xds: HostPort = HostPort("127.0.0.1", 18000)
    status: HostPort = HostPort("127.0.0.1", 18001)


@dataclass(frozen=True)
class RootAddrs:
    ext_proc: HostPort = HostPort("127.0.0.1", 18080)
    metrics: HostPort = HostPort("127.0.0.1", 19080)
    #: The root Envoy's admin (``dlb up``; loopback only in every bootstrap).
    admin: HostPort = HostPort("127.0.0.1", 19901)


@dataclass(frozen=True)
class Services:
    control_plane: ControlPlaneAddrs = field(default_factory=ControlPlaneAddrs)
    root: RootAddrs = field(default_factory=RootAddrs)


#: The placeholder a ``tls.cert``/``tls.key`` path may hold; each component puts its identity there.
TLS_IDENTITY_PLACEHOLDER = "{identity}"


@dataclass(frozen=True)
class TlsFiles:
    """Optional mutual TLS on DLB's gRPC channels (docs/security.md): PEM file paths, absolute.

    One config serves every component, but each component has its own certificate (its identity is
    what the control plane authorises), so ``cert`` and ``key`` may contain ``{identity}``, replaced
    by ``control-plane``, ``root-<cell>`` or ``leaf-<cell>`` (:func:`dlb.config.tls.identity_name`).
    """

    ca: str  # the CA that signs every DLB component's certificate; peers must chain to it
    cert: str
    key: str
    #: A mounted ``kubernetes.io/tls`` Secret's: the folder of the Envoy SDS files naming these paths
    #: (:func:`dlb.envoy.tls.sds_files`), so Envoys reload a renewal; "": Envoys read the files at start.
    envoy_sds: str = ""

    def cert_for(self, identity: str) -> str:
        return self.cert.replace(TLS_IDENTITY_PLACEHOLDER, identity)

    def key_for(self, identity: str) -> str:
        return self.key.replace(TLS_IDENTITY_PLACEHOLDER, identity)


@dataclass(frozen=True)
class Config:
    version: int
    cells: tuple[Cell, ...]
    network: Network
    endpoints: tuple[Endpoint, ...]
    probe: ProbeParams = field(default_factory=ProbeParams)
    services: Services = field(default_factory=Services)
    tls: TlsFiles | None = None  # None: plaintext gRPC everywhere (the default)
    discovery: Discovery = field(default_factory=Discovery)
    policy: DeploymentPolicy = field(default_factory=DeploymentPolicy)
    #: The shared secret roots send leaves with ``x-dlb-src-cell`` (``root_token_file``); None: one derived
    #: from the config (:func:`dlb.envoy.root_token.root_token`). Kept out of repr so it is never logged.
    root_token: str | None = field(default=None, repr=False)
    #: Where ``root_token`` was read (absolute): Envoys read the token from this file, never from xDS.
    root_token_file: str | None = None
    source: str = "<memory>"  # file the config came from (for messages)

    # -- lookups -------------------------------------------------------------------------------
    @property
    def cell_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cells)

    def leaf_replica(self, name: str, replica: int) -> Config:
        """This config as leaf replica ``replica`` of cell ``name`` sees it: that cell's ``leaf`` is the
        replica's (its Envoy listener, probe, ext_proc and access log), so an agent or a leaf Envoy
        bootstrap built from it is that replica's. Replica 0 is the config itself."""
        cell = self.cell(name)
        reps = cell.leaf.all_replicas()
        if not 0 <= replica < len(reps):
            raise KeyError(f"{self.source}: cell {name!r} has {len(reps)} leaf replica(s) (cells[{cell.index}].leaf.replicas): "
                           f"no replica {replica}")
        if replica == 0:
            return self
        cells = tuple(dataclasses.replace(c, leaf=reps[replica]) if c.name == name else c for c in self.cells)
        # The token is the fleet's, not the view's: a derived one must not change with the replica's addresses.
        return dataclasses.replace(self, cells=cells, root_token=self.root_token or self.derived_root_token())

    def derived_root_token(self) -> str:
        """The root token when ``root_token_file`` is not set: a hash of the cells' addresses (dlb.envoy.root_token)."""
        h = hashlib.sha256(b"dlb-root-token/v1\n")
        for c in self.cells:
            h.update(f"{c.name}\t{c.root.address}\t{c.leaf.address}\t{c.leaf.probe}\n".encode())
        return "derived-" + h.hexdigest()

    def cell(self, name: str) -> Cell:
        for c in self.cells:
            if c.name == name:
                return c
        raise KeyError(f"{self.source}: no cell named {name!r} (cells: {', '.join(self.cell_names)})")

    def endpoint(self, name: str) -> Endpoint:
        for e in self.endpoints:
            if e.name == name:
                return e
        raise KeyError(f"{self.source}: no endpoint named {name!r}")

    def endpoint_for_path(self, path: str) -> Endpoint | None:
        """The endpoint a request path belongs to: first prefix match in file order (as on the root Envoy)."""
        for e in self.endpoints:
            if path.startswith(e.match.prefix):
                return e
        return None

    # -- matrices ------------------------------------------------------------------------------
    def one_way_s(self) -> np.ndarray:
        """τ as an (n, n) float array in seconds (one-way)."""
        return np.asarray(self.network.one_way_ms, dtype=float) / 1000.0

    def allowed_matrix(self) -> np.ndarray:
        return np.asarray(self.network.allowed, dtype=bool)

    def replicas(self) -> np.ndarray:
        return np.asarray([c.replicas for c in self.cells], dtype=float)

    def rtt_ms(self, src: str, dst: str) -> float:
        """Round trip src → dst → src in milliseconds (what WAN emulation delays a request by)."""
        i, j = self.cell(src).index, self.cell(dst).index
        return self.network.one_way_ms[i][j] + self.network.one_way_ms[j][i]

    def allowed_destinations(self, src: str) -> tuple[Cell, ...]:
        i = self.cell(src).index
        return tuple(c for c in self.cells if self.network.allowed[i][c.index])

    def topology(self) -> Topology:
        """The routing core's view of this deployment (replicas, one-way τ in seconds, allowed arcs)."""
        return Topology(names=self.cell_names, replicas=self.replicas(), tau=self.one_way_s(), allowed=self.allowed_matrix())

