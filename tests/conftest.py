"""Test-suite settings.

Under CI (``CI`` set, as ``.ci/run`` is run) hypothesis is derandomised: the examples are the same on
every run, so a red CI is always reproducible locally with ``CI=1 pytest``; locally, each run still
explores new examples.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
