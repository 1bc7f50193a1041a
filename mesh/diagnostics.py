"""Configuration errors that name the file, line, resource and field."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnostic:
    """One finding about a resource. `code` follows istioctl (IST0101, ...)."""
    message: str
    file: str = ""
    line: int = 0
    resource: str = ""      # Kind/namespace/name
    field: str = ""         # dotted path, e.g. spec.http[0].route[1].weight
    code: str = ""
    severity: str = "error"  # error | warning | info

    def __str__(self) -> str:
        # no line (a file that is missing, unreadable): the file alone, not FILE:0
        where = (f"{self.file}:{self.line}" if self.line else self.file) if self.file else "<input>"
        parts = [where]
        if self.code:
            parts.append(f"{self.severity} {self.code}")
        else:
            parts.append(self.severity)
        if self.resource:
            parts.append(self.resource)
        if self.field:
            parts.append(self.field)
        return ": ".join(parts) + f": {self.message}"


class ConfigError(Exception):
    """A change set that was rejected whole; carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))
