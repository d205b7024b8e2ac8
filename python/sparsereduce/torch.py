"""PyTorch DistributedDataParallel communication hook that reduces each gradient bucket through sparsereduce.

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    import sparsereduce.torch as srt

    dist.init_process_group("gloo", ...)   # DDP still uses a process group for its setup (parameter broadcast)
    ddp = DistributedDataParallel(model)
    state = srt.SparseReduceState.from_process_group(["10.0.0.5:19875"], job=7)
    ddp.register_comm_hook(state, srt.allreduce_hook)   # before the first backward

Works with unmodified torch 1.13. Buckets must be float32 CPU tensors: for another dtype (a float64 model) or a
GPU model the hook raises TypeError before it touches the bucket, which DDP's backward() raises as a
RuntimeError whose message starts with "TypeError: sparsereduce: job J rank R: unsupported dtype torch.float64"
(the gradients stay as backward computed them, not averaged).

One state per DDP module. Several DDP modules of one process group (a GAN's generator and discriminator) can
share one Worker (one sparsereduce job), with one state each:

    g_state = srt.SparseReduceState.from_process_group(aggregators, job=7)
    d_state = srt.SparseReduceState(g_state.worker)
    generator.register_comm_hook(g_state, srt.allreduce_hook)
    discriminator.register_comm_hook(d_state, srt.allreduce_hook)

A codec compresses the buckets (`codec=` of from_process_group: a sparsereduce.Codec or a name such as "3lc").
Each bucket is reduced under the key `state.key_space << 32 | bucket index`, so error feedback and DIANA's h
follow the bucket from step to step and never mix between states. The states of one Worker get key spaces 0, 1,
2, ... in the order they are created, which must therefore be the same on every rank (the key is part of the
collective's spec), or pass `key_space=` explicitly. Registering one state on two DDP modules would mix their
buckets' codec state (both have a bucket 0): the hook cannot tell the modules apart. Results stay identical on
every rank.

DDP rebuilds its buckets after the first step (in the order the gradients became ready), so a bucket index can
keep its size but hold other parameters. The hook notices (the bucket's parameters are not the ones of its last
reduction, the same on every rank, as DDP syncs the rebuild) and reduces that bucket once without a codec, which
starts its key's codec state over on every rank and at the aggregators; otherwise the error feedback or h of
one parameter would be added to another.

Ctrl-C while DDP's backward() waits for a bucket aborts the states' Workers, so that the wait ends and
KeyboardInterrupt follows (see _CtrlC; python/README.md).
"""

import collections
import contextlib
import itertools
import os
import queue
import signal
import socket
import sys
import threading
import warnings
import weakref

import torch
import torch.distributed as dist

import sparsereduce

# One reduced bucket: DDP's bucket index, the bucket's flat buffer (it holds the averaged gradients until DDP's
# next backward refills it; with gradient_as_bucket_view=True also only until the gradients, views of it, are
# changed in place: zero_grad(), clipping) and the collective's CollectiveStats (None if the Worker had already
# replaced them).
BucketRecord = collections.namedtuple("BucketRecord", "index buffer stats")

KEY_SPACE_BITS = 32  # a bucket's key: key_space << KEY_SPACE_BITS | bucket index
_key_space_lock = threading.Lock()


sparsereduce._new_lock_after_fork(globals(), "_key_space_lock")

# The functions of torch.autograd that call into the C++ engine (backward(), autograd.grad() and its batched vjp;
# later torch versions go through graph._engine_run_backward), by module and name (not by file: an install of
# compiled files only keeps the build's paths): while one of them is the main thread's innermost Python frame, the
# main thread runs backward in C++, where Python runs no signal handlers.
_ENGINE_CALLERS = {(module, name)
                   for module in ("torch.autograd", "torch.autograd.graph")
                   for name in ("backward", "grad", "vjp", "_engine_run_backward")}


def _main_thread_in_backward():
    """Whether the main thread is inside the autograd engine (see _ENGINE_CALLERS)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return frame is not None and (frame.f_globals.get("__name__"), frame.f_code.co_name) in _ENGINE_CALLERS


class _CtrlC:
    """Ctrl-C while DDP waits for the hook's futures. torch waits in C++, where Python runs no signal handlers, so
    KeyboardInterrupt would come only once the bucket's collective ended (at the latest after collective_timeout).
    Python's C-level handler still writes the signal's number to the wakeup descriptor (signal.set_wakeup_fd): the
    completion threads poll it between slices of their waits, and on SIGINT, while its handler is Python's default
    (KeyboardInterrupt), abort the registered Workers. Their futures then fail with ABORTED, backward() returns
    and the KeyboardInterrupt follows. One per process, since signal dispositions are; it installs the descriptor
    only from the main thread and only where none is set (an asyncio loop's stays, and then Ctrl-C is late).

    Only a SIGINT of this process that comes while DDP waits counts: every hook call drops the bytes of earlier
    ones (Python has raised their KeyboardInterrupt in the main thread by the time a hook runs there; a program
    that caught it and went on must not see its next slow bucket aborted), and a forked child (a DataLoader or
    multiprocessing worker) gives the descriptor up, so that its SIGINTs do not reach the parent's socket.
    Nor does one that comes while the main thread waits in the extension itself (the process group's Work.wait
    and barrier, see main_thread_waits): that wait raises KeyboardInterrupt by itself and leaves the collective
    running; its bytes are dropped when the wait ends, so that no completion thread finds them later. The process
    group's completion thread, whose Works may be in flight while the main thread runs the program's own code,
    acts on a SIGINT only while the main thread is inside autograd's backward (poll(only_in_backward=True))."""

    def __init__(self):
        self._lock = threading.Lock()
        self._workers = weakref.WeakKeyDictionary()  # Worker -> how many registered it (states may share one)
        self._reader = self._writer = None
        self._main_thread_waits = 0  # main_thread_waits() in progress
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def register(self, worker):
        with self._lock:
            self._workers[worker] = self._workers.get(worker, 0) + 1
            if self._reader is None and threading.current_thread() is threading.main_thread():
                reader, writer = socket.socketpair()
                reader.setblocking(False)
                writer.setblocking(False)
                previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
                if previous == -1:
                    self._reader, self._writer = reader, writer
                else:  # someone else's descriptor: theirs stays
                    signal.set_wakeup_fd(previous)
                    reader.close()
                    writer.close()

    def unregister(self, worker):
        with self._lock:
            count = self._workers.pop(worker, 0) - 1
            if count > 0:
                self._workers[worker] = count

    @contextlib.contextmanager
    def main_thread_waits(self):
        """Around a wait in the extension (Handle.wait) that raises KeyboardInterrupt by itself on the main thread:
        meanwhile poll() aborts nothing, and at its end the SIGINTs that came during it are dropped (Python raises
        their KeyboardInterrupt in the main thread, in the wait or just after it). Nothing on other threads."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        with self._lock:
            self._main_thread_waits += 1
        try:
            yield
        finally:
            with self._lock:
                self._main_thread_waits -= 1
                self._drain()

    def forget_earlier(self):
        """Drops the SIGINTs that came before now (see the class). Only on the main thread, where Python has
        raised their KeyboardInterrupt; elsewhere one may be the Ctrl-C of a wait still to be polled."""
        if threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            self._drain()

    def _drain(self):
        if self._reader is None:
            return b""
        received = b""
        try:
            while chunk := self._reader.recv(4096):
                received += chunk
        except (BlockingIOError, InterruptedError):
            pass
        return received

    def _after_fork_in_child(self):
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._workers = weakref.WeakKeyDictionary()  # the parent's; unusable here anyway
        self._main_thread_waits = 0  # the forking thread is the child's only one
        if self._reader is None:
            return
        try:
            previous = signal.set_wakeup_fd(-1)
            if previous != self._writer.fileno():  # someone else's since: theirs stays
                signal.set_wakeup_fd(previous)
        except ValueError:  # not the main thread of the main interpreter: the descriptor stays set
            return
        self._reader.close()
        self._writer.close()
        self._reader = self._writer = None

    def poll(self, only_in_backward=False):
        """Aborts the registered Workers if SIGINT came since the last poll and Python would raise
        KeyboardInterrupt for it. only_in_backward (the process group's completion thread, whose Works may be
        in flight while the main thread runs the program's own code): only while the main thread is inside
        autograd's backward, in C++, where that KeyboardInterrupt cannot come until the wait for the collective
        ended; elsewhere Python raises it in the main thread by itself, and a program that caught it and went on
        must find its collectives still running. The SIGINT is dropped then (it is the main thread's)."""
        with self._lock:
            if self._main_thread_waits:
                return  # the main thread's wait takes this SIGINT (see main_thread_waits)
            received = self._drain()
            if signal.SIGINT not in received or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                return
            if only_in_backward and not _main_thread_in_backward():
                return
            workers = list(self._workers)
        for worker in workers:
            worker.abort()


_ctrl_c = _CtrlC()
_WAIT_SLICE_S = 0.1  # how often a completion thread looks for Ctrl-C
# How long a shutdown waits for a completion thread, which ends within a wait slice once told to.
_JOIN_S = 5.0


def _next_key_space(worker):
    """0, 1, 2, ... per Worker, in the order its states are created."""
    with _key_space_lock:
        spaces = worker.__dict__.setdefault("_sparsereduce_key_spaces", itertools.count())
        return next(spaces)


class _Completion:
    """What a SparseReduceState shares with its completion thread and its finalizer. Neither holds the state, so
    that a state dropped without close() (its DDP module gone) is collected and its finalizer ends the thread."""

    def __init__(self, record):
        self.pending = queue.SimpleQueue()  # (handle, future, buffer, index) per bucket; None: stop
        self.record = record
        self.records = []
        self.error = None
        self.dropped = False  # set by the finalizer: stop waiting


class SparseReduceState:
    """What the hook needs: the Worker of this rank and a thread that completes DDP's futures in order. One
    state per DDP module; several states may share one Worker (see the module's docstring).

    record=True keeps a BucketRecord per reduced bucket until take_records() (for measurements). Its buffer is
    DDP's own (no copy), which the next backward() refills: take the records after every step. With DDP's
    gradient_as_bucket_view=True the parameters' .grad are views of that buffer, so whatever changes them in
    place changes the record too, before the next backward(): zero_grad() (set_to_none=False, torch 1.13's
    default), gradient clipping (clip_grad_norm_), an in-place unscale. Take the records (or clone their buffers)
    right after backward() then.
    error: None, or the first failure of a bucket's allreduce (a sparsereduce.Error with its .code); DDP's
    backward() raises a RuntimeError carrying its message, as torch 1.13 cannot hand the exception itself through.
    key_space: the high 32 bits of this state's bucket keys; None takes the Worker's next (0 for its first
    state), so states sharing a Worker must be created in the same order on every rank.

    close() leaves the job. A state dropped without it (and at interpreter exit) only stops its completion
    thread: the buckets still in flight go on as the collectives of dropped Handles do (README), and the Worker,
    once nothing else holds it (from_process_group's state holds the only reference), is collected, which
    aborts them and leaves the job."""

    def __init__(self, worker, *, record=False, key_space=None):
        self.key_space = _next_key_space(worker) if key_space is None else int(key_space)
        if not 0 <= self.key_space < 1 << (64 - KEY_SPACE_BITS):
            raise ValueError(f"sparsereduce: key_space must be from 0 to {(1 << (64 - KEY_SPACE_BITS)) - 1}, got "
                             f"{key_space}")
        self.worker = worker
        self.world_size = worker.world_size
        self._completion = _Completion(record)
        self._layouts = {}  # bucket index -> ids of its parameters at its last reduction
        # Collectives finish in submission order, so one thread waiting on them in that order completes every
        # future as early as possible. It waits with the GIL released (Handle.wait).
        self._completer = threading.Thread(target=_complete_in_order, args=(self._completion,),
                                           name="sparsereduce-ddp", daemon=True)
        self._completer.start()
        _ctrl_c.register(worker)
        self._finalizer = weakref.finalize(self, _stop, self._completion, self._completer, worker)
        sparsereduce._finalize_before_extension_exit(self._finalizer)

    @classmethod
    def from_process_group(cls, aggregators, job, process_group=None, *, record=False, key_space=None,
                           **worker_options):
        """A state whose Worker has the group's rank and size; `job` must be the same on every rank and
        unique among the jobs the aggregators serve at the same time. `record` and `key_space` are the state's
        (see the class); `worker_options` go to sparsereduce.Worker (e.g. codec="3lc", transport="tcp")."""
        rank = dist.get_rank(process_group)
        world_size = dist.get_world_size(process_group)
        worker = sparsereduce.Worker(aggregators, job, rank, world_size, **worker_options)
        try:
            return cls(worker, record=record, key_space=key_space)
        except BaseException:  # a bad key_space: the Worker no one else holds leaves the job now
            worker.close()
            raise

    @property
    def record(self):
        return self._completion.record

    @record.setter
    def record(self, value):
        self._completion.record = value

    @property
    def error(self):
        return self._completion.error

    @error.setter
    def error(self, value):
        self._completion.error = value

    def take_records(self):
        """The BucketRecords since the last call (record=True), in reduction order."""
        records, self._completion.records = self._completion.records, []
        return records

    def close(self):
        """Stops the completion thread and leaves the job (states sharing the Worker stop working too). Call after
        the last backward has finished."""
        self._completion.pending.put(None)
        self._completer.join()  # after the buckets still queued: their collectives end by their deadline
        self._finalizer()
        self.worker.close()


def _complete_in_order(completion):
    """A state's completion thread: fulfils the hook's futures in order. Once the state is gone (_stop), it stops
    waiting and lets go of what is still queued: those handles go to the Worker's orphans."""
    while True:
        item = completion.pending.get()
        if item is None or completion.dropped:
            break
        handle, future, buffer, index = item
        del item
        try:
            while True:
                try:
                    handle.wait(timeout=_WAIT_SLICE_S)
                    break
                except TimeoutError:
                    if completion.dropped:
                        break
                    _ctrl_c.poll()  # on Ctrl-C the Worker is aborted: the next wait raises ABORTED
        except BaseException as error:  # the hook's future fails with it (see allreduce_hook)
            if completion.error is None:
                completion.error = error
            future.set_exception(error)
            continue
        if completion.dropped:
            break
        if completion.record:
            completion.records.append(BucketRecord(index, buffer, handle.stats))
        future.set_result(buffer)
    while True:  # the queue may hold more buckets (dropped) and close()'s or _stop's None
        try:
            completion.pending.get_nowait()
        except queue.Empty:
            return


def _stop(completion, completer, worker):
    """A state's finalizer (close(), garbage collection, interpreter exit before the extension's exit hook):
    ends the completion thread within a wait slice, without waiting for the buckets in flight."""
    completion.dropped = True
    completion.pending.put(None)
    _join(completer)
    _ctrl_c.unregister(worker)


def _join(thread):
    """Joins a completion thread for at most _JOIN_S (skipped on that thread itself: garbage collection may run a
    finalizer there); warns if it is still running then."""
    if thread is threading.current_thread():
        return
    thread.join(_JOIN_S)
    if thread.is_alive():
        warnings.warn(f"sparsereduce: the completion thread {thread.name} did not end within {_JOIN_S} s of the "
                      "shutdown; leaving it behind", RuntimeWarning, stacklevel=2)


def allreduce_hook(state, bucket):
    """DDP comm hook: averages the bucket over the ranks with one sparsereduce allreduce.

    Scales by 1/world_size before the sum, as DDP's built-in allreduce does when it copies each gradient into the
    bucket (gradient_as_bucket_view=False), so results match it bit for bit whenever the summation order does
    (measured: 2 and 3 ranks against gloo). With gradient_as_bucket_view=True, DDP divides the bucket instead, and
    3 ranks differed from gloo in the last bit (1.5e-8); zero blocks stay zero and are still skipped either way.

    On failure, backward() raises RuntimeError("Got the following error when running the callback: Error:
    <the library's message, naming job, rank and aggregator>...") and state.error is the sparsereduce.Error. In
    torch 1.13 Future.set_exception stores the exception as the future's value, which DDP's reducer then fails to
    cast to a tensor ("Unable to cast ... to Tensor", the message lost); so the hook returns a future chained with
    then(), whose callback re-raises the exception and so fails the returned future as a real error."""
    buffer = bucket.buffer()
    # Refused before the scaling, which would otherwise have been left in the gradients.
    sparsereduce._check_tensor(buffer, getattr(state.worker, "_job_rank", None))
    buffer.mul_(1.0 / state.world_size)
    index = bucket.index()
    layout = tuple(id(p) for p in bucket.parameters())
    codec = None  # the Worker's
    if state._layouts.setdefault(index, layout) != layout:  # DDP rebuilt its buckets (see the module's docstring)
        state._layouts[index] = layout
        codec = "none"
    _ctrl_c.forget_earlier()  # a Ctrl-C before this bucket is not one of its wait (see _CtrlC)
    handle = state.worker.allreduce_async(buffer, key=state.key_space << KEY_SPACE_BITS | index, codec=codec)
    future = torch.futures.Future()
    state._completion.pending.put((handle, future, buffer, index))
    return future.then(_value_or_raise)


def _value_or_raise(future):
    return future.wait()  # the bucket, or raises the exception set_exception stored
