"""The GIE endpoint-picker protocol (GIE ``docs/proposals/004-endpoint-picker-protocol``): names and replies.

- The gateway MAY restrict a request to a subset of the pool: ``metadata_context`` namespace
  ``envoy.lb.subset_hint``, key ``x-gateway-destination-endpoint-subset`` (a list of ``ip:port``).
- The EPP names the pick twice with one value: the ``x-gateway-destination-endpoint`` request header
  (an ORIGINAL_DST cluster reads it) and dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint``
  (what Envoy's override-host load balancer and subset matching read).
- Nothing to pick: an ImmediateResponse 503 (no eligible endpoint) or 429 (the request is shed).
- On the response the gateway reports where the request really went: ``metadata_context`` ``envoy.lb`` /
  ``x-gateway-destination-endpoint-served`` (a retry may have moved it).

Replies per endpoint are serialised once and cached, as the leaf's are: the request path only parses.
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from dlb.envoy import replies
from dlb.envoy.contract import GIE_DESTINATION
from dlb.ext_proc.protocol import header_value, openai_error

#: Dynamic-metadata namespace of the pick, and of the endpoint that served (both protocol defaults).
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"

#: One code for "nothing can serve this now", 503 or 429 alike, as the root's replies (:mod:`dlb.envoy.replies`).
_NO_CAPACITY = replies.ERRORS[replies.NO_CAPACITY].type, replies.NO_CAPACITY
NO_ENDPOINT = openai_error(503, "dlb: no eligible endpoint in the pool (or in the gateway's subset hint) for this request; retry shortly",
                           *_NO_CAPACITY, retry_after_s=replies.DEFAULT_RETRY_AFTER_S)
SHED = openai_error(429, "dlb: every eligible endpoint is full (KV cache); this request was shed, retry later",
                    *_NO_CAPACITY, retry_after_s=replies.DEFAULT_RETRY_AFTER_S)

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def pick_reply(address: str) -> bytes:
    """The request-headers reply naming ``address`` in the header and in ``envoy.lb`` dynamic metadata."""
    meta = struct_pb2.Struct()
    meta.fields[LB_NAMESPACE].struct_value.fields[GIE_DESTINATION].string_value = address
    mutation = ep.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=GIE_DESTINATION, raw_value=address.encode()), append_action=_OVERWRITE)])
    return ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=ep.CommonResponse(
        header_mutation=mutation, clear_route_cache=True)), dynamic_metadata=meta).SerializeToString()


def streamed_body(phase: str, body: bytes, end_of_stream: bool) -> bytes:
    """A body chunk handed back unchanged: in FULL_DUPLEX_STREAMED mode the gateway forwards only what the EPP returns."""
    resp = ep.BodyResponse(response=ep.CommonResponse(body_mutation=ep.BodyMutation(
        streamed_response=ep.StreamedBodyResponse(body=body, end_of_stream=end_of_stream))))
    return ep.ProcessingResponse(**{phase: resp}).SerializeToString()


def _strings(value: struct_pb2.Value) -> list[str]:
    """A metadata value as endpoints: a list of strings, or one comma-separated string."""
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value.strip() for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    if kind == "string_value":
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []


def subset_hint(req: ep.ProcessingRequest) -> list[str] | None:
    """The gateway's subset of ``ip:port`` for this request, or None when it sets none (the whole pool)."""
    ns = req.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if ns is None or SUBSET_KEY not in ns.fields:
        return None
    return _strings(ns.fields[SUBSET_KEY])


def served_endpoint(req: ep.ProcessingRequest) -> str | None:
    """The endpoint the gateway reports serving the request (first of a list), if it says."""
    ns = req.metadata_context.filter_metadata.get(LB_NAMESPACE)
    if ns is None or SERVED_KEY not in ns.fields:
        return None
    found = _strings(ns.fields[SERVED_KEY])
    return found[0] if found else None


def status_of(headers: ep.HttpHeaders) -> int:
    """The ``:status`` of response headers (0 when absent or not a number)."""
    for h in headers.headers.headers:
        if h.key == ":status":
            try:
                return int(header_value(h))
            except ValueError:
                return 0
    return 0
