"""Child process of test_errors.py's exit test: the script ends with an exception while a daemon thread waits in
an allreduce that rank 1 never joins (as the DDP hook's completer thread waits for a bucket). Python ends such a
thread when it next takes the GIL during interpreter exit; the process must still end with the script's own exit
status, not SIGABRT.

argv: AGGREGATOR JOB
"""

import sys
import threading

import numpy as np

from child_workers import join_two_ranks

aggregator, job = sys.argv[1], int(sys.argv[2])
workers = join_two_ranks(aggregator, job)

# The script ends once the thread has called into the extension's wait (a profile hook sees the C call).
waiting = threading.Event()


def profile(frame, event, arg):
    if event == "c_call" and getattr(arg, "__name__", "") == "wait":
        waiting.set()


def blocked():
    # Waits in slices of 1 ms, so that the thread retakes the GIL many times while the interpreter exits (one wait
    # of 100 ms slices often outlasts the whole exit). Every retake but the ones in Python code is in the extension.
    handle = workers[0].allreduce_async(np.ones(1 << 10, np.float32))
    sys.setprofile(profile)
    while True:
        try:
            handle.wait(timeout=0.001)
        except TimeoutError:
            pass


threading.Thread(target=blocked, daemon=True).start()
waiting.wait()
raise RuntimeError("the training loop failed (simulated)")
