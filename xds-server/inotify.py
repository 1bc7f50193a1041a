"""Linux inotify through ctypes: wake the config source the moment a file changes.

Only a wake-up signal: what changed is still decided by comparing the
directory's fingerprint, so a missed or spurious event costs nothing but a
check. Watches every directory under the root, adding new ones as they
appear (mkdir, a ConfigMap's `..data` swap is a rename inside a watched dir).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_ISDIR = 0x400, 0x800, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF)
_EVENT = struct.Struct("iIII")


class Inotify:
    """A non-blocking inotify fd watching `root` recursively; `drain()` says whether anything happened."""

    def __init__(self, root: str):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.dirs: dict[int, str] = {}
        self._watch_tree(root)

    def _watch(self, path: str) -> None:
        wd = self._add(self.fd, os.fsencode(path), MASK)
        if wd >= 0:
            self.dirs[wd] = path

    def _watch_tree(self, root: str) -> None:
        self._watch(root)
        for dirpath, dirnames, _ in os.walk(root):
            for d in dirnames:
                self._watch(os.path.join(dirpath, d))

    def drain(self) -> bool:
        """Read every pending event; True if there was any."""
        seen = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return seen
            seen = True
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and wd in self.dirs:
                    self._watch_tree(os.path.join(self.dirs[wd], os.fsdecode(name)))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
