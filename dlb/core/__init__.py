"""The pure routing core, shared by the services and the simulator: topology, latency model and its fit,
costs, projection, flow step, router, aversion, affinity, baselines, theory.

May import nothing else from ``dlb``. No I/O and no hidden clocks: every function that depends on time
takes ``now`` (seconds) or ``dt``, so the simulator runs it in simulated time and tests pin it exactly.
"""
