"""The DDP comm hook against DDP's built-in gloo allreduce on a real 2-process DDP run.

With 2 ranks both sides compute g0/2 + g1/2 (DDP scales each gradient by 1/world_size before summing; the hook
does the same) and float addition of two terms is commutative, so losses, gradients and parameters must be
bit-identical, step after step.
"""

import torch_required  # noqa: F401  (fails clearly without torch)

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import ddp_training
import sparsereduce
import sparsereduce.torch as srt
from conftest import FAST

WORLD, STEPS, DEADLINE_S = 2, 6, 150


def spawn_ranks(args):
    context = mp.start_processes(ddp_training.run, args=args, nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the DDP ranks did not finish within {DEADLINE_S} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()


def test_hook_matches_ddp_builtin_allreduce_bit_for_bit(aggregator, job, tmp_path):
    spawn_ranks((WORLD, str(tmp_path / "store"), aggregator, job, STEPS, str(tmp_path)))
    for rank in range(WORLD):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        reference, hooked = result["reference"], result["sparsereduce"]
        assert len(hooked["losses"]) == STEPS
        assert hooked["losses"] == reference["losses"], f"rank {rank}"
        for name in ("grads", "params"):
            for i, (a, b) in enumerate(zip(reference[name], hooked[name])):
                assert torch.equal(a, b), f"rank {rank} {name}[{i}]: max |diff| {(a - b).abs().max()}"
        # The hook did the reducing: one collective per bucket; after DDP's first-iteration bucket rebuild
        # several buckets in the same order every step; the tables' buckets mostly zero blocks.
        steps = hooked["buckets"]
        assert len(steps) == STEPS and all(len(s) >= 2 for s in steps[1:])
        assert all([b[0] for b in s] == [b[0] for b in steps[-1]] for s in steps[1:])
        densities = [nz / blocks for s in steps for _, nz, blocks in s if blocks and blocks >= 256]
        assert densities and max(densities) < 0.5, densities
    # The ranks saw different data, so this is a real reduction (not two identical local runs).
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt")["reference"] for r in range(WORLD))
    assert r0["losses"] != r1["losses"]


def test_ddp_backward_raises_the_library_message_when_the_aggregator_dies(own_aggregator, job, tmp_path):
    """A 1-rank gloo DDP: once the aggregator is gone, backward() raises a RuntimeError carrying the library's
    message (not torch's "Unable to cast ... to Tensor"), and state.error is the typed sparsereduce.Error."""
    address, daemon = own_aggregator
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        torch.manual_seed(0)
        ddp = DistributedDataParallel(torch.nn.Linear(8, 1))
        state = srt.SparseReduceState.from_process_group(address, job, **FAST)
        ddp.register_comm_hook(state, srt.allreduce_hook)
        ddp(torch.ones(2, 8)).sum().backward()  # through the aggregator
        assert state.error is None
        assert torch.equal(ddp.module.bias.grad, torch.tensor([2.0]))
        daemon.kill()
        daemon.wait(timeout=10)
        with pytest.raises(RuntimeError) as info:
            ddp(torch.ones(2, 8)).sum().backward()
        assert isinstance(state.error, sparsereduce.Error), repr(state.error)
        assert state.error.code in ("UNAVAILABLE", "PEER_LEFT", "DEADLINE_EXCEEDED", "ABORTED"), state.error.code
        message = str(info.value)
        assert "Unable to cast" not in message
        assert str(state.error) in message and f"job {job} rank 0" in message, message
        state.close()
    finally:
        dist.destroy_process_group()


class UsedInReverse(torch.nn.Module):
    """Registered a, b; used b, then a: DDP's rebuild after the first step reorders its one bucket."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(10, 10)
        self.b = torch.nn.Linear(10, 10)

    def forward(self, x):
        return self.a(self.b(x)).sum()


def test_a_rebuilt_bucket_is_reduced_once_without_its_codec(aggregator, job, tmp_path):
    """DDP rebuilds its buckets after the first step. Here bucket 0 keeps its 220 elements but holds the parameters
    in another order, so the 3LC error feedback of its key belongs to other parameters: the hook reduces it once
    without the codec (which starts the key's state over, here and at the aggregator), then with it again."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        torch.manual_seed(0)
        ddp = DistributedDataParallel(UsedInReverse())
        state = srt.SparseReduceState.from_process_group(aggregator, job, record=True, codec="3lc", **FAST)
        layouts = []

        def hook(hook_state, bucket):
            layouts.append((bucket.index(), bucket.buffer().numel(), [id(p) for p in bucket.parameters()]))
            return srt.allreduce_hook(hook_state, bucket)

        ddp.register_comm_hook(state, hook)
        codecs = []
        for _ in range(4):
            ddp(torch.randn(4, 10)).backward()
            records = state.take_records()
            assert [r.index for r in records] == [0], records
            codecs.append(records[0].stats.codec)
        assert state.error is None, state.error
        # The premise: one bucket of the same size throughout, whose parameters changed order once.
        assert [(index, numel) for index, numel, _ in layouts] == [(0, 220)] * 4
        assert layouts[0][2] != layouts[1][2] and layouts[1][2] == layouts[2][2] == layouts[3][2]
        assert codecs == ["3lc", "none", "3lc", "3lc"], codecs
        state.close()
    finally:
        dist.destroy_process_group()


def test_the_main_thread_is_seen_inside_backward_while_the_engine_runs():
    """The process group's completion thread acts on Ctrl-C only while the main thread is in autograd's backward
    (srt._main_thread_in_backward, which names torch's engine callers): on the installed torch, another thread sees
    it inside a backward of C++ operations, and outside it once backward returned. Were the names wrong for this
    torch, Ctrl-C during a DDP backward on the sparsereduce backend would wait for the collective timeout."""
    import threading
    x = torch.randn(256, 256, requires_grad=True)
    seen = []
    stop = threading.Event()

    def sample():
        while not stop.is_set() and not any(seen):
            seen.append(srt._main_thread_in_backward())

    deadline = time.monotonic() + 30
    while not any(seen) and time.monotonic() < deadline:
        loss = x
        for _ in range(20):  # milliseconds of matrix products in the engine, which releases the GIL meanwhile
            loss = loss @ x
        loss = loss.sum()
        sampler = threading.Thread(target=sample)
        sampler.start()
        loss.backward()
        stop.set()
        sampler.join()
        stop.clear()
    assert any(seen), "never seen inside backward"
    assert not srt._main_thread_in_backward()
