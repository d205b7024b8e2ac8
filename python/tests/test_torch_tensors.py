"""torch tensors through the Worker (in place, same memory) and the DDP hook driven by hand with fake buckets."""

import torch_required  # noqa: F401  (fails clearly without torch)

import gc
import json
import os
import subprocess
import sys
import time
import warnings
import weakref

import pytest
import torch
import torch.distributed as dist

import sparsereduce
import sparsereduce.torch as srt
from child_workers import join_two_ranks
from conftest import FAST, run_ranks


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_tensor_reduced_in_its_own_memory(aggregator, job, dtype):
    def rank(r):
        with sparsereduce.Worker(aggregator, job, r, 2, **FAST) as w:
            t = torch.arange(1000, dtype=dtype) * (r + 1)
            pointer = t.data_ptr()
            assert w.allreduce(t) is t
            h = w.allreduce_async(t)
            h.wait()
            return t, pointer

    for t, pointer in run_ranks(2, rank):
        assert t.data_ptr() == pointer
        assert torch.equal(t, torch.arange(1000, dtype=dtype) * 6)  # (1 + 2), twice


def test_gradient_and_slice_of_a_larger_tensor(aggregator, job):
    def rank(r):
        with sparsereduce.Worker(aggregator, job, r, 2, **FAST) as w:
            p = torch.nn.Parameter(torch.zeros(300))
            (p * (r + 1)).sum().backward()
            w.allreduce(p)  # requires_grad: reduced through a detached view of the same memory
            w.allreduce(p.grad)
            base = torch.zeros(50, 20)
            base[10:20] = r + 1
            w.allreduce(base[10:20])  # rows 10..19 are contiguous
            return p, base

    for p, base in run_ranks(2, rank):
        assert torch.equal(p.grad, torch.full((300,), 3.0))
        assert torch.equal(base[10:20], torch.full((10, 20), 3.0))
        assert not base[:10].any() and not base[20:].any()


def nested_tensor():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch 1.13: "nested tensors ... in prototype stage"
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


@pytest.mark.parametrize("tensor, error, message", [
    (torch.zeros(8, dtype=torch.float64), TypeError, r"unsupported dtype torch.float64; .*convert with \.float\(\)"),
    (torch.zeros(4, 4).t(), ValueError, "not contiguous"),
    (torch.zeros(8).to_sparse(), TypeError, "dense tensor"),
    (torch._neg_view(torch.ones(8)), ValueError, r"negative bit .*resolve_neg\(\)"),
    (nested_tensor(), TypeError, "nested tensor"),
])
def test_bad_tensors_are_refused(aggregator, job, tensor, error, message):
    """With the documented error, naming job and rank as the library's errors do, and before the tensor's version
    counter moves (it did for a negated view)."""
    version = tensor._version if not tensor.is_nested else None
    with sparsereduce.Worker(aggregator, job, 0, 1, **FAST) as w:
        with pytest.raises(error, match=f"^sparsereduce: job {job} rank 0: .*{message}"):
            w.allreduce(tensor)
        with pytest.raises(error, match=f"^sparsereduce: job {job} rank 0: .*{message}"):
            w.allreduce_async(tensor)
    with pytest.raises(error, match=f"^sparsereduce: (?!job).*{message}"):
        sparsereduce.as_buffer(tensor)  # no Worker: no job nor rank
    if version is not None:
        assert tensor._version == version


@pytest.mark.parametrize("asynchronous", [False, True], ids=["allreduce", "allreduce_async"])
def test_refused_calls_leave_the_version_counter_alone(aggregator, job, asynchronous):
    """A good tensor in a call the Worker refuses (unknown codec, negative key, closed Worker) is not written,
    so autograd must not be told it was (the counter moved before the refusal)."""
    t = torch.ones(8)
    before = t._version
    w = sparsereduce.Worker(aggregator, job, 0, 1, **FAST)
    call = w.allreduce_async if asynchronous else w.allreduce
    with pytest.raises(sparsereduce.Error, match="unknown codec 'gzip'"):
        call(t, codec="gzip")
    with pytest.raises(TypeError):
        call(t, key=-1)
    w.close()
    with pytest.raises(ValueError, match="closed"):
        call(t)
    assert t._version == before


class FakeBucket:
    """What the hook uses of torch.distributed.GradBucket."""

    def __init__(self, buffer, index=0):
        self._buffer, self._index = buffer, index

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def parameters(self):
        return []  # the same layout every step


def test_hook_averages_and_completes_futures_in_order(aggregator, job):
    grads = {r: [torch.full((n,), float(r + 1)) for n in (100, 3000)] for r in range(2)}

    def rank(r):
        state = srt.SparseReduceState(sparsereduce.Worker(aggregator, job, r, 2, **FAST), record=True)
        futures = [srt.allreduce_hook(state, FakeBucket(g, i)) for i, g in enumerate(grads[r])]
        values = [f.wait() for f in futures]
        records = state.take_records()
        state.close()
        return values, records

    for r, (values, records) in enumerate(run_ranks(2, rank)):
        for g, v in zip(grads[r], values):
            assert v is g  # the bucket itself, averaged in place: (1 + 2) / 2
            assert torch.equal(v, torch.full_like(v, 1.5))
        assert [rec.index for rec in records] == [0, 1]
        assert records[-1].stats is not None and records[-1].stats.element_count == 3000


def test_hook_reduces_each_bucket_under_its_index_with_the_codec(aggregator, job, new_job):
    """With a codec, bucket i is reduced under key i: the same buckets in another order give the same results."""
    torch.manual_seed(0)
    grads = {r: [torch.randn(3000) for _ in range(2)] for r in range(2)}

    backward_job = new_job()

    def rank(r, order):
        worker = sparsereduce.Worker(aggregator, backward_job if order else job, r, 2, codec="3lc", **FAST)
        state = srt.SparseReduceState(worker, record=True)
        results = {}
        for step in range(3):
            for i in (order or [0, 1]):
                bucket = grads[r][i].clone() * (step + 1)
                srt.allreduce_hook(state, FakeBucket(bucket, i)).wait()
                results[(step, i)] = bucket
        codecs = {rec.stats.codec for rec in state.take_records() if rec.stats is not None}
        state.close()
        return results, codecs

    forward = run_ranks(2, lambda r: rank(r, None))
    backward = run_ranks(2, lambda r: rank(r, [1, 0]))
    for (a, codecs_a), (b, codecs_b) in zip(forward, backward):
        assert codecs_a == {"3lc"} and codecs_b == {"3lc"}
        for key in a:
            assert torch.equal(a[key], b[key]), key  # state follows the bucket index, not the call order
            assert torch.equal(a[key], forward[0][0][key])  # and every rank has the same result


def test_hook_failure_fails_the_future_and_keeps_the_typed_error(aggregator, job):
    def rank(r):
        state = srt.SparseReduceState(sparsereduce.Worker(aggregator, job, r, 2, **FAST))
        future = srt.allreduce_hook(state, FakeBucket(torch.ones(10 + r)))  # sizes differ: SPEC_MISMATCH
        with pytest.raises(RuntimeError) as info:
            future.wait()
        state.close()
        return info.value, state.error

    for r, (e, error) in enumerate(run_ranks(2, rank)):
        assert isinstance(error, sparsereduce.Error) and error.code == "SPEC_MISMATCH", repr(error)
        assert f"job {job} rank {r}" in str(error) and str(error) in str(e), (e, error)


def test_hook_refuses_float64_buckets_before_scaling_them(aggregator, job):
    """The TypeError names job and rank, and the bucket is left as it was: the hook used to scale it by
    1/world_size before the Worker refused it (with 2 ranks, the gradients were left halved)."""
    workers = join_two_ranks(aggregator, job)
    state = srt.SparseReduceState(workers[0])
    bucket = torch.ones(4, dtype=torch.float64)
    with pytest.raises(TypeError, match=f"^sparsereduce: job {job} rank 0: unsupported dtype torch.float64"):
        srt.allreduce_hook(state, FakeBucket(bucket))
    assert torch.equal(bucket, torch.ones(4, dtype=torch.float64))
    state.close()
    workers[1].close()
    assert state.worker.closed


@pytest.mark.parametrize("make", [
    lambda: torch.arange(6, dtype=torch.float32),
    lambda: torch.nn.Parameter(torch.ones(5)),
    lambda: torch.zeros(0),
    lambda: torch.tensor(3.0),  # 0-d
    lambda: torch.arange(4, dtype=torch.int32),
], ids=["float32", "parameter", "empty", "0-d", "int32"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["allreduce", "allreduce_async"])
def test_allreduce_moves_the_version_counter(aggregator, job, make, asynchronous):
    """The sum is written outside torch; the tensor's version must still move, as for any in-place op."""
    t = make()
    before = t._version
    with sparsereduce.Worker(aggregator, job, 0, 1, **FAST) as w:
        if asynchronous:
            handle = w.allreduce_async(t)
            assert t._version > before  # already on submission: the memory changes while the handle runs
            handle.wait()
        else:
            w.allreduce(t)
    assert t._version > before


@pytest.mark.parametrize("asynchronous", [False, True], ids=["allreduce", "allreduce_async"])
def test_tensor_saved_for_backward_then_reduced_makes_backward_raise(aggregator, job, asynchronous):
    """y * y saves y for backward; reducing y in place must make backward refuse the stale y (with 2 ranks it
    would otherwise silently use the sum: d/dx (y*y) with y = x1 + x2 instead of 2 x)."""
    def rank(r):
        with sparsereduce.Worker(aggregator, job, r, 2, **FAST) as w:
            x = torch.tensor([1.0 + r], requires_grad=True)
            y = x * 1
            z = (y * y).sum()
            if asynchronous:
                w.allreduce_async(y).wait()
            else:
                w.allreduce(y)
            assert torch.equal(y.detach(), torch.tensor([3.0]))
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                z.backward()

    run_ranks(2, rank)


def test_inference_tensor_is_reduced_without_a_version_counter(aggregator, job):
    with torch.inference_mode():
        t = torch.ones(4)
    with sparsereduce.Worker(aggregator, job, 0, 1, **FAST) as w:
        w.allreduce(t)
        w.allreduce_async(t).wait()
    assert torch.equal(t, torch.ones(4))


def test_states_sharing_a_worker_keep_their_codec_state_apart(aggregator, job, new_job):
    """Two DDP modules (a GAN's generator and discriminator), one state each on one Worker: both have a bucket 0,
    yet the generator's buckets must come out as if it had the Worker to itself (3LC's error feedback is per key)."""
    torch.manual_seed(1)
    gen = {r: [torch.randn(3000) * (s + 1) for s in range(3)] for r in range(2)}
    disc = {r: [torch.randn(3000) * 10 for s in range(3)] for r in range(2)}
    alone_job = new_job()

    def rank(r, with_discriminator):
        worker = sparsereduce.Worker(aggregator, job if with_discriminator else alone_job, r, 2, codec="3lc", **FAST)
        g_state = srt.SparseReduceState(worker)
        d_state = srt.SparseReduceState(worker) if with_discriminator else None
        results = []
        for step in range(3):
            g = gen[r][step].clone()
            srt.allreduce_hook(g_state, FakeBucket(g, 0)).wait()
            results.append(g)
            if d_state is not None:
                srt.allreduce_hook(d_state, FakeBucket(disc[r][step].clone(), 0)).wait()
        if d_state is not None:
            d_state.close()
        g_state.close()
        return results

    shared = run_ranks(2, lambda r: rank(r, True))
    alone = run_ranks(2, lambda r: rank(r, False))
    for r in range(2):
        for step in range(3):
            assert torch.equal(shared[r][step], alone[r][step]), (r, step)


def test_ctrl_c_while_ddp_waits_for_the_hook_aborts_the_collective(aggregator, job):
    """SIGINT while torch waits for the hook's future in C++ (where Python runs no signal handlers), for a bucket
    whose collective the other rank never joins: the wait ends within a fraction of a second with the Worker
    aborted (state.error ABORTED), and KeyboardInterrupt follows. It used to end only at collective_timeout (20 s
    here, 30 min by default)."""
    child = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "ddp_interrupt_child.py"),
                            aggregator, str(job)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["wait_ended_after_signal"] < 2.0, result
    assert result["error_code"] == "ABORTED", result
    assert result.get("keyboard_interrupt"), result


def test_ctrl_c_that_is_not_of_a_ddp_wait_aborts_nothing(aggregator, job):
    """A Ctrl-C the program caught in its own code, and one of a forked child, used to abort the next bucket whose
    collective took longer than a poll slice (0.1 s): their bytes stayed in the wakeup socket, which a forked child
    also shares. Now each hook call drops earlier ones and a forked child gives the socket up."""
    child = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "ddp_stale_interrupt_child.py"),
                            aggregator, str(job)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["caught"], result
    assert result["after_caught_ctrl_c"] == [[1.0, 1.0], [1.0, 1.0]], result
    assert result["after_child_ctrl_c"] == [[1.0, 1.0], [1.0, 1.0]], result
    assert result["errors"] == [None, None], result


def test_exit_with_a_bucket_in_flight_ends_promptly(aggregator, job):
    """A script that ends while a state's bucket is in flight (rank 1 never joins it) exits at once with status 0:
    the state's shutdown (its completion thread stopped and joined) runs before the extension's exit hook, even
    when a weakref.finalize existed before sparsereduce was imported (see exit_in_flight_child.py). Run from
    weakref.finalize's own atexit hook, after the extension's, the join gave up after 5 s with a RuntimeWarning."""
    start = time.monotonic()
    # -X faulthandler: a crash at exit shows every thread's Python stack.
    child = subprocess.run([sys.executable, "-X", "faulthandler",
                            os.path.join(os.path.dirname(__file__), "exit_in_flight_child.py"),
                            aggregator, str(job), "state"], capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, (child.returncode, child.stdout, child.stderr)
    assert "the script ends" in child.stdout, child.stdout
    assert "did not end within" not in child.stderr, child.stderr  # the bounded join gave up on the thread
    assert time.monotonic() - start < 20, "the exit waited for the collective's 30 s deadline"


def _collected(*references, within=5.0):
    deadline = time.monotonic() + within
    while any(r() is not None for r in references) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)  # poll interval: nothing signals a collection
    return all(r() is None for r in references)


def test_a_state_dropped_without_close_ends_its_thread_and_lets_its_worker_go(aggregator, job):
    """A state that is dropped without close() (its DDP module gone) is collected: its completion thread ends and
    its Worker, once no one else holds it, is collected too and leaves the job (the same rank can join it again).
    The thread's target used to be the state's bound method, which kept the state, its Worker and the thread
    alive until the process ended."""
    worker = sparsereduce.Worker(aggregator, job, 0, 1, **FAST)
    state = srt.SparseReduceState(worker)
    thread, states, workers = state._completer, weakref.ref(state), weakref.ref(worker)
    srt.allreduce_hook(state, FakeBucket(torch.ones(10))).wait()
    del state, worker
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert _collected(states, workers)
    with sparsereduce.Worker(aggregator, job, 0, 1, **FAST) as again:  # rank 0 left: it may join again
        assert again.allreduce(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]


def test_a_state_dropped_with_a_bucket_in_flight_stops_waiting_for_it(aggregator, job):
    """Dropped while a bucket's collective is in flight (rank 1 never joins it): the completion thread stops
    waiting at once and lets the handle go to the Worker's orphans; collecting the Worker then aborts the
    collective, so rank 1 fails at once instead of waiting for the collective's deadline (20 s)."""
    workers = join_two_ranks(aggregator, job)
    state = srt.SparseReduceState(workers[0])
    thread, worker_ref = state._completer, weakref.ref(workers[0])
    srt.allreduce_hook(state, FakeBucket(torch.ones(10)))
    start = time.monotonic()
    del state
    workers[0] = None
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert _collected(worker_ref)
    assert time.monotonic() - start < 5
    with pytest.raises(sparsereduce.Error) as info:
        workers[1].allreduce(torch.ones(10))
    assert info.value.code in ("PEER_LEFT", "ABORTED"), info.value.code
    assert time.monotonic() - start < 10
    workers[1].close()


def test_from_process_group_takes_a_key_space(aggregator, job):
    """from_process_group(..., key_space=) as the module's docstring says (it went to the Worker: TypeError)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        state = srt.SparseReduceState.from_process_group(aggregator, job, key_space=5, **FAST)
        assert state.key_space == 5
        srt.allreduce_hook(state, FakeBucket(torch.ones(4), index=3)).wait()
        state.close()
    finally:
        dist.destroy_process_group()
