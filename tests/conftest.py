"""Test-suite settings, and the tier markers.

Tests live in three folders by what they start: ``tests/unit`` (in-process; a socket or a process
fails the test, see ``tests/unit/conftest.py``), ``tests/integration`` (dlb services, real sockets on
127.0.0.1, subprocesses; also in-process runs too slow for the fast tier, > 15 s each) and ``tests/e2e``
(a real Envoy, ``dlb demo``, network namespaces, the container image). Each test gets the marker of its
folder, so ``pytest -m "not e2e"`` works too. Shared fixtures (``make_config``, ``control_plane``,
``envoy``, ``leaves``) are below; their code is in ``service_fixtures.py``.

Under CI (``CI`` set, as ``.ci/run`` is run) hypothesis is derandomised: the examples are the same on
every run, so a red CI is always reproducible locally with ``CI=1 pytest``; locally, each run still
explores new examples.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Before anything imports grpc: the suite's own process holds gRPC channels and servers while the
# testbed supervisor starts children with a preexec_fn (parent-death signal, setns into a network
# namespace), which means fork() with gRPC threads running; gRPC's fork handlers then abort the child
# before exec ("leaf west envoy exited with -6", the netns testbed in a fresh-clone CI run). The
# children exec at once and never use this process's gRPC state, so they need no fork support.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Each xdist worker (and every service it starts) draws free ports from its own stripe of the pool, so two
# workers never hand out one port (dlb.procutil.PORT_STRIPE_ENV).
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ["DLB_PORT_STRIPE"] = f"{os.environ['PYTEST_XDIST_WORKER'][2:]}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier from its folder (``tests/unit/...`` -> ``unit``), so ``-m unit`` works."""
    here = Path(__file__).resolve().parent
    for item in items:
        try:
            tier = item.path.resolve().relative_to(here).parts[0]
        except ValueError:  # a test outside tests/ (pytester's planted files): no tier
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., Path]:
    """A DLB config factory: ``make_config(cells, endpoints, **sections)`` writes ``tmp_path/dlb.yaml`` and returns it.

    ``cells`` maps names to ``service_fixtures.CellPorts``; calling it again rewrites the file (a reload).
    """
    from service_fixtures import config_doc, write_config

    def make(cells: Mapping[str, Any], endpoints: list[dict[str, Any]], *, name: str = "dlb.yaml", **kw: Any) -> Path:
        return write_config(tmp_path / name, config_doc(cells, endpoints, **kw))

    return make


@pytest.fixture
def control_plane() -> Callable[..., Any]:
    """``async with control_plane(cfg) as running:`` a control plane on 127.0.0.1 (service_fixtures.control_plane)."""
    from service_fixtures import control_plane as start

    return start


@pytest.fixture
def envoy(tmp_path: Path) -> Callable[..., Any]:
    """``async with envoy(bootstrap) as proc:`` a real Envoy, its bootstrap written under tmp_path (service_fixtures.envoy)."""
    from service_fixtures import envoy as start

    return functools.partial(start, folder=tmp_path)


@pytest.fixture
def leaves() -> Callable[..., Any]:
    """``async with leaves({cell: port}):`` stand-in leaves answering with their cell's name (service_fixtures.leaves)."""
    from service_fixtures import leaves as start

    return start
