"""What is sent: tenants (system prompt, adapters), their Zipf popularity, and the requests.

Sources of prompts and lengths:
- ShareGPT (default): each conversation's first question, with `max_tokens` = the token length
  of the answer ShareGPT recorded for it (as `vllm bench serve` does);
- a JSONL trace: one request per line, `{"tenant", "adapter", "prompt_tokens",
  "completion_tokens", "arrival_s", "prompt"|"messages"}` (all optional but a length or a text),
  e.g. the usage ledger's export (bench/loadtest/trace_export.py): real lengths per tenant;
- fixed lengths (`--fixed-lengths IN,OUT`), only on request: every prompt equally long overstates
  what continuous batching gives, so the tool warns loudly.

The request list is built once and replayed unchanged against every target and level, so runs
are comparable. Targets map (tenant, adapter) to their own key and model name.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from bench.sharegpt import first_exchanges, sharegpt_conversations

FIXED_LENGTH_WARNING = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!! FIXED LENGTHS: every prompt {inp} tokens, every answer {out} tokens (ignore_eos).            
!! Real traffic has varied lengths; identical requests batch unrealistically well, so these     
!! figures OVERSTATE capacity. Do not plan capacity from them; use ShareGPT or a JSONL trace.    
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


class Lengths:
    """Counts and cuts text in tokens: the served model's tokenizer when it can be loaded
    (local dir), else ~4 characters a token (marked approximate in the results)."""

    def __init__(self, tokenizer=None):
        self.tok = tokenizer
        self.exact = tokenizer is not None

    @classmethod
    def load(cls, model: Optional[str]) -> "Lengths":
        if model and Path(model).is_dir():
            try:
                from transformers import AutoTokenizer

                return cls(AutoTokenizer.from_pretrained(model))
            except Exception as e:  # noqa: BLE001 - any failure: fall back, say so
                print(f"loadtest: tokenizer of {model} not loaded ({e}); lengths ~4 chars/token", file=sys.stderr)
        return cls(None)

    def count(self, text: str) -> int:
        if self.tok is None:
            return max(1, len(text) // 4)
        return len(self.tok.encode(text, add_special_tokens=False))

    def cut(self, text: str, n: int) -> str:
        if self.tok is None:
            return text[: 4 * n]
        return self.tok.decode(self.tok.encode(text, add_special_tokens=False)[:n])

    def chat_overhead(self) -> int:
        """Tokens the chat template adds around one empty user message (0 when unknown)."""
        if self.tok is None or not getattr(self.tok, "chat_template", None):
            return 0
        try:
            text = self.tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True,
                                                tokenize=False)
            return len(self.tok.encode(text, add_special_tokens=False))
        except Exception:  # noqa: BLE001
            return 0


@dataclass
class Prompt:
    """One request's content before tenants are assigned."""

    text: str
    max_tokens: int
    prompt_tokens: Optional[int] = None   # of the text alone, when known
    tenant: Optional[str] = None          # trace label
    adapter: Optional[str] = None         # trace label
    arrival_s: Optional[float] = None     # trace offset
    raw_prompt: bool = False              # trace text sized to the whole prompt: no system prompt added


@dataclass
class Tenant:
    name: str
    system_prompt: str
    adapters: list[int] = field(default_factory=list)  # global adapter indices this tenant owns


@dataclass
class RequestSpec:
    index: int
    tenant: int
    adapter: Optional[int]   # global adapter index, None = base model
    user_text: str
    max_tokens: int
    system: bool = True
    arrival_s: Optional[float] = None
    ignore_eos: bool = False

    def messages(self, tenants: Sequence[Tenant]) -> list[dict]:
        sys_prompt = tenants[self.tenant].system_prompt if self.system else ""
        msgs = [{"role": "system", "content": sys_prompt}] if sys_prompt else []
        return msgs + [{"role": "user", "content": self.user_text}]


@dataclass
class Workload:
    tenants: list[Tenant]
    adapters: list[tuple[int, int]]   # global index -> (tenant, index within the tenant)
    requests: list[RequestSpec]
    source: str
    exact_lengths: bool
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        per_tenant = [0] * len(self.tenants)
        on_adapter = 0
        for r in self.requests:
            per_tenant[r.tenant] += 1
            on_adapter += r.adapter is not None
        return {"source": self.source, "tenants": [t.name for t in self.tenants], "adapters": len(self.adapters),
                "requests": len(self.requests), "requests_per_tenant": per_tenant,
                "share_on_adapters": on_adapter / len(self.requests) if self.requests else 0.0,
                "exact_token_lengths": self.exact_lengths, "warnings": self.warnings}


# -- popularity ------------------------------------------------------------------------------------
def zipf_weights(n: int, s: float) -> list[float]:
    """P(rank k) proportional to 1 / k^s, k = 1..n; s = 0 is uniform."""
    if n <= 0:
        return []
    raw = [1.0 / (k ** s) for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def zipf_choices(n: int, s: float, count: int, rng: random.Random) -> list[int]:
    return rng.choices(range(n), weights=zipf_weights(n, s), k=count)


# -- prompt sources ----------------------------------------------------------------------------------
def sharegpt_prompts(lengths: Lengths, count: int, *, max_prompt_tokens: int, max_output_tokens: int,
                     max_model_len: int, reserve_tokens: int, rng: random.Random,
                     read: Callable[[int], list[dict]] = sharegpt_conversations) -> list[Prompt]:
    """`count` ShareGPT first exchanges (repeating the pool if it is smaller), filtered like vLLM's
    benchmark: question of 4..max_prompt_tokens tokens, answer of >= 4 tokens, question + answer
    within max_model_len less `reserve_tokens` (system prompt and template); max_tokens = the
    recorded answer's length, capped at max_output_tokens."""
    pool: list[Prompt] = []
    for ex in first_exchanges(read(max(4 * count, 400))):
        p, o = lengths.count(ex.question), lengths.count(ex.answer)
        if p < 4 or p > max_prompt_tokens or o < 4:
            continue
        o = min(o, max_output_tokens)
        if p + o + reserve_tokens > max_model_len:
            continue
        pool.append(Prompt(ex.question, o, p))
    if not pool:
        raise SystemExit("loadtest: no ShareGPT exchange fits the length limits")
    rng.shuffle(pool)
    return [pool[i % len(pool)] for i in range(count)]


def filler_text(read: Callable[[int], list[dict]] = sharegpt_conversations) -> str:
    """Real text (ShareGPT answers) to cut prompts of a given length from."""
    return "\n".join(ex.answer for ex in first_exchanges(read(400)))


def trace_prompts(path: Path, lengths: Lengths, count: Optional[int], filler: str, rng: random.Random,
                  max_model_len: int) -> list[Prompt]:
    """A JSONL trace's requests. A line with only lengths gets a prompt of that many tokens cut
    from real text at a random place (the chat template's own tokens taken off)."""
    overhead = lengths.chat_overhead()
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"loadtest: {path}:{n}: not JSON ({e})")
            out_tokens = int(rec.get("completion_tokens") or rec.get("max_tokens") or 0)
            if out_tokens <= 0:
                raise SystemExit(f"loadtest: {path}:{n}: needs completion_tokens (or max_tokens) > 0")
            tenant, adapter, arrival = rec.get("tenant"), rec.get("adapter"), rec.get("arrival_s")
            if "messages" in rec or "prompt" in rec:
                text = rec.get("prompt") or "\n".join(m.get("content", "") for m in rec["messages"])
                out.append(Prompt(text, out_tokens, lengths.count(text), tenant, adapter, arrival))
                continue
            p = int(rec.get("prompt_tokens") or 0)
            if p <= 0:
                raise SystemExit(f"loadtest: {path}:{n}: needs prompt_tokens, prompt or messages")
            want = max(1, min(p, max_model_len - out_tokens - 1) - overhead)
            start = rng.randrange(max(1, len(filler) - 8 * want - 1))
            text = lengths.cut(filler[start:start + 8 * want + 64], want)
            out.append(Prompt(text, out_tokens, want, tenant, adapter, arrival, raw_prompt=True))
            if count is not None and len(out) >= count:
                break
    if not out:
        raise SystemExit(f"loadtest: {path} has no requests")
    if count is not None and len(out) < count:
        out = [out[i % len(out)] for i in range(count)]
    return out


def fixed_prompts(lengths: Lengths, count: int, input_tokens: int, output_tokens: int, filler: str) -> list[Prompt]:
    text = lengths.cut(filler * (1 + 8 * input_tokens // max(1, len(filler))), input_tokens)
    return [Prompt(text, output_tokens, input_tokens) for _ in range(count)]


# -- the workload ----------------------------------------------------------------------------------
def system_prompts(n: int, chars: int, filler: str) -> list[str]:
    """Each tenant's own system prompt: its name, then `chars` characters of real text."""
    out = []
    step = max(1, len(filler) // max(1, n))
    for t in range(n):
        body = filler[t * step:t * step + chars] if chars > 0 else ""
        out.append(f"You are the assistant of company {t}. Reference material:\n{body}" if chars > 0 else "")
    return out


def build_workload(prompts: list[Prompt], *, tenants: int, zipf_s: float, adapter_share: Sequence[float],
                   adapters_per_tenant: int, system: list[str], rng: random.Random, source: str,
                   exact_lengths: bool, ignore_eos: bool = False, tenant_names: Optional[list[str]] = None,
                   lora_scenario: Optional[int] = None) -> Workload:
    """Assign each prompt a tenant (Zipf popularity, rank 1 = tenant 0) and, for
    `adapter_share[tenant]` of a tenant's requests, one of its adapters (uniform).

    Trace prompts that name tenants / adapters keep them (tenants in order of first appearance).
    `lora_scenario` = n replaces the mix for the multi-LoRA comparison: request i goes to adapter
    i mod n (0: base model only), so exactly n distinct adapters are in flight, owned round-robin
    by the tenants."""
    labelled = any(p.tenant is not None for p in prompts)
    if labelled:
        names: list[str] = []
        for p in prompts:
            if p.tenant is not None and str(p.tenant) not in names:
                names.append(str(p.tenant))
        tenants = len(names)
        tenant_names = names
    names = tenant_names or [f"tenant-{t}" for t in range(tenants)]
    ts = [Tenant(names[t], system[t % len(system)] if system else "") for t in range(tenants)]
    adapters: list[tuple[int, int]] = []

    def new_adapter(t: int) -> int:
        adapters.append((t, len(ts[t].adapters)))
        ts[t].adapters.append(len(adapters) - 1)
        return len(adapters) - 1

    if lora_scenario is not None:
        for a in range(lora_scenario):
            new_adapter(a % tenants)
    elif not labelled:
        for t in range(tenants):
            if _share(adapter_share, t) > 0:
                for _ in range(adapters_per_tenant):
                    new_adapter(t)

    picks = zipf_choices(tenants, zipf_s, len(prompts), rng) if not labelled else None
    labels: dict[tuple[int, str], int] = {}
    out = []
    for i, p in enumerate(prompts):
        if lora_scenario is not None:
            adapter = i % lora_scenario if lora_scenario else None
            tenant = adapters[adapter][0] if adapter is not None else (picks[i] if picks else 0)
        elif labelled:
            tenant = names.index(str(p.tenant)) if p.tenant is not None else 0
            adapter = None
            if p.adapter:
                key = (tenant, str(p.adapter))
                if key not in labels:
                    labels[key] = new_adapter(tenant)
                adapter = labels[key]
        else:
            tenant = picks[i]
            own = ts[tenant].adapters
            adapter = own[rng.randrange(len(own))] if own and rng.random() < _share(adapter_share, tenant) else None
        out.append(RequestSpec(i, tenant, adapter, p.text, p.max_tokens, system=not p.raw_prompt,
                               arrival_s=p.arrival_s, ignore_eos=ignore_eos))
    return Workload(ts, adapters, out, source, exact_lengths)


def _share(shares: Sequence[float], t: int) -> float:
    return shares[t % len(shares)] if shares else 0.0
