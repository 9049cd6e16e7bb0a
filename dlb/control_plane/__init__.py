"""The DLB control-plane service: serves Envoy and ``dlb.v1`` resources over xDS and runs the flow loop.

May import ``core``, ``config``, ``envoy``, ``xds``, ``proto``, the shared service plumbing (``service``)
and the probe client (``probe``: it probes leaves the way roots do); never the data plane's services
(``ext_proc``), the launchers or benchmarks.
"""
