"""Streaming through the platform at GPU token rates: tokens/s delivered, added TTFT and TPOT.

    python -m bench stream [--modes paced,instant] [--streams 128]
                           [--variants after] [--after '{"stream_window_s": 0.1}']

The real ingress, router and Engine deployment behind Serve's HTTP proxy on 127.0.0.1, with the
engine class swapped for `BenchmarkFakeEngine`, which emits tokens itself and loads no model:
- paced: a token every `--interval` (20 ms: a loaded GPU's decode step; a replica's streams all
  step together; the first token comes at once). Offered load = streams / interval.
  Closed loop: `streams` requests always run, each client sending its next request when one
  ends; measured are the requests sent once all run (see run_streams).
- instant: every token at once (one per stream per event-loop turn), all streams sent at once:
  the ceiling.

Variants, one after another in the same run:
- direct: the same fake behind a bare asyncio HTTP server, no Ray: what the client and kernel
  add, and the client's own ceiling.
- bare: Ray Serve alone, one item per token on both hops: a minimal HTTP deployment streaming
  one body message per item from a minimal deployment around the fake. In instant mode the
  handle hop alone (deployment to deployment, no HTTP) is measured as well.
- before: the platform with `stream_window_s: 0` (one Ray stream item per chunk).
- after: the platform with its default coalescing (or `--after`'s engine_deployment fields).

The client is raw asyncio on one HTTP/1.1 connection per request, in this process, sharing the
cores. It counts `data: {` events in the bytes (in the fake one event is one token), never
parses them. Per request: TTFT = first token - request sent, TPOT = (last token - first token)
/ (tokens - 1); added TTFT = TTFT (the fake's first token is immediate), added TPOT = TPOT -
interval. Gap = time between two reads that carried tokens. Delivered tokens/s: paced, streams x
the mean of (tokens - 1) / (last - first), i.e. how fast streams flow against the engine's
pace (TTFT apart); instant, all tokens / (last token - first request).
"""

from __future__ import annotations
import json
import os
import tempfile
import time
from pathlib import Path

from bench.local_serve import local_serve
from bench.processes import free_port
from bench.stream.bare_app import bare_app, direct_server
from bench.stream.client import arun, run_streams
from bench.stream.platform import ADMIN, APP, deploy_platform, platform_args, settle, stub_model_dir, wait_http, wait_port
from bench.stream.report import report, summarize
from bench.tenants import new_tenant_key


def add_arguments(ap) -> None:
    ap.add_argument("--modes", default="paced,instant")
    ap.add_argument("--streams", default="128")
    ap.add_argument("--variants", default="after",
                    help="of direct, bare, before, after (comma list); direct: the fake behind a bare asyncio server, no Ray (the client's floor)")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per stream, paced")
    ap.add_argument("--instant-tokens", type=int, default=400, help="tokens per stream, instant")
    ap.add_argument("--interval", type=float, default=0.02, help="seconds per token, paced")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds per cell, then every stream is cut (default: paced 4 request lengths, instant 20)")
    ap.add_argument("--after", type=json.loads, default={},
                    help="engine_deployment fields for the 'after' variant, as JSON (default: the platform's)")


def run(args, out) -> None:
    modes = args.modes.split(",")
    counts = [int(s) for s in args.streams.split(",")]
    variants = args.variants.split(",")

    import multiprocessing

    from ray import serve

    from loraplex.config import PlatformConfig
    from loraplex.engine.config import EngineDeploymentConfig

    window_s = EngineDeploymentConfig(**args.after).stream_window_s
    model = PlatformConfig().engine.model_id
    rows, hop = [], []
    with local_serve(admin_token=ADMIN) as serve_port, tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        state = Path(tmp)
        model_dir = stub_model_dir(state, model)
        api_key = None
        for mode in modes:
            interval = args.interval if mode == "paced" else 0.0
            tokens = args.tokens if mode == "paced" else args.instant_tokens
            lifetime = tokens * interval  # one paced request's length: the closed loop's ramp
            duration = args.duration or (4 * lifetime if mode == "paced" else 20.0)
            for variant in variants:
                t0 = time.time()
                port, key, source, server = serve_port, None, None, None
                if variant == "direct":
                    port = free_port()
                    server = multiprocessing.get_context("spawn").Process(
                        target=direct_server, args=(port, interval, model), daemon=True)
                    server.start()
                    wait_port(port)
                elif variant == "bare":
                    serve.run(bare_app(interval, model), name=APP, route_prefix="/", blocking=False)
                    source = "BareTokens"
                else:
                    streaming = {"stream_window_s": 0.0} if variant == "before" else args.after
                    deploy_platform(platform_args(state, model_dir, interval, streaming, max(counts)))
                    wait_http(f"http://127.0.0.1:{port}", "/readyz")
                    api_key = api_key or new_tenant_key(f"http://127.0.0.1:{port}", ADMIN, "bench")
                    key, source = api_key, "Engine"
                arun(run_streams(port, key, model, 8, 10, 30))  # warm-up
                print(f"[{mode} {variant}] up in {time.time() - t0:.0f} s", flush=True)
                if variant == "bare" and mode == "instant":
                    h = serve.get_app_handle(APP)
                    for s in counts:
                        r = h.handle_hop.remote(s, tokens, duration).result()
                        hop.append({"streams": s, **r})
                        settle(source)
                for s in counts:
                    r = arun(run_streams(port, key, model, s, tokens, duration, lifetime))
                    rows.append({**summarize(mode, variant, r, args.interval), "load": os.getloadavg()[0]})
                    x = rows[-1]
                    print(f"  {s} streams: {x['delivered']:,.0f} tok/s, TTFT p50 {x['ttft_p50']:.1f} ms, "
                          f"TPOT p99 +{x['tpot_p99']:.2f} ms, {x['requests']} requests, {x['failed']} failed", flush=True)
                    if source:
                        settle(source)
                if server is not None:
                    server.terminate()
                    server.join(10)
                else:
                    serve.delete(APP)
    report(out, rows, hop, window_s)
