"""Fixtures shared by the Python tests: a real aggregator daemon from this build and rank threads.

ctest sets SPARSEREDUCE_AGGREGATOR_BIN and PYTHONPATH (python/CMakeLists.txt). Every wait is bounded: the daemon
must write its port file within STARTUP_S, rank threads must finish within their deadline.
"""

import contextlib
import itertools
import os
import subprocess
import threading
import time

import pytest

STARTUP_S = 15.0
# Short library timeouts so that a hang shows up as a prompt sparsereduce.Error instead of a ctest timeout.
FAST = dict(connect_timeout=5.0, join_timeout=10.0, collective_timeout=10.0)

_job_ids = itertools.count(1)


@pytest.fixture(scope="session")
def aggregator(tmp_path_factory):
    """HOST:PORT of a sparsereduce-aggregator on 127.0.0.1 (port 0, read from --port-file)."""
    with _start_aggregator(tmp_path_factory.mktemp("aggregator")) as (address, _):
        yield address


@pytest.fixture
def own_aggregator(tmp_path):
    """(HOST:PORT, Popen) of an aggregator for this test alone, which it may kill."""
    with _start_aggregator(tmp_path / "aggregator") as started:
        yield started


@contextlib.contextmanager
def _start_aggregator(work):
    work.mkdir(parents=True, exist_ok=True)
    binary = os.environ.get("SPARSEREDUCE_AGGREGATOR_BIN", "")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"SPARSEREDUCE_AGGREGATOR_BIN={binary!r} is not the built sparsereduce-aggregator; run the "
                    "tests through ctest (or set it and PYTHONPATH as python/CMakeLists.txt does)", pytrace=False)
    port_file, log_path = work / "port", work / "aggregator.log"
    with open(log_path, "w") as log:
        # setpriv (util-linux, essential on Debian) gives the daemon a parent-death signal before it execs it: a
        # pytest killed outright (ctest's timeout) leaves no daemon behind. Not preexec_fn, which is unsafe in a
        # process with threads (torch's, the Workers').
        daemon = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", binary, "--listen", "127.0.0.1:0", "--metrics-listen",
             "127.0.0.1:0", "--port-file", str(port_file), "--io-threads", "2", "--stall-timeout-ms", "10000"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"127.0.0.1:{_wait_for_port(daemon, port_file, log_path)}", daemon
    finally:
        if daemon.poll() is None:
            daemon.terminate()  # SIGTERM drains; no job is left at the end of a test session
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def _wait_for_port(daemon, port_file, log_path):
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            pytest.fail(f"the aggregator exited with {daemon.returncode}:\n{log_path.read_text()}", pytrace=False)
        try:
            port = int(port_file.read_text().strip())
            if port > 0:
                return port
        except (FileNotFoundError, ValueError):  # not written yet, or half written
            pass
        time.sleep(0.02)  # poll interval
    pytest.fail(f"no port file from the aggregator within {STARTUP_S} s:\n{log_path.read_text()}", pytrace=False)


@pytest.fixture
def job():
    """A job id no other test of this session uses (they share the daemon)."""
    return next(_job_ids)


@pytest.fixture
def new_job():
    """For a test that runs several jobs: each call hands out another id no other test uses."""
    return lambda: next(_job_ids)


def run_ranks(world_size, fn, timeout=30.0):
    """Runs fn(rank) for every rank in its own thread (ranks of one job in one process: this only works because
    the extension releases the GIL while it waits) and returns the results by rank. Re-raises the first
    exception; fails if a rank is still running after `timeout` seconds."""
    results, errors = [None] * world_size, [None] * world_size

    def body(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # reported below, in rank order
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        pytest.fail(f"ranks {hung} did not finish within {timeout} s")
    for e in errors:
        if e is not None:
            raise e
    return results
