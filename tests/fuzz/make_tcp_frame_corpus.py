#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/tcp_frame_fuzz.cc into corpus/tcp_frame/.

Each file is the fuzz input: one mode byte (see the target's header comment),
then a stream of TCP frames (worker/ipc/src/tcp_frame.h) with real XXH3-64
checksums (libxxhash through ctypes), valid ones and malformed ones.

  tests/fuzz/make_tcp_frame_corpus.py   (rewrites the directory's seed files)
"""
import ctypes
import ctypes.util
import os
import struct

_xxh = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

MAGIC = 0x54706B63
HELLO, CONFIGURE, TRAIN, RESULT, SHUTDOWN = 2, 3, 4, 5, 8
FRAGMENT, HEARTBEAT = 1, 64
FIRST, LAST = 1, 2


def xxh3(b):
    return _xxh.XXH3_64bits(b, len(b))


def frame(ftype, seq, payload=b"", flags=0, message_bytes=None, message_type=None,
          offset=0, payload_bytes=None, payload_xxh3=None, header_xxh3=None):
    if message_bytes is None:
        message_bytes = len(payload)
    if message_type is None:
        message_type = ftype
    if payload_bytes is None:
        payload_bytes = len(payload)
    if payload_xxh3 is None:
        payload_xxh3 = xxh3(payload)
    head = struct.pack("<IHHQQQQHHIQ", MAGIC, ftype, flags, seq, payload_bytes, payload_xxh3,
                       message_bytes, message_type, 0, 0, offset)
    assert len(head) == 56
    if header_xxh3 is None:
        header_xxh3 = xxh3(head)
    return head + struct.pack("<Q", header_xxh3) + payload


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "tcp_frame")
    os.makedirs(out, exist_ok=True)
    msg = bytes(range(30))
    seeds = {
        # Valid streams.
        "valid_messages": b"\x00" + frame(HELLO, 1, b"hello") + frame(HEARTBEAT, 2)
        + frame(TRAIN, 3, b"x" * 100) + frame(SHUTDOWN, 4),
        "valid_fragments": b"\x00"
        + frame(FRAGMENT, 1, msg[:10], FIRST, 30, RESULT, 0)
        + frame(HEARTBEAT, 2)
        + frame(FRAGMENT, 3, msg[10:20], 0, 30, RESULT, 10)
        + frame(FRAGMENT, 4, msg[20:], LAST, 30, RESULT, 20)
        + frame(CONFIGURE, 5, b"{}"),
        # A sender that gave up on a message: a new one drops it, and the
        # rest of the dropped one is skipped.
        "abandoned_fragments": b"\x00"
        + frame(FRAGMENT, 1, msg[:10], FIRST, 30, RESULT, 0)
        + frame(HELLO, 2, b"new")
        + frame(FRAGMENT, 3, msg[10:20], 0, 30, RESULT, 10)
        + frame(FRAGMENT, 4, msg[:15], FIRST, 30, TRAIN, 0)
        + frame(FRAGMENT, 5, msg[15:], LAST, 30, TRAIN, 15),
        # A 2 GiB message claim: over the TCP default limit (1 GiB + 1 MiB)
        # and over a 4 MiB limit (mode bits 3-4 = 1) it ends the stream.
        "claim_2gib_message": b"\x00" + frame(FRAGMENT, 1, b"a" * 16, FIRST, 2 << 30, RESULT, 0),
        # A 1 GiB claim within the limit and no budget (a worker's channel):
        # the buffer is claimed and reserved whole, its pages resident only
        # as payloads arrive; with a 64 MiB budget (mode bit 5) it is refused
        # before anything is allocated.
        "claim_1gib_message": b"\x00" + frame(FRAGMENT, 1, b"a" * 16, FIRST, 1 << 30, RESULT, 0),
        "claim_1gib_message_over_budget": b"\x20"
        + frame(FRAGMENT, 1, b"a" * 16, FIRST, 1 << 30, RESULT, 0),
        # Within the budget: a message assembled from two fragments, then a
        # single-frame one, each claim given back as it is delivered.
        "budget_fragments": b"\x20"
        + frame(FRAGMENT, 1, msg[:10], FIRST, 30, RESULT, 0)
        + frame(FRAGMENT, 2, msg[10:], LAST, 30, RESULT, 10)
        + frame(HELLO, 3, b"hello"),
        "claim_2gib_message_over_limit": b"\x08"
        + frame(FRAGMENT, 1, b"a" * 16, FIRST, 2 << 30, RESULT, 0),
        # A single frame claiming a 2 GiB payload (the frame limit is 1 MiB).
        "claim_2gib_frame": b"\x00" + frame(RESULT, 1, b"abc", payload_bytes=2 << 30,
                                            message_bytes=2 << 30),
        # The stream ends inside a header, then inside a payload.
        "truncated_header": b"\x00" + frame(HELLO, 1, b"hi") + frame(HELLO, 2, b"hi")[:40],
        "truncated_payload": b"\x00" + frame(TRAIN, 1, b"y" * 100)[:64 + 10],
        # Checksums: a bad payload checksum skips that record only; a bad
        # header checksum ends the stream.
        "bad_payload_checksum": b"\x00" + frame(HELLO, 1, b"hello", payload_xxh3=12345)
        + frame(HELLO, 2, b"again"),
        "bad_header_checksum": b"\x00" + frame(HELLO, 1, b"hello", header_xxh3=1),
        "bad_fragment_checksum": b"\x00"
        + frame(FRAGMENT, 1, msg[:10], FIRST, 30, RESULT, 0, payload_xxh3=7)
        + frame(FRAGMENT, 2, msg[10:], LAST, 30, RESULT, 10),
        # Header faults behind a good checksum.
        "bad_sequence": b"\x00" + frame(HELLO, 1, b"a") + frame(HELLO, 5, b"b"),
        "bad_type": b"\x00" + frame(99, 1, b"a"),
        "heartbeat_with_payload": b"\x00" + frame(HEARTBEAT, 1, b"p"),
        "fragment_past_end": b"\x00" + frame(FRAGMENT, 1, msg, LAST, 20, RESULT, 0),
        "fragment_bad_flags": b"\x00" + frame(FRAGMENT, 1, msg[:10], FIRST | 8, 30, RESULT, 0),
        # Checksums resealed by the target (mode bits 0-2): garbage fields
        # reach the fragment bookkeeping.
        "resealed_garbage": b"\x07"
        + frame(FRAGMENT, 0, msg[:10], FIRST, 30, HELLO, 0, header_xxh3=0, payload_xxh3=0)
        + frame(FRAGMENT, 0, msg[10:], LAST, 30, HELLO, 10, header_xxh3=0, payload_xxh3=0)
        + bytes(64),
        "resealed_at_small_limit": b"\x1f" + frame(FRAGMENT, 0, b"z" * 900, FIRST, 1000, TRAIN, 0)
        + frame(FRAGMENT, 0, b"z" * 100, LAST, 1000, TRAIN, 900),
        "resealed_small_limit": b"\x1f" + frame(FRAGMENT, 0, b"z" * 900, FIRST, 1001, TRAIN, 0)
        + frame(FRAGMENT, 0, b"z" * 101, LAST, 1001, TRAIN, 900),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {out}")


if __name__ == "__main__":
    main()
