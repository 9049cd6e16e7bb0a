"""Control-plane reloads: a request to reload during a reload is queued, and the latest file wins."""

from __future__ import annotations

import asyncio

from dlb.control_plane.reload import Reloader


def test_a_reload_requested_while_one_runs_is_queued_and_reads_the_latest_file() -> None:
    """Rule: signals during a running reload are not dropped; they coalesce into one more reload,
    which sees the file as it is after the last signal."""

    async def main() -> tuple[list[str], int]:
        disk = {"file": "v1"}
        applied: list[str] = []
        gate = asyncio.Event()

        async def reload_now() -> None:
            content = disk["file"]  # read at the start, as load_config does
            if not applied:
                await gate.wait()  # the first reload is slow
            applied.append(content)

        r = Reloader(reload_now)
        r.request()
        await asyncio.sleep(0)  # the first reload reads v1 and blocks
        disk["file"] = "v2"
        r.request()  # SIGHUP during the reload
        disk["file"] = "v3"
        r.request()  # and another: both coalesce
        gate.set()
        await r.idle()
        return applied, r.runs

    applied, runs = asyncio.run(main())
    assert applied == ["v1", "v3"] and runs == 2


def test_a_failing_reload_does_not_stop_the_queue() -> None:
    async def main() -> list[int]:
        calls: list[int] = []

        async def reload_now() -> None:
            calls.append(len(calls))
            if len(calls) == 1:
                r.request()  # a signal arrives while this reload runs...
                raise RuntimeError("loader bug")  # ...and this one fails

        r = Reloader(reload_now)
        r.request()
        await r.idle()
        r.request()  # idle again: a new request runs at once
        await r.idle()
        return calls

    assert asyncio.run(main()) == [0, 1, 2]
