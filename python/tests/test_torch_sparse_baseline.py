"""bench/torch_sparse_baseline.py: how --spawn waits for its ranks, its exit statuses and its JSON.

wait_for_ranks is tested on stand-in processes (no torch needed): a rank that fails while rank 0 still runs must be
noticed at once. The old loop, `while any(p.poll() is None ...)`, stopped polling at the first running process, so
it saw a later rank's failure only when rank 0 ended (or at --run-timeout). Exit statuses are sparsereduce-perf's:
1 failed run, 2 usage error, 3 wrong results (wrong results exited 1 before). End-to-end runs check that --spawn
succeeds through it with JSON fields named as perf's ("check" a boolean), that ranks that find wrong results exit
3, and that a sweep stopped by --run-timeout leaves the rows measured so far with "complete": false (the file was
left empty: rank 0 wrote it only at its end).

A stop signal to the --spawn process alone (SIGTERM here; SIGINT and SIGHUP alike) stops its ranks, removes the
rendezvous directory and exits 128 + the signal, leaving the rows so far in --json with "complete": false; killed
outright (SIGKILL), its ranks end by themselves (PR_SET_PDEATHSIG). The spawner used to die alone and the ranks ran
their sweep to its end (bench/spawn_stop_test.py runs the spawner with the test a child subreaper).

Sizes sweep as sparsereduce-perf's (-b/-e/-f, one row per size, --size the single-size sweep) and --overlap disjoint
places blocks as the C++ synthetic tensors do (block b is rank b % W's, each rank keeps density x W of its own).
"""

import importlib.util
import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "torch_sparse_baseline.py"
STOP_TEST = SCRIPT.parent / "spawn_stop_test.py"


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
    procs = [_rank(SLEEPS), _rank(SLEEPS), _rank("import sys, time; time.sleep(0.2); sys.exit(1)")]
    start = time.monotonic()
    assert baseline.wait_for_ranks(procs, run_timeout=60) == 1
    assert time.monotonic() - start < 20  # not the 60 s of rank 0's sleep
    assert all(p.returncode is not None for p in procs), "the other ranks were left running"
    err = capsys.readouterr().err
    assert "rank 2 failed (exit code 1)" in err
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


def test_a_rank_with_wrong_results_lets_the_others_finish_and_gives_3(baseline, capsys):
    # Exit 3 is a finished sweep with wrong results, not a failure: rank 0, still running, must not be killed (it
    # writes --json at its end), and the run exits 3.
    procs = [_rank("import sys, time; time.sleep(1); sys.exit(3)"), _rank("import sys; sys.exit(3)")]
    assert baseline.wait_for_ranks(procs, run_timeout=60) == 3
    assert [p.returncode for p in procs] == [3, 3]  # rank 0 exited by itself, not killed (-9)
    assert "failed" not in capsys.readouterr().err


def test_a_failure_outranks_wrong_results(baseline, capsys):
    procs = [_rank("import sys, time; time.sleep(0.5); sys.exit(3)"), _rank("import sys; sys.exit(1)")]
    assert baseline.wait_for_ranks(procs, run_timeout=60) == 1
    assert "rank 1 failed (exit code 1)" in capsys.readouterr().err


def test_exit_status_of_a_rank(baseline):
    assert baseline.exit_status([{"wrong": 0}, {"wrong": 0}]) == 0
    assert baseline.exit_status([{"wrong": None}]) == 0  # -c 0: nothing checked
    assert baseline.exit_status([{"wrong": 0}, {"wrong": 5}]) == 3
    assert baseline.exit_status([]) == 0


def test_help_and_usage_errors_give_the_exit_statuses(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "3 wrong results" in " ".join(done.stdout.split())
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", "--json", str(tmp_path / "no" / "r.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "cannot open for writing" in done.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", "-n", "0"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr


# A rank whose reference is off by one everywhere: it counts every element wrong (the sum itself is right).
WRONG_REFERENCE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("torch_sparse_baseline", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
real = module.make_dense
def off_by_one(args, rank, density, size, torch):
    out = real(args, rank, density, size, torch)
    return out + 1 if rank != args.rank else out  # the other ranks' inputs, as this rank rebuilds them
module.make_dense = off_by_one
sys.argv = sys.argv[1:]
sys.exit(module.main())
"""


def test_wrong_results_exit_3_and_are_in_the_json(baseline, tmp_path):
    import torch_required  # noqa: F401  (fails clearly without torch)
    out = tmp_path / "r.json"
    init = tmp_path / "rendezvous"
    procs = [subprocess.Popen([sys.executable, "-c", WRONG_REFERENCE, str(SCRIPT), "--rank", str(r),
                               "--world-size", "2", "--init-file", str(init), "--size", "16K", "-n", "1", "-w", "0",
                               "--timeout", "120"] + (["--json", str(out)] if r == 0 else []),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    assert baseline.wait_for_ranks(procs, run_timeout=180) == 3
    assert [p.returncode for p in procs] == [3, 3]
    assert "wrong elements" in procs[0].stderr.read()
    doc = json.loads(out.read_text())
    assert doc["complete"] is True
    assert doc["results"][0]["wrong"] > 0


def test_the_json_names_fields_as_perf_does(tmp_path):
    import torch_required  # noqa: F401  (fails clearly without torch)
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", "--size", "64K", "--density", "0.1,1",
                           "-n", "2", "-w", "1", "--run-timeout", "120", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["tool"] == "torch-sparse" and doc["world_size"] == 2 and doc["dtype"] == "float"
    assert (doc["iterations"], doc["warmup_iterations"], doc["complete"]) == (2, 1, True)
    assert doc["check"] is True  # a boolean, as perf's (it was the number 1)
    assert doc["transports"] == ["tcp"] and doc["block_size"] == 256 and doc["overlap"] == "random"
    assert [r["requested_density"] for r in doc["results"]] == [0.1, 1]  # tools/bench/tables.py reads it
    for r in doc["results"]:
        assert (r["size"], r["count"], r["wrong"]) == (65536, 16384, 0)
        assert 0 < r["density"] <= r["union_density"] <= 1
        assert r["time_us_min"] <= r["time_us_median"] <= r["time_us_max"]
        assert r["algbw"] > 0 and r["busbw"] > 0
        assert r["bytes_sent"] is None and r["bytes_received"] is None  # torch does not report them
        assert "union" not in r  # renamed union_density, as perf names it
    assert doc["results"][1]["density"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # each rewrite's temporary file was renamed


def test_a_run_stopped_by_the_run_timeout_leaves_its_rows(tmp_path):
    # Rank 0 wrote --json only at the end of its sweep and --run-timeout kills the ranks: the file was left empty.
    # It now holds the rows measured before the stop, with "complete": false. The sizes: the 4K row ends about 2 s
    # after the start (most of it importing torch); the sweep to 1G took 52 s on 2 cores, far beyond the 8 s allowed.
    import torch_required  # noqa: F401  (fails clearly without torch)
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", "-b", "4K", "-e", "1G", "-f", "4",
                           "--density", "0.01", "-n", "1", "-w", "0", "--run-timeout", "8", "--json", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "run exceeded --run-timeout 8 s" in done.stderr, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is False
    assert doc["check"] is True and doc["iterations"] == 1
    assert len(doc["results"]) >= 1, doc
    assert (doc["results"][0]["size"], doc["results"][0]["wrong"]) == (4096, 0)
    printed = [line for line in done.stdout.splitlines() if line and not line.startswith("#")]
    assert len(doc["results"]) >= len(printed) - 1  # a row is written before the next one starts


def test_sweep_sizes_are_perfs(baseline):
    # Each size the factor times the one before, rounded down to whole floats; a repeated size is skipped; the
    # sweep ends at -e.
    assert baseline.sweep_sizes(16384, 65536, 2) == [16384, 32768, 65536]
    assert baseline.sweep_sizes(1000, 5000, 1.3) == [1000, 1300, 1688, 2196, 2856, 3712, 4824]
    assert baseline.sweep_sizes(4, 12, 1.1) == [4, 8]  # 4.4, 4.84, ... round down to 4: skipped; 12.55 > 12
    assert baseline.sweep_sizes(4096, 4096, 2) == [4096]
    assert baseline.sweep_sizes(4096, 10000, 2) == [4096, 8192]
    assert baseline.sweep_sizes(1023, 1023, 2) == [1020]


def _usage_error(*options):
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", *options], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, (options, done.stdout, done.stderr)
    return done.stderr


def test_sweep_option_errors_exit_2_naming_the_option():
    assert "-b/--minbytes" in _usage_error("-b", "4X")
    assert "-e/--maxbytes" in _usage_error("-e", "1.5M")
    assert "-b/--minbytes <= -e/--maxbytes" in _usage_error("-b", "1M", "-e", "4K")
    for factor in ("1", "0.5", "nan", "x"):
        assert "-f/--stepfactor" in _usage_error("-f", factor)
    assert "--overlap" in _usage_error("--overlap", "sideways")
    assert "-b/--minbytes 2" in _usage_error("-b", "2")  # not one float
    assert "--size" in _usage_error("--size", "4K", "-e", "8K")  # --size is -b SIZE -e SIZE


def test_disjoint_blocks_are_dealt_round_robin(baseline):
    import torch_required  # noqa: F401  (fails clearly without torch)
    import argparse
    import torch
    args = argparse.Namespace(block_size=16, world_size=3, overlap="disjoint", seed=1)
    size = 64 * 16 * 4  # 64 blocks: ranks 0, 1, 2 own 22, 21, 21
    blocks = [baseline.nonzero_blocks(args, size, r, 0.1, torch).tolist() for r in range(3)]
    assert [len(b) for b in blocks] == [7, 6, 6]  # round(0.3 x 22), round(0.3 x 21)
    for r, b in enumerate(blocks):
        assert all(x % 3 == r for x in b) and len(set(b)) == len(b)
    full = [baseline.nonzero_blocks(args, size, r, 0.9, torch).tolist() for r in range(3)]
    assert sorted(sum(full, [])) == list(range(64))  # density x W capped at 1: each rank keeps all of its own


def test_spawn_sweeps_three_sizes_one_row_each(tmp_path):
    import torch_required  # noqa: F401  (fails clearly without torch)
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", "-b", "16K", "-e", "64K", "-f", "2",
                           "-c", "1", "--density", "0.1", "-n", "1", "-w", "0", "--run-timeout", "120",
                           "--json", str(out)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line and not line.startswith("#")]
    assert [(int(r[0]), int(r[1]), r[7]) for r in rows] == [(16384, 4096, "0"), (32768, 8192, "0"),
                                                            (65536, 16384, "0")]
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and doc["check"] is True
    assert [(r["size"], r["count"], r["wrong"]) for r in doc["results"]] == [(16384, 4096, 0), (32768, 8192, 0),
                                                                            (65536, 16384, 0)]


def test_disjoint_overlap_gives_the_expected_density(tmp_path):
    import torch_required  # noqa: F401  (fails clearly without torch)
    out = tmp_path / "r.json"
    # 2 ranks, 16 and 32 blocks: each rank owns half; 0.25 keeps half of its own, 0.9 is capped at all of them (1/W).
    done = subprocess.run([sys.executable, str(SCRIPT), "--spawn", "2", "-b", "16K", "-e", "32K",
                           "--overlap", "disjoint", "--density", "0.25,0.9", "-n", "1", "-w", "0",
                           "--run-timeout", "120", "--json", str(out)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a density above 0.5 is capped" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["overlap"] == "disjoint"
    got = [(r["size"], r["requested_density"], r["density"], r["union_density"], r["wrong"]) for r in doc["results"]]
    assert got == [(16384, 0.25, 0.25, 0.5, 0), (32768, 0.25, 0.25, 0.5, 0),
                   (16384, 0.9, 0.5, 1.0, 0), (32768, 0.9, 0.5, 1.0, 0)]


@pytest.fixture(scope="module")
def spawn_stop():
    spec = importlib.util.spec_from_file_location("spawn_stop_test", STOP_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The sweep: the 4K row about 2 s after the start (most of it importing torch); to 1G it takes some 50 s on 2 cores.
LONG_SWEEP = ["--spawn", "2", "-b", "4K", "-e", "1G", "-f", "4", "--density", "0.01", "-n", "1", "-w", "0"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_to_the_spawner_alone_ends_every_rank(spawn_stop, tmp_path, sig):
    # SIGTERM: the ranks stopped, the directory removed, exit 143 (it died alone: -15, the ranks ran on). SIGKILL:
    # the ranks end within seconds by themselves (they ran on). Both leave the rows so far, "complete": false.
    import torch_required  # noqa: F401  (fails clearly without torch)
    out = tmp_path / "r.json"
    result = spawn_stop.stop_spawner([sys.executable, str(SCRIPT), *LONG_SWEEP, "--json", str(out)], sig)
    summary = f"{result['status']} {result['rank_status']}\n{result['stdout']}\n{result['stderr']}"
    assert spawn_stop.problems(result, sig, out) == [], summary
    assert len(result["ranks"]) == 2, summary
    if sig == signal.SIGTERM:
        assert "stopped by signal 15 (SIGTERM): ranks stopped" in result["stderr"]
        assert result["dirs"] and all(d.startswith("/tmp/sparsereduce-torch-") for d in result["dirs"])
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and (doc["results"][0]["size"], doc["results"][0]["wrong"]) == (4096, 0)
