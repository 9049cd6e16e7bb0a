"""The data plane's Python services: the root ext_proc (picks a cell per request), the leaf agent
(picks a server, measures its cell, answers probes) and the probe protocol between them.

Only the root's ExternalProcessor and the leaf's ExternalProcessor sit on the request path; both
answer from in-memory state (probe cache, counters) and never do I/O while a request waits.

May import ``core``, ``config``, ``envoy``, ``xds`` (its client) and ``proto``; never the control-plane
service, launchers or benchmarks.
"""
