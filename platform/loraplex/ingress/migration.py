"""Moving a request off an Engine replica that was lost mid-request (issue 48).

The ingress forwards every chunk of a reply, so it knows what its client has. When the replica
dies (or cannot be reached), `MigratingEngine.generate` sends the request to another replica of
the same pool (the router skips the lost one: EngineCall.avoid_replica):

- nothing delivered yet (a non-stream reply, or a stream before its first chunk): the whole
  request again, invisibly;
- a stream with text delivered: a continuation, a new call for the same request id that asks the
  new replica to go on from exactly that text (chat: the text as a trailing assistant message with
  `continue_final_message`; completions: the prompt followed by the text), for the tokens left of
  `max_tokens`. Its chunks are rewritten so the client sees one reply: the role chunk dropped,
  `created` kept, usage totals merged (prompt once, every completion token received);
- at most `max_migrations` moves, and only before the request's deadline.

The replica that finishes the request meters it as one (EngineCall.resumed, engine/metering.py):
one usage record, the prompt once, completion tokens = what the client received, the prompt
work repeated on the new replicas in `migrated_prompt_tokens`.

No parsing on the way when nothing fails: each chunk's bytes are kept in a list (one append per
chunk, as the engine coalesced them), parsed only if the replica is lost. Only a continuation's
own chunks are parsed and rewritten.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from ray.serve.exceptions import BackPressureError

from loraplex.contract import EngineCall, EngineChunk, EngineClient, EngineError, EngineLost, Resumed

logger = logging.getLogger(__name__)

_DATA = "data: "


@dataclass
class Delivered:
    """What a stream's client received, read from the SSE bytes the ingress forwarded."""

    text: dict[int, str] = field(default_factory=dict)  # choice index -> its text so far
    finish_reasons: dict[int, str] = field(default_factory=dict)
    created: Optional[int] = None
    role_sent: bool = False
    tool_calls: bool = False
    reasoning: bool = False
    logprobs: bool = False
    usage_sent: bool = False  # the final usage chunk (no choices)
    done: bool = False  # `data: [DONE]`
    error: bool = False  # an error event
    pieces: list = field(default_factory=list)  # choice 0's text, event by event (a token each)

    @classmethod
    def parse(cls, chunks: list[bytes]) -> "Delivered":
        seen = cls()
        pieces: dict[int, list[str]] = {}
        for event in b"".join(chunks).decode("utf-8", errors="replace").split("\n\n"):
            event = event.strip()
            if not event.startswith(_DATA):
                continue
            payload = event[len(_DATA):]
            if payload == "[DONE]":
                seen.done = True
                continue
            try:
                body = json.loads(payload)
            except ValueError:
                seen.error = True
                continue
            if "error" in body:
                seen.error = True
                continue
            if seen.created is None:
                seen.created = body.get("created")
            choices = body.get("choices") or []
            if not choices and body.get("usage"):
                seen.usage_sent = True
            for choice in choices:
                index = choice.get("index", 0)
                if choice.get("logprobs") is not None:
                    seen.logprobs = True
                if choice.get("finish_reason") is not None:
                    seen.finish_reasons[index] = choice["finish_reason"]
                delta = choice.get("delta")
                if delta is None:  # a completion chunk
                    text = choice.get("text")
                else:
                    seen.role_sent = seen.role_sent or "role" in delta
                    seen.tool_calls = seen.tool_calls or bool(delta.get("tool_calls"))
                    seen.reasoning = seen.reasoning or bool(delta.get("reasoning_content") or delta.get("reasoning"))
                    text = delta.get("content")
                if text:
                    pieces.setdefault(index, []).append(text)
                else:
                    pieces.setdefault(index, [])
        seen.text = {i: "".join(p) for i, p in pieces.items()}
        seen.pieces = pieces.get(0, [])
        return seen

    def tokens_in_tail(self, chars: int) -> int:
        """The events (one token each) that carried the last `chars` characters of choice 0's text."""
        tokens = 0
        for piece in reversed(self.pieces):
            if chars <= 0:
                break
            chars -= len(piece)
            tokens += 1
        return tokens


def not_continuable(request: Any, delivered: Delivered) -> Optional[str]:
    """Why this stream cannot go on exactly from what its client has on another replica; None: it can.
    docs/operations.md lists these and why."""
    if delivered.error or delivered.done:
        return "ended"  # the client already has an end
    if delivered.finish_reasons or delivered.usage_sent:
        return "finished"  # the reply's end was on its way: nothing left to generate
    if (getattr(request, "n", 1) or 1) > 1 or len(delivered.text) > 1:
        return "n"  # several sequences, each at its own point: one request cannot continue them all
    if getattr(request, "use_beam_search", False):
        return "beam_search"
    if (getattr(request, "logprobs", None) not in (None, False) or getattr(request, "top_logprobs", None)
            or getattr(request, "prompt_logprobs", None) or delivered.logprobs):
        return "logprobs"  # the continuation's prompt logprobs would not be the reply's
    if getattr(request, "frequency_penalty", 0) or getattr(request, "presence_penalty", 0):
        return "penalties"  # they count generated tokens only: moved into the prompt, they would not count
    if getattr(request, "echo", False):
        return "echo"
    if getattr(request, "return_token_ids", False) or getattr(request, "return_tokens_as_token_ids", False):
        return "token_ids"  # the continuation's prompt ids are not the client's
    if (getattr(request, "structured_outputs", None) is not None
            or (getattr(request, "response_format", None) is not None
                and getattr(request.response_format, "type", "text") != "text")):
        return "structured_output"  # the grammar would restart from the beginning
    if delivered.tool_calls or (getattr(request, "tools", None) and getattr(request, "tool_choice", None) != "none"):
        return "tools"  # the tool parser reads the whole output: a half-sent call cannot be resumed
    if delivered.reasoning:
        return "reasoning"  # the reasoning parser's split is in the output, not in a continuation's prompt
    if hasattr(request, "messages"):
        if getattr(request, "continue_final_message", False):
            last = request.messages[-1] if request.messages else None
            if not (isinstance(last, dict) and isinstance(last.get("content"), str)):
                return "final_message"
    elif not isinstance(getattr(request, "prompt", None), str):
        return "prompt"  # a list of prompts, or token ids: text cannot be appended exactly
    return None


def continuation_request(request: Any, text: str, max_tokens: Optional[int], delivered_tokens: int) -> Any:
    """The request that makes a replica go on from `text` (what the client has): the same request
    with the text appended to the prompt (completions) or as the assistant's message continued
    (chat), for what is left of max_tokens (`max_tokens`; None: to the context's end)."""
    update: dict[str, Any] = {}
    if hasattr(request, "messages"):
        messages = list(request.messages)
        if getattr(request, "continue_final_message", False):
            last = messages[-1]
            messages[-1] = {**last, "content": last["content"] + text}
        else:
            messages.append({"role": "assistant", "content": text})
        update.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
        if getattr(request, "max_completion_tokens", None) is not None:
            update["max_completion_tokens"] = max_tokens
    else:
        update["prompt"] = request.prompt + text
    if max_tokens is not None:
        update["max_tokens"] = max_tokens
    if getattr(request, "min_tokens", 0):
        update["min_tokens"] = max(request.min_tokens - delivered_tokens, 0)
    return request.model_copy(update=update)


def merged_usage(usage: dict, resumed: Resumed) -> dict:
    """A continuation's `usage` object as the whole reply's: the prompt once, every completion token."""
    completion = usage.get("completion_tokens", 0) + resumed.completion_tokens
    prompt = resumed.prompt_tokens or usage.get("prompt_tokens", 0)
    merged = {**usage, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if resumed.prompt_tokens and isinstance(usage.get("prompt_tokens_details"), dict):
        merged["prompt_tokens_details"] = {**usage["prompt_tokens_details"],
                                           "cached_tokens": resumed.cached_prompt_tokens}
    return merged


def split_at_token_boundary(text: str) -> tuple[str, str]:
    """(what the continuation's prompt ends with, what it must generate again). A tokenizer joins a
    run of whitespace into one token when nothing follows it, where the model had generated it as
    several (a BPE pre-tokenizer splits "\n\nThe" as "\n", "\nThe"): a prompt ending in that run
    would not be the tokens the model had. Without it the text ends where a token ended; the
    replica generates the run again and the client is not sent it twice (Continuation)."""
    kept = text.rstrip()
    if not kept:
        return text, ""
    return kept, text[len(kept):]


class Continuation:
    """Rewrites a continuation's chunks into the rest of the client's one reply: the role chunk
    dropped, the text the client already has (`overlap`) not sent again, `created` kept and the
    usage totals merged (Resumed.completion_tokens leaves out the overlap: this replica counts it)."""

    def __init__(self, resumed: Resumed, created: Optional[int], drop_role: bool, overlap: str = ""):
        self.resumed = resumed
        self.created = created
        self.drop_role = drop_role
        self.overlap = overlap  # what the client has that this replica generates again first

    def chunk(self, raw: EngineChunk) -> Optional[EngineChunk]:
        """The chunk as the client's reply goes on; None: nothing of it is for the client."""
        data = self.data(raw.data)
        r = self.resumed
        chunk = raw._replace(
            data=data, prompt_tokens=r.prompt_tokens or raw.prompt_tokens,
            cached_prompt_tokens=r.cached_prompt_tokens if r.prompt_tokens else raw.cached_prompt_tokens,
            completion_tokens=r.completion_tokens + raw.completion_tokens,
            first_token_time=r.first_token_time or raw.first_token_time)
        return chunk if data or raw.final else None

    def data(self, data: bytes) -> bytes:
        events = []
        for event in data.decode("utf-8").split("\n\n"):
            if not event.startswith(_DATA) or event == "data: [DONE]":
                if event:
                    events.append(event)
                continue
            try:
                body = json.loads(event[len(_DATA):])
            except ValueError:
                events.append(event)
                continue
            if "error" not in body and not self._rewrite(body):
                continue
            events.append(_DATA + json.dumps(body, separators=(",", ":"), ensure_ascii=False))
        return "".join(e + "\n\n" for e in events).encode()

    def _rewrite(self, body: dict) -> bool:
        """Rewrite one event in place; False: drop it (the role-only first delta, an overlap)."""
        if self.created is not None and "created" in body:
            body["created"] = self.created
        choices = body.get("choices") or []
        keep = True
        for choice in choices:
            delta = choice.get("delta")
            holder, key = (delta, "content") if isinstance(delta, dict) else (choice, "text")
            if self.drop_role and isinstance(delta, dict) and "role" in delta:
                del delta["role"]
                if not delta.get("content") and len(delta) <= 1 and choice.get("finish_reason") is None:
                    keep = False
            text = holder.get(key)
            if self.overlap and text:
                # The replica says again what the client has; past where it stops agreeing, it goes on.
                common = 0
                while common < min(len(text), len(self.overlap)) and text[common] == self.overlap[common]:
                    common += 1
                self.overlap = self.overlap[common:] if common == len(text) or common == len(self.overlap) else ""
                holder[key] = text[common:]
                if not holder[key] and choice.get("finish_reason") is None:
                    keep = False
                else:
                    keep = True
        if isinstance(body.get("usage"), dict):
            body["usage"] = merged_usage(body["usage"], self.resumed)
            keep = True
        return keep


def _delivered_tokens(last: Optional[EngineChunk]) -> int:
    return last.completion_tokens if last is not None else 0


class MigratingEngine:
    """The ingress's EngineClient.generate, moving a request off a lost replica (see the module)."""

    def __init__(self, engine: EngineClient, max_migrations: int, replica_metrics=None):
        self.engine = engine
        self.max_migrations = max_migrations
        self.replica_metrics = replica_metrics  # ReplicaMetrics (its `migrated`), or None

    def generate(self, call: EngineCall, request: Any) -> AsyncIterator[EngineChunk | EngineError]:
        if self.max_migrations <= 0:
            return self.engine.generate(call, request)  # off: the engine's stream as it is
        return self._generate(call, request)

    def _count(self, outcome: str) -> None:
        if self.replica_metrics is not None:
            try:
                self.replica_metrics.migrated(outcome)
            except Exception:
                logger.debug("migration metric failed", exc_info=True)

    @staticmethod
    def _ended(call: EngineCall, exc: Exception, moved: int, migrated_prompt: int) -> Exception:
        """The exception the request ends with: as it came, unless it had moved (then the ingress's
        record of the loss must name what the moves cost)."""
        if not moved:
            return exc
        lost_call = exc.call if isinstance(exc, EngineLost) else call
        lost = exc.cause if isinstance(exc, EngineLost) else exc
        return EngineLost(dataclasses.replace(lost_call, resumed=None, avoid_replica=None), lost, migrated_prompt)

    async def _generate(self, call: EngineCall, request: Any) -> AsyncIterator[EngineChunk | EngineError]:
        sent: list[bytes] = []  # the bytes the client was sent, as the engine coalesced them
        last: Optional[EngineChunk] = None  # the last chunk as the client got it (counts merged)
        attempt_call, attempt_request, continuation = call, request, None
        moved, migrated_prompt = 0, 0
        while True:
            items = self.engine.generate(attempt_call, attempt_request)
            raw_last: Optional[EngineChunk] = None
            try:
                async for item in items:
                    if isinstance(item, EngineChunk):
                        raw_last = item
                        if continuation is not None:
                            item = continuation.chunk(item)
                            if item is None:
                                continue
                        sent.append(item.data)
                        last = item
                    yield item
                return
            except BackPressureError:
                raise  # a refusal: every replica's queue is full, nothing was lost
            except Exception as exc:
                lost = exc.cause if isinstance(exc, EngineLost) else exc
                if moved and raw_last is not None:  # what the lost take-over prefilled
                    migrated_prompt += raw_last.prompt_tokens
                if last is not None and (not call.stream or last.final):
                    # The whole reply was sent (a non-stream body; a stream's metered end).
                    raise self._ended(call, exc, moved, migrated_prompt)
                if moved >= self.max_migrations or (call.deadline is not None and time.time() >= call.deadline):
                    self._count("exhausted")
                    raise self._ended(call, exc, moved, migrated_prompt)
                moved += 1
                avoid = (raw_last.replica_id if raw_last is not None else None) or attempt_call.avoid_replica
                if not sent:  # nothing delivered: the whole request again
                    logger.warning("engine replica lost before request %s's first chunk (%r); resending it "
                                   "(move %d of %d)", call.request_id, lost, moved, self.max_migrations)
                    attempt_call = dataclasses.replace(
                        call, avoid_replica=avoid,
                        resumed=Resumed(migrations=moved, migrated_prompt_tokens=migrated_prompt))
                    attempt_request, continuation = request, None
                    self._count("resent")
                    continue
                delivered = Delivered.parse(sent)
                reason = not_continuable(request, delivered)
                if reason is not None:
                    logger.warning("engine replica lost mid-stream on request %s (%r); not continuable (%s)",
                                   call.request_id, lost, reason)
                    self._count("not_continuable")
                    raise self._ended(call, exc, moved - 1, migrated_prompt)
                text = delivered.text.get(0, "")
                prefix, overlap = split_at_token_boundary(text)
                # Tokens of the text the continuation starts from; the overlap's it generates again.
                done_tokens = max(_delivered_tokens(last) - delivered.tokens_in_tail(len(overlap)), 0) if text else 0
                left = None if call.max_tokens is None else call.max_tokens - done_tokens
                if left is not None and left <= 0:
                    self._count("not_continuable")
                    raise self._ended(call, exc, moved - 1, migrated_prompt)
                resumed = Resumed(
                    migrations=moved, prompt_tokens=last.prompt_tokens, cached_prompt_tokens=last.cached_prompt_tokens,
                    completion_tokens=done_tokens, first_token_time=last.first_token_time,
                    migrated_prompt_tokens=migrated_prompt)
                attempt_call = dataclasses.replace(
                    call, resumed=resumed, avoid_replica=avoid, max_tokens=left,
                    prompt_tokens=call.prompt_tokens + len(text) // 4)
                attempt_request = (continuation_request(request, prefix, left, done_tokens) if text else request)
                continuation = Continuation(resumed, delivered.created, drop_role=delivered.role_sent,
                                            overlap=overlap)
                logger.warning("engine replica lost mid-stream on request %s after %d tokens (%r); continuing "
                               "on another replica (move %d of %d)", call.request_id, done_tokens, lost, moved,
                               self.max_migrations)
                self._count("continued")
            finally:
                await items.aclose()
