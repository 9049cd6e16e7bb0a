"""A stub DNS server on the lab's bridge: what the cluster DNS is to a Kubernetes pod.

Why a server and not ``/etc/hosts`` per namespace: a headless Service is answered by the cluster's
DNS server over UDP, with every ready pod's address in one answer and a short TTL, and the set
changes when a pod goes away. Envoy (c-ares, ``STRICT_DNS`` clusters), gRPC (c-ares) and Python
(glibc ``getaddrinfo``) each take that path — ``/etc/resolv.conf``, a query, a multi-record answer
— and none of them takes it for a hosts file (c-ares and glibc read the file on another code path,
without TTLs). Each namespace's ``/etc/resolv.conf`` names this server (``ip netns exec`` mounts
``/etc/netns/<ns>/resolv.conf``, :meth:`dlb.testbed.netns.Lab.use_nameserver`).

Answers A records for the names of :attr:`StubDns.zone` (AAAA and other types: no data; other names:
NXDOMAIN), rotated one place per query as CoreDNS's ``loadbalance`` plugin does. :func:`answer` is
pure; :func:`serve` answers on UDP in a process of the lab's ``dns`` host (not a thread of the test's
process, whose own work would hold the GIL while resolvers time out and retry).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import struct
import sys
from collections.abc import Mapping, Sequence

from dlb.testbed.netns import Host

TYPE_A, CLASS_IN = 1, 1
RCODE_OK, RCODE_FORMERR, RCODE_NXDOMAIN = 0, 1, 3
#: Seconds a resolver may cache an answer: CoreDNS's default for Kubernetes records is 5 s.
TTL_S = 5


def _question(msg: bytes) -> tuple[str, int, int, int]:
    """(name, qtype, qclass, end offset) of the first question; ValueError on a malformed message."""
    if len(msg) < 12 or struct.unpack("!H", msg[4:6])[0] < 1:
        raise ValueError("no question")
    labels, at = [], 12
    while True:
        if at >= len(msg):
            raise ValueError("truncated name")
        n = msg[at]
        at += 1
        if n == 0:
            break
        if n & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(msg[at:at + n].decode("ascii", errors="replace"))
        at += n
    if at + 4 > len(msg):
        raise ValueError("truncated question")
    qtype, qclass = struct.unpack("!HH", msg[at:at + 4])
    return ".".join(labels).lower(), qtype, qclass, at + 4


def answer(query: bytes, zone: Mapping[str, Sequence[str]], rotate: int = 0, ttl_s: int = TTL_S) -> bytes:
    """The response to ``query``: the A records of its name in ``zone`` rotated by ``rotate`` (pure)."""
    qid = query[:2] if len(query) >= 2 else b"\0\0"
    rd = (query[2] & 0x01) if len(query) > 2 else 0
    try:
        name, qtype, qclass, end = _question(query)
        name = name.rstrip(".")
    except ValueError:
        return qid + struct.pack("!HHHHH", 0x8000 | (rd << 8) | 0x0080 | RCODE_FORMERR, 0, 0, 0, 0)
    ips = list(zone.get(name, ()))
    rcode = RCODE_OK if name in zone else RCODE_NXDOMAIN
    records = b""
    count = 0
    if qtype == TYPE_A and qclass == CLASS_IN and ips:
        k = rotate % len(ips)
        for ip in ips[k:] + ips[:k]:
            # 0xC00C: the name is the question's, at offset 12.
            records += struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, ttl_s, 4) + ipaddress.IPv4Address(ip).packed
            count += 1
    flags = 0x8000 | 0x0400 | (rd << 8) | 0x0080 | rcode  # QR, AA, RD copied, RA
    return qid + struct.pack("!HHHHH", flags, 1, count, 0, 0) + query[12:end] + records


def serve(address: str, zone: Mapping[str, Sequence[str]], ttl_s: int = TTL_S) -> None:
    """Answer queries on ``address``:53 (UDP) forever, rotating each name's records per A query."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    turns: dict[str, int] = {}
    while True:
        query, peer = sock.recvfrom(512)
        try:
            name, qtype = _question(query)[:2]
        except ValueError:
            name, qtype = "", 0
        # Turn on A queries only: glibc asks A and AAAA for each lookup, which would turn twice.
        turn = turns.get(name.rstrip("."), 0)
        if qtype == TYPE_A:
            turns[name.rstrip(".")] = turn + 1
        with contextlib.suppress(OSError):
            sock.sendto(answer(query, zone, turn, ttl_s), peer)


def argv(host: Host, zone: Mapping[str, Sequence[str]]) -> list[str]:
    """The stub DNS server as a process of ``host`` (a pod of its own, like the cluster's DNS)."""
    code = "from dlb.testbed.cli import stub_dns_main; stub_dns_main()"
    return host.argv([sys.executable, "-c", code, host.ip, json.dumps({k: list(v) for k, v in zone.items()})])


def answers(address: str, name: str, timeout_s: float = 0.5) -> list[str]:
    """The A records the server at ``address`` gives ``name`` (its readiness check); OSError if it does not answer."""
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    query = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", TYPE_A, CLASS_IN)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        sock.sendto(query, (address, 53))
        reply = sock.recv(512)
    count, at = struct.unpack("!H", reply[6:8])[0], len(query)
    return [str(ipaddress.IPv4Address(reply[at + 12 + 16 * k:at + 16 + 16 * k])) for k in range(count)]
