"""cpu_load: the other work that --bare-with-load runs next to bare vLLM."""

import os
import time

import pytest

from bench.loadtest.cpu_load import PROCESSES, cpu_load


def test_it_takes_cpu_and_leaves_no_process_behind():
    with cpu_load(0.4) as load:
        assert all(os.path.exists(f"/proc/{pid}") for pid in load["pids"])
        time.sleep(1.0)
    assert load["cores_used"] > 0
    assert not any(os.path.exists(f"/proc/{pid}") for pid in load["pids"])


@pytest.mark.parametrize("cores", [0, PROCESSES])
def test_a_load_that_is_no_duty_cycle_is_refused(cores):
    with pytest.raises(ValueError, match="duty cycle"):
        with cpu_load(cores):
            pass


@pytest.mark.parametrize("cores", ["0", "-1", "4"])
def test_the_cli_refuses_a_load_it_cannot_make_before_starting_anything(cores):
    from bench.loadtest import cli

    with pytest.raises(SystemExit, match="--bare-with-load is a number of cores"):
        cli.main(["--bare-only", "--bare-with-load", cores])
