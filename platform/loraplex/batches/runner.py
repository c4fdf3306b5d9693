"""BatchRunner: claims a batch with a lease in the database and works it to its end, from any
Ingress replica (docs/operations.md: why there). State lives in the database and the store only,
so a runner that dies loses nothing: its lease runs out and another runner (or itself, restarted)
goes on from the lines still pending; a line's request id is the same on every run (the ledger
bills it once).

Lines go to the engine through `execute(batch, line, request_id) -> LineResult`, the online path
(ingress/batch_lines.py), marked batch: the Engine's fair queue and scheduler serve them below
every online request.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Awaitable, Callable, Optional

from loraplex.batches import state
from loraplex.batches.config import BatchConfig
from loraplex.batches.files import BatchFileStore
from loraplex.store_io import AdapterStoreUnavailable
from loraplex.batches.jsonl import BatchLine, parse_batch_file
from loraplex.batches.repository import OUTPUT_PURPOSE, BatchRepository, line_request_id
from loraplex.batches.results import MAX_RETRY_WAIT_S, LineResult, batch_error_line, output_line, result_file_id

logger = logging.getLogger(__name__)

Execute = Callable[[dict, BatchLine, str], Awaitable[LineResult]]


class LeaseLost(Exception):
    pass


class BatchRunner:
    def __init__(self, repo: BatchRepository, files: BatchFileStore, config: BatchConfig, execute: Execute,
                 owner: str):
        self.repo, self.files, self.config, self.execute, self.owner = repo, files, config, execute, owner
        self._stop = asyncio.Event()
        self.lines_run = 0  # lines this runner sent (for tests and logs)

    def stop(self) -> None:
        self._stop.set()

    async def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                worked = await self.run_once()
            except AdapterStoreUnavailable as exc:  # the batch waits for the store (released, claimed again)
                logger.warning("batch runner %s: %s", self.owner, exc.message)
                worked = False
            except Exception:
                logger.exception("batch runner %s: a pass failed; retrying", self.owner)
                worked = False
            if not worked:
                try:
                    await asyncio.wait_for(self._stop.wait(), self.config.poll_s)
                except TimeoutError:
                    pass

    async def run_once(self) -> bool:
        """Claim one batch and work it as far as it goes now; False when there was none."""
        batch = await asyncio.to_thread(self.repo.claim, self.owner, self.config.lease_s)
        if batch is None:
            return False
        renewer = asyncio.create_task(self._renew(batch["id"]))
        try:
            await self.work(batch, renewer)
        except LeaseLost:
            logger.warning("batch %s: lease lost to another runner; leaving it", batch["id"])
        finally:
            renewer.cancel()
            await asyncio.to_thread(self.repo.release, batch["id"], self.owner)
        return True

    async def _renew(self, batch_id: str) -> None:
        while True:
            await asyncio.sleep(self.config.lease_s / 3)
            if not await asyncio.to_thread(self.repo.renew, batch_id, self.owner, self.config.lease_s):
                return

    async def work(self, batch: dict, renewer: Optional[asyncio.Task] = None) -> None:
        batch_id = batch["id"]
        status = batch["status"]
        if status in ("validating", "in_progress") and self._expired(batch):
            return await self._finalize(batch, "expired")
        if status == "validating":
            lines = await self._lines(batch)
            if lines is None:
                return
            await asyncio.to_thread(self.repo.add_lines, batch_id, lines)
            if not await asyncio.to_thread(self.repo.move, batch_id, "in_progress", self.owner):
                return  # cancelled meanwhile: the next claim finalizes it
            status = "in_progress"
        if status == "in_progress":
            ended = await self._run_lines(batch, renewer)
            if ended == "cancelling":  # cancelled mid-way: its files now, from what ran
                return await self._finalize(batch, "cancelled")
            if ended != "done":
                return
            if not await asyncio.to_thread(self.repo.move, batch_id, "finalizing", self.owner):
                return
            status = "finalizing"
        if status in ("finalizing", "cancelling"):
            await self._finalize(batch, "completed" if status == "finalizing" else "cancelled")

    def _expired(self, batch: dict) -> bool:
        return self.repo.clock() >= batch["expires_at"]

    async def _lines(self, batch: dict) -> Optional[list[BatchLine]]:
        """The batch's input lines, or None after failing the batch (its input is gone or unreadable)."""
        try:
            data = await asyncio.to_thread(self.files.get, batch["tenant_id"], batch["input_file_id"])
            return parse_batch_file(data, self.config.max_lines, self.config.max_line_bytes)
        except AdapterStoreUnavailable:
            raise  # the store is down, the file is not gone: the batch is released and claimed again
        except Exception as exc:
            errors = [{"code": "invalid_input_file", "message": f"The input file cannot be read ({exc}); "
                       "upload it again and create a new batch.", "param": "input_file_id", "line": None}]
            await asyncio.to_thread(self.repo.move, batch["id"], "failed", self.owner, errors=errors)
            return None

    async def _run_lines(self, batch: dict, renewer: Optional[asyncio.Task]) -> str:
        """Run the pending lines; "done" when none is left, else why it stopped (cancelling, expired)."""
        lines = await self._lines(batch)
        if lines is None:
            return "failed"
        by_index = {x.index: x for x in lines}
        slots = asyncio.Semaphore(self.config.lines_in_flight)
        running: set[asyncio.Task] = set()
        stopped: Optional[str] = None
        pending = await asyncio.to_thread(self.repo.pending_lines, batch["id"])
        started = last_check = asyncio.get_running_loop().time()
        sent = 0
        park: list[datetime] = []  # batch_tokens_per_day spent: not before then (results.LineResult)
        while pending and stopped is None:
            retry: dict[int, Optional[float]] = {}  # line -> the refusal's Retry-After, if it said one
            for index in pending:
                await slots.acquire()
                if park:  # no further line today: the ones in flight end, then the batch waits
                    slots.release()
                    break
                now = asyncio.get_running_loop().time()
                if now - last_check >= self.config.poll_s:  # a cancel, the window, the lease: between lines
                    last_check = now
                    stopped = await self._why_stop(batch["id"], renewer)
                if stopped is None and sent and now - started >= self.config.slice_s:
                    stopped = "sliced"  # its turn is over: the next claim may be another batch
                if stopped is not None or self._stop.is_set():
                    slots.release()
                    stopped = stopped or "runner_stopped"
                    break
                sent += 1
                task = asyncio.create_task(self._run_line(batch, by_index[index], slots, retry, park))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            if stopped is None and park:
                return await self._park(batch, max(park))
            if stopped is None and retry:
                await asyncio.sleep(self._retry_wait(retry.values()))
                stopped = await self._why_stop(batch["id"], renewer)
            pending = sorted(retry)
        if stopped == "expired":
            await self._finalize(await asyncio.to_thread(self.repo.get_batch, None, batch["id"]), "expired")
        return stopped or "done"

    async def _park(self, batch: dict, until: datetime) -> str:
        """Leave the batch (still in_progress) until `until`; a claim after its window expires it."""
        if await asyncio.to_thread(self.repo.park, batch["id"], self.owner, until):
            logger.info("batch %s of tenant %s: batch_tokens_per_day spent; it waits until %s",
                        batch["id"], batch["tenant_id"], until.isoformat())
        return "parked"

    async def _why_stop(self, batch_id: str, renewer: Optional[asyncio.Task]) -> Optional[str]:
        if renewer is not None and renewer.done():
            raise LeaseLost(batch_id)
        now = await asyncio.to_thread(self.repo.get_batch, None, batch_id)
        if now is None or now["status"] != "in_progress" or now["lease_owner"] != self.owner:
            return "cancelling" if now is not None and now["status"] == "cancelling" else "moved"
        return "expired" if self._expired(now) else None

    def _retry_wait(self, hints) -> float:
        """Seconds before refused lines go again: the soonest Retry-After they were given (the engine's
        shed, the budget's in-flight wait), never less than `retry_s` nor more than MAX_RETRY_WAIT_S
        (a cancel or the window is checked after the wait)."""
        given = [h for h in hints if h]
        return min(max(self.config.retry_s, min(given, default=self.config.retry_s)), MAX_RETRY_WAIT_S)

    async def _run_line(self, batch: dict, line: BatchLine, slots: asyncio.Semaphore,
                        retry: dict[int, Optional[float]], park: list[datetime]) -> None:
        request_id = line_request_id(batch["id"], line.index)
        try:
            self.lines_run += 1
            try:
                result = await self.execute(batch, line, request_id)
            except Exception as exc:  # the executor's own failure: the line is not lost, it is retried
                logger.exception("batch %s line %d failed to run", batch["id"], line.index)
                result = LineResult(503, {"error": {"message": f"{type(exc).__name__}: {exc}"}}, retry=True)
            if result.retry:
                retry[line.index] = result.retry_after_s
                if result.park_until is not None:
                    park.append(result.park_until)
                return
            text = output_line(line.custom_id, request_id, result.status_code, result.body)
            await asyncio.to_thread(self.repo.finish_line, batch["id"], line.index, result.ok, result.status_code, text)
        finally:
            slots.release()

    async def _finalize(self, batch: dict, end: str) -> None:
        """Write the output and error files from the lines' results (lines never run: an error line
        each, `batch_<end>`), then enter `end`. Done again after a crash, it writes the same files."""
        batch_id, tenant = batch["id"], batch["tenant_id"]
        rows = await asyncio.to_thread(self.repo.lines, batch_id)
        out, err = [], []
        why = {"expired": ("batch_expired", "The batch's completion window passed before this request ran."),
               "cancelled": ("batch_cancelled", "The batch was cancelled before this request ran.")}
        for r in rows:
            if r["state"] == "pending":
                code, message = why.get(end, ("batch_incomplete", "The request did not run."))
                err.append(batch_error_line(r["custom_id"], r["request_id"], code, message))
            else:
                (out if r["state"] == "done" else err).append(r["result"])
        ids = {}
        for kind, lines in (("output", out), ("error", err)):
            if not lines:
                continue
            file_id = result_file_id(batch_id, kind)
            data = ("\n".join(lines) + "\n").encode()
            await asyncio.to_thread(self.files.put, tenant, file_id, data)
            if await asyncio.to_thread(self.repo.get_file, tenant, file_id) is None:
                await asyncio.to_thread(self.repo.create_file, tenant, OUTPUT_PURPOSE,
                                        f"{batch_id}_{kind}.jsonl", len(data), file_id)
            ids[f"{kind}_file_id"] = file_id
        failed_pending = sum(r["state"] == "pending" for r in rows)
        values = dict(ids)
        if failed_pending:
            values["failed"] = sum(r["state"] == "error" for r in rows) + failed_pending
        await asyncio.to_thread(self.repo.move, batch_id, end, self.owner, **values)

