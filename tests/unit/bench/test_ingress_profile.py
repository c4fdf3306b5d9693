from bench.ingress.profile import summarise


def test_summarise_shares_samples_by_function_inclusive_and_self(tmp_path):
    collapsed = tmp_path / "ingress.txt"
    collapsed.write_text(
        "handle (starlette/routing.py:10);authenticate (loraplex/ingress/auth.py:20) 3\n"
        "handle (starlette/routing.py:10);admit (loraplex/admission/limiter.py:5) 1\n")
    rows = {f: (own, inclusive) for f, own, inclusive in summarise(collapsed)}
    assert rows["handle (routing.py)"] == (0.0, 1.0)
    assert rows["authenticate (auth.py)"] == (0.75, 0.75)
    assert rows["admit (limiter.py)"] == (0.25, 0.25)
    assert list(rows)[0] == "handle (routing.py)"  # largest inclusive share first


def test_summarise_of_an_empty_recording_is_empty(tmp_path):
    (tmp_path / "idle.txt").write_text("")
    assert summarise(tmp_path / "idle.txt") == []
