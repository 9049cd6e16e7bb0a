"""The unit tier: in-process tests only; any socket or process attempt fails the test (see tier_guard)."""

from __future__ import annotations

from collections.abc import Generator

import pytest
from tier_guard import guarding


def _guarded(item: pytest.Item) -> Generator[None, object, object]:
    with guarding() as guard:
        try:
            return (yield)
        finally:
            if guard.violations:
                pytest.fail(f"{item.nodeid}: {guard.violations[0]}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))
