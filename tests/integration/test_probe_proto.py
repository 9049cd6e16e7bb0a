"""The committed generated code matches dlb/proto/*.proto, and the probe round-trips over real gRPC."""

import asyncio
import subprocess
import sys

import grpc
import pytest

from dlb.proto import probe_pb2, probe_pb2_grpc


def test_generated_code_is_up_to_date():
    pytest.importorskip("grpc_tools")
    r = subprocess.run([sys.executable, "-m", "dlb.proto.generate", "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_probe_round_trip_over_grpc():
    class Servicer(probe_pb2_grpc.ProbeServicer):
        async def Probe(self, request, context):
            return probe_pb2.ProbeResponse(cell="x", rif=3.0, replicas=4, error_rate=0.25,
                                           model=probe_pb2.LatencyModel(a_s=1.0, b_s=0.1, c=2.0, s=0.5, confidence=0.7),
                                           timestamp_unix_ns=123)

    async def main():
        server = grpc.aio.server()
        probe_pb2_grpc.add_ProbeServicer_to_server(Servicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return await probe_pb2_grpc.ProbeStub(ch).Probe(probe_pb2.ProbeRequest(source_cell="y"), timeout=5)
        finally:
            await server.stop(0)

    resp = asyncio.run(main())
    assert (resp.cell, resp.rif, resp.replicas, resp.error_rate, resp.timestamp_unix_ns) == ("x", 3.0, 4, 0.25, 123)
    assert resp.HasField("model") and resp.model.confidence == pytest.approx(0.7)
