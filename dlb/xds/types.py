"""Type URLs and the per-type protocol rules the server applies.

The cache is type-agnostic (any protobuf message under any type URL flows over ADS, including our own
``type.googleapis.com/dlb.v1.*`` types). Only three things depend on the type, all from the xDS
protocol: which types are *full state* in state-of-the-world (a missing name means "deleted"; the
same types are the ones that allow the legacy wildcard, which ``ServerContext.legacy_wildcard``
applies), and the make-before-break push order across types on one ADS stream.
"""

from __future__ import annotations

_PREFIX = "type.googleapis.com/"
CLUSTER = _PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT = _PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = _PREFIX + "envoy.config.listener.v3.Listener"
ROUTE = _PREFIX + "envoy.config.route.v3.RouteConfiguration"
SCOPED_ROUTE = _PREFIX + "envoy.config.route.v3.ScopedRouteConfiguration"
VIRTUAL_HOST = _PREFIX + "envoy.config.route.v3.VirtualHost"
SECRET = _PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
RUNTIME = _PREFIX + "envoy.service.runtime.v3.Runtime"

SHORT_NAMES = {CLUSTER: "CDS", ENDPOINT: "EDS", LISTENER: "LDS", ROUTE: "RDS", SCOPED_ROUTE: "SRDS",
               VIRTUAL_HOST: "VHDS", SECRET: "SDS", RUNTIME: "RTDS"}

# Make-before-break order on one ADS stream (xDS protocol, "eventual consistency considerations"):
# clusters first, then their endpoints, then listeners, then the routes that reference the clusters.
# Types not listed (our own custom types) go last, in type-URL order, so pushes are deterministic.
PUSH_ORDER = [CLUSTER, ENDPOINT, LISTENER, ROUTE, SCOPED_ROUTE, VIRTUAL_HOST, SECRET, RUNTIME]

# Types a client always requests by name (Envoy's EDS, RDS, VHDS, SDS, RTDS): an empty request is
# "nothing", never wildcard, and SotW responses to them cannot express deletion.
NAMED_ONLY = frozenset({ENDPOINT, ROUTE, VIRTUAL_HOST, SECRET, RUNTIME})


def full_state(type_url: str) -> bool:
    """SotW responses of this type carry every subscribed resource, so omission means deletion.

    True for LDS, CDS, SRDS and for every custom type: our own resources (cells, policies) must be
    deletable in SotW too, and ``dlb.xds.client`` reads each response as the whole state.
    """
    return type_url not in NAMED_ONLY


WILDCARD = "*"


def short(type_url: str) -> str:
    """A short label for logs and metrics (``CDS``, or the message name for custom types)."""
    return SHORT_NAMES.get(type_url) or type_url.rsplit("/", 1)[-1]


def order_key(type_url: str) -> tuple[int, str]:
    try:
        return (PUSH_ORDER.index(type_url), "")
    except ValueError:
        return (len(PUSH_ORDER), type_url)


def type_url_of(message_full_name: str) -> str:
    return _PREFIX + message_full_name
