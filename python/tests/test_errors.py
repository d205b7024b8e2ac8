"""Errors: bad arrays are refused before anything is sent; library failures raise sparsereduce.Error carrying the
library's code and message; a failed collective leaves the caller's array as it was."""

import gc
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import sparsereduce
from conftest import FAST, run_ranks


def test_error_class():
    assert issubclass(sparsereduce.Error, RuntimeError)
    assert sparsereduce.Error.__module__ == "sparsereduce" and sparsereduce.Error("x").code is None


@pytest.mark.parametrize("array, error, message", [
    (np.zeros(8, dtype=np.float64), TypeError, "only float32 and int32"),
    (np.zeros(8, dtype=np.int64), TypeError, "only float32 and int32"),
    (np.zeros(8, dtype=np.float16), TypeError, "only float32 and int32"),
    ([1.0, 2.0], TypeError, "expected a NumPy array"),
    (np.zeros(16, dtype=np.float32)[::2], ValueError, "not C-contiguous"),
    (np.zeros((4, 4), dtype=np.float32, order="F"), ValueError, "not C-contiguous"),
    (np.frombuffer(bytes(32), dtype=np.float32), ValueError, "read-only"),
    (np.zeros(8, dtype=np.float32).newbyteorder(">"), TypeError, "only float32 and int32"),
])
def test_bad_arrays_are_refused_and_the_worker_stays_usable(aggregator, job, array, error, message):
    with sparsereduce.Worker(aggregator, job, 0, 1, **FAST) as w:
        with pytest.raises(error, match=f"^sparsereduce: job {job} rank 0: .*{message}"):
            w.allreduce(array)
        with pytest.raises(error, match=f"^sparsereduce: job {job} rank 0: .*{message}"):
            w.allreduce_async(array)
        ok = np.ones(3, dtype=np.float32)
        w.allreduce(ok)
        np.testing.assert_array_equal(ok, np.ones(3, dtype=np.float32))


def test_invalid_rank_names_the_job_and_rank(aggregator, job):
    with pytest.raises(sparsereduce.Error) as info:
        sparsereduce.Worker(aggregator, job, 2, 2, **FAST)
    assert info.value.code == "INVALID_ARGUMENT"
    assert f"job {job} rank 2" in str(info.value) and "out of range" in str(info.value)


def test_invalid_options():
    with pytest.raises(ValueError, match=r"connect_timeout must be .*, got -1\.0$"):  # Python's float repr
        sparsereduce.Worker("127.0.0.1:1", 1, 0, 1, connect_timeout=-1)
    for endless in (float("inf"), float("nan"), 1e300):  # the conversion to milliseconds would overflow
        with pytest.raises(ValueError, match="join_timeout"):
            sparsereduce.Worker("127.0.0.1:1", 1, 0, 1, join_timeout=endless)
    for zero in (0, 0.0, -0.0):  # no time at all: refused rather than passed on as 0 ms
        with pytest.raises(ValueError, match="collective_timeout must be more than 0"):
            sparsereduce.Worker("127.0.0.1:1", 1, 0, 1, connect_timeout=0.5, join_timeout=0.5,
                                collective_timeout=zero)
    with pytest.raises(TypeError):
        sparsereduce.Worker("127.0.0.1:1", 1, -1, 1)  # negative rank: not an unsigned integer


def test_timeouts_under_a_millisecond_round_up(aggregator, job):
    """0.0004 s is 1 ms (it was 0 ms before): rank 0's lone collective fails after 1 ms, and says so."""
    def rank(r):
        return sparsereduce.Worker(aggregator, job, r, 2, connect_timeout=5.0, join_timeout=10.0,
                                   collective_timeout=0.0004 if r == 0 else 10.0)

    workers = run_ranks(2, rank)
    handle = workers[0].allreduce_async(np.ones(4, dtype=np.float32))  # rank 1 never joins it
    with pytest.raises(sparsereduce.Error) as info:
        handle.wait(timeout=10)
    assert info.value.code == "DEADLINE_EXCEEDED" and "within 1 ms" in str(info.value), info.value
    for w in workers:
        w.close()


def test_no_aggregator_listening(job):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(sparsereduce.Error) as info:
        sparsereduce.Worker(f"127.0.0.1:{port}", job, 0, 1, connect_timeout=0.5, join_timeout=0.5)
    assert info.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    assert f"job {job} rank 0" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)


def test_spec_mismatch_fails_every_rank_and_restores_the_array(aggregator, job):
    sizes = [300, 600]  # the ranks disagree on the tensor

    def rank(r):
        w = sparsereduce.Worker(aggregator, job, r, 2, **FAST)
        a = np.arange(sizes[r], dtype=np.float32) + 1
        before = a.copy()
        with pytest.raises(sparsereduce.Error) as info:
            w.allreduce(a)
        np.testing.assert_array_equal(a, before)  # bit for bit what it was: the step can be retried
        with pytest.raises(sparsereduce.Error):  # after an error the Worker is unusable
            w.allreduce(np.ones(4, dtype=np.float32))
        w.close()
        return info.value

    for r, e in enumerate(run_ranks(2, rank)):
        assert e.code == "SPEC_MISMATCH", e
        assert f"job {job} rank {r}" in str(e) and "300" in str(e) and "600" in str(e)


def test_async_failure_is_raised_by_wait(aggregator, job):
    def rank(r):
        w = sparsereduce.Worker(aggregator, job, r, 2, **FAST)
        handle = w.allreduce_async(np.ones(10 + r, dtype=np.float32))
        with pytest.raises(sparsereduce.Error) as info:
            handle.wait()
        assert handle.done() and handle.stats is None
        w.close()
        return info.value.code

    assert run_ranks(2, rank) == ["SPEC_MISMATCH", "SPEC_MISMATCH"]


def test_peer_leaving_fails_the_waiting_rank(aggregator, job):
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **FAST))
    a = np.ones(1000, dtype=np.float32)
    handle = workers[0].allreduce_async(a)
    workers[1].close()  # rank 1 leaves without joining the collective
    with pytest.raises(sparsereduce.Error) as info:
        handle.wait(timeout=20)
    assert info.value.code == "PEER_LEFT", info.value
    # The wording depends on when the aggregator saw rank 1 go (Goodbye or closed socket, before or during the
    # collective); every variant names it.
    message = str(info.value)
    assert f"job {job} rank 0" in message
    assert re.search(r"rank(\(s\))? 1\b", message), message
    np.testing.assert_array_equal(a, np.ones(1000, dtype=np.float32))
    workers[0].close()


def test_leaving_a_with_block_on_an_exception_aborts_what_is_in_flight(aggregator, job):
    """A `with` body that raises (Ctrl-C in a training loop) while an allreduce waits for a peer leaves at once:
    the collective is aborted (ABORTED, array restored) instead of close() waiting up to its deadline."""
    options = dict(FAST, collective_timeout=120.0)
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **options))
    a = np.ones(1000, dtype=np.float32)
    handle = None
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with workers[0]:
            handle = workers[0].allreduce_async(a)  # rank 1 never joins in
            raise KeyboardInterrupt
    assert time.monotonic() - start < 10.0
    assert workers[0].closed
    with pytest.raises(sparsereduce.Error) as info:
        handle.wait(timeout=10)  # done once no write reads the array any more (abort returns before that)
    assert info.value.code == "ABORTED" and "Worker::abort" in str(info.value), info.value
    np.testing.assert_array_equal(a, np.ones(1000, dtype=np.float32))
    workers[1].close()


def test_garbage_collection_aborts_an_orphaned_collective(aggregator, job):
    """A Worker dropped without close() while a dropped handle's collective waits for a peer is collected at once:
    the orphan is aborted rather than waited for until its deadline (which blocked the collecting thread)."""
    options = dict(FAST, collective_timeout=120.0)
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **options))
    handle = workers[0].allreduce_async(np.ones(1000, dtype=np.float32))  # rank 1 never joins in
    del handle
    start = time.monotonic()
    workers[0] = None  # the last reference to rank 0's Worker
    gc.collect()
    assert time.monotonic() - start < 10.0
    workers[1].close()


def test_wait_timeout_then_completion(aggregator, job):
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **FAST))
    arrays = [np.full(100, r + 1, dtype=np.int32) for r in range(2)]
    first = workers[0].allreduce_async(arrays[0])
    with pytest.raises(TimeoutError):
        first.wait(timeout=0.05)  # rank 1 has not started its part
    assert not first.done()
    workers[1].allreduce(arrays[1])
    first.wait(timeout=10)
    np.testing.assert_array_equal(arrays[0], np.full(100, 3, dtype=np.int32))
    for w in workers:
        w.close()



def test_closed_worker_names_the_job_and_rank(aggregator, job):
    w = sparsereduce.Worker(aggregator, job, 0, 1, **FAST)
    w.close()
    with pytest.raises(ValueError, match=f"job {job} rank 0: the Worker is closed"):
        w.allreduce(np.ones(4, dtype=np.float32))



def test_repr_of_a_worker_whose_constructor_failed_returns():
    """Traceback formatters (pytest's among them) repr the `self` of a failed __init__: that must not touch the
    C++ object that was never built (it hung). In a child process, bounded."""
    code = ("import sparsereduce\n"
            "w = sparsereduce.Worker.__new__(sparsereduce.Worker)\n"
            "print(repr(w))\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "<sparsereduce.Worker not constructed>"


@pytest.mark.parametrize("endless", [math.inf, 1e10, 365.0 * 24 * 3600 + 1])
def test_wait_with_an_endless_timeout_waits(aggregator, job, endless):
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **FAST))
    arrays = [np.full(100, r + 1, dtype=np.int32) for r in range(2)]
    handle = workers[0].allreduce_async(arrays[0])
    rank1 = threading.Thread(target=workers[1].allreduce, args=(arrays[1],))
    rank1.start()  # whenever it gets there: rank 0 waits without a bound (the collective's deadline still holds)
    handle.wait(timeout=endless)
    rank1.join()
    np.testing.assert_array_equal(arrays[0], np.full(100, 3, dtype=np.int32))
    for w in workers:
        w.close()


def test_wait_refuses_nan_and_negative_timeouts(aggregator, job):
    with sparsereduce.Worker(aggregator, job, 0, 1, **FAST) as w:
        handle = w.allreduce_async(np.ones(4, dtype=np.float32))
        for bad in (math.nan, -1.0, -math.inf):
            with pytest.raises(ValueError, match="timeout"):
                handle.wait(timeout=bad)
        handle.wait(timeout=10)


def test_wait_timeout_names_the_job_and_rank(aggregator, job):
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **FAST))
    handle = workers[0].allreduce_async(np.ones(4, dtype=np.float32))
    with pytest.raises(TimeoutError, match=fr"job {job} rank 0: the allreduce \(collective 1, 4 float32 elements\)"):
        handle.wait(timeout=0)
    workers[1].allreduce(np.ones(4, dtype=np.float32))
    handle.wait(timeout=10)
    for w in workers:
        w.close()
    with pytest.raises(ValueError, match=f"job {job} rank 0.*closed"):
        workers[0].allreduce(np.ones(4, dtype=np.float32))


@pytest.mark.parametrize("mode", ["allreduce", "wait"])
def test_ctrl_c_interrupts_a_blocked_allreduce_and_the_memory_stays_held(aggregator, job, mode):
    """SIGINT during a blocked allreduce / Handle.wait raises KeyboardInterrupt at once (not after the 20 s
    collective deadline); the array stays held (dropping it and the handle neither blocks nor frees it) until the
    collective finished into it, then it is released."""
    child = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "interrupt_child.py"),
                            aggregator, str(job), mode], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "KeyboardInterrupt", result
    assert result["interrupted_after"] < 5.0, result
    assert result["dropped_after"] < 5.0, result
    assert result["held"] and result["first_result"] == 3.0 and result["released"], result


def test_exit_while_a_daemon_thread_waits_in_an_allreduce(aggregator, job):
    """A script that ends (here with an exception) while a daemon thread waits in an allreduce, as the DDP hook's
    completer waits for a bucket, exits with its own status. Python 3.11 ends such a thread with pthread_exit when
    it retakes the GIL during interpreter exit; the unwind through the GIL guard's destructor aborted the process
    (SIGABRT, "terminate called without an active exception")."""
    child = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "exit_child.py"),
                            aggregator, str(job)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1, (child.returncode, child.stderr)
    assert "RuntimeError: the training loop failed (simulated)" in child.stderr, child.stderr
    assert "terminate called" not in child.stderr, child.stderr


def test_a_worker_inherited_through_fork_raises_in_the_child(aggregator, job):
    """In a child of fork(), the inherited Worker and its handle in flight raise UNSUPPORTED (they waited forever
    for the parent's I/O thread), and the child exits normally without waiting for them."""
    child = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "fork_child.py"),
                            aggregator, str(job)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["exit"] == 0, (result, child.stderr)
    assert result["seconds"] < 10.0, result


def test_ctrl_c_interrupts_the_constructors_join():
    """SIGINT while the constructor waits for the job to form (the other rank never comes) raises KeyboardInterrupt
    at once, not after the 60 s join timeout, and the worker leaves: it closes its connection."""
    child = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "interrupt_join_child.py")],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["hello_seen"] and result["outcome"] == "KeyboardInterrupt", result
    assert result["interrupted_after"] < 5.0, result
    assert result["left"], result
