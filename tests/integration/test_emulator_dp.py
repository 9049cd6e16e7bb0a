"""The emulator's data-parallel mode over real sockets: G ranks on consecutive ports, lock-step steps
whose time is the slowest rank's, and per-rank barrier idle exported as a metric."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp
import pytest

from dlb.emulator.dp import DpEmulator, rank_step_time
from dlb.emulator.profile import BUILTIN_PROFILES
from dlb.emulator.server import EmulatorConfig
from dlb.testbed.emulator import EmulatorProcess

T = TypeVar("T")
FAST = BUILTIN_PROFILES["fast-test"]


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def post(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
    async with s.post(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None), r.headers.get("x-dlb-server", "")


def _metric(text: str, name: str) -> float:
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))  # fmt: skip


def test_ranks_step_together_and_the_light_rank_idles_at_the_barrier() -> None:
    async def main() -> tuple[dict[str, Any], list[str], list[str]]:
        dp = DpEmulator(EmulatorConfig(profile="fast-test", server_id="g", max_batch=8), dp_size=2)
        async with dp, aiohttp.ClientSession() as s:
            assert [r.port for r in dp.ranks] == [dp.port, dp.port + 1]  # vLLM external DP LB: one port per rank
            heavy = {"prompt": "x" * 4 * 20_000, "max_tokens": 30}  # 20k prompt tokens: a slow rank
            light = {"prompt": "hi", "max_tokens": 30}
            results = await asyncio.gather(post(s, f"http://127.0.0.1:{dp.port}/v1/completions", heavy),
                                           post(s, f"http://127.0.0.1:{dp.port + 1}/v1/completions", light))  # fmt: skip
            texts = []
            for r in dp.ranks:
                async with s.get(f"http://127.0.0.1:{r.port}/metrics") as resp:
                    texts.append(await resp.text())
            return dp.state(), [x[2] for x in results], texts

    state, servers, texts = run(main())
    assert servers == ["g-dp0", "g-dp1"]
    # Exact accounting: each rank's busy + idle is the group's step time; the light rank did the idling.
    for r in range(2):
        assert state["busy_seconds"][r] + state["idle_seconds"][r] == pytest.approx(state["step_seconds"])
    assert state["idle_seconds"][1] > 10 * state["idle_seconds"][0]
    # Every decode step the light rank waits for the heavy rank's 20k resident KV tokens.
    per_step = rank_step_time(FAST, 1, 20_000) - rank_step_time(FAST, 1, 10)
    assert state["idle_seconds"][1] >= 0.8 * 29 * per_step
    assert 0.0 < state["idle_fraction"] < 0.5
    # The light request took as many (slow) lock steps as it had tokens: it ran at the heavy rank's pace.
    assert state["steps"] >= 30
    assert state["generated_tokens"] == 60
    idle = [_metric(t, "dlb_dp_idle_seconds_total") for t in texts]
    assert idle[1] == pytest.approx(state["idle_seconds"][1]) and idle[1] > idle[0]
    assert _metric(texts[0], "dlb_dp_busy_seconds_total") == pytest.approx(state["busy_seconds"][0])


def test_cli_serves_every_rank_on_consecutive_ports() -> None:
    import urllib.request

    with EmulatorProcess(server_id="c", profile="fast-test", dp_size=3) as p:
        for r in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{p.port + r}/metrics", timeout=5) as resp:
                assert resp.headers["x-dlb-server"] == f"c-dp{r}"
                assert "dlb_dp_idle_seconds_total" in resp.read().decode()
