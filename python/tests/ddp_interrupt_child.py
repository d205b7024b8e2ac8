"""Child process of test_torch_tensors.py's Ctrl-C test: the DDP hook's future is waited for in C++ (as DDP's
backward does), for a bucket whose collective rank 1 never joins, and SIGINT arrives meanwhile. Prints one JSON
line: how long after the signal the wait ended, whether KeyboardInterrupt came, and the state's error.

argv: AGGREGATOR JOB
"""

import json
import os
import signal
import sys
import threading
import time

import torch

import sparsereduce.torch as srt
from child_workers import Bucket, join_two_ranks

aggregator, job = sys.argv[1], int(sys.argv[2])
workers = join_two_ranks(aggregator, job)
state = srt.SparseReduceState(workers[0])


bucket_buffer = torch.ones(1000)
future = srt.allreduce_hook(state, Bucket(bucket_buffer))
sent = None
# SIGINT once the main thread calls torch's Future.wait (a profile hook sees the C call), so the signal arrives
# while it blocks in C++, not in Python code before it.
blocking = threading.Event()


def profile(frame, event, arg):
    if event == "c_call" and getattr(arg, "__name__", "") == "wait":
        blocking.set()


def interrupt():
    global sent
    if blocking.wait(timeout=30):
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)


threading.Thread(target=interrupt, daemon=True).start()
result = {}
ended = None
try:
    sys.setprofile(profile)
    try:
        future.wait()  # C++: no Python signal handler runs in here
        result["wait"] = "returned"
    finally:
        ended = time.monotonic()
        sys.setprofile(None)
except KeyboardInterrupt:
    # Raised as soon as the wait came back into Python (in place of the future's error).
    result["keyboard_interrupt"] = True
except RuntimeError:
    result["wait"] = "RuntimeError"
    try:
        time.sleep(1.0)  # Python code: the pending KeyboardInterrupt is raised here at the latest
        result["keyboard_interrupt"] = False
    except KeyboardInterrupt:
        result["keyboard_interrupt"] = True
result["wait_ended_after_signal"] = ended - sent if sent is not None else None
result["error_code"] = getattr(state.error, "code", None)
print(json.dumps(result))
state.close()
workers[1].close()
