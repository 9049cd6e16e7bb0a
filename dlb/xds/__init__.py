"""A generic xDS library: snapshot cache, ADS/per-type server (SotW + delta), status endpoint, client.

May import only the foundations (``dlb.log``): it knows nothing of DLB and could be published alone.

See docs/xds.md. Typical use::

    cache = SnapshotCache()
    server = XdsServer(cache)
    await server.start("127.0.0.1:18000")
    cache.set_snapshot("node-1", Snapshot.build([cluster, listener, route]))
"""

from dlb.xds.cache import SnapshotCache, node_cluster_key, node_id_key
from dlb.xds.server import XdsServer
from dlb.xds.snapshot import Resource, Snapshot, SnapshotError
from dlb.xds.status import StatusRegistry, StatusServer

__all__ = ["Resource", "Snapshot", "SnapshotCache", "SnapshotError", "StatusRegistry", "StatusServer", "XdsServer",
           "node_cluster_key", "node_id_key"]
