"""Child process of test_errors.py's fork test: a Worker with an allreduce in flight (rank 1 never joins in), then
fork(). In the child the inherited Worker and handle raise UNSUPPORTED instead of waiting for a collective that
only the parent's I/O thread runs (or, for Handle.done, saying False forever), and the child exits normally (its garbage collection must not wait for them
either). Prints one JSON line with what the child did.

argv: AGGREGATOR JOB
"""

import json
import os
import sys
import time

import numpy as np

import sparsereduce
from child_workers import join_two_ranks

aggregator, job = sys.argv[1], int(sys.argv[2])
workers = join_two_ranks(aggregator, job, collective_timeout=60.0)
handle = workers[0].allreduce_async(np.ones(1000, dtype=np.float32))

pid = os.fork()
if pid == 0:
    codes = []
    calls = (lambda: handle.wait(timeout=5), handle.done, lambda: workers[0].allreduce(np.ones(10, dtype=np.float32)))
    for call in calls:
        try:
            call()
            codes.append("returned")
        except sparsereduce.Error as e:
            codes.append(e.code)
        except Exception as e:  # noqa: BLE001  (reported to the parent)
            codes.append(repr(e))
    sys.exit(0 if codes == ["UNSUPPORTED"] * 3 else 3)  # normal exit: the interpreter finalizes

start = time.monotonic()
status = None
while time.monotonic() - start < 20:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    status = None  # hung: reported as no exit code, not as the WNOHANG poll's 0
print(json.dumps({"exit": os.waitstatus_to_exitcode(status) if status is not None else None,
                  "seconds": time.monotonic() - start}))
workers[0].abort()
for w in workers:
    w.close()
