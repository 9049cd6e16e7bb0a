"""Check a hand-edited Envoy bootstrap against the DLB config: every mismatch, each with its path.

Why: "configure with Envoy YAML" only holds if a hand-written root or leaf Envoy agrees with the DLB
file its services read. A missing ``cell-<name>`` cluster, an ext_proc filter pointing elsewhere, an
``x-dlb-*`` header a client may set, or a route that never reaches a cell each fail quietly at run
time (traffic by the fail-open weights only, a spoofable cell, 404s). This compares the contract of
:mod:`dlb.envoy.bootstrap` (clusters, ext_proc, internal-only headers, route shape, ports) with the
file, not every setting: tuning (timeouts, buffers, health checks) stays the operator's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlb.config.model import OPERATOR_BASELINES, WILDCARD_HOSTS, Cell, Config, HostPort
from dlb.envoy.bootstrap import (
    HEADER_CELL,
    HEADER_FALLBACK,
    HEADER_ROOT_TOKEN,
    HEADER_SRC_CELL,
    INTERNAL_HEADERS,
    LEAF_INTERNAL_HEADERS,
    LEAF_PICKED_CLUSTER,
    LEAF_SERVERS_CLUSTER,
    READY_LISTENER,
    aggregate_cells,
    fallback_cluster_name,
    leaf_prefixes,
    root_has_ext_proc,
)
from dlb.envoy.contract import LEAF_AGENT_CLUSTER
from dlb.envoy.operator_pool import POOL_CLUSTER, POOL_KINDS
from dlb.envoy.root_token import SECRET, TOKEN_CHECK, TOKEN_FILTER

EXT_PROC = "envoy.filters.http.ext_proc"
EXT_PROC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
ROUTER = "envoy.filters.http.router"
HCM = "envoy.filters.network.http_connection_manager"
ROLES = {"dlb-root": "root", "dlb-leaf": "leaf"}


@dataclass(frozen=True)
class Mismatch:
    """One way the Envoy file disagrees with the DLB config."""

    path: str  # in the Envoy file, e.g. ``static_resources.clusters[2].load_assignment``
    reason: str

    def __str__(self) -> str:
        return f"{self.path or '(document)'}: {self.reason}"


def _get(d: Any, *keys: str | int) -> Any:
    for k in keys:
        if isinstance(k, int):
            d = d[k] if isinstance(d, list) and -len(d) <= k < len(d) else None
        else:
            d = d.get(k) if isinstance(d, dict) else None
    return d


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _ext_proc_filters(hcm: dict[str, Any]) -> list[tuple[int, Any]]:
    """The ext_proc filters of an HTTP connection manager, with their index in its filter chain."""
    return [(i, f) for i, f in enumerate(_list(hcm.get("http_filters")))
            if _get(f, "name") == EXT_PROC or _get(f, "typed_config", "@type") == EXT_PROC_TYPE]


def _socket(sa: Any) -> HostPort | None:
    host, port = _get(sa, "address"), _get(sa, "port_value")
    return HostPort(str(host), int(port)) if host is not None and isinstance(port, int) else None


def cluster_addresses(cluster: Any) -> list[HostPort]:
    """Every endpoint address of a static cluster (``load_assignment``)."""
    out = []
    for loc in _list(_get(cluster, "load_assignment", "endpoints")):
        for lb in _list(_get(loc, "lb_endpoints")):
            hp = _socket(_get(lb, "endpoint", "address", "socket_address"))
            if hp is not None:
                out.append(hp)
    return out


class _Check:
    def __init__(self, boot: Any, cfg: Config) -> None:
        self.boot, self.cfg = boot, cfg
        self.out: list[Mismatch] = []
        self.clusters = {c.get("name"): (i, c) for i, c in enumerate(_list(_get(boot, "static_resources", "clusters")))
                         if isinstance(c, dict)}

    def bad(self, path: str, reason: str) -> None:
        self.out.append(Mismatch(path, reason))

    # -- shared parts -------------------------------------------------------------------------------
    def listener(self, name: str) -> tuple[str, dict[str, Any]] | None:
        listeners = [(i, x) for i, x in enumerate(_list(_get(self.boot, "static_resources", "listeners")))
                     if isinstance(x, dict) and x.get("name") != READY_LISTENER]
        for i, x in listeners:
            if x.get("name") == name:
                return f"static_resources.listeners[{i}]", x
        if len(listeners) == 1:
            return f"static_resources.listeners[{listeners[0][0]}]", listeners[0][1]
        if _get(self.boot, "dynamic_resources", "lds_config") is not None or _get(self.boot, "dynamic_resources", "ads_config") is not None:
            return None  # listeners come from the control plane: nothing static to compare
        self.bad("static_resources.listeners", f"no listener {name!r} (the one clients or roots reach)")
        return None

    def hcm(self, lpath: str, listener: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        for ci, chain in enumerate(_list(listener.get("filter_chains"))):
            for fi, f in enumerate(_list(_get(chain, "filters"))):
                if _get(f, "name") == HCM or str(_get(f, "typed_config", "@type")).endswith("HttpConnectionManager"):
                    return f"{lpath}.filter_chains[{ci}].filters[{fi}].typed_config", _get(f, "typed_config") or {}
        self.bad(f"{lpath}.filter_chains", "no http_connection_manager filter")
        return None

    def port(self, lpath: str, listener: dict[str, Any], want: HostPort, what: str) -> None:
        got = _socket(_get(listener, "address", "socket_address"))
        if got is None:
            self.bad(f"{lpath}.address", f"no socket_address; the DLB config has {what} = {want}")
        elif got.port != want.port:
            self.bad(f"{lpath}.address.socket_address.port_value", f"{got.port}, but the DLB config's {what} is {want}")
        elif got.host not in WILDCARD_HOSTS and got.host != want.host:
            self.bad(f"{lpath}.address.socket_address.address", f"{got.host!r} is neither all interfaces nor {want.host} ({what})")

    def internal_headers(self, hpath: str, hcm: dict[str, Any], required: tuple[str, ...]) -> None:
        rc = hcm.get("route_config")
        if rc is None:
            return  # RDS: the control plane's route configuration sets them
        have = {str(h).lower() for h in _list(_get(rc, "internal_only_headers"))}
        missing = [h for h in required if h not in have]
        if missing:
            self.bad(f"{hpath}.route_config.internal_only_headers",
                     f"missing {', '.join(missing)}: a client could set {'it' if len(missing) == 1 else 'them'} "
                     "(internal-only headers are stripped before any filter or route sees them)")
        cidrs = _get(hcm, "internal_address_config", "cidr_ranges")
        if not cidrs:
            self.bad(f"{hpath}.internal_address_config",
                     "unset or empty: Envoy then counts loopback/private peers as internal and keeps their x-dlb-* headers "
                     "(set cidr_ranges: [{address_prefix: 255.255.255.255, prefix_len: 32}])")

    def token_filter(self, hpath: str, hcm: dict[str, Any], name: str, why: str) -> None:
        """The root's token injector / the leaf's token check must be in the HTTP filters (and the secret in the bootstrap)."""
        if not any(_get(f, "name") == name for f in _list(hcm.get("http_filters"))):
            self.bad(f"{hpath}.http_filters", f"no {name} filter: {why} (`dlb config render` writes it)")
        static = _list(_get(self.boot, "static_resources", "secrets"))
        if name == TOKEN_FILTER and not any(_get(s, "name") == SECRET for s in static):
            self.bad("static_resources.secrets", f"no {SECRET!r} secret: the root's {TOKEN_FILTER} filter has no token to add")

    def ext_proc(self, hpath: str, hcm: dict[str, Any], want: HostPort | None, what: str) -> None:
        filters = _list(hcm.get("http_filters"))
        found = _ext_proc_filters(hcm)
        router = next((i for i, f in enumerate(filters) if _get(f, "name") == ROUTER), None)
        if router is None:
            self.bad(f"{hpath}.http_filters", f"no {ROUTER}: nothing is forwarded")
        if want is None:
            if found:
                self.bad(f"{hpath}.http_filters[{found[0][0]}]", f"an ext_proc filter, but the DLB config sets no {what}")
            return
        if not found:
            self.bad(f"{hpath}.http_filters", f"no {EXT_PROC} filter: the DLB config's {what} ({want}) is never asked")
            return
        i, f = found[0]
        fp = f"{hpath}.http_filters[{i}]"
        if router is not None and i > router:
            self.bad(fp, f"after {ROUTER}: the filter never runs")
        if _get(f, "typed_config", "failure_mode_allow") is not True:
            self.bad(f"{fp}.typed_config.failure_mode_allow", "must be true: DLB fails open (a down service must not cause 5xx)")
        name = _get(f, "typed_config", "grpc_service", "envoy_grpc", "cluster_name")
        if name is None:
            self.bad(f"{fp}.typed_config.grpc_service", "needs envoy_grpc.cluster_name (a static cluster)")
        else:
            self.cluster_points_at(name, [want], f"{fp}.typed_config.grpc_service.envoy_grpc.cluster_name", what)

    def cluster_points_at(self, name: str, want: list[HostPort], ref: str, what: str) -> None:
        if name not in self.clusters:
            if _get(self.boot, "dynamic_resources", "cds_config") is None and _get(self.boot, "dynamic_resources", "ads_config") is None:
                self.bad(ref, f"names cluster {name!r}, which is not in static_resources.clusters")
            return
        i, c = self.clusters[name]
        got = cluster_addresses(c)
        if sorted(got) != sorted(want):
            self.bad(f"static_resources.clusters[{i}].load_assignment",
                     f"cluster {name!r} points at {', '.join(map(str, got)) or 'nothing'}; the DLB config's {what} is "
                     f"{', '.join(map(str, want))}")

    # -- root ---------------------------------------------------------------------------------------
    def root(self, cell: Cell) -> None:
        cfg = self.cfg
        found = self.listener("dlb_root")
        if cell.root.address is None:
            self.bad("node.locality.zone", f"cell {cell.name!r} has no root in the DLB config (cells[{cell.index}].root.address)")
        allowed = list(cfg.allowed_destinations(cell.name))
        for d in allowed:
            self.cluster_points_at_or_missing(d)
        allowed_names = {d.cluster_name for d in allowed}
        for cluster, (i, _) in self.clusters.items():
            if not isinstance(cluster, str) or not cluster.startswith("cell-"):
                continue
            for name in aggregate_cells(cluster):
                if name not in allowed_names:
                    known = name.removeprefix("cell-") in cfg.cell_names
                    self.bad(f"static_resources.clusters[{i}]", f"cluster {cluster!r}: " + (
                        f"the DLB config does not allow {cell.name} -> {name.removeprefix('cell-')} (network.allowed)" if known
                        else "no such cell in the DLB config"))
        if found is None:
            return
        lpath, listener = found
        if cell.root.bind is not None:
            self.port(lpath, listener, cell.root.bind, f"cells[{cell.index}].root listener")
        h = self.hcm(lpath, listener)
        if h is None:
            return
        hpath, hcm = h
        self.internal_headers(hpath, hcm, INTERNAL_HEADERS)
        self.token_filter(hpath, hcm, TOKEN_FILTER, "leaves drop this root's x-dlb-src-cell without the token")
        where = f"cells[{cell.index}].root.ext_proc"
        if cfg.policy.weights in OPERATOR_BASELINES:
            for i, _ in _ext_proc_filters(hcm):
                self.bad(f"{hpath}.http_filters[{i}]", f"an ext_proc filter, but policy.weights {cfg.policy.weights} "
                         "is an operator baseline: Envoy alone routes (`dlb config render` writes none)")
        elif root_has_ext_proc(cfg, native_flow=True) or _ext_proc_filters(hcm):
            self.ext_proc(hpath, hcm, cell.root.ext_proc or cfg.services.root.ext_proc, where)
        # else every endpoint runs natively (rendered with --native-flow): no filter is right.
        rc = hcm.get("route_config")
        if rc is not None:
            self.root_headers(f"{hpath}.route_config", rc, cell)
            self.root_routes(f"{hpath}.route_config", rc, allowed_names)

    def cluster_points_at_or_missing(self, d: Cell) -> None:
        if d.cluster_name not in self.clusters:
            if _get(self.boot, "dynamic_resources", "cds_config") is None and _get(self.boot, "dynamic_resources", "ads_config") is None:
                self.bad("static_resources.clusters", f"no cluster {d.cluster_name!r}: requests for cell {d.name} cannot be sent")
            return
        what = f"cells[{d.index}].servers" if d.leaf.source == "vllm" else f"cells[{d.index}].leaf.address"
        self.cluster_points_at(d.cluster_name, [hp for hp, _ in d.upstreams()], "", what)

    def root_headers(self, rpath: str, rc: dict[str, Any], cell: Cell) -> None:
        added = {_get(h, "header", "key"): _get(h, "header", "value") for h in _list(rc.get("request_headers_to_add"))}
        if added.get(HEADER_SRC_CELL) != cell.name:
            self.bad(f"{rpath}.request_headers_to_add", f"must add {HEADER_SRC_CELL}: {cell.name} (leaves count demand and "
                     f"emulate the WAN by it), has {added.get(HEADER_SRC_CELL)!r}")
        if HEADER_ROOT_TOKEN in added:
            self.bad(f"{rpath}.request_headers_to_add", f"{HEADER_ROOT_TOKEN} must not be in the route config (xDS would carry "
                     f"the secret): the {TOKEN_FILTER} filter adds it from the bootstrap's {SECRET!r} secret")

    def root_routes(self, rpath: str, rc: dict[str, Any], allowed: set[str]) -> None:
        cfg = self.cfg
        routes: list[tuple[str, dict[str, Any]]] = []
        for vi, vh in enumerate(_list(rc.get("virtual_hosts"))):
            routes += [(f"{rpath}.virtual_hosts[{vi}].routes[{ri}]", r) for ri, r in enumerate(_list(_get(vh, "routes"))) if isinstance(r, dict)]
        for path, r in routes:
            if _get(r, "route", "cluster_header") is not None:
                self.bad(f"{path}.route.cluster_header", f"route by exact {HEADER_CELL} matches instead: with cluster_header a pick "
                         "naming an unknown or forbidden cell is a 503, not the fail-open weights")
        for ep in cfg.endpoints:
            prefix = ep.match.prefix
            picked: dict[str, int] = {}
            fallback = None
            for k, (path, r) in enumerate(routes):
                if _get(r, "match", "prefix") != prefix:
                    continue
                headers = _list(_get(r, "match", "headers"))
                cell_match = [_get(h, "string_match", "exact") for h in headers if _get(h, "name") == HEADER_CELL]
                fb_match = [_get(h, "string_match", "exact") for h in headers if _get(h, "name") == HEADER_FALLBACK]
                if cell_match:
                    target = _get(r, "route", "cluster")
                    want = fallback_cluster_name(str(cell_match[0]), str(fb_match[0])) if fb_match else cell_match[0]
                    if target != want:
                        self.bad(f"{path}.route.cluster", f"{target!r}, but the route matches {HEADER_CELL} = {cell_match[0]!r}"
                                 + (f" and {HEADER_FALLBACK} = {fb_match[0]!r}" if fb_match else ""))
                    if not fb_match:
                        picked.setdefault(str(cell_match[0]), k)
                elif fallback is None:
                    fallback = k
                    wc = _get(r, "route", "weighted_clusters", "clusters")
                    if cfg.policy.weights in POOL_KINDS:  # an operator baseline: Envoy's one pool of every server
                        if _get(r, "route", "cluster") != POOL_CLUSTER:
                            self.bad(f"{path}.route", f"endpoint {ep.name}'s route must be cluster {POOL_CLUSTER!r} "
                                     f"(policy.weights {cfg.policy.weights}: Envoy's pool of every allowed server)")
                    elif wc is None:
                        self.bad(f"{path}.route", f"endpoint {ep.name}'s fail-open route must use weighted_clusters "
                                 "(the control plane's flow weights replace them over RDS)")
                    for wi, c in enumerate(_list(wc)):  # a cell, or a cell and its fallback (native flow)
                        if not set(aggregate_cells(str(_get(c, "name")))) <= allowed:
                            self.bad(f"{path}.route.weighted_clusters.clusters[{wi}]", f"{_get(c, 'name')!r} is not a cell this root may send to")
            where = f"endpoints[{cfg.endpoints.index(ep)}] ({ep.name}, prefix {prefix})"
            for name in sorted(allowed - set(picked)):
                self.bad(f"{rpath}.virtual_hosts", f"{where}: no route matching {HEADER_CELL} = {name}: the root service's pick "
                         "of that cell is ignored")
            if fallback is None:
                self.bad(f"{rpath}.virtual_hosts", f"{where}: no fail-open route (prefix without {HEADER_CELL}, weighted_clusters)")
            elif any(k > fallback for k in picked.values()):
                self.bad(routes[fallback][0], f"{where}: the fail-open route comes before the per-cell routes, so picks never apply")

    # -- leaf ---------------------------------------------------------------------------------------
    def ready_port(self) -> None:
        """The ready listener on the admin port: Envoy refuses to start ("address already in use")."""
        admin = _get(self.boot, "admin", "address", "socket_address", "port_value")
        for i, listener in enumerate(_list(_get(self.boot, "static_resources", "listeners"))):
            if _get(listener, "name") == READY_LISTENER and admin is not None \
                    and _get(listener, "address", "socket_address", "port_value") == admin:
                self.bad(f"static_resources.listeners[{i}].address.socket_address.port_value",
                         f"{admin} is also admin.address's port: Envoy cannot bind both (`dlb config render --ready-port`)")

    def leaf(self, cell: Cell) -> None:
        want = [a for s in cell.servers for a in s.rank_addresses()]
        if LEAF_SERVERS_CLUSTER in self.clusters:
            self.cluster_points_at(LEAF_SERVERS_CLUSTER, want, "", f"cells[{cell.index}].servers")
        elif _get(self.boot, "dynamic_resources", "cds_config") is None and _get(self.boot, "dynamic_resources", "ads_config") is None:
            self.bad("static_resources.clusters", f"no cluster {LEAF_SERVERS_CLUSTER!r} (the cell's servers)")
        found = self.listener("dlb_leaf")
        if found is None:
            return
        lpath, listener = found
        self.port(lpath, listener, cell.leaf.bind, f"cells[{cell.index}].leaf listener")
        h = self.hcm(lpath, listener)
        if h is None:
            return
        hpath, hcm = h
        self.internal_headers(hpath, hcm, LEAF_INTERNAL_HEADERS)
        self.token_filter(hpath, hcm, TOKEN_CHECK, "any client can claim a source cell here")
        if not any(_get(a, "typed_config", "common_config", "grpc_service", "envoy_grpc", "cluster_name") == LEAF_AGENT_CLUSTER
                   for a in _list(hcm.get("access_log"))):
            self.bad(f"{hpath}.access_log", f"no gRPC access log to cluster {LEAF_AGENT_CLUSTER!r}: the leaf agent never learns a "
                     "request finished, so the cell's requests in flight only grow (`dlb config render` writes it)")
        self.ext_proc(hpath, hcm, cell.leaf.ext_proc, f"cells[{cell.index}].leaf.ext_proc")
        rc = hcm.get("route_config")
        if rc is None:
            return
        routes = [(f"{hpath}.route_config.virtual_hosts[{vi}].routes[{ri}]", r) for vi, vh in enumerate(_list(rc.get("virtual_hosts")))
                  for ri, r in enumerate(_list(_get(vh, "routes")))]
        targets = {LEAF_SERVERS_CLUSTER, LEAF_PICKED_CLUSTER}
        for prefix in leaf_prefixes(self.cfg):
            if not any(_get(r, "match", "prefix") == prefix and _get(r, "route", "cluster") in targets for _, r in routes):
                self.bad(f"{hpath}.route_config.virtual_hosts", f"no route for prefix {prefix} to {LEAF_SERVERS_CLUSTER!r}: "
                         "requests for that endpoint get 404")


def check_bootstrap(boot: Any, cfg: Config, *, role: str | None = None, cell: str | None = None) -> list[Mismatch]:
    """Every mismatch between an Envoy bootstrap (parsed YAML) and ``cfg``; empty when they agree.

    ``role`` (root or leaf) and ``cell`` default to the file's ``node.cluster`` (``dlb-root``/``dlb-leaf``)
    and ``node.locality.zone``, as :mod:`dlb.envoy.bootstrap` writes them.
    """
    if not isinstance(boot, dict):
        return [Mismatch("", "not an Envoy bootstrap (expected a mapping)")]
    role = role or ROLES.get(str(_get(boot, "node", "cluster")))
    if role not in ("root", "leaf"):
        return [Mismatch("node.cluster", f"{_get(boot, 'node', 'cluster')!r}: cannot tell root from leaf (set dlb-root or dlb-leaf, "
                                         "or pass --role)")]
    if cell is not None and cell not in cfg.cell_names:  # the caller's value, not the file's
        return [Mismatch("--cell", f"{cell!r} is not a cell of {cfg.source} (cells: {', '.join(cfg.cell_names)})")]
    cell = cell or _get(boot, "node", "locality", "zone")
    if cell not in cfg.cell_names:
        return [Mismatch("node.locality.zone", f"{cell!r} is not a cell of {cfg.source} (cells: {', '.join(cfg.cell_names)}; "
                                               "or pass --cell)")]
    check = _Check(boot, cfg)
    (check.root if role == "root" else check.leaf)(cfg.cell(str(cell)))
    check.ready_port()
    return check.out
