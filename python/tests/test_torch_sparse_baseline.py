"""bench/torch_sparse_baseline.py --spawn: how it waits for its ranks.

wait_for_ranks is tested on stand-in processes (no torch needed): a rank that fails while rank 0 still runs must be
noticed at once. The old loop, `while any(p.poll() is None ...)`, stopped polling at the first running process, so
it saw a later rank's failure only when rank 0 ended (or at --run-timeout). One end-to-end run checks that --spawn
still succeeds through it.
"""

import importlib.util
import pathlib
import subprocess
import sys
import time

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "torch_sparse_baseline.py"


@pytest.fixture(scope="module")
def baseline():
    spec = importlib.util.spec_from_file_location("torch_sparse_baseline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rank(code):
    return subprocess.Popen([sys.executable, "-c", code])


SLEEPS = "import time; time.sleep(60)"


def test_a_later_rank_failing_stops_the_others_at_once(baseline, capsys):
    procs = [_rank(SLEEPS), _rank(SLEEPS), _rank("import sys, time; time.sleep(0.2); sys.exit(3)")]
    start = time.monotonic()
    assert baseline.wait_for_ranks(procs, run_timeout=60) == 1
    assert time.monotonic() - start < 20  # not the 60 s of rank 0's sleep
    assert all(p.returncode is not None for p in procs), "the other ranks were left running"
    err = capsys.readouterr().err
    assert "rank 2 failed (exit status 3)" in err
    assert "rank 0 failed" not in err and "rank 1 failed" not in err  # the ones it stopped are not blamed


def test_a_rank_killed_by_a_signal_is_named(baseline, capsys):
    procs = [_rank(SLEEPS), _rank("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")]
    assert baseline.wait_for_ranks(procs, run_timeout=60) == 1
    assert "rank 1 failed (killed by signal 9 (SIGKILL))" in capsys.readouterr().err
    assert procs[0].returncode is not None


def test_ranks_that_all_succeed_give_zero(baseline, capsys):
    procs = [_rank("import time; time.sleep(0.3)"), _rank("pass")]
    assert baseline.wait_for_ranks(procs, run_timeout=60) == 0
    assert [p.returncode for p in procs] == [0, 0]
    assert capsys.readouterr().err == ""


def test_the_run_timeout_stops_every_rank(baseline, capsys):
    procs = [_rank(SLEEPS), _rank(SLEEPS)]
    start = time.monotonic()
    assert baseline.wait_for_ranks(procs, run_timeout=0.5) == 1
    assert time.monotonic() - start < 20
    assert all(p.returncode is not None for p in procs)
    assert "run exceeded --run-timeout 0.5 s" in capsys.readouterr().err


def test_spawn_runs_two_ranks(tmp_path):
    import torch_required  # noqa: F401  (fails clearly without torch)
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", "--size", "64K", "-n", "1", "-w", "0",
                           "--run-timeout", "120", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"wrong": 0' in out.read_text()
