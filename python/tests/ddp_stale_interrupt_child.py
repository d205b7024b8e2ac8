"""Child process of test_torch_tensors.py's stale Ctrl-C test: SIGINTs that are not a Ctrl-C of a DDP wait (one
the program caught in its own code, one of a forked child) must not abort a later bucket whose collective simply
takes longer than a poll slice (rank 1 comes 0.3 s after rank 0). Prints one JSON line with each bucket's outcome.

argv: AGGREGATOR JOB
"""

import json
import os
import signal
import sys
import time

import torch

import sparsereduce.torch as srt
from child_workers import Bucket, join_two_ranks

aggregator, job = sys.argv[1], int(sys.argv[2])
workers = join_two_ranks(aggregator, job)
states = [srt.SparseReduceState(workers[0]), srt.SparseReduceState(workers[1])]


def skewed_bucket(while_rank_0_waits=None):
    """Rank 1's bucket 0.3 s after rank 0's: rank 0's wait spans several poll slices."""
    buffers = [torch.ones(1000), torch.ones(1000)]
    f0 = srt.allreduce_hook(states[0], Bucket(buffers[0]))
    if while_rank_0_waits:
        while_rank_0_waits()
    time.sleep(0.3)
    f1 = srt.allreduce_hook(states[1], Bucket(buffers[1]))
    outcome = []
    for future in (f0, f1):
        try:
            outcome.append(future.wait()[:2].tolist())
        except RuntimeError as error:
            outcome.append(str(error).splitlines()[0][:200])
    return outcome


result = {}
# 1. A Ctrl-C in the program's own code, caught there; training goes on.
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1.0)  # Python code: the KeyboardInterrupt is raised here
    result["caught"] = False
except KeyboardInterrupt:
    result["caught"] = True
result["after_caught_ctrl_c"] = skewed_bucket()
# 2. A forked child (as a DataLoader worker) that gets SIGINT and ends, while rank 0 waits.
def child_ctrl_c():
    child = os.fork()
    if child == 0:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
        except KeyboardInterrupt:
            pass
        os._exit(0)
    os.waitpid(child, 0)


result["after_child_ctrl_c"] = skewed_bucket(while_rank_0_waits=child_ctrl_c)
result["errors"] = [getattr(s.error, "code", None) for s in states]
print(json.dumps(result))
for s in states:
    s.close()
