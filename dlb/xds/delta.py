"""Incremental (delta) xDS streams (``DeltaAggregatedResources`` and ``Delta<Type>``).

Per type the stream tracks the client's subscription and ``client``: name → version the client holds
(seeded from ``initial_resource_versions`` on reconnect, then updated with every response). A push
sends only resources whose content hash differs from what the client holds, and lists in
``removed_resources`` names the client holds that no longer exist (or that it may no longer read).
Resource versions are content hashes, so a reconnecting client with current resources gets nothing.

Unlike SotW, subscription changes in a request with a stale nonce are still applied: delta requests
are deltas and dropping one would lose a subscription. A NACK leaves ``client`` at the rejected
versions, so the rejected content is never re-sent; new content has a new hash and goes out.
Make-before-break as in SotW: LDS/RDS wait while a CDS response that added clusters is unanswered;
cluster and endpoint removals wait while LDS/RDS responses are in flight; a changed EDS cluster
makes its ClusterLoadAssignment go out again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from dlb.xds import types, wire
from dlb.xds.snapshot import Resource, Snapshot
from dlb.xds.stream import GATE_TYPES, ROUTE_TYPES, ServerContext, StreamBase, Subscription, Waker

_MAX_PENDING = 64


@dataclass
class DeltaTypeState:
    sub: Subscription
    client: dict[str, str] = field(default_factory=dict)  # name -> version the client holds
    pending: dict[str, str] = field(default_factory=dict)  # nonce -> system version, awaiting ACK/NACK
    initial_pending: bool = True
    adds_nonce: str = ""  # CDS: nonce of a response that added clusters (routes wait for its answer)
    # When ``client`` equals a snapshot's whole type (wildcard, nothing withheld): that view and its
    # digest, so the next push uses the shared snapshot diff instead of comparing every resource.
    synced_digest: str = ""
    synced_view: Mapping[str, Resource] = field(default_factory=dict)


class DeltaStream(StreamBase):
    kind = "delta"

    def __init__(self, ctx: ServerContext, fixed_type: str | None, peer: str, wake: Waker | None = None) -> None:
        super().__init__(ctx, fixed_type, peer, wake)
        self.states: dict[str, DeltaTypeState] = {}

    def handle(self, req: discovery_pb2.DeltaDiscoveryRequest) -> bool:
        type_url = self.type_of(req.type_url)
        self.adopt_node(req.node, req.HasField("node"))
        assert self.node is not None
        observer = self.ctx.observer
        st = self.states.get(type_url)
        first = st is None
        if st is None:
            self.check_new_type(len(self.states))
            self.check_names(req.initial_resource_versions, ())
            # initial_resource_versions: what a reconnecting client already holds (not re-sent if current).
            st = self.states[type_url] = DeltaTypeState(sub=self.subscription(type_url),
                                                        client=dict(req.initial_resource_versions))
        if req.response_nonce:
            if req.response_nonce == st.adds_nonce:
                st.adds_nonce = ""
            version = st.pending.pop(req.response_nonce, None)
            if version is None:
                observer.stale_nonce(self.node.id, type_url, req.response_nonce)
            elif req.HasField("error_detail"):
                reason = self.ctx.limits.clip(req.error_detail.message)
                observer.nacked(self.node.id, type_url, version, reason)
                self.log.warning("nack", type=types.short(type_url), version=version, reason=reason)
            else:
                observer.acked(self.node.id, type_url, version)
        # Subscription changes apply even with a stale nonce: a delta request is a delta, and
        # dropping it would lose the change for good.
        sub = st.sub
        self.check_names(req.resource_names_subscribe, ())
        change = sub.update(req.resource_names_subscribe, req.resource_names_unsubscribe, first)
        self.check_names((), (s.sub for s in self.states.values()))
        if change.changed or first:
            observer.subscribed(self.node.id, type_url, sub.names, sub.wildcard)
        if change.narrowed or req.resource_names_unsubscribe:
            st.synced_digest = ""
            for n in [n for n in st.client if not sub.covers(n)]:
                del st.client[n]  # the client dropped it; never respond for it
        for n in change.resend:
            st.client.pop(n, None)  # dropped by the client, still covered by the wildcard: send it again
        return bool(st.initial_pending or change.grew or change.resend or (type_url in GATE_TYPES and self.gate_held))

    def _diff(self, snap: Snapshot, type_url: str) -> tuple[list[Resource], list[str]]:
        st = self.states[type_url]
        view = self.visible(snap, type_url, st.sub.names, st.sub.wildcard)
        if st.synced_digest and view is snap.get(type_url):
            digest = snap.type_digests.get(type_url, "")
            if digest == st.synced_digest:
                return [], []
            return self.ctx.view_diff(type_url, st.synced_digest, st.synced_view, digest, view)
        updates = [view[n] for n in sorted(view) if st.client.get(n) != view[n].version]
        removed = sorted(n for n in st.client if n not in view and st.sub.covers(n))
        return updates, removed

    def _wants(self, type_url: str, updates: list[Resource], removed: list[str]) -> bool:
        st = self.states[type_url]
        first = st.initial_pending and (types.full_state(type_url) or st.sub.wildcard)
        return bool(updates or removed or first)

    def push(self) -> list[bytes]:
        snap = self.snapshot()
        if snap is None:
            return []
        gated = [t for t in ROUTE_TYPES if t in self.states]
        diffs = {t: self._diff(snap, t) for t in gated}
        cds = self.states.get(types.CLUSTER)
        gate = self.gate(routes_busy=lambda: any(self.states[t].pending or self._wants(t, *diffs[t]) for t in gated))
        out: list[bytes] = []
        self.gate_held = False
        for t in sorted(self.states, key=types.order_key):
            st = self.states[t]
            updates, removed = diffs.get(t) or self._diff(snap, t)
            if gate.routes_wait(t, cds_adding=cds is not None and bool(cds.adds_nonce)):
                self.gate_held = self.gate_held or self._wants(t, updates, removed)
                continue  # new clusters are warming: routes wait for the CDS answer (see sotw.py)
            withheld = t in (types.CLUSTER, types.ENDPOINT) and gate.hold_removals and bool(removed)
            if withheld:
                self.gate_held = True  # the removals follow the route answer
                removed = []  # stale clusters and their endpoints go once routes no longer use them
            if not self._wants(t, updates, removed):
                continue
            if t == types.CLUSTER and types.ENDPOINT in self.states:
                eds = self.states[types.ENDPOINT]
                for r in updates:
                    if r.name in st.client and r.eds_name and r.eds_name in eds.client:
                        eds.client.pop(r.eds_name)  # re-send endpoints for the re-warming cluster
                        eds.synced_digest = ""
            nonce = self.next_nonce()
            if t == types.CLUSTER and any(r.name not in st.client for r in updates):
                st.adds_nonce = nonce
            msg = (wire.string_field(wire.DeltaResponseField.SYSTEM_VERSION_INFO, snap.version)
                   + b"".join(r.delta_field for r in updates)
                   + wire.string_field(wire.DeltaResponseField.TYPE_URL, t)
                   + b"".join(wire.string_field(wire.DeltaResponseField.REMOVED_RESOURCES, n) for n in removed)
                   + wire.string_field(wire.DeltaResponseField.NONCE, nonce))
            for r in updates:
                st.client[r.name] = r.version
            for n in removed:
                st.client.pop(n, None)
            st.initial_pending = False
            view = snap.get(t)
            if not withheld and st.sub.wildcard and self.ctx.authorizer is None and t in snap.resources:
                st.synced_digest, st.synced_view = snap.type_digests.get(t, ""), view
            else:
                st.synced_digest = ""
            st.pending[nonce] = snap.version
            if len(st.pending) > _MAX_PENDING:
                del st.pending[next(iter(st.pending))]
            assert self.node is not None
            self.ctx.observer.sent(self.node.id, t, snap.version, nonce)
            out.append(msg)
        return out
