"""The self-checking block record shared by FileStore and RedisStore: format 2 (XXH3-128) is written,
format 1 (blake2b-256) still reads, and every damaged or unknown record is rejected, never returned."""
from __future__ import annotations

import hashlib
import struct

import pytest
import torch
import xxhash

from deferdump.reference.stores.base import ReadyPayload
from deferdump.reference.stores.file import FileStore, decode_block, decode_block_view, encode_block
from deferdump.reference.stores.threaded import BadBlock

HASH = bytes(range(32))
PAYLOAD = bytes((i * 7 + 3) % 256 for i in range(1000))


def _v1_record(block_hash: bytes, payload: bytes) -> bytes:
    """A format-1 record built by hand, as stores before format 2 wrote it."""
    digest = hashlib.blake2b(block_hash + payload, digest_size=32).digest()
    return struct.pack("<8sHHIQ32s", b"DDKVBLK\x00", 1, 0, len(block_hash), len(payload), digest) + block_hash + payload


def test_format_2_is_written_with_an_xxh3_128_digest() -> None:
    record = encode_block(HASH, PAYLOAD)
    magic, version, flags, hash_len, payload_len, digest = struct.unpack_from("<8sHHIQ16s", record)
    assert (magic, version, flags, hash_len, payload_len) == (b"DDKVBLK\x00", 2, 0, 32, len(PAYLOAD))
    assert digest == xxhash.xxh3_128(HASH + PAYLOAD).digest()
    assert record[40:] == HASH + PAYLOAD
    assert decode_block(HASH, record) == PAYLOAD


def test_format_1_records_still_read_and_verify() -> None:
    record = _v1_record(HASH, PAYLOAD)
    assert decode_block(HASH, record) == PAYLOAD
    damaged = bytearray(record)
    damaged[-1] ^= 0x01
    with pytest.raises(BadBlock, match="checksum mismatch"):
        decode_block_view(HASH, bytes(damaged))


@pytest.mark.parametrize("version", [0, 3, 0xFFFF])
def test_unknown_versions_are_bad_records(version: int) -> None:
    record = bytearray(encode_block(HASH, PAYLOAD))
    struct.pack_into("<H", record, 8, version)
    with pytest.raises(BadBlock, match="unsupported format version"):
        decode_block_view(HASH, bytes(record))


def test_a_format_2_body_under_a_format_1_version_is_rejected() -> None:
    """A version field flipped between known versions reads the digest at the wrong place: rejected."""
    record = bytearray(encode_block(HASH, PAYLOAD))
    struct.pack_into("<H", record, 8, 1)
    with pytest.raises(BadBlock):
        decode_block_view(HASH, bytes(record))


@pytest.mark.parametrize("make", [encode_block, _v1_record], ids=["v2", "v1"])
def test_every_single_bit_flip_of_header_and_hash_and_a_payload_sample_is_rejected(make) -> None:
    record = make(HASH, PAYLOAD)
    header_and_hash = len(record) - len(PAYLOAD)
    offsets = list(range(header_and_hash)) + list(range(header_and_hash, len(record), 97)) + [len(record) - 1]
    for offset in offsets:
        for bit in (0x01, 0x80):
            damaged = bytearray(record)
            damaged[offset] ^= bit
            with pytest.raises(BadBlock):
                decode_block_view(HASH, bytes(damaged))


def test_a_filestore_directory_of_format_1_files_still_loads(tmp_path) -> None:
    data = torch.arange(3 * 256, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(3, 256)
    hashes = [bytes([i]) * 32 for i in range(3)]
    with FileStore(tmp_path) as store:
        store.wait(store.dump(hashes, ReadyPayload(data)))
        for block_hash, row in zip(hashes[:2], data[:2]):  # rewrite two blocks as an old store would have
            store.path_of(block_hash).write_bytes(_v1_record(block_hash, row.numpy().tobytes()))
    with FileStore(tmp_path) as reopened:
        assert reopened.lookup_prefix(hashes) == 3
        assert torch.equal(reopened.wait(reopened.load(hashes)), data)
