"""Benchmarks and load generators: ext_proc overhead (wrk, asyncio loadgen, constant-reply floor), xDS
scale, Envoy push latency, per-request pick cost, faults, hostile input, load-generator fidelity,
emulator fidelity, the simulator's twin of the demo, BF-IO studies.

Every command is in ``cli.py`` (one table); every run goes through ``harness.py`` (commit, command line,
box load, verdict, JSON). May import anything below it; nothing imports it but the command line and the tests.
"""
