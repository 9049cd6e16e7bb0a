"""Whole deployments on one machine: child-process launchers for the services, Envoy and emulators, and
the data-plane stack the tests and benchmarks start.

May import anything below it; only benchmarks, the command line and tests import it.
"""
