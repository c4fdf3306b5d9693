"""docs/config.md is what `python -m loraplex.config_docs` prints from PlatformConfig's fields today:
a Field description changed without regenerating fails here."""
from pathlib import Path

from loraplex import config_docs

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_is_generated_from_the_config_models():
    assert DOC.read_text() == config_docs.render(), f"docs/config.md is stale: run `{config_docs.COMMAND}`"


def test_every_field_of_every_section_is_in_the_reference():
    text = config_docs.render()
    for model, path in config_docs._sections(config_docs.PlatformConfig).items():
        assert f"## {config_docs._title(path, model)}" in text
        assert all(f"| `{name}` |" in text for name in model.model_fields)
