"""Plumbing every DLB service shares: gRPC health, Prometheus metrics, the process runner, ports and
serve-until-signal.

Why a package of its own: the control plane and the data plane both run services; keeping this under
``ext_proc`` made the control plane import the data plane. Knows nothing of routing, the config or
Envoy: may import only the foundations (``log``, ``errors``).
"""
