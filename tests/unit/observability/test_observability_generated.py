"""deploy/ holds what `python -m loraplex.observability serve_config.yaml` generates: a config
change without regenerating (or a hand edit) fails here."""
from pathlib import Path

import pytest

from loraplex.observability.generated import generated_files
from loraplex.observability.served import load_served

ROOT = Path(__file__).resolve().parents[3]
FILES = generated_files(load_served(ROOT / "serve_config.yaml"))


@pytest.mark.parametrize("rel", sorted(FILES))
def test_checked_in_file_matches_the_config(rel):
    path = ROOT / "deploy" / rel
    assert path.exists(), f"{path} missing: run `python -m loraplex.observability serve_config.yaml`"
    assert path.read_text() == FILES[rel], (
        f"{path} drifted from serve_config.yaml: run `python -m loraplex.observability serve_config.yaml`")
