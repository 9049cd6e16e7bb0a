"""The data plane's Python services: the root ext_proc (picks a cell per request), the leaf agent
(picks a server, measures its cell, answers probes) and the HTTP/2 transport they serve Envoy on.

Only the root's ExternalProcessor and the leaf's ExternalProcessor sit on the request path; both
answer from in-memory state (probe cache, counters) and never do I/O while a request waits.

May import ``core``, ``config``, ``envoy``, ``xds`` (its client), ``proto``, the shared service plumbing
(``service``) and the probe protocol (``probe``); never the control-plane service, launchers or benchmarks.
"""
