"""Who keeps a connection slot at the caps (dlb/transport/admission.py): pure bookkeeping."""

from __future__ import annotations

from dlb.transport.admission import Admission


def test_at_the_peer_cap_the_peers_oldest_unproven_connection_gives_way() -> None:
    adm = Admission[str](cap=10, peer_cap=2)
    adm.add("a1", "10.0.0.1")
    adm.add("a2", "10.0.0.1")
    adm.add("b1", "10.0.0.2")
    assert adm.make_room("10.0.0.1") == ["a1"]
    adm.add("a3", "10.0.0.1")
    assert len(adm) == 3
    assert adm.make_room("10.0.0.2") == []  # under both caps: nothing to close


def test_connections_that_opened_a_stream_are_never_displaced() -> None:
    adm = Admission[str](cap=2, peer_cap=2)
    adm.add("envoy", "127.0.0.1")
    adm.proven("envoy")
    adm.add("squat", "127.0.0.1")
    assert adm.make_room("127.0.0.1") == ["squat"]
    adm.add("envoy2", "127.0.0.1")
    adm.proven("envoy2")
    assert adm.make_room("127.0.0.1") is None  # every slot is a client's: refuse
    adm.remove("envoy")
    adm.remove("envoy")  # twice is harmless
    assert adm.make_room("127.0.0.1") == []


def test_at_the_total_cap_the_oldest_unproven_anywhere_gives_way_and_unclosable_ones_are_skipped() -> None:
    handing_over = {"x1"}
    adm = Admission[str](cap=3, peer_cap=3, closable=lambda c: c not in handing_over)
    for conn, peer in (("x1", "10.0.0.1"), ("y1", "10.0.0.2"), ("z1", "10.0.0.3")):
        adm.add(conn, peer)
    assert adm.make_room("10.0.0.4") == ["y1"]


def test_one_victim_serves_both_caps_when_it_is_the_peers_own() -> None:
    adm = Admission[str](cap=2, peer_cap=2)
    adm.add("a1", "p")
    adm.add("a2", "p")
    assert adm.make_room("p") == ["a1"]  # the peer's cap freed a slot under the total cap too
    assert len(adm) == 1
