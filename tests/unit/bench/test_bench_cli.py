"""`python -m bench` (bench/cli.py, bench/report.py): the scenario registry matches bench/scenarios/ and the
old scripts' aliases, every scenario parses its options, and one output: the printed markdown table and
the --json file hold the same rows."""
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli
from bench.report import Column, Output, Table

ROOT = Path(__file__).resolve().parents[3]
MODULES = sorted(p.stem for p in (ROOT / "bench" / "scenarios").glob("*.py") if p.stem != "__init__")
ALIAS = re.compile(r'#!/usr/bin/env python\nimport os, sys; os\.execv\(sys\.executable, \[sys\.executable, '
                   r'os\.path\.join\(os\.path\.dirname\(os\.path\.abspath\(__file__\)\), "bench"\), "(\w+)", '
                   r'\*sys\.argv\[1:\]\]\)  # alias of scripts/bench \1\n')


def test_the_registry_is_the_scenarios_package():
    assert sorted(cli.SCENARIOS) == MODULES


@pytest.mark.parametrize("name", MODULES)
def test_each_scenario_parses_its_defaults_and_the_shared_json_option(name, tmp_path):
    parser, module = cli.scenario_parser(name)
    assert callable(module.run) and module.__doc__
    args = parser.parse_args(["--json", str(tmp_path / "x.json")])
    assert args.json == tmp_path / "x.json"
    assert parser.parse_args([]).json is None  # JSON only when asked


def test_old_script_names_are_one_line_aliases_of_a_scenario():
    aliases = {p.name: p.read_text() for p in (ROOT / "scripts").iterdir()
               if p.name.startswith("bench_") or p.name in ("drill.py", "route_sim.py", "loadtest")}
    assert len(aliases) == 20
    for name, text in aliases.items():
        m = ALIAS.fullmatch(text)
        assert m, f"scripts/{name} is not a one-line alias"
        assert m.group(1) in cli.SCENARIOS, name


def test_an_alias_runs_the_entry_point():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_admission.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m bench admission")


def test_usage_and_unknown_scenarios(capsys):
    assert cli.main([]) == 2
    listing = capsys.readouterr().out
    assert all(f"  {name} " in listing for name in cli.SCENARIOS)
    assert cli.main(["--help"]) == 0
    capsys.readouterr()
    assert cli.main(["bench_fairness"]) == 2
    assert "no scenario 'bench_fairness'" in capsys.readouterr().err


def test_table_markdown_formats_aligns_and_dashes_missing_values():
    t = Table("t", [("case", "case"), ("n", "n", "{:d}"), ("ms", "ms", "{:.1f}"), Column("note", "note", right=True)])
    t.add(case="a", n=3, ms=1.25, note="x")
    t.add(case="b", n=None, ms=float("nan"))
    t.add(case="b / a", ms="0.50x")  # a ratio row: its cells as written
    assert t.markdown().splitlines() == ["| case | n | ms | note |", "|---|---:|---:|---:|",
                                         "| a | 3 | 1.2 | x |", "| b | - | - | - |", "| b / a | - | 0.50x | - |"]
    assert t.to_json()["rows"][1] == {"case": "b", "n": None, "ms": None}  # NaN is not JSON


def test_json_holds_the_printed_rows_raw_and_no_secrets(tmp_path, capsys):
    out = Output("demo", ["--admin-token", "s3cret", "--api-key=k3y", "--tokens", "5"])
    out.table(Table("the title", [("case", "case"), ("us", "p50 us", "{:.1f}")], [{"case": "x", "us": 1.2345}]))
    out.note("a verdict")
    out.data["records"] = [{"v": math.inf}]
    out.write_json(tmp_path / "d" / "out.json")
    printed = capsys.readouterr().out
    assert "the title\n\n| case | p50 us |\n|---|---:|\n| x | 1.2 |\n" in printed and "a verdict" in printed
    doc = json.loads((tmp_path / "d" / "out.json").read_text())
    assert doc["scenario"] == "demo" and doc["notes"] == ["a verdict"] and doc["data"] == {"records": [{"v": None}]}
    assert doc["tables"] == [{"title": "the title", "columns": [{"key": "case", "header": "case"},
                                                                {"key": "us", "header": "p50 us"}],
                              "rows": [{"case": "x", "us": 1.2345}]}]
    assert doc["argv"] == ["--admin-token", "<redacted>", "--api-key=<redacted>", "--tokens", "5"]


def test_a_scenario_end_to_end_prints_its_table_and_writes_the_same_rows(tmp_path, capsys):
    """admission --local: the real limiter with in-process state, no Ray, a few requests."""
    path = tmp_path / "admission.json"
    assert cli.main(["admission", "--local", "--requests", "20", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(path.read_text())
    (table,) = doc["tables"]
    assert [r["case"] for r in table["rows"]] == ["no limits", "limits, leased (production)",
                                                   "limits, a round trip each"]
    for row in table["rows"]:
        assert f"| {row['case']} | {row['n']} | {row['p50_us']:.1f} | {row['p99_us']:.1f} |" in printed
    assert doc["argv"] == ["--local", "--requests", "20", "--json", str(path)]


def doc_commands() -> list[tuple[str, list[str]]]:
    """Every `python -m bench ...` in README.md and docs/*.md: in code blocks (continued lines joined,
    comments cut) and in `inline code`."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
        lines = [line.split(" #")[0] for b in blocks for line in b.replace("\\\n", " ").splitlines()]
        lines += re.findall(r"`([^`\n]*python -m bench [^`\n]*)`", text)
        found += [(page.name, shlex.split(line.split("python -m bench ", 1)[1]))
                  for line in lines if "python -m bench " in line and "python -m bench SCENARIO" not in line]
    return found


def test_every_command_the_docs_show_parses():
    commands = doc_commands()
    assert len(commands) > 30 and {argv[0] for _, argv in commands} == set(cli.SCENARIOS)
    for page, argv in commands:
        parser, _ = cli.scenario_parser(argv[0])
        try:
            parser.parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{page}: python -m bench {shlex.join(argv)} does not parse")
