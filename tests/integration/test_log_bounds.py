"""Logs stay bounded under hostile input: a live root service (``dlb serve root``) gets 1,500 fuzzed
HTTP/2 conversations (the transport fuzz test's generator: mostly client-shaped frames with malformed
gRPC messages and any frame at all), one connection each, and its log grows by at most 100 lines with
no traceback. Before, every bad connection logged ``h2_connection_error`` and every malformed
protobuf a full traceback (1,435 lines from 1,531 conversations).
"""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from test_h2_fuzz import conversations

from dlb.procutil import free_port
from dlb.testbed.process import ServiceProcess
from dlb.transport.h2 import PREFACE

pytestmark = pytest.mark.timeout(600)
CONVERSATIONS = 1_500
MAX_LINES = 100


def _send(port: int, seq: list[bytes]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(PREFACE + b"".join(seq))
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass  # cut off by the server: fine, that is one of the answers


def test_fuzzed_conversations_leave_a_short_log_without_tracebacks() -> None:
    ext_proc = free_port()
    raw = {"version": 1, "cells": [{"name": "a", "servers": [f"127.0.0.1:{free_port()}"],
                                    "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                                    "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{ext_proc}"}}],
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]}
    with tempfile.TemporaryDirectory(prefix="dlb-logbound-") as tmp:
        path = Path(tmp) / "dlb.yaml"
        path.write_text(json.dumps(raw))
        with ServiceProcess("root", "--config", str(path), "--cell", "a", "--metrics", "") as root:
            start = len(root.log_path.read_bytes())
            sent = [0]

            @settings(max_examples=CONVERSATIONS, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(conversations())
            def one(seq: list[bytes]) -> None:
                sent[0] += 1
                _send(ext_proc, seq)

            one()
            text = root.log_path.read_bytes()[start:].decode(errors="replace")
    lines = text.splitlines()
    kinds = sorted({json.loads(ln).get("event", "?") for ln in lines if ln.startswith("{")})
    print(f"{sent[0]} conversations: {len(lines)} log lines, kinds {kinds}")
    assert sent[0] >= CONVERSATIONS * 0.9  # hypothesis may stop early only once it ran out of distinct examples
    assert len(lines) <= MAX_LINES, "\n".join(lines[:20])
    assert "Traceback" not in text
