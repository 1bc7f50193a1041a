"""benchmarks/gpu_wheelhouse: the fatbin pruner keeps exactly what a GPU of one SM generation
loads and zeroes the rest; the ELF section lookup finds sections of a real ELF file."""
from __future__ import annotations

import struct
import sys

import pytest

from benchmarks.gpu_wheelhouse import FATBIN_MAGIC, KIND_ELF, KIND_PTX, elf_section, prune_fatbin


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def test_prune_keeps_own_machine_code_and_older_ptx_only():
    a = container(entry(KIND_ELF, 80, b"\x80" * 40), entry(KIND_ELF, 90, b"\x90" * 24),
                  entry(KIND_PTX, 75, b"\x75" * 8))
    b = container(entry(KIND_ELF, 120, b"\x12" * 16), entry(KIND_PTX, 120, b"\x13" * 8))
    section = a + bytes(8) + b                          # 8-byte padding between containers
    data = bytearray(b"HEAD" * 4 + section + b"TAIL")
    stats = prune_fatbin(data, 16, len(section), 90)
    assert stats == {"kept": 24 + 8, "zeroed": 40 + 16 + 8}
    assert len(data) == 16 + len(section) + 4
    assert data[:16] == b"HEAD" * 4 and data[-4:] == b"TAIL"
    assert data.count(b"\x90" * 24) == 1 and data.count(b"\x75" * 8) == 1
    for gone in (b"\x80", b"\x12", b"\x13"):
        assert gone not in data
    # headers are untouched: the same walk finds the same entries
    assert prune_fatbin(data, 16, len(section), 90) == stats


def test_elf_section_of_a_real_file():
    with open(sys.executable, "rb") as fh:
        data = fh.read()
    offset, size = elf_section(data, ".text") or (0, 0)
    assert size > 0 and offset + size <= len(data)
    assert elf_section(data, ".nv_fatbin") is None
    with pytest.raises(ValueError):
        elf_section(b"#!/bin/sh\n" + bytes(64), ".text")


def test_malformed_input_is_refused_not_written_past():
    good = container(entry(KIND_ELF, 80, b"\x80" * 40))
    lying = bytearray(good)
    struct.pack_into("<Q", lying, 16 + 8, 4000)             # the entry claims 4,000 payload bytes
    data = bytearray(b"HEAD" + lying + b"TAIL")
    with pytest.raises(ValueError, match="runs past"):
        prune_fatbin(data, 4, len(lying), 90)
    assert data.endswith(b"TAIL") and len(data) == 4 + len(lying) + 4
    with open(sys.executable, "rb") as fh:
        head = fh.read(0x200)                               # the ELF header, no section table
    with pytest.raises(ValueError, match="truncated or malformed"):
        elf_section(head, ".text")
