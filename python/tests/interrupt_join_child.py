"""Child process of test_errors.py's Ctrl-C test of the constructor: rank 0 of a 2-rank job connects to a stand-in
aggregator (a socket here that takes the Hello and never answers), so the constructor waits for the job to form;
SIGINT arrives once the Hello did. Prints one JSON line with what happened.
"""

import json
import os
import signal
import socket
import threading
import time

import sparsereduce

listener = socket.create_server(("127.0.0.1", 0))
address = "127.0.0.1:%d" % listener.getsockname()[1]
hello_seen = threading.Event()
closed_by_worker = threading.Event()


def stand_in_aggregator():
    connection, _ = listener.accept()
    connection.settimeout(30)
    if connection.recv(4096):  # the Hello: the constructor now waits for the job to form
        hello_seen.set()
        os.kill(os.getpid(), signal.SIGINT)
    try:
        while connection.recv(4096):  # a Goodbye, then the end of the stream
            pass
        closed_by_worker.set()
    except socket.timeout:
        pass


threading.Thread(target=stand_in_aggregator, daemon=True).start()
start = time.monotonic()
try:
    sparsereduce.Worker(address, 1, 0, 2, connect_timeout=60.0, join_timeout=60.0)
    outcome = "joined"
except KeyboardInterrupt:
    outcome = "KeyboardInterrupt"
except Exception as e:  # noqa: BLE001  (reported to the parent)
    outcome = repr(e)
interrupted_after = time.monotonic() - start
left = closed_by_worker.wait(timeout=10)
print(json.dumps(dict(outcome=outcome, hello_seen=hello_seen.is_set(), interrupted_after=interrupted_after,
                      left=left)))
