"""Envoy as DLB uses it: locating and running the binary, rendering static and ADS bootstraps, and the
header and cluster names the Envoy configs and the services share.

May import ``core``, ``config`` and the foundations; never a service.
"""
