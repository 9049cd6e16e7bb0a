"""Just enough protobuf wire format to assemble responses from pre-serialized pieces.

Protobuf's encoding is a concatenation of fields, and parsing concatenated messages merges them. So a
``DiscoveryResponse`` can be built as ``body + tail`` where ``body`` (version, type URL and the
resources, each already serialized once per snapshot) is shared by every stream that sees the same
view, and ``tail`` carries the per-stream nonce. With hundreds of streams this turns a per-stream
serialization of every resource into one ``bytes.join``.
"""

from __future__ import annotations


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """Encode one length-delimited field (strings, bytes, embedded messages)."""
    return varint((field_number << 3) | 2) + varint(len(payload)) + payload


def string_field(field_number: int, value: str) -> bytes:
    """A proto3 string field; empty strings are omitted, as the protobuf runtime does."""
    return length_delimited(field_number, value.encode()) if value else b""


# Field numbers (envoy/service/discovery/v3/discovery.proto).
class SotwResponseField:
    VERSION_INFO = 1
    RESOURCES = 2
    TYPE_URL = 4
    NONCE = 5
    CONTROL_PLANE = 6


class DeltaResponseField:
    SYSTEM_VERSION_INFO = 1
    RESOURCES = 2
    TYPE_URL = 4
    NONCE = 5
    REMOVED_RESOURCES = 6
    CONTROL_PLANE = 7
