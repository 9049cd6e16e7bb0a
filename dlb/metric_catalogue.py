"""Every ``dlb_*`` metric family the services export: name, type, labels, meaning — in one place.

Why a catalogue next to the collectors rather than instead of them: the collectors build families at
scrape time (the fast path: nothing is updated per request but plain counters), so the names live
where the values are. This table is what operators and dashboards read (``docs/metrics.md`` is
generated from it) and ``tests/integration/test_metric_catalogue.py`` scrapes each service and fails when a
family is exported that is not listed here, or listed with another type or label set, or listed
and no longer exported. Imports nothing.

Names and types are as a Prometheus scraper sees them in the text format: counters appear on the
wire with ``_total``, histograms with ``_bucket``/``_sum``/``_count``, and an info family (a
version string carried as a label) is a gauge named ``..._info`` with value 1. ``labels`` are the
sample labels (histograms: without ``le``). ``when`` names the condition for a family that only some deployments export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricDef:
    service: str  # root, leaf, epp, xds (the control plane's status server), emulator
    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str
    when: str = ""  # empty: always exported


def _h2(service: str) -> tuple[MetricDef, ...]:
    """The HTTP/2 ext_proc transport's counters (``TransportStats.families``)."""
    p = f"dlb_{service}_h2"
    when = "DLB's HTTP/2 transport (the default; not with --transport grpc or --xds-transport grpc)"
    return (
        MetricDef(service, f"{p}_connections", "counter", (), "HTTP/2 connections accepted from Envoy", when),
        MetricDef(service, f"{p}_messages", "counter", (), "gRPC messages received", when),
        MetricDef(service, f"{p}_grpc_errors", "counter", (), "Calls ended with a non-OK gRPC status", when),
        MetricDef(service, f"{p}_stream_resets", "counter", (), "Streams reset with an error code", when),
        MetricDef(service, f"{p}_connection_errors", "counter", (), "Connections closed for a protocol error (GOAWAY)", when),
        MetricDef(service, f"{p}_handler_errors", "counter", (), "Messages whose handler raised", when),
        # Bounds (dlb/transport/limits.py): each counts the times a bound was hit.
        MetricDef(service, f"{p}_connections_refused", "counter", (),
                  "Connections closed at accept: the connection cap was reached", when),
        MetricDef(service, f"{p}_connections_evicted", "counter", (), "Streamless connections closed to admit a new one", when),
        MetricDef(service, f"{p}_first_stream_timeouts", "counter", (), "Connections closed for opening no stream in time", when),
        MetricDef(service, f"{p}_handshake_timeouts", "counter", (),
                  "Connections closed for no TLS handshake and HTTP/2 preface in time", when),
        MetricDef(service, f"{p}_tls_failures", "counter", (),
                  "Connections closed for a TLS failure", when),
        MetricDef(service, f"{p}_tls_handshakes_refused", "counter", (),
                  "Connections closed: too many TLS handshakes in progress", when),
        MetricDef(service, f"{p}_idle_timeouts", "counter", (),
                  "Connections closed idle (no stream open)", when),
        MetricDef(service, f"{p}_streams_refused", "counter", (),
                  "Streams refused: stream cap reached or shutting down", when),
        MetricDef(service, f"{p}_header_cache_refused", "counter", (),
                  "Header blocks not cached: a cache bound was hit", when),
        MetricDef(service, f"{p}_buffer_limit_hits", "counter", (),
                  "Connections cut for too many partial-message bytes", when),
        MetricDef(service, f"{p}_control_floods", "counter", (),
                  "Connections cut for a flood of control frames (ENHANCE_YOUR_CALM)", when),
        MetricDef(service, f"{p}_non_grpc_requests", "counter", (),
                  "Non-gRPC requests, answered 415/405", when),
        MetricDef(service, f"{p}_open_connections", "gauge", (), "HTTP/2 connections open now", when),
        MetricDef(service, f"{p}_tls_handshakes_pending", "gauge", (), "TLS handshakes in progress",
                  when),
        MetricDef(service, f"{p}_header_cache_bytes", "gauge", (),
                  "Bytes of cached header blocks", when),
        MetricDef(service, f"{p}_buffered_bytes", "gauge", (), "Bytes of partial gRPC messages held", when),
    )


def _gc(service: str, when: str) -> tuple[MetricDef, ...]:
    """Garbage-collection pauses of a service whose start-up heap is frozen (``dlb/gc_heap.py``)."""
    p = f"dlb_{service}_gc"
    return (
        MetricDef(service, f"{p}_frozen_objects", "gauge", (), "objects exempt from garbage collection (frozen after start, dlb/gc_heap.py)",
                  when),
        MetricDef(service, f"{p}_pause_seconds", "counter", ("generation",), "time the process spent in garbage collections", when),
        MetricDef(service, f"{p}_pause_longest_seconds", "gauge", ("generation",), "the longest single garbage collection so far", when),
    )


def _loop(service: str) -> tuple[MetricDef, ...]:
    """How late the service's event loop runs: a heartbeat every 20 ms (``dlb/service/loop_lag.py``)."""
    p = f"dlb_{service}_loop_lag"
    return (MetricDef(service, f"{p}_seconds", "histogram", (), "Event-loop lag: how late a 20-ms heartbeat ran"),
            MetricDef(service, f"{p}_longest_seconds", "gauge", (), "Longest event-loop lag in the last 60 s"))


def _tls(service: str) -> tuple[MetricDef, ...]:
    """A certificate that follows its renewed files (dlb/config/tls_live.py)."""
    when = "`tls` set"
    return (MetricDef(service, f"dlb_{service}_tls_reloads", "counter", (), "Certificate renewals applied", when),
            MetricDef(service, f"dlb_{service}_tls_reload_failures", "counter", (),
                      "Certificate renewals refused (old pair kept)", when))


_EC = ("endpoint", "cell")
_PROBES = "the root probes leaves (always in a deployment; absent in a root built without a probe client)"
_FLOW = "an endpoint with mechanism flow"
_K8S = "an InferencePool pool"

CATALOGUE: tuple[MetricDef, ...] = (
    # --- root ext_proc service (dlb/ext_proc/root.py) ---
    MetricDef("root", "dlb_root_decisions", "counter", _EC, "Requests routed, by endpoint and destination cell"),
    MetricDef("root", "dlb_root_rejected", "counter", ("endpoint",), "Requests answered 503 (no usable cell)"),
    MetricDef("root", "dlb_root_shed", "counter", ("endpoint", "source_cell"),
              "Requests answered 429 (shed: every usable cell saturated or past the deadline)"),
    MetricDef("root", "dlb_root_aversion_rate", "gauge", _EC, "Error-aversion skip probability a_j"),
    MetricDef("root", "dlb_root_flow_weight", "gauge", _EC, "Flow routing vector x_ij", _FLOW),
    MetricDef("root", "dlb_root_cell_usable", "gauge", _EC, "1 if the cell is usable now (allowed, fresh, available)"),
    MetricDef("root", "dlb_root_unmatched", "counter", (), "Requests whose path matched no endpoint"),
    MetricDef("root", "dlb_root_streams", "counter", (), "ext_proc streams opened by Envoy"),
    MetricDef("root", "dlb_root_decide_errors", "counter", (), "Decisions that raised (request continued on the fail-open route)"),
    MetricDef("root", "dlb_root_processing_seconds", "histogram", (), "Time to decide one ext_proc message inside the service"),
    MetricDef("root", "dlb_root_probe_age_seconds", "gauge", ("cell",), "Seconds since the last good probe answer", _PROBES),
    MetricDef("root", "dlb_root_probe_errors", "counter", ("cell",), "Failed probes", _PROBES),
    MetricDef("root", "dlb_root_probes", "counter", ("cell",), "Successful probes", _PROBES),
    MetricDef("root", "dlb_root_probe_rtt_seconds", "gauge", ("cell",), "Round trip of the last good probe", _PROBES),
    MetricDef("root", "dlb_root_cell_rif", "gauge", ("cell",), "Cell RIF reported by the last probe", _PROBES),
    MetricDef("root", "dlb_root_cell_error_rate", "gauge", ("cell",), "Cell error rate reported by the last probe", _PROBES),
    MetricDef("root", "dlb_root_cell_model", "gauge", ("cell", "param"), "Cell latency-model parameter from the last probe", _PROBES),
    *_h2("root"),
    MetricDef("root", "dlb_root_metrics_http_refused", "counter", (), "Connections to the metrics listener closed at its cap (64)"),
    *_gc("root", "dlb serve root with a metrics port"),
    *_loop("root"),
    *_tls("root"),
    # --- leaf agent (dlb/ext_proc/leaf.py) ---
    MetricDef("leaf", "dlb_leaf_rif", "gauge", (), "Requests in flight counted by the leaf"),
    MetricDef("leaf", "dlb_leaf_server_rif", "gauge", ("server",), "Leaf-counted RIF per server"),
    MetricDef("leaf", "dlb_leaf_server_scraped_load", "gauge", ("server",), "running + waiting scraped from the server (-1 unknown)"),
    MetricDef("leaf", "dlb_leaf_server_tokens", "gauge", ("server",), "Leaf-counted tokens waiting per server (size estimates of requests in flight)"),
    MetricDef("leaf", "dlb_leaf_background_probes", "counter", ("outcome",), "Background probe requests sent by this leaf (ok, failed)"),
    MetricDef("leaf", "dlb_leaf_background_probe_seconds", "counter", (), "Summed latency of successful background probes"),
    MetricDef("leaf", "dlb_leaf_background_watched", "gauge", (), "1 while the cell is watched: probed every watch interval"),
    MetricDef("leaf", "dlb_leaf_cell_changes", "counter", ("source", "direction"),
              "Cell changes declared by probes or traffic (older samples dropped)"),
    MetricDef("leaf", "dlb_leaf_dp_rank_kv_tokens", "gauge", ("server",), "Predicted resident KV tokens per data-parallel rank",
              "the cell has a data-parallel server (dp_ranks)"),
    MetricDef("leaf", "dlb_leaf_dp_held", "gauge", ("server",), "Requests held for a data-parallel server",
              "the cell has a data-parallel server (dp_ranks)"),
    MetricDef("leaf", "dlb_leaf_dp_held_seconds", "counter", ("server",), "Summed wait of held requests released to a rank",
              "the cell has a data-parallel server (dp_ranks)"),
    MetricDef("leaf", "dlb_leaf_dp_hold_outcomes", "counter", ("server", "outcome"),
              "Held requests: released, full (429), deadline (503), cancelled", "the cell has a data-parallel server (dp_ranks)"),
    MetricDef("leaf", "dlb_leaf_dp_stream_tokens", "counter", (), "Decoded tokens counted in DP responses",
              "the cell has a data-parallel server (dp_ranks)"),
    MetricDef("leaf", "dlb_leaf_server_picks", "counter", ("server",), "Requests sent to each server"),
    MetricDef("leaf", "dlb_leaf_server_errors", "counter", ("server",), "Failed completions per server"),
    MetricDef("leaf", "dlb_leaf_cut_streams", "counter", ("server",),
              "Responses a server started and then broke off (reset mid-body)"),
    MetricDef("leaf", "dlb_leaf_healthy_servers", "gauge", (), "Servers usable for picking"),
    MetricDef("leaf", "dlb_leaf_envoy_reachable", "gauge", (), "1 if the leaf Envoy accepts connections"),
    MetricDef("leaf", "dlb_leaf_grpc_limit", "gauge", ("limit",), "gRPC listener bounds"),
    MetricDef("leaf", "dlb_leaf_error_rate", "gauge", (), "EMA error fraction reported in probes"),
    MetricDef("leaf", "dlb_leaf_completed", "counter", (), "Completions seen in the access log"),
    MetricDef("leaf", "dlb_leaf_failed", "counter", (), "Completions counted as errors"),
    MetricDef("leaf", "dlb_leaf_client_aborts", "counter", (),
              "Requests the client (or a root, at its timeout) left before the answer ended"),
    MetricDef("leaf", "dlb_leaf_inflight_expired", "counter", (), "In-flight records dropped after max age"),
    MetricDef("leaf", "dlb_leaf_inflight_refused", "counter", (), "Request starts not recorded: the in-flight table was full (max_inflight)"),
    MetricDef("leaf", "dlb_leaf_admission_refused", "counter", (),
              "Requests answered 429 by admission: the picked server was too busy"),
    MetricDef("leaf", "dlb_leaf_server_uncongested_stay_seconds", "gauge", ("server",),
              "Each server's uncongested stay that admission compares with (0: not learnt yet, or admission off)"),
    MetricDef("leaf", "dlb_leaf_inflight_orphaned", "counter", (), "In-flight records dropped when the access-log stream that opened them ended"),
    MetricDef("leaf", "dlb_leaf_probes", "counter", (), "Probe requests answered"),
    MetricDef("leaf", "dlb_leaf_als_entries", "counter", (), "Access-log entries received"),
    MetricDef("leaf", "dlb_leaf_als_peers_refused", "counter", (), "Access-log connections from another user, refused"),
    MetricDef("leaf", "dlb_leaf_model", "gauge", ("param",), "Published latency-model parameter"),
    MetricDef("leaf", "dlb_leaf_fit_seconds", "counter", (), "Time spent fitting the latency model"),
    MetricDef("leaf", "dlb_leaf_pick_rule", "gauge", ("rule",), "1 for the server-pick rule in use (config or xDS LeafPolicy; "
              "envoy-least-request: no leaf.ext_proc, the leaf Envoy picks)"),
    MetricDef("leaf", "dlb_leaf_pick_choices", "gauge", (), "Servers probed per pick in use"),
    MetricDef("leaf", "dlb_leaf_processing_seconds", "histogram", (), "Time to pick a server inside the service"),
    *_tls("leaf"),
    *_h2("leaf"),
    MetricDef("leaf", "dlb_leaf_metrics_http_refused", "counter", (), "Connections to the metrics listener closed at its cap (64)"),
    *_loop("leaf"),
    # --- GIE endpoint picker (dlb/epp/metrics.py), beside the dlb_leaf_* families ---
    MetricDef("epp", "dlb_epp_picks", "counter", ("outcome",),
              "Picks by outcome: picked, no_capacity (503), shed (429), hint_empty, hint_foreign (503)"),
    MetricDef("epp", "dlb_epp_served_moves", "counter", (), "Responses served elsewhere than picked (the gateway's report)"),
    MetricDef("epp", "dlb_epp_pool_endpoints", "gauge", (), "Endpoints in the pool"),
    MetricDef("epp", "dlb_epp_pool_source", "gauge", ("state",), "1 for the pool's source state"),
    MetricDef("epp", "dlb_epp_pool_updates", "counter", ("what",), "Endpoint-set and InferencePool spec changes"),
    MetricDef("epp", "dlb_epp_grpc_limit", "gauge", ("limit",), "gRPC listener bounds"),
    MetricDef("epp", "dlb_epp_metrics_http_refused", "counter", (), "Connections to the metrics listener closed at its cap (64)"),
    MetricDef("epp", "dlb_epp_grpc_streams_refused", "counter", (), "ext_proc streams refused: max_streams open"),
    MetricDef("epp", "dlb_epp_pool_watch_errors", "counter", ("watch",), "Failed lists and watches, unusable pool edits", _K8S),
    *_loop("epp"),
    # --- control plane's xDS status server (dlb/xds/status.py) ---
    MetricDef("xds", "dlb_xds_streams", "gauge", ("node",), "open xDS streams per node (past 2,000 nodes, the rest as node=other)"),
    MetricDef("xds", "dlb_xds_acked_version_info", "gauge", ("node", "type", "version"), "last version each node ACKed, per type (value 1)"),
    MetricDef("xds", "dlb_xds_sent_version_info", "gauge", ("node", "type", "version"), "last version sent to each node, per type (value 1)"),
    MetricDef("xds", "dlb_xds_responses", "counter", ("node", "type"), "responses sent"),
    MetricDef("xds", "dlb_xds_nacks", "counter", ("node", "type"), "NACKs received"),
    MetricDef("xds", "dlb_xds_stale_nonces", "counter", (), "requests ignored for a stale nonce"),
    MetricDef("xds", "dlb_xds_limit_hits", "counter", ("limit",),
              "xDS streams closed for going past a server limit (limit: a StreamLimits field, e.g. node_id_bytes, types, names)"),
    *_h2("xds"),
    MetricDef("xds", "dlb_xds_streams_denied", "counter", (), "streams refused: the client certificate's identity may not read the node it claims"),
    MetricDef("xds", "dlb_xds_status_http_refused", "counter", (), "Status connections closed at the cap (64)"),
    MetricDef("xds", "dlb_xds_snapshots", "gauge", (), "node keys with a snapshot", "the server passes a snapshot count (the control plane does)"),
    MetricDef("xds", "dlb_xds_dns_resolutions", "counter", (), "server-name resolutions attempted (discovery)",
              "the control plane (dlb serve control-plane)"),
    MetricDef("xds", "dlb_xds_dns_failures", "counter", (), "server-name resolutions that failed; the name kept its last addresses",
              "the control plane (dlb serve control-plane)"),
    MetricDef("xds", "dlb_xds_dns_truncated", "counter", (),
              "resolutions that returned more than 1024 addresses, cut to the lowest 1024", "the control plane (dlb serve control-plane)"),
    MetricDef("xds", "dlb_xds_config_reloads", "counter", ("result",), "config reloads by result: applied, needs_restart, refused",
              "the control plane (dlb serve control-plane)"),
    MetricDef("xds", "dlb_xds_config_loaded_timestamp_seconds", "gauge", (), "when the running config was loaded",
              "the control plane (dlb serve control-plane)"),
    MetricDef("xds", "dlb_xds_config_info", "gauge", ("digest", "source"), "running config's digest and file (value 1)",
              "the control plane (dlb serve control-plane)"),
    *_gc("xds", "the control plane (dlb serve control-plane)"),
    *_loop("xds"),
    *_tls("xds"),
    # --- emulated inference server (dlb/emulator/metrics.py; its other families are vLLM's names) ---
    MetricDef("emulator", "dlb_emulator_requests_rejected", "counter", ("model_name", "reason"),
              "Requests answered with an error before running (reason: queue_full, injected_error, down)"),
)


def for_service(service: str) -> dict[str, MetricDef]:
    return {m.name: m for m in CATALOGUE if m.service == service}


def markdown_table() -> str:
    """The catalogue as the table in docs/metrics.md; each condition once, as a numbered note below it. Families
    that differ only in their service (the HTTP/2 transport's, in root and leaf) share a row naming each."""
    rows = ["| service | family | type | labels | meaning | only with |", "| --- | --- | --- | --- | --- | --- |"]
    notes: dict[str, int] = {}
    same: dict[tuple[str, str, tuple[str, ...], str, str], list[MetricDef]] = {}
    for m in CATALOGUE:
        same.setdefault((m.name.removeprefix(f"dlb_{m.service}_"), m.type, m.labels, m.help, m.when), []).append(m)
    for group in same.values():
        m = group[0]
        labels = ", ".join(f"`{label}`" for label in m.labels) or "—"
        when = f"[{notes.setdefault(m.when, len(notes) + 1)}]" if m.when else ""
        services, names = ", ".join(g.service for g in group), ", ".join(f"`{g.name}`" for g in group)
        rows.append(f"| {services} | {names} | {m.type} | {labels} | {m.help}. | {when} |")
    rows += ["", "Exported only with:", ""] + [f"- [{n}] {when}." for when, n in notes.items()]
    return "\n".join(rows)
