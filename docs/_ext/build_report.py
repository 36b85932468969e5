"""Write ``build-report.json`` beside the HTML: what this build read, executed, and how long it took.

For ``benchmarks/bench_build.py`` and for anyone asking why a build was slow.
It records the wall-clock time of Sphinx's phases (start-up to reading, reading
and executing pages, resolving and writing), the seconds each page took to
read (execution included) when it was read in this build, and myst-nb's
execution record of every notebook page: whether it ran in this build or came
from the cache, and its run time. Safe for parallel builds: per-page times are
merged from the workers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

_STARTED = time.time()  # when Sphinx imported this extension, just after start-up


def _marks(app: Sphinx) -> dict[str, float]:
    if not hasattr(app, "_tf_marks"):
        app._tf_marks = {"start": _STARTED}  # type: ignore[attr-defined]
    return app._tf_marks  # type: ignore[attr-defined]


def _before_read(app: Sphinx, env: Any, docnames: list[str]) -> None:
    _marks(app)["read"] = time.time()
    env.tf_read_started = {}
    env.tf_read_seconds = getattr(env, "tf_read_seconds", {})
    env.tf_read_now = sorted(docnames)


def _source_read(app: Sphinx, docname: str, _source: list[str]) -> None:
    app.env.tf_read_started[docname] = time.time()  # type: ignore[attr-defined]


def _doctree_read(app: Sphinx, _doctree: Any) -> None:
    env = app.env
    started = getattr(env, "tf_read_started", {}).get(env.docname)
    if started is not None:
        env.tf_read_seconds[env.docname] = time.time() - started  # type: ignore[attr-defined]


def _merge(_app: Sphinx, env: Any, docnames: set[str], other: Any) -> None:
    for docname in docnames:
        if docname in getattr(other, "tf_read_seconds", {}):
            env.tf_read_seconds[docname] = other.tf_read_seconds[docname]


def _env_updated(app: Sphinx, _env: Any) -> list[str]:
    _marks(app)["resolve"] = time.time()
    return []


def _finished(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None:
        return
    marks = _marks(app)
    end = time.time()
    env = app.env
    read_now = getattr(env, "tf_read_now", [])
    phases = {
        "startup": marks.get("read", end) - marks["start"],
        "read": marks.get("resolve", end) - marks.get("read", end),
        "write": end - marks.get("resolve", end),
    }
    pages = {}
    for docname, data in sorted(getattr(env, "nb_metadata", {}).items()):
        exec_data = data.get("exec_data")
        if exec_data:
            pages[docname] = {
                "executed_now": exec_data["mtime"] >= marks["start"],
                "runtime": exec_data["runtime"],
                "succeeded": exec_data["succeeded"],
            }
    report = {
        "phases": phases,
        "read_now": read_now,
        "read_seconds": {d: env.tf_read_seconds[d] for d in read_now if d in env.tf_read_seconds},
        "notebooks": pages,
    }
    Path(app.outdir, "build-report.json").write_text(json.dumps(report, indent=1) + "\n")


def setup(app: Sphinx) -> dict[str, Any]:
    """Connect the timers (Sphinx extension entry point)."""
    app.connect("env-before-read-docs", _before_read)
    app.connect("source-read", _source_read)
    app.connect("doctree-read", _doctree_read)
    app.connect("env-merge-info", _merge)
    app.connect("env-updated", _env_updated)
    app.connect("build-finished", _finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
