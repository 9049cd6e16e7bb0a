"""Benchmarks and load generators: ext_proc overhead (wrk, asyncio loadgen, constant-reply floor), xDS
scale, Envoy push latency, per-request pick cost, emulator fidelity.

May import anything below it; nothing imports it but the command line and the tests.
"""
