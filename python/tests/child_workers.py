"""What the child scripts of the Ctrl-C, fork and exit tests share: both ranks of a 2-rank job, in this process, and
a stand-in for DDP's gradient bucket."""

import threading

import sparsereduce


def join_two_ranks(aggregator, job, collective_timeout=20.0):
    """The Workers of rank 0 and rank 1, joined at the same time (each constructor returns once the other joined)."""
    workers = [None, None]

    def join(rank):
        workers[rank] = sparsereduce.Worker(aggregator, job, rank, 2, connect_timeout=5.0, join_timeout=10.0,
                                            collective_timeout=collective_timeout)

    joiner = threading.Thread(target=join, args=(1,))
    joiner.start()
    join(0)
    joiner.join()
    return workers


class Bucket:
    """What the DDP hook uses of torch.distributed.GradBucket: bucket 0, holding `buffer`."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def parameters(self):
        return []
