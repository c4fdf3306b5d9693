"""A 500-line batch beside an online load that rises and falls (issue 36): what the batch costs
the online tenant (TTFT / TPOT p50, p95 alone and beside it), whether the batch completes in the
online load's idle time, and the cost model's utilization and cost per 1M tokens before and after.

    python -m bench batch [--phase-s 480] [--valley 0.1] [--peak 1.3] [--seed 0]
                          [--max-tokens 64] [--batch-lines 500] [--batch-max-tokens 16] [--port 8000]

One `serve run` of the shipped config (serve_config.yaml) with its state in a temp dir and two
tenants, `online` and `batcher`. The online load is open loop: ShareGPT first questions, each
answer exactly its recorded length capped at --max-tokens (ignore_eos, greedy), sent at Poisson
arrivals whose rate goes valley -> peak -> valley over --phase-s (bench/loadtest/arrivals.py
RateProfile.rise_and_fall). Phases, after a warm-up:
  1. online alone;
  2. the same profile and seed (other tags on the questions: no prefix-cache hits across phases),
     with `batcher`'s batch of --batch-lines ShareGPT questions (max_tokens capped at
     --batch-max-tokens) created at the phase's start. If the batch is not done when the online load
     ends, the run waits for it (up to --batch-timeout-s) and says when it completed.
The cost model (GET /admin/cost-model) is asked about each phase's window of the same length;
when the batch ended after its window, a third column covers the second phase until then.
Run it alone on the machine (under flock /tmp/loraplex-bench.lock here).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import yaml

from bench import batch_bench as bb
from bench.batch_api import BatchClient, batch_lines, completed_by, cost_model
from bench.dedicated import seeded_config
from bench.loadtest import targets
from bench.loadtest import workload as wl
from bench.loadtest.arrivals import RateProfile, profile_arrivals
from bench.loadtest.client import Target
from bench.loadtest.runner import run_closed, run_open
from bench.loadtest.stats import summarize
from bench.processes import ROOT
from bench.report import commit
from bench.serve_run import ServeRun

FLUSH_S = 5.0  # the replicas' usage spools reach the ledger (flush_interval_s 0.5 in the seeded config)


def say(msg: str) -> None:
    print(f"batch {datetime.now(timezone.utc):%H:%M:%S}: {msg}", file=sys.stderr, flush=True)


def config(state: Path, port: int):
    """The shipped config with its state in `state`, the two tenants' keys seeded (bench/dedicated.py);
    an idle runner looks for batches every 0.5 s (2 s shipped), so the batch starts with the phase."""
    seeded = seeded_config(state, uploads={}, dedicated=[], tenants=("online", "batcher"))
    doc = yaml.safe_load(seeded.config.read_text())
    doc["http_options"]["port"] = port
    doc["applications"][0]["args"]["batches"] = {"poll_s": 0.5}
    seeded.config.write_text(yaml.safe_dump(doc))
    return seeded


async def phase(name: str, target: Target, workload, arrivals: list[float], peak: float, on_start=None) -> bb.Phase:
    """The profile's t = 0 is now (on_start runs then); the first request goes at its arrival."""
    start = time.time()
    if on_start:
        on_start()
    say(f"{name}: {len(arrivals)} requests over {arrivals[-1]:.0f} s")
    await asyncio.sleep(arrivals[0])  # run_open counts from the first arrival
    results = await run_open(target, workload, None, progress=False, desc=name)
    for r in results:
        r["at"] = arrivals[r["index"]]
    end = max(r["end_epoch"] for r in results)
    say(f"{name}: done in {end - start:.0f} s")
    return bb.Phase(name, start, end, results, summarize(results, peak))


def add_arguments(ap) -> None:
    ap.add_argument("--phase-s", type=float, default=480, help="the rate profile's length (each phase)")
    ap.add_argument("--valley", type=float, default=0.1, help="online requests/s in the valleys")
    ap.add_argument("--peak", type=float, default=1.3, help="online requests/s at the peak")
    ap.add_argument("--seed", type=int, default=0, help="arrivals and prompts (the same in both phases)")
    ap.add_argument("--max-prompt-tokens", type=int, default=400, help="online questions up to this long")
    ap.add_argument("--max-tokens", type=int, default=64, help="online answers: ShareGPT's length capped at this")
    ap.add_argument("--batch-lines", type=int, default=500)
    ap.add_argument("--batch-max-tokens", type=int, default=16, help="batch answers: ShareGPT's length capped at this")
    ap.add_argument("--batch-max-prompt-tokens", type=int, default=256)
    ap.add_argument("--batch-timeout-s", type=float, default=1200, help="longest wait for the batch after the online load")
    ap.add_argument("--port", type=int, default=8000)


def run(a, out) -> None:
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    eng = targets.engine_config(args, ROOT)
    lengths = wl.Lengths.load(eng.model)
    profile = RateProfile.rise_and_fall(a.valley, a.peak, a.phase_s)
    arrivals = profile_arrivals(profile, random.Random(a.seed))
    reserve = max(lengths.chat_overhead(), 32) + 16  # the template, and the tag before each question
    online = wl.sharegpt_prompts(lengths, len(arrivals), max_prompt_tokens=a.max_prompt_tokens,
                                 max_output_tokens=a.max_tokens, max_model_len=eng.max_model_len or 2048,
                                 reserve_tokens=reserve, rng=random.Random(a.seed))
    batch_prompts = wl.sharegpt_prompts(lengths, a.batch_lines, max_prompt_tokens=a.batch_max_prompt_tokens,
                                        max_output_tokens=a.batch_max_tokens, max_model_len=eng.max_model_len or 2048,
                                        reserve_tokens=reserve, rng=random.Random(a.seed + 1))
    admin = secrets.token_urlsafe(16)
    began = datetime.now(timezone.utc)
    out_dir = ROOT / "var" / "bench_batch" / began.strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        state = Path(tmp)
        seeded = config(state, a.port)
        with ServeRun(seeded.config, port=a.port, log_path=out_dir / "serve_run.log", admin_token=admin) as run:
            run.wait_ready()
            target = Target("loraplex", run.base_url, eng.model_id, keys=[seeded.keys["online"]])
            warm = bb.online_workload(online[:8], [0.0] * 8, "warm")
            asyncio.run(run_closed(target, warm, 4, progress=False))
            alone = asyncio.run(phase("online alone", target, bb.online_workload(online, arrivals, "alone"),
                                      arrivals, a.peak))
            batch = BatchClient(run.base_url, seeded.keys["batcher"])
            batch.upload(batch_lines(batch_prompts, eng.model_id, "batch"))
            # The alone phase's cost-model window lasts at least the profile: the second phase must
            # not start inside it when the last response came before the profile's end.
            time.sleep(max(0.0, alone.start + a.phase_s - time.time()))
            beside = asyncio.run(phase("online + batch", target, bb.online_workload(online, arrivals, "with"),
                                       arrivals, a.peak, on_start=lambda: (batch.create(), batch.follow())))
            say(f"online load over; the batch: {batch.get()['request_counts']}")
            final = batch.wait_ended(a.batch_timeout_s)
            batch.stop()
            time.sleep(FLUSH_S)
            phases = windows(alone, beside, final, batch, a.phase_s)
            for p in phases:
                p.cost = cost_model(run.base_url, admin, *p.window)
    ended = datetime.now(timezone.utc)
    report(out, a, phases, final, batch, profile, arrivals, batch_prompts, began, ended)
    (out_dir / "results.json").write_text(json.dumps(
        {"phases": [{"name": p.name, "start": p.start, "end": p.end, "window": p.window, "cost": p.cost,
                     "summary": p.summary, "results": p.results} for p in phases[:2]],
         "batch": final, "batch_progress": batch.progress}, default=str))
    out.write_json(out_dir / "report.json")
    say(f"results in {out_dir}")


def windows(alone: bb.Phase, beside: bb.Phase, final: dict, batch: BatchClient, phase_s: float) -> list[bb.Phase]:
    """Each phase's cost-model window: the same length, from its start to the later of the profile's
    end and the alone phase's last response; a third (the second phase until the batch completed)
    when the batch ended after its window."""
    length = max(alone.end - alone.start, phase_s)
    alone.window = (alone.start, alone.start + length)
    beside.window = (beside.start, beside.start + length)
    beside.batch_lines = (completed_by(batch.progress, beside.window[1]), failed_by(batch.progress, beside.window[1]))
    out = [alone, beside]
    done_at = final.get("completed_at")
    if done_at and done_at > beside.window[1]:
        rc = final["request_counts"]
        out.append(replace(beside, name="online + batch, until the batch completed", window=(beside.start, done_at + 1),
                           batch_lines=(rc["completed"], rc["failed"])))
    return out


def failed_by(progress, epoch: float) -> int:
    done = [f for t, _, f in progress if t <= epoch]
    return done[-1] if done else 0


def report(out, a, phases, final, batch: BatchClient, profile, arrivals, batch_prompts, began, ended) -> None:
    alone, beside = phases[0], phases[1]
    rc = final["request_counts"]
    prompt_tokens = sum(p.prompt_tokens or 0 for p in batch_prompts)
    out_tokens = sum(p.max_tokens for p in batch_prompts)
    out.note(f"batch: commit {commit()}, {began:%Y-%m-%d %H:%M}-{ended:%H:%M} UTC, one serve run of "
             "serve_config.yaml; online: ShareGPT first questions (<= "
             f"{a.max_prompt_tokens} tokens), answers of their recorded length capped at {a.max_tokens} (ignore_eos, "
             f"greedy), Poisson arrivals at {a.valley} -> {a.peak} -> {a.valley} req/s over {a.phase_s:.0f} s (seed "
             f"{a.seed}): {len(arrivals)} requests a phase; batch: {a.batch_lines} ShareGPT questions (<= "
             f"{a.batch_max_prompt_tokens} tokens, {prompt_tokens:,} in all) x answers capped at {a.batch_max_tokens} "
             f"({out_tokens:,} tokens in all), created at the second phase's start")
    out.table(bb.side_by_side(phases))
    done = lambda t: completed_by(batch.progress, beside.start + t)  # noqa: E731
    out.table(bb.by_part(alone, beside, a.phase_s, profile.rate, done))
    online_end = beside.end - beside.start
    if final.get("completed_at"):
        at = final["completed_at"] - beside.start
        when = f"{at - online_end:.0f} s after" if at > online_end else f"{online_end - at:.0f} s before"
        out.note(f"The batch {final['status']}: {rc['completed']} lines completed, {rc['failed']} failed of "
                 f"{rc['total']}, at {at:.0f} s from the phase's start, {when} the online load's last response "
                 f"(at {online_end:.0f} s).")
    else:
        out.note(f"The batch did not complete: {final['status']}, {rc['completed']} completed, {rc['failed']} "
                 f"failed of {rc['total']} when the run stopped waiting ({a.batch_timeout_s:.0f} s after the "
                 f"online load's last response at {online_end:.0f} s).")
