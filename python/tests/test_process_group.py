"""The "sparsereduce" torch.distributed backend (sparsereduce/process_group.py).

Two spawned ranks (process_group_child.py) on a real aggregator: float32 and int32 sums through sparsereduce,
bit-exact against sums computed here (two terms: the order cannot matter); delegated collectives with gloo's
results and without a sparsereduce collective; the job id agreed through the store; errors that end the wait on
every rank; destroy with a collective in flight; Ctrl-C in wait() and barrier(); DDP without a comm hook against
DDP on gloo. Single-rank cases (configuration errors, SPARSEREDUCE_JOB, a killed aggregator, single-tensor
allreduce) run in this process; the exit with a collective in flight in a child process.
"""

import torch_required  # noqa: F401  (fails clearly without torch)

import gc
import os
import subprocess
import sys
import time
import weakref
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import process_group_child as child
import sparsereduce
import sparsereduce.process_group as spg

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
])
def test_missing_or_wrong_configuration_is_named_at_init(aggregator, monkeypatch, one_rank, variable, value,
                                                         expected):
    monkeypatch.setenv("SPARSEREDUCE_AGGREGATORS", aggregator)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match="rank 0: .*" + expected.replace("(", r"\(")):
        dist.init_process_group("sparsereduce", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
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
