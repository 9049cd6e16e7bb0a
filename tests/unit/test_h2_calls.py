"""Bidirectional calls on the sans-I/O HTTP/2 connection (``Route.bidi``: how xDS's ADS runs on it).

Fed by the ``h2`` library's client as in ``test_h2_connection.py``; one rule per test, the rule as its
docstring. ``tests/integration/test_xds_protocol.py`` runs the xDS protocol over it on real sockets.
"""

from __future__ import annotations

import h2.events
from test_h2_connection import Pair, grpc_message

from dlb.transport.h2 import CallHandle, ErrorCode, GrpcStatus, H2Connection, Route
from dlb.transport.limits import H2Limits

ADS = "/test.Bidi/Stream"


class Recorder:
    """A :class:`~dlb.transport.h2.StreamCall` that records what it is told and keeps its handle."""

    calls: list[Recorder]

    def __init__(self, handle: CallHandle) -> None:
        self.handle = handle
        self.messages: list[bytes] = []
        self.half_closed = 0
        self.closed = 0
        Recorder.calls.append(self)

    def on_message(self, message: bytes) -> None:
        self.messages.append(message)

    def on_half_close(self) -> None:
        self.half_closed += 1

    def on_closed(self) -> None:
        self.closed += 1


def bidi_pair(limits: H2Limits | None = None) -> Pair:
    Recorder.calls = []
    p = Pair()
    if limits is not None:
        p.server.limits = limits
    p.server.routes = {**p.server.routes, ADS.encode(): Route.bidi(Recorder)}
    return p


def test_a_bidi_call_gets_every_message_and_sends_whenever_it_likes() -> None:
    """Each request message reaches the call in order, and a message it sends later, outside
    ``receive_data``, is written at once through ``on_output`` (a push with no request to answer)."""
    p = bidi_pair()
    written: list[bytes] = []
    p.server.on_output = lambda: written.append(p.server.data_to_send())
    p.request(1, b"one", path=ADS)
    p.client.send_data(1, grpc_message(b"two"))
    p.pump()
    (call,) = Recorder.calls
    assert call.messages == [b"one", b"two"] and written == []  # answers inside receive_data wait for its return
    call.handle.send(b"pushed")
    assert len(written) == 1
    p.events += p.client.receive_data(written[0])
    assert [e.data for e in p.of(h2.events.DataReceived, 1)] == [grpc_message(b"pushed")]


def test_the_clients_half_close_does_not_end_a_bidi_call() -> None:
    """The client's END_STREAM tells the call, which ends the stream when it chooses (with its status)."""
    p = bidi_pair()
    p.request(1, b"one", path=ADS, end_stream=True)
    (call,) = Recorder.calls
    assert call.half_closed == 1 and 1 in p.server.streams and p.of(h2.events.TrailersReceived, 1) == []
    call.handle.finish(GrpcStatus.OK)
    p.pump()
    assert p.status(1) == "0" and call.closed == 1 and not call.handle.open


def test_a_bidi_call_is_told_once_when_its_stream_goes() -> None:
    """Reset by the client, ended at shutdown (UNAVAILABLE) or with the connection lost: ``on_closed``
    exactly once each, and the stream is forgotten."""
    p = bidi_pair()
    for sid in (1, 3, 5):
        p.request(sid, b"hi", path=ADS)
    reset, shut, lost = Recorder.calls
    p.client.reset_stream(1, ErrorCode.CANCEL)
    p.pump()
    assert reset.closed == 1 and 1 not in p.server.streams
    p.server.end_watches(GrpcStatus.UNAVAILABLE, "server shutting down")
    p.pump()
    assert p.status(3) == str(int(GrpcStatus.UNAVAILABLE)) and shut.closed == 1
    assert lost.closed == 1  # end_watches ends every call
    p.server.connection_lost()
    assert [c.closed for c in Recorder.calls] == [1, 1, 1]


def test_a_bidi_call_opened_on_a_lost_connection_is_told_once() -> None:
    """``connection_lost`` tells every call still open that its stream is gone."""
    p = bidi_pair()
    p.request(1, b"hi", path=ADS)
    p.server.connection_lost()
    assert Recorder.calls[0].closed == 1


def test_a_message_over_max_message_ends_the_call_resource_exhausted() -> None:
    """``H2Limits.max_message`` bounds what a client may send in one message (xDS: 512 KiB)."""
    p = bidi_pair(H2Limits(max_message=8))
    p.request(1, b"123456789", path=ADS)
    assert p.status(1) == str(int(GrpcStatus.RESOURCE_EXHAUSTED)) and Recorder.calls[0].messages == []
    assert Recorder.calls[0].closed == 1


def test_the_peer_address_and_certificate_reach_the_call() -> None:
    """What the I/O layer set on the connection (peer, verified SANs) is what the call's handle shows."""
    p = bidi_pair()
    server: H2Connection = p.server
    server.peer, server.peer_auth = "10.0.0.7:5000", {"peer_uri": [b"spiffe://dlb/root/a"]}
    p.request(1, b"hi", path=ADS)
    handle = Recorder.calls[0].handle
    assert handle.peer == "10.0.0.7:5000" and handle.peer_auth == {"peer_uri": [b"spiffe://dlb/root/a"]}
