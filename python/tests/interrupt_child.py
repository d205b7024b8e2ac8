"""Child process of test_errors.py's Ctrl-C tests: rank 0 blocks in an allreduce that rank 1 does not join, and
gets SIGINT while inside the extension's blocking call. Prints one JSON line with what happened.

argv: AGGREGATOR JOB MODE, MODE 'allreduce' (the synchronous call) or 'wait' (Handle.wait, then the handle is
dropped while the collective still runs).
"""

import gc
import json
import os
import signal
import sys
import threading
import time
import weakref

import numpy as np

from child_workers import join_two_ranks

aggregator, job, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
workers = join_two_ranks(aggregator, job)
w0, w1 = workers

# SIGINT once the main thread calls into the extension's blocking function (a profile hook sees the C call), so
# the signal arrives while it blocks, not in Python code before it. Worker.allreduce blocks in Handle.wait too.
blocking = threading.Event()


def profile(frame, event, arg):
    if event == "c_call" and getattr(arg, "__name__", "") == "wait":
        blocking.set()


def interrupt():
    if blocking.wait(timeout=30):
        os.kill(os.getpid(), signal.SIGINT)


threading.Thread(target=interrupt, daemon=True).start()
# `a` is a view of `memory`: the extension holds `a` (its buffer's exporter) while the collective runs, and the
# result can still be read from `memory` once `a` is released.
memory = np.ones(1000, dtype=np.float32)
a = memory[:]
handle = None
start = time.monotonic()
try:
    sys.setprofile(profile)
    if mode == "allreduce":
        w0.allreduce(a)
    else:
        handle = w0.allreduce_async(a)
        handle.wait()
    outcome = "returned"
except KeyboardInterrupt:
    outcome = "KeyboardInterrupt"
except Exception as e:  # noqa: BLE001  (reported to the parent)
    outcome = repr(e)
finally:
    sys.setprofile(None)
interrupted_after = time.monotonic() - start

# The collective is still in flight: dropping every reference must neither block nor let go of the array.
array = weakref.ref(a)
start = time.monotonic()
del a, handle
gc.collect()
dropped_after = time.monotonic() - start
held = array() is not None

# Rank 1 joins the collective, then both run another one: collectives finish in order, so rank 0's first is done.
w1.allreduce(np.full(1000, 2, dtype=np.float32))
second = threading.Thread(target=w1.allreduce, args=(np.ones(4, dtype=np.float32),))
second.start()
w0.allreduce(np.ones(4, dtype=np.float32))
second.join()
first_result = float(memory[0])
w0.close()
w1.close()
gc.collect()
print(json.dumps(dict(outcome=outcome, interrupted_after=interrupted_after, dropped_after=dropped_after, held=held,
                      first_result=first_result, released=array() is None)))
