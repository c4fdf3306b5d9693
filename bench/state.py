"""A benchmark run's own state: every run starts on a new database, adapter store and usage spool."""

from __future__ import annotations

from pathlib import Path


def with_fresh_state(args: dict, state: Path, **accounting) -> dict:
    """`args` (a LoRAPlex app's, changed in place and returned) with its state in `state`: a new SQLite
    database, adapter store and cache, usage spool; its other registry and accounting settings kept,
    `accounting`'s over them (e.g. flush_interval_s)."""
    args["database_url"] = f"sqlite:///{state}/loraplex.db"
    args["registry"] = {**(args.get("registry") or {}), "store_url": str(state / "adapters"),
                        "cache_dir": str(state / "cache")}
    args["accounting"] = {**(args.get("accounting") or {}), "spool_dir": str(state / "spool"), **accounting}
    return args
