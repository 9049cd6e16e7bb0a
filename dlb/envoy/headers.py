"""Header names shared by the services, the Envoy configs and the tests (one place to change them).

Every ``x-dlb-*`` header is internal: the root Envoy strips them from client requests
(``route_config.internal_only_headers``) and the services never read them from a client. So is the
Gateway API Inference Extension's destination header: a GIE gateway (or llm-d's proxy) behind a root
routes by it, so a client that could set it would pick the server itself, past every DLB decision.
"""

#: Root → root Envoy route: the chosen cell's cluster, ``cell-<name>`` (read by ``cluster_header``).
CELL = "x-dlb-cell"
#: Root → leaf Envoy: the cell the request entered at (the leaf's WAN emulation delays by its RTT).
SRC_CELL = "x-dlb-src-cell"
#: Root → leaf Envoy: the deployment's shared secret; a leaf trusts ``x-dlb-src-cell`` only next to it
#: (docs/security.md), and removes it before the servers.
ROOT_TOKEN = "x-dlb-root-token"
#: Leaf → leaf Envoy: ``ip:port`` of the chosen server (ORIGINAL_DST cluster reads it).
SERVER = "x-dlb-server"

#: GIE endpoint picker → gateway: ``ip:port[,ip:port…]`` the gateway sends the request to (ORIGINAL_DST).
GIE_DESTINATION = "x-gateway-destination-endpoint"

INTERNAL = (CELL, SRC_CELL, ROOT_TOKEN, SERVER, GIE_DESTINATION)
