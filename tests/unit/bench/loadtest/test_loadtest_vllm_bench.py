import json

from bench.loadtest import vllm_bench
from bench.loadtest.workload import RequestSpec, Tenant, Workload


def test_the_dataset_holds_the_base_requests_with_their_system_prompts_and_lengths(tmp_path):
    w = Workload([Tenant("t0", "You are terse."), Tenant("t1", "")], [(0, 0)],
                 [RequestSpec(0, 0, None, "hi?", 7), RequestSpec(1, 0, 0, "on an adapter", 5),
                  RequestSpec(2, 1, None, "no system", 3)], "test", True)
    path = tmp_path / "d.json"
    assert vllm_bench.write_dataset(w, path) == 2
    rows = json.loads(path.read_text())
    assert [[t["value"] for t in r["conversations"]] for r in rows] == [
        ["You are terse.\n\nhi?", " the" * 7], ["no system", " the" * 3]]


def test_the_table_puts_both_tools_side_by_side():
    lt = {"output_tokens_per_s": 50.0, "ttft_p50": 1.5, "tpot_p50": 0.05}
    vb = {"requests": 8, "completed": 8, "concurrency": 4, "output_tokens_per_s": 40.0, "ttft_p50": 2.0,
          "tpot_p50": 0.06}
    row = vllm_bench.table({"loraplex": (lt, vb)}).splitlines()[-1]
    assert row == "| loraplex | 4 | 50.0 | 40.0 | 1.250x | 1.50 | 2.00 | 50.0 | 60.0 | 8/8 |"
