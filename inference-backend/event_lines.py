"""The JSON event lines `mcpctl serve` writes on stdout (`ready`, and `envoy` with --replicas),
which the demo, tests and operators' scripts read a line at a time."""
from __future__ import annotations

import json
import os
import sys


def emit_event(doc: dict) -> None:
    """One JSON line on stdout in one write(2): the replicas of `--replicas` share their
    parent's stdout pipe, and a line written in two pieces (the text, then its newline) let
    another replica's line in between (a pool's reader then saw two events on one line)."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (json.dumps(doc) + "\n").encode())
