"""A line's outcome and the output / error file lines OpenAI's Batch API writes for it."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional


MAX_RETRY_WAIT_S = 60.0  # the longest a refused line waits to be sent again; a refusal lifting later ends it


@dataclass(frozen=True)
class LineResult:
    """What running one line gave. `retry`: refused before it ran (overload): nothing was billed,
    nothing is written, it is sent again later; with `park_until` (batch_tokens_per_day spent) not
    before then: its batch waits. `billed`: an error the ledger bills (None: not known)."""

    status_code: int
    body: Any = None
    retry: bool = False
    retry_after_s: Optional[float] = None
    park_until: Optional[datetime] = None
    billed: Optional[bool] = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


def output_line(custom_id: str, request_id: str, status_code: int, body: Any) -> str:
    """One line of the output file (2xx) or of the error file (an HTTP error the line's request got)."""
    return json.dumps({"id": f"batch_req_{request_id}", "custom_id": custom_id,
                       "response": {"status_code": status_code, "request_id": request_id, "body": body},
                       "error": None}, separators=(",", ":"))


def batch_error_line(custom_id: str, request_id: str, code: str, message: str) -> str:
    """One line of the error file for a line the batch never ran (expired, cancelled)."""
    return json.dumps({"id": f"batch_req_{request_id}", "custom_id": custom_id, "response": None,
                       "error": {"code": code, "message": message}}, separators=(",", ":"))


def result_file_id(batch_id: str, kind: str) -> str:
    """The output / error file's id: the same on every finalize of the batch (a finalize cut short
    and done again writes the same files, never a second pair)."""
    return f"file-{uuid.uuid5(uuid.NAMESPACE_URL, f'loraplex:{batch_id}:{kind}').hex}"
