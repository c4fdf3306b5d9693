"""docs/examples/requests.jsonl, docs/batch.md's sample batch, is a file the upload accepts, on a base
model the shipped serve_config.yaml serves (issue 46: a newcomer pastes it as it is)."""

from pathlib import Path

from loraplex.batches.config import BatchConfig
from loraplex.batches.jsonl import endpoints_of, parse_batch_file
from loraplex.observability.served import load_served

ROOT = Path(__file__).resolve().parents[3]


def test_the_sample_batch_passes_the_upload_checks_on_the_default_base():
    config = BatchConfig()
    lines = parse_batch_file((ROOT / "docs/examples/requests.jsonl").read_bytes(), config.max_lines,
                             config.max_line_bytes)
    assert len(lines) >= 2 and endpoints_of(lines) == {"/v1/chat/completions"}  # what openai_batch.py starts
    served = load_served(ROOT / "serve_config.yaml").config
    assert {line.body["model"] for line in lines} == {served.engine.model_id}
