"""`loraplex`: the admin and tenant HTTP routes from a shell.

    TENANT=$(loraplex tenants create acme -q)         # -q: only the tenant id
    export LORAPLEX_API_KEY=$(loraplex keys create $TENANT -q)   # -q: only the key (shown once)
    loraplex tenants update $TENANT --limits '{"requests_per_minute": 60}'
    LORAPLEX_API_KEY=lpx-... loraplex adapters upload support-bot adapter.tar.gz [--base-model BASE]
    LORAPLEX_API_KEY=lpx-... loraplex usage --group-by adapter --start 2026-11-01
    loraplex billing export --period 2026-11 > events.jsonl
    loraplex latency                                  # TTFT / TPOT P95 of the last hour vs the SLO
    LORAPLEX_API_KEY=lpx-... loraplex batches create requests.jsonl --wait   # upload, run, progress bar
    LORAPLEX_API_KEY=lpx-... loraplex batches results batch_... > out.jsonl
    LORAPLEX_API_KEY=lpx-... loraplex quality run mine.jsonl --reference BASE --candidate CHEAPER --wait

Admin commands send --admin-token (LORAPLEX_ADMIN_TOKEN); tenant commands send --api-key
(LORAPLEX_API_KEY). Lists print as tables, or as the server's JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class CLIError(Exception):
    """Printed as `error: <message>`; the process exits with `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.message, self.code = message, code


def main(argv: Optional[Sequence[str]] = None, transport: Optional[httpx.BaseTransport] = None) -> int:
    """Entry point; `transport` lets tests talk to an app without a socket."""
    args = _parser().parse_args(argv)
    # Not parser defaults: the shared option objects would make a subcommand's default
    # overwrite a value given before the subcommand.
    for name, default in (("url", os.environ.get("LORAPLEX_URL", DEFAULT_URL)),
                          ("admin_token", os.environ.get("LORAPLEX_ADMIN_TOKEN")),
                          ("api_key", os.environ.get("LORAPLEX_API_KEY")), ("json", False), ("timeout", 60.0)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        with httpx.Client(base_url=args.url, transport=transport, timeout=args.timeout) as client:
            args.run(Session(client, args))
    except CLIError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return e.code
    except httpx.TransportError as e:
        print(f"error: cannot reach LoRAPlex at {args.url} ({e}); start it with scripts/serve or pass --url.",
              file=sys.stderr)
        return 1
    return 0


class Session:
    """One command's HTTP calls, with the right credential for admin or tenant routes."""

    def __init__(self, client: httpx.Client, args: argparse.Namespace):
        self.client, self.args = client, args

    def admin(self, method: str, path: str, **kwargs) -> httpx.Response:
        if not self.args.admin_token:
            raise CLIError("admin commands need --admin-token or the LORAPLEX_ADMIN_TOKEN env var.", code=2)
        return self._send(method, path, self.args.admin_token, **kwargs)

    def tenant(self, method: str, path: str, **kwargs) -> httpx.Response:
        if not self.args.api_key:
            raise CLIError("tenant commands need --api-key or the LORAPLEX_API_KEY env var.", code=2)
        return self._send(method, path, self.args.api_key, **kwargs)

    def _send(self, method: str, path: str, token: str, **kwargs) -> httpx.Response:
        response = self.client.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kwargs)
        if response.status_code >= 400:
            raise CLIError(f"{response.status_code} {_server_message(response)}")
        return response

    def show(self, body: Any, rows: Optional[list[dict]] = None, columns: Sequence[str] = ()) -> None:
        """--json: the server's body as is; else a table of `rows` (or the body's `data`)."""
        if self.args.json or rows is None and not isinstance(body, dict):
            print(json.dumps(body, indent=2))
            return
        rows = rows if rows is not None else body.get("data", [body])
        print(_table(rows, columns))


# -- commands ----------------------------------------------------------------------------------
TENANT_COLUMNS = ("id", "name", "plan", "status", "limits", "created_at")
KEY_COLUMNS = ("id", "prefix", "created_at", "revoked_at")
ADAPTER_COLUMNS = ("name", "version", "sha256", "rank", "base_model", "size_bytes", "created_at")
# The cost model's table rows, named for any hardware (the API's fields say gpu; on the CPU profile
# the priced unit is a VM, named by the `hardware` row).
COST_MODEL_LABELS = {"gpus": "units", "gpu_hour_price": "unit_hour_price", "gpu_cost": "hardware_cost"}
USAGE_COLUMNS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests", "cost")
QUALITY_COLUMNS = ("id", "status", "reference", "candidate", "passed", "created_at", "completed_at")
QUALITY_ENDED = ("completed", "failed")
# Response headers of GET /admin/billing/export (loraplex.ingress.usage_routes).
EXPORT_COMPLETE, EXPORT_THROUGH, EXPORT_EVENTS = (
    "X-LoRAPlex-Export-Complete", "X-LoRAPlex-Export-Through", "X-LoRAPlex-Export-Events")


def tenants_create(s: Session) -> None:
    body = {"name": s.args.name}
    if s.args.plan is not None:
        body["plan"] = s.args.plan
    if s.args.limits is not None:
        body["limits"] = s.args.limits
    tenant = s.admin("POST", "/admin/tenants", json=body).json()
    if s.args.quiet:  # for scripts: TENANT=$(loraplex tenants create acme -q)
        print(tenant["id"])
        return
    s.show(tenant, [tenant], TENANT_COLUMNS)


def tenants_list(s: Session) -> None:
    s.show(s.admin("GET", "/admin/tenants").json(), None, TENANT_COLUMNS)


def tenants_update(s: Session) -> None:
    body: dict[str, Any] = {}
    if s.args.plan is not None:
        body["plan"] = s.args.plan
    if s.args.limits is not None:
        body["limits"] = s.args.limits
    if s.args.status is not None:
        body["status"] = s.args.status
    if not body:
        raise CLIError("nothing to update: pass --plan, --limits, --suspend or --reactivate.", code=2)
    tenant = s.admin("PATCH", f"/admin/tenants/{_seg(s.args.tenant_id)}", json=body).json()
    s.show(tenant, [tenant], TENANT_COLUMNS)


def keys_create(s: Session) -> None:
    key = s.admin("POST", f"/admin/tenants/{_seg(s.args.tenant_id)}/keys").json()
    if s.args.quiet:  # for scripts: export LORAPLEX_API_KEY=$(loraplex keys create $TENANT -q)
        print(key["key"])
        return
    if s.args.json:
        s.show(key)
        return
    print(f"API key {key['id']} for tenant {key['tenant_id']}.")
    print("It is shown only this once; store it now:\n")
    print(f"    {key['key']}\n")


def keys_list(s: Session) -> None:
    s.show(s.admin("GET", f"/admin/tenants/{_seg(s.args.tenant_id)}/keys").json(), None, KEY_COLUMNS)


def keys_revoke(s: Session) -> None:
    key = s.admin("DELETE", f"/admin/keys/{_seg(s.args.key_id)}").json()
    if s.args.json:
        s.show(key)
    else:
        print(f"revoked {key['id']} ({key['prefix']}...) at {key['revoked_at']}")


def adapters_upload(s: Session) -> None:
    path = Path(s.args.file)
    if not path.is_file():
        raise CLIError(f"{path}: no such file; pass a .tar.gz, .tgz or .zip of a PEFT LoRA directory.", code=2)
    form = {"name": s.args.name}
    if s.args.base_model:  # else the server takes the archive's claim, the name's base or the only base
        form["base_model"] = s.args.base_model
    with path.open("rb") as f:
        adapter = s.tenant("POST", "/v1/adapters", data=form,
                           files={"file": (path.name, f, "application/octet-stream")}).json()
    s.show(adapter, [adapter], ADAPTER_COLUMNS)


def adapters_list(s: Session) -> None:
    body = s.tenant("GET", "/v1/adapters").json()
    # One row per version: the server groups versions under their name.
    rows = [{"name": a.get("name"), **v} for a in body.get("data", []) for v in a.get("versions", [a])]
    s.show(body, rows, ADAPTER_COLUMNS)


def adapters_delete(s: Session) -> None:
    response = s.tenant("DELETE", f"/v1/adapters/{_seg(s.args.ref)}")
    if s.args.json:
        print(response.text or "{}")
    else:
        print(f"deleted {s.args.ref}")


def usage(s: Session) -> None:
    params = {k: v for k, v in {"start": s.args.start, "end": s.args.end, "group_by": s.args.group_by,
                                "format": s.args.format}.items() if v is not None}
    if s.args.admin:
        if s.args.tenant:
            params["tenant"] = s.args.tenant
        response = s.admin("GET", "/admin/usage", params=params)
    else:
        if s.args.tenant:
            raise CLIError("--tenant needs --admin (a tenant key only sees its own usage).", code=2)
        response = s.tenant("GET", "/v1/usage", params=params)
    if s.args.format == "csv":
        sys.stdout.write(response.text)
        return
    body = response.json()
    rows = body.get("rows", body.get("data")) if isinstance(body, dict) else None
    if s.args.json or not isinstance(rows, list):
        s.show(body)
        return
    key = body.get("group_by") or _first_key(rows)
    named = key == "tenant" and any("tenant_name" in row for row in rows)  # tenants by name next to their id
    columns = (key, *(("tenant_name",) if named else ()), *USAGE_COLUMNS) if body.get("group_by") else ()
    if isinstance(body.get("total"), dict):
        rows = rows + [{**body["total"], key: "TOTAL"}]
    print(_table(rows, columns))
    if body.get("currency"):
        print(f"\ncost in {body['currency']}; finished {body.get('start')} to {body.get('end')} (end exclusive)")
    if body.get("rejections"):
        print("\nrefused before the engine (not billed):")
        named = any("tenant_name" in r for r in body["rejections"])
        print(_table(body["rejections"], ("tenant", *(("tenant_name",) if named else ()), "reason", "count")))


def billing_export(s: Session) -> None:
    params = {"period": s.args.period, "format": s.args.format}
    if s.args.tenant:
        params["tenant"] = s.args.tenant
    response = s.admin("GET", "/admin/billing/export", params=params)
    if s.args.output:
        Path(s.args.output).write_text(response.text)
    else:
        sys.stdout.write(response.text)
    events = response.headers.get(EXPORT_EVENTS, "?")
    through = response.headers.get(EXPORT_THROUGH)
    if response.headers.get(EXPORT_COMPLETE) == "true":
        note = f"{events} events; {s.args.period} is complete (through {through})."
    elif through:
        note = (f"{events} events; {s.args.period} is NOT complete: days through {through} only. A day is exported "
                "once billing_grace_s has passed after it ends; export again later (ids do not change).")
    else:
        note = f"no day of {s.args.period} is final yet: nothing to export."
    print(note, file=sys.stderr)


def billing_statement(s: Session) -> None:
    params = {"period": s.args.period}
    if s.args.format:
        params["format"] = s.args.format
    response = s.admin("GET", f"/admin/tenants/{_seg(s.args.tenant_id)}/statement", params=params)
    if s.args.format == "csv":
        sys.stdout.write(response.text)
        return
    st = response.json()
    if s.args.json:
        s.show(st)
        return
    print(f"Statement for {st['tenant']}, {st['period']} (plan {st['plan']}, {st['requests']} requests, "
          f"prices in {st['currency']} per 1M tokens)")
    print(_table(st["lines"], ("model", "meter", "quantity", "unit_price_per_1m", "amount")))
    print(f"\nsubtotal   {st['subtotal']} {st['currency']}\nTOTAL DUE  {st['total_due']} {st['currency']}")


def billing_cost_model(s: Session) -> None:
    params = {k: v for k, v in {"start": s.args.start, "end": s.args.end, "model": s.args.model}.items()
              if v is not None}
    body = s.admin("GET", "/admin/cost-model", params=params).json()
    s.show(body, [{"metric": COST_MODEL_LABELS.get(k, k), "value": v} for k, v in body.items()], ("metric", "value"))
    if not s.args.json and body.get("hardware"):
        # The figures are only as right as this price: say which hardware it is for.
        print(f"\npriced as {body['gpus']} x {body['hardware']} at {body['gpu_hour_price']} {body.get('currency', '')}"
              "/h each (accounting.cost_model in the serve config)")


def latency(s: Session) -> None:
    body = s.admin("GET", "/admin/latency", params={"window_s": s.args.window_s}).json()
    rows = [{"metric": m.upper(), "p95_s": _ms(body[f"{m}_p95_s"]), "slo_p95_s": body["slo"][f"{m}_p95_s"],
             "within_slo": body["within_slo"][m]} for m in ("ttft", "tpot")]
    s.show(body, rows, ("metric", "p95_s", "slo_p95_s", "within_slo"))
    if not s.args.json:
        source = "Prometheus" if body["source"] == "prometheus" else f"the usage ledger ({body['requests']} requests)"
        print(f"\nover the last {body['window_s']} s, from {source}")
        if body.get("prometheus_error"):
            print(f"Prometheus was not used: {body['prometheus_error']}")


# -- argument parsing --------------------------------------------------------------------------
BATCH_COLUMNS = ("id", "status", "endpoint", "request_counts", "created_at", "output_file_id", "error_file_id")
BATCH_ENDED = ("completed", "failed", "expired", "cancelled")


def _input_file_id(s: Session) -> str:
    """`s.args.input`: a JSONL file, uploaded as a batch file, or an uploaded file's id."""
    path = Path(s.args.input)
    if path.is_file():
        with path.open("rb") as f:
            return s.tenant("POST", "/v1/files", data={"purpose": "batch"},
                            files={"file": (path.name, f, "application/jsonl")}).json()["id"]
    if s.args.input.startswith("file-"):
        return s.args.input
    raise CLIError(f"{path}: no such file; pass a JSONL of requests or an uploaded file's id (file-...).", code=2)


def batches_create(s: Session) -> None:
    """From a JSONL file (uploaded first) or an uploaded file's id."""
    file_id = _input_file_id(s)
    batch = s.tenant("POST", "/v1/batches", json={"input_file_id": file_id, "endpoint": s.args.endpoint,
                                                  "completion_window": "24h"}).json()
    if s.args.quiet:
        print(batch["id"])
    elif not s.args.wait:
        s.show(batch, [_batch_row(batch)], BATCH_COLUMNS)
    if s.args.wait:
        _watch(s, batch["id"])


def batches_list(s: Session) -> None:
    body = s.tenant("GET", "/v1/batches", params={"limit": s.args.limit}).json()
    s.show(body, [_batch_row(b) for b in body.get("data", [])], BATCH_COLUMNS)


def batches_get(s: Session) -> None:
    batch = s.tenant("GET", f"/v1/batches/{_seg(s.args.batch_id)}").json()
    s.show(batch, [_batch_row(batch)], BATCH_COLUMNS)


def batches_watch(s: Session) -> None:
    _watch(s, s.args.batch_id)


def batches_cancel(s: Session) -> None:
    batch = s.tenant("POST", f"/v1/batches/{_seg(s.args.batch_id)}/cancel").json()
    s.show(batch, [_batch_row(batch)], BATCH_COLUMNS)


def batches_results(s: Session) -> None:
    """The output file (or with --errors the error file) of an ended batch, to stdout."""
    batch = s.tenant("GET", f"/v1/batches/{_seg(s.args.batch_id)}").json()
    file_id = batch.get("error_file_id" if s.args.errors else "output_file_id")
    if not file_id:
        state = batch.get("status")
        raise CLIError(f"batch {s.args.batch_id} has no {'error' if s.args.errors else 'output'} file "
                       f"({'not ended yet: ' + state if state not in BATCH_ENDED else 'no such lines'}).")
    sys.stdout.write(s.tenant("GET", f"/v1/files/{_seg(file_id)}/content").text)


def quality_run(s: Session) -> None:
    """From a JSONL file (uploaded first) or an uploaded file's id; --wait: until the report."""
    file_id = _input_file_id(s)
    run = s.tenant("POST", "/v1/quality/runs", json={"input_file_id": file_id, "reference": s.args.reference,
                                                     "candidate": s.args.candidate}).json()
    if s.args.quiet:
        print(run["id"])
        return
    while s.args.wait and run["status"] not in QUALITY_ENDED:
        print(f"\r{run['id']}: {run['status']}", end="", file=sys.stderr, flush=True)
        time.sleep(s.args.poll_s)
        run = s.tenant("GET", f"/v1/quality/runs/{_seg(run['id'])}").json()
    if s.args.wait:
        print(file=sys.stderr)
    _show_run(s, run)


def quality_show(s: Session) -> None:
    _show_run(s, s.tenant("GET", f"/v1/quality/runs/{_seg(s.args.run_id)}").json())


def quality_list(s: Session) -> None:
    body = s.tenant("GET", "/v1/quality/runs").json()
    s.show(body, [{**_batch_row(r), "passed": r["passed"]} for r in body.get("data", [])], QUALITY_COLUMNS)


def quality_override(s: Session) -> None:
    body = {"tenant_id": s.args.tenant, "adapter": s.args.adapter, "to_base": s.args.to_base, "reason": s.args.reason}
    s.show(s.admin("POST", "/admin/quality/overrides", json=body).json(), None)


def _show_run(s: Session, run: dict) -> None:
    """The run's figures against its thresholds (a table), then its verdict; --json: the run as is."""
    if s.args.json:
        return s.show(run)
    print(_table([_batch_row({k: run.get(k) for k in QUALITY_COLUMNS})]))
    figures, thresholds = run.get("figures") or {}, run.get("thresholds") or {}
    limit = {"exact_match_rate": (">=", "min_exact_match_rate"), "mean_common_prefix": (">=", "min_mean_common_prefix"),
             "logprob_drop": ("<=", "max_logprob_drop"), "lines": (">=", "min_lines")}
    rows = [{"figure": k, "value": v, "threshold": f"{limit[k][0]} {thresholds[limit[k][1]]}"
             if thresholds.get(limit.get(k, ("", ""))[1]) is not None else ""}
            for k, v in figures.items() if v is not None]
    if rows:
        print(_table(rows, ("figure", "value", "threshold")))
    if run.get("result_counts"):
        print("lines: " + ", ".join(f"{k} {v}" for k, v in run["result_counts"].items()))
    print(f"verdict: {run.get('verdict') or run['status']}" + (f" ({run['error']['message']})" if run.get("error") else ""))


def _watch(s: Session, batch_id: str) -> None:
    """A progress bar on stderr until the batch ends; then the batch (a table, or --json)."""
    while True:
        batch = s.tenant("GET", f"/v1/batches/{_seg(batch_id)}").json()
        print("\r" + progress_bar(batch), end="", file=sys.stderr, flush=True)
        if batch.get("status") in BATCH_ENDED:
            print(file=sys.stderr)
            s.show(batch, [_batch_row(batch)], BATCH_COLUMNS)
            if batch["status"] != "completed":
                raise CLIError(f"batch {batch_id} ended {batch['status']}")
            return
        time.sleep(s.args.poll_s)


def _batch_row(batch: dict) -> dict:
    """A Batch object for the table: its times (epoch seconds, as OpenAI's) in ISO UTC like every
    other table's."""
    return {k: datetime.fromtimestamp(v, timezone.utc).isoformat() if k.endswith("_at") and isinstance(v, (int, float))
            else v for k, v in batch.items()}


def progress_bar(batch: dict, width: int = 30) -> str:
    counts = batch.get("request_counts") or {}
    total, done, failed = counts.get("total") or 0, counts.get("completed") or 0, counts.get("failed") or 0
    filled = int(width * (done + failed) / total) if total else 0
    return (f"[{'#' * filled}{'.' * (width - filled)}] {done + failed}/{total} ({done} ok, {failed} failed) "
            f"{batch.get('status')}")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: options given after the subcommand override those before it, absent ones don't.
    sup = argparse.SUPPRESS
    common.add_argument("--url", default=sup, help=f"server URL (LORAPLEX_URL, default {DEFAULT_URL})")
    common.add_argument("--admin-token", default=sup, help="admin bearer token (LORAPLEX_ADMIN_TOKEN)")
    common.add_argument("--api-key", default=sup, help="tenant API key (LORAPLEX_API_KEY)")
    common.add_argument("--json", action="store_true", default=sup, help="print the server's JSON")
    common.add_argument("--timeout", type=float, default=sup, help="seconds per request (default 60)")

    root = argparse.ArgumentParser(prog="loraplex", description=__doc__.split("\n")[0], parents=[common],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = root.add_subparsers(dest="group", required=True,
                                 metavar="{tenants,keys,adapters,batches,usage,latency,billing}")

    def command(sub, name: str, run, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(run=run)
        return p

    tenants = groups.add_parser("tenants", help="create, list and update tenants (admin)")
    sub = tenants.add_subparsers(dest="command", required=True)
    p = command(sub, "create", tenants_create, "create a tenant")
    p.add_argument("name")
    p.add_argument("--plan")
    p.add_argument("--limits", type=_json_object, help='JSON, e.g. \'{"requests_per_minute": 60}\'')
    p.add_argument("-q", "--quiet", action="store_true", help="print only the new tenant's id")
    command(sub, "list", tenants_list, "list tenants")
    p = command(sub, "update", tenants_update, "change a tenant's plan or limits, or suspend it")
    p.add_argument("tenant_id")
    p.add_argument("--plan")
    p.add_argument("--limits", type=_json_object, help="JSON; keys left out keep their value, null clears one")
    state = p.add_mutually_exclusive_group()
    state.add_argument("--suspend", dest="status", action="store_const", const="suspended")
    state.add_argument("--reactivate", dest="status", action="store_const", const="active")

    keys = groups.add_parser("keys", help="issue, list and revoke API keys (admin)")
    sub = keys.add_subparsers(dest="command", required=True)
    p = command(sub, "create", keys_create, "issue a new API key (shown once)")
    p.add_argument("tenant_id")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the key (it is shown only this once)")
    command(sub, "list", keys_list, "list a tenant's keys (no secrets)").add_argument("tenant_id")
    command(sub, "revoke", keys_revoke, "revoke a key: its next request gets 401").add_argument("key_id")

    adapters = groups.add_parser("adapters", help="upload, list and delete your adapters (tenant key)")
    sub = adapters.add_subparsers(dest="command", required=True)
    p = command(sub, "upload", adapters_upload, "upload a .tar.gz/.tgz/.zip of a PEFT LoRA directory")
    p.add_argument("name")
    p.add_argument("file")
    p.add_argument("--base-model", metavar="BASE",
                   help="the base model it was trained on (GET /v1/models lists them); default: the one the "
                        "archive's base_model_name_or_path names, else the name's earlier versions' base")
    command(sub, "list", adapters_list, "list your adapters and their versions")
    command(sub, "delete", adapters_delete, "delete an adapter, or one version").add_argument(
        "ref", metavar="NAME[@VERSION]")

    batches = groups.add_parser("batches", help="run JSONL batches of requests below online traffic (tenant key)")
    sub = batches.add_subparsers(dest="command", required=True)
    p = command(sub, "create", batches_create, "upload a JSONL of requests (or name an uploaded file) and start it")
    p.add_argument("input", metavar="FILE.jsonl|file-ID")
    p.add_argument("--endpoint", default="/v1/chat/completions", choices=["/v1/chat/completions", "/v1/completions"])
    p.add_argument("--wait", action="store_true", help="show a progress bar until the batch ends")
    p.add_argument("--poll-s", type=float, default=2.0, help="seconds between progress updates (default 2)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the new batch's id")
    command(sub, "list", batches_list, "list your batches, newest first").add_argument(
        "--limit", type=int, default=20, help="at most this many (1-100, default 20)")
    command(sub, "get", batches_get, "one batch's state and counts").add_argument("batch_id")
    p = command(sub, "watch", batches_watch, "a progress bar until the batch ends")
    p.add_argument("batch_id")
    p.add_argument("--poll-s", type=float, default=2.0, help="seconds between progress updates (default 2)")
    command(sub, "cancel", batches_cancel, "cancel a batch (lines not run go to its error file)").add_argument(
        "batch_id")
    p = command(sub, "results", batches_results, "print an ended batch's output file (JSONL) to stdout")
    p.add_argument("batch_id")
    p.add_argument("--errors", action="store_true", help="the error file instead")

    quality = groups.add_parser("quality", help="compare a cheaper base (or your adapter on one) with the model "
                                "you use, on your own requests (tenant key; override: admin)")
    sub = quality.add_subparsers(dest="command", required=True)
    p = command(sub, "run", quality_run, "upload a JSONL of your requests (the batch format, optional `expected`) "
                "and compare a candidate model with a reference on it")
    p.add_argument("input", metavar="FILE.jsonl|file-ID")
    p.add_argument("--reference", required=True, help="the model you use now: a base, or one of your adapters")
    p.add_argument("--candidate", required=True, help="the model to compare: a base, an adapter, or "
                   "<base>:<adapter> (your adapter on another base)")
    p.add_argument("--wait", action="store_true", help="wait for the report (the run goes at the batch tier)")
    p.add_argument("--poll-s", type=float, default=5.0, help="seconds between checks (default 5)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the new run's id")
    command(sub, "show", quality_show, "a run's report: figures, thresholds, verdict").add_argument("run_id")
    command(sub, "list", quality_list, "your quality runs, newest first")
    p = command(sub, "override", quality_override, "let a tenant's move to another base through without a "
                "passing run (admin; recorded with the reason)")
    p.add_argument("tenant", metavar="TENANT_ID")
    p.add_argument("--to-base", required=True)
    p.add_argument("--adapter", help="the adapter's name (default: the tenant's base-model traffic)")
    p.add_argument("--reason", required=True)

    p = command(groups, "usage", usage, "usage and cost report (your own; any tenant with --admin)")
    p.add_argument("--start", help="ISO-8601 date or time (UTC)")
    p.add_argument("--end", help="ISO-8601 date or time (UTC), exclusive")
    p.add_argument("--group-by", choices=["day", "hour", "adapter", "model", "tenant", "batch"],
                   help="default day; tenant needs --admin")
    p.add_argument("--format", choices=["json", "csv"])
    p.add_argument("--admin", action="store_true", help="use /admin/usage with the admin token")
    p.add_argument("--tenant", help="with --admin: one tenant's id (default: all)")

    p = command(groups, "latency", latency, "TTFT / TPOT P95 against the SLO (admin; the console's latency panel)")
    p.add_argument("--window-s", type=int, default=3600, help="the last this many seconds (default 3600)")

    billing = groups.add_parser("billing", help="billing export, monthly statements, cost model (admin)")
    sub = billing.add_subparsers(dest="command", required=True)
    p = command(sub, "export", billing_export,
                "a month's billing events (one per tenant, meter and closed UTC day; stable ids)")
    p.add_argument("--period", required=True, metavar="YYYY-MM")
    p.add_argument("--format", choices=["jsonl", "csv"], default="jsonl", help="default jsonl (CloudEvents)")
    p.add_argument("--tenant", help="one tenant's id (default: all)")
    p.add_argument("--output", "-o", metavar="FILE", help="write the events here instead of stdout")
    p = command(sub, "statement", billing_statement, "a tenant's monthly statement at its prices")
    p.add_argument("tenant_id")
    p.add_argument("--period", required=True, metavar="YYYY-MM")
    p.add_argument("--format", choices=["json", "csv"], help="csv: the server's CSV; default: a table")
    p = command(sub, "cost-model", billing_cost_model,
                "GPU cost per 1M tokens at peak and measured throughput, against revenue")
    p.add_argument("--model", help="one base model: its usage on its pool's hardware (accounting.cost_model.models)")
    p.add_argument("--start", help="ISO-8601 date or time (UTC); default: start of end's month")
    p.add_argument("--end", help="ISO-8601 date or time (UTC), exclusive; default: now")
    return root


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}); quote it, e.g. '{{\"priority\": 1}}'")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"priority\": 1}'")
    return value


# -- output ------------------------------------------------------------------------------------
def _server_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return error["message"]
    return response.text.strip()[:500] or response.reason_phrase


def _table(rows: list[dict], columns: Sequence[str] = ()) -> str:
    if not rows:
        return "(none)"
    if not columns:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [[c.upper() for c in columns], *cells]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):  # limits: only the ones set
        return ",".join(f"{k}={v}" for k, v in value.items() if v is not None) or "-"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _ms(seconds: Optional[float]) -> Optional[float]:
    """Seconds to the millisecond (a percentile's float arithmetic prints as 0.8506772499999999)."""
    return None if seconds is None else round(seconds, 3)


def _first_key(rows: list[dict]) -> str:
    return next(iter(rows[0]), "group") if rows else "group"


def _seg(value: str) -> str:
    """One URL path segment: a '/' or '?' in an argument cannot reach another route."""
    return quote(value, safe="@")


if __name__ == "__main__":
    sys.exit(main())
