"""The DLB config schema: each section's checks and the cross-field checks, building a :class:`Config`.

The jobs around it live apart: :mod:`dlb.config.yaml_nodes` reads YAML with line numbers,
:mod:`dlb.config.checker` is the generic field checker, :mod:`dlb.config.tls_check` checks the ``tls``
files, :mod:`dlb.config.hostport` parses addresses, :mod:`dlb.config.policy` resolves the policy plugins and
:mod:`dlb.config.loader` holds the entry points. Checking never stops at the first problem: a bad
field records a problem and yields its default; ``ConfigError`` is raised at the end with all of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from dlb.config.checker import MISSING, Checker, config_dir, fmt, kind, show
from dlb.config.hostport import is_ip, parse_hostport
from dlb.config.model import (
    DP_POLICIES,
    INFERENCE_POOL_GROUPS,
    LEAF_SOURCES,
    Cell,
    Config,
    ControlPlaneAddrs,
    DeploymentPolicy,
    Discovery,
    DpGroup,
    Endpoint,
    HostPort,
    InferencePoolRef,
    LatencyPrior,
    Leaf,
    Match,
    Network,
    ProbeParams,
    Root,
    RootAddrs,
    Server,
    Services,
)
from dlb.config.policy import deployment_policy, endpoint_policy
from dlb.config.problems import ConfigError, Problem
from dlb.config.tls_check import check_tls
from dlb.core.hold_queue import MAX_HOLD_S

CELL_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
ENDPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SUPPORTED_VERSIONS = (1,)
#: A one-way latency above a minute is a unit slip (seconds or µs typed as ms), not a network.
MAX_ONE_WAY_MS = 60_000.0


#: Cross-cell checks (the latency matrix, unique addresses) and prefix shadowing are quadratic in these.
MAX_CELLS = 256
MAX_ENDPOINTS = 256


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def _cells(ck: Checker, raw: Any) -> list[Cell]:
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(ck.sequence(raw, "cells", required=True, nonempty=True, max_len=MAX_CELLS)):
        p = f"cells[{i}]"
        # A GIE cell's servers are its pool's, which its endpoint picker counts (ready pods): listing them is optional.
        m = ck.mapping(item, p, ("name", "replicas", "leaf", "servers", "root", "inference_pool"), required=("name", "leaf"))
        name = ck.string(m, "name", p, None, pattern=CELL_NAME_RE, what="a cell name (^[a-z][a-z0-9-]{0,62}$)")
        if name:
            if name in seen:
                ck.err(f"{p}.name", f"duplicate cell name {name!r} (also {seen[name]})")
            seen.setdefault(name, p)
        lp = f"{p}.leaf"
        known = _source(ck, m.get("leaf"), lp)
        source = known or "dlb"  # what the rest is built as; checks that depend on the source need it known
        lm = ck.mapping(m.get("leaf"), lp, ("source", "address", "probe", "ext_proc", "listen", "access_log", "replicas"),
                        required=LEAF_REQUIRED[known] if "leaf" in m and known else ())
        for key in ("ext_proc", "listen", "access_log", "replicas") if source != "dlb" else ():
            if key in lm:
                ck.err(f"{lp}.{key}", f"a {source} cell has no DLB leaf: {key} applies only to source: dlb")
        pool = _inference_pool(ck, m, p, source)
        if isinstance(item, dict) and "servers" not in m and pool is None and known not in (None, "gie"):  # not a mapping: said once
            ck.err(f"{p}.servers", "required (or inference_pool: the Kubernetes InferencePool whose ready pods are the servers)")
        servers: list[Server] = []
        for k, s in enumerate(ck.sequence(m.get("servers"), f"{p}.servers", nonempty="servers" in m)):
            sp = f"{p}.servers[{k}]"
            # shorthand: a bare "host:port"
            sm = ck.mapping({"address": s} if isinstance(s, str) else s, sp, ("address", "weight", *_DP_KEYS), required=("address",))
            addr = ck.hostport(sm, "address", sp, None)
            weight = ck.number(sm, "weight", sp, 1, ge=1, le=1_000_000, integer=True)
            servers.append(Server(addr or HostPort("invalid", 1), weight, _dp_group(ck, sm, sp, addr)))
        # A vllm cell's requests go to its servers (Cell.upstreams); its leaf address only names the first.
        first = servers[0].address if servers and source == "vllm" else HostPort("invalid", 1)
        leaf = Leaf(
            address=ck.hostport(lm, "address", lp, None) or first,
            probe=ck.hostport(lm, "probe", lp, None) or first,
            ext_proc=ck.hostport(lm, "ext_proc", lp, None),
            listen=_listen(ck, lm, lp),
            access_log=_access_log(ck, lm, lp),
            source=source,
            replicas=_leaf_replicas(ck, lm, lp) if source == "dlb" and lm.get("replicas") != "dns" else (),
            replicas_dns=source == "dlb" and _replicas_dns(ck, lm, lp),
        )
        replicas = ck.number(m, "replicas", p, max(len(servers), 1), ge=1, integer=True)
        rp = f"{p}.root"
        rm = ck.mapping(m.get("root"), rp, ("address", "ext_proc", "listen"))
        root = Root(address=ck.hostport(rm, "address", rp, None), ext_proc=ck.hostport(rm, "ext_proc", rp, None),
                    listen=_listen(ck, rm, rp))
        if root.listen is not None and "address" not in rm:
            ck.err(f"{rp}.listen", "needs root.address (the address this cell's clients reach the root at)")
        # An invalid name becomes "" so the network checks below skip it instead of adding noise.
        cells.append(Cell(name=name or "", index=i, replicas=replicas, leaf=leaf, servers=tuple(servers), root=root,
                          replicas_auto="replicas" not in m, inference_pool=pool))
    _unique_addresses(ck, cells)
    return cells


#: Kubernetes object names: a DNS subdomain (253 at most), and a namespace: a DNS label (63 at most).
K8S_NAME_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
K8S_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _inference_pool(ck: Checker, m: dict[str, Any], p: str, source: str) -> InferencePoolRef | None:
    """``cells[].inference_pool``: the servers are this InferencePool's ready pods (``dlb serve epp`` follows it)."""
    if "inference_pool" not in m:
        return None
    ip = f"{p}.inference_pool"
    if source != "dlb":
        ck.err(ip, f"a {source} cell's servers are not DLB's to pick: inference_pool applies only to source: dlb")
    if "servers" in m:
        ck.err(ip, "set servers or inference_pool, not both: the pool's ready pods are the servers")
    im = ck.mapping(m["inference_pool"], ip, ("name", "namespace", "group"), required=("name",))
    name = ck.string(im, "name", ip, None, pattern=K8S_NAME_RE, what="a Kubernetes object name (lower-case DNS subdomain)")
    namespace = ck.string(im, "namespace", ip, None, pattern=K8S_NAMESPACE_RE, what="a Kubernetes namespace (lower-case DNS label)")
    group = ck.string(im, "group", ip, "inference.networking.k8s.io")
    if group not in INFERENCE_POOL_GROUPS:
        ck.err(f"{ip}.group", f"{show(group)} is not one of: {', '.join(INFERENCE_POOL_GROUPS)}")
    return InferencePoolRef(name, namespace, group) if name else None


#: Leaf replicas per cell at most (each is probed by every root every probe period).
MAX_LEAF_REPLICAS = 16


def _replicas_dns(ck: Checker, lm: dict[str, Any], lp: str) -> bool:
    """``leaf.replicas: dns``: the replicas are the addresses of ``leaf.probe``'s name, which must be a name."""
    if lm.get("replicas") != "dns":
        return False
    probe = parse_hostport(lm.get("probe")) if isinstance(lm.get("probe"), str) else None
    if probe is not None and is_ip(probe.host):
        ck.err(f"{lp}.replicas", f"dns: leaf.probe {probe} is an IP address, not a name whose addresses are the replicas")
    return True


def _leaf_replicas(ck: Checker, lm: dict[str, Any], lp: str) -> tuple[Leaf, ...]:
    """``leaf.replicas``: the further leaf replicas of a cell, each with its own Envoy listener and agent
    addresses (``ext_proc`` exactly when the leaf has one: each replica's Envoy asks its own agent)."""
    out = []
    if isinstance(lm.get("replicas"), str):
        ck.err(f"{lp}.replicas", f"{show(lm['replicas'])}: must be a list of {{address, probe}} or dns")
        return ()
    for k, item in enumerate(ck.sequence(lm.get("replicas"), f"{lp}.replicas", max_len=MAX_LEAF_REPLICAS - 1)):
        rp = f"{lp}.replicas[{k}]"
        rm = ck.mapping(item, rp, ("address", "probe", "ext_proc", "listen", "access_log"),
                        required=("address", "probe", "ext_proc") if "ext_proc" in lm else ("address", "probe"))
        if "ext_proc" in rm and "ext_proc" not in lm:
            ck.err(f"{rp}.ext_proc", "set only when leaf.ext_proc is: every replica picks servers the same way")
        out.append(Leaf(address=ck.hostport(rm, "address", rp, None) or HostPort("invalid", 1),
                        probe=ck.hostport(rm, "probe", rp, None) or HostPort("invalid", 1),
                        ext_proc=ck.hostport(rm, "ext_proc", rp, None) if "ext_proc" in lm else None,
                        listen=_listen(ck, rm, rp), access_log=_access_log(ck, rm, rp)))
    return tuple(out)


#: The leaf fields each probe source needs (dlb.probe.foreign): a vllm cell is reached and probed at its servers.
LEAF_REQUIRED: dict[str, tuple[str, ...]] = {"dlb": ("address", "probe"), "vllm": (), "gie": ("address", "probe")}


def _source(ck: Checker, raw: Any, path: str) -> str | None:
    """``leaf.source``: what answers the roots' probes (``dlb`` unless set); None when it is not known, so the
    checks that depend on it stay silent: a mistyped ``GIE`` or ``sourse:`` also drew "address: required" and
    "servers: required", which belong to another source than the one meant."""
    if isinstance(raw, dict) and "source" not in raw and any(
            difflib.get_close_matches(str(k), ["source"], n=1, cutoff=0.8) for k in raw):
        return None  # the key itself is mistyped (reported as an unknown key, with the suggestion)
    v = raw.get("source", "dlb") if isinstance(raw, dict) else "dlb"
    if v not in LEAF_SOURCES:
        ck.err(f"{path}.source", f"{show(v)} is not one of: {', '.join(LEAF_SOURCES)}")
        return None
    return str(v)


def _access_log(ck: Checker, m: dict[str, Any], path: str) -> str | None:
    """``unix:/absolute/path`` or a loopback host:port: only the cell's own Envoy may reach the access log."""
    v = ck.string(m, "access_log", path, None)
    if v is None:
        return None
    p = f"{path}.access_log"
    if v.startswith("unix:"):
        if not v[5:].startswith("/") or len(v) - 5 > 100:
            ck.err(p, f"{show(v)}: a Unix socket needs an absolute path of at most 100 characters")
            return None
        return v
    hp = parse_hostport(v)
    if hp is None:
        ck.err(p, f"{show(v)} is neither unix:/path nor host:port")
        return None
    if not hp.loopback:
        ck.err(p, f"{hp.host} is not a loopback address: anyone who reaches the access log can steer the cell")
        return None
    return v


def _listen(ck: Checker, m: dict[str, Any], path: str) -> HostPort | None:
    """Optional bind address of an Envoy listener: an IP (``0.0.0.0``, ``::`` or one interface), never a name."""
    hp = ck.hostport(m, "listen", path, None)
    if hp is not None and not is_ip(hp.host):
        ck.err(f"{path}.listen", f"{hp.host!r} is not an IP address: a listener binds an interface (0.0.0.0 for all)")
        return None
    return hp


_DP_KEYS = ("dp_ranks", "policy", "horizon", "mean_decode_tokens", "max_num_seqs", "hold_queue", "hold_deadline_ms",
            "hold_early")


def _dp_group(ck: Checker, m: dict[str, Any], path: str, addr: HostPort | None) -> DpGroup | None:
    """``dp_ranks`` (> 1 makes a DP server) and the rank policy's settings, which need it."""
    ranks = ck.number(m, "dp_ranks", path, 1, ge=1, le=4096, integer=True)
    if ranks == 1:
        for k in _DP_KEYS[1:]:
            if k in m:
                ck.err(f"{path}.{k}", "only applies to a data-parallel server: set dp_ranks > 1")
        return None
    policy = ck.string(m, "policy", path, "bf-io")
    if policy not in DP_POLICIES:
        ck.err(f"{path}.policy", f"{policy!r} is not one of: {', '.join(DP_POLICIES)}")
        policy = "bf-io"
    horizon = ck.number(m, "horizon", path, 10, ge=0, le=10_000, integer=True)
    mean = ck.number(m, "mean_decode_tokens", path, 256.0, ge=1)
    slots = ck.number(m, "max_num_seqs", path, 0, ge=0, integer=True)
    hold = ck.number(m, "hold_queue", path, 0, ge=0, le=100_000, integer=True)
    # Under the leaf Envoy's ext_proc max_message_timeout (dlb.core.hold_queue.MAX_HOLD_S).
    deadline = ck.number(m, "hold_deadline_ms", path, 5000.0, ge=1, le=MAX_HOLD_S * 1000)
    early = ck.number(m, "hold_early", path, DpGroup.hold_early, ge=0, le=0.99)
    if "hold_early" in m and (policy != "bf-io" or hold == 0):
        ck.err(f"{path}.hold_early", "only applies to policy bf-io with hold_queue > 0 (it sets when BF-IO starts holding)")
    if addr is not None and addr.port + ranks - 1 > 65535:
        ck.err(f"{path}.dp_ranks", f"ranks listen on ports {addr.port}..{addr.port + ranks - 1}: past 65535")
    return DpGroup(ranks=ranks, policy=policy, horizon=horizon, mean_decode_tokens=mean, max_num_seqs=slots,
                   hold_queue=hold, hold_deadline_ms=deadline, hold_early=early)


def _cell_addresses(cells: list[Cell]) -> list[tuple[str, HostPort]]:
    """Every (field path, address) the cells' own listeners take, in file order."""
    out: list[tuple[str, HostPort]] = []
    for c in cells:
        p = f"cells[{c.index}]"
        uses = [(f"{p}.leaf.address", c.leaf.address), (f"{p}.leaf.probe", c.leaf.probe), (f"{p}.leaf.ext_proc", c.leaf.ext_proc)]
        uses += [(f"{p}.leaf.replicas[{k}].{key}", getattr(r, key)) for k, r in enumerate(c.leaf.replicas)
                 for key in ("address", "probe", "ext_proc")]
        if c.leaf.source == "vllm":
            uses = []  # its leaf names its first server (its own, not a listener of ours)
        # A DP server's ranks r > 0 sit on the following ports; a clash is reported on its dp_ranks.
        uses += [(f"{p}.servers[{k}]." + ("dp_ranks" if r else "address"), a)
                 for k, s in enumerate(c.servers) for r, a in enumerate(s.rank_addresses())]  # fmt: skip
        uses += [(f"{p}.root.address", c.root.address)]
        out += [(path, hp) for path, hp in uses if hp is not None and hp.host != "invalid"]
    return out


def _unique_addresses(ck: Checker, cells: list[Cell]) -> None:
    """Two things cannot listen on one address; a copy-paste slip here makes a confusing testbed."""
    owner: dict[HostPort, str] = {}
    for path, hp in _cell_addresses(cells):
        if hp in owner:
            ck.err(path, f"address {hp} is also used by {owner[hp]}")
        else:
            owner[hp] = path


def _services_apart(ck: Checker, services: Services, cells: list[Cell], raw: Any) -> None:
    """No cell listener on the control plane's addresses (given in ``raw``, the file's ``services``, or
    default): a root there reported ready while its Envoy had NACKed the listener, its readiness connect
    answered by the xDS server."""
    cp = services.control_plane
    given = raw.get("control_plane") if isinstance(raw, dict) else None
    mine = {cp.xds: "xds", cp.status: "status"}
    for path, hp in _cell_addresses(cells):
        if hp in mine:
            key = mine[hp]
            default = "" if isinstance(given, dict) and key in given else " (its default)"
            ck.err(path, f"address {hp} is also used by services.control_plane.{key}{default}")


def _network(ck: Checker, raw: Any, cells: list[Cell]) -> Network:
    n = len(cells)
    index: dict[str, int] = {}
    for c in cells:  # first cell of each valid name; invalid/duplicate ones were reported already
        if c.name:
            index.setdefault(c.name, c.index)
    good = set(index.values())
    m = ck.mapping(raw, "network", ("one_way_ms", "symmetric", "default_one_way_ms", "allowed"))
    symmetric = ck.boolean(m, "symmetric", "network", True)
    default = ck.number(m, "default_one_way_ms", "network", None, ge=0, le=MAX_ONE_WAY_MS)

    given: dict[tuple[int, int], tuple[float, str]] = {}
    ow = ck.mapping(m.get("one_way_ms"), "network.one_way_ms", index.keys(), unknown="not a cell")
    for src, row in ow.items():
        rp = f"network.one_way_ms.{src}"
        rowm = ck.mapping(row, rp, index.keys(), unknown="not a cell")
        for dst in rowm:
            if rowm[dst] is None:
                ck.err(f"{rp}.{dst}", "must be a number (milliseconds), got null")
            v = ck.number(rowm, dst, rp, None, ge=0, le=MAX_ONE_WAY_MS)
            # A bad value was reported above; count the pair as given so it is not also "missing".
            given[(index[src], index[dst])] = (0.0 if v is None else v, f"{rp}.{dst}")

    tau = [[math.nan] * n for _ in range(n)]
    for (i, j), (v, _) in given.items():
        tau[i][j] = v
    if symmetric:
        for (i, j), (v, path) in given.items():
            if (j, i) in given and given[(j, i)][0] != v and i < j:
                ck.err(path, f"{fmt(v)} differs from {given[(j, i)][1]} = {fmt(given[(j, i)][0])} while network.symmetric is true")
            elif (j, i) not in given:
                tau[j][i] = v
    missing: list[str] = []
    for i in range(n):
        if math.isnan(tau[i][i]):
            tau[i][i] = 0.0
        for j in range(n):
            if not math.isnan(tau[i][j]):
                continue
            if default is not None:
                tau[i][j] = default
            elif i in good and j in good and not (symmetric and j < i):  # a symmetric pair is reported once
                missing.append(f"{cells[i].name} {'<->' if symmetric else '->'} {cells[j].name}")
            tau[i][j] = tau[i][j] if not math.isnan(tau[i][j]) else 0.0
    if missing and n > 1:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        ck.err("network.one_way_ms", f"no latency for {shown} (give them, or set network.default_one_way_ms)")

    allowed = [[True] * n for _ in range(n)]
    am = ck.mapping(m.get("allowed"), "network.allowed", index.keys(), unknown="not a cell")
    for src, dsts in am.items():
        ap = f"network.allowed.{src}"
        lst = ck.sequence(dsts, ap, required=True, nonempty=True)
        if not lst:
            continue
        row = [False] * n
        for k, d in enumerate(lst):
            if not isinstance(d, str) or d not in index:
                ck.err(f"{ap}[{k}]", f"{show(d)} is not a cell (cells: {', '.join(c for c in index if c)})")
            elif row[index[d]]:
                ck.err(f"{ap}[{k}]", f"{d!r} listed twice")
            else:
                row[index[d]] = True
        if any(row):
            allowed[index[src]] = row
    return Network(one_way_ms=tuple(tuple(r) for r in tau), allowed=tuple(tuple(r) for r in allowed))


def _prior(ck: Checker, raw: Any, path: str, d: LatencyPrior | None = None) -> LatencyPrior:
    """A latency prior; fields left out take ``d``'s (the endpoint's own prior, for a per-cell one)."""
    m = ck.mapping(raw, path, ("a_s", "b_s", "c", "s"))
    d = d or LatencyPrior()
    prior = LatencyPrior(
        a_s=ck.number(m, "a_s", path, d.a_s, gt=0),
        b_s=ck.number(m, "b_s", path, d.b_s, gt=0),
        c=ck.number(m, "c", path, d.c, ge=0),
        s=ck.number(m, "s", path, d.s, gt=0),
    )
    # μ(N) = N/ℓ(N) must keep increasing past the knee, which needs c < a/b (docs/design.md §3, latency model).
    if prior.c >= prior.a_s / prior.b_s:
        # Blame what the file gave here: a per-cell prior's a_s may make the c it inherits too large.
        given = [k for k in ("a_s", "b_s") if k in m]
        blamed = "c" if "c" in m or not given else given[-1]
        inherited = ", ".join(f"{k}={fmt(getattr(prior, k))}" for k in ("a_s", "b_s", "c") if k not in m)
        ck.err(f"{path}.{blamed}",
               f"knee c={fmt(prior.c)} must be below a_s/b_s={fmt(prior.a_s / prior.b_s)} (else throughput falls as load grows)"
               + (f"; not given here: {inherited}" if inherited else ""))
    return prior


def _priors_by_cell(ck: Checker, raw: Any, path: str, base: LatencyPrior, cells: Sequence[str]) -> tuple[tuple[str, LatencyPrior], ...]:
    """``{cell: prior}``: a cell's own prior of this endpoint; each field defaults to the endpoint's ``latency_prior``."""
    if raw is None or raw is MISSING:
        return ()
    if not isinstance(raw, dict):
        ck.err(path, f"must be a mapping of cell name to latency prior, got {kind(raw)}")
        return ()
    out = []
    for cell, value in raw.items():
        p = f"{path}.{cell}"
        if str(cell) not in cells:
            ck.err(p, f"{show(cell)} is not a cell (cells: {', '.join(dict.fromkeys(c for c in cells if c))})")
        else:
            out.append((str(cell), _prior(ck, value, p, base)))
    return tuple(out)


def _endpoints(ck: Checker, raw: Any, cells: Sequence[str] = ()) -> list[Endpoint]:
    out: list[Endpoint] = []
    names: dict[str, str] = {}
    prefixes: list[tuple[str, str]] = []
    keys = ("name", "match", "policy", "latency_prior", "latency_prior_by_cell", "timeout_s", "idle_timeout_s")
    for i, item in enumerate(ck.sequence(raw, "endpoints", required=True, nonempty=True, max_len=MAX_ENDPOINTS)):
        p = f"endpoints[{i}]"
        m = ck.mapping(item, p, keys, required=("name", "match"))
        name = ck.string(m, "name", p, None, pattern=ENDPOINT_NAME_RE, what="an endpoint name (^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$)")
        name = name or f"invalid-{i}"
        if name in names:
            ck.err(f"{p}.name", f"duplicate endpoint name {name!r} (also {names[name]})")
        names.setdefault(name, p)
        mp = f"{p}.match"
        mm = ck.mapping(m.get("match"), mp, ("prefix",), required=("prefix",) if "match" in m else ())
        prefix = ck.string(mm, "prefix", mp, None)
        if prefix is not None and not prefix.startswith("/"):
            ck.err(f"{mp}.prefix", f"{prefix!r} must start with '/'")
        elif prefix is not None:
            for other, opath in prefixes:
                if prefix.startswith(other):
                    ck.err(f"{mp}.prefix", f"{prefix!r} never matches: {opath} = {other!r} comes first and matches all of it")
                    break
            prefixes.append((prefix, f"{mp}.prefix"))
        out.append(
            Endpoint(
                name=name,
                match=Match(prefix or "/"),
                policy=endpoint_policy(ck, m.get("policy"), f"{p}.policy"),
                latency_prior=(prior := _prior(ck, m.get("latency_prior"), f"{p}.latency_prior")),
                latency_prior_by_cell=_priors_by_cell(ck, m.get("latency_prior_by_cell"), f"{p}.latency_prior_by_cell", prior, cells),
                timeout_s=ck.timeout(m, "timeout_s", p, Endpoint.timeout_s),
                idle_timeout_s=ck.timeout(m, "idle_timeout_s", p, Endpoint.idle_timeout_s),
            )
        )
    return out


def _probe(ck: Checker, raw: Any) -> ProbeParams:
    m = ck.mapping(raw, "probe", ("period_ms", "timeout_ms", "stale_after_ms", "backoff_max_ms"))
    d = ProbeParams()
    period = ck.number(m, "period_ms", "probe", d.period_ms, gt=0)
    out = ProbeParams(
        period_ms=period,
        timeout_ms=ck.number(m, "timeout_ms", "probe", d.timeout_ms, gt=0),
        stale_after_ms=ck.number(m, "stale_after_ms", "probe", d.stale_after_ms, gt=0),
        backoff_max_ms=ck.number(m, "backoff_max_ms", "probe", d.backoff_max_ms, gt=0),
    )
    if out.stale_after_ms <= out.period_ms:
        ck.err("probe.stale_after_ms", f"{fmt(out.stale_after_ms)} must exceed probe.period_ms={fmt(out.period_ms)} (else every state is stale)")
    if out.backoff_max_ms < out.period_ms:
        ck.err("probe.backoff_max_ms", f"{fmt(out.backoff_max_ms)} must be >= probe.period_ms={fmt(out.period_ms)}")
    return out


def _services(ck: Checker, raw: Any) -> Services:
    m = ck.mapping(raw, "services", ("control_plane", "root"))
    cm = ck.mapping(m.get("control_plane"), "services.control_plane", ("xds", "status"))
    rm = ck.mapping(m.get("root"), "services.root", ("ext_proc", "metrics", "admin"))
    dc, dr = ControlPlaneAddrs(), RootAddrs()
    return Services(
        control_plane=ControlPlaneAddrs(
            xds=ck.hostport(cm, "xds", "services.control_plane", dc.xds) or dc.xds,
            status=ck.hostport(cm, "status", "services.control_plane", dc.status) or dc.status,
        ),
        root=RootAddrs(
            ext_proc=ck.hostport(rm, "ext_proc", "services.root", dr.ext_proc) or dr.ext_proc,
            metrics=ck.hostport(rm, "metrics", "services.root", dr.metrics) or dr.metrics,
            admin=ck.hostport(rm, "admin", "services.root", dr.admin) or dr.admin,
        ),
    )



# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

def _discovery(ck: Checker, raw: Any) -> Discovery:
    m = ck.mapping(raw, "discovery", ("dns_period_s",))
    # At least 0.1 s: a tighter loop would resolve faster than any DNS TTL changes, on every name.
    return Discovery(dns_period_s=ck.number(m, "dns_period_s", "discovery", Discovery().dns_period_s, ge=0.1, le=3600))


#: A root token: printable ASCII without spaces (an HTTP header value Envoy matches exactly), 16-256 bytes.
_TOKEN = re.compile(r"^[!-~]{16,256}$")


def _root_token(ck: Checker, raw: Any, source: str) -> tuple[str, str] | None:
    """``root_token_file: PATH``: the file holds the secret roots prove themselves to leaves with.

    The secret is read here (one line, surrounding whitespace dropped) so a bad file is a problem report
    at load time, not a leaf that silently trusts no root. Relative paths are from the config's folder.
    Returns the token and the file's absolute path (Envoys read it themselves).
    """
    if not isinstance(raw, str) or not raw:
        ck.err("root_token_file", "must be a file path")
        return None
    base = config_dir(source)
    path = os.path.abspath(os.path.join(base, os.path.expanduser(raw)))
    try:
        with open(path, "rb") as fh:
            data = fh.read(4097)
    except OSError as exc:
        ck.err("root_token_file", f"{path}: cannot read: {exc.strerror or exc}")
        return None
    token = data.decode("ascii", "replace").strip()
    if not _TOKEN.match(token):
        ck.err("root_token_file", f"{path}: must hold one token of 16-256 printable ASCII characters without spaces")
        return None
    return token, path


#: The root token file when the config names none: ``dlb up`` generates one per run and sets this for
#: every process it starts, so a config without ``root_token_file`` still gets a secret no reader can forge.
ROOT_TOKEN_ENV = "DLB_ROOT_TOKEN_FILE"

#: A folder of certificates ``dlb up`` made for this run (``ca.pem``, ``{identity}.pem``,
#: ``{identity}-key.pem``): the ``tls`` section when the config has none.
TLS_DIR_ENV = "DLB_TLS_DIR"


#: A mounted ``kubernetes.io/tls`` Secret (what cert-manager writes: ``ca.crt``, ``tls.crt``, ``tls.key``):
#: the ``tls`` section when the config has none. One certificate per pod, so no ``{identity}`` in its paths.
TLS_SECRET_DIR_ENV = "DLB_TLS_SECRET_DIR"


def secret_dir_tls(folder: str) -> dict[str, str]:
    """The ``tls`` section of a pod that mounts its own ``kubernetes.io/tls`` Secret at ``folder``."""
    return {"ca": os.path.join(folder, "ca.crt"), "cert": os.path.join(folder, "tls.crt"), "key": os.path.join(folder, "tls.key")}


def secret_dir_sds(folder: str) -> str:
    """Where the Envoys of a pod that mounts its Secret at ``folder`` find their SDS files (a ConfigMap)."""
    return os.path.normpath(folder) + "-sds"


def _tls_from_env() -> dict[str, str] | None:
    secret = os.environ.get(TLS_SECRET_DIR_ENV)
    if secret:
        return secret_dir_tls(secret)
    folder = os.environ.get(TLS_DIR_ENV)
    if not folder:
        return None
    return {"ca": os.path.join(folder, "ca.pem"), "cert": os.path.join(folder, "{identity}.pem"),
            "key": os.path.join(folder, "{identity}-key.pem")}


TOP_KEYS = ("version", "cells", "network", "endpoints", "policy", "probe", "services", "tls", "discovery", "root_token_file")


def build(data: Any, source: str, marks: dict[str, int], problems: list[Problem]) -> Config:
    """Check plain data (``marks``: field path -> line) and build the Config; raises ConfigError with every problem."""
    ck = Checker(source, marks, problems)
    if data is None and not problems:
        ck.err("", "empty file: expected a mapping with version, cells, endpoints")
    top = ck.mapping(data, "", TOP_KEYS, required=("version", "cells", "endpoints") if isinstance(data, dict) else ())
    version = ck.number(top, "version", "", 1, integer=True)
    if "version" in top and version not in SUPPORTED_VERSIONS and isinstance(top.get("version"), int):
        ck.err("version", f"unsupported version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    cells = _cells(ck, top.get("cells")) if "cells" in top else []
    network = _network(ck, top.get("network"), cells)
    endpoints = _endpoints(ck, top.get("endpoints"), [c.name for c in cells]) if "endpoints" in top else []
    policy = deployment_policy(ck, top.get("policy")) if "policy" in top else DeploymentPolicy()
    probe = _probe(ck, top.get("probe"))
    services = _services(ck, top.get("services"))
    _services_apart(ck, services, cells, top.get("services"))
    tls_raw = top.get("tls", _tls_from_env())
    tls = check_tls(ck, tls_raw, source) if tls_raw is not None else None
    if tls is not None and "tls" not in top and os.environ.get(TLS_SECRET_DIR_ENV):
        tls = dataclasses.replace(tls, envoy_sds=secret_dir_sds(os.environ[TLS_SECRET_DIR_ENV]))
    discovery = _discovery(ck, top.get("discovery"))
    token_file = top.get("root_token_file", os.environ.get(ROOT_TOKEN_ENV))
    token = _root_token(ck, token_file, source) if token_file is not None else None
    if problems:
        raise ConfigError(sorted(problems, key=lambda pr: pr.line or 0))  # stable: file order, then check order
    return Config(version=version, cells=tuple(cells), network=network, endpoints=tuple(endpoints), probe=probe, services=services, tls=tls,
                  discovery=discovery, policy=policy, root_token=token[0] if token else None,
                  root_token_file=token[1] if token else None, source=source)
