"""DLB's error contract: every error DLB itself answers, one stable ``error.code`` per condition.

Why one table: clients (OpenAI SDKs, retry wrappers, dashboards) key on the code, so a condition
must read the same whichever part noticed it — "nothing can serve this" is ``dlb_no_capacity``
whether the root had no usable cell, refused because every cell was full, or a leaf had no
healthy server. The root ext_proc builds its replies from :data:`ERRORS`; every Envoy's
``local_reply_config`` (:func:`dlb.envoy.bootstrap.local_replies`) maps Envoy's response flags to
the same codes through :data:`ENVOY_FLAGS`. docs/operations.md lists the table (a test checks).
Bodies are OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_CAPACITY = "dlb_no_capacity"
NO_ENDPOINT = "dlb_no_endpoint"
UPSTREAM_FAILED = "dlb_upstream_failed"
UPSTREAM_TIMEOUT = "dlb_upstream_timeout"
HEADERS_TOO_LARGE = "dlb_request_headers_too_large"


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
}

#: Envoy's response flags on its own failure replies → the condition. UH: no healthy upstream; UO:
#: circuit breaker full (both: nothing in the cluster can take the request); NR: no route; UT:
#: upstream timeout; the rest a connect failure or a reset before any response byte.
ENVOY_FLAGS: dict[str, str] = {
    "UH": NO_CAPACITY, "UO": NO_CAPACITY, "NR": NO_ENDPOINT, "UT": UPSTREAM_TIMEOUT,
    "UF": UPSTREAM_FAILED, "URX": UPSTREAM_FAILED, "UC": UPSTREAM_FAILED, "UR": UPSTREAM_FAILED, "LR": UPSTREAM_FAILED,
}

#: Envoy's local replies that carry no response flag, matched by a CEL expression over the reply →
#: (condition, status, message). The codec's 431 (past Envoy's 100 fields or ``max_request_headers_kb``), and
#: ``header_mutation_result_exceeds_limit``: the client's headers fit, but not with the few the root
#: adds (``x-dlb-*``), which Envoy's ext_proc answered with a bare 500 — the client's doing, so 431 too.
ENVOY_REPLY_EXPRESSIONS: dict[str, tuple[str, int, str]] = {
    "response.code == 431 || response.code_details == 'header_mutation_result_exceeds_limit'": (
        HEADERS_TOO_LARGE, 431, "the request's headers are too many or too large"),
}

#: ``retry-after`` (seconds) where waiting helps and nothing better is known: every root re-probes
#: within it, and a leaf's health check (0.5 s) has looked again.
DEFAULT_RETRY_AFTER_S = 1
