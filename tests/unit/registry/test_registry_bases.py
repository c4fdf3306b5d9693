"""Adapters bound to the base they were trained on (issue 35): which base an upload is bound to,
and that it is validated against that base's shapes."""

from __future__ import annotations

import pytest
from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter

from loraplex.registry.config import RegistryConfig
from loraplex.db.engine import make_engine
from loraplex.registry.bases import BaseMismatch, ServedBase, ServedBases, UnknownBase
from loraplex.registry.catalog import AdapterCatalog
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.registry import AdapterRegistry
from loraplex.registry.store import AdapterStore
from loraplex.registry.validator import AdapterValidator, InvalidAdapter

# A second base of other shapes: a smaller llama.
TINY_CONFIG = {**SMOLLM2_CONFIG, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2}
SMALL, TINY = "SmolLM2-135M-Instruct", "tiny-llama"


def served(name: str, model: str, config: dict) -> ServedBase:
    return ServedBase(name, model, AdapterValidator(BaseModelSpec.from_config(config, name), max_lora_rank=16))


@pytest.fixture
def bases() -> ServedBases:
    return ServedBases([served(SMALL, "/models/SmolLM2-135M-Instruct", SMOLLM2_CONFIG),
                        served(TINY, "acme/tiny-llama-v1", TINY_CONFIG)])


@pytest.fixture
def registry(tmp_path, bases) -> AdapterRegistry:
    cfg = RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))
    return AdapterRegistry(cfg, bases, AdapterStore(cfg), AdapterCatalog(make_engine(f"sqlite:///{tmp_path}/db")))


def adapter_for(tmp_path, name: str, config: dict, claim: str | None) -> str:
    spec = BaseModelSpec.from_config(config, name)
    src = write_adapter(tmp_path / f"{name}-{claim}", lora_config(r=4, base_model_name_or_path=claim),
                        lora_tensors(spec, r=4))
    return tar_dir(src, tmp_path / f"{name}-{claim}.tar.gz")


@pytest.mark.parametrize("claim,expected", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", SMALL),  # the HF id's last part is the base's name
    ("/home/me/ckpt/SmolLM2-135M-Instruct/", SMALL),  # a path on the trainer's disk
    ("acme/tiny-llama-v1", TINY),  # the base's HF id
    ("tiny-llama", TINY),  # its name
])
def test_the_archives_claim_picks_its_base(bases, claim, expected):
    assert bases.choose(None, claim, None, "bot").name == expected


def test_the_explicit_field_wins_and_an_unknown_base_is_a_400_listing_the_bases(bases):
    assert bases.choose(TINY, "HuggingFaceTB/SmolLM2-135M-Instruct", None, "bot").name == TINY
    with pytest.raises(UnknownBase, match="'gpt-9' is not a base model.*SmolLM2-135M-Instruct, tiny-llama") as err:
        bases.choose("gpt-9", None, None, "bot")
    assert err.value.status == 400 and err.value.param == "base_model"


def test_without_a_claim_the_names_base_or_the_only_base_else_a_400_asking_which(bases):
    assert bases.choose(None, "my-own-run", TINY, "bot").name == TINY
    one = ServedBases([bases.default])
    assert one.choose(None, None, None, "bot").name == SMALL
    with pytest.raises(UnknownBase, match="Say which base model `bot` was trained on.*`base_model`"):
        bases.choose(None, "my-own-run", None, "bot")


def test_a_names_versions_stay_on_one_base(bases):
    with pytest.raises(BaseMismatch, match="`bot` is bound to the base model tiny-llama") as err:
        bases.choose(SMALL, None, TINY, "bot")
    assert err.value.status == 409


def test_an_upload_is_validated_against_its_bases_shapes_and_bound_to_it(registry, tmp_path):
    v = registry.upload("acme", "small-bot", adapter_for(tmp_path, SMALL, SMOLLM2_CONFIG, "HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert v.base_model == SMALL
    t = registry.upload("acme", "tiny-bot", adapter_for(tmp_path, TINY, TINY_CONFIG, None), base_model=TINY)
    assert t.base_model == TINY and registry.resolve("acme", "tiny-bot").base_model == TINY
    # Tiny's shapes claimed for the other base: 422 naming the shapes, nothing stored.
    with pytest.raises(InvalidAdapter, match="SmolLM2-135M-Instruct"):
        registry.upload("acme", "mixed", adapter_for(tmp_path, TINY, TINY_CONFIG, "x"), base_model=SMALL)
    # A new version of tiny-bot for the other base: 409, the old version stays.
    with pytest.raises(BaseMismatch):
        registry.upload("acme", "tiny-bot", adapter_for(tmp_path, SMALL, SMOLLM2_CONFIG, None), base_model=SMALL)
    assert [(x.name, x.base_model) for x in registry.list("acme")] == [("small-bot", SMALL), ("tiny-bot", TINY)]


def test_an_unknown_base_is_refused_before_the_archive_is_read(registry, tmp_path):
    with pytest.raises(UnknownBase):
        registry.upload("acme", "bot", tmp_path / "never-read.tar.gz", base_model="gpt-9")
