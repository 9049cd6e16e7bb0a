"""The paper's fluid model (section 4) and its equilibria: a check of the production routers, not routing code.

Why apart from ``dlb.core``: the core holds what ships on the request path; this is an offline
experiment (scipy solvers, long integrations, worker processes) that drives the core's routers.
"""
