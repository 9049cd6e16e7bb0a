"""Server-side TLS over memory buffers: ciphertext in, plaintext out, and back (no sockets, no clock).

Why our own TLS layer instead of ``loop.create_server(ssl=...)``: asyncio (and uvloop) run the TLS
handshake in their own protocol and only call ours once it completed, so until then none of the
transport's bounds applied — 20,000 connections that never sent a byte each held a pending handshake
and its buffers (issue 14 row 3 under mTLS: RSS 80 → ~1000 MB, a 233–315 ms loop block). With TLS
inside our protocol, the connection cap and the handshake timeout act at accept, and this object —
the OpenSSL state — is made only when a connection's first bytes arrive, so a connection that sends
nothing costs no TLS memory at all. (``loop.start_tls`` after a plain accept was tried: under uvloop
bytes arriving before it installed its protocol were lost and handshakes hung.)

The same ``ssl.SSLObject`` + ``MemoryBIO`` pair asyncio's own TLS protocol uses, so the cost per
record is OpenSSL's either way; what changes is who owns the bytes and when the state exists.
"""

from __future__ import annotations

import ssl

#: Plaintext read per SSLObject.read call (a TLS record carries at most 16 KiB).
READ_CHUNK = 64 * 1024


class TlsServerSession:
    """One connection's server side of TLS: :meth:`receive` ciphertext, :meth:`send` plaintext,
    :meth:`data_to_send` the ciphertext (handshake, records, alerts) for the socket.

    Errors are ``ssl.SSLError`` from :meth:`receive` (a failed handshake or a bad record); what is left
    in :meth:`data_to_send` then is the alert for the peer.
    """

    __slots__ = ("_in", "_obj", "_out", "handshake_done", "peer_closed")

    def __init__(self, context: ssl.SSLContext) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=True)
        self.handshake_done = False
        #: The peer sent close_notify: no more plaintext will come.
        self.peer_closed = False

    def receive(self, data: bytes) -> bytes:
        """Feed ciphertext; return the plaintext it completed (``b""`` during the handshake)."""
        self._in.write(data)
        obj = self._obj
        if not self.handshake_done:
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.handshake_done = True
        chunks: list[bytes] = []
        incoming = self._in
        while True:
            try:
                chunk = obj.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            if not chunk:
                break
            chunks.append(chunk)
            if not incoming.pending and not obj.pending():
                break  # all consumed: skip the read that would only raise SSLWantReadError (once per request)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def send(self, data: bytes) -> None:
        """Encrypt ``data`` (the memory BIO takes all of it: no partial writes). After the peer's
        close_notify nothing more can go out (the server's GOAWAY at stop then raised from ``stop``)."""
        try:
            self._obj.write(data)
        except ssl.SSLError as exc:
            if exc.reason != "PROTOCOL_IS_SHUTDOWN":
                raise
            self.peer_closed = True

    def data_to_send(self) -> bytes:
        return self._out.read() if self._out.pending else b""

    def peer_auth(self) -> dict[str, list[bytes]]:
        """The verified client certificate under gRPC's auth-context keys (every SAN under
        ``x509_subject_alternative_name``, URI SANs under ``peer_uri``, the PEM under ``x509_pem_cert``);
        empty without one."""
        cert = self._obj.getpeercert() if self.handshake_done else None
        if not cert:
            return {}
        sans = list(cert.get("subjectAltName", ()))
        der = self._obj.getpeercert(binary_form=True)
        return {"x509_subject_alternative_name": [str(v).encode() for _k, v in sans],
                "peer_uri": [str(v).encode() for k, v in sans if k == "URI"],
                "x509_pem_cert": [ssl.DER_cert_to_PEM_cert(der).encode()] if der else []}

    def close(self) -> None:
        """Queue our close_notify (the peer's answer is not waited for: the socket closes next)."""
        if self.handshake_done:
            try:
                self._obj.unwrap()
            except (ssl.SSLError, OSError):  # SSLWantReadError: the peer's close_notify has not come
                pass
