"""Engine: the Ray Serve deployment that hosts one VLLMEngine per replica."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from ray import serve

from loraplex import disk_full, store_io
from loraplex.dedicated.replica import merged_engine_config, path_refusal
from loraplex.engine.caller_watch import CallerWatch
from loraplex.engine.config import EngineDeploymentConfig
from loraplex.engine.cpu_backend import EngineDeployment, pin_to_cpus, share_cores
from loraplex.engine.dispatch_limit import AdaptiveLimit, FixedLimit
from loraplex.engine.engine_counters import EngineStatsReader
from loraplex.engine.fair_queue import Entry, FairQueue
from loraplex.engine.slack_order import class_target
from loraplex.engine.hand_back import HandBackClock, serve_stopping
from loraplex.engine.metering import Meter
from loraplex.contract import (SSE_DONE, AdapterTarget, EngineCall, EngineChunk, EngineError, ReplicaStopping,
                               RequestUsage, sse_error)
from loraplex.engine.shedding import InFlight, LoadShedder
from loraplex.engine.stream_batcher import DeadlineExceeded, StreamBatcher
from loraplex.metrics.recorder import Metrics
from loraplex.metrics.publisher import Publisher
from loraplex.routing.serve_router import TenantAffinityRouter
from loraplex.routing.served_keys import KeyDemand, ServedKeys, adapter_stats, routing_stats

if TYPE_CHECKING:  # annotations only: the root config imports engine/config.py, so engine/ never imports it at run time
    from loraplex.config import PlatformConfig
    from loraplex.dedicated.targets import DedicatedTarget

logger = logging.getLogger(__name__)

HAND_BACK_POLL_S = 0.25  # how often a replica reads Serve's stop flag (engine/hand_back.py)
SPOOL_FULL_RETRY_S = 10  # a disk freed or a database back: the next flush (~1 s) empties the held records


def _engine_deployments(pinned: bool) -> tuple[EngineDeployment, list[EngineDeployment], float] | None:
    """This replica's Engine deployment, the other Engine deployments on the cluster as Serve's
    controller has them (every deployment but the Ingress of each LoRAPlex app: the pools and the
    dedicated versions), and this node's logical CPUs; None when Serve cannot say (the replica
    then keeps its whole pool's cores)."""
    import ray
    from ray.serve.context import _get_global_client

    try:
        context = serve.get_replica_context()
        apps = _get_global_client().get_serve_details()["applications"]
        node = ray.get_runtime_context().get_node_id()
        node_cpus = next(n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["NodeID"] == node)
    except Exception:  # noqa: BLE001 - a best effort: the controller busy or a field renamed
        logger.warning("Engine replica: Serve's deployment details unreadable; its vLLM takes every "
                       "core of its pool", exc_info=True)
        return None
    mine, others = None, []
    for app_name, app in apps.items():
        import_path = ((app.get("deployed_app_config") or {}).get("import_path") or "")
        if app_name != context.app_name and not import_path.startswith("loraplex."):
            continue
        for name, details in app["deployments"].items():
            if name == "Ingress":
                continue
            config = details["deployment_config"]
            scaling = config.get("autoscaling_config") or {}
            replicas = scaling.get("max_replicas") or config.get("num_replicas")
            is_mine = app_name == context.app_name and name == context.deployment
            entry = EngineDeployment(
                max_replicas=int(replicas) if isinstance(replicas, (int, float)) else details["target_num_replicas"],
                num_cpus=float((details.get("required_resources") or {}).get("CPU", 1.0)),
                max_replicas_per_node=config.get("max_replicas_per_node"), pinned=pinned and is_mine)
            if is_mine:
                mine = entry
            else:
                others.append(entry)
    return (mine, others, node_cpus) if mine else None


class Engine:
    """Serve replica around VLLMEngine. `engine_cls` is injectable so tests can swap the engine,
    `metrics_sink` so they can read what the replica records (default: Ray's metrics)."""

    async def __init__(self, config: PlatformConfig, engine_cls: type | None = None, metrics_sink=None,
                       home_node_id: str | None = None, dedicated: DedicatedTarget | None = None,
                       stopping: Callable[[], bool] | None = None):
        from loraplex.accounting.ledger import UsageLedger
        from loraplex.cluster import check_model_on_this_node, check_on_replica, for_this_node
        if engine_cls is None:  # imported here: the app's build imports this module, and need not import vLLM
            from loraplex.serve_log import keep_serve_log_open

            keep_serve_log_open()  # vLLM configures logging on its import and its start (serve_log.py)
            from loraplex.engine.vllm_engine import VLLMEngine as engine_cls
        from loraplex.db.engine import make_engine
        from loraplex.registry.store import AdapterStore
        from loraplex.registry.catalog import AdapterCatalog

        try:
            replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside Serve (unit tests)
            replica_id = "local"
        self.replica_id = replica_id
        # Node-local state away from the node the app was deployed on, or a model this node
        # cannot read: refuse to start, with the fix (loraplex/cluster.py).
        check_on_replica(config, home_node_id, "Engine")
        check_model_on_this_node(config.engine.model)
        config = for_this_node(config)
        self.ready_probe_max_age_s = config.engine_deployment.ready_probe_max_age_s
        registry = config.registry
        store = AdapterStore(registry)
        # A dedicated replica (dedicated/replica.py): one adapter version merged into its weights.
        self.dedicated = dedicated
        if dedicated is not None:
            config = await asyncio.to_thread(merged_engine_config, config, dedicated, store)
        db = make_engine(config.database_url)
        self.catalog = AdapterCatalog(db)
        self.base_model = config.engine.model_id
        # The affinity keys this replica served lately, reported to the routers (record_routing_stats).
        deployment = config.engine_deployment
        self.served_keys = ServedKeys(deployment.routing.served_keys)
        self.adapter_demand = KeyDemand(capacity=deployment.routing.served_keys)  # requests per adapter lately
        self.max_loras = config.engine.max_loras
        self._residency = None  # vLLM's LoRA tiers at the last routing-stats sample
        self.migrated_in = 0  # requests this replica took over from a lost one (EngineCall.resumed)
        # Calls running here, and whether Serve is stopping the replica: once its graceful period is
        # over, the calls still running are handed back to their ingress to move (ReplicaStopping).
        self.running: set[asyncio.Task] = set()
        self.stopping = False
        self.in_flight = InFlight()  # sequences (EngineCall.sequences) this replica serves, per tenant
        self.metrics = Metrics.for_replica(config.metrics, "engine", metrics_sink, base_model=self.base_model)
        if self.metrics.enabled and metrics_sink is None:  # the adapter store and disk failure counters, exported at 0
            store_io.FAILURES.start()
            disk_full.FAILURES.start()
        scheduler = config.engine.tenant_scheduler
        if scheduler.enabled and scheduler.slo_classes:
            self.metrics.replica.slo_classes(name for name, k in config.slo.resolved_classes().items()
                                             if k.tpot_p95_s is not None)
        # vLLM's own numbers, read from its registry by one reader: the shedder, the routing
        # stats and the metrics publisher share its readings.
        self.stats = EngineStatsReader(max_age_s=deployment.shedding.sample_period_s)
        # The fair queue (VTC) decides which request vLLM gets next; None: every request at once.
        self.fair_queue = self._fair_queue(config)
        # in_flight counts only what the queue dispatched: the shedder bounds vLLM's share, the
        # queue refuses by share when it is full.
        self.shedder = LoadShedder(deployment.shedding, self.in_flight,
                                   lambda: self.stats.read()["kv_cache_usage"])
        # The Ingress replicas of running calls, checked alive: a dead one's calls are aborted.
        self.callers = CallerWatch(deployment.caller_check_s)
        self.batcher = StreamBatcher(deployment.stream_window_s, deployment.stream_max_chunks,
                                     deployment.stream_items_per_s, deployment.stream_max_window_s)
        # Before vLLM starts its processes: they inherit the pool's cores (several bases on one node).
        if (pinned := pin_to_cpus(deployment.cpu_affinity)) is not None:
            logger.info("Engine replica %s of %s pinned to CPUs %s", replica_id, self.base_model, sorted(pinned))
        if replica_id != "local" and (here := await asyncio.to_thread(_engine_deployments, bool(pinned))):
            logger.info("Engine replica %s shares its cores with up to %d Engine replicas",
                        replica_id, share_cores(*here))
        self.engine = engine_cls(self.engine_config(config), replica_id=replica_id, adapter_store=store,
                                 metrics=self.metrics.replica)
        await self.engine.start()
        # This replica writes the usage record of every request it serves: it alone sees every
        # token, also those generated for a client that has gone. Start it (replaying what a
        # crashed replica left in its spool) before taking traffic, but after vLLM has forked
        # its processes: a child holding the spool's lock would keep it from being adopted.
        self.ledger = await asyncio.to_thread(
            UsageLedger.from_config(config.accounting, f"engine-{replica_id}", engine=db).start
        )
        self.meter = Meter(self.ledger, self.metrics.requests, self.base_model)
        self._free_deleted = asyncio.create_task(self._free_deleted_adapters(registry.deletion_poll_s))
        # Serve's stop, read from its flag (`stopping` in tests): the calls still running go back
        # before the controller's kill, which comes before __del__ (engine/hand_back.py).
        stopping = stopping or serve_stopping()
        self._hand_back = None
        if stopping is None and replica_id != "local":
            logger.warning("Engine replica %s cannot read Serve's stop flag (another Ray version?): a call "
                           "outlasting the graceful period is cut by the kill and moved as after a crash", replica_id)
        if stopping is not None:
            clock = HandBackClock(deployment.graceful_shutdown_timeout_s)
            self._hand_back = asyncio.create_task(self._hand_back_when_due(stopping, clock))
        self._loop = asyncio.get_running_loop()
        self.publisher = None
        if self.metrics.enabled:
            self.publisher = Publisher(config.metrics.publish_period_s, [
                self.metrics.flush, self._publish_engine_stats, self._publish_adapters, self._publish_ledger,
                self._publish_fair_queue, self._publish_unreachable,
            ], name=f"metrics-{replica_id}").start()
        if replica_id != "local":  # as the Ingress does: what init built stays out of every full
            from vllm.utils.gc_utils import freeze_gc_heap  # collection (never in a test process:
            freeze_gc_heap()                                # its garbage would stay)

    @staticmethod
    def _fair_queue(config: PlatformConfig) -> FairQueue | None:
        fq = config.engine_deployment.fair_queue
        if not fq.enabled:
            return None
        max_num_seqs = config.engine.max_num_seqs
        if fq.dispatch_limit == "adaptive":  # its TPOT target: the queue's own, else `slo:`'s (for_replicas)
            limit = AdaptiveLimit(fq.adaptive, max_num_seqs, config.slo.tpot_p95_s)
        else:  # None: work-conserving, the whole batch (fairness is the tenant scheduler's, in vLLM's step)
            limit = FixedLimit(min(fq.dispatch_limit or max_num_seqs, max_num_seqs))
        # The reserve sits beside the limit: vLLM runs max_num_seqs + newcomer_slots (engine_config).
        return FairQueue(fq, limit, max_num_seqs + fq.newcomer_slots,
                         slo_classes=config.engine.tenant_scheduler.slo_classes)

    @staticmethod
    def engine_config(config: PlatformConfig):
        """What vLLM runs: with the fair queue on, room for its reserved slots beside a full batch."""
        fq = config.engine_deployment.fair_queue
        if not fq.enabled or not fq.newcomer_slots:
            return config.engine
        return config.engine.model_copy(update={"max_num_seqs": config.engine.max_num_seqs + fq.newcomer_slots})

    async def generate(self, call: EngineCall, request) -> AsyncIterator[EngineChunk | EngineError]:
        """Serve one tenant request: coalesced EngineChunks (SSE bytes, or the JSON body), or
        one EngineError for a request the engine refused.

        Writes the request's one usage record before the last chunk leaves (a client that saw
        its reply end was metered), or, if the stream ends otherwise (client gone, engine
        error), when it ends. An engine failure after the request started ends the stream with
        an error event (a stream) or a 503 EngineError, billed as `engine_error`; the call's
        deadline aborts the engine request and ends it the same way with 504, billed as `timeout`.
        """
        if (wrong_path := path_refusal(self.dedicated, call)) is not None:
            yield wrong_path
            return
        if call.base_model is not None and call.base_model != self.base_model:
            # Only a wiring bug sends a call to another base's pool: its adapter's shapes and
            # weights are that base's, so refuse rather than run it here (nothing generated, unbilled).
            yield EngineError(status=500, message=f"This request for base model {call.base_model} reached an "
                              f"engine of {self.base_model}; nothing was run. Report it; retrying may reach the "
                              "right one.", reason="wrong_base")
            return
        self.served_keys.touch(call.routing_key)
        if call.adapter is not None:
            self.adapter_demand.touch(call.routing_key)
        tenant = call.tenant_id or "-"
        if call.tenant_id is not None and (unbillable := self.ledger.refusal()) is not None:
            # Served, it could not be billed (spool full, database unreachable): not served.
            yield EngineError(status=503, message=f"Usage cannot be recorded on this engine replica: {unbillable}; "
                              f"retry in {SPOOL_FULL_RETRY_S} s.", type="service_unavailable",
                              retry_after=SPOOL_FULL_RETRY_S, reason="usage_spool_full", code="usage_spool_full")
            return
        if (overloaded := self.shedder.refusal(tenant, call.priority, call.weight, call.sequences)) is not None:
            yield EngineError(status=503, message=f"The server is overloaded ({overloaded}); retry in a moment.",
                              type="service_unavailable", retry_after=self.shedder.config.retry_after_s,
                              reason="shed")
            return
        # Aborted if its Ingress replica dies: queued too, or it would start later for no one.
        watched = self.callers.watch(call.caller)
        entry = None
        if self.fair_queue is not None:
            try:
                entry = await self._wait_for_slot(call)
            except BaseException:  # cancelled while queued: nothing ran, nothing to bill
                self.callers.unwatch(watched)
                raise
            if entry.state == "refused":
                self.callers.unwatch(watched)
                yield self._queue_refusal(entry)
                return
        if self.stopping:  # handed back already (hand_back.py): nothing ran here, it goes elsewhere whole
            self.callers.unwatch(watched)
            if entry is not None:
                self.fair_queue.finish(entry)
            raise ReplicaStopping(f"Engine replica {self.replica_id} is stopping; request {call.request_id} "
                                  "did not start")
        if call.resumed is not None:
            self.migrated_in += 1
        task = asyncio.current_task()
        self.running.add(task)
        self.in_flight.add(tenant, call.weight, call.sequences, call.priority)  # what the shedder bounds: sequences in vLLM
        usage = RequestUsage(replica_id=self.replica_id)
        if entry is not None:  # its tenant's next request may start now (prefill pacing)
            usage.on_first_token = lambda: self.fair_queue.first_token(entry)
        source = self.engine.generate(call, request, usage)
        batches = self.batcher.batches(source, call.deadline)
        metered = refused = handed_back = False
        charged = [0, 0]  # prompt, completion tokens added to the tenant's virtual counter
        try:
            async for items in batches:
                if entry is not None:
                    self._charge(entry, usage, charged)
                last = items[-1]
                if isinstance(last, EngineError):
                    refused = True  # counted by the ingress as a refusal, never billed
                    yield last
                    return
                if isinstance(last, dict) or last == SSE_DONE:  # the reply's end: usage is final
                    self._meter(call, usage)
                    metered = True
                if isinstance(last, dict):
                    yield usage.chunk(json.dumps(last, separators=(",", ":")).encode(), final=metered)
                else:
                    yield usage.chunk("".join(items).encode(), final=metered)
        except asyncio.CancelledError:
            if not self.stopping:
                raise  # the client went away (or its Ingress replica died): billed below
            # The graceful period is over with this call still running: its ingress moves it to
            # another replica, which meters it whole (or bills what its client got, if it cannot).
            handed_back = True
            raise ReplicaStopping(f"Engine replica {self.replica_id} stopped with request {call.request_id} "
                                  "running") from None
        except DeadlineExceeded:
            # The batcher cancelled the engine request; bill what it produced, as a timeout.
            usage.status, usage.finish_time = "timeout", time.time()
            self._meter(call, usage)
            metered = True
            fewer = "fewer tokens" if call.sequences == 1 else f"fewer tokens or fewer sequences (n x prompts: {call.sequences})"
            message = (f"The request ran past its deadline and was stopped; ask for {fewer}, "
                       "or a longer X-LoRAPlex-Timeout (up to the server's limit).")
            if call.stream and usage.engine_request_ids:
                yield usage.chunk(sse_error(504, message, "timeout_error") + SSE_DONE.encode(), final=True)
            else:
                yield EngineError(status=504, message=message, type="timeout_error",
                                  billed=bool(usage.engine_request_ids))
        except Exception as exc:
            logger.exception("request %s failed in the engine", call.request_id)
            usage.status = "engine_error"
            self._meter(call, usage)
            metered = True
            message = f"The engine failed on this request ({type(exc).__name__}); retry it."
            if call.stream and usage.engine_request_ids:
                yield usage.chunk(sse_error(503, message) + SSE_DONE.encode(), final=True)
            else:
                yield EngineError(status=503, message=message, type="ServiceUnavailableError",
                                  billed=bool(usage.engine_request_ids))
        finally:
            self.callers.unwatch(watched)
            self.running.discard(task)
            self.in_flight.remove(tenant, call.sequences)
            await batches.aclose()  # on a disconnect: cancels the engine request first
            if not metered and not refused and not handed_back:
                self._meter(call, usage)
            if entry is not None:
                self._charge(entry, usage, charged)
                self._slot_freed(entry, usage)

    # -- the fair queue: thin glue over loraplex/engine/fair_queue.py ----------------------------
    async def _wait_for_slot(self, call: EngineCall) -> Entry:
        """Queue the call until the fair queue dispatches it (state running) or refuses it;
        a cancelled wait (the client went away) leaves the queue at once."""
        slot = asyncio.get_running_loop().create_future()
        entry = Entry(tenant=call.tenant_id or "-", priority=call.priority, weight=call.weight,
                      deadline=call.deadline, ready=lambda e: slot.done() or slot.set_result(None),
                      sequences=call.sequences, batch=call.batch,
                      ttft_s=class_target(call.slo.name, call.slo.ttft_s) if call.slo is not None else None,
                      arrival=call.arrival_time or None)
        queue = self.fair_queue
        queue.submit(entry)
        try:
            while entry.state == "queued":
                timeout = None
                if call.deadline is not None:  # wake when it is too late to start, to refuse it
                    timeout = max(call.deadline - queue.config.deadline_margin_s - time.time(), 0.0) + 0.001
                try:
                    await asyncio.wait_for(asyncio.shield(slot), timeout)
                except asyncio.TimeoutError:
                    queue.expire()
        except BaseException:
            queue.finish(entry)
            raise
        return entry

    def _queue_refusal(self, entry: Entry) -> EngineError:
        if entry.reason == "queue_deadline":
            message = ("The server is overloaded: this request could not start before its deadline "
                       "(X-LoRAPlex-Timeout); retry in a moment, or allow it longer.")
        else:
            message = ("The server is overloaded and your tenant has the most requests queued on this "
                       "replica for its share; retry in a moment, or send fewer at once.")
        return EngineError(status=503, message=message, type="service_unavailable",
                           retry_after=self.fair_queue.config.retry_after_s, reason=entry.reason)

    def _charge(self, entry: Entry, usage: RequestUsage, charged: list) -> None:
        prompt, completion = usage.prompt_tokens - charged[0], usage.completion_tokens - charged[1]
        if (prompt or completion) and not entry.batch:  # a batch line charges no tenant's online share
            self.fair_queue.charge(entry.tenant, prompt, completion, entry.weight)
            charged[0], charged[1] = usage.prompt_tokens, usage.completion_tokens

    def _slot_freed(self, entry: Entry, usage: RequestUsage) -> None:
        """Free the request's slot; feed its time per output token in vLLM to the adaptive limit."""
        queue = self.fair_queue
        if usage.status in ("stop", "length") and usage.first_token_time is not None:
            n = usage.longest_output()
            if n > 1:
                queue.limit.observe(((usage.finish_time or time.time()) - usage.first_token_time) / (n - 1))
        queue.finish(entry)  # dispatches the next ones, under the (maybe new) limit

    async def record_routing_stats(self) -> dict[str, Any]:
        """Serve collects this every routing stats period and hands it to every router."""
        gauges = self.stats.read()
        queue = self.fair_queue.snapshot() if self.fair_queue is not None else None
        return routing_stats(self.served_keys.recent(), running=gauges["num_requests_running"],
                             waiting=gauges["num_requests_waiting"], kv_usage=gauges["kv_cache_usage"],
                             queued=queue["queued"] if queue is not None else 0, status=self.status(queue),
                             adapters=await self._adapter_stats())

    async def _adapter_stats(self) -> dict | None:
        """Where vLLM holds this replica's adapters now, and their recent demand."""
        if not hasattr(self.engine, "lora_residency") or self.engine.adapters is None:
            return None  # an engine without LoRA adapters (a benchmark's fake)
        try:
            residency = await self.engine.lora_residency()
        except Exception:
            logger.warning("could not read vLLM's LoRA residency for the routing stats", exc_info=True)
            return None
        self._residency = residency  # for status(): pins and the CPU tier's bytes
        adapters = self.engine.adapters
        return adapter_stats(adapters.keys_of(residency.slots), adapters.keys_of(residency.cpu),
                             self.adapter_demand.snapshot(), self.max_loras)

    def replica_status(self) -> dict[str, Any]:
        """What GET /admin/replicas shows of this replica, read now."""
        gauges = self.stats.read()
        return {"replica_id": self.replica_id, "running": int(gauges["num_requests_running"]),
                "waiting": int(gauges["num_requests_waiting"]), "kv_usage": round(gauges["kv_cache_usage"], 4),
                **self.status(), "reported_at": time.time()}

    def status(self, queue: dict | None = None) -> dict[str, Any]:
        """This replica for GET /admin/replicas (carried in its routing stats): its requests,
        the fair queue's limit and per-tenant queues and counters, the adapters it holds."""
        if queue is None and self.fair_queue is not None:
            queue = self.fair_queue.snapshot()
        adapters = getattr(self.engine, "adapters", None)
        return {
            "base_model": self.base_model,  # with several bases, which pool this replica is of
            "in_flight": self.in_flight.total,
            "migrated_in": self.migrated_in,  # requests taken over from a lost replica (ingress/migration.py)
            "caller_aborts": self.callers.aborted,  # requests aborted because their Ingress replica died
            "dispatch_limit": queue["dispatch_limit"] if queue else None,  # None: no fair queue
            "dispatched": queue["dispatched"] if queue else self.in_flight.total,
            "queued": queue["queued"] if queue else 0,
            "tenants": queue["tenants"] if queue else {},
            "loaded_adapters": sorted(adapters.targets)[:64] if adapters is not None else [],
            # vLLM's CPU tier at the last routing-stats sample: pinned versions, bytes and budget.
            "pinned_adapters": sorted(adapters.targets[n].lora_name for n in adapters.targets
                                      if adapters.targets[n].lora_int_id in self._residency.pinned)
            if adapters is not None and self._residency is not None else [],
            "adapter_cpu_bytes": sum(self._residency.cpu_bytes.values()) if self._residency is not None else 0,
            "max_cpu_lora_bytes": adapters.max_cpu_bytes if adapters is not None else None,
            # Adapters vLLM moved into its GPU slots so far: slot churn, what placement can save.
            "slot_loads": self._residency.slot_loads if self._residency is not None else 0,
        }

    def _meter(self, call: EngineCall, usage: RequestUsage) -> None:
        """Append the request's usage record, if it is billable: a tenant's, and the engine
        took it (a refusal with no tokens is counted by the ingress, never billed)."""
        if call.tenant_id is None or not usage.engine_request_ids:
            return
        if usage.status is None:  # ended before the engine's own bookkeeping ran
            usage.status, usage.finish_time = "engine_error", time.time()
        self.meter(call, usage)  # the ledger's record, and the tenant's metrics from it

    def engine_counters(self) -> dict[str, float]:
        """vLLM's own token counters and gauges (read now), plus the probes no tenant pays for."""
        return {**self.stats.read(max_age_s=0), "probes": self.engine.probes_done, "replica_id": self.replica_id}

    # -- metrics: the publisher's sources, on its thread ------------------------------------------
    def _publish_engine_stats(self) -> None:
        self.metrics.replica.engine_stats(self.stats.read())

    def _publish_adapters(self) -> None:
        if not hasattr(self.engine, "resident_adapter_ids"):
            return  # an engine without LoRA adapters (a benchmark's fake)
        self._on_loop(self._sample_adapters())

    def _on_loop(self, coro):
        """Run `coro` on the replica's event loop from the publisher's thread, within a period."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=self.metrics.config.publish_period_s)
        except BaseException:
            future.cancel()
            raise

    async def _sample_adapters(self) -> None:
        # On the replica's event loop, where LoadedAdapters lives.
        asked_at = time.monotonic()
        resident = await self.engine.resident_adapter_ids()
        self.metrics.replica.resident_adapters(len(resident))
        if hasattr(self.engine, "lora_residency"):
            tier = await self.engine.lora_residency()
            self.metrics.replica.adapter_tier(len(tier.pinned), sum(tier.cpu_bytes.values()))
        self.metrics.replica.adapters_evicted("lru", self.engine.adapters.note_resident(resident, asked_at))

    def _publish_unreachable(self) -> None:
        if not hasattr(self.engine, "unreachable_steps"):
            return  # an engine without the tenant scheduler (a benchmark's fake)
        self.metrics.replica.unreachable_steps(self._on_loop(self.engine.unreachable_steps()))

    def _publish_fair_queue(self) -> None:
        if self.fair_queue is not None:
            self.metrics.replica.fair_queue(self.fair_queue.snapshot(), self.metrics.requests.tenant_label)

    def _publish_ledger(self) -> None:
        self.metrics.replica.ledger(self.ledger.last_flush_at, self.ledger.pending_records(),
                                    self.ledger.unspooled_records())

    async def base_models(self) -> dict[str, Any]:
        return await self.engine.base_models()

    async def ready(self) -> dict[str, Any]:
        """A real 1-token generation on this replica, for /readyz."""
        seconds = await self.engine.probe()
        return {"replica_id": self.replica_id, "probe_seconds": round(seconds, 4)}

    def num_unfinished_requests(self) -> int:
        return self.engine.num_unfinished_requests()

    def loaded_adapters(self) -> list[str]:
        return sorted(self.engine.adapters.targets)

    async def adapter_residency(self) -> dict[str, Any]:
        """Where vLLM holds this replica's adapters now, by vLLM name: GPU slots, CPU tier, pinned,
        the tier's bytes and its byte budget (for /admin/adapters and the tests)."""
        tier = await self.engine.lora_residency()
        names = {t.lora_int_id: n for n, t in self.engine.adapters.targets.items()}

        def named(ids) -> list[str]:
            return sorted(names.get(i, str(i)) for i in ids)
        return {"replica_id": self.replica_id, "slots": named(tier.slots), "cpu": named(tier.cpu),
                "pinned": named(tier.pinned), "cpu_bytes": sum(tier.cpu_bytes.values()),
                "max_cpu_lora_bytes": self.engine.adapters.max_cpu_bytes, "known_slots": tier.known_slots}

    async def check_health(self) -> None:
        # Serve calls this every health_check_period_s; a replica that cannot produce a token
        # is replaced. Skip the probe when real traffic or a recent probe already proved it:
        # a busy engine answers a probe only after the prefills queued before it, and a
        # replica restarted for being busy would lose its whole prefix cache.
        if time.time() - self.engine.last_progress() > self.ready_probe_max_age_s / 2:
            await self.engine.probe()

    async def _free_deleted_adapters(self, period_s: float) -> None:
        # DELETE marks the catalog row; every replica notices here and frees its copy once the
        # requests still running with it finish. Polling keeps replicas free of any broadcast.
        # The database down: requests go on (they carry their AdapterTarget; blobs come from the
        # store); the poll says so once per outage and tries again each period. Pins travel the
        # same way; a replica that starts later pins at its first poll.
        from loraplex.db.unavailable import is_unavailable

        down = False
        while True:
            await asyncio.sleep(period_s)
            try:
                loaded = self.engine.adapters.loaded_ids()
                deleted = await asyncio.to_thread(self.catalog.deleted_among, loaded)
                if down:
                    logger.warning("the database is reachable again: checking for deleted adapters")
                down = False
                if deleted:
                    await self.engine.adapters.retire(deleted)
                # Pins travel the same way: the catalog's pinned versions of this replica's base,
                # loaded and pinned here (not on a dedicated replica: it runs no LoRA).
                if self.dedicated is None:
                    pinned = await asyncio.to_thread(self.catalog.pinned, self.base_model)
                    await self.engine.adapters.sync_pins([pinned_target(v) for v in pinned])
            except Exception as exc:
                if not is_unavailable(exc):
                    logger.exception("could not check for deleted or pinned adapters; retrying")
                elif not down:
                    down = True
                    logger.warning("cannot check for deleted adapters, the database is unavailable (%r); "
                                   "retrying every %g s", exc, period_s)

    def hand_back_running(self) -> None:
        """End every call running here with ReplicaStopping: their ingresses move them (generate)."""
        self.stopping = True
        for task in list(self.running):
            task.cancel()

    async def _hand_back_when_due(self, stopping: Callable[[], bool], clock: HandBackClock) -> None:
        while not clock.due(stopping(), time.monotonic()):
            await asyncio.sleep(HAND_BACK_POLL_S)
        logger.warning("Engine replica %s is stopping: handing %d running calls back to their ingresses "
                       "%.0f s into its graceful period", self.replica_id, len(self.running), clock.delay_s)
        while True:  # and any the fair queue dispatches later, until Serve ends the replica
            self.hand_back_running()
            await asyncio.sleep(HAND_BACK_POLL_S)

    async def __del__(self):
        # Serve calls this once no request runs here (or, a replica it stops, after the hand-back):
        # hand any call still running back to its ingress, before vLLM goes down under it.
        if getattr(self, "_hand_back", None) is not None:
            self._hand_back.cancel()
        self.hand_back_running()
        deadline = time.monotonic() + 5.0
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.publisher is not None:
            await asyncio.to_thread(self.publisher.stop)  # it may be waiting for this loop
            self.metrics.flush()  # what the last period added up
        self._free_deleted.cancel()
        await self.engine.shutdown()
        # After the engine: requests it ended on the way down are metered too.
        await asyncio.to_thread(self.ledger.close)


def pinned_target(v) -> AdapterTarget:
    """The AdapterTarget a replica loads a pinned catalog version (AdapterVersion) as."""
    return AdapterTarget(lora_name=v.lora_name, lora_int_id=v.id, tenant=v.tenant, name=v.name, sha256=v.sha256,
                         requested_as=f"{v.name}@{v.version}", version=v.version)


def engine_deployment(deployment: EngineDeploymentConfig, name: str = "Engine"):
    """Apply serve.deployment with the config's resources; the class stays plain for tests.
    `name`: another deployment of the same class (a dedicated replica, Merged-<adapter id>)."""
    # With `autoscaling`, Serve sizes the pool between its min and max replicas; a `deployments:`
    # entry's autoscaling_config (applied in place) replaces this one.
    scaling = ({"autoscaling_config": deployment.autoscaling} if deployment.autoscaling is not None
               else {"num_replicas": deployment.num_replicas})
    return serve.deployment(
        Engine,
        name=name,
        **scaling,
        max_ongoing_requests=deployment.max_ongoing_requests,
        health_check_period_s=deployment.health_check_period_s,
        health_check_timeout_s=deployment.health_check_timeout_s,
        # Serve stops routing to a stopping replica, waits for its running requests up to this
        # long, then calls __del__ (engine shutdown, ledger flush).
        graceful_shutdown_timeout_s=deployment.graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=1.0,
        max_queued_requests=deployment.max_queued_requests,
        ray_actor_options={"num_cpus": deployment.num_cpus, "num_gpus": deployment.num_gpus,
                           **({"resources": dict(deployment.resources)} if deployment.resources else {})},
        request_router_config=deployment.routing.request_router_config(TenantAffinityRouter),
    )
