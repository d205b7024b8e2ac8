"""The Worker API on NumPy arrays: sums, in place without copies, async handles, GIL release, options."""

import copy
import pickle
import threading
import time

import numpy as np
import pytest

import sparsereduce
from conftest import FAST, run_ranks


def sparse_array(rank, n, dtype, block=256, density=0.2):
    """Deterministic per-rank data with whole zero blocks, so both zero and nonzero blocks travel."""
    rng = np.random.default_rng(1000 + rank)
    values = rng.integers(-1000, 1000, n) if dtype == np.int32 else rng.standard_normal(n)
    a = values.astype(dtype)
    keep = rng.random((n + block - 1) // block) < density
    a[~np.repeat(keep, block)[:n]] = 0
    return a


def rank_order_sum(arrays):
    """The library sums contributions in rank order: ((a0 + a1) + a2) ..., in the array's dtype."""
    total = arrays[0].copy()
    for a in arrays[1:]:
        total += a
    return total


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("n", [1, 255, 256, 257, 10_000])
def test_sum_is_bit_exact_and_in_place(aggregator, job, dtype, n):
    world = 3
    inputs = [sparse_array(r, n, dtype) for r in range(world)]
    expected = rank_order_sum(inputs)

    def rank(r):
        a = inputs[r].copy()
        address = a.ctypes.data
        with sparsereduce.Worker([aggregator], job, r, world, **FAST) as w:
            returned = w.allreduce(a)
        assert returned is a and a.ctypes.data == address  # same object, same memory: no copy
        return a

    for result in run_ranks(world, rank):
        np.testing.assert_array_equal(result, expected, strict=True)


def test_multidimensional_array_and_view_of_a_larger_one(aggregator, job):
    def rank(r):
        with sparsereduce.Worker(aggregator, job, r, 2, **FAST) as w:
            matrix = np.full((4, 300), r + 1, dtype=np.float32)
            w.allreduce(matrix)
            base = np.zeros(1000, dtype=np.int32)
            base[100:300] = r + 1
            w.allreduce(base[100:300])  # a contiguous view: the sum lands in `base`
            return matrix, base

    for matrix, base in run_ranks(2, rank):
        np.testing.assert_array_equal(matrix, np.full((4, 300), 3, dtype=np.float32))
        np.testing.assert_array_equal(base[100:300], np.full(200, 3, dtype=np.int32))
        assert not base[:100].any() and not base[300:].any()


def test_empty_array(aggregator, job):
    def rank(r):
        with sparsereduce.Worker(aggregator, job, r, 2, **FAST) as w:
            w.allreduce(np.zeros(0, dtype=np.float32))
            return w.last_stats.element_count

    assert run_ranks(2, rank) == [0, 0]


def test_async_handles_complete_in_order_with_their_stats(aggregator, job):
    sizes = [700, 1300, 2100]

    def rank(r):
        with sparsereduce.Worker(aggregator, job, r, 2, **FAST) as w:
            arrays = [np.full(n, r + 1, dtype=np.float32) for n in sizes]
            handles = [w.allreduce_async(a) for a in arrays]
            handles[-1].wait()  # the last one done implies the earlier ones are (collectives run in order)
            assert all(h.done() for h in handles)
            for h in reversed(handles):
                h.wait()
            return arrays, handles

    for arrays, handles in run_ranks(2, rank):
        for n, a in zip(sizes, arrays):
            np.testing.assert_array_equal(a, np.full(n, 3, dtype=np.float32))
        last = handles[-1].stats
        assert last is not None and last.element_count == sizes[-1] and last.blocks == (sizes[-1] + 255) // 256
        assert last.nonzero_blocks == last.blocks and last.bytes_sent > sizes[-1] * 4
        # Their stats were gone from the Worker by the time these finished: None rather than another's.
        assert handles[0].stats is None and handles[1].stats is None
        # Values: they pickle (a results file, another process) and compare by value.
        assert pickle.loads(pickle.dumps(last)) == last and repr(copy.deepcopy(last)) == repr(last)


def test_other_threads_run_while_a_rank_waits(aggregator, job):
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **FAST))
    arrays = [np.full(512, r + 1, dtype=np.float32) for r in range(2)]
    entered, outcome = threading.Event(), {}

    def rank0():
        entered.set()
        try:
            workers[0].allreduce(arrays[0])  # blocks until rank 1 joins the collective below
            outcome["rank0"] = "ok"
        except BaseException as e:
            outcome["rank0"] = e

    t = threading.Thread(target=rank0, daemon=True)
    t.start()
    assert entered.wait(10)
    # Pure-Python work on this thread while rank 0 is (very likely) blocked in allreduce. If the extension held
    # the GIL there, this thread would stall until rank 0's collective timeout and rank 0 would fail.
    spins, end = 0, time.monotonic() + 0.3
    while time.monotonic() < end:
        spins += 1
    assert t.is_alive() and "rank0" not in outcome, "rank 0 finished without rank 1"
    assert spins > 1000
    workers[1].allreduce(arrays[1])
    t.join(10)
    assert outcome.get("rank0") == "ok"
    np.testing.assert_array_equal(arrays[0], np.full(512, 3, dtype=np.float32))
    for w in workers:
        w.close()


def test_options_and_properties(aggregator, job, monkeypatch):
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", aggregator)  # an empty list means this variable

    def rank(r):
        w = sparsereduce.Worker([], job, r, 2, block_size=64, slots=2, blocks_per_message=4, **FAST)
        a = np.ones(1000, dtype=np.float32)
        w.allreduce(a)
        seen = (w.job, w.rank, w.world_size, w.block_size, w.aggregators, w.last_stats.blocks, w.closed)
        w.close()
        return seen, w.closed, a

    for r, (seen, closed, a) in enumerate(run_ranks(2, rank)):
        assert seen == (job, r, 2, 64, [aggregator], (1000 + 63) // 64, False)
        assert closed
        np.testing.assert_array_equal(a, np.full(1000, 2, dtype=np.float32))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_transport_option(aggregator, job, transport):
    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, transport=transport, **FAST) as w:
            a = np.arange(5000, dtype=np.float32)
            w.allreduce(a)
            return w.transports, a

    for transports, a in run_ranks(2, rank):
        assert transports == [transport]  # the aggregator is on this host: "shm" is available, "tcp" is honoured
        np.testing.assert_array_equal(a, 2 * np.arange(5000, dtype=np.float32))


def test_tcp_send_buffer_option(aggregator, job, monkeypatch):
    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, transport="tcp", tcp_send_buffer=8192, **FAST) as w:
            a = sparse_array(r, 300_000, np.float32)
            expected = rank_order_sum([sparse_array(q, 300_000, np.float32) for q in range(2)])
            w.allreduce(a)
            return a, expected

    for a, expected in run_ranks(2, rank):
        np.testing.assert_array_equal(a, expected)
    monkeypatch.setenv("SPARSEREDUCE_TCP_SEND_BUFFER", "32k")
    with pytest.raises(sparsereduce.Error, match="SPARSEREDUCE_TCP_SEND_BUFFER '32k'"):
        sparsereduce.Worker([aggregator], job, 0, 1, **FAST)


@pytest.mark.parametrize("codec", ["none", "fp16"])
def test_restore_on_failure_off_sums_the_same(aggregator, job, codec):
    n = 100_000

    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, restore_on_failure=False, codec=codec, **FAST) as w:
            a = sparse_array(r, n, np.float32)
            w.allreduce(a)
            return a

    results = run_ranks(2, rank)
    if codec == "none":
        np.testing.assert_array_equal(results[0], rank_order_sum([sparse_array(q, n, np.float32) for q in range(2)]))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("yield_while_scanning", [True, False])
def test_yield_while_scanning_sums_the_same(aggregator, job, yield_while_scanning):
    n = 2_000_000  # 8 MB, 80 % zero blocks: a few MiB of zero blocks, so the worker that yields does

    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, yield_while_scanning=yield_while_scanning, **FAST) as w:
            a = sparse_array(r, n, np.float32)
            w.allreduce(a)
            return a

    expected = rank_order_sum([sparse_array(q, n, np.float32) for q in range(2)])
    for a in run_ranks(2, rank):
        np.testing.assert_array_equal(a, expected)


def test_unknown_transport_is_refused(aggregator, job):
    with pytest.raises(sparsereduce.Error, match="unknown transport 'carrier-pigeon'") as raised:
        sparsereduce.Worker([aggregator], job, 0, 1, transport="carrier-pigeon", **FAST)
    assert raised.value.code == "INVALID_ARGUMENT"


def test_closed_worker_refuses_calls(aggregator, job):
    w = sparsereduce.Worker(aggregator, job, 0, 1, **FAST)
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.allreduce(np.zeros(4, dtype=np.float32))
    assert "closed" in repr(w)


def test_dropping_a_handle_keeps_its_collective_running_until_close(aggregator, job):
    def rank(r):
        with sparsereduce.Worker(aggregator, job, r, 2, **FAST) as w:
            a = np.full(5000, r + 1, dtype=np.float32)
            w.allreduce_async(a)  # handle dropped at once: the collective goes on, `a` stays held
        return a  # close() waited for it

    for a in run_ranks(2, rank):
        np.testing.assert_array_equal(a, np.full(5000, 3, dtype=np.float32))


@pytest.mark.parametrize("seen_by", ["wait", "done"])
def test_close_leaves_the_job_while_a_finished_handle_is_kept(aggregator, job, seen_by):
    """A handle whose collective wait() or done() saw finish holds nothing: close() leaves the job at once although
    the handle is still referenced, so the peer's next allreduce fails with PEER_LEFT. (The handle used to keep the
    Worker, and the peer waited until its collective_timeout: DEADLINE_EXCEEDED.)"""
    workers = run_ranks(2, lambda r: sparsereduce.Worker(aggregator, job, r, 2, **FAST))

    def reduce(r):
        handle = workers[r].allreduce_async(np.full(1000, r + 1, dtype=np.float32))
        if seen_by == "wait":
            handle.wait()
        else:
            deadline = time.monotonic() + 20
            while not handle.done():
                assert time.monotonic() < deadline, "done() never said True"
                time.sleep(0.001)  # polling done() is what this case tests
        return handle

    handles = run_ranks(2, reduce)
    workers[0].close()
    with pytest.raises(sparsereduce.Error) as info:
        workers[1].allreduce(np.ones(1000, dtype=np.float32))
    assert info.value.code == "PEER_LEFT", info.value
    assert handles[0].done() and handles[0].stats is not None and handles[0].stats.seq == 1
    workers[1].close()
