"""Malformed request bodies get the emulator's JSON 400, never aiohttp's text/plain 500 (issue 14 row 11)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from dlb.emulator import EmulatorServer

HOSTILE: list[bytes] = [
    b'{"prompt": ' + b"9" * 5000 + b"}",  # past Python's 4,300-digit int limit
    b'{"max_tokens": ' + b"1" * 4400 + b', "prompt": "x"}',
    b"[" * 100_000 + b"]" * 100_000,  # JSON nested 100,000 deep
    b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"messages": "hi"}',
    b'{"messages": [{"role": 1}]}',
    b'{"messages": [{"role": "user", "content": [1]}]}',
    b'{"prompt": {"a": 1}}',
    b'{"prompt": "x", "stream": "yes"}',
    b'{"prompt": "x", "max_tokens": 1.5}',
    b'{"prompt": "x", "max_tokens": 1e400}',
    b'{"prompt": "x", "n": [1]}',
    b"\xff\xfe not utf-8",
    b"NaN",
]


def test_every_hostile_body_gets_a_json_400_from_a_live_emulator() -> None:
    async def go() -> list[tuple[str, int, str, Any]]:
        out = []
        async with EmulatorServer(port=0, time_scale=0.01) as emu, aiohttp.ClientSession() as s:
            for path in ("/v1/completions", "/v1/chat/completions", "/admin/faults"):
                base = emu.admin_url if path.startswith("/admin/") else emu.url
                for body in HOSTILE:
                    async with s.post(base + path, data=body, headers={"content-type": "application/json"}) as r:
                        text = await r.text()
                        out.append((path, r.status, r.content_type, json.loads(text) if r.content_type == "application/json" else text[:80]))
        return out

    results = asyncio.run(asyncio.wait_for(go(), 120))
    bad = [(path, status, ctype, body) for path, status, ctype, body in results
           if status != 400 or ctype != "application/json" or "message" not in body.get("error", {})]
    assert not bad, bad


def test_admin_api_only_on_its_own_port() -> None:
    """Whoever reaches the API port (clients, a leaf Envoy) cannot change faults or read the scheduler."""
    async def go() -> list[tuple[str, str, int]]:
        out = []
        async with EmulatorServer(port=0, time_scale=0.01) as emu, aiohttp.ClientSession() as s:
            assert emu.admin_port not in (None, emu.port)
            for method, path in (("GET", "/admin/faults"), ("POST", "/admin/faults"), ("DELETE", "/admin/faults"),
                                 ("POST", "/admin/faults/reset"), ("GET", "/admin/state")):
                async with s.request(method, emu.url + path, json={"down": True}) as r:
                    out.append(("api", path, r.status))
            assert emu.faults.down is False  # the POST above did nothing
            async with s.post(emu.admin_url + "/admin/faults", json={"slowdown": 2.0}) as r:
                out.append(("admin", "/admin/faults", r.status))
            async with s.post(emu.admin_url + "/v1/completions", json={"prompt": "x"}) as r:
                out.append(("admin", "/v1/completions", r.status))
            assert emu.faults.slowdown == 2.0
        async with EmulatorServer(port=0, time_scale=0.01, admin_port=None) as emu:
            assert emu.admin_port is None
        return out

    results = asyncio.run(asyncio.wait_for(go(), 60))
    assert [status for _, _, status in results] == [404] * 5 + [200, 404], results


def test_a_header_a_leaf_may_forward_reaches_the_handler() -> None:
    """A 10–60 KB header or URL (the Envoys pass up to 60 KiB) got aiohttp's text/plain 400 at 8 KB."""
    async def go() -> list[tuple[int, str]]:
        out = []
        async with EmulatorServer(port=0, time_scale=0.01) as emu, aiohttp.ClientSession() as s:
            for kb in (10, 40, 59):
                async with s.post(emu.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                                  headers={"x-big": "a" * (kb * 1024)}) as r:
                    out.append((r.status, r.content_type))
                async with s.get(emu.url + "/v1/models?q=" + "a" * (kb * 1024)) as r:
                    out.append((r.status, r.content_type))
        return out

    results = asyncio.run(asyncio.wait_for(go(), 60))
    assert results == [(200, "application/json")] * 6, results
