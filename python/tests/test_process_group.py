"""The "sparsereduce" torch.distributed backend (sparsereduce/process_group.py).

Two spawned ranks (process_group_child.py) on a real aggregator: float32 and int32 sums through sparsereduce,
bit-exact against sums computed here (two terms: the order cannot matter); delegated collectives with gloo's
results and without a sparsereduce collective; the job id agreed through the store; errors that end the wait on
every rank; destroy with a collective in flight; Ctrl-C in wait() and barrier(), caught in the program's own code,
and during DDP's backward; is_completed() only once the result is in place; DDP without a comm hook against DDP
on gloo. Single-rank cases (configuration errors, SPARSEREDUCE_JOB, a killed aggregator, single-tensor
allreduce, overlapping tensors, an allreduce racing close(), locks after fork()) run in this process; the exit
with a collective in flight in a child process.
"""

import torch_required  # noqa: F401  (fails clearly without torch)

import contextlib
import gc
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from datetime import timedelta

import re

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import process_group_child as child
import sparsereduce
import sparsereduce.process_group as spg
import sparsereduce.torch as srt

WORLD, DEADLINE_S = 2, 90
SHORT = timedelta(seconds=10)  # the in-process groups' timeout: a hang shows up as an error within it


def spawn(scenario, aggregator, tmp_path, **environment):
    """Runs the scenario on WORLD spawned ranks and returns what each saved; every rank is killed on failure."""
    # Empty means unset for the backend: the ranks must not inherit a job or codec from this process.
    environment = {"SPARSEREDUCE_AGGREGATORS": aggregator, "SPARSEREDUCE_JOB": "", "SPARSEREDUCE_CODEC": "",
                   **environment}
    context = mp.start_processes(child.run, nprocs=WORLD, join=False, start_method="spawn",
                                 args=(WORLD, scenario, str(tmp_path / "store"), environment, str(tmp_path)))
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the ranks of {scenario} did not finish within {DEADLINE_S} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD)]


def test_sums_go_through_sparsereduce_and_the_rest_through_gloo(aggregator, tmp_path):
    results = spawn("collectives", aggregator, tmp_path)
    float32_sum = child.float32_input(0) + child.float32_input(1)
    int32_sum = child.int32_input(0) + child.int32_input(1)
    assert int32_sum.dtype == torch.int32 and float32_sum.count_nonzero() < 0.6 * float32_sum.numel()
    for rank, out in enumerate(results):
        assert out["backend"] == "sparsereduce" and out["group_type"] == "ProcessGroup", out["backend"]
        assert torch.equal(out["float32"], float32_sum), f"rank {rank}"
        assert torch.equal(out["int32"], int32_sum) and out["int32"].dtype == torch.int32, f"rank {rank}"
        assert out["async_work_is_ours"] and out["async_wait"] is True and out["async_completed"]
        assert torch.equal(out["async"], float32_sum), f"rank {rank}"
        assert torch.equal(out["transposed"], float32_sum[:4998].reshape(2, 2499).t()), f"rank {rank}"
        # One Worker collective per sparsereduce all_reduce, none for the delegated collectives.
        assert out["seq_after_float32"] == 1 and out["seq_after_sparsereduce"] == 4, out
        assert out["seq_after_delegated"] == 4, out
        assert torch.equal(out["broadcast"], child.float32_input(1)), f"rank {rank}"
        assert all(torch.equal(a, child.float32_input(r)) for r, a in enumerate(out["allgather"])), f"rank {rank}"
        assert torch.equal(out["max"], torch.maximum(child.float32_input(0), child.float32_input(1)))
        assert torch.equal(out["float64"], child.float64_input(0) + child.float64_input(1)), f"rank {rank}"
        assert not out["float64_async_work_is_ours"]  # gloo's own
        assert torch.equal(out["second_int32"], int32_sum), f"rank {rank}"
    # Both ranks joined the job rank 0 drew; the second group drew another.
    jobs = {out["job"] for out in results}
    second_jobs = {out["second_job"] for out in results}
    assert len(jobs) == 1 and len(second_jobs) == 1 and jobs != second_jobs, (jobs, second_jobs)
    assert all(0 < j < 1 << 63 for j in jobs | second_jobs)


def test_a_size_mismatch_fails_the_wait_on_every_rank_naming_job_and_rank(aggregator, tmp_path):
    results = spawn("size_mismatch", aggregator, tmp_path)
    for rank, out in enumerate(results):
        name, typed, code, message = out["raised"]
        assert typed and name == "Error" and code == "SPEC_MISMATCH", out["raised"]
        assert f"job {out['job']} rank {rank}" in message, message
        assert out["work_error_is_raised"], "the Work's and the group's error are the raised one"
        assert out["wait_seconds"] < child.TIMEOUT_S / 2, out["wait_seconds"]
        assert out["unchanged"] and out["completed"] and out["raised_again"] == "SPEC_MISMATCH"
        assert out["future"] is not None and message in out["future"], out["future"]
        assert out["destroy_seconds"] < 5 and out["closed"], out


def test_destroying_the_group_with_a_collective_in_flight_does_not_wait(aggregator, tmp_path):
    first, second = spawn("destroy_in_flight", aggregator, tmp_path)
    assert first["completed_before"] is False  # rank 1 never joined it
    assert first["destroy_seconds"] < 5, first  # not the 20 s collective timeout
    code, message = first["raised"]
    assert code == "ABORTED" and f"job {first['job']} rank 0" in message, first["raised"]
    assert second["saw_flag"] and second["destroy_seconds"] < 5, second
    assert first["closed"] and second["closed"]


@pytest.mark.parametrize("scenario", ["interrupted_wait", "interrupted_barrier"])
def test_ctrl_c_in_wait_or_barrier_leaves_the_collective_running(aggregator, tmp_path, scenario):
    """SIGINT while rank 0's main thread waits in Work.wait() or barrier() for a collective that rank 1 joins only
    later: KeyboardInterrupt at once, and the collective keeps running (a later wait() returns the sum; the Worker
    still works). The completion thread used to find the SIGINT in the wakeup socket once the wait was left, and
    aborted the Worker (ABORTED on both ranks)."""
    first, second = spawn(scenario, aggregator, tmp_path)
    assert first["outcome"] == "KeyboardInterrupt" and first["interrupted_after"] < 5, first
    assert first["polled"] and not first["completed_before_rank1"] and second["saw_flag"], (first, second)
    assert first["wait"] is True, first["wait"]
    for out in (first, second):
        assert torch.equal(out["sum"], torch.full((1000,), 3.0)), out
        assert torch.equal(out["second_sum"], torch.full((10,), 3.0)), out
        assert out["error"] is None, out["error"]


def test_is_completed_means_the_result_is_in_place(aggregator, tmp_path):
    """is_completed() is true only once the Work is finished: a strided tensor holds the sum, a failed collective's
    is_success() is False and exception() its sparsereduce.Error, even while the completion thread (held here on
    rank 0) has not got to them yet."""
    results = spawn("completed_means_finished", aggregator, tmp_path)
    assert results[0]["held"] and results[0]["still_held"], results[0]
    for rank, out in enumerate(results):
        assert out["strided_completed"] and out["failing_completed"], (rank, out)
        assert torch.equal(out["strided_at_completion"], torch.full((64,), 3.0)), (rank, out["strided_at_completion"])
        assert out["failing_success"] is False and out["failing_exception"] == ("Error", "SPEC_MISMATCH"), (rank, out)
        assert out["group_error_is_it"], (rank, out)
        assert out["first_wait"] is True and torch.equal(out["first"], torch.full((10,), 3.0)), (rank, out)
        assert out["failing_wait"][0] == "SPEC_MISMATCH", (rank, out["failing_wait"])


def test_a_caught_ctrl_c_leaves_an_async_collective_running(aggregator, tmp_path):
    """Ctrl-C caught in the program's own code on rank 0 while an async all_reduce is in flight: the collective
    completes normally on both ranks, and the group goes on working."""
    first, second = spawn("caught_ctrl_c", aggregator, tmp_path)
    assert first["caught"] and first["polled"] and not first["completed_before_rank1"], first
    for out in (first, second):
        assert out["wait"] is True and torch.equal(out["sum"], torch.full((1000,), 3.0)), out
        assert out["second"] is True and torch.equal(out["second_sum"], torch.full((10,), 3.0)), out
        assert out["error"] is None, out["error"]


def test_ctrl_c_while_ddp_backward_waits_aborts_the_collective(aggregator, tmp_path):
    """DDP without a comm hook on this backend: SIGINT while rank 0's backward() waits in C++ for a bucket rank 1
    never reduces ends the wait within a fraction of a second (ABORTED), and KeyboardInterrupt follows."""
    first, _ = spawn("ddp_interrupted", aggregator, tmp_path)
    assert first["ended_after_signal"] is not None and first["ended_after_signal"] < 2.0, first
    assert first["error_code"] == "ABORTED" and first["keyboard_interrupt"], first


def test_ddp_without_a_comm_hook_matches_ddp_on_gloo(aggregator, tmp_path):
    """With 2 ranks both compute g0/2 + g1/2: losses and parameters must be bit-identical."""
    results = spawn("ddp", aggregator, tmp_path)
    for rank, out in enumerate(results):
        assert out["error"] is None, out["error"]
        for find_unused in (False, True):
            reference, ours = out[("gloo", find_unused)], out[("sparsereduce", find_unused)]
            assert ours["losses"] == reference["losses"], (rank, find_unused)
            for i, (a, b) in enumerate(zip(reference["params"], ours["params"])):
                assert torch.equal(a, b), f"rank {rank} find_unused={find_unused} param {i}"
            # The gradient bucket went through sparsereduce every step, and with find_unused_parameters also
            # the int32 used-parameter map, which DDP waits on from C++ (Work.wait through torch's trampoline).
            assert out[("collectives", find_unused)] >= (2 if find_unused else 1) * child.DDP_STEPS, out
    assert results[0][("gloo", False)]["losses"] != results[1][("gloo", False)]["losses"]  # a real reduction


def test_exit_with_a_collective_in_flight_ends_promptly(aggregator, job):
    """A script that ends while a collective is in flight (rank 1 never joins it) exits at once with status 0. The
    group's shutdown used to run from weakref.finalize's atexit hook, which runs after the extension's own exit hook
    when a weakref.finalize existed before sparsereduce was imported (tempfile.TemporaryDirectory makes one): it then
    joined a completion thread that the extension had parked for good, and the process hung forever."""
    start = time.monotonic()
    # -X faulthandler: a crash at exit shows every thread's Python stack.
    child = subprocess.run([sys.executable, "-X", "faulthandler",
                            os.path.join(os.path.dirname(__file__), "exit_in_flight_child.py"),
                            aggregator, str(job), "group"], capture_output=True, text=True, timeout=30,
                           env={**os.environ, "SPARSEREDUCE_AGGREGATORS": aggregator, "SPARSEREDUCE_JOB": ""})
    assert child.returncode == 0, (child.returncode, child.stdout, child.stderr)
    assert "the script ends" in child.stdout, child.stdout
    assert "did not end within" not in child.stderr, child.stderr  # the bounded join gave up on the thread
    assert time.monotonic() - start < 20, "the exit waited for the collective's 30 s deadline"


@pytest.fixture
def one_rank():
    """Destroys the default group a test left (also after a failure)."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("variable, value, expected", [
    ("SPARSEREDUCE_AGGREGATORS", "", "no aggregators: set SPARSEREDUCE_AGGREGATORS"),
    ("SPARSEREDUCE_CODEC", "3lc", "SPARSEREDUCE_CODEC='3lc'"),
    ("SPARSEREDUCE_JOB", "seven", "SPARSEREDUCE_JOB='seven' is not a job id"),
    ("SPARSEREDUCE_AGGREGATORS", "127.0.0.1:0", "SPARSEREDUCE_AGGREGATORS: aggregator 0 '127.0.0.1:0': port 0"),
    ("SPARSEREDUCE_TRANSPORT", "bogus", "unknown transport 'bogus' (auto, tcp, shm or rdma"),
    ("SPARSEREDUCE_TCP_SEND_BUFFER", "4k", "SPARSEREDUCE_TCP_SEND_BUFFER '4k' is not a byte count"),
    ("SPARSEREDUCE_SECRET_FILE", "{tmp}/missing", "cannot read SPARSEREDUCE_SECRET_FILE {tmp}/missing: No such file"),
    ("SPARSEREDUCE_SECRET_FILE", "{tmp}/empty", "the job secret from SPARSEREDUCE_SECRET_FILE {tmp}/empty is empty"),
])
def test_missing_or_wrong_configuration_is_named_at_init(aggregator, monkeypatch, one_rank, tmp_path, variable,
                                                         value, expected):
    """Before the store and gloo's rendezvous: rank 0 of 2 fails at once instead of waiting for rank 1 (which
    never comes here). The Worker's own settings (transport, send buffer, secret) used to fail only in the
    Worker's constructor, after the rendezvous (sparsereduce.Error INVALID_ARGUMENT)."""
    (tmp_path / "empty").write_bytes(b"\n")
    value, expected = value.format(tmp=tmp_path), expected.format(tmp=tmp_path)
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", aggregator)
    for other in ("SPARSEREDUCE_JOB", "SPARSEREDUCE_CODEC", "SPARSEREDUCE_TRANSPORT", "SPARSEREDUCE_TCP_SEND_BUFFER",
                  "SPARSEREDUCE_SECRET", "SPARSEREDUCE_SECRET_FILE"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, value)
    start = time.monotonic()
    with pytest.raises(ValueError, match="rank 0: .*" + re.escape(expected)):
        dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=2, timeout=SHORT)
    assert time.monotonic() - start < SHORT.total_seconds() / 2
    assert not dist.is_initialized()


def test_sparsereduce_job_names_the_job_and_is_not_shared_by_two_groups(aggregator, job, monkeypatch, one_rank):
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", aggregator)
    monkeypatch.setenv("SPARSEREDUCE_JOB", str(job))
    monkeypatch.setenv("SPARSEREDUCE_CODEC", "bf16")
    dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    group = dist.distributed_c10d._get_default_group()
    assert group.worker.job == job
    t = torch.tensor([1.0, 2.0, 3.0])
    dist.all_reduce(t)
    assert group.worker.last_stats.codec == "bf16" and torch.equal(t, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=f"job {job} rank 0: SPARSEREDUCE_JOB={job} is already the job"):
        dist.new_group(backend="sparsereduce")
    worker = group.worker
    del group
    dist.destroy_process_group()
    assert worker.closed
    # Its job is free again for the next group.
    dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    assert dist.distributed_c10d._get_default_group().worker.job == job


def test_a_killed_aggregator_fails_the_wait_without_hanging(own_aggregator, monkeypatch, one_rank):
    address, daemon = own_aggregator
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", address)
    monkeypatch.delenv("SPARSEREDUCE_JOB", raising=False)
    dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    group = dist.distributed_c10d._get_default_group()
    job = group.worker.job
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert torch.equal(t, torch.ones(1000))
    daemon.kill()
    daemon.wait(timeout=10)
    start = time.monotonic()
    with pytest.raises(sparsereduce.Error) as info:
        dist.all_reduce(t)
    assert time.monotonic() - start < SHORT.total_seconds()
    assert info.value.code in ("UNAVAILABLE", "PEER_LEFT", "DEADLINE_EXCEEDED"), info.value.code
    assert f"job {job} rank 0" in str(info.value) and group.error is info.value
    assert torch.equal(t, torch.ones(1000))  # restored
    # Other collectives still work (gloo), and destroying the group does not wait.
    dist.broadcast(t, src=0)
    del group
    start = time.monotonic()
    dist.destroy_process_group()
    assert time.monotonic() - start < 5


def test_the_backend_is_registered_once():
    assert dist.Backend("sparsereduce") == "sparsereduce"
    assert dist.Backend._plugins["SPARSEREDUCE"].creator_fn is spg._create


def test_finished_works_stay_alive_for_cpp_until_waited_on_or_among_the_newest(aggregator, monkeypatch, one_rank):
    """A Python Work handed to C++ (DDP's reducer) dies with its last Python reference, after which C++'s wait()
    would never return: the group keeps those never waited on nor asked for a future (DDP waits on its
    used-parameter map's from C++ later) among the newest _UNCONSUMED_KEPT, and lets the others go."""
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", aggregator)
    monkeypatch.delenv("SPARSEREDUCE_JOB", raising=False)
    dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    group = dist.distributed_c10d._get_default_group()

    def finished_work(consume):
        work = group.allreduce([torch.ones(10)], dist.AllreduceOptions())
        if consume:
            work.wait()
        reference = weakref.ref(work)
        del work
        deadline = time.monotonic() + SHORT.total_seconds()
        while group._shared.pending and time.monotonic() < deadline:  # the completion thread let it go
            time.sleep(0.01)
        return reference

    def dies(reference, within=5.0):  # the completion thread drops its reference just after leaving the queue
        deadline = time.monotonic() + within
        while reference() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        return reference() is None

    assert dies(finished_work(consume=True))
    unconsumed = finished_work(consume=False)
    assert not dies(unconsumed, within=0.5)
    for _ in range(spg._UNCONSUMED_KEPT):
        finished_work(consume=False)
    assert dies(unconsumed)


def test_allreduce_takes_a_single_tensor_as_torchs_groups_do(aggregator, monkeypatch, one_rank):
    """torch 1.13's ProcessGroup.allreduce also takes one tensor: allreduce(tensor) and allreduce(tensor, op). The
    backend took a tensor for the list of tensors: one of length 1 went through sparsereduce as its row view
    t[0] (result() a row, not the tensor), any other went to gloo, which refused it with TypeError."""
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", aggregator)
    monkeypatch.delenv("SPARSEREDUCE_JOB", raising=False)
    dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    group = dist.distributed_c10d._get_default_group()

    def seq():
        stats = group.worker.last_stats
        return stats.seq if stats is not None else 0

    for shape, op in (((3,), None), ((1, 3), None), ((3,), dist.ReduceOp.SUM), ((1, 3), dist.ReduceOp.SUM)):
        t = torch.arange(3, dtype=torch.float32).reshape(shape)
        before = seq()
        work = group.allreduce(t) if op is None else group.allreduce(t, op)
        assert isinstance(work, spg.Work) and work.wait() is True, (shape, op)
        assert seq() == before + 1 and work.result()[0] is t, (shape, op)  # through sparsereduce, the whole tensor
        assert torch.equal(t, torch.arange(3, dtype=torch.float32).reshape(shape)), (shape, op)
    before = seq()
    for t, op in ((torch.ones(3, dtype=torch.float64), None), (torch.ones(3), dist.ReduceOp.MAX)):
        work = group.allreduce(t) if op is None else group.allreduce(t, op)
        assert not isinstance(work, spg.Work), (t.dtype, op)  # gloo's
        work.wait()
        assert torch.equal(t, torch.ones(3, dtype=t.dtype)), (t.dtype, op)
    assert seq() == before


def _one_rank_group(aggregator, monkeypatch):
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", aggregator)
    monkeypatch.delenv("SPARSEREDUCE_JOB", raising=False)
    dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    return dist.distributed_c10d._get_default_group()


def test_a_tensor_whose_elements_share_memory_is_refused_before_it_is_sent(aggregator, monkeypatch, one_rank):
    """An expand()ed view cannot hold a sum per element: refused before anything is sent, with a ValueError that
    says why. It used to be reduced (on every rank) through a contiguous copy and to fail only at the copy-back,
    with torch's RuntimeError recorded as the group's error, which is for sparsereduce.Error."""
    group = _one_rank_group(aggregator, monkeypatch)
    before = group.worker.last_stats.seq if group.worker.last_stats is not None else 0
    t = torch.ones(1).expand(4)
    with pytest.raises(ValueError, match="job .* rank 0: the tensor has elements that share memory"):
        dist.all_reduce(t)
    assert group.worker.last_stats is None or group.worker.last_stats.seq == before  # nothing sent
    assert group.error is None
    # A strided view whose elements do not overlap still goes through (the copy written back).
    u = torch.arange(8, dtype=torch.float32).reshape(4, 2)[:, 1]
    dist.all_reduce(u)
    assert torch.equal(u, torch.tensor([1.0, 3.0, 5.0, 7.0])) and group.error is None


def test_an_allreduce_racing_close_is_refused(aggregator, monkeypatch, one_rank):
    """close() on one thread, allreduce on another once the shutdown has begun (held here where it joins the
    completion thread): the allreduce raises ValueError. It used to submit a Work that no completion thread would
    finish (its future never completed: a DDP hang)."""
    group = _one_rank_group(aggregator, monkeypatch)
    entered, release = threading.Event(), threading.Event()
    join = spg._join

    def held_join(thread):
        entered.set()
        release.wait(SHORT.total_seconds())
        join(thread)

    monkeypatch.setattr(spg, "_join", held_join)
    closer = threading.Thread(target=group.close, daemon=True)
    closer.start()
    try:
        assert entered.wait(SHORT.total_seconds())
        with pytest.raises(ValueError, match="job .* rank 0: the process group is closed"):
            group.allreduce([torch.ones(3)])
    finally:
        release.set()
        closer.join(SHORT.total_seconds())
    assert not closer.is_alive() and group.worker.closed
    with pytest.raises(ValueError, match="the process group is closed"):
        group.allreduce([torch.ones(3)])


def test_a_child_of_fork_gets_the_locks_of_the_package_free(aggregator, monkeypatch, one_rank):
    """Locks another thread held at fork(): the child gets them free (os.register_at_fork), so that its calls and
    its exit's shutdown raise or finish instead of waiting for good on a copy of a held lock."""
    group = _one_rank_group(aggregator, monkeypatch)
    work = group.allreduce([torch.ones(3)])
    work.wait()
    locks = {"exit finalizers": lambda: sparsereduce._exit_finalizers_lock, "key spaces": lambda: srt._key_space_lock,
             "env jobs": lambda: spg._env_jobs_lock, "group": lambda: group._shared.ready, "work": lambda: work._lock}
    held, release = threading.Event(), threading.Event()

    def hold():
        with contextlib.ExitStack() as stack:
            for get in locks.values():
                stack.enter_context(get())
            held.set()
            release.wait(SHORT.total_seconds())

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    read, write = os.pipe()
    try:
        assert held.wait(SHORT.total_seconds())
        pid = os.fork()
        if pid == 0:  # the child: reports and leaves at once (no pytest teardown, no atexit)
            try:
                free = [name for name, get in locks.items() if get().acquire(timeout=1)]
                os.write(write, json.dumps(free).encode())
            finally:
                os._exit(0)
    finally:
        release.set()
        os.close(write)
    holder.join(SHORT.total_seconds())
    try:
        ready, _, _ = select.select([read], [], [], SHORT.total_seconds())
        report = os.read(read, 4096) if ready else b""
    finally:
        os.close(read)
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert report, "no report from the child"
    assert sorted(json.loads(report)) == sorted(locks)
