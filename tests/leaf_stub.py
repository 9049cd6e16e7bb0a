"""A dlb.v1.Probe server standing in for a leaf agent in control-plane and root tests.

It is a real gRPC server on 127.0.0.1 answering with a cell state the test sets, so the code under
test (probe client, flow loop, root reconfiguration) runs unchanged; the leaf agent itself is tested
in test_leaf_*.py.
"""

from __future__ import annotations

import grpc

from dlb.proto import probe_pb2, probe_pb2_grpc


class StaticProbe(probe_pb2_grpc.ProbeServicer):
    def __init__(self, cell: str, rif: float, error_rate: float = 0.0, waiting: float = 0.0, kv_usage: float = 0.0) -> None:
        self.cell, self.rif, self.error_rate, self.completed = cell, rif, error_rate, 0
        self.waiting, self.kv_usage = waiting, kv_usage  # hub-score's signals; change them to move its pick
        self.probes = 0

    async def Probe(self, request, context):
        self.probes += 1
        self.completed += 5
        return probe_pb2.ProbeResponse(cell=self.cell, rif=self.rif, replicas=1, healthy_replicas=1, completed=self.completed,
                                       error_rate=self.error_rate, waiting=self.waiting, kv_usage=self.kv_usage,
                                       model=probe_pb2.LatencyModel(a_s=0.5, b_s=0.05, c=4, s=1, confidence=0.9, samples=100))


async def serve_probe(probe: StaticProbe, address: str) -> grpc.aio.Server:
    server = grpc.aio.server()
    probe_pb2_grpc.add_ProbeServicer_to_server(probe, server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind {address}")
    await server.start()
    return server
