"""The schema registry's wire format: magic byte 0, the schema id (4 bytes, big-endian),
then the payload; a protobuf payload starts with its message indexes (zigzag varints:
how many, then each; ``[0]``, the first message of the file, is the single byte 0)."""

from __future__ import annotations

from service.formats.errors import UndecodableError

MAGIC = 0
HEADER = 5


def split(data: bytes) -> tuple[int, memoryview]:
    """``(schema id, payload)``; bytes not in the wire format raise UndecodableError."""
    if len(data) < HEADER or data[0] != MAGIC:
        raise UndecodableError(
            f"not in the schema registry wire format (magic byte 0 and a 4-byte schema id): "
            f"{len(data)} bytes starting {bytes(data[:HEADER]).hex() or 'empty'}")
    return int.from_bytes(data[1:HEADER], "big"), memoryview(data)[HEADER:]


def header(schema_id: int) -> bytes:
    return bytes((MAGIC,)) + schema_id.to_bytes(4, "big")


def _zigzag_varint(value: int) -> bytes:
    number = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        if number:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def message_indexes(path: list[int]) -> bytes:
    if path == [0]:
        return b"\x00"
    return _zigzag_varint(len(path)) + b"".join(_zigzag_varint(i) for i in path)


def skip_message_indexes(payload: memoryview) -> memoryview:
    """The protobuf message after its indexes."""
    count, at = _read_varint(payload, 0)
    for _ in range(count):
        _, at = _read_varint(payload, at)
    return payload[at:]


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    shift = number = 0
    while True:
        if at >= len(data):
            raise UndecodableError("the protobuf message indexes end early")
        byte = data[at]
        at += 1
        number |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (number >> 1) ^ -(number & 1), at
        shift += 7
