"""State-of-the-world xDS streams (``StreamAggregatedResources`` and ``Stream<Type>``).

Per type, a stream remembers what the client asked for (names or wildcard) and exactly which
resources the last response carried (``sent``). A push sends a type only if the client's view changed:
a resource it asked for appeared or changed, or (full-state types) disappeared. Consequences:

* unchanged config is never pushed, even when the snapshot version moves because another type changed;
* a NACKed response is never re-sent: ``sent`` still holds the rejected content, so the same content
  in later snapshots is "no change", and only different content goes out;
* newly requested names are answered at an unchanged version, names that don't exist yet are
  remembered and sent when they appear, and withdrawn names never trigger a response;
* responses are never held until a client names everything in the snapshot.

Make-before-break (ADS only): types go out in CDS → EDS → LDS → RDS → custom order; while a CDS
response that adds clusters is unanswered (Envoy ACKs CDS only once the new clusters have their
endpoints), LDS/RDS wait; while LDS/RDS changes are in flight (wanted or not yet ACKed/NACKed), a
CDS response keeps the clusters being removed (version ``<v>~partial``), and the final CDS without
them follows once LDS/RDS are answered. After a CDS response that changed EDS clusters, EDS is re-sent so the re-warming clusters
get their endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from dlb.xds import types, wire
from dlb.xds.snapshot import Resource, Snapshot
from dlb.xds.stream import GATE_TYPES, ROUTE_TYPES, BodyKey, ServerContext, StreamBase, Subscription, Waker

PARTIAL_SUFFIX = "~partial"


@dataclass
class SotwTypeState:
    sub: Subscription
    nonce: str = ""  # latest nonce sent for this type; any other nonce is stale
    outstanding: bool = False  # a response awaits its ACK/NACK
    adds_pending: bool = False  # CDS: the outstanding response adds clusters (routes wait for its ACK)
    initial_pending: bool = True  # answer the first request even when it changes nothing
    subscribed_reported: bool = False
    resend: bool = False  # send even if unchanged (EDS after a CDS change)
    sent: dict[str, Resource] = field(default_factory=dict)
    sent_shared: bool = False  # ``sent`` is a snapshot's own (immutable) dict: copy before changing it
    sent_digest: str = ""  # type digest when the last response was the snapshot's whole type
    sent_version: str = ""
    acked_version: str = ""

    def own_sent(self) -> dict[str, Resource]:
        if self.sent_shared:
            self.sent, self.sent_shared = dict(self.sent), False
        self.sent_digest = ""
        return self.sent


@dataclass
class _Plan:
    view: Mapping[str, Resource]
    changed: list[Resource]
    deleted: list[str]
    whole_type: bool  # view is the snapshot's whole type (lets streams share a cached body)


class SotwStream(StreamBase):
    kind = "sotw"

    def __init__(self, ctx: ServerContext, fixed_type: str | None, peer: str, wake: Waker | None = None) -> None:
        super().__init__(ctx, fixed_type, peer, wake)
        self.states: dict[str, SotwTypeState] = {}

    def handle(self, req: discovery_pb2.DiscoveryRequest) -> bool:
        type_url = self.type_of(req.type_url)
        self.adopt_node(req.node, req.HasField("node"))
        assert self.node is not None
        st = self.states.get(type_url)
        if st is None:
            self.check_new_type(len(self.states))
            st = self.states[type_url] = SotwTypeState(sub=self.subscription(type_url))
        observer = self.ctx.observer
        clip = self.ctx.limits.clip
        if req.response_nonce and st.nonce:
            if req.response_nonce != st.nonce:
                # Superseded by a newer response; the client will answer that one (xDS protocol).
                observer.stale_nonce(self.node.id, type_url, req.response_nonce)
                self.log.debug("stale_nonce_ignored", type=types.short(type_url), nonce=req.response_nonce,
                               current=st.nonce)
                return False
            st.outstanding = st.adds_pending = False
            if req.HasField("error_detail"):
                reason = clip(req.error_detail.message)
                observer.nacked(self.node.id, type_url, st.sent_version, reason)
                self.log.warning("nack", type=types.short(type_url), version=st.sent_version,
                                 kept_version=clip(req.version_info), reason=reason)
            else:
                st.acked_version = clip(req.version_info)
                observer.acked(self.node.id, type_url, st.acked_version)
        else:
            # No nonce, or a nonce from before this stream (a client that kept it across a
            # reconnect): either way nothing was sent on this stream yet, so answer it.
            st.initial_pending = True
            if req.version_info and self.key is not None:
                self.ctx.cache.resume(self.key, req.version_info)  # re-homed from another replica
        sub = st.sub
        self.check_names(req.resource_names, ())
        change = sub.replace(req.resource_names)
        self.check_names((), (s.sub for s in self.states.values()))
        if change.narrowed:
            withdrawn = [n for n in st.sent if not sub.covers(n)]
            if withdrawn:
                sent = st.own_sent()
                for n in withdrawn:
                    del sent[n]  # withdrawn: forget silently, never respond for it
        if change.changed or not st.subscribed_reported:
            observer.subscribed(self.node.id, type_url, sub.names, sub.wildcard)
            st.subscribed_reported = True
        # A push may be due after: a first request, new names, or an answer to CDS/LDS/RDS while the
        # gate holds something (the answer can release held routes or held cluster removals). Any other
        # plain ACK changes nothing.
        return st.initial_pending or change.grew or (type_url in GATE_TYPES and self.gate_held)

    def _plan(self, snap: Snapshot, type_url: str) -> _Plan:
        st = self.states[type_url]
        view = self.visible(snap, type_url, st.sub.names, st.sub.wildcard)
        whole = view is snap.get(type_url)
        if whole and st.sent_digest:  # the client holds a whole earlier view: shared diff, O(changes)
            digest = snap.type_digests.get(type_url, "")
            if st.sent_digest == digest:
                return _Plan(view, [], [], whole_type=True)
            changed, missing = self.ctx.view_diff(type_url, st.sent_digest, st.sent, digest, view)
        else:
            changed = [r for n, r in view.items() if (s := st.sent.get(n)) is None or s.version != r.version]
            missing = [n for n in st.sent if n not in view]
        if types.full_state(type_url):
            deleted = missing
        else:
            deleted = []
            if missing:
                sent = st.own_sent()
                for n in missing:  # nothing to tell the client; forget so a reappearance is sent
                    del sent[n]
        return _Plan(view if whole else dict(view), changed, deleted, whole_type=whole)

    @staticmethod
    def _wants(st: SotwTypeState, type_url: str, plan: _Plan) -> bool:
        first = st.initial_pending and (bool(plan.view) or types.full_state(type_url) or st.sub.wildcard)
        return bool(plan.changed or plan.deleted or first or (st.resend and plan.view))

    def push(self) -> list[bytes]:
        snap = self.snapshot()
        if snap is None:
            return []
        order = sorted(self.states, key=types.order_key)
        gated = [t for t in ROUTE_TYPES if t in self.states]
        plans = {t: self._plan(snap, t) for t in gated}
        cds = self.states.get(types.CLUSTER)
        gate = self.gate(routes_busy=lambda: any(self.states[t].outstanding or self._wants(self.states[t], t, plans[t])
                                                 for t in gated))
        out: list[bytes] = []
        self.gate_held = False
        for t in order:
            st = self.states[t]
            plan = plans.get(t) or self._plan(snap, t)
            if not self._wants(st, t, plan):
                continue
            if gate.routes_wait(t, cds_adding=cds is not None and cds.outstanding and cds.adds_pending):
                # New clusters are warming (Envoy ACKs CDS once their endpoints arrived): routes
                # that may use them wait for that ACK, or they would point at a warming cluster.
                self.gate_held = True
                continue
            resources = plan.view
            whole = plan.whole_type
            version = snap.version
            partial = t == types.CLUSTER and gate.hold_removals and bool(plan.deleted)
            if partial:
                self.gate_held = True  # the final CDS without the removed clusters follows the route answer
                if not (plan.changed or st.initial_pending):
                    continue  # only removals: wait until LDS/RDS are answered
                resources = {**{n: st.sent[n] for n in plan.deleted}, **plan.view}
                whole = False
                version += PARTIAL_SUFFIX
            if t == types.CLUSTER and types.ENDPOINT in self.states:
                self._flag_eds_resend(plan)
            adds = t == types.CLUSTER and any(n not in st.sent for n in resources)
            out.append(self._respond(t, st, version, resources, whole, snap))
            st.adds_pending = adds
        return out

    def _flag_eds_resend(self, plan: _Plan) -> None:
        eds = self.states[types.ENDPOINT]
        cds = self.states[types.CLUSTER]
        for r in plan.changed:
            if r.name in cds.sent and r.eds_name and eds.sub.covers(r.eds_name):
                eds.resend = True
                return

    def _respond(self, t: str, st: SotwTypeState, version: str, resources: Mapping[str, Resource], whole: bool,
                 snap: Snapshot) -> bytes:
        wrap = self.wrap_ok
        if whole:  # the snapshot's whole type: shared by every wildcard stream, keyed by digest
            key: BodyKey = (t, version, wrap, snap.type_digests.get(t, ""))
        else:
            key = (t, version, wrap, tuple(sorted((n, r.version) for n, r in resources.items())))

        def build() -> bytes:
            return (wire.string_field(wire.SotwResponseField.VERSION_INFO, version)
                    + b"".join(resources[n].sotw(wrap) for n in sorted(resources))
                    + wire.string_field(wire.SotwResponseField.TYPE_URL, t))

        body = self.ctx.body_cache.get(key, build)
        nonce = self.next_nonce()
        st.nonce, st.outstanding, st.initial_pending, st.resend = nonce, True, False, False
        st.sent, st.sent_shared, st.sent_version = resources, whole, version  # type: ignore[assignment]
        st.sent_digest = snap.type_digests.get(t, "") if whole else ""
        assert self.node is not None
        self.ctx.observer.sent(self.node.id, t, version, nonce)
        self.log.debug("response", type=types.short(t), version=version, nonce=nonce, resources=len(resources))
        return body + wire.string_field(wire.SotwResponseField.NONCE, nonce)
