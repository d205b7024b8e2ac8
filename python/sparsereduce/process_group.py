"""A torch.distributed backend "sparsereduce": all_reduce goes through a sparsereduce Worker, the rest through gloo.

    import torch.distributed as dist
    import sparsereduce.process_group   # registers the backend

    dist.init_process_group("sparsereduce", init_method="env://")   # or store=..., rank=..., world_size=...
    dist.all_reduce(grad)                # float32 / int32 CPU SUM: through the aggregators

A sum (ReduceOp.SUM) of one dense CPU float32 or int32 tensor goes through sparsereduce (a non-contiguous tensor
through a contiguous copy, so that the route depends only on what torch requires to match between ranks: op, dtype,
device, count). Everything else (other ops, dtypes, devices, several tensors, broadcast, allgather, barrier, ...)
goes to a gloo process group built from the same store, so the group serves DDP's setup and any other collective.

Configuration, read at init on every rank:
  SPARSEREDUCE_AGGREGATORS (required), SPARSEREDUCE_SECRET / SPARSEREDUCE_SECRET_FILE, SPARSEREDUCE_TRANSPORT,
  SPARSEREDUCE_TCP_SEND_BUFFER, SPARSEREDUCE_RDMA_DEVICE: read by the Worker, as everywhere.
  SPARSEREDUCE_JOB: the job id; unset, rank 0 draws a random 63-bit id and hands it to the others through the store,
  so that two groups (or two runs) on the same aggregators never share a job by accident.
  SPARSEREDUCE_CODEC: none (default), fp16 or bf16. The stateful codecs (3lc, diana, topk, adaptive) keep state per
  tensor key, which dist.all_reduce cannot name: use the DDP comm hook (sparsereduce.torch) for those.
All of them, and the Worker's own SPARSEREDUCE_* settings, are checked before the store and gloo's rendezvous
(ValueError naming the variable).
The group's timeout bounds the Worker's join and each collective (as torch's timeout bounds gloo's).

DDP works on this backend without a comm hook: its reducer calls allreduce and then get_future() on the returned
Work, which is this module's Python Work (see Work for what keeps it alive while C++ holds it).
"""

import collections
import os
import secrets
import threading
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

import sparsereduce
from sparsereduce._sparsereduce import check_environment as _check_environment
from sparsereduce.torch import _WAIT_SLICE_S, _ctrl_c, _join, _value_or_raise

BACKEND = "sparsereduce"
STATELESS_CODECS = ("none", "fp16", "bf16")
_CONNECT_TIMEOUT_S = 30.0  # the Worker's default: the aggregators may start a little later than the ranks
_MAX_TIMEOUT_S = 365 * 24 * 3600.0  # the Worker's limit; torch allows longer
# Finished Works that no one waited on nor asked for a future: kept this many, newest first, since C++ may still
# hold one and call wait() on it (see Work).
_UNCONSUMED_KEPT = 16
# Jobs of live groups taken from SPARSEREDUCE_JOB: a second group with the same would join the first one's job.
_env_jobs = set()
_env_jobs_lock = threading.Lock()
# The live groups' _Shared and the live Works, whose locks a child of fork() gets new (_after_fork_in_child).
_live_shared = weakref.WeakSet()
_live_works = weakref.WeakSet()


def _after_fork_in_child():
    """Another thread of the parent (a completion thread, a training thread) may have held one of these locks at
    the fork; the child has only the forking thread, which held none of them (no fork happens under them), so it
    replaces them. The group is unusable in the child anyway (its Worker raises UNSUPPORTED there), but a call or
    the exit's shutdown then raises instead of hanging for good on the copy of a held lock."""
    for shared in list(_live_shared):
        shared.ready = threading.Condition()
    for work in list(_live_works):
        work._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
sparsereduce._new_lock_after_fork(globals(), "_env_jobs_lock")


def _job_rank(job, rank):
    return f"sparsereduce process group: job {job} rank {rank}"


class Work(dist.Work):
    """One allreduce through sparsereduce. wait() raises the sparsereduce.Error itself (a RuntimeError; .code) on
    failure, TimeoutError if a wait's timeout passed first (the collective keeps running); is_completed() says
    True once the collective ended and its result is in place (a non-contiguous tensor's sum copied back, error and
    is_success() set: it finishes the Work itself if the completion thread has not yet); get_future() gives a
    torch Future of [tensor] (DDP's reducer uses it).

    A Python Work handed to C++ (DDP's reducer) lives only as long as a Python reference: once gone, C++ calls
    reach the base class, whose getFuture() raises and whose wait() never returns. So the group keeps every Work
    until its collective finished, and afterwards those not yet waited on nor asked for a future (C++ may still
    call wait(), as DDP does for its unused-parameter map) among the newest _UNCONSUMED_KEPT."""

    def __init__(self, shared, tensor, sent, handle):
        super().__init__()
        self._shared = shared
        self._tensor = tensor
        self._sent = sent  # the contiguous copy reduced in place of a non-contiguous tensor, else the tensor
        self._handle = handle
        self._lock = threading.Lock()  # replaced in a child of fork() (_after_fork_in_child)
        self._finished = False
        self._consumed = False
        self._future = None
        self.error = None  # the sparsereduce.Error once the collective failed

    def wait(self, timeout=None):
        """timeout: None or timedelta(0) (C++'s "no timeout") wait until the collective ends (its own deadline is
        the group's timeout); Ctrl-C raises KeyboardInterrupt within about 0.1 s."""
        self._consumed = True
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        try:
            # Ctrl-C on the main thread raises KeyboardInterrupt here by itself: no abort (see _complete_in_order)
            with _ctrl_c.main_thread_waits():
                self._handle.wait(seconds or None)
        except sparsereduce.Error:
            pass  # _finish takes it from the handle
        self._finish()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        """True once the collective ended and the Work is finished: the sum (of a non-contiguous tensor too) is in
        the tensor, or error is set. The handle's done() alone says so before the completion thread copied the sum
        back and recorded the error, so a Work whose handle is done is finished here first."""
        if not self._finished and self._handle.done():
            self._finish()
        return self._finished

    def is_success(self):
        return self.is_completed() and self.error is None

    def exception(self):
        self.is_completed()  # finished if done: the error is recorded
        return self.error

    def result(self):
        self.is_completed()  # finished if done: the sum is in the tensor
        return [self._tensor]

    def get_future(self):
        self._consumed = True
        with self._lock:
            if self._future is None:
                future = torch.futures.Future()
                if self._finished:
                    self._fulfil(future)
                # set_exception in torch 1.13 stores the error as the value, which DDP cannot cast to a tensor;
                # then() re-raises it, failing the returned future for real (as sparsereduce.torch's hook does).
                self._future = (future, future.then(_value_or_raise))
            return self._future[1]

    def _finish(self):
        """Once the handle is done, from whichever thread sees it first (the completion thread, wait(),
        is_completed()): copies a non-contiguous tensor's sum back, records the error, fulfils the future. Once
        only: the Work's lock orders the threads, and the later ones find it finished. The future's callbacks run
        after the lock is released (one may call back into this Work)."""
        with self._lock:
            if self._finished:
                return
            try:
                self._handle.wait()  # done: returns or raises at once
                if self._sent is not self._tensor:
                    self._tensor.copy_(self._sent)  # no overlapping elements: ProcessGroup.allreduce refused those
            except Exception as error:  # noqa: BLE001  (the Work's failure, whatever it was: wait() raises it)
                self.error = error
                if isinstance(error, sparsereduce.Error) and self._shared.error is None:
                    self._shared.error = error  # the group's first failed collective
            self._finished = True
            future = self._future[0] if self._future is not None else None
        if future is not None:
            self._fulfil(future)

    def _fulfil(self, future):
        if self.error is None:
            future.set_result([self._tensor])
        else:
            future.set_exception(self.error)


class _Shared:
    """What the group's Works, its completion thread and its finalizer share; none of them holds the group, so
    that dropping the group (dist.destroy_process_group) closes the Worker."""

    def __init__(self, worker):
        self.worker = worker
        self.pending = collections.deque()  # Works in flight, in submission order (which is completion order)
        self.ready = threading.Condition()  # replaced in a child of fork() (_after_fork_in_child)
        self.stopping = False  # set by the shutdown under `ready`: allreduce refuses from then on
        self.unconsumed = collections.deque(maxlen=_UNCONSUMED_KEPT)
        self.error = None


def _complete_in_order(shared):
    """The group's completion thread: finishes each Work once its collective ended (collectives end in submission
    order), so that futures complete without anyone calling wait(). Polls for Ctrl-C between slices of a wait, as
    sparsereduce.torch does for DDP, whose backward() waits in C++ where Python runs no signal handlers: the
    Worker is aborted so that the wait ends. Only while the main thread is inside autograd's backward (poll's
    only_in_backward): elsewhere the main thread raises the KeyboardInterrupt itself, and a program that caught it
    and went on must find its async collectives still running. Nor for a SIGINT that came while the main thread
    waited in Work.wait or barrier(), which raise KeyboardInterrupt themselves and leave the collective running,
    as Handle.wait does (_CtrlC.main_thread_waits)."""
    while True:
        with shared.ready:
            while not shared.pending and not shared.stopping:
                shared.ready.wait()
            if not shared.pending:
                return
            work = shared.pending[0]
        while True:
            try:
                work._handle.wait(timeout=_WAIT_SLICE_S)
                break
            except TimeoutError:
                # On Ctrl-C during backward the Worker is aborted: the next wait raises ABORTED.
                _ctrl_c.poll(only_in_backward=True)
            except sparsereduce.Error:
                break
        work._finish()
        with shared.ready:
            shared.pending.popleft()
            if not work._consumed:
                shared.unconsumed.append(work)
            shared.ready.notify_all()
        del work  # else this thread would hold the last Work (and its tensor) until the next collective


def _shut_down(shared, completer, env_job):
    """The group's finalizer (also at interpreter exit, before the extension's exit hook: see sparsereduce's
    _finalize_before_extension_exit): leaves the job without waiting for peers. What is still in flight then has no
    one to wait for it (the group is gone), so it is aborted rather than left to run into its deadline; the
    completion thread then ends within a wait slice. The join is bounded all the same (a future's callback runs on
    that thread), and skipped on that thread itself (garbage collection may run the finalizer there). `stopping`,
    set under the lock that allreduce submits under, makes every later allreduce refuse: a Work submitted after
    it would have no completion thread to finish it (its future would never complete)."""
    with shared.ready:
        if shared.pending:
            shared.worker.abort()
        shared.stopping = True
        shared.ready.notify_all()
    _join(completer)
    _ctrl_c.unregister(shared.worker)
    shared.worker.close()
    if env_job is not None:
        with _env_jobs_lock:
            _env_jobs.discard(env_job)


class ProcessGroup(dist.ProcessGroup):
    """The backend's process group; made by dist.init_process_group("sparsereduce", ...) or dist.new_group(...,
    backend="sparsereduce"), or directly as ProcessGroup(store, rank, world_size, timeout).

    worker: the sparsereduce.Worker; gloo: the inner gloo group; error: the first failed collective's
    sparsereduce.Error (None while all went well). close() leaves the job; dropping the group does it too."""

    def __init__(self, store, rank, world_size, timeout=timedelta(minutes=30)):
        super().__init__(rank, world_size)
        seconds = min(timeout.total_seconds(), _MAX_TIMEOUT_S)
        codec = _codec_from_environment(rank)
        env_job = _job_from_environment(rank)
        if not os.environ.get("SPARSEREDUCE_AGGREGATORS", "").strip():
            raise ValueError(f"sparsereduce process group: rank {rank}: no aggregators: set SPARSEREDUCE_AGGREGATORS "
                             "to HOST:PORT[,HOST:PORT...], the same list on every rank")
        _check_worker_environment(rank)
        # Configuration first, on every rank alike: a rank that failed would otherwise leave the others waiting
        # in the store or in gloo's rendezvous until the timeout.
        job = env_job if env_job is not None else _agree_on_job(dist.PrefixStore("sparsereduce/", store), rank,
                                                                world_size)
        if env_job is not None:
            with _env_jobs_lock:
                if env_job in _env_jobs:
                    raise ValueError(f"{_job_rank(env_job, rank)}: SPARSEREDUCE_JOB={env_job} is already the job of "
                                     "another live sparsereduce group of this process; unset it so that each group "
                                     "draws its own")
                _env_jobs.add(env_job)
        try:
            self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, world_size, timeout)
            worker = sparsereduce.Worker([], job, rank, world_size, codec=codec,
                                         connect_timeout=min(_CONNECT_TIMEOUT_S, seconds), join_timeout=seconds,
                                         collective_timeout=seconds)
        except BaseException:
            if env_job is not None:
                with _env_jobs_lock:
                    _env_jobs.discard(env_job)
            raise
        self.worker = worker
        self._job_rank = _job_rank(job, rank)
        self._shared = _Shared(worker)
        _live_shared.add(self._shared)
        self._last_work = None
        completer = threading.Thread(target=_complete_in_order, args=(self._shared,), name="sparsereduce-pg",
                                     daemon=True)
        completer.start()
        _ctrl_c.register(worker)
        self._finalizer = weakref.finalize(self, _shut_down, self._shared, completer, env_job)
        sparsereduce._finalize_before_extension_exit(self._finalizer)

    @property
    def error(self):
        return self._shared.error

    def close(self):
        """Leaves the job (aborting what is still in flight); later allreduces raise ValueError."""
        self._finalizer()

    def getBackendName(self):
        return BACKEND

    def allreduce(self, tensors, opts=None):
        """torch 1.13's overloads: allreduce(tensors, opts), allreduce(tensors, op) and allreduce(tensor, op) (one
        tensor, not in a list; with opts too)."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None:
            opts = dist.AllreduceOptions()
        elif isinstance(opts, dist.ReduceOp):  # the allreduce(tensors, op) overload
            opts, op = dist.AllreduceOptions(), opts
            opts.reduceOp = op
        if not _goes_through_sparsereduce(tensors, opts):
            return self.gloo.allreduce(tensors, opts)
        tensor = tensors[0]
        if _has_internal_overlap(tensor):
            # Through a contiguous copy, every rank would reduce it and only the copy-back would then fail.
            raise ValueError(f"{self._job_rank}: the tensor has elements that share memory (e.g. a view made by "
                             "expand()): all_reduce writes each element's sum into it, which such a tensor cannot "
                             "hold; reduce tensor.clone() instead")
        sent = tensor if tensor.is_contiguous() and not tensor.is_neg() else tensor.resolve_neg().contiguous()
        _ctrl_c.forget_earlier()  # a Ctrl-C before this collective is not one of its wait (see sparsereduce.torch)
        with self._shared.ready:  # submission and queueing in one step: the queue stays in submission order
            if self._shared.stopping:  # close() or garbage collection is shutting the group down
                raise ValueError(f"{self._job_rank}: the process group is closed (close() or "
                                 "dist.destroy_process_group())")
            work = Work(self._shared, tensor, sent, self.worker.allreduce_async(sent))
            self._shared.pending.append(work)
            _live_works.add(work)
            self._shared.ready.notify_all()
        self._last_work = weakref.ref(work)
        return work

    def barrier(self, opts=None):
        # gloo's barrier also waits for the group's earlier collectives; ours run beside gloo, so wait for them
        # here (they end in order: the last one is enough). Their errors are their Works'.
        last = self._last_work() if self._last_work is not None else None
        if last is not None:
            try:
                with _ctrl_c.main_thread_waits():  # Ctrl-C: KeyboardInterrupt, the collective keeps running
                    last._handle.wait()
            except sparsereduce.Error:
                pass
        return self.gloo.barrier() if opts is None else self.gloo.barrier(opts)

    def __repr__(self):
        return f"<sparsereduce.process_group.ProcessGroup rank={self.rank()} size={self.size()} worker={self.worker!r}>"


def _delegate(name):
    def method(self, *args, **kwargs):
        return getattr(self.gloo, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"gloo's {name}."
    return method


# Every other collective of torch 1.13's ProcessGroup goes to gloo. Defined on the class, so that calls from C++
# (DDP's broadcast of the module's state, its parameter-shape allgather) find them through torch's trampoline.
for _name in ("broadcast", "allgather", "_allgather_base", "allgather_coalesced", "allreduce_coalesced", "reduce",
              "gather", "scatter", "reduce_scatter", "_reduce_scatter_base", "alltoall", "alltoall_base", "send",
              "recv", "recv_anysource", "monitored_barrier"):
    setattr(ProcessGroup, _name, _delegate(_name))
del _name


def _goes_through_sparsereduce(tensors, opts):
    if len(tensors) != 1 or opts.reduceOp != dist.ReduceOp.SUM:
        return False
    t = tensors[0]
    return (t.device.type == "cpu" and t.layout == torch.strided and not getattr(t, "is_nested", False)
            and t.dtype in (torch.float32, torch.int32))


def _has_internal_overlap(t):
    """Whether some elements of the strided tensor share memory (torch's MemOverlap::Yes, e.g. an expand()ed view,
    which torch's own in-place ops refuse too); without torch's check, a stride of 0 in a dimension of more than
    one element, which is how such views are made."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    if check is not None:
        return check(t) == 1
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride()))


def _check_worker_environment(rank):
    """The settings the Worker reads from the environment (aggregators, transport, TCP send buffer, secret), checked
    by the extension as the Worker's constructor checks them, before the store and gloo's rendezvous: a rank that
    fails them fails at once with a ValueError naming the variable, instead of after the rendezvous while the others
    wait for it."""
    try:
        _check_environment()
    except sparsereduce.Error as error:
        raise ValueError(f"sparsereduce process group: rank {rank}: {error}") from None


def _codec_from_environment(rank):
    name = os.environ.get("SPARSEREDUCE_CODEC", "").strip() or "none"
    if name not in STATELESS_CODECS:
        raise ValueError(f"sparsereduce process group: rank {rank}: SPARSEREDUCE_CODEC={name!r}: the process group "
                         f"takes {', '.join(STATELESS_CODECS)}; the stateful codecs (3lc, diana, topk, adaptive) keep "
                         "state per tensor, which dist.all_reduce does not name: use the DDP comm hook "
                         "(sparsereduce.torch) for them")
    return name


def _job_from_environment(rank):
    text = os.environ.get("SPARSEREDUCE_JOB", "").strip()
    if not text:
        return None
    try:
        job = int(text, 10)
    except ValueError:
        job = -1
    if not 0 <= job < 1 << 64:
        raise ValueError(f"sparsereduce process group: rank {rank}: SPARSEREDUCE_JOB={text!r} is not a job id (a "
                         "decimal number from 0 to 2**64 - 1)")
    return job


def _agree_on_job(store, rank, world_size):
    """Rank 0 draws a random job id and publishes it; the others read it (store.get waits for it). The key carries
    a generation, counted in the store, so that a group created again on the same store does not read the id of
    the one before it."""
    generation = (store.add("members", 1) - 1) // world_size
    key = f"job/{generation}"
    if rank == 0:
        store.set(key, str(1 + secrets.randbelow((1 << 63) - 1)))
    return int(store.get(key))


def _create(store, rank, world_size, timeout):
    return ProcessGroup(store, rank, world_size, timeout)


if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _create)
