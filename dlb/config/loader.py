"""Parse and check a DLB config file, reporting every problem at once.

Why a hand-written checker rather than a schema library: we want one message per problem with the
file, the line, the field path and a reason a person can act on (``dlb.yaml:12: cells[1].leaf.probe:
'localhost' is not host:port``), unknown keys reported (typos must never be silently ignored), duplicate
YAML keys caught (PyYAML silently keeps the last one), and cross-field checks (latency pairs, arcs,
shadowed prefixes) in the same list. The YAML is composed into nodes first so each path keeps the line
it came from. Checking never stops at the first problem: a bad field records a problem and yields its
default so the rest of the file is still checked; ``ConfigError`` is raised at the end with all of them.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import yaml

from dlb.config.model import (
    DP_POLICIES,
    TLS_IDENTITY_PLACEHOLDER,
    AffinityParams,
    AversionParams,
    Cell,
    Config,
    ControlPlaneAddrs,
    Cost,
    Discovery,
    DpGroup,
    Endpoint,
    FlowParams,
    HostPort,
    LatencyPrior,
    Leaf,
    Match,
    Mechanism,
    Network,
    Policy,
    ProbeParams,
    Root,
    RootAddrs,
    Server,
    Services,
    TlsFiles,
)
from dlb.errors import DlbError

CELL_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
ENDPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
HEADER_NAME_RE = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")  # RFC 9110 token, lower case (HTTP/2 form)
HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
SUPPORTED_VERSIONS = (1,)
#: A one-way latency above a minute is a unit slip (seconds or µs typed as ms), not a network.
MAX_ONE_WAY_MS = 60_000.0

E = TypeVar("E", bound=Enum)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file."""

    file: str
    path: str  # field path, e.g. ``cells[1].leaf.probe``; "" for the whole document
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path or '(document)'}: {self.reason}"


class ConfigError(DlbError, ValueError):
    """An invalid config; ``problems`` lists every problem found (services refuse to start on it)."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: tuple[Problem, ...] = tuple(problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in config:\n" + "\n".join(str(p) for p in self.problems))


# --------------------------------------------------------------------------------------------
# YAML → plain data, remembering the line of every path and catching duplicate keys
# --------------------------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


#: Budgets that bound what a hostile or broken file can cost (issue 14 rows 7-8: an alias bomb took 60 s and 1.67 GB,
#: 5,000-deep nesting a Python traceback). A real DLB config is a few KB, nested about 6 deep, with a few hundred values;
#: the budgets sit far above that and keep the worst file within ~0.5 s and ~60 MB (docs/security.md).
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 64
#: Values (scalars, mappings, lists) after alias expansion: every alias counts the whole subtree it stands for, each
#: time it is used. 20,000 is ~5x a 64-cell config with a full latency matrix; composing that many takes ~0.5 s.
MAX_VALUES = 20_000
#: libyaml when PyYAML was built with it (~30x faster: a 1 MB file of scalars took 39 s in pure Python).
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: Cross-cell checks (the latency matrix, unique addresses) and prefix shadowing are quadratic in these.
MAX_CELLS = 256
MAX_ENDPOINTS = 256
MAX_UNKNOWN_KEYS = 20
MERGE_TAG = "tag:yaml.org,2002:merge"


class _OverBudget(Exception):
    def __init__(self, path: str, line: int) -> None:
        super().__init__(path)
        self.path, self.line = path, line


def _scan(text: str, source: str) -> Problem | None:
    """Depth and size from the event stream, before composing (the parser is iterative, the composer recursive)."""
    depth = values = 0
    for ev in yaml.parse(text, Loader=_LOADER):
        if isinstance(ev, (yaml.ScalarEvent, yaml.AliasEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            values += 1
            if values > MAX_VALUES:
                return Problem(source, "", f"more than {MAX_VALUES:,} values (a DLB config has hundreds)", ev.start_mark.line + 1)
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                return Problem(source, "", f"nested deeper than {MAX_DEPTH} levels (a DLB config needs fewer than 10)", ev.start_mark.line + 1)
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return None


STR_TAG = "tag:yaml.org,2002:str"
#: A YAML 1.2 (and JSON) float with an exponent, which YAML 1.1 reads as a string unless it has both a
#: dot and a signed exponent.
_YAML12_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\Z")


def _compose(text: str, source: str) -> tuple[Any, dict[str, int], list[Problem]]:
    problems: list[Problem] = []
    marks: dict[str, int] = {}
    if len(text) > MAX_CONFIG_BYTES:
        problems.append(Problem(source, "", f"{len(text):,} characters: larger than the {MAX_CONFIG_BYTES:,} a config may have"))
        return None, marks, problems
    try:
        deep = _scan(text, source)
        if deep is not None:
            return None, marks, [deep]
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = f"not valid YAML: {getattr(exc, 'problem', None) or exc}"
        problems.append(Problem(source, "", reason, mark.line + 1 if mark else None))
        return None, marks, problems
    constructor = yaml.SafeLoader("")
    budget = [MAX_VALUES]

    def scalar(node: yaml.Node, path: str, line: int | None = None) -> Any:
        if (node.tag == STR_TAG and not node.style and _YAML12_FLOAT.match(node.value)  # (plain: None, or "" from libyaml)
                and not text.startswith("!", node.start_mark.index)):  # (not an explicit !!str)
            # PyYAML resolves YAML 1.1, where a float needs a dot ('4e-05' is a string); JSON and
            # YAML 1.2 write exponents without one (json.dumps(0.00004) == '4e-05'): a plain scalar
            # of that shape is a number, a quoted one stays a string.
            return float(node.value)
        try:
            return constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:  # ValueError: an int of > 4,300 digits
            problems.append(Problem(source, path, f"bad value: {str(exc)[:200]}", line or node.start_mark.line + 1))
            return None

    def merge_sources(vnode: yaml.Node, path: str) -> list[yaml.MappingNode]:
        items = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
        if all(isinstance(n, yaml.MappingNode) for n in items):
            return items
        problems.append(Problem(source, _join(path, "<<"), "a merge key '<<' takes a mapping or a list of mappings", vnode.start_mark.line + 1))
        return []

    #: ids of the nodes converted so far: meeting one again means an alias (``*name``) of it is being used.
    seen: set[int] = set()

    def conv(node: yaml.Node, path: str, use_line: int | None = None, alias_line: int | None = None) -> Any:
        """``use_line``: where the parent names this node (its key's line); ``alias_line``: inside an alias,
        the line of the alias's use, where every field of it is reported (the composed alias is the
        anchor's node itself, so its own marks point at the anchor: cells[1] given as ``*leaf`` was
        reported on cells[0]'s line)."""
        if alias_line is None and id(node) in seen:
            alias_line = use_line
        seen.add(id(node))
        line = alias_line or node.start_mark.line + 1
        budget[0] -= 1
        if budget[0] < 0:
            raise _OverBudget(path, line)
        marks.setdefault(path, line)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            merges: list[tuple[yaml.MappingNode, int]] = []
            for knode, vnode in node.value:
                kline = alias_line or knode.start_mark.line + 1
                if not isinstance(knode, yaml.ScalarNode):
                    problems.append(Problem(source, path, "mapping keys must be plain scalars", kline))
                    continue
                if knode.tag == MERGE_TAG:  # YAML merge key: explicit keys win, then earlier merged mappings
                    merges += [(m, kline) for m in merge_sources(vnode, path)]
                    continue
                key = str(scalar(knode, path, kline))
                child = _join(path, key)
                if key in out:
                    problems.append(Problem(source, child, f"duplicate key (first given on line {marks.get(child)})", kline))
                    continue
                out[key] = conv(vnode, child, kline, alias_line)
            for merged, kline in merges:
                for key, value in conv(merged, path, kline, alias_line).items():
                    out.setdefault(key, value)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [conv(item, f"{path}[{i}]", line, alias_line) for i, item in enumerate(node.value)]
        return scalar(node, path, line)

    try:
        data = conv(root, "") if root is not None else None
    except _OverBudget as over:
        reason = f"more than {MAX_VALUES:,} values once aliases are expanded (an alias bomb?)"
        return None, marks, [Problem(source, over.path, reason, over.line)]
    return data, marks, problems


# --------------------------------------------------------------------------------------------
# Field checkers: each records a problem and returns a fallback, so checking goes on
# --------------------------------------------------------------------------------------------

_MISSING: Any = object()


class _Checker:
    def __init__(self, source: str, marks: dict[str, int], problems: list[Problem]):
        self.source = source
        self.marks = marks
        self.problems = problems

    def err(self, path: str, reason: str) -> None:
        p = path
        while p and p not in self.marks:  # nearest ancestor that has a line
            p = _parent(p)
        self.problems.append(Problem(self.source, path, reason, self.marks.get(p)))

    # -- structure ---------------------------------------------------------------------------
    def mapping(self, value: Any, path: str, keys: Iterable[str], required: Iterable[str] = (), unknown: str = "unknown key") -> dict[str, Any]:
        """``value`` as a dict with only ``keys``; unknown and missing required keys are problems.

        Required keys are reported here, once; the scalar checkers below return their default for a
        missing key without a second message.
        """
        if value is _MISSING or value is None:
            value = {}
        if not isinstance(value, dict):
            self.err(path, f"must be a mapping, got {_kind(value)}")
            return {}
        value = {str(k): v for k, v in value.items()}  # config_from_dict may get non-string keys
        known = set(keys)
        strangers = [k for k in value if k not in known]
        if len(strangers) > MAX_UNKNOWN_KEYS:  # name a few, not 100,000 (each with a spelling hint)
            self.err(path, f"{len(strangers):,} keys are not allowed here ({', '.join(strangers[:3])}, ...); allowed: {', '.join(sorted(known)) or 'none'}")
            strangers = []
        for k in strangers:
            if k not in known:
                hint = _close(k, known)
                self.err(_join(path, k), unknown + (f" (did you mean {hint!r}?)" if hint else f"; allowed: {', '.join(sorted(known)) or 'none'}"))
        for k in required:
            if k not in value:
                self.err(_join(path, k), "required")
        return {k: v for k, v in value.items() if k in known}

    def sequence(self, value: Any, path: str, *, required: bool = False, nonempty: bool = False, max_len: int | None = None) -> list[Any]:
        if value is _MISSING or value is None:
            if required:
                self.err(path, "required")
            return []
        if not isinstance(value, list):
            self.err(path, f"must be a list, got {_kind(value)}")
            return []
        if nonempty and not value:
            self.err(path, "must not be empty")
        if max_len is not None and len(value) > max_len:  # checks across items are quadratic: check the first max_len
            self.err(path, f"{len(value):,} items: at most {max_len} are allowed")
            return value[:max_len]
        return value

    # -- scalars -----------------------------------------------------------------------------
    def number(
        self,
        m: dict[str, Any],
        key: str,
        path: str,
        default: float | None,
        *,
        gt: float | None = None,
        ge: float | None = None,
        lt: float | None = None,
        le: float | None = None,
        integer: bool = False,
    ) -> Any:
        p = _join(path, key)
        v = m.get(key, _MISSING)
        if v is _MISSING or v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            self.err(p, f"must be {'an integer' if integer else 'a number'}, got {_show(v)}")
            return default
        if not math.isfinite(v):
            self.err(p, f"must be finite, got {v}")
            return default
        for bound, ok, word in ((gt, lambda b: v > b, ">"), (ge, lambda b: v >= b, ">="), (lt, lambda b: v < b, "<"), (le, lambda b: v <= b, "<=")):
            if bound is not None and not ok(bound):
                self.err(p, f"must be {word} {_fmt(bound)}, got {_fmt(v)}")
                return default
        return int(v) if integer else float(v)

    def boolean(self, m: dict[str, Any], key: str, path: str, default: bool) -> bool:
        v = m.get(key, _MISSING)
        if v is _MISSING:
            return default
        if not isinstance(v, bool):
            self.err(_join(path, key), f"must be true or false, got {_show(v)}")
            return default
        return v

    def string(self, m: dict[str, Any], key: str, path: str, default: str | None, *, pattern: re.Pattern[str] | None = None, what: str = "") -> Any:
        p = _join(path, key)
        v = m.get(key, _MISSING)
        if v is _MISSING:
            return default
        if not isinstance(v, str):
            self.err(p, f"must be a string, got {_show(v)}")
            return default
        if pattern is not None and not pattern.match(v):
            self.err(p, f"{v!r} is not {what or 'valid'}")
            return default
        return v

    def choice(self, m: dict[str, Any], key: str, path: str, enum: type[E], default: E) -> E:
        v = m.get(key, _MISSING)
        if v is _MISSING:
            return default
        try:
            return enum(v)
        except ValueError:
            self.err(_join(path, key), f"{_show(v)} is not one of: {', '.join(e.value for e in enum)}")
            return default

    def hostport(self, m: dict[str, Any], key: str, path: str, default: HostPort | None) -> HostPort | None:
        p = _join(path, key)
        v = m.get(key, _MISSING)
        if v is _MISSING or v is None:
            return default
        hp = parse_hostport(v)
        if hp is None:
            self.err(p, f"{_show(v)} is not host:port (e.g. 127.0.0.1:8080, [::1]:8080, leaf.example:10000; quote it in YAML)")
            return default
        return hp


def parse_hostport(v: Any) -> HostPort | None:
    """``host:port`` → HostPort, or None. IPv6 needs brackets; ports 1..65535; hosts are IPs or DNS names."""
    if not isinstance(v, str):
        return None
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]\s]+):(\d{1,5})", v)
    if not m:
        return None
    host, port_s = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    port = int(port_s)
    if not 1 <= port <= 65535:
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        # Not an IP: a DNS name, whose last label is never all digits (so 999.1.1.1 is a typo, not a name).
        if m.group(1) or not HOSTNAME_RE.match(host) or host.rsplit(".", 1)[-1].isdigit():
            return None
    return HostPort(host, port)


def _parent(path: str) -> str:
    if path.endswith("]"):
        return path[: path.rindex("[")]
    return path.rsplit(".", 1)[0] if "." in path else ""


def _kind(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, (str, int, float, bool)) or v is None else _kind(v)


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _close(word: str, options: Iterable[str]) -> str | None:
    import difflib

    hits = difflib.get_close_matches(word, list(options), n=1, cutoff=0.7)
    return hits[0] if hits else None


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def _cells(ck: _Checker, raw: Any) -> list[Cell]:
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(ck.sequence(raw, "cells", required=True, nonempty=True, max_len=MAX_CELLS)):
        p = f"cells[{i}]"
        m = ck.mapping(item, p, ("name", "replicas", "leaf", "servers", "root"), required=("name", "leaf", "servers"))
        name = ck.string(m, "name", p, None, pattern=CELL_NAME_RE, what="a cell name (^[a-z][a-z0-9-]{0,62}$)")
        if name:
            if name in seen:
                ck.err(f"{p}.name", f"duplicate cell name {name!r} (also {seen[name]})")
            seen.setdefault(name, p)
        lp = f"{p}.leaf"
        lm = ck.mapping(m.get("leaf"), lp, ("address", "probe", "ext_proc", "listen", "access_log"),
                        required=("address", "probe") if "leaf" in m else ())
        leaf = Leaf(
            address=ck.hostport(lm, "address", lp, None) or HostPort("invalid", 1),
            probe=ck.hostport(lm, "probe", lp, None) or HostPort("invalid", 1),
            ext_proc=ck.hostport(lm, "ext_proc", lp, None),
            listen=_listen(ck, lm, lp),
            access_log=_access_log(ck, lm, lp),
        )
        servers: list[Server] = []
        for k, s in enumerate(ck.sequence(m.get("servers"), f"{p}.servers", nonempty="servers" in m)):
            sp = f"{p}.servers[{k}]"
            # shorthand: a bare "host:port"
            sm = ck.mapping({"address": s} if isinstance(s, str) else s, sp, ("address", "weight", *_DP_KEYS), required=("address",))
            addr = ck.hostport(sm, "address", sp, None)
            weight = ck.number(sm, "weight", sp, 1, ge=1, le=1_000_000, integer=True)
            servers.append(Server(addr or HostPort("invalid", 1), weight, _dp_group(ck, sm, sp, addr)))
        replicas = ck.number(m, "replicas", p, max(len(servers), 1), ge=1, integer=True)
        rp = f"{p}.root"
        rm = ck.mapping(m.get("root"), rp, ("address", "ext_proc", "listen"))
        root = Root(address=ck.hostport(rm, "address", rp, None), ext_proc=ck.hostport(rm, "ext_proc", rp, None),
                    listen=_listen(ck, rm, rp))
        if root.listen is not None and "address" not in rm:
            ck.err(f"{rp}.listen", "needs root.address (the address this cell's clients reach the root at)")
        # An invalid name becomes "" so the network checks below skip it instead of adding noise.
        cells.append(Cell(name=name or "", index=i, replicas=replicas, leaf=leaf, servers=tuple(servers), root=root,
                          replicas_auto="replicas" not in m))
    _unique_addresses(ck, cells)
    return cells


def _access_log(ck: _Checker, m: dict[str, Any], path: str) -> str | None:
    """``unix:/absolute/path`` or a loopback host:port: only the cell's own Envoy may reach the access log."""
    v = ck.string(m, "access_log", path, None)
    if v is None:
        return None
    p = f"{path}.access_log"
    if v.startswith("unix:"):
        if not v[5:].startswith("/") or len(v) - 5 > 100:
            ck.err(p, f"{_show(v)}: a Unix socket needs an absolute path of at most 100 characters")
            return None
        return v
    hp = parse_hostport(v)
    if hp is None:
        ck.err(p, f"{_show(v)} is neither unix:/path nor host:port")
        return None
    if not hp.loopback:
        ck.err(p, f"{hp.host} is not a loopback address: anyone who reaches the access log can steer the cell")
        return None
    return v


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _listen(ck: _Checker, m: dict[str, Any], path: str) -> HostPort | None:
    """Optional bind address of an Envoy listener: an IP (``0.0.0.0``, ``::`` or one interface), never a name."""
    hp = ck.hostport(m, "listen", path, None)
    if hp is not None:
        try:
            ipaddress.ip_address(hp.host)
        except ValueError:
            ck.err(f"{path}.listen", f"{hp.host!r} is not an IP address: a listener binds an interface (0.0.0.0 for all)")
            return None
    return hp


_DP_KEYS = ("dp_ranks", "policy", "horizon", "mean_decode_tokens", "max_num_seqs")


def _dp_group(ck: _Checker, m: dict[str, Any], path: str, addr: HostPort | None) -> DpGroup | None:
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
    if addr is not None and addr.port + ranks - 1 > 65535:
        ck.err(f"{path}.dp_ranks", f"ranks listen on ports {addr.port}..{addr.port + ranks - 1}: past 65535")
    return DpGroup(ranks=ranks, policy=policy, horizon=horizon, mean_decode_tokens=mean, max_num_seqs=slots)


def _unique_addresses(ck: _Checker, cells: list[Cell]) -> None:
    """Two things cannot listen on one address; a copy-paste slip here makes a confusing testbed."""
    owner: dict[HostPort, str] = {}
    for c in cells:
        p = f"cells[{c.index}]"
        uses = [(f"{p}.leaf.address", c.leaf.address), (f"{p}.leaf.probe", c.leaf.probe), (f"{p}.leaf.ext_proc", c.leaf.ext_proc)]
        # A DP server's ranks r > 0 sit on the following ports; a clash is reported on its dp_ranks.
        uses += [(f"{p}.servers[{k}]." + ("dp_ranks" if r else "address"), a)
                 for k, s in enumerate(c.servers) for r, a in enumerate(s.rank_addresses())]  # fmt: skip
        uses += [(f"{p}.root.address", c.root.address)]
        for path, hp in uses:
            if hp is None or hp.host == "invalid":
                continue
            if hp in owner:
                ck.err(path, f"address {hp} is also used by {owner[hp]}")
            else:
                owner[hp] = path


def _network(ck: _Checker, raw: Any, cells: list[Cell]) -> Network:
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
                ck.err(path, f"{_fmt(v)} differs from {given[(j, i)][1]} = {_fmt(given[(j, i)][0])} while network.symmetric is true")
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
                ck.err(f"{ap}[{k}]", f"{_show(d)} is not a cell (cells: {', '.join(index)})")
            elif row[index[d]]:
                ck.err(f"{ap}[{k}]", f"{d!r} listed twice")
            else:
                row[index[d]] = True
        if any(row):
            allowed[index[src]] = row
    return Network(one_way_ms=tuple(tuple(r) for r in tau), allowed=tuple(tuple(r) for r in allowed))


def _policy(ck: _Checker, raw: Any, path: str) -> Policy:
    m = ck.mapping(raw, path, ("mechanism", "cost", "flow", "aversion", "affinity"))
    d = Policy()
    fp = f"{path}.flow"
    fm = ck.mapping(m.get("flow"), fp, ("period_ms", "kappa"))
    flow = FlowParams(
        period_ms=ck.number(fm, "period_ms", fp, d.flow.period_ms, gt=0),
        kappa=ck.number(fm, "kappa", fp, d.flow.kappa, gt=0, lt=math.pi / 2),
    )
    ap = f"{path}.aversion"
    am = ck.mapping(m.get("aversion"), ap, ("enabled", "margin", "gain", "decay", "max", "period_ms"))
    da = d.aversion
    aversion = AversionParams(
        enabled=ck.boolean(am, "enabled", ap, da.enabled),
        margin=ck.number(am, "margin", ap, da.margin, ge=0, le=1),
        gain=ck.number(am, "gain", ap, da.gain, gt=0),
        decay=ck.number(am, "decay", ap, da.decay, ge=0, le=1),
        max=ck.number(am, "max", ap, da.max, ge=0, lt=1),
        period_ms=ck.number(am, "period_ms", ap, da.period_ms, gt=0),
    )
    fp = f"{path}.affinity"
    fm = ck.mapping(m.get("affinity"), fp, ("enabled", "header", "ttl_s", "max_sessions", "prefix_savings_ms"))
    df = d.affinity
    header = ck.string(fm, "header", fp, df.header, pattern=HEADER_NAME_RE, what="a lower-case HTTP header name")
    if header.startswith("x-dlb-"):
        ck.err(f"{fp}.header", f"{header!r}: x-dlb-* headers are internal (stripped from client requests by the root Envoy)")
        header = df.header
    affinity = AffinityParams(
        enabled=ck.boolean(fm, "enabled", fp, df.enabled),
        header=header,
        ttl_s=ck.number(fm, "ttl_s", fp, df.ttl_s, gt=0),
        max_sessions=ck.number(fm, "max_sessions", fp, df.max_sessions, ge=1, integer=True),
        prefix_savings_ms=ck.number(fm, "prefix_savings_ms", fp, df.prefix_savings_ms, ge=0),
    )
    cost = ck.choice(m, "cost", path, Cost, d.cost)
    return Policy(
        mechanism=ck.choice(m, "mechanism", path, Mechanism, d.mechanism),
        cost=cost,
        flow=flow,
        aversion=aversion,
        affinity=affinity,
    )


def _prior(ck: _Checker, raw: Any, path: str) -> LatencyPrior:
    m = ck.mapping(raw, path, ("a_s", "b_s", "c", "s"))
    d = LatencyPrior()
    prior = LatencyPrior(
        a_s=ck.number(m, "a_s", path, d.a_s, gt=0),
        b_s=ck.number(m, "b_s", path, d.b_s, gt=0),
        c=ck.number(m, "c", path, d.c, ge=0),
        s=ck.number(m, "s", path, d.s, gt=0),
    )
    # μ(N) = N/ℓ(N) must keep increasing past the knee, which needs c < a/b (docs/design.md §3, latency model).
    if prior.c >= prior.a_s / prior.b_s:
        ck.err(f"{path}.c", f"knee c={_fmt(prior.c)} must be below a_s/b_s={_fmt(prior.a_s / prior.b_s)} (else throughput falls as load grows)")
    return prior


def _endpoints(ck: _Checker, raw: Any) -> list[Endpoint]:
    out: list[Endpoint] = []
    names: dict[str, str] = {}
    prefixes: list[tuple[str, str]] = []
    keys = ("name", "match", "policy", "latency_prior", "timeout_s", "idle_timeout_s")
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
                policy=_policy(ck, m.get("policy"), f"{p}.policy"),
                latency_prior=_prior(ck, m.get("latency_prior"), f"{p}.latency_prior"),
                timeout_s=ck.number(m, "timeout_s", p, Endpoint.timeout_s, ge=0),
                idle_timeout_s=ck.number(m, "idle_timeout_s", p, Endpoint.idle_timeout_s, ge=0),
            )
        )
    return out


def _probe(ck: _Checker, raw: Any) -> ProbeParams:
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
        ck.err("probe.stale_after_ms", f"{_fmt(out.stale_after_ms)} must exceed probe.period_ms={_fmt(out.period_ms)} (else every state is stale)")
    if out.backoff_max_ms < out.period_ms:
        ck.err("probe.backoff_max_ms", f"{_fmt(out.backoff_max_ms)} must be >= probe.period_ms={_fmt(out.period_ms)}")
    return out


def _services(ck: _Checker, raw: Any) -> Services:
    m = ck.mapping(raw, "services", ("control_plane", "root"))
    cm = ck.mapping(m.get("control_plane"), "services.control_plane", ("xds", "status"))
    rm = ck.mapping(m.get("root"), "services.root", ("ext_proc", "metrics"))
    dc, dr = ControlPlaneAddrs(), RootAddrs()
    return Services(
        control_plane=ControlPlaneAddrs(
            xds=ck.hostport(cm, "xds", "services.control_plane", dc.xds) or dc.xds,
            status=ck.hostport(cm, "status", "services.control_plane", dc.status) or dc.status,
        ),
        root=RootAddrs(
            ext_proc=ck.hostport(rm, "ext_proc", "services.root", dr.ext_proc) or dr.ext_proc,
            metrics=ck.hostport(rm, "metrics", "services.root", dr.metrics) or dr.metrics,
        ),
    )


#: What each ``tls`` file must hold (a PEM block of this kind), and why a person would set it.
_TLS_PEM = {"ca": ("CERTIFICATE", "the CA certificate every DLB component's certificate chains to"),
            "cert": ("CERTIFICATE", "this component's certificate (chain)"),
            "key": ("PRIVATE KEY", "this component's private key")}


def _tls(ck: _Checker, raw: Any, source: str) -> TlsFiles | None:
    """``tls: {ca, cert, key}``: PEM paths, relative ones from the config file's folder.

    ``cert`` and ``key`` may hold ``{identity}`` (one config, a certificate per component); such a
    path is checked when the component starts (``dlb.config.tls.load_identity``), a plain one here.
    """
    problems_before = len(ck.problems)
    m = ck.mapping(raw, "tls", tuple(_TLS_PEM), required=tuple(_TLS_PEM))
    base = os.path.dirname(os.path.abspath(source)) if os.path.exists(source) else os.getcwd()
    paths: dict[str, str] = {}
    for key, (kind, _) in _TLS_PEM.items():
        v = ck.string(m, key, "tls", None)
        if not v:
            if isinstance(m.get(key), str):  # a wrong type was reported by ck.string already
                ck.err(f"tls.{key}", "must be a file path")
            continue
        path = os.path.join(base, os.path.expanduser(v))
        rest = v.replace(TLS_IDENTITY_PLACEHOLDER, "")
        if "{" in rest or "}" in rest:
            ck.err(f"tls.{key}", f"{v!r}: the only placeholder is {TLS_IDENTITY_PLACEHOLDER}")
            continue
        if key == "ca" and TLS_IDENTITY_PLACEHOLDER in v:
            ck.err("tls.ca", f"{v!r}: one CA for every component (no {TLS_IDENTITY_PLACEHOLDER})")
            continue
        if TLS_IDENTITY_PLACEHOLDER not in v:
            reason = pem_problem(path, kind)
            if reason:
                ck.err(f"tls.{key}", reason)
        paths[key] = path
    if len(paths) < len(_TLS_PEM):
        return None
    if (TLS_IDENTITY_PLACEHOLDER in paths["cert"]) != (TLS_IDENTITY_PLACEHOLDER in paths["key"]):
        ck.err("tls.key", f"tls.cert and tls.key must both hold {TLS_IDENTITY_PLACEHOLDER} or neither")
    elif TLS_IDENTITY_PLACEHOLDER not in paths["cert"] and len(ck.problems) == problems_before:
        for field_path, reason in tls_pair_problems(paths["ca"], paths["cert"], paths["key"]):
            ck.err(field_path, reason)
    return TlsFiles(ca=paths["ca"], cert=paths["cert"], key=paths["key"])


def tls_pair_problems(ca: str, cert: str, key: str) -> list[tuple[str, str]]:
    """``(field, reason)`` for a certificate and key that are each a readable PEM file but do not work
    together: the key is not the certificate's, or the certificate does not verify against ``ca``
    (another CA's, expired, wrong key usage). Without this check such a component starts and then
    fails every handshake (or, on grpc.aio, reports a port it "could not bind").

    Checked the way a peer would: an in-memory mutual TLS handshake of the certificate with itself,
    both sides trusting only ``ca`` (stdlib ``ssl``, no network, no hostname check).
    """
    import ssl  # only configs with a tls section pay for it

    def ctx(side: int) -> ssl.SSLContext:
        c = ssl.SSLContext(side)
        c.load_cert_chain(cert, key)
        c.load_verify_locations(ca)
        c.check_hostname = False
        c.verify_mode = ssl.CERT_REQUIRED
        return c

    try:
        server, client = ctx(ssl.PROTOCOL_TLS_SERVER), ctx(ssl.PROTOCOL_TLS_CLIENT)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            return [("tls.key", f"{key}: not the private key of tls.cert {cert}")]
        return [("tls.cert", f"{cert} with tls.key {key} and tls.ca {ca}: cannot be loaded: {exc.reason or exc}")]
    bios = [ssl.MemoryBIO() for _ in range(4)]
    s = server.wrap_bio(bios[0], bios[1], server_side=True)
    c = client.wrap_bio(bios[2], bios[3])
    done = [False, False]
    try:
        for _ in range(16):
            for i, side in enumerate((c, s)):
                if not done[i]:
                    try:
                        side.do_handshake()
                        done[i] = True
                    except ssl.SSLWantReadError:
                        pass
            bios[0].write(bios[3].read())
            bios[2].write(bios[1].read())
            if all(done):
                s.write(b"x")  # TLS 1.3: the server learns the client certificate's verdict on the first record
                bios[2].write(bios[1].read())
                c.write(b"x")
                bios[0].write(bios[3].read())
                s.read(1)
                return []
    except ssl.SSLCertVerificationError as exc:
        return [("tls.cert", f"{cert}: does not verify against tls.ca {ca}: {exc.verify_message}")]
    except ssl.SSLError as exc:
        return [("tls.cert", f"{cert}: a mutual TLS handshake with it and tls.ca {ca} fails: {exc.reason or exc}")]
    return [("tls.cert", f"{cert}: a mutual TLS handshake with it and tls.ca {ca} does not complete")]


def pem_problem(path: str, kind: str) -> str | None:
    """Why ``path`` is not a readable PEM file holding a ``kind`` block, or None if it is."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    if f"-----BEGIN {kind}-----".encode() not in head and not (kind == "PRIVATE KEY" and b"PRIVATE KEY-----" in head):
        return f"{path}: no PEM {kind} block in it"
    return None


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

def _discovery(ck: _Checker, raw: Any) -> Discovery:
    m = ck.mapping(raw, "discovery", ("dns_period_s",))
    # At least 0.1 s: a tighter loop would resolve faster than any DNS TTL changes, on every name.
    return Discovery(dns_period_s=ck.number(m, "dns_period_s", "discovery", Discovery().dns_period_s, ge=0.1, le=3600))


#: A root token: printable ASCII without spaces (an HTTP header value Envoy matches exactly), 16-256 bytes.
_TOKEN = re.compile(r"^[!-~]{16,256}$")


def _root_token(ck: _Checker, raw: Any, source: str) -> str | None:
    """``root_token_file: PATH``: the file holds the secret roots prove themselves to leaves with.

    The secret is read here (one line, surrounding whitespace dropped) so a bad file is a problem report
    at load time, not a leaf that silently trusts no root. Relative paths are from the config's folder.
    """
    if not isinstance(raw, str) or not raw:
        ck.err("root_token_file", "must be a file path")
        return None
    base = os.path.dirname(os.path.abspath(source)) if os.path.exists(source) else os.getcwd()
    path = os.path.join(base, os.path.expanduser(raw))
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
    return token


TOP_KEYS = ("version", "cells", "network", "endpoints", "probe", "services", "tls", "discovery", "root_token_file")


def _build(data: Any, source: str, marks: dict[str, int], problems: list[Problem]) -> Config:
    ck = _Checker(source, marks, problems)
    if data is None and not problems:
        ck.err("", "empty file: expected a mapping with version, cells, endpoints")
    top = ck.mapping(data, "", TOP_KEYS, required=("version", "cells", "endpoints") if isinstance(data, dict) else ())
    version = ck.number(top, "version", "", 1, integer=True)
    if "version" in top and version not in SUPPORTED_VERSIONS and isinstance(top.get("version"), int):
        ck.err("version", f"unsupported version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    cells = _cells(ck, top.get("cells")) if "cells" in top else []
    network = _network(ck, top.get("network"), cells)
    endpoints = _endpoints(ck, top.get("endpoints")) if "endpoints" in top else []
    probe = _probe(ck, top.get("probe"))
    services = _services(ck, top.get("services"))
    tls = _tls(ck, top.get("tls"), source) if "tls" in top else None
    discovery = _discovery(ck, top.get("discovery"))
    root_token = _root_token(ck, top.get("root_token_file"), source) if "root_token_file" in top else None
    if problems:
        raise ConfigError(sorted(problems, key=lambda pr: pr.line or 0))  # stable: file order, then check order
    return Config(version=version, cells=tuple(cells), network=network, endpoints=tuple(endpoints), probe=probe, services=services, tls=tls,
                  discovery=discovery, root_token=root_token, source=source)


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse YAML text; raises ConfigError listing every problem (``source`` names the file in messages)."""
    data, marks, problems = _compose(text, source)
    return _build(data, source, marks, problems)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    """Check and build a config from already-parsed data (tests, generated testbeds); no line numbers."""
    return _build(data, source, {}, [])


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load and check a config file. Services call this at start and refuse to run on ConfigError."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)  # never read a huge file whole
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError([Problem(source, "", f"larger than the {MAX_CONFIG_BYTES:,} bytes a config may have")])
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError([Problem(source, "", f"cannot read: {exc.strerror or exc}")]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(source, "", f"not UTF-8 text: {exc}")]) from exc
    return parse_config(text, source)
