"""The overload's prompts (ShareGPT first user turns) and its serve config."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.processes import ROOT
from bench.state import with_fresh_state
from bench.sharegpt import first_exchanges, sharegpt_conversations

MODEL = "SmolLM2-135M-Instruct"
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M: layers x KV heads x head dim, K+V, float32


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_tokens: int  # of the cut question, before the chat template
    max_tokens: int


def build_prompts(model_dir: Path, max_prompt_tokens: int, max_tokens: int, seed: int) -> list[Prompt]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    exchanges = first_exchanges(sharegpt_conversations(3000))
    random.Random(seed).shuffle(exchanges)
    questions = tokenizer([e.question for e in exchanges], add_special_tokens=False)["input_ids"]
    answers = tokenizer([e.answer for e in exchanges], add_special_tokens=False)["input_ids"]
    out = []
    for q, a in zip(questions, answers):
        if len(q) >= 4:
            cut = q[:max_prompt_tokens]
            out.append(Prompt(tokenizer.decode(cut), len(cut), max(1, min(len(a), max_tokens))))
    return out


def write_config(tmp: Path, args) -> Path:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = args.port
    a = config["applications"][0]["args"]
    with_fresh_state(a, tmp, flush_interval_s=0.2)
    a["engine"]["max_num_seqs"] = 4
    a["engine"]["scheduling_policy"] = "priority"
    # The KV cache by size, not as a share of host RAM (0.25 of 24 GiB per replica).
    a["engine"]["engine_kwargs"] = {"kv_cache_memory_bytes": args.kv_tokens * KV_BYTES_PER_TOKEN}
    a["engine_deployment"].update(
        num_cpus=0.5, shedding={"requests_by_priority": args.shed_ladder},
    )
    # The replica count where an operator sets it: the `deployments:` entry wins over args.
    [engine] = [d for d in config["applications"][0]["deployments"] if d["name"] == "Engine"]
    engine["num_replicas"] = 2
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
