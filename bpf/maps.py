"""Typed access to a BPF map by fd, whoever created it (bcc, or a pin).

Element access goes through libbcc's exported bpf_lookup_elem & co., with
keys and values as the ctypes structures of layout.py.
"""
from __future__ import annotations

import ctypes as ct
import os
from typing import Iterator

from bcc.libbcc import lib


class BpfMap:
    def __init__(self, fd: int, key_type, value_type, name: str = "", owned: bool = False):
        self.fd, self.key_type, self.value_type, self.name = fd, key_type, value_type, name
        self._owned = owned   # close the fd with this object (fds from obj_get)

    def __getitem__(self, key):
        value = self.value_type()
        if lib.bpf_lookup_elem(self.fd, ct.byref(self._key(key)), ct.byref(value)) < 0:
            raise KeyError(key)
        return value

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key, value) -> None:
        if not isinstance(value, ct._SimpleCData | ct.Structure):
            value = self.value_type(value)
        if lib.bpf_update_elem(self.fd, ct.byref(self._key(key)), ct.byref(value), 0) < 0:
            err = ct.get_errno()
            raise OSError(err, f"map {self.name}: update failed: {os.strerror(err)}")

    def __delitem__(self, key) -> None:
        if lib.bpf_delete_elem(self.fd, ct.byref(self._key(key))) < 0:
            raise KeyError(key)

    def keys(self) -> Iterator:
        key, nxt = self.key_type(), self.key_type()
        first = True
        while True:
            ret = lib.bpf_get_next_key(self.fd, None if first else ct.byref(key), ct.byref(nxt))
            if ret < 0:
                return
            first = False
            ct.memmove(ct.byref(key), ct.byref(nxt), ct.sizeof(key))
            out = self.key_type()
            ct.memmove(ct.byref(out), ct.byref(key), ct.sizeof(key))
            yield out

    def items(self) -> Iterator[tuple]:
        for k in list(self.keys()):
            v = self.get(k)
            if v is not None:
                yield k, v

    def clear(self) -> None:
        for k in list(self.keys()):
            try:
                del self[k]
            except KeyError:
                pass

    def __len__(self) -> int:
        return sum(1 for _ in self.keys())

    def _key(self, key):
        return key if isinstance(key, ct._SimpleCData | ct.Structure) else self.key_type(key)

    def close(self) -> None:
        if self._owned and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
