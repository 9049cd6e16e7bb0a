"""A span per root decision and per leaf pick, around the services' ``handle`` (tracing on only).

Why a wrapper and not code inside ``decide``/``pick``: with tracing off the request path is exactly as
before (the wrapper is not installed). The parent is Envoy's span of the ext_proc call (the gRPC call's
``traceparent``) when Envoy traces, so a trace Envoy starts holds the decision; else the client's
``traceparent`` forwarded in the request, for which the message is parsed a second time. The span and its
attributes — the decision, every candidate cell's cost and aversion, the server's load — are built only
for sampled requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.envoy.contract import TRACEPARENT
from dlb.ext_proc.leaf import LeafAgent
from dlb.ext_proc.protocol import MessageHandler, header_value
from dlb.ext_proc.root import RootService
from dlb.service.tracing import AttributeValue, Tracer
from dlb.transport.h2 import CALL, Later

TRACE_BYTES = TRACEPARENT.encode()
Describe = Callable[[ep.ProcessingRequest, bytes], Mapping[str, AttributeValue]]


def traced(handle: MessageHandler, tracer: Tracer, name: str, describe: Describe) -> MessageHandler:
    """``handle`` recording a span named ``name`` for each request-headers message."""

    def run(message: bytes) -> tuple[bytes | Later | None, bool]:
        start = time.time_ns()
        reply, end = handle(message)
        if reply is None or isinstance(reply, Later):  # a held request's pick comes later: no span for it
            return reply, end
        req = parent = None
        if CALL.traceparent is not None:  # Envoy traces: its span of this ext_proc call is the parent
            if unsampled(CALL.traceparent):
                return reply, end
            parent = CALL.traceparent.decode("latin-1")
        elif TRACE_BYTES in message:  # else the client's, forwarded in the request: parse to read it
            req = ep.ProcessingRequest.FromString(message)
            parent = next((header_value(h) for h in req.request_headers.headers.headers if h.key == TRACEPARENT), None)
        if not tracer.sampled(parent):
            return reply, end
        req = req or ep.ProcessingRequest.FromString(message)
        if req.WhichOneof("request") == "request_headers":
            tracer.record(name, parent, start, time.time_ns(), lambda: describe(req, reply))
        return reply, end

    return run


def unsampled(traceparent: bytes) -> bool:
    """True when ``traceparent`` is a version-00 W3C trace context with its sampled flag clear, read off
    the bytes (what :meth:`Tracer.sampled` would answer False for). Why: Envoy sends one with every
    ext_proc call and 99 % are unsampled; this skips the decode, strip, split and ``int`` for them."""
    return (len(traceparent) == 55 and traceparent[:3] == b"00-" and traceparent[-3:] == b"-00"
            and traceparent[35:36] == b"-" and traceparent.count(b"-") == 3)


def describe_root(svc: RootService) -> Describe:
    """The root's decision: endpoint, policy, chosen cell (or none), each cell's cost and aversion."""

    def describe(req: ep.ProcessingRequest, reply: bytes) -> dict[str, AttributeValue]:
        path = next((header_value(h) for h in req.request_headers.headers.headers if h.key == ":path"), "")
        out: dict[str, AttributeValue] = {"dlb.cell.source": svc.cell}
        state = next((e for e in svc.endpoints if path.startswith(e.prefix)), None)
        if state is None:
            return out
        router = state.router
        chosen = next((svc.cell_names[i] for i, r in enumerate(svc.responses) if r is reply), "")
        if not chosen:  # a pick with a fallback cell (x-dlb-fallback-cell) is a reply of its own
            chosen = next((svc.cell_names[i] for i, row in enumerate(svc.fallback_responses)
                           if any(r is reply for r in row)), "")
        out.update({"dlb.endpoint": state.name, "dlb.policy": router.policy.name, "dlb.cell": chosen})
        costs = router.costs(svc.clock())
        for j, cell in enumerate(svc.cell_names):
            out[f"dlb.cost.{cell}"] = float(costs[j])
            out[f"dlb.aversion.{cell}"] = float(router.aversion[j])
        return out

    return describe


def describe_leaf(agent: LeafAgent) -> Describe:
    """The leaf's pick: the server and the load it carries (RIF, tokens waiting), the cell's RIF."""

    def describe(req: ep.ProcessingRequest, reply: bytes) -> dict[str, AttributeValue]:
        st = agent.state
        out: dict[str, AttributeValue] = {"dlb.cell": st.cell, "dlb.cell.rif": st.rif, "dlb.pick_rule": st.pick_rule}
        i = next((i for i, r in enumerate(agent.responses) if r is reply), None)
        if i is not None and i < len(st.servers):
            s = st.servers[i]
            out.update({"dlb.server": s.address, "dlb.server.rif": s.rif, "dlb.server.tokens_waiting": s.tokens})
        return out

    return describe
