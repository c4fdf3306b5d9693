"""bench/processes.py, the lifecycle under every `serve run` of the benchmarks and e2e tests: a
stop ends the process and every child it left (by the mark), and nothing else."""
import subprocess
import sys
import time
import uuid

from bench.processes import marked, start_marked, stop_marked

# A parent that ignores SIGINT and SIGTERM (as a wedged serve run) and leaves a child in a new
# session (as Ray's raylet does), so only the mark finds it.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
time.sleep(60)
"""


def test_stop_kills_the_process_and_what_it_left_by_mark(tmp_path):
    mark = ("LORAPLEX_TEST_PROCESSES", uuid.uuid4().hex)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = start_marked([sys.executable, "-c", STUBBORN], mark=mark, log_path=tmp_path / "log", cwd=tmp_path)
    try:
        deadline = time.monotonic() + 20
        while len(marked(*mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(marked(*mark)) == 2
        assert proc.run_mark == mark[1]
        stop_marked(proc, mark, grace_s=0.5, term_s=0.5)
        assert proc.poll() is not None
        assert marked(*mark) == []
        assert bystander.poll() is None  # unmarked: left alone
    finally:
        bystander.kill()
        bystander.wait()


def test_a_started_process_gets_sigint_back(tmp_path):
    """A background job inherits SIGINT ignored; serve run stops on SIGINT only."""
    mark = ("LORAPLEX_TEST_PROCESSES", uuid.uuid4().hex)
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    proc = start_marked([sys.executable, "-c", code], mark=mark, log_path=tmp_path / "log", cwd=tmp_path)
    proc.wait(timeout=20)
    assert (tmp_path / "log").read_text().strip() == "True"
