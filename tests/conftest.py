"""Test-suite settings.

Under CI (``CI`` set, as ``.ci/run`` is run) hypothesis is derandomised: the examples are the same on
every run, so a red CI is always reproducible locally with ``CI=1 pytest``; locally, each run still
explores new examples.
"""

from __future__ import annotations

import os

# Before anything imports grpc: the suite's own process holds gRPC channels and servers while the
# testbed supervisor starts children with a preexec_fn (parent-death signal, setns into a network
# namespace), which means fork() with gRPC threads running; gRPC's fork handlers then abort the child
# before exec ("leaf west envoy exited with -6", the netns testbed in a fresh-clone CI run). The
# children exec at once and never use this process's gRPC state, so they need no fork support.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
