"""Every implementation of the contract's Protocols is checked against them, signatures
included (names, parameter kinds and defaults, async or not), so no fake can drift from the
engine again (BenchmarkFakeEngine once had `list_models` while the Engine called `base_models`)."""
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from bench.fake_engine import BenchmarkFakeEngine, _NoAdapters
from loraplex import contract
from loraplex.admission.limiter import LocalBackend
from loraplex.admission.ray_backend import RayBackend
from loraplex.engine.config import EngineConfig
from loraplex.engine.loaded_adapters import LoadedAdapters
from loraplex.engine.vllm_engine import VLLMEngine
from loraplex.ingress.engine_client import ServeEngineClient
from loraplex.ingress.engine_pools import PooledEngineClient

ROOT = Path(__file__).resolve().parents[2]


def load(relative: str):
    """A test helper or script module by its path (they are not packages)."""
    name = "contract_check_" + relative.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / relative)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses look their module up
        sys.path.insert(0, str((ROOT / relative).parent))  # its own siblings (fake_engine, ...)
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str((ROOT / relative).parent))
    return sys.modules[name]


FakeEngineClient = load("tests/unit/ingress/fake_engine.py").FakeEngineClient
SlowEngine = load("tests/unit/ingress/test_limits_routes.py").SlowEngine
ScriptedEngine = load("tests/unit/ingress/test_ingress_metrics.py").ScriptedEngine
VLLMEngineOverFakeVLLM = load("tests/unit/engine/test_engine_replica.py").VLLMEngineOverFakeVLLM
InstantFakeEngine = load("bench/scenarios/metrics.py").InstantFakeEngine


def members(protocol) -> dict[str, object]:
    """The Protocol's methods (with __init__) and its annotated attributes."""
    out = {name: value for name, value in vars(protocol).items()
           if callable(value) and (not name.startswith("_") or name == "__init__")
           and getattr(value, "__qualname__", "").startswith(protocol.__name__ + ".")}  # not typing's own __init__
    for name in protocol.__annotations__:
        out.setdefault(name, None)
    return out


def kind(fn) -> str:
    if inspect.iscoroutinefunction(fn):
        return "async"
    if inspect.isasyncgenfunction(fn):
        return "asyncgen"
    return "sync"


def mismatches(impl: type, protocol) -> list[str]:
    problems = []
    for name, spec in members(protocol).items():
        if spec is None:  # an attribute: checked on instances
            continue
        got = getattr(impl, name, None)
        if got is None or not callable(got):
            problems.append(f"{impl.__name__} has no {name}()")
            continue
        want_kind, got_kind = kind(spec), kind(got)
        # `def f() -> AsyncIterator` in the Protocol: a plain function returning one, or an async generator.
        returns_iter = "AsyncIterator" in str(inspect.signature(spec).return_annotation)
        if want_kind != got_kind and not (returns_iter and got_kind in ("sync", "asyncgen")):
            problems.append(f"{impl.__name__}.{name} is {got_kind}, the Protocol's is {want_kind}")
        want = list(inspect.signature(spec).parameters.values())
        have = list(inspect.signature(got).parameters.values())
        for i, p in enumerate(want):
            q = have[i] if i < len(have) else None
            if q is None or q.name != p.name or q.kind != p.kind:
                problems.append(f"{impl.__name__}.{name}: parameter {i} is {q and q.name!r}, the Protocol's {p.name!r}")
            elif (p.default is inspect.Parameter.empty) != (q.default is inspect.Parameter.empty):
                problems.append(f"{impl.__name__}.{name}({p.name}): default differs from the Protocol's")
        for q in have[len(want):]:
            if q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
                problems.append(f"{impl.__name__}.{name}: extra required parameter {q.name!r}")
    return problems


# Every engine implementation: the real one, the benchmarks' fake, and their subclasses in the
# unit tests (VLLMEngine over a fake vLLM) and bench_metrics (counting through record_output).
ENGINES = [VLLMEngine, VLLMEngineOverFakeVLLM, BenchmarkFakeEngine, InstantFakeEngine]


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_every_engine_implements_the_engine_protocol(cls):
    assert mismatches(cls, contract.EngineBackend) == []
    engine = cls(EngineConfig(model="m", engine_kwargs={"benchmark_token_interval_s": 0}))
    for attr in contract.EngineBackend.__annotations__:
        assert hasattr(engine, attr), f"{cls.__name__} instances have no {attr}"


@pytest.mark.parametrize("cls", [LoadedAdapters, _NoAdapters], ids=lambda c: c.__name__)
def test_adapters_implement_the_adapters_protocol(cls):
    assert mismatches(cls, contract.EngineAdapters) == []


@pytest.mark.parametrize("cls", [ServeEngineClient, PooledEngineClient, FakeEngineClient, SlowEngine, ScriptedEngine],
                         ids=lambda c: c.__name__)
def test_engine_clients_implement_the_client_protocol(cls):
    assert mismatches(cls, contract.EngineClient) == []


@pytest.mark.parametrize("cls", [LocalBackend, RayBackend], ids=lambda c: c.__name__)
def test_limiter_backends_implement_the_backend_protocol(cls):
    assert mismatches(cls, contract.LimiterBackend) == []


def test_the_checker_catches_a_drifted_fake():
    class Drifted:
        adapters = None
        probes_done = 0

        def __init__(self, config, replica_id="", adapter_store=None, metrics=None):
            pass

        async def list_models(self):  # the old drift: base_models renamed
            return {}

        async def probe(self):  # the timeout parameter lost
            return 0.0

        def start(self):  # not async
            pass

    problems = mismatches(Drifted, contract.EngineBackend)
    assert "Drifted has no base_models()" in problems
    assert any("probe: parameter 1" in p for p in problems)
    assert "Drifted.start is sync, the Protocol's is async" in problems
