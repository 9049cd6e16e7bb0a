"""The contract between DLB's services and the Envoys they sit beside: header, cluster and listener
names, and the timings both sides must agree on (one place to change them).

Why one module: the bootstrap renderer writes these names into Envoy's config and the services (root,
leaf, leaf xDS sync, control plane) read or match them at run time; a service importing the renderer
for a constant tied them together (and hid an import cycle).

Every ``x-dlb-*`` header is internal: the root Envoy strips them from client requests
(``route_config.internal_only_headers``) and the services never read them from a client. So is the
Gateway API Inference Extension's destination header: a GIE gateway (or llm-d's proxy) behind a root
routes by it, so a client that could set it would pick the server itself, past every DLB decision.
"""

# -- headers ------------------------------------------------------------------------------------------
#: Root → root Envoy route: the chosen cell's cluster, ``cell-<name>`` (read by ``cluster_header``).
CELL = "x-dlb-cell"
#: Root → root Envoy route: the cell a request is retried on (once) if its connection to ``CELL`` fails
#: or is reset before response headers, ``cell-<name>``; removed before the request leaves the root.
FALLBACK = "x-dlb-fallback-cell"
#: Root → leaf Envoy: the cell the request entered at (the leaf's WAN emulation delays by its RTT).
SRC_CELL = "x-dlb-src-cell"
#: Root → leaf Envoy: the deployment's shared secret; a leaf trusts ``x-dlb-src-cell`` only next to it
#: (docs/security.md), and removes it before the servers.
ROOT_TOKEN = "x-dlb-root-token"
#: Leaf → leaf Envoy: ``ip:port`` of the chosen server (ORIGINAL_DST cluster reads it).
SERVER = "x-dlb-server"
#: Root Envoy → root ext_proc (per-route gRPC metadata and a request header): the endpoint's name.
ENDPOINT = "x-dlb-endpoint"

#: GIE endpoint picker → gateway: ``ip:port[,ip:port…]`` the gateway sends the request to (ORIGINAL_DST).
GIE_DESTINATION = "x-gateway-destination-endpoint"

INTERNAL = (CELL, FALLBACK, SRC_CELL, ROOT_TOKEN, SERVER, GIE_DESTINATION)
#: What no request reaching a leaf Envoy may carry: the leaf's own pick and the root's cell choice.
LEAF_INTERNAL = (SERVER, CELL)
#: The leaf ext_proc reads only the request id (to match the access-log completion to its pick) and the
#: body's length (the size estimate of the tokens-waiting pick; the body itself never reaches Python).
REQUEST_ID = "x-request-id"
CONTENT_LENGTH = "content-length"
#: W3C trace context: both services make their spans children of it when tracing is on.
TRACEPARENT = "traceparent"
LEAF_FORWARD_HEADERS = (REQUEST_ID, CONTENT_LENGTH, TRACEPARENT)

# -- clusters -----------------------------------------------------------------------------------------
ROOT_EXT_PROC_CLUSTER = "dlb_root_ext_proc"
LEAF_EXT_PROC_CLUSTER = "dlb_leaf_ext_proc"
#: The leaf Envoy's servers; the leaf agent follows the same cluster's endpoints over EDS.
LEAF_SERVERS_CLUSTER = "servers"
LEAF_PICKED_CLUSTER = "picked_server"
#: The leaf agent's access-log channel.
LEAF_AGENT_CLUSTER = "dlb_leaf_agent"
#: ``log_name`` of the leaf Envoy's gRPC access log.
ACCESS_LOG_NAME = "dlb-leaf"

# -- listeners and paths ------------------------------------------------------------------------------
#: The readiness listener every bootstrap can carry (``ready_port``): orchestrators probe it, not admin.
READY_LISTENER = "dlb_ready"
READY_PATH = "/ready"
#: Active health check of every server: vLLM's and the emulator's ``GET /health`` (200 when serving).
HEALTH_PATH = "/health"
#: A leaf Envoy answers this path itself (its ``health_check`` filter, first in the chain): the root Envoys'
#: health check of each leaf replica. Never routed, never in the access log, never through the ext_proc.
LEAF_HEALTH_PATH = "/dlb/leaf-health"

# -- timings ------------------------------------------------------------------------------------------
#: The leaf Envoy checks each server's ``/health`` this often (plus up to the jitter). A recovered server
#: is back in Envoy's rotation only at its next check, so the leaf agent waits as long before it counts
#: the server healthy again (``LeafState.rejoin_hold_s``): a cell reported usable before that gets its
#: requests answered ``503 no_healthy_upstream`` (seen in ``dlb bench faults``, whole-cell fault).
SERVER_CHECK_INTERVAL_S = 0.5
SERVER_CHECK_JITTER_S = 0.05
#: How long the leaf Envoy waits for a server's ``/health`` before counting one failed check, and how
#: many failed checks in a row take it out: an answer that is late is load, not death. A loaded inference
#: server answers ``/health`` late (vLLM's goes through its busy engine process; on a busy box the
#: emulators missed the old 1-s timeout twice in a row and a slow cell answered 503 to all its traffic).
#: 5 s is over 3 times the slowest answer seen from a server that still served, so only a server silent
#: for 3 × 5 s is taken out by timeouts. A dead one is found faster by other signals: a non-200
#: ``/health`` at once, refused connects in 3 checks (1.5 s), outlier detection, the agent's scrapes.
SERVER_CHECK_TIMEOUT_S = 5.0
SERVER_CHECK_UNHEALTHY_THRESHOLD = 3
