"""The DLB control-plane service: serves Envoy and ``dlb.v1`` resources over xDS and runs the flow loop.

May import ``core``, ``config``, ``envoy``, ``xds``, ``proto`` and the data plane's probe client
(it probes leaves the way roots do); never the launchers or benchmarks.
"""
