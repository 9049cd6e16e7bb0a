"""Render concrete Envoy bootstraps (root and leaf) from a DLB config.

``envoy_configs/root.yaml`` and ``leaf.yaml`` are the commented templates people copy; this module
produces the same shape for a given config and cell (ports, cells, weights, WAN delays), as plain dicts
dumped with ``yaml.safe_dump``, for the testbed and the tests. docs/envoy-configs.md explains each
setting. The header names here are the contract between the Envoys and the DLB services:

* ``x-dlb-cell``: set by the root ext_proc; the value is the *cluster name* ``cell-<name>``; the
  root routes match it exactly per allowed cell (anything else falls back to the weights).
* ``x-dlb-src-cell``: the root Envoy's own cell, added by the root's route config (not by the
  ext_proc, so it is present even when the ext_proc is down); the leaf uses it for WAN emulation,
  and believes it only next to ``x-dlb-root-token`` (:mod:`dlb.envoy.root_token`).
* ``x-dlb-endpoint``: the endpoint name, added by the root route that matched.
* ``x-dlb-server``: set by an optional leaf ext_proc; ``ip:port`` of the chosen server, read by an
  ORIGINAL_DST cluster on the leaf.

All four are ``internal_only_headers`` on the root: Envoy strips them from client requests before
any filter runs or any route is chosen, so a client cannot steer traffic. A leaf strips ``x-dlb-server``
and ``x-dlb-cell`` from everyone and drops ``x-dlb-src-cell`` from requests without the roots' token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from dlb.config.hostport import is_ip
from dlb.config.model import CELL_CLUSTER_PREFIX, OPERATOR_BASELINES, AffinityParams, Config, Endpoint, HostPort, Mechanism, loopback_name
from dlb.config.tls import identity_name, spiffe_id
from dlb.core.hold_queue import MAX_HOLD_S, REPLY_MARGIN_S
from dlb.core.native_discrete import DEFAULT_PICK, PICKS, WEIGHT_SCALE
from dlb.envoy import contract as _h
from dlb.envoy import replies
from dlb.envoy.als import add_leaf_access_log
from dlb.envoy.contract import (
    HEALTH_PATH,
    LEAF_EXT_PROC_CLUSTER,
    LEAF_HEALTH_PATH,
    LEAF_PICKED_CLUSTER,
    LEAF_SERVERS_CLUSTER,
    READY_LISTENER,
    READY_PATH,
    ROOT_EXT_PROC_CLUSTER,
    SERVER_CHECK_INTERVAL_S,
    SERVER_CHECK_JITTER_S,
    SERVER_CHECK_TIMEOUT_S,
    SERVER_CHECK_UNHEALTHY_THRESHOLD,
)
from dlb.envoy.health_check import service_health
from dlb.envoy.operator_pool import POOL_CLUSTER, POOL_KINDS, pool_cluster
from dlb.envoy.root_token import token_check, token_injector, token_secret
from dlb.envoy.tls import upstream_tls

HEADER_CELL = _h.CELL
HEADER_FALLBACK = _h.FALLBACK
HEADER_SRC_CELL = _h.SRC_CELL
HEADER_SERVER = _h.SERVER
HEADER_ROOT_TOKEN = _h.ROOT_TOKEN
HEADER_ENDPOINT = _h.ENDPOINT
#: Every x-dlb-* header the system uses; all are stripped from client requests at the root.
INTERNAL_HEADERS = tuple(dict.fromkeys((*_h.INTERNAL, HEADER_ENDPOINT)))

#: Largest request header block a client may send (Envoy's default, stated explicitly). Only headers
#: go to the ext_proc, so a gRPC message never carries more than this plus framing.
MAX_REQUEST_HEADERS_KB = 60
#: Per-connection buffer limit on listeners and clusters (Envoy's default, stated explicitly).
BUFFER_LIMIT_BYTES = 1 << 20
#: Largest gRPC message Envoy accepts from an ext_proc: a full header map plus mutations fits with
#: room to spare, and it stays well under the buffer limit so one message never stalls a connection.
EXT_PROC_MAX_MESSAGE_BYTES = 4 * MAX_REQUEST_HEADERS_KB * 1024
#: Circuit-breaker thresholds: DLB does the balancing, so Envoy's defaults (1024 requests per cluster)
#: must not turn a busy cell into 503 overflows; long generations keep many requests in flight.
HIGH_THRESHOLDS = {"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000, "max_retries": 16}
MAX_DOWNSTREAM_CONNECTIONS = 50000
#: An internal-address list that matches no TCP peer, so every client request is external.
LEAF_INTERNAL_HEADERS = _h.LEAF_INTERNAL
NO_INTERNAL_ADDRESSES = {"cidr_ranges": [{"address_prefix": "255.255.255.255", "prefix_len": 32}]}


# --------------------------------------------------------------------------------------------
# Small builders
# --------------------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    """Protobuf JSON duration at microsecond resolution ("0.062s", "600s", "0s")."""
    text = f"{seconds:.6f}".rstrip("0").rstrip(".")
    return (text if text not in ("", "0", "-0") else "0") + "s"


def _socket(hp: HostPort) -> dict[str, Any]:
    return {"socket_address": {"address": hp.host, "port_value": hp.port}}


def _lb_endpoints(addrs: list[tuple[HostPort, int]]) -> list[dict[str, Any]]:
    return [{"endpoint": {"address": _socket(hp)}, "load_balancing_weight": w} for hp, w in addrs]


def _cluster(name: str, addrs: list[tuple[HostPort, int]], *, lb_policy: str = "ROUND_ROBIN", http2: bool = False,
             connect_timeout_s: float = 1.0, tls: dict[str, Any] | None = None) -> dict[str, Any]:
    """A cluster of fixed hosts: STATIC for IPs, STRICT_DNS when any host is a DNS name; ``tls``: its transport socket."""
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC" if all(is_ip(hp.host) for hp, _ in addrs) else "STRICT_DNS",
        "connect_timeout": _duration(connect_timeout_s),
        "lb_policy": lb_policy,
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "circuit_breakers": {"thresholds": [dict(HIGH_THRESHOLDS, priority="DEFAULT")]},
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": _lb_endpoints(addrs)}]},
    }
    if cluster["type"] == "STRICT_DNS":
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    if tls is not None:
        cluster["transport_socket"] = tls
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        # Windows at least the buffer limit: a header message is never held back by flow control.
                        "initial_stream_window_size": BUFFER_LIMIT_BYTES,
                        "initial_connection_window_size": BUFFER_LIMIT_BYTES,
                        # Detect a dead ext_proc on an idle connection instead of on the next request.
                        "connection_keepalive": {"interval": "10s", "timeout": "5s"},
                    }
                },
            }
        }
    return cluster


def dlb_service_tls(cfg: Config, role: str, cell: str) -> dict[str, Any] | None:
    """With the config's ``tls``: the transport socket from the (role, cell) Envoy to its own cell's
    DLB service of that role (root ext_proc; leaf ext_proc and agent), mutual TLS on both identities."""
    if cfg.tls is None:
        return None
    return upstream_tls(cfg.tls, identity_name(role, cell), spiffe_id(role, cell))


def _picked_cluster() -> dict[str, Any]:
    """ORIGINAL_DST cluster that connects to the ``ip:port`` in x-dlb-server (the leaf ext_proc's pick)."""
    return {
        "name": LEAF_PICKED_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "1s",
        "cleanup_interval": "60s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": HEADER_SERVER},
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "circuit_breakers": {"thresholds": [dict(HIGH_THRESHOLDS, priority="DEFAULT")]},
    }


#: What the leaf retries: only failures where the server cannot have started the request — the
#: connection was refused or timed out, an HTTP/2 server refused the stream, or the stream was reset
#: before Envoy sent any byte of the request. A generation that started is never replayed (it may have
#: cost GPU time, and a partial stream cannot be resumed).
SAFE_RETRY_ON = "connect-failure,refused-stream,reset-before-request"
#: The servers cluster panics (routes to every server) only below this healthy share: none healthy.
SERVER_PANIC_PERCENT = 1.0


def _server_health(cluster: dict[str, Any]) -> dict[str, Any]:
    """Take a *dead* server out of rotation within about a second, and never a merely *slow* one.

    A dead server kept getting traffic in LEAST_REQUEST mode (its requests failed fast, so it looked
    least loaded); a slow one was taken out with the dead ones (a 1-s ``/health`` timeout, and outlier
    detection allowed to eject every server), so an overloaded cell answered 503 to everything. So:

    - *active health check* of ``/health`` every 0.5 s (``no_traffic_interval`` too: an idle cell must
      not keep a dead server for a minute). A non-200 answer takes a server out at once; refused
      connects or late answers (waited for :data:`~dlb.envoy.contract.SERVER_CHECK_TIMEOUT_S`) only
      :data:`~dlb.envoy.contract.SERVER_CHECK_UNHEALTHY_THRESHOLD` in a row (why those numbers: there);
    - *outlier detection* only on what a server does wrong, never on its speed: 2 consecutive
      local-origin failures (connect refused, reset; the leaf sets no request timeout, so slowness is
      never one) or 5 consecutive 5xx answers; at most half the servers ejected, so it alone cannot
      empty a cell;
    - *panic only when no server is healthy* (threshold 1 %: below it in cells of up to 100 servers
      means none): Envoy then spreads requests over all servers instead of answering 503 itself; the
      leaf agent, which counts healthy what this Envoy does (``--envoy-admin``), reports 0 healthy
      replicas and roots stop sending here. With some servers healthy, only they get requests.

    Retries (:data:`SAFE_RETRY_ON`) are a route setting, with their budget here.
    """
    cluster["health_checks"] = [{
        "timeout": _duration(SERVER_CHECK_TIMEOUT_S), "interval": _duration(SERVER_CHECK_INTERVAL_S),
        "no_traffic_interval": _duration(SERVER_CHECK_INTERVAL_S), "unhealthy_threshold": SERVER_CHECK_UNHEALTHY_THRESHOLD,
        "healthy_threshold": 1, "interval_jitter": _duration(SERVER_CHECK_JITTER_S), "http_health_check": {"path": HEALTH_PATH},
    }]
    cluster["outlier_detection"] = {
        "split_external_local_origin_errors": True,
        "consecutive_local_origin_failure": 2, "enforcing_consecutive_local_origin_failure": 100,
        "consecutive_5xx": 5, "enforcing_consecutive_5xx": 100, "enforcing_consecutive_gateway_failure": 0,
        "enforcing_success_rate": 0, "enforcing_local_origin_success_rate": 0,
        "interval": "1s", "base_ejection_time": "2s", "max_ejection_time": "30s", "max_ejection_percent": 50,
    }
    cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": SERVER_PANIC_PERCENT}}
    # Retries may add at most 20 % to the requests in flight (3 concurrent at least): a budget, not a
    # count, so a cell-wide failure cannot multiply the load on the servers that are left.
    thresholds = cluster["circuit_breakers"]["thresholds"][0]
    thresholds.pop("max_retries", None)
    thresholds["retry_budget"] = {"budget_percent": {"value": 20.0}, "min_retry_concurrency": 3}
    return cluster


#: The root's check of each leaf replica (:func:`_leaf_replica_health`): how long it waits for the leaf
#: Envoy's own answer, and how many late answers in a row take the replica out. The answer comes from
#: the leaf Envoy's event loop, not from a server, so a cell's load does not delay it; only a starved
#: or stopped Envoy does. The slowest answer measured from a live leaf Envoy under load on a busy 2-core
#: box (load 3-4, tests/e2e/test_leaf_replicas_e2e.py) was 25 ms, so 1 s is 40 times that; two in a row
#: keep one stall of the box from ejecting a live replica. A frozen one is out in about 3 s (measured).
LEAF_CHECK_TIMEOUT_S = 1.0
LEAF_CHECK_UNHEALTHY_THRESHOLD = 2


def _leaf_replica_health(cluster: dict[str, Any]) -> dict[str, Any]:
    """A cell with leaf replicas (one endpoint each): a dead or frozen replica out of rotation within
    seconds, the cell never emptied by Envoy.

    An HTTP check of :data:`~dlb.envoy.contract.LEAF_HEALTH_PATH` every 0.5 s, which the leaf Envoy
    answers itself (:func:`leaf_health_filter`): a TCP check passed for a frozen (SIGSTOPped) Envoy,
    since the kernel completes the handshake, and the root kept sending it requests that hung. A killed
    Envoy refuses at once; a frozen one answers nothing (:data:`LEAF_CHECK_TIMEOUT_S`); a draining one
    answers 503. Requests sent to a frozen replica before the check fails wait for it to wake (Envoy
    closes only idle connections to a failed host, ``close_connections_on_host_health_failure``
    included, measured): they are its in-flight requests, not retried. Outlier detection on 2 consecutive refused
    or reset connections; at most half the replicas ejected and no panic threshold of our own — whether
    the cell is usable at all is the roots' call, from probes of every replica
    (:mod:`dlb.core.leaf_replicas`). Requests a dead replica held are retried on the fallback cell, or
    with none on another replica (:func:`_other_host_retries`)."""
    cluster["health_checks"] = [{
        "timeout": _duration(LEAF_CHECK_TIMEOUT_S), "interval": "0.5s", "no_traffic_interval": "0.5s",
        "unhealthy_threshold": LEAF_CHECK_UNHEALTHY_THRESHOLD, "healthy_threshold": 1,
        "http_health_check": {"path": LEAF_HEALTH_PATH},
    }]
    cluster["outlier_detection"] = {
        "split_external_local_origin_errors": True,
        "consecutive_local_origin_failure": 2, "enforcing_consecutive_local_origin_failure": 100,
        "enforcing_consecutive_5xx": 0, "enforcing_consecutive_gateway_failure": 0,
        "enforcing_success_rate": 0, "enforcing_local_origin_success_rate": 0,
        "interval": "1s", "base_ejection_time": "2s", "max_ejection_time": "30s", "max_ejection_percent": 50,
    }
    return cluster


def leaf_health_filter() -> dict[str, Any]:
    """The leaf Envoy's answer to the roots' check (:func:`_leaf_replica_health`), first in its chain.

    Answered by Envoy (``pass_through_mode`` off): 200 while it serves, 503 after ``POST /healthcheck/fail``
    (``dlb envoy drain``), so a draining replica leaves the roots' rotation. No filter after it runs (the
    ext_proc never sees a check) and the access log skips the path (:func:`dlb.envoy.als.leaf_access_log`):
    a check is not a request the agent counts.
    """
    return {"name": "envoy.filters.http.health_check", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck",
        "pass_through_mode": False,
        "headers": [{"name": ":path", "string_match": {"exact": LEAF_HEALTH_PATH}}],
    }}


def local_replies() -> dict[str, Any]:
    """Envoy's own failure replies as OpenAI-shaped JSON errors with DLB's codes (:mod:`dlb.envoy.replies`).

    Clients of DLB speak the OpenAI API; Envoy's text/plain "no healthy upstream" reached an OpenAI
    SDK as a bare ``Error code: 503``, and its details (``no_healthy_upstream``) named the same
    condition differently from the root's reply. One mapper per code, matched on the response flag,
    so the root ext_proc's own replies (ImmediateResponse, no flag) and every upstream server's error
    pass through untouched; the message keeps Envoy's details for operators. Where waiting helps,
    ``retry-after: 1``. A path no route matches is the client's mistake: 404, no ``retry-after``
    (Envoy's own body for it is empty). Replies with no flag that are the client's doing (headers past
    the limits) are matched by a CEL expression (:data:`replies.ENVOY_REPLIES`).
    """
    mappers = []
    for code, kind in replies.ERRORS.items():
        flags = [f for f, c in replies.ENVOY_FLAGS.items() if c == code]
        if not flags:
            continue
        mapper: dict[str, Any] = {"filter": {"response_flag_filter": {"flags": flags}}, "body_format_override": {"json_format": {
            "error": {"message": "dlb: %LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)", "type": kind.type, "param": None, "code": code}}}}
        if code == replies.NO_ENDPOINT:
            mapper["body_format_override"]["json_format"]["error"]["message"] = replies.NO_ENDPOINT_MESSAGE
        if kind.retry:
            mapper["headers_to_add"] = [{"header": {"key": "retry-after", "value": str(replies.DEFAULT_RETRY_AFTER_S)},
                                         "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
        mappers.append(mapper)
    for r in replies.ENVOY_REPLIES:
        # Local replies only, so the expression costs nothing on a proxied request.
        mapper = {"filter": {"extension_filter": {"name": "envoy.access_loggers.extension_filters.cel", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter", "expression": r.expression}}},
            "body_format_override": {"json_format": {"error": {
                "message": f"dlb: {r.message} (%RESPONSE_CODE_DETAILS%)", "type": replies.ERRORS[r.code].type, "param": None, "code": r.code}}}}
        if r.status is not None:
            mapper["status_code"] = r.status
        mappers.append(mapper)
    return {"mappers": mappers}


def leaf_ext_proc_cluster(ext_proc: HostPort, probe: HostPort, tls: dict[str, Any] | None = None) -> dict[str, Any]:
    """The leaf ext_proc cluster, health-checked with gRPC health *at the agent's probe address*.

    The agent serves its ext_proc on its own address (DLB's HTTP/2 transport by default, one method
    only, no health service) but its probe/access-log server always has ``grpc.health.v1``, which turns
    NOT_SERVING the moment the agent starts draining (SIGTERM). Checking there (the endpoint's
    ``health_check_config``) makes Envoy mark the ext_proc unhealthy during the drain and stop opening
    ext_proc streams to it — requests then take LEAST_REQUEST — while the streams already open finish.
    A TCP check of the ext_proc port would only fail once the agent had closed it, with streams in flight.
    ``tls``: the transport socket under mutual TLS (the health check uses it too; the probe server
    serves the same identity).
    """
    cluster = service_health(_cluster(LEAF_EXT_PROC_CLUSTER, [(ext_proc, 1)], http2=True, connect_timeout_s=0.25, tls=tls),
                             grpc_health=True)
    at: dict[str, Any] = {"port_value": probe.port}
    if probe.host != ext_proc.host:
        at["address"] = {"socket_address": {"address": probe.host, "port_value": probe.port}}
    for group in cluster["load_assignment"]["endpoints"]:
        for lb in group["lb_endpoints"]:
            lb["endpoint"]["health_check_config"] = at
    return cluster


def _safe_retries() -> dict[str, Any]:
    """Route retry policy for the server cluster: another server, only where nothing was sent (see above)."""
    return {
        "retry_on": SAFE_RETRY_ON,
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": 3,
        "retry_back_off": {"base_interval": "0.01s", "max_interval": "0.1s"},
    }




#: What the root retries on the fallback cell: its connection to the cell failed or was refused, it
#: was reset before any response header (the leaf Envoy died), or the cell answered one of
#: :data:`CROSS_CELL_RETRY_STATUSES`. Envoy never retries once response headers went to the client, so
#: a stream that started answering is never replayed; a request the dead cell had started is generated
#: again elsewhere (the client gets an answer, a GPU pays twice).
CROSS_CELL_RETRY_ON = "connect-failure,refused-stream,reset,retriable-status-codes"
#: Answers that say the cell served nothing: 503 (the leaf Envoy found no live server, or a server was
#: stopping) and 429 (the leaf's admission refused the request, or the server's queue was full). Other
#: 5xx reach the client as they are: the cell may have done the work.
CROSS_CELL_RETRY_STATUSES = (503, 429)


def fallback_cluster_name(cluster: str, fallback: str) -> str:
    """The aggregate cluster ``cell-<a>`` then ``cell-<b>`` (cell names have no dots: no clash)."""
    return f"{cluster}.or.{fallback.removeprefix(CELL_CLUSTER_PREFIX)}"


def aggregate_cells(cluster: str) -> list[str]:
    """The cell clusters a cluster name stands for: itself, or both of an aggregate (:func:`fallback_cluster_name`)."""
    first, _, then = cluster.partition(".or.")
    return [first, CELL_CLUSTER_PREFIX + then] if then else [first]


#: Prefix of a native-discrete endpoint's cluster: every allowed cell's leaf as one host of it.
NATIVE_CLUSTER_PREFIX = "dlb-native."


def native_cluster_name(endpoint: str) -> str:
    """The cluster Envoy's load balancer picks cells from for a ``native-discrete`` endpoint."""
    return NATIVE_CLUSTER_PREFIX + endpoint


def native_discrete_cluster(endpoint: str, dests: list[Any], pick: str = DEFAULT_PICK) -> dict[str, Any]:
    """Cells as hosts, with the ``lb_policy`` of the endpoint's ``pick`` (:data:`dlb.core.native_discrete.PICKS`:
    ``LEAST_REQUEST``, each weight divided by the cell's active requests + 1, or ``ROUND_ROBIN``, the
    weights alone), weights refreshed by the control plane over EDS from probes (replica counts until
    then). Panic mode off: a cell the control plane marks unusable is never picked while another is
    usable (the control plane never marks them all)."""
    cluster = _cluster(native_cluster_name(endpoint), [(d.leaf.address, d.replicas) for d in dests], lb_policy=PICKS[pick].lb_policy)
    cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0}}
    cluster["circuit_breakers"]["thresholds"][0]["max_retries"] = HIGH_THRESHOLDS["max_requests"]
    return cluster


#: Host reselections of a native cluster's retry: its weights run from 1 to ``WEIGHT_SCALE``, and Envoy's
#: weighted schedule picks a host of weight 1 once in ``WEIGHT_SCALE`` picks of one at the top, so fewer
#: reselections sent the retry back to the failed cell when it held nearly all the weight.
NATIVE_RESELECTIONS = WEIGHT_SCALE + 1


def _other_host_retries(reselections: int = 3) -> dict[str, Any]:
    """Once, on another host of the cluster (never the one that failed), for what the cross-cell retry covers:
    another cell of a native cluster, or another leaf replica of a cell the root picked with no fallback.
    ``reselections``: how many picks may be refused as the failed host before Envoy takes it anyway (each
    one pick of the load balancer, on the retry only)."""
    return {
        "retry_on": CROSS_CELL_RETRY_ON,
        "retriable_status_codes": list(CROSS_CELL_RETRY_STATUSES),
        "num_retries": 1,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": reselections,
        "retry_back_off": {"base_interval": "0.005s", "max_interval": "0.02s"},
    }


def _fallback_cluster(cluster: str, fallback: str) -> dict[str, Any]:
    """An aggregate cluster: priority 0 is ``cluster``'s leaf, priority 1 ``fallback``'s. Requests go to
    the first; the route's retry (previous_priorities) goes to the second."""
    return {
        "name": fallback_cluster_name(cluster, fallback),
        "connect_timeout": "1s",
        "lb_policy": "CLUSTER_PROVIDED",
        "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig", "clusters": [cluster, fallback]}},
        "circuit_breakers": {"thresholds": [dict(HIGH_THRESHOLDS, priority="DEFAULT", max_retries=HIGH_THRESHOLDS["max_requests"])]},
    }


#: The retry priority of :func:`_cross_cell_retries`: a route carrying it retries across the cells of an
#: aggregate cluster, so the control plane names aggregates in its weighted clusters (:func:`flow_cluster_name`).
PREVIOUS_PRIORITIES = "envoy.retry_priorities.previous_priorities"


def _cross_cell_retries() -> dict[str, Any]:
    """Once, on the other priority of the aggregate cluster (the fallback cell), without back-off
    worth speaking of: the fallback cell is healthy, the failure was the first cell's."""
    return {
        "retry_on": CROSS_CELL_RETRY_ON,
        "retriable_status_codes": list(CROSS_CELL_RETRY_STATUSES),
        "num_retries": 1,
        "retry_priority": {"name": PREVIOUS_PRIORITIES, "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
            "update_frequency": 1}},
        "retry_back_off": {"base_interval": "0.005s", "max_interval": "0.02s"},
    }


#: The cluster of Envoy's own admin (127.0.0.1), which the ready listener exposes for /stats/prometheus only.
ADMIN_STATS_CLUSTER = "dlb_admin_stats"
STATS_PATH = "/stats/prometheus"


def admin_stats_cluster(admin_port: int) -> dict[str, Any]:
    """Envoy's admin as a cluster, so the ready listener can serve its Prometheus stats (and nothing else of it)."""
    return _cluster(ADMIN_STATS_CLUSTER, [(HostPort("127.0.0.1", admin_port), 1)], connect_timeout_s=0.25)


def ready_port_clash(admin_port: int, ready_port: int | None) -> str | None:
    """Why ``ready_port`` cannot be used beside ``admin_port``, or None: one port for both is a bootstrap
    Envoy refuses at start ("address already in use"), after every check had passed (a stranger's
    ``--admin-port 9902`` met the ready port's default, 9902)."""
    if ready_port and ready_port == admin_port:
        return (f"--ready-port {ready_port} is also the admin port (--admin-port {admin_port}): "
                "give the ready listener another port, or --ready-port 0 for none")
    return None


def ready_listener(port: int, host: str = "0.0.0.0") -> dict[str, Any]:
    """``GET /ready`` on ``host:port``: 200 while Envoy serves, 503 once it fails health checks.

    ``host``: the traffic listener's (a loopback leaf keeps its stats off the network); all interfaces
    where the bootstrap has no listener of its own (xDS), as a kubelet probes the pod's address.

    ``GET /stats/prometheus`` there is Envoy's own stats, from admin (:func:`admin_stats_cluster`): a
    Prometheus in another pod can scrape Envoy while admin (which can quit it) stays on loopback.

    Why a listener of its own: admin stays on 127.0.0.1 (it can quit Envoy), so a kubelet cannot reach
    admin's ``/ready``. Envoy opens listeners only after its first xDS config is in (init), and the
    ``health_check`` filter answers 503 after ``POST /healthcheck/fail`` (``dlb envoy drain`` does
    that first), so the pod leaves its Service before its listeners drain. Anything but ``/ready`` is 404.
    """
    stats = {"match": {"path": STATS_PATH, "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
             "route": {"cluster": ADMIN_STATS_CLUSTER, "timeout": "5s"}}
    route_config = {"name": READY_LISTENER, "virtual_hosts": [{"name": "ready", "domains": ["*"], "routes": [
        stats, {"match": {"prefix": "/"}, "direct_response": {"status": 404}}]}]}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": READY_LISTENER,
        "codec_type": "AUTO",
        "route_config": route_config,
        "request_headers_timeout": "5s",
        "http_filters": [{"name": "envoy.filters.http.health_check", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck",
            "pass_through_mode": False,
            "headers": [{"name": ":path", "string_match": {"exact": READY_PATH}}],
        }}, _router()],
    }
    return {
        "name": READY_LISTENER,
        "address": _socket(HostPort(host, port)),
        "enable_reuse_port": False,
        "per_connection_buffer_limit_bytes": 32 * 1024,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
    }


def _bootstrap(role: str, cell: str, admin_port: int, listener: dict[str, Any], clusters: list[dict[str, Any]],
               ready_port: int | None = None) -> dict[str, Any]:
    host = listener["address"]["socket_address"]["address"]
    listeners = [listener] + ([ready_listener(ready_port, host)] if ready_port is not None else [])
    if ready_port is not None:
        clusters = [*clusters, admin_stats_cluster(admin_port)]
    return {
        "node": {"id": f"{role}-{cell}", "cluster": f"dlb-{role}", "locality": {"zone": cell}},
        # Admin can quit Envoy and dump its config: loopback only, whatever the listeners bind to.
        "admin": {"address": _socket(HostPort("127.0.0.1", admin_port))},
        "static_resources": {"listeners": listeners, "clusters": clusters},
        "overload_manager": overload_manager(),
    }


def overload_manager() -> dict[str, Any]:
    """The downstream connection cap, shared by static and xDS bootstraps (without one Envoy warns at start
    and accepts connections until file descriptors run out)."""
    return {
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": MAX_DOWNSTREAM_CONNECTIONS,
                },
            }
        ]
    }


def _ext_proc_filter(cluster: str, message_timeout_ms: float, stat_prefix: str, forward_headers: list[str],
                     max_message_timeout_s: float | None = None) -> dict[str, Any]:
    extra = {"max_message_timeout": _duration(max_message_timeout_s)} if max_message_timeout_s else {}
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster, "max_receive_message_length": EXT_PROC_MAX_MESSAGE_BYTES}},
            # Fail open: a dead or slow service means "route by the last weights", never a 5xx.
            "failure_mode_allow": True,
            "message_timeout": _duration(message_timeout_ms / 1000.0),
            **extra,
            # Request headers only: no body waits on Python (stream_tokens_filter copies response bodies, unawaited).
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SKIP",
                "request_body_mode": "NONE",
                "response_body_mode": "NONE",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
            "allow_mode_override": False,
            # Only the headers the service reads are sent to it: less for Envoy to serialise and for
            # Python to parse per request, and credentials (authorization, cookies) never reach it.
            "forward_rules": {"allowed_headers": {"patterns": [{"exact": h} for h in forward_headers]}},
            # Re-pick the route only when the service asks (clear_route_cache after setting the header).
            "route_cache_action": "DEFAULT",
            "stat_prefix": stat_prefix,
        },
    }


LEAF_FORWARD_HEADERS = list(_h.LEAF_FORWARD_HEADERS)
#: The leaf's second ext_proc filter: response bodies to the agent, which counts decoded tokens.
STREAM_TOKENS_FILTER = "dlb.leaf.stream_tokens"


def stream_tokens_filter(cluster: str = LEAF_EXT_PROC_CLUSTER) -> dict[str, Any]:
    """Response bodies to the leaf agent, which counts each DP rank's decoded tokens from them
    (:mod:`dlb.ext_proc.leaf_tokens`). ``observability_mode``: Envoy sends and goes on, never waiting for
    the agent, so the client's tokens are not delayed; the call opens with the request id (headers, async
    too) and the agent ends it at once for a request not on a DP rank. After the pick filter: the pick
    is made by then."""
    f = _ext_proc_filter(cluster, 200.0, "dlb_leaf_tokens", [_h.REQUEST_ID])
    tc = f["typed_config"]
    f["name"] = STREAM_TOKENS_FILTER
    tc["observability_mode"] = True
    tc["processing_mode"] = dict(tc["processing_mode"], response_body_mode="STREAMED")
    del tc["route_cache_action"]
    tc["disable_clear_route_cache"] = True
    return f


def root_forward_headers(cfg: Config) -> list[str]:
    """What the root ext_proc reads: ``:path`` (the endpoint) and the session headers of affinity.

    Every endpoint's affinity header is forwarded, enabled or not, plus the default name, so turning
    affinity on over xDS works without re-rendering Envoy as long as the header name is one of these.
    """
    names = [":path", _h.TRACEPARENT, AffinityParams().header.lower()]
    for ep in cfg.endpoints:
        h = ep.policy.affinity.header.lower()
        if h not in names:
            names.append(h)
    return names


def _router() -> dict[str, Any]:
    return {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def _hcm(stat_prefix: str, route_config: dict[str, Any], http_filters: list[dict[str, Any]], *, edge: bool) -> dict[str, Any]:
    hcm: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "codec_type": "AUTO",
        "route_config": route_config,
        "http_filters": http_filters,
        "max_request_headers_kb": MAX_REQUEST_HEADERS_KB,
        "request_headers_timeout": "10s",  # slow-loris guard; does not limit long generations
        "stream_idle_timeout": "300s",
        "request_timeout": "0s",  # whole-request limits are per endpoint on the routes
        "normalize_path": True,
        "merge_slashes": True,
        "common_http_protocol_options": {"idle_timeout": "3600s", "headers_with_underscores_action": "DROP_HEADER"},
        "local_reply_config": local_replies(),
    }
    if edge:
        # The root is the edge: the peer address, not a client-supplied X-Forwarded-For, decides whether
        # a request is internal, and *no* peer may be internal, else internal_only_headers are kept.
        # Measured on Envoy 1.40 (tests/e2e/test_envoy_configs.py): with `internal_address_config:
        # {cidr_ranges: []}` a loopback/RFC1918 client counts as internal and its spoofed x-dlb-cell
        # wins; so we list one range no TCP peer can have (the limited broadcast address).
        hcm["use_remote_address"] = True
        hcm["xff_num_trusted_hops"] = 0
        hcm["internal_address_config"] = NO_INTERNAL_ADDRESSES
    return hcm


def _listener(name: str, listen: HostPort, hcm: dict[str, Any], reuse_port: bool) -> dict[str, Any]:
    return {
        "name": name,
        "address": _socket(listen),
        # Envoy's default (SO_REUSEPORT) lets a second Envoy bind the same port *silently* and take
        # part of the traffic (measured: two roots on one port split requests). Off, a clash is a
        # bind error at start; workers then share one accept socket, fine at our connection counts.
        "enable_reuse_port": reuse_port,
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
    }


def _bind(hp: HostPort) -> HostPort:
    """A listener needs an IP: a DNS name in the config is how *others* reach us, so bind all interfaces —
    but ``localhost`` means this host only (loopback)."""
    if is_ip(hp.host):
        return hp
    return HostPort("127.0.0.1" if loopback_name(hp.host) else "0.0.0.0", hp.port)


# --------------------------------------------------------------------------------------------
# Root
# --------------------------------------------------------------------------------------------


def fallback_weights(cfg: Config, cell: str) -> dict[str, int]:
    """Fail-open weights of a root in ``cell``: replica counts over the allowed destinations (Rand)."""
    return {d.name: d.replicas for d in cfg.allowed_destinations(cell)}


def flow_fallbacks(cfg: Config, cell: str) -> dict[str, str]:
    """For each cell a root in ``cell`` may send to, the cell its native flow route retries on: the other
    allowed cell nearest to the root (round trip from ``cell``, then config order); empty with one cell.

    Fixed per (root, destination), so the aggregate clusters are static and a weight change is an RDS
    push only. Nearest to the root because the root sends the retry: it adds the least time to a request
    that already failed once, and it is the root's own cell when that is allowed. Always an allowed cell:
    the aggregate's second priority, which also takes the traffic at once while every leaf of the first
    fails its health check, can never be a cell this root may not send to."""
    allowed = cfg.allowed_destinations(cell)
    return {d.name: min((o for o in allowed if o is not d), key=lambda o: (cfg.rtt_ms(cell, o.name), o.index)).name
            for d in allowed if len(allowed) > 1}


def flow_cluster_name(cfg: Config, dest: str, fallbacks: Mapping[str, str]) -> str:
    """The cluster a native flow route's weight for ``dest`` names: ``dest`` then its fallback, or the bare cell."""
    fb = fallbacks.get(dest)
    return fallback_cluster_name(cfg.cell(dest).cluster_name, cfg.cell(fb).cluster_name) if fb else cfg.cell(dest).cluster_name


def _runs_natively(ep: Endpoint, native_flow: bool) -> bool:
    """Flow (Envoy samples the weights) or native-discrete (Envoy's load balancer over cells) without
    affinity, on a root configured by the control plane; anything else takes the ext_proc."""
    return native_flow and (ep.policy.mechanism is Mechanism.FLOW or ep.policy.native) and not ep.policy.affinity.enabled


def root_has_ext_proc(cfg: Config, native_flow: bool) -> bool:
    """Whether a root Envoy rendered from ``cfg`` carries the ext_proc filter: not under an operator
    baseline (Envoy alone decides), nor when every endpoint runs natively (``--native-flow``)."""
    return cfg.policy.weights not in OPERATOR_BASELINES and not all(_runs_natively(ep, native_flow) for ep in cfg.endpoints)


def _endpoint_routes(ep: Endpoint, weights: Mapping[str, int], cfg: Config, native_flow: bool, allowed: list[str],
                     has_ext_proc: bool = True, pool: str | None = None,
                     fallbacks: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One route per allowed cell (x-dlb-cell == cell-<name>), then the fail-open weighted route.

    Exact per-cell matches rather than ``cluster_header``: a pick naming an unknown or forbidden cell,
    or a cluster that is not a cell at all (the ext_proc's own), falls through to the weights instead
    of a 503 or a request sent to the wrong place. Measured with cluster_header on Envoy 1.40: all
    three gave 503s (tests/e2e/test_envoy_configs.py::test_root_bad_pick_falls_back_to_weights).
    ``pool``: the fail-open route goes to this cluster instead of the weights (operator baselines).
    ``fallbacks`` (:func:`flow_fallbacks`): the fail-open route weights aggregate clusters (cell, fallback)
    and retries once on the fallback, as a root's pick does: a flow endpoint run natively always takes
    it, an ext_proc endpoint whenever its root service is down, slow or undecided — a dead leaf Envoy
    then costs no more than with the service up. Not a native-discrete endpoint's (Envoy's load
    balancer over cells retries on another host of its own cluster).
    """
    action = {"timeout": _duration(ep.timeout_s), "idle_timeout": _duration(ep.idle_timeout_s)}
    native = _runs_natively(ep, native_flow) and ep.policy.native
    across = fallbacks if fallbacks and not native and not pool else {}
    clusters = [{"name": flow_cluster_name(cfg, name, across), "weight": int(w)} for name, w in weights.items() if w > 0]
    per_filter: dict[str, Any] = {}
    # Tell the root service which endpoint this is (gRPC metadata on the ext_proc stream).
    ext_proc_route: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
        "overrides": {"grpc_initial_metadata": [{"key": HEADER_ENDPOINT, "value": ep.name}]},
    }
    if _runs_natively(ep, native_flow):
        # Flow without affinity runs natively: Envoy samples weighted_clusters, no Python hop.
        ext_proc_route = {"@type": ext_proc_route["@type"], "disabled": True}
    if has_ext_proc:
        per_filter["envoy.filters.http.ext_proc"] = ext_proc_route
    add_endpoint = [{"header": {"key": HEADER_ENDPOINT, "value": ep.name}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    # The root picked a cell and a fallback: one aggregate cluster per ordered pair, retried once across.
    pairs = [
        {
            "name": f"{ep.name}-to-{name}-or-{other}",
            "match": {"prefix": ep.match.prefix, "headers": [
                {"name": HEADER_CELL, "string_match": {"exact": cfg.cell(name).cluster_name}},
                {"name": HEADER_FALLBACK, "string_match": {"exact": cfg.cell(other).cluster_name}}]},
            "route": dict(action, cluster=fallback_cluster_name(cfg.cell(name).cluster_name, cfg.cell(other).cluster_name),
                          retry_policy=_cross_cell_retries()),
            "request_headers_to_add": add_endpoint,
            "typed_per_filter_config": per_filter,
        }
        for name in allowed for other in allowed if other != name
    ] if has_ext_proc and not _runs_natively(ep, native_flow) else []
    picked = [
        {
            "name": f"{ep.name}-to-{name}",
            "match": {"prefix": ep.match.prefix, "headers": [{"name": HEADER_CELL, "string_match": {"exact": cfg.cell(name).cluster_name}}]},
            "route": dict(action, cluster=cfg.cell(name).cluster_name,
                          **({"retry_policy": _other_host_retries()} if cfg.cell(name).leaf.replicated else {})),
            "request_headers_to_add": add_endpoint,
            "typed_per_filter_config": per_filter,
        }
        for name in allowed
    ]
    return pairs + picked + [
        {
            "name": f"{ep.name}-fallback",
            "match": {"prefix": ep.match.prefix},
            "route": (dict(action, cluster=native_cluster_name(ep.name), retry_policy=_other_host_retries(NATIVE_RESELECTIONS)) if native
                      else dict(action, cluster=pool) if pool else dict(action, weighted_clusters={"clusters": clusters},
                                                                        **({"retry_policy": _cross_cell_retries()} if across else {}))),
            "request_headers_to_add": add_endpoint,
            "typed_per_filter_config": per_filter,
        },
    ]


def root_bootstrap(
    cfg: Config,
    cell: str,
    *,
    admin_port: int,
    listen: HostPort | None = None,
    ext_proc: HostPort | None = None,
    weights: Mapping[str, int] | None = None,
    message_timeout_ms: float = 200.0,
    native_flow: bool = False,
    reuse_port: bool = False,
    ready_port: int | None = None,
) -> dict[str, Any]:
    """The root Envoy of ``cell``: client listener → ext_proc (picks a cell) → router.

    ``listen`` defaults to ``cells[].root.listen`` (``0.0.0.0:<port of root.address>``); ``ext_proc`` to ``cells[].root.ext_proc`` or
    ``services.root.ext_proc``; ``weights`` (cell name → integer weight, fail-open fallback) to
    :func:`fallback_weights`. ``native_flow`` disables the ext_proc on flow endpoints without affinity.
    ``reuse_port`` sets the listener's SO_REUSEPORT (off: a port clash fails loudly). ``ready_port``
    adds the :func:`ready_listener`.
    """
    me = cfg.cell(cell)
    listen = listen or me.root.bind
    if listen is None:
        raise ValueError(f"{cfg.source}: cells[{me.index}].root.address is not set; pass listen=")
    ext_proc = ext_proc or me.root.ext_proc or cfg.services.root.ext_proc
    allowed = [d.name for d in cfg.allowed_destinations(cell)]
    weights = dict(weights) if weights is not None else fallback_weights(cfg, cell)
    bad = sorted(set(weights) - set(allowed))
    if bad:
        raise ValueError(f"weights name cells {bad} that {cell} may not send to (allowed: {sorted(allowed)})")
    if not any(w > 0 for w in weights.values()):
        raise ValueError(f"fallback weights of {cell} are all zero: {weights}")
    # A root whose every endpoint runs natively has no ext_proc filter at all: a filter left in the
    # chain and disabled per route still costs every request its per-route lookup (docs/bench.md).
    # An operator baseline has none either: Envoy alone decides (dlb.envoy.operator_pool).
    operator = cfg.policy.weights in OPERATOR_BASELINES
    has_ext_proc = root_has_ext_proc(cfg, native_flow)
    pool = POOL_CLUSTER if cfg.policy.weights in POOL_KINDS else None
    # Not for an operator baseline: it runs what Envoy alone would, without DLB's cross-cell retry.
    fallbacks = {} if operator else flow_fallbacks(cfg, cell)
    routes = [r for ep in cfg.endpoints for r in _endpoint_routes(ep, weights, cfg, native_flow, allowed, has_ext_proc, pool, fallbacks)]
    route_config = {
        "name": "dlb_root",
        # Stripped from client requests before any filter runs or any route is picked (docs/design.md §2).
        "internal_only_headers": list(INTERNAL_HEADERS),
        # Our own cell, for the leaf's WAN emulation and accounting; added by Envoy itself so it is
        # there when the ext_proc is down too. The token leaves require next to it comes from the
        # token_injector filter (from a secret in the bootstrap, so it is never in the route config).
        "request_headers_to_add": [{"header": {"key": HEADER_SRC_CELL, "value": me.name}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
        "virtual_hosts": [{"name": "dlb", "domains": ["*"], "routes": routes}],
        # The fallback is the root Envoy's business (its route chose the pair); the leaf never sees it.
        "request_headers_to_remove": [HEADER_FALLBACK],
    }
    filters = [token_injector(), _router()]  # after the ext_proc: the token is never sent to it
    clusters = []
    if has_ext_proc:
        filters.insert(0, _ext_proc_filter(ROOT_EXT_PROC_CLUSTER, message_timeout_ms, "dlb_root", root_forward_headers(cfg)))
        tls = dlb_service_tls(cfg, "root", me.name)
        clusters.append(service_health(_cluster(ROOT_EXT_PROC_CLUSTER, [(ext_proc, 1)], http2=True, connect_timeout_s=0.25, tls=tls),
                                       grpc_health=False))
    dests = [d for d in cfg.cells if d.name in allowed]
    for d in dests:
        # A vllm cell (no DLB leaf) is its servers: Envoy's least-request picks among them.
        cluster = _cluster(d.cluster_name, list(d.upstreams()), lb_policy="LEAST_REQUEST" if d.leaf.source == "vllm" else "ROUND_ROBIN")
        # Each request is retried across cells at most once, so retries are bounded by requests; a
        # dead leaf Envoy resets every request it held at once, and each must get its retry.
        cluster["circuit_breakers"]["thresholds"][0]["max_retries"] = HIGH_THRESHOLDS["max_requests"]
        clusters.append(_leaf_replica_health(cluster) if d.leaf.replicated else cluster)
    # Aggregates (cell, fallback): every ordered pair for the root's picks, each cell's fallback for the
    # fail-open routes (every endpoint's but a native-discrete one's).
    pairs = [(a.name, b.name) for a in dests for b in dests if a is not b] if has_ext_proc else []
    if not pool and any(not (_runs_natively(ep, native_flow) and ep.policy.native) for ep in cfg.endpoints):
        pairs += [p for p in fallbacks.items() if p not in pairs]
    clusters += [_fallback_cluster(cfg.cell(a).cluster_name, cfg.cell(b).cluster_name) for a, b in pairs]
    clusters += [native_discrete_cluster(ep.name, dests, ep.policy.native_pick)
                 for ep in cfg.endpoints if _runs_natively(ep, native_flow) and ep.policy.native]
    if pool:
        base = _cluster(POOL_CLUSTER, [(r.address, 1) for d in dests for r in d.leaf.all_replicas()], lb_policy="LEAST_REQUEST")
        clusters.append(pool_cluster(base, cfg, me.name, cfg.policy.weights, leaf_prefixes(cfg)[0]))
    listener = _listener("dlb_root", _bind(listen), _hcm("dlb_root", route_config, filters, edge=True), reuse_port)
    boot = _bootstrap("root", me.name, admin_port, listener, clusters, ready_port)
    boot["static_resources"]["secrets"] = [token_secret(cfg)]
    return boot


# --------------------------------------------------------------------------------------------
# Leaf
# --------------------------------------------------------------------------------------------


def wan_delays_ms(cfg: Config, cell: str) -> dict[str, float]:
    """Round-trip delay the leaf of ``cell`` adds per source cell (only non-zero ones, allowed arcs)."""
    me = cfg.cell(cell)
    return {
        src.name: cfg.rtt_ms(src.name, cell)
        for src in cfg.cells
        # Below a microsecond there is nothing to emulate (and Envoy refuses a zero fixed_delay).
        if src.name != cell and cfg.network.allowed[src.index][me.index] and cfg.rtt_ms(src.name, cell) >= 0.001
    }


def _fault_filter(src: str, delay_ms: float) -> dict[str, Any]:
    """Delay requests from ``src``: only a root's (it sends the token) keeps a source cell past :func:`token_check`."""
    return {
        "name": f"dlb.wan_delay.{src}",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
            "delay": {"fixed_delay": _duration(delay_ms / 1000.0), "percentage": {"numerator": 100, "denominator": "HUNDRED"}},
            "headers": [{"name": HEADER_SRC_CELL, "string_match": {"exact": src}}],
        },
    }


def leaf_prefixes(cfg: Config) -> list[str]:
    """The path prefixes a leaf forwards: the endpoints' own, most specific first, without ones a shorter covers."""
    out: list[str] = []
    for prefix in sorted({ep.match.prefix for ep in cfg.endpoints}, key=len):
        if not any(prefix.startswith(p) for p in out):
            out.append(prefix)
    return out


def leaf_bootstrap(
    cfg: Config,
    cell: str,
    *,
    admin_port: int,
    emulate_wan: bool,
    listen: HostPort | None = None,
    message_timeout_ms: float = 200.0,
    access_log: bool = True,
    reuse_port: bool = False,
    ready_port: int | None = None,
    stream_tokens: bool | None = None,
) -> dict[str, Any]:
    """The leaf Envoy of ``cell``: root-facing listener → [WAN delay] → [leaf ext_proc] → servers.

    ``emulate_wan`` adds one fault filter per source cell delaying its requests by the round trip
    ``τ_src,cell + τ_cell,src`` (testbeds only; on a real WAN leave it off). A leaf ext_proc is used
    when ``cells[].leaf.ext_proc`` is set: it may name a server in ``x-dlb-server``; without it, or
    when it is down, Envoy's LEAST_REQUEST picks. ``access_log`` wires Envoy's gRPC access log to the
    leaf agent (over ``cells[].leaf.access_log``), which is how the agent learns completions and latencies
    (:mod:`dlb.envoy.als` owns that wiring): on by default, since without it the agent's counts only grow. ``ready_port`` adds the :func:`ready_listener`.
    ``stream_tokens`` adds :func:`stream_tokens_filter` (None: when the cell has a data-parallel server).
    """
    me = cfg.cell(cell)
    if not me.runs_dlb_leaf:
        what = f"leaf.source {me.leaf.source}: a cell DLB does not run" if me.leaf.foreign else \
            "inference_pool: its GIE gateway and dlb serve epp serve it"
        raise ValueError(f"cells[{me.index}] ({cell}) has no DLB leaf Envoy ({what})")
    listen = listen or me.leaf.bind
    # First the roots' health check, answered before anything else runs; then a request without the roots'
    # token loses x-dlb-src-cell before any filter or the access log sees it.
    filters: list[dict[str, Any]] = [leaf_health_filter(), token_check(cfg)]
    if emulate_wan:
        filters += [_fault_filter(src, ms) for src, ms in sorted(wan_delays_ms(cfg, cell).items())]
    servers = [(a, s.weight) for s in me.servers for a in s.rank_addresses()]  # a DP server: one endpoint per rank
    clusters = [_server_health(_cluster(LEAF_SERVERS_CLUSTER, servers, lb_policy="LEAST_REQUEST"))]
    routes: list[dict[str, Any]] = []
    # Generation deadlines are the root's (per endpoint); the leaf only relies on idle timeouts.
    action = {"timeout": "0s"}
    if me.leaf.ext_proc is not None:
        # A request held for a data-parallel rank gets its reply up to MAX_HOLD_S later; the agent then
        # restarts the message timer once (override_message_timeout), which Envoy caps at this maximum.
        filters.append(_ext_proc_filter(LEAF_EXT_PROC_CLUSTER, message_timeout_ms, "dlb_leaf", LEAF_FORWARD_HEADERS,
                                        max_message_timeout_s=MAX_HOLD_S + REPLY_MARGIN_S))
        if stream_tokens if stream_tokens is not None else any(s.dp is not None for s in me.servers):
            filters.append(stream_tokens_filter())
        clusters.append(leaf_ext_proc_cluster(me.leaf.ext_proc, me.leaf.probe, tls=dlb_service_tls(cfg, "leaf", me.name)))
        clusters.append(_picked_cluster())
        # Only requests that carry a pick go to ORIGINAL_DST: without the header it would connect back
        # to this listener. Unpicked requests (ext_proc down or undecided) fall through to LEAST_REQUEST.
    # Only the API paths the config routes (endpoints[].match.prefix) reach the servers: an emulator's
    # /admin/faults or a vLLM's own admin paths are never proxied (issue 14 row 9); anything else is a 404.
    for prefix in leaf_prefixes(cfg):
        if me.leaf.ext_proc is not None:
            routes.append({"name": "picked", "match": {"prefix": prefix, "headers": [{"name": HEADER_SERVER, "present_match": True}]},
                           "route": dict(action, cluster=LEAF_PICKED_CLUSTER)})
        routes.append({"name": "least-request", "match": {"prefix": prefix},
                       "route": dict(action, cluster=LEAF_SERVERS_CLUSTER, retry_policy=_safe_retries())})
    filters.append(_router())
    route_config = {
        "name": "dlb_leaf",
        # Headers only this leaf's own ext_proc may set (x-dlb-server is an ORIGINAL_DST target: from a client
        # it made the leaf Envoy an open proxy to any host:port): stripped from every downstream request
        # before any filter runs. x-dlb-src-cell is kept only next to the roots' token (token_check).
        "internal_only_headers": list(LEAF_INTERNAL_HEADERS),
        # The token itself never reaches a server (nor the access log, which sees the router's headers).
        "request_headers_to_remove": [HEADER_ROOT_TOKEN],
        "virtual_hosts": [{"name": "dlb", "domains": ["*"], "routes": routes}],
    }
    listener = _listener("dlb_leaf", _bind(listen), _hcm("dlb_leaf", route_config, filters, edge=True), reuse_port)
    boot = _bootstrap("leaf", me.name, admin_port, listener, clusters, ready_port)
    if access_log:
        add_leaf_access_log(boot, cfg, cell)
    return boot


class _EnvoyYamlDumper(yaml.SafeDumper):
    """Quotes every string Envoy's YAML reader could take for something else.

    PyYAML quotes strings that *it* would misread, but Envoy reads YAML with yaml-cpp and turns any
    plain scalar that converts to a bool or a number into one: a cell named ``y`` or ``n`` (YAML 1.1
    booleans PyYAML leaves bare) or an endpoint named ``1e3`` became a bool/number in a string field
    and Envoy refused the bootstrap (found by the property test in tests/e2e/test_envoy_configs.py).
    Only proto-field-like words stay bare, so the files remain readable.
    """


_BARE_OK = re.compile(r"^[a-z_][a-z0-9_]*$")
_YAML_CPP_SPECIAL = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf"}


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    bare = _BARE_OK.match(data) is not None and data not in _YAML_CPP_SPECIAL
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=None if bare else '"')


_EnvoyYamlDumper.add_representer(str, _represent_str)


def dump_bootstrap(bootstrap: Mapping[str, Any]) -> str:
    """A bootstrap as YAML text that Envoy reads back exactly (strings stay strings)."""
    return yaml.dump(dict(bootstrap), Dumper=_EnvoyYamlDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def write_bootstrap(bootstrap: Mapping[str, Any], path: str | os.PathLike[str]) -> str:
    """Write a bootstrap for ``envoy -c``; returns the path."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(dump_bootstrap(bootstrap))
    return os.fspath(path)
