"""sparsereduce: sparse allreduce through aggregator daemons (OmniReduce-style).

    import numpy as np, sparsereduce
    worker = sparsereduce.Worker(["10.0.0.5:19875"], job=7, rank=rank, world_size=4)
    grad = np.zeros(1 << 20, dtype=np.float32)
    worker.allreduce(grad)                      # in place, GIL released while waiting
    handle = worker.allreduce_async(grad)       # handle.wait() / handle.done()

Arrays are reduced in place without copies: NumPy arrays (or anything with the buffer protocol) and CPU torch
tensors, C-contiguous, writable, float32 or int32. Failures raise sparsereduce.Error (a RuntimeError) whose
message names the job, rank and aggregator and whose .code is a stable name. For PyTorch DDP see
sparsereduce.torch.
"""

import atexit
import os
import pkgutil
import sys
import threading

# The extension is built into build/python/sparsereduce/ while this file stays in the source tree: let the
# package span both when both are on sys.path (installed, they are one directory).
__path__ = pkgutil.extend_path(__path__, __name__)

from ._sparsereduce import Codec, CollectiveStats, Error, Handle  # noqa: E402
from ._sparsereduce import Worker as _Worker  # noqa: E402

__all__ = ["Codec", "CollectiveStats", "Error", "Handle", "Worker", "as_buffer"]

# Interpreter exit. The extension registered an atexit hook when it was imported (just above); after it has run, a
# thread that comes back from a wait in the extension sleeps until the process ends (module.cc, ExitGate). So the
# process group's and the DDP hook state's shutdowns, which stop and join such threads, must run at exit before it:
# from this package's own atexit hook, registered after the extension's (atexit runs hooks last registered first).
# weakref.finalize's atexit hook would not do: it is registered when the process creates its first finalize (e.g.
# tempfile.TemporaryDirectory() before `import sparsereduce`), and then runs after the extension's.
_exit_finalizers = []  # weakref.finalize objects, oldest first; they hold no reference to their object
_exit_finalizers_lock = threading.Lock()


def _new_lock_after_fork(namespace, name):
    """Gives a child of fork() a new lock for the module-level lock `namespace[name]`: another thread of the parent
    may have held it at the fork, and nothing in the child would ever release that copy."""
    os.register_at_fork(after_in_child=lambda: namespace.__setitem__(name, threading.Lock()))


_new_lock_after_fork(globals(), "_exit_finalizers_lock")


def _finalize_before_extension_exit(finalizer):
    """Runs `finalizer` (a weakref.finalize) from this package's atexit hook, not weakref's, if it is still alive
    at exit."""
    finalizer.atexit = False
    with _exit_finalizers_lock:
        _exit_finalizers[:] = [f for f in _exit_finalizers if f.alive]
        _exit_finalizers.append(finalizer)


def _run_exit_finalizers():
    with _exit_finalizers_lock:
        finalizers = _exit_finalizers[::-1]  # newest first, as weakref.finalize's own hook does
        _exit_finalizers.clear()
    for finalizer in finalizers:
        try:
            finalizer()
        except Exception:  # noqa: BLE001  (as weakref.finalize's hook: report it and go on with the others)
            sys.excepthook(*sys.exc_info())


atexit.register(_run_exit_finalizers)


def _codec(codec):
    """None, a Codec, or a codec name."""
    return Codec(codec) if isinstance(codec, str) else codec


def as_buffer(array):
    """The object the extension reduces: a CPU torch tensor becomes a NumPy view of its memory; anything else
    is passed through and checked by the extension.

    The sum is written into the tensor outside torch, so this also moves the tensor's version counter, as any
    in-place operation does: autograd then refuses (RuntimeError "... modified by an inplace operation") a
    backward that saved the tensor before it was reduced, instead of silently using the sum."""
    view = _view_of(array)
    _mark_modified(array)
    return view


def _view_of(array, job_rank=None):
    """as_buffer without the version bump: the checks and the NumPy view. job_rank ("job J rank R", the Worker's)
    goes into the messages, as in the library's own."""
    _check_tensor(array, job_rank)
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(array, torch.Tensor):
        return array
    return array.detach().numpy()  # shares the tensor's memory


def _check_tensor(array, job_rank=None):
    """Raises TypeError or ValueError for a torch tensor the extension cannot reduce in place; nothing for other
    arrays (the extension checks them)."""
    torch = sys.modules.get("torch")  # no torch import unless the caller already uses torch
    if torch is None or not isinstance(array, torch.Tensor):
        return
    who = f"sparsereduce: {job_rank}:" if job_rank else "sparsereduce:"
    if getattr(array, "is_nested", False):
        raise TypeError(f"{who} expected a dense tensor, got a nested tensor")
    if array.layout != torch.strided:
        raise TypeError(f"{who} expected a dense tensor, got layout {array.layout}")
    if array.device.type != "cpu":
        raise TypeError(f"{who} expected a CPU tensor, got one on {array.device}; there is no GPU path: reduce a "
                        "CPU copy (t.cpu()) and copy the result back")
    if array.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"{who} unsupported dtype {array.dtype}; only float32 and int32 are supported (convert "
                        "with .float(); for 2 bytes per element on the wire, codec='bf16' or 'fp16')")
    if not array.is_contiguous():
        raise ValueError(f"{who} the tensor is not contiguous; allreduce works in place without copies, so pass "
                         "tensor.contiguous() and copy the result back")
    if array.is_neg():
        raise ValueError(f"{who} the tensor is a lazily negated view (its negative bit is set); its memory does "
                         "not hold its values: pass tensor.resolve_neg() and copy the result back")


def _mark_modified(array):
    """Bumps a torch tensor's version counter (see as_buffer); nothing for other arrays."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(array, torch.Tensor) or array.is_inference():
        return  # inference tensors have no version counter (and cannot be saved for backward)
    with torch.no_grad():
        array.view(-1)[:0].zero_()  # an in-place op on no element: bumps the (shared) version counter


class Worker(_Worker):
    """A member of a sparsereduce job: Worker(aggregators, job, rank, world_size, *, secret='',
    block_size=256, slots=8, blocks_per_message=128, window=1, connect_timeout=30.0, join_timeout=60.0,
    collective_timeout=1800.0, transport='', rdma_device='', rdma_port=1, rdma_gid_index=-1, tcp_send_buffer=0,
    restore_on_failure=True, yield_while_scanning=False, codec=Codec('none'), codec_seed=0), timeouts in seconds.

    transport: 'auto' (shared memory with aggregators on this host, TCP otherwise), 'tcp', 'shm' or 'rdma'; empty
    means SPARSEREDUCE_TRANSPORT, else 'auto'. `worker.transports` tells what each connection uses.
    tcp_send_buffer: SO_SNDBUF of each TCP aggregator connection in bytes; 0 means SPARSEREDUCE_TCP_SEND_BUFFER,
    else the kernel's autotuning (README, Transports: "TCP send buffer").
    restore_on_failure: when an allreduce raises, the array holds its input again, bit for bit (a copy of its
    nonzero blocks per collective); False skips the copy, and a failed allreduce leaves the array partly
    overwritten with sums.
    yield_while_scanning: give the core up between the slots it scans (per MiB of all-zero blocks), so that the
    workers of a job that share cores all announce their first blocks early; off by default, since it also hands
    the core to any other busy thread (README, "Worker library (C++)").

    codec: the compression of float32 allreduces that do not name one: a Codec, or a name ('none', 'fp16',
    'bf16', '3lc', 'diana', 'topk', 'adaptive'); every rank must use the same. codec_seed seeds DIANA's rounding.

    aggregators: a list of "HOST:PORT" or one comma-separated string, in the same order on every rank; empty
    means the SPARSEREDUCE_AGGREGATORS environment variable. Returns once all ranks joined (GIL released);
    Ctrl-C while it waits leaves the job and raises KeyboardInterrupt.
    """

    def __init__(self, aggregators, job, rank, world_size, **options):
        if isinstance(aggregators, str):
            aggregators = [a.strip() for a in aggregators.split(",") if a.strip()]
        if "codec" in options:
            options["codec"] = _codec(options["codec"]) or Codec()
        super().__init__(list(aggregators), job, rank, world_size, **options)
        self._constructed = True
        self._job_rank = f"job {self.job} rank {self.rank}"  # for argument errors, also once closed

    def allreduce(self, array, key=0, codec=None):
        """Sums `array` over all ranks, in place; returns it. `key` names the tensor from call to call (codecs
        keep error feedback or DIANA's h per key; the aggregators compare it between ranks, so distinct keys turn
        calls issued in different orders, e.g. by threads sharing this Worker, into SPEC_MISMATCH instead of
        mixed sums); `codec` (a Codec or its name) overrides the Worker's. Every rank must issue its calls in
        the same order."""
        self.allreduce_async(array, key, codec).wait()
        return array

    def allreduce_async(self, array, key=0, codec=None):
        """Starts an allreduce of `array` in place and returns a Handle (wait(), done(), stats). The array must
        not be touched until the handle is done."""
        # A call refused (closed Worker, bad codec, key or array) leaves a tensor's version counter alone: it is
        # moved once the library took the array, before the caller can look at it again.
        handle = super().allreduce_async(_view_of(array, self._job_rank), key, _codec(codec))
        _mark_modified(array)
        return handle

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        # Leaving on an exception (Ctrl-C included) aborts what is still in flight instead of waiting for it: an
        # interrupted allreduce would otherwise keep close() waiting for peers that may never come.
        if exc_type is not None:
            self.abort()
        self.close()

    def __repr__(self):
        # A failed __init__ leaves no C++ Worker behind, which the properties below would use (undefined
        # behaviour: it hung); traceback formatters repr such a `self`.
        if not self.__dict__.get("_constructed"):
            return "<sparsereduce.Worker not constructed>"
        if self.closed:
            return "<sparsereduce.Worker closed>"
        return (f"<sparsereduce.Worker job={self.job} rank={self.rank} world_size={self.world_size} "
                f"aggregators={self.aggregators}>")
