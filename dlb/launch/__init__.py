"""``dlb up``: run every DLB component of a config on one machine under a supervisor that restarts them.

Why apart from ``dlb.testbed``: this is a product command operators run; the testbed (demo, emulated
fleets, network namespaces, test stacks) builds on it, never the other way round.
"""
