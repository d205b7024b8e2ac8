"""Child process of the exit tests of test_process_group.py and test_torch_tensors.py: the script ends while a
collective of a process group (MODE 'group') or of a DDP hook state (MODE 'state') is in flight, one that rank 1
never joins. Before anything of sparsereduce is imported, a weakref.finalize is created (tempfile's
TemporaryDirectory makes one), so that weakref's own atexit hook runs after the extension's (atexit runs hooks in
reverse order of registration): the group's or state's shutdown must not wait on a thread the extension's exit
hook has parked for good. The process must end promptly with status 0.

argv: AGGREGATOR JOB MODE (the environment names the aggregator for MODE 'group')
"""

import sys
import tempfile
import threading

_directory = tempfile.TemporaryDirectory()  # the first weakref.finalize of the process, before sparsereduce's

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

aggregator, job, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

if mode == "group":
    import sparsereduce.process_group as spg

    store = dist.HashStore()
    groups = [None, None]

    def make(rank):
        groups[rank] = spg.ProcessGroup(store, rank, 2, timedelta(seconds=30))

    other = threading.Thread(target=make, args=(1,))
    other.start()
    make(0)
    other.join()
    work = groups[0].allreduce([torch.ones(1024)])  # rank 1 never joins it
else:
    import sparsereduce.torch as srt
    from child_workers import Bucket, join_two_ranks

    workers = join_two_ranks(aggregator, job, collective_timeout=30.0)
    state = srt.SparseReduceState(workers[0])
    future = srt.allreduce_hook(state, Bucket(torch.ones(1024)))  # rank 1 never joins it
print(f"{mode}: the script ends with a collective in flight", flush=True)
