"""Triton's model-repository extension over the models this process serves
(RepositoryIndex / RepositoryModelLoad / RepositoryModelUnload, POST /v2/repository/...).

The repository is the models the server knows: `--model` (one per process), or the
models of `--model-repository DIR` (model_repository.py), where a load of a model of
the directory that is not served yet reads it from disk (an ensemble's step models first). Index
entries are Triton's: name, version, state READY or UNAVAILABLE, reason ("unloaded").
Unload stops serving the model at once (infer, metadata and ready answer UNAVAILABLE /
503 / not ready) while requests already queued are still answered; its session stays
in memory, so a load serves it again at once. A load of a model that is being served
is a no-op (a new file or version is `POST /admin/reload`). A model the process does
not know cannot be loaded (NOT_FOUND / 404: nothing here can fetch one), and the
`config` / `file:` load parameters (Triton's overrides) are refused as unsupported.

As in Triton, load and unload are refused unless the model control mode is explicit
(`--model-control-mode explicit`; default none): on the serving port any client could
otherwise take the model out of service.
"""
from __future__ import annotations

import logging

from mcp26.inference.errors import InvalidArgument, Unsupported
from mcp26.inference.model_repository import RepositoryError

log = logging.getLogger("mcp26.inference")


def index(server, ready_only: bool = False) -> list[dict]:
    out = []
    for name, served in sorted(server.models.items()):
        ready = served.loaded and server.ready
        if ready_only and not ready:
            continue
        entry = {"name": name, "version": served.model.version, "state": "READY" if ready else "UNAVAILABLE"}
        if not ready:
            entry["reason"] = "unloaded" if not served.loaded else "loading"
        out.append(entry)
        if not ready_only and served.entry is not None:    # versions its policy selected but not served
            out += [{"name": name, "version": v, "state": "UNAVAILABLE",
                     "reason": "one version per model is served here: the newest its version_policy selects"}
                    for v in served.entry.versions[:-1]]
    repo = getattr(server, "repository", None)
    if repo is not None and not ready_only:   # in the directory, not loaded (explicit mode)
        out += [{"name": n, "version": "", "state": "UNAVAILABLE", "reason": "not loaded"}
                for n in repo.names() if n not in server.models]
    return sorted(out, key=lambda e: (e["name"], e["version"]))


def _check_parameters(parameters: dict) -> None:
    for key in parameters:
        if key == "config" or key.startswith("file:"):
            raise InvalidArgument(f"load parameter {key!r} (a configuration or file override) is not supported; "
                                  f"use POST /admin/reload or /admin/policy on the admin port")


def _check_mode(server) -> None:
    if getattr(server, "model_control_mode", "none") != "explicit":
        raise Unsupported("explicit model load / unload is not allowed: the model control mode is none "
                          "(mcpctl serve --model-control-mode explicit)")


def load(server, name: str, parameters: dict | None = None) -> None:
    _check_mode(server)
    _check_parameters(parameters or {})
    repo = getattr(server, "repository", None)
    if repo is not None and name not in server.models and name in repo.names():
        try:
            repo.load(server, name)          # from the directory: config.pbtxt and its version
        except RepositoryError as e:
            raise InvalidArgument(f"load of {name!r} failed, nothing changed: {e}") from None
        log.info("model %s loaded from the repository %s", name, repo.root)
        return
    served = server.lookup(name)
    if not served.loaded:
        served.loaded = True
        log.info("model %s loaded (repository load): serving again", name)


def unload(server, name: str, parameters: dict | None = None) -> None:
    _check_mode(server)
    served = server.lookup(name)
    if served.loaded:
        served.loaded = False
        log.info("model %s unloaded (repository unload): not serving; queued requests are still answered", name)
