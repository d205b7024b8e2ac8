"""Child process of the exit tests of test_process_group.py and test_torch_tensors.py: the script ends while a
collective of a process group (MODE 'group') or of a DDP hook state (MODE 'state') is in flight, one that rank 1
never joins. Before anything of sparsereduce is imported, a weakref.finalize is created (tempfile's
TemporaryDirectory makes one), so that weakref's own atexit hook runs after the extension's (atexit runs hooks in
reverse order of registration): the group's or state's shutdown must not wait on a thread the extension's exit
hook has parked for good. The process must end promptly with status 0.

In MODE 'group' rank 1 is a process of its own (this script again, MODE 'group-rank1', a client of this one's
TCPStore). Two ranks' groups built at once on two threads of one process build their gloo groups at once, and torch
1.13's ProcessGroupGloo constructor registers its Python object with pybind11 without holding the GIL: racing, the
two corrupted pybind11's instance registry, and about one exit in 200 under load aborted at exit
("pybind11_object_dealloc(): Tried to deallocate unregistered instance!", while freeing a gloo group).

argv: AGGREGATOR JOB MODE [STORE_PORT] (the environment names the aggregator for the group modes)
"""

import subprocess
import sys
import tempfile

_directory = tempfile.TemporaryDirectory()  # the first weakref.finalize of the process, before sparsereduce's

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

aggregator, job, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

if mode == "group-rank1":
    import sparsereduce.process_group as spg

    store = dist.TCPStore("127.0.0.1", int(sys.argv[4]), 2, False, timedelta(seconds=30))
    group = spg.ProcessGroup(store, 1, 2, timedelta(seconds=30))
    sys.stdin.read()  # until rank 0's process has ended (its end of the pipe closes): never joins its collective
elif mode == "group":
    import sparsereduce.process_group as spg

    store = dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
    # Its stdin is kept open until this process ends.
    rank1 = subprocess.Popen([sys.executable, __file__, aggregator, str(job), "group-rank1", str(store.port)],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    group = spg.ProcessGroup(store, 0, 2, timedelta(seconds=30))
    work = group.allreduce([torch.ones(1024)])  # rank 1 never joins it
else:
    import sparsereduce.torch as srt
    from child_workers import Bucket, join_two_ranks

    workers = join_two_ranks(aggregator, job, collective_timeout=30.0)
    state = srt.SparseReduceState(workers[0])
    future = srt.allreduce_hook(state, Bucket(torch.ones(1024)))  # rank 1 never joins it
print(f"{mode}: the script ends with a collective in flight", flush=True)
