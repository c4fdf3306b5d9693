"""The files generated from a serve config, by path under deploy/: written by
`python -m loraplex.observability [serve_config.yaml] [--out deploy]`, compared with the
checked-in ones by tests/unit/observability/test_generated_files.py."""
from pathlib import Path

from loraplex.observability.dashboard import render_dashboard
from loraplex.observability.rule_tests import render_rule_tests
from loraplex.observability.rules import render_rules
from loraplex.observability.served import ServedPlatform

RULES = "prometheus/rules.yml"
RULE_TESTS = "prometheus/rules.test.yml"   # names rules.yml next to it
DASHBOARD = "grafana/loraplex.json"


def generated_files(served: ServedPlatform) -> dict[str, str]:
    return {RULES: render_rules(served), RULE_TESTS: render_rule_tests(served), DASHBOARD: render_dashboard(served)}


def write_generated(served: ServedPlatform, out: Path) -> list[Path]:
    written = []
    for rel, text in generated_files(served).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
