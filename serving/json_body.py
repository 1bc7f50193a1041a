"""A JSON request body for the admin APIs (the control plane's, a model server's): parsed, or
ValueError with the reason, so a caller answers 400 and never 500. json.loads raises
RecursionError, not ValueError, for a body nested deeper than the parser recurses (~1,000
levels: `[[[[...]]]]` is a few KB), and a body that is not UTF-8 raises UnicodeDecodeError."""
from __future__ import annotations

import json


def parse_json_body(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("body: JSON nested too deeply") from None
    except ValueError as e:         # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"body: expected JSON ({e})") from None
