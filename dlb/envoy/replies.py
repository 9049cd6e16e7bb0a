"""DLB's error contract: every error DLB itself answers, one stable ``error.code`` per condition.

Why one table: clients (OpenAI SDKs, retry wrappers, dashboards) key on the code, so a condition must
read the same whichever part noticed it — "nothing can serve this" is ``dlb_no_capacity`` whether the
root had no usable cell or refused because every cell was full. (A leaf whose servers all died still
tries them, Envoy's panic routing, so that reads ``dlb_upstream_failed``.) The root ext_proc builds its
replies from :data:`ERRORS`; every Envoy's ``local_reply_config``
(:func:`dlb.envoy.bootstrap.local_replies`) maps Envoy's response flags to the same codes through
:data:`ENVOY_FLAGS`, and its flagless replies that are the client's doing (malformed HTTP, headers past
the limits) through :data:`ENVOY_REPLIES`. docs/operations.md lists the table (a test checks).
Bodies are OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_CAPACITY = "dlb_no_capacity"
NO_ENDPOINT = "dlb_no_endpoint"
UPSTREAM_FAILED = "dlb_upstream_failed"
UPSTREAM_TIMEOUT = "dlb_upstream_timeout"
HEADERS_TOO_LARGE = "dlb_request_headers_too_large"
BAD_REQUEST = "dlb_bad_request"


@dataclass(frozen=True)
class ErrorKind:
    """One condition: its OpenAI ``error.type`` and whether waiting helps (then ``retry-after`` is set)."""

    type: str
    retry: bool


ERRORS: dict[str, ErrorKind] = {
    NO_CAPACITY: ErrorKind("service_unavailable", retry=True),
    NO_ENDPOINT: ErrorKind("invalid_request_error", retry=False),
    UPSTREAM_FAILED: ErrorKind("service_unavailable", retry=True),
    UPSTREAM_TIMEOUT: ErrorKind("service_unavailable", retry=True),
    HEADERS_TOO_LARGE: ErrorKind("invalid_request_error", retry=False),
    BAD_REQUEST: ErrorKind("invalid_request_error", retry=False),
}

#: The one message of :data:`NO_ENDPOINT`, whichever part answers it (the root ext_proc, Envoy's NR).
NO_ENDPOINT_MESSAGE = "dlb: no endpoint serves this path"

#: Envoy's response flags on its own failure replies → the condition. UH: no healthy upstream; UO:
#: circuit breaker full (both: nothing in the cluster can take the request); NR: no route; UT:
#: upstream timeout; the rest a connect failure or a reset before any response byte.
ENVOY_FLAGS: dict[str, str] = {
    "UH": NO_CAPACITY, "UO": NO_CAPACITY, "NR": NO_ENDPOINT, "UT": UPSTREAM_TIMEOUT,
    "UF": UPSTREAM_FAILED, "URX": UPSTREAM_FAILED, "UC": UPSTREAM_FAILED, "UR": UPSTREAM_FAILED, "LR": UPSTREAM_FAILED,
}


@dataclass(frozen=True)
class LocalReply:
    """Envoy's local replies that carry no response flag, matched by a CEL expression over the reply."""

    expression: str
    code: str
    #: The statuses a client sees (docs/operations.md's rows).
    statuses: tuple[int, ...]
    #: Rewrite the status to this; None keeps Envoy's.
    status: int | None
    message: str


#: The codec's 431 (past Envoy's 100 fields or ``max_request_headers_kb``), and
#: ``header_mutation_result_exceeds_limit``: the client's headers fit, but not with the few the root adds
#: (``x-dlb-*``), which Envoy's ext_proc answered with a bare 500 — the client's doing, so 431 too. The
#: codec's 400 (not HTTP it accepts), 408 (headers not complete within ``request_headers_timeout``) and
#: 426 (HTTP/1.0) came as text/plain.
ENVOY_REPLIES: tuple[LocalReply, ...] = (
    LocalReply("response.code == 431 || response.code_details == 'header_mutation_result_exceeds_limit'", HEADERS_TOO_LARGE,
               (431,), 431, "the request's headers are too many or too large"),
    LocalReply("response.code in [400, 408, 426]", BAD_REQUEST, (400, 408, 426), None,
               "the request is not HTTP this proxy accepts, or its headers came too slowly"),
)

#: ``retry-after`` (seconds) where waiting helps and nothing better is known: every root re-probes
#: within it, and a leaf's health check (0.5 s) has looked again.
DEFAULT_RETRY_AFTER_S = 1
