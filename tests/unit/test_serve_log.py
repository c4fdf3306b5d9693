"""Serve's replica log handler keeps its file across vLLM's logging setup (serve_log.py): the
handler Serve's controller asks for the file after a restart; without its target the recovering
controller replaced every Engine replica (found by `python -m bench drill --drills controller`)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_memory_handler_keeps_its_file_through_every_dict_config_after(tmp_path):
    # In a child process: dictConfig closes every handler of the process it runs in.
    script = textwrap.dedent(f"""
        import logging, logging.config, logging.handlers
        from loraplex.serve_log import keep_serve_log_open

        def serve_like_logger(name):
            log = logging.getLogger(name)
            target = logging.FileHandler({str(tmp_path)!r} + "/" + name + ".log")
            log.addHandler(logging.handlers.MemoryHandler(1, target=target))
            log.setLevel(logging.INFO)
            return log

        kept, lost = serve_like_logger("ray.serve"), serve_like_logger("other")
        vllm_like = {{"version": 1, "disable_existing_loggers": False,
                      "handlers": {{"vllm": {{"class": "logging.StreamHandler"}}}},
                      "loggers": {{"vllm": {{"handlers": ["vllm"], "level": "INFO"}}}}}}
        keep_serve_log_open()
        logging.config.dictConfig(vllm_like)  # vLLM's import
        kept.info("between")
        logging.config.dictConfig(vllm_like)  # its engine's start
        for log in (kept, lost):
            log.info("after vLLM's import")
            print(log.handlers[0].target is not None)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT / "platform")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]  # only Serve's keeps its target
    assert (tmp_path / "ray.serve.log").read_text().split("\n")[:2] == ["between", "after vLLM's import"]
    assert "after vLLM's import" not in (tmp_path / "other.log").read_text()
