"""QualityRunner: drives quality runs through the Batch API, from any Ingress replica.

A run is two batches the Batch API's runner works like any other (the batch tier, below every
online request; billed at the plan's batch price; restarts and leases as batches have them):
generation (each line greedy on both models), then scoring (the reference's answers under both
models). This runner only moves a run from one to the next when its batch has ended, and writes
the report. State lives in the database and the store, so any replica may take the next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Optional

from loraplex.batches.config import BatchConfig
from loraplex.batches.files import BatchFileStore
from loraplex.batches.jsonl import InvalidBatchFile
from loraplex.batches.repository import BatchRepository, new_file_id
from loraplex.quality import lines as ql
from loraplex.quality.config import QualityConfig
from loraplex.quality.metrics import run_figures
from loraplex.quality.repository import QualityRepository
from loraplex.quality.verdict import verdict
from loraplex.store_io import AdapterStoreUnavailable

logger = logging.getLogger(__name__)
PURPOSE = "quality"  # the run's own batch input files: not the tenant's, not in its file quota
RUN_KEY = "loraplex_quality_run"  # a quality batch's metadata key (tenants' batches may not use loraplex_*)


class QualityRunner:
    def __init__(self, runs: QualityRepository, batches: BatchRepository, files: BatchFileStore,
                 config: QualityConfig, batch_config: BatchConfig):
        self.runs, self.batches, self.files, self.config, self.batch_config = runs, batches, files, config, batch_config
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                await self.run_once()
            except AdapterStoreUnavailable as exc:
                logger.warning("quality runner: %s", exc.message)
            except Exception:
                logger.exception("quality runner: a pass failed; retrying")
            try:
                await asyncio.wait_for(self._stop.wait(), self.batch_config.poll_s)
            except TimeoutError:
                pass

    async def run_once(self) -> None:
        for run in await asyncio.to_thread(self.runs.active):
            await asyncio.to_thread(self.step, run)

    # -- one step of one run (blocking: database and store) ---------------------------------------
    def step(self, run: dict) -> None:
        """Start the run's next batch, or write its report, if the batch before has ended."""
        status = run["status"]
        ended = None
        if status in ("generating", "scoring"):
            ended = self._ended(run, run[f"{'generation' if status == 'generating' else 'scoring'}_batch_id"])
            if ended is None:  # still running (or the run just failed)
                return
        try:
            lines = self._lines(run)
        except (InvalidBatchFile, FileNotFoundError) as exc:  # deleted (or changed) under the run
            self.runs.move(run["id"], "failed", error={"code": "invalid_input_file", "message": (
                f"The run's input file {run['input_file_id']} cannot be read ({exc}); upload it again and "
                "create a new run.")})
            return
        models = {"reference": run["reference"], "candidate": run["candidate"]}
        if status == "queued":
            self._start(run, "generating", "generation_batch_id",
                        ql.generation_file(lines, models, self.config.max_tokens))
        elif status == "generating":
            data = ql.scoring_file(lines, models, ql.reference_answers(lines, ended))
            if data is None:  # no reference answer to score: the figures without log-probabilities
                return self._report(run, lines, ended, {})
            self._start(run, "scoring", "scoring_batch_id", data)
        else:
            self._report(run, lines, self._results(run, run["generation_batch_id"]), ended)

    def _lines(self, run: dict) -> list[ql.QualityLine]:
        data = self.files.get(run["tenant_id"], run["input_file_id"])
        return ql.parse_quality_file(data, self.config.max_lines, self.batch_config.max_line_bytes)

    def _start(self, run: dict, status: str, column: str, data: bytes) -> None:
        tenant, file_id = run["tenant_id"], new_file_id()
        self.files.put(tenant, file_id, data)
        self.batches.create_file(tenant, PURPOSE, f"{run['id']}_{status}.jsonl", len(data), file_id)
        batch = self.batches.create_batch(tenant, run["api_key_id"], run["endpoint"], file_id,
                                          {RUN_KEY: run["id"]}, self.batch_config.completion_window_s)
        if not self.runs.move(run["id"], status, **{column: batch["id"]}):
            self.batches.cancel(tenant, batch["id"])  # another replica took this step first

    def _ended(self, run: dict, batch_id: str) -> Optional[dict[str, dict]]:
        """The batch's results by custom_id once it completed; None while it runs (or after failing the run)."""
        batch = self.batches.get_batch(run["tenant_id"], batch_id)
        if batch is None or batch["status"] in ("failed", "expired", "cancelled"):
            status = batch["status"] if batch else "gone"
            self.runs.move(run["id"], "failed", error={"code": f"batch_{status}", "message": (
                f"The run's batch {batch_id} ended {status}; create the run again.")})
            return None
        if batch["status"] != "completed":
            return None
        return self._results(run, batch_id)

    def _results(self, run: dict, batch_id: str) -> dict[str, dict]:
        batch = self.batches.get_batch(run["tenant_id"], batch_id)
        out: dict[str, dict] = {}
        for column in ("output_file_id", "error_file_id"):
            if batch[column]:
                out.update(ql.results_by_id(self.files.get(run["tenant_id"], batch[column])))
        return out

    def _report(self, run: dict, lines: list[ql.QualityLine], generated: dict, scored: dict) -> None:
        figures, problems = ql.compare(lines, generated, scored)
        totals = run_figures(figures)
        result = verdict(totals, self.config)
        report = {
            "result_counts": {"total": len(lines), "compared": totals.lines, "errored": len(problems)},
            "figures": {**dataclasses.asdict(totals), "logprob_drop": totals.logprob_drop},
            "thresholds": {**self.config.thresholds.model_dump(), "min_lines": self.config.min_lines},
            "failures": [dataclasses.asdict(f) for f in result.failures],
            "problems": problems[:100],  # which lines were not compared, and why (the first 100)
        }
        self.runs.move(run["id"], "completed", report=report, passed=result.passed, summary=result.summary())
