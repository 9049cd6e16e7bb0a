"""A minimal ExternalProcessor that always answers the same cell: the floor the benchmark compares
the real root service against (same transport, same pre-serialised reply, no parsing, no routing).

``python -m dlb.bench.bare --listen 127.0.0.1:PORT --cell cell-x [--transport h2|grpc] [--ready-file F]``
"""

from __future__ import annotations

import argparse
import os

from dlb.envoy import contract
from dlb.ext_proc.protocol import ExtProcServer, header_response
from dlb.service.serve import serve_until_signal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--cell", required=True, help="x-dlb-cell value to answer (cluster name)")
    parser.add_argument("--ready-file", default=None)
    parser.add_argument("--transport", choices=("h2", "grpc"), default="grpc")
    args = parser.parse_args(argv)
    reply = header_response([(contract.CELL, args.cell)])
    answer = (reply, True)

    def handle(message: bytes) -> tuple[bytes, bool]:
        return answer

    async def run() -> None:
        server = ExtProcServer(args.transport, handle)
        port = await server.bind(args.listen)
        if args.ready_file:
            from dlb.service.runner import write_ready

            write_ready(args.ready_file, {"ext_proc": port, "pid": os.getpid()})
        await serve_until_signal(server)

    from dlb.service.runner import run_event_loop

    run_event_loop(run())


if __name__ == "__main__":
    main()
