"""VLLMEngine: one vLLM AsyncLLM plus vLLM's own OpenAI serving layer, in one process.

Like Ray Serve LLM's VLLMEngine, we build vLLM's OpenAI serving objects with `init_app_state`
next to the engine, so chat templates, request validation, sampling-parameter mapping and SSE
framing are vLLM's, not ours. What we add: per-request token counts (see usage_tracking) and
a 1-token readiness probe.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, AsyncIterator, Union

from starlette.datastructures import State
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.entrypoints.openai.api_server import init_app_state
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMClientError
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.executor import Executor

from loraplex.engine.cpu_backend import renice_children, resolve_cpu_dtype, set_cpu_backend_env
from loraplex.engine.tenant_scheduler import (ARG_PREFIX, BATCH_ARG, CONFIG_KEY, NO_TENANT, TENANT_ARG, WEIGHT_ARG,
                                              UNREACHABLE_UTILITY, scheduler_cls_for, slo_args)
from loraplex.engine.loaded_adapters import AdapterGone, LoadedAdapters
from loraplex.disk_full import CacheDiskFull
from loraplex.store_io import AdapterStoreUnavailable
from loraplex.engine.lora_residency import EXTENSION, RPC, LoRAResidency
from loraplex.engine.orphan_guard import start_guard
from loraplex.contract import SSE_DONE, EngineCall, EngineError, RequestUsage
from loraplex.engine.usage_tracking import UsageTrackingAsyncLLM, current_usage

if TYPE_CHECKING:  # annotations only: at run time engine/ does not import the config (no cycle)
    from loraplex.engine.config import EngineConfig

logger = logging.getLogger(__name__)
# What the replica chose for vLLM at start (threads, dtype): in the replica's Serve log, which
# only Serve's logger reaches (as routing/serve_router.py's).
start_log = logging.getLogger("ray.serve")

EngineItem = Union[str, dict, EngineError]
# vLLM finish reasons -> the ledger's statuses; any other ending reason is "finished".
_STATUS_OF_FINISH = {"stop": "stop", "length": "length", "abort": "aborted"}


_SSE_ERROR = 'data: {"error"'


def _in_band_error(chunk: str) -> EngineError:
    try:
        e = json.loads(chunk[len("data: "):])["error"]
        return EngineError(status=int(e.get("code") or 400), message=str(e.get("message")), type=e.get("type"),
                           param=e.get("param"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return EngineError(status=400, message=chunk[len("data: "):].strip())


def ending_status(finish_reason: str | None, ending: str) -> str:
    """The ledger status of a request: its finish reason, else how the stream ended."""
    if finish_reason is None:
        return ending
    return _STATUS_OF_FINISH.get(finish_reason, "finished")


def engine_args(sent: dict | None, call: EngineCall) -> dict:
    """A request's vLLM extra_args: whose tokens these are and their SLO class, for the tenant
    scheduler in EngineCore, ours; the client's own `loraplex_*` args are dropped, so it can name
    neither its tenant, its weight nor its class."""
    own = {k: v for k, v in (sent or {}).items() if not str(k).startswith(ARG_PREFIX)}
    return {**own, TENANT_ARG: call.tenant_id or NO_TENANT, WEIGHT_ARG: float(call.weight),
            BATCH_ARG: bool(call.batch), **slo_args(call.slo)}


class VLLMEngine:
    def __init__(self, config: EngineConfig, replica_id: str = "", adapter_store=None, metrics=None):
        self.config = config
        self.replica_id = replica_id
        self.adapter_store = adapter_store  # where adapter versions are fetched from (registry)
        self.metrics = metrics  # the replica's ReplicaMetrics: adapter loads and evictions
        self.llm: UsageTrackingAsyncLLM | None = None
        self._residency_rpc = False
        self._orphan_guard = None
        self.adapters: LoadedAdapters | None = None
        self.last_probe_ok: float = 0.0
        # Probes are real generations that no tenant pays for: reconciling the ledger with the
        # engine's counters takes them out (each is 1 prompt + 1 generated token).
        self.probes_done = 0

    async def start(self) -> None:
        # Before vLLM forks EngineCore: if this replica is killed, the guard kills EngineCore.
        self._orphan_guard = start_guard()
        added = set_cpu_backend_env()
        if added:  # docs/operations.md: set either in the replica's runtime_env to choose yourself
            start_log.info("vLLM CPU backend: %s", " ".join(f"{k}={v}" for k, v in added.items()))
        args = self.config.engine_args()
        if _on_cpu():  # vLLM's auto takes the model's dtype (bfloat16), emulated and slow on most CPUs
            args["dtype"], why = resolve_cpu_dtype(args.get("dtype", "auto"))
            if why:
                start_log.info("vLLM CPU backend: dtype auto -> %s: %s", args["dtype"], why)
        if self.config.enable_lora:  # lists vLLM's GPU slots (lora_residency), unless the operator has one
            args.setdefault("worker_extension_cls", EXTENSION)
        self._residency_rpc = args.get("worker_extension_cls") == EXTENSION
        if self.config.tenant_scheduler.enabled:  # its settings travel to EngineCore in vLLM's own config
            args["additional_config"] = {**args.get("additional_config", {}),
                                         CONFIG_KEY: self.config.tenant_scheduler.settings()}
        engine_args = AsyncEngineArgs(**args)
        vllm_config = engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        if self.config.tenant_scheduler.enabled:
            # Chosen once vLLM has resolved async scheduling (on for GPUs by default, off on CPU).
            cls = scheduler_cls_for(vllm_config)
            vllm_config.scheduler_config.scheduler_cls = f"{cls.__module__}.{cls.__qualname__}"
        self.llm = UsageTrackingAsyncLLM(
            vllm_config=vllm_config, executor_class=Executor.get_class(vllm_config),
            log_requests=engine_args.enable_log_requests, log_stats=not engine_args.disable_log_stats,
            usage_context=UsageContext.ENGINE_CONTEXT)  # AsyncLLM.from_engine_args, with our scheduler
        if _on_cpu() and self.config.cpu_nice:  # the front door shares these cores (docs/operations.md)
            reniced = renice_children(self.config.cpu_nice, skip={self._orphan_guard.pid})
            start_log.info("vLLM CPU backend: EngineCore %s %d steps nicer than the replica", reniced,
                           self.config.cpu_nice)
        state = State()
        await init_app_state(
            self.llm,
            state=state,
            args=self._frontend_args(engine_args),
            supported_tasks=await self.llm.get_supported_tasks(),
        )
        self.models = state.openai_serving_models
        self.chat_serving = state.openai_serving_chat
        self.completion_serving = state.openai_serving_completion
        self.adapters = LoadedAdapters(self.llm, self.models, self.adapter_store, self.metrics,
                                       residency=self.lora_residency, max_cpu_bytes=self.config.max_cpu_lora_bytes)
        await self.probe()

    def _frontend_args(self, engine_args: AsyncEngineArgs):
        # init_app_state reads the CLI namespace of `vllm serve`; start from its defaults so
        # every frontend option exists, then lay our engine args over them.
        args = make_arg_parser(FlexibleArgumentParser()).parse_args([])
        for key, value in vars(engine_args).items():
            setattr(args, key, value)
        args.served_model_name = [self.config.model_id]
        # Cached prompt tokens in `usage.prompt_tokens_details`, as OpenAI reports them.
        args.enable_prompt_tokens_details = True
        return args

    def generate(self, call: EngineCall, request, usage: RequestUsage) -> AsyncIterator[EngineItem]:
        """Run one OpenAI request (chat or completion) as the call says: its adapter version,
        its tenant's prefix-cache salt and request id. Yields SSE strings (a stream) or one
        response dict, or one EngineError for a refusal; fills `usage` as tokens are made.

        The stream's `[DONE]` (or the response) is held until `usage` is final, so whoever
        meters on the last item sees the final counts.
        """
        create = (self.chat_serving.create_chat_completion if isinstance(request, ChatCompletionRequest)
                  else self.completion_serving.create_completion)
        return self._serve(create, call, request, usage)

    async def _serve(self, create, call: EngineCall, request, usage: RequestUsage):
        request.request_id = call.request_id
        # vLLM runs lower values first; a client's own `priority` never counts.
        request.priority = 100 - call.priority if self.config.scheduling_policy == "priority" else 0
        if call.cache_salt is not None:
            request.cache_salt = call.cache_salt
        # Whose tokens these are, for the tenant scheduler in EngineCore: ours, whatever the client sent.
        request.vllm_xargs = engine_args(request.vllm_xargs, call)
        adapter = call.adapter
        if adapter is None:
            async for item in self._run(create, request, usage):
                yield item
            return
        if call.path == "merged":
            # A dedicated replica: the adapter is in this engine's weights (dedicated/replica.py
            # checked that it is this call's version), served under the base model's name.
            request.model = self.config.model_id
            async for item in self._run(create, request, usage):
                yield _renamed(item, self.config.model_id, adapter.requested_as)
            return
        try:
            await self.adapters.acquire(adapter)
        except AdapterGone as exc:
            # Deleted between the ingress's resolve and now: the same 404 as at the ingress.
            yield EngineError(status=404, message=str(exc), type="NotFoundError", param="model")
            return
        except AdapterStoreUnavailable as exc:
            # Not on this replica yet and the store cannot give it: refused, never billed; the
            # next request for it tries the store again.
            yield EngineError(status=503, message=exc.message, type="service_unavailable",
                              retry_after=exc.retry_after_s, reason="adapter_store_unavailable")
            return
        except CacheDiskFull as exc:  # no room on this node even after pruning idle copies: refused, unbilled
            yield EngineError(status=503, message=exc.message, type="service_unavailable",
                              retry_after=exc.retry_after_s, reason="adapter_cache_full", code="adapter_cache_full")
            return
        request.model = adapter.lora_name
        try:
            async for item in self._run(create, request, usage):
                yield _renamed(item, adapter.lora_name, adapter.requested_as)
        finally:
            await self.adapters.release(adapter)

    async def _run(self, create, request, usage: RequestUsage) -> AsyncIterator[EngineItem]:
        current_usage.set(usage)
        serving = create.__self__
        ending, held, body, error = "client_disconnect", None, None, None
        try:
            try:
                result = await create(request, raw_request=None)
            except (ValueError, VLLMClientError) as exc:
                result = serving.create_error_response(exc)
            if isinstance(result, ErrorResponse):
                error = EngineError(
                    status=result.error.code,
                    message=result.error.message,
                    type=result.error.type,
                    param=result.error.param,
                )
            elif isinstance(result, AsyncIterator):
                async for chunk in result:
                    if chunk == SSE_DONE:
                        held = chunk
                    elif not usage._completion_by_output and chunk.startswith(_SSE_ERROR):
                        # vLLM refused the request inside generate() (add_request validation) and
                        # says so in-band: a refusal like any other, not a billed failure.
                        error = _in_band_error(chunk)
                    else:
                        yield chunk
            else:
                body = result.model_dump(mode="json")
            ending = "engine_error"  # ended on its own: a finish reason says how, else it failed
        except Exception:
            ending = "engine_error"
            raise
        finally:
            # GeneratorExit / CancelledError (the client went away) leave ending at client_disconnect.
            await self._finish(usage, ending)
        if error is not None:
            yield error
            return
        if body is not None:
            yield body
        if held is not None:
            yield held

    async def _finish(self, usage: RequestUsage, ending: str) -> None:
        usage.finish_time = time.time()
        usage.status = ending_status(usage.finish_reason, ending)
        if usage.finish_reason is None and usage.engine_request_ids:
            # Abort now rather than when the abandoned generators are garbage-collected: the
            # engine must stop at once.
            await self.llm.abort(usage.engine_request_ids)
            logger.info("%s after %s completion tokens", usage.status, usage.completion_tokens)

    async def base_models(self) -> dict[str, Any]:
        """The served base model(s) as OpenAI lists them. Never the LoRAs vLLM has registered:
        those are every tenant's, and a tenant sees only its own (from the catalog)."""
        models = (await self.models.show_available_models()).model_dump(mode="json")
        return {**models, "data": [m for m in models["data"] if m.get("parent") is None]}

    def num_unfinished_requests(self) -> int:
        return self.llm.get_num_unfinished_requests()

    async def resident_adapter_ids(self) -> set[int]:
        """The adapter ids in vLLM's host-memory LoRA cache now (max_cpu_loras of them at most)."""
        if not self.config.enable_lora:
            return set()
        return set(await self.llm.list_loras())

    async def unreachable_steps(self) -> dict[str, int]:
        """The tenant scheduler's count, per SLO class, of shared steps whose tightest class's TPOT
        target was out of reach (counted only with tenant_scheduler.slo_classes on)."""
        scheduler = self.config.tenant_scheduler
        if not (scheduler.enabled and scheduler.slo_classes):
            return {}
        return await self.llm.engine_core.call_utility_async(UNREACHABLE_UTILITY)

    async def lora_residency(self) -> LoRAResidency:
        """vLLM's GPU slots and CPU tier now (the slots only through our worker extension)."""
        if not self.config.enable_lora:
            return LoRAResidency(known_slots=False)
        if self._residency_rpc:
            try:
                return LoRAResidency.of((await self.llm.collective_rpc(RPC, timeout=10))[0])
            except Exception:
                logger.warning("could not list vLLM's LoRA slots; reporting its CPU tier only", exc_info=True)
        return LoRAResidency.of(None, set(await self.llm.list_loras()))

    def last_progress(self) -> float:
        """When this engine last proved it works: a probe, or any request's output (real traffic)."""
        return max(self.last_probe_ok, self.llm.last_output_at if self.llm else 0.0)

    async def probe(self, timeout_s: float = 60.0) -> float:
        """Generate one real token; raise if the engine cannot. Returns the probe's seconds."""
        started = time.monotonic()
        params = SamplingParams(max_tokens=1, temperature=0.0)
        request_id = f"probe-{uuid.uuid4().hex}"

        async def one_token() -> None:
            async for _ in self.llm.generate({"prompt_token_ids": [1]}, params, request_id):
                pass

        await asyncio.wait_for(one_token(), timeout_s)
        self.probes_done += 1
        self.last_probe_ok = time.time()
        return time.monotonic() - started

    async def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
        if self._orphan_guard is not None:
            self._orphan_guard.kill()


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _renamed(item: EngineItem, served_as: str, requested_as: str) -> EngineItem:
    """Echo the model name the client asked for, not the internal tenant/name@sha (or, on a
    dedicated replica, the base model's name its merged weights are served under)."""
    if isinstance(item, dict) and item.get("model") == served_as:
        return {**item, "model": requested_as}
    if isinstance(item, str):
        return item.replace(f'"model":{json.dumps(served_as)}', f'"model":{json.dumps(requested_as)}')
    return item
