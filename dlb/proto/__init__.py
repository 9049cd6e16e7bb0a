"""Our own protobuf API (package ``dlb.v1``) and its generated code.

``probe.proto`` is the source; ``probe_pb2.py`` / ``probe_pb2_grpc.py`` are generated and committed
(so a fresh install needs no protoc). Regenerate with ``python -m dlb.proto.generate`` — the test
``tests/integration/test_probe_proto.py`` fails when the committed files are out of date.
"""
