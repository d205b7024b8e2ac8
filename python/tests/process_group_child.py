"""One rank of test_process_group.py's multi-process scenarios (spawned processes import it by name).

Each scenario runs on a "sparsereduce" default group and returns what it saw; run() saves it for the parent to
check against references it computes itself.
"""

import contextlib
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import sparsereduce
import sparsereduce.process_group as spg
import sparsereduce.torch as srt

TIMEOUT_S = 20  # the groups' timeout, which is also the Worker's join and collective timeout
DDP_STEPS = 4


def float32_input(rank):
    """Mostly zero (so that sparsereduce skips blocks), an odd length (a partial last block)."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(5000, generator=g)
    x[torch.rand(5000, generator=g) < 0.7] = 0
    return x


def int32_input(rank):
    g = torch.Generator().manual_seed(200 + rank)
    return torch.randint(-1000, 1000, (3001,), generator=g, dtype=torch.int32)


def float64_input(rank):
    return torch.randn(300, generator=torch.Generator().manual_seed(300 + rank), dtype=torch.float64)


def _group():
    return dist.distributed_c10d._get_default_group()


def _seq(group):
    stats = group.worker.last_stats
    return stats.seq if stats is not None else 0


def collectives(rank, world_size, out_dir):
    group = _group()
    out = {"backend": dist.get_backend(), "group_type": type(group).__name__, "job": group.worker.job}

    t = float32_input(rank)
    dist.all_reduce(t)
    out["float32"], out["seq_after_float32"] = t, _seq(group)
    t = int32_input(rank)
    dist.all_reduce(t)
    out["int32"] = t
    t = float32_input(rank)
    work = dist.all_reduce(t, async_op=True)
    out["async_work_is_ours"] = isinstance(work, spg.Work)
    out["async_wait"] = work.wait()
    out["async_completed"] = work.is_completed()
    out["async"] = t
    # A transposed view: reduced through a contiguous copy, the sum written back into the view.
    t = float32_input(rank)[:4998].reshape(2, 2499).t()
    dist.all_reduce(t)
    out["transposed"], out["seq_after_sparsereduce"] = t.clone(), _seq(group)

    # Delegated to gloo: none of these may move the Worker's collective count.
    t = float32_input(rank)
    dist.broadcast(t, src=1)
    out["broadcast"] = t
    gathered = [torch.empty(5000) for _ in range(world_size)]
    dist.all_gather(gathered, float32_input(rank))
    out["allgather"] = gathered
    t = float32_input(rank)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["max"] = t
    t = float64_input(rank)
    dist.all_reduce(t)
    out["float64"] = t
    work = dist.all_reduce(float64_input(rank), async_op=True)
    out["float64_async_work_is_ours"] = isinstance(work, spg.Work)
    work.wait()
    dist.barrier()
    out["seq_after_delegated"] = _seq(group)

    # A second group on the same store draws its own job, the same on every rank, and works.
    second = dist.new_group(backend="sparsereduce")
    out["second_job"] = second.worker.job
    t = int32_input(rank)
    dist.all_reduce(t, group=second)
    out["second_int32"] = t
    return out


def size_mismatch(rank, world_size, out_dir):
    """Rank 1 sends 24 more elements: the aggregator refuses the collective on every rank (SPEC_MISMATCH)."""
    group = _group()
    out = {"job": group.worker.job}
    t = float32_input(rank)[:1000 + 24 * rank].clone()
    before = t.clone()
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
        out["raised"] = None
    except Exception as e:  # noqa: BLE001  (the parent checks what it was)
        out["raised"] = (type(e).__name__, isinstance(e, sparsereduce.Error), getattr(e, "code", None), str(e))
        out["work_error_is_raised"] = work.error is e and group.error is e
    out["wait_seconds"] = time.monotonic() - start
    out["unchanged"] = torch.equal(t, before)
    out["completed"] = work.is_completed()
    try:  # a second wait raises the same
        work.wait()
        out["raised_again"] = None
    except sparsereduce.Error as e:
        out["raised_again"] = e.code
    try:  # a future asked for after the failure fails too
        work.get_future().wait()
        out["future"] = None
    except RuntimeError as e:
        out["future"] = str(e)
    worker = group.worker
    del group, work
    start = time.monotonic()
    dist.destroy_process_group()
    out["destroy_seconds"] = time.monotonic() - start
    out["closed"] = worker.closed
    return out


def destroy_in_flight(rank, world_size, out_dir):
    """Rank 0 starts an allreduce that rank 1 never joins and destroys the group: that must not wait for rank 1
    (nor for the 20 s collective timeout); the Work then fails. Rank 1 stays in the job until rank 0 is done."""
    group = _group()
    out = {"job": group.worker.job}
    worker = group.worker
    flag = os.path.join(out_dir, "rank0-destroyed")
    if rank == 0:
        work = dist.all_reduce(float32_input(rank), async_op=True)
        time.sleep(0.2)  # submitted and sent
        out["completed_before"] = work.is_completed()
        del group
        start = time.monotonic()
        dist.destroy_process_group()
        out["destroy_seconds"] = time.monotonic() - start
        open(flag, "w").close()
        try:
            work.wait()
            out["raised"] = None
        except sparsereduce.Error as e:
            out["raised"] = (e.code, str(e))
    else:
        deadline = time.monotonic() + TIMEOUT_S
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
        out["saw_flag"] = os.path.exists(flag)
        del group
        start = time.monotonic()
        dist.destroy_process_group()
        out["destroy_seconds"] = time.monotonic() - start
    out["closed"] = worker.closed
    return out


def _interrupted(rank, out_dir, interrupt_in):
    """Rank 0 gets SIGINT while it waits on the main thread (interrupt_in: 'wait', Work.wait, or 'barrier', which
    first waits for the group's sparsereduce collectives) for an allreduce that rank 1 joins only afterwards. The
    KeyboardInterrupt must leave the collective running: rank 0's completion thread polls the wakeup socket again
    (awaited here) before rank 1 joins, and a later wait() then returns the sum, as does a second allreduce."""
    group = _group()
    out = {"job": group.worker.job}
    flag = os.path.join(out_dir, "rank0-interrupted")
    if rank == 0:
        t = torch.full((1000,), 1.0)
        work = dist.all_reduce(t, async_op=True)
        # SIGINT once the main thread calls into the handle's blocking wait (a profile hook sees the C call), so
        # that it arrives while the main thread waits, not in Python code before.
        blocking = threading.Event()

        def profile(frame, event, arg):
            if event == "c_call" and getattr(arg, "__name__", "") == "wait":
                blocking.set()

        def interrupt():
            if blocking.wait(timeout=TIMEOUT_S):
                os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        start = time.monotonic()
        try:
            sys.setprofile(profile)
            if interrupt_in == "wait":
                work.wait()
            else:
                group.barrier()
            out["outcome"] = "returned"
        except KeyboardInterrupt:
            out["outcome"] = "KeyboardInterrupt"
        finally:
            sys.setprofile(None)
        out["interrupted_after"] = time.monotonic() - start
        # Two polls of the completion thread after the interrupted wait (the first may have begun during it): the
        # SIGINT is not one for it to act on.
        with _counting_polls() as polled:
            out["polled"] = all(polled.acquire(timeout=TIMEOUT_S) for _ in range(2))
        out["completed_before_rank1"] = work.is_completed()
        open(flag, "w").close()
        try:
            out["wait"] = work.wait()
        except Exception as e:  # noqa: BLE001  (the parent checks what it was)
            out["wait"] = (getattr(e, "code", None), str(e))
        out["sum"] = t
    else:
        deadline = time.monotonic() + TIMEOUT_S
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
        out["saw_flag"] = os.path.exists(flag)
        t = torch.full((1000,), 2.0)
        dist.all_reduce(t)
        out["sum"] = t
    t = torch.full((10,), float(rank + 1))
    dist.all_reduce(t)
    out["second_sum"] = t
    out["error"] = None if group.error is None else str(group.error)
    return out


def interrupted_wait(rank, world_size, out_dir):
    return _interrupted(rank, out_dir, "wait")


def interrupted_barrier(rank, world_size, out_dir):
    return _interrupted(rank, out_dir, "barrier")


@contextlib.contextmanager
def _counting_polls():
    """Counts the completion thread's Ctrl-C polls (a semaphore released after each) while in the block."""
    polled = threading.Semaphore(0)
    poll = spg._ctrl_c.poll

    def counting_poll(*args, **kwargs):
        poll(*args, **kwargs)
        polled.release()

    spg._ctrl_c.poll = counting_poll
    try:
        yield polled
    finally:
        del spg._ctrl_c.poll


def _spin_until(condition):
    """Calls condition() until it is true or TIMEOUT_S passed; returns whether it became true."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
    return True


def _outcome(call):
    """call()'s value, or (code, message) of what it raised."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001  (the parent checks what it was)
        return (getattr(e, "code", type(e).__name__), str(e))


def completed_means_finished(rank, world_size, out_dir):
    """is_completed() must say True only once the Work is finished: a strided tensor's sum copied back, a failure
    recorded (is_success(), exception()). Rank 0's completion thread is held in its first poll (a wait slice of an
    allreduce that rank 1 joins only once it is held) while two more collectives end: a strided one and a failing
    one (rank 1 sends 24 more elements: SPEC_MISMATCH). is_completed() used to be the handle's done(), true while
    the held thread had yet to copy the sum back and record the error."""
    group = _group()
    out = {}
    entered, release = threading.Event(), threading.Event()
    poll = spg._ctrl_c.poll

    def held_poll(*args, **kwargs):
        if not entered.is_set():
            entered.set()
            release.wait(TIMEOUT_S)
        poll(*args, **kwargs)

    first = torch.full((10,), float(rank + 1))
    try:
        if rank == 0:
            spg._ctrl_c.poll = held_poll
            work = dist.all_reduce(first, async_op=True)
            out["held"] = entered.wait(TIMEOUT_S)
            group.gloo.barrier().wait()
        else:
            group.gloo.barrier().wait()
            work = dist.all_reduce(first, async_op=True)
        strided = torch.full((64, 2), float(rank + 1))[:, 0]  # every second element: through a contiguous copy
        strided_work = dist.all_reduce(strided, async_op=True)
        out["strided_completed"] = _spin_until(strided_work.is_completed)
        out["strided_at_completion"] = strided.clone()
        failing = torch.ones(100 + 24 * rank)
        failing_work = dist.all_reduce(failing, async_op=True)
        out["failing_completed"] = _spin_until(failing_work.is_completed)
        out["failing_success"] = failing_work.is_success()
        error = failing_work.exception()
        out["failing_exception"] = None if error is None else (type(error).__name__, getattr(error, "code", None))
        out["group_error_is_it"] = error is not None and group.error is error
        out["still_held"] = entered.is_set() and not release.is_set()
    finally:
        release.set()
        if rank == 0:
            del spg._ctrl_c.poll
    out["first_wait"] = _outcome(work.wait)
    out["first"] = first
    out["failing_wait"] = _outcome(failing_work.wait)
    return out


def caught_ctrl_c(rank, world_size, out_dir):
    """Rank 0 gets a Ctrl-C in its own code and catches it while an async allreduce is in flight (rank 1 joins it
    only afterwards): the collective must go on and complete normally on both ranks. The group's completion
    thread used to find the SIGINT in the wakeup socket and abort the Worker (ABORTED here, PEER_LEFT on rank 1)."""
    group = _group()
    out = {}
    t = torch.full((1000,), float(rank + 1))
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        with _counting_polls() as polled:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                _spin_until(lambda: False)  # Python code: the KeyboardInterrupt is raised in here
                out["caught"] = False
            except KeyboardInterrupt:
                out["caught"] = True
            # Two polls of the completion thread after it (the first may have begun before the signal): it has
            # seen the SIGINT. With the Worker aborted there is no second one (the Work failed): bounded.
            out["polled"] = all(polled.acquire(timeout=5) for _ in range(2))
        out["completed_before_rank1"] = work.is_completed()
        group.gloo.barrier().wait()
        out["wait"] = _outcome(work.wait)
    else:
        group.gloo.barrier().wait()
        out["wait"] = _outcome(lambda: dist.all_reduce(t) or True)
    out["sum"] = t
    second = torch.full((10,), float(rank + 1))
    out["second"] = _outcome(lambda: dist.all_reduce(second) or True)
    out["second_sum"] = second
    out["error"] = None if group.error is None else str(group.error)
    return out


def ddp_interrupted(rank, world_size, out_dir):
    """DDP without a comm hook: SIGINT while rank 0's backward() waits in C++ for its bucket, which rank 1 never
    reduces. The main thread is inside autograd's backward, where Python runs no signal handlers: the group's
    completion thread aborts the Worker, backward() ends at once (not at the 20 s collective timeout) and
    KeyboardInterrupt follows."""
    group = _group()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Linear(8, 1), process_group=group)
    out = {}
    if rank == 0:
        sent = []

        def waiting_in_backward():
            pending = list(group._shared.pending)
            # DDP's reducer asked the bucket's Work for its future (its last Python call) and waits in C++.
            return bool(pending) and pending[0]._future is not None and srt._main_thread_in_backward()

        def interrupt():
            if _spin_until(waiting_in_backward):
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        try:
            try:
                ddp(torch.ones(4, 8)).sum().backward()
                out["backward"] = "returned"
            except RuntimeError as e:  # the aborted bucket's error
                out["backward"] = str(e).splitlines()[0][:300]
            _spin_until(lambda: False)  # Python code: the pending KeyboardInterrupt is raised here at the latest
            out["keyboard_interrupt"] = False
        except KeyboardInterrupt:  # as soon as backward() came back into Python
            out["keyboard_interrupt"] = True
        out["ended_after_signal"] = time.monotonic() - sent[0] if sent else None
        out["error_code"] = getattr(group.error, "code", None)
    group.gloo.barrier().wait()  # rank 1 stays in the job until rank 0 is done
    return out


class _SmallModel(nn.Module):
    def __init__(self, with_unused):
        super().__init__()
        self.table = nn.EmbeddingBag(3000, 8, mode="sum")  # dense gradient, mostly zero rows
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        if with_unused:
            self.unused = nn.Linear(4, 4)  # no gradient ever: DDP's find_unused_parameters path

    def forward(self, ids, offsets):
        return self.mlp(self.table(ids, offsets)).squeeze(1)


def _train(rank, group, steps, find_unused):
    torch.manual_seed(0)
    model = _SmallModel(with_unused=find_unused)
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.05,
                                  find_unused_parameters=find_unused)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 3000, (64,), generator=g)
        offsets = torch.arange(0, 64, 4)
        labels = torch.randint(0, 2, (16,), generator=g).float()
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(ddp(ids, offsets), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()]}


def ddp(rank, world_size, out_dir):
    """DDP without a comm hook on the sparsereduce group, against DDP on a gloo group, with and without
    find_unused_parameters (whose used-parameter map DDP reduces as int32 and waits on from C++)."""
    group = _group()
    gloo = dist.new_group(backend="gloo")
    out = {}
    for find_unused in (False, True):
        before = _seq(group)
        out[("sparsereduce", find_unused)] = _train(rank, group, DDP_STEPS, find_unused)
        out[("collectives", find_unused)] = _seq(group) - before
        out[("gloo", find_unused)] = _train(rank, gloo, DDP_STEPS, find_unused)
    out["error"] = None if group.error is None else str(group.error)
    return out


SCENARIOS = {f.__name__: f for f in (collectives, size_mismatch, destroy_in_flight, interrupted_wait,
                                      interrupted_barrier, ddp, completed_means_finished, caught_ctrl_c,
                                      ddp_interrupted)}


def run(rank, world_size, scenario, store_path, environment, out_dir):
    torch.set_num_threads(1)  # two ranks on a small machine
    os.environ.update(environment)
    assert spg.BACKEND == "sparsereduce"
    dist.init_process_group("sparsereduce", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=TIMEOUT_S))
    result = SCENARIOS[scenario](rank, world_size, out_dir)
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
