"""One tenant's batch over the Batch API (/v1/files, /v1/batches), and the admin's cost model
(GET /admin/cost-model), for python -m bench batch."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import Optional

import httpx

from bench.loadtest.workload import Prompt

ENDED = {"completed", "failed", "expired", "cancelled"}


def batch_lines(prompts: list[Prompt], model: str, tag: str) -> list[dict]:
    """Batch input lines for `prompts`: chat completions of exactly their max_tokens (ignore_eos,
    greedy), each question tagged so no line shares a prefix-cache block with another request."""
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "max_tokens": p.max_tokens, "ignore_eos": True, "temperature": 0,
                      "messages": [{"role": "user", "content": f"[{tag}-{i}] {p.text}"}]}}
            for i, p in enumerate(prompts)]


class BatchClient:
    """A batch of one tenant: upload its lines (`upload`), start it (`create`), follow it."""

    def __init__(self, base_url: str, key: str):
        self.http = httpx.Client(base_url=f"{base_url}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        self.file_id: Optional[str] = None
        self.id: Optional[str] = None
        self.created_epoch: Optional[float] = None
        self.progress: list[tuple[float, int, int]] = []  # (epoch, completed, failed) as polled
        self._stop = threading.Event()

    def upload(self, lines: list[dict]) -> str:
        body = "\n".join(json.dumps(x) for x in lines).encode()
        got = self.http.post("/files", files={"file": ("in.jsonl", body)}, data={"purpose": "batch"})
        got.raise_for_status()
        self.file_id = got.json()["id"]
        return self.file_id

    def create(self) -> dict:
        got = self.http.post("/batches", json={"input_file_id": self.file_id, "endpoint": "/v1/chat/completions",
                                               "completion_window": "24h"})
        got.raise_for_status()
        self.created_epoch = time.time()
        self.id = got.json()["id"]
        return got.json()

    def get(self) -> dict:
        got = self.http.get(f"/batches/{self.id}")
        got.raise_for_status()
        return got.json()

    def follow(self, every_s: float = 5.0) -> threading.Thread:
        """Poll the batch every `every_s` into `progress` (a thread) until it ends or `stop()`."""
        def poll():
            while not self._stop.is_set():
                try:
                    b = self.get()
                except httpx.HTTPError:
                    b = None  # a slow answer under load: the next poll
                if b is not None:
                    self.progress.append((time.time(), b["request_counts"]["completed"], b["request_counts"]["failed"]))
                    if b["status"] in ENDED:
                        return
                self._stop.wait(every_s)

        thread = threading.Thread(target=poll, name="batch-progress", daemon=True)
        thread.start()
        return thread

    def wait_ended(self, timeout_s: float) -> dict:
        """The batch once ended (completed, failed, expired, cancelled), or as it is at the timeout."""
        deadline = time.time() + timeout_s
        while True:
            b = self.get()
            if b["status"] in ENDED or time.time() >= deadline:
                return b
            time.sleep(2)

    def stop(self) -> None:
        self._stop.set()


def completed_by(progress: list[tuple[float, int, int]], epoch: float) -> int:
    """Lines completed by `epoch`, from the polled progress (the last poll at or before it)."""
    done = [c for t, c, _ in progress if t <= epoch]
    return done[-1] if done else 0


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


def cost_model(base_url: str, admin_token: str, start_epoch: float, end_epoch: float) -> dict:
    """GET /admin/cost-model over [start, end): the ledger's utilization and cost per 1M tokens."""
    got = httpx.get(f"{base_url}/admin/cost-model", params={"start": iso(start_epoch), "end": iso(end_epoch)},
                    headers={"Authorization": f"Bearer {admin_token}"}, timeout=60)
    got.raise_for_status()
    return got.json()
