"""A minimal ExternalProcessor that always answers the same cell: the floor the benchmark compares
the real root service against (same grpc.aio + uvloop stack, same pre-serialised reply, no routing).

``python -m dlb.ext_proc.bare --listen 127.0.0.1:PORT --cell cell-x [--ready-file F]``
"""

from __future__ import annotations

import argparse
import os

import grpc

from dlb.ext_proc import headers
from dlb.ext_proc.protocol import ext_proc_handler, header_response, serve_until_signal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--cell", required=True, help="x-dlb-cell value to answer (cluster name)")
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args(argv)
    reply = header_response([(headers.CELL, args.cell)])

    async def process(requests, context):
        async for _ in requests:
            yield reply
            return

    async def run() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((ext_proc_handler(process),))
        port = server.add_insecure_port(args.listen)
        await server.start()
        if args.ready_file:
            from dlb.ext_proc.root import _write_ready

            _write_ready(args.ready_file, {"ext_proc": port, "pid": os.getpid()})
        await serve_until_signal(server)

    from dlb.ext_proc.root import run_event_loop

    run_event_loop(run())


if __name__ == "__main__":
    main()
