"""The demo adapters trained in the background while the unit tests run: trained_adapter waits
for that training instead of starting its own, and trains itself when there is none."""

import threading
import time

import bench.demo_adapters as demo


def test_trained_adapter_waits_for_the_background_training(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    for recipe in ("pirate", "banana"):
        (tmp_path / "recipes" / f"{recipe}.jsonl").write_text(f"{recipe}\n")
    monkeypatch.setattr(demo, "RECIPES", tmp_path / "recipes")
    monkeypatch.setattr(demo, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(demo, "_background", None)
    trained, release = [], threading.Event()

    def fake_train(recipe, threads=None):
        release.wait(5)
        trained.append((recipe, threads, threading.current_thread().name))
        demo.CACHE.mkdir(exist_ok=True)
        demo.cached_archive(recipe).write_bytes(b"archive")
    monkeypatch.setattr(demo, "_train", fake_train)

    demo.train_in_background(["pirate", "banana"])
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    assert demo.trained_adapter("banana").read_bytes() == b"archive"
    assert time.monotonic() - started >= 0.15  # it waited for the background thread
    assert trained == [("pirate", 1, "demo-adapters"), ("banana", 1, "demo-adapters")]  # trained once each

    (tmp_path / "recipes" / "new.jsonl").write_text("new\n")
    assert demo.trained_adapter("new").exists()  # no background training of it: trained here
    assert trained[-1][0] == "new" and trained[-1][2] != "demo-adapters"
