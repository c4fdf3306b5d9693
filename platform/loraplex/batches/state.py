"""A batch's states (OpenAI's), the moves between them, and its OpenAI-shaped object.

validating -> in_progress -> finalizing -> completed
validating -> failed                      (its input file is gone or cannot be read)
validating | in_progress -> cancelling -> cancelled
validating | in_progress | finalizing -> expired   (the completion window passed)

The runner makes every move but the client's cancel; each is one conditional UPDATE (repository.py)
from a state `MOVES` allows, so two runners, or a runner and a cancel, never both win.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
MOVES: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling", "expired"}),
    "in_progress": frozenset({"finalizing", "cancelling", "expired"}),
    "finalizing": frozenset({"completed", "expired"}),
    "cancelling": frozenset({"cancelled"}),
    **{s: frozenset() for s in TERMINAL},
}
STATES = frozenset(MOVES)
# What a runner claims: every state with work left for it (cancelling: its files to write).
RUNNABLE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
# What counts against the tenant's max_batches_in_flight.
IN_FLIGHT = RUNNABLE
# The timestamp column each state sets when entered (OpenAI's field names).
STAMP = {s: f"{s}_at" for s in ("in_progress", "finalizing", "completed", "failed", "expired",
                                  "cancelling", "cancelled")}
COMPLETION_WINDOW = "24h"


class InvalidMove(ValueError):
    pass


def check_move(current: str, new: str) -> None:
    if new not in MOVES.get(current, ()):
        raise InvalidMove(f"a batch cannot go from {current!r} to {new!r}")


def may_move(current: str, new: str) -> bool:
    return new in MOVES.get(current, ())


def sources_of(new: str) -> list[str]:
    """The states a batch may enter `new` from (the WHERE of the conditional UPDATE)."""
    return sorted(s for s, targets in MOVES.items() if new in targets)


def _epoch(t: Optional[datetime]) -> Optional[int]:
    return int(t.timestamp()) if t is not None else None


def batch_object(row: Any) -> dict[str, Any]:
    """OpenAI's Batch object for a `batches` row (repository.BatchRow or a mapping alike)."""
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    obj = {
        "id": get("id"), "object": "batch", "endpoint": get("endpoint"),
        "errors": {"object": "list", "data": get("errors")} if get("errors") else None,
        "input_file_id": get("input_file_id"), "completion_window": COMPLETION_WINDOW,
        "status": get("status"), "output_file_id": get("output_file_id"), "error_file_id": get("error_file_id"),
        "created_at": _epoch(get("created_at")), "expires_at": _epoch(get("expires_at")),
        "request_counts": {"total": get("total"), "completed": get("completed"), "failed": get("failed")},
        "metadata": get("metadata") or None,
        # LoRAPlex's extension: when a batch parked by batch_tokens_per_day goes on (it stays
        # in_progress meanwhile, and nothing else would say why it makes no progress).
        "not_before": _epoch(get("not_before")),
    }
    for column in STAMP.values():
        obj[column] = _epoch(get(column))
    return obj


def file_object(row: Any) -> dict[str, Any]:
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return {"id": get("id"), "object": "file", "bytes": get("bytes"), "created_at": _epoch(get("created_at")),
            "filename": get("filename"), "purpose": get("purpose"), "status": "processed",
            "status_details": None}
