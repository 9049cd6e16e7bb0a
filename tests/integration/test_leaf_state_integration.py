"""The leaf's bookkeeping (pure, clock passed in): picking, RIF accounting, completions, health.

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/unit/test_leaf_state.py``.
The rules and what the tests stand for: that file's docstring.
"""

import pytest


def test_scrape_tells_a_slow_server_from_an_unreachable_one():
    """Real sockets: a server that accepts but does not answer in time is ScrapeSlow; a refused port is
    unreachable (all None)."""
    import asyncio

    from dlb.probe.scrape import Scrape, ScrapeSlow, scrape_vllm
    from dlb.procutil import free_port

    async def scenario() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(5)
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(ScrapeSlow):
                await scrape_vllm(f"127.0.0.1:{port}", 0.1)
        finally:
            server.close()
        assert await scrape_vllm(f"127.0.0.1:{free_port()}", 0.5) == (None,) * len(Scrape._fields)

    asyncio.run(scenario())
