"""A stub DNS server on the lab's bridge: what the cluster DNS is to a Kubernetes pod.

Why a server and not ``/etc/hosts`` per namespace: a headless Service is answered by the cluster's
DNS server over UDP, with every ready pod's address in one answer and a short TTL, and the set
changes when a pod goes away. Envoy (c-ares, ``STRICT_DNS`` clusters), gRPC (c-ares) and Python
(glibc ``getaddrinfo``) each take that path — ``/etc/resolv.conf``, a query, a multi-record answer
— and none of them takes it for a hosts file (c-ares and glibc read the file on another code path,
without TTLs). Each namespace's ``/etc/resolv.conf`` names this server (``ip netns exec`` mounts
``/etc/netns/<ns>/resolv.conf``, :meth:`dlb.testbed.netns.Lab.use_nameserver`).

Answers A records for the names of :attr:`StubDns.zone` (AAAA and other types: no data; other names:
NXDOMAIN), rotated one place per query as CoreDNS's ``loadbalance`` plugin does, so clients that
take the first address spread over the records. :func:`answer` is pure; :class:`StubDns` serves it
from a thread on a UDP socket made inside the DNS host's namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlb.testbed.netns import Host, entered

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


@dataclass
class StubDns:
    """Serve :func:`answer` for ``zone`` on ``host``'s address, port 53, from a daemon thread.

    ``zone`` may be changed while it runs (a Service's endpoints changing); :meth:`set` does it atomically.
    """

    host: Host
    zone: dict[str, list[str]] = field(default_factory=dict)
    ttl_s: int = TTL_S
    queries: int = 0
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _turns: dict[str, int] = field(default_factory=dict)

    def set(self, name: str, ips: Sequence[str]) -> None:
        with self._lock:
            self.zone[name.lower().rstrip(".")] = list(ips)

    def start(self) -> StubDns:
        with entered(self.host):  # the socket is made in the DNS host's namespace and stays there
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((self.host.ip, 53))
        self._thread = threading.Thread(target=self._serve, name=f"stub-dns-{self.host.name}", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                query, peer = sock.recvfrom(512)
            except OSError:  # closed by stop()
                return
            if not peer:  # shut down by stop()
                return
            with self._lock:
                try:
                    name, qtype = _question(query)[:2]
                except ValueError:
                    name, qtype = "", 0
                # Turn on A queries only: glibc asks A and AAAA for each lookup, which would turn twice.
                turn = self._turns.get(name, 0)
                if qtype == TYPE_A:
                    self._turns[name] = turn + 1
                self.queries += 1
                reply = answer(query, self.zone, turn, self.ttl_s)
            with contextlib.suppress(OSError):
                sock.sendto(reply, peer)

    def stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._thread is not None:
            self._thread.join(5)
