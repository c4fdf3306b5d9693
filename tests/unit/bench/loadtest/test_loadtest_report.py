"""The Markdown tables and the plot."""
from decimal import Decimal

from bench.loadtest import report
from bench.loadtest.stats import SLO, capacity, cost_summary

PNG = b"\x89PNG\r\n\x1a\n"


def lv(c, tok, ttft, tpot, failed=0):
    return {"level": c, "requests": 8, "ok": 8 - failed, "failed": failed, "error_rate": failed / 8,
            "requests_per_s": tok / 10, "output_tokens_per_s": tok, "total_tokens_per_s": tok * 3,
            "ttft_p50": ttft / 2, "ttft_p95": ttft, "tpot_p50": tpot / 2, "tpot_p95": tpot, "e2e_p50": 1.0,
            "peak_tokens_per_s": tok * 4, "utilization": 0.75, "mean_in_flight": c}


LEVELS = [lv(1, 10.0, 0.2, 0.02), lv(2, 18.0, 0.4, 0.03), lv(4, 30.0, 1.5, 0.06)]
SLO_ = SLO(1.0, 0.05)


def test_curve_table_says_why_a_level_misses():
    t = report.curve_table(LEVELS, SLO_)
    rows = t.splitlines()
    assert rows[0].startswith("| concurrency | requests | failed | requests/s | output tok/s | TTFT P50 s | TTFT P95 s")
    assert len(rows) == 5 and rows[2].endswith("| yes |")
    assert "no (TTFT P95 1.500 s > 1.0 s; TPOT P95 0.060 s > 0.05 s)" in rows[4]
    assert "| 20.0 | 30.0 |" not in t and "| 30.0 |" in t and "| 30.0 | 60.0 |" in rows[4]  # TPOT in ms


def test_capacity_lines():
    cap = capacity(LEVELS, SLO_)
    lines = "\n".join(report.capacity_lines(cap, cost_summary(cap["at"], Decimal("2"), 1, 5, 2), 5, "concurrency"))
    assert "**2**" in lines and "`max_num_seqs` to set: **2**" in lines and "replicas for a peak of 5" in lines
    assert "**3**" in lines  # ceil(5 / 2)
    every = capacity(LEVELS[:2], SLO_)
    assert "at least **2**" in "\n".join(report.capacity_lines(every, None, None, "concurrency"))
    none = capacity([lv(1, 1.0, 9.0, 9.0)], SLO_)
    assert "capacity: none" in report.capacity_lines(none, None, None, "concurrency")[0]


def test_comparison_and_lora_tables():
    other = [lv(1, 20.0, 0.1, 0.01), lv(2, 20.0, 0.3, 0.02)]
    t = report.comparison_table("loraplex", LEVELS, "vllm", other, "concurrency")
    assert "| 1 | 10.0 | 20.0 | 0.500x |" in t and "| 2 | 18.0 | 20.0 | 0.900x |" in t
    assert len(t.splitlines()) == 4  # level 4 has no counterpart
    runs = {"loraplex": {"base": [lv(16, 10.0, 1, 0.1)], "8": [lv(16, 9.0, 1, 0.1)]},
            "vllm": {"base": [lv(16, 10.0, 1, 0.1)], "8": [lv(16, 9.5, 1, 0.1)]}}
    t = report.lora_table(runs)
    assert "| 8 | 9.0 | 0.900x |" in t and t.splitlines()[-1].endswith("| 0.947x |")


def test_plot_is_a_png_with_or_without_slo_lines(tmp_path):
    out = report.plot({"loraplex": LEVELS, "vllm": LEVELS[:2]}, SLO_, tmp_path / "curve.png")
    assert out == tmp_path / "curve.png" and out.read_bytes()[:8] == PNG
    report.plot({"x": LEVELS}, SLO(None, None), tmp_path / "p.png", "rate")
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG


def test_the_ratio_table_puts_each_target_against_each_bare_vllm_on_the_same_workload():
    def lv(tok_s, ttft, level=16):
        return {"level": level, "output_tokens_per_s": tok_s, "ttft_p50": ttft, "tpot_p50": 0.1}
    results = {"loraplex": {"base r0 cold": {"levels": [lv(120.0, 1.0)]}, "base r0 warm": {"levels": [lv(90.0, 2.0)]}},
               "vllm-defaults": {"base r0 cold": {"levels": [lv(100.0, 2.0)]}, "base r0 warm": {"levels": [lv(100.0, 1.0)]}},
               "vllm-same-args": {"base r0 cold": {"levels": [lv(60.0, 4.0)]}}}
    table = report.ratio_table(results, ["vllm-defaults", "vllm-same-args"])
    lines = table.splitlines()
    assert "out tok/s / vllm-defaults" in lines[0] and "TTFT P50 / vllm-same-args" in lines[0]
    assert "| base r0 cold | loraplex | 120.0 | 1.00 | 100.0 | 1.200x | 0.500x | 2.000x | 0.250x |" in lines
    assert "| base r0 warm | loraplex | 90.0 | 2.00 | 100.0 | 0.900x | 2.000x | - | - |" in lines
