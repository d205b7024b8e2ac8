"""One rank of the DDP comparison in test_torch_hook.py (run in spawned processes, so it lives in its own module).

Trains the same small recommendation-style model twice from the same initial weights on the same batches: once
with DDP's built-in allreduce (gloo), once with sparsereduce's comm hook, and saves losses, final parameters and
gradients, and what the hook saw, for the parent to compare.
"""

from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import sparsereduce.torch as srt

# Two tables of 1.25 MB: DDP's first bucket closes at 1 MB, so the gradients span several buckets.
ROWS, DIM, BAGS, IDS_PER_BAG = 20000, 16, 32, 4


class TinyRecModel(nn.Module):
    def __init__(self):
        super().__init__()
        # Dense gradients (sparse=False), mostly zero rows.
        self.users = nn.EmbeddingBag(ROWS, DIM, mode="sum")
        self.items = nn.EmbeddingBag(ROWS, DIM, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids, offsets):
        return self.mlp(torch.cat([self.users(ids, offsets), self.items(ids.flip(0), offsets)], 1)).squeeze(1)


def batches(rank, steps):
    """Per-rank batches: power-law popular ids scattered over the table (as hashed ids are)."""
    rng = np.random.default_rng(rank)
    scatter = np.random.default_rng(12345).permutation(ROWS)
    for _ in range(steps):
        ids = scatter[(rng.zipf(1.2, BAGS * IDS_PER_BAG) - 1) % ROWS]
        offsets = np.arange(0, BAGS * IDS_PER_BAG, IDS_PER_BAG)
        labels = rng.integers(0, 2, BAGS).astype(np.float32)
        yield torch.from_numpy(ids), torch.from_numpy(offsets), torch.from_numpy(labels)


def train(rank, steps, state):
    torch.manual_seed(0)
    model = TinyRecModel()
    # A small cap for the buckets after the first: each table gets its own.
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.05)
    if state is not None:
        ddp.register_comm_hook(state, srt.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    losses, buckets = [], []
    for ids, offsets, labels in batches(rank, steps):
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(ddp(ids, offsets), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if state is not None:
            buckets.append([(r.index, r.stats.nonzero_blocks if r.stats else None, r.stats.blocks if r.stats else None)
                            for r in state.take_records()])
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()],
            "grads": [p.grad.clone() for p in model.parameters()], "buckets": buckets}


def run(rank, world_size, store_path, aggregator, job, steps, out_dir):
    torch.set_num_threads(1)  # two ranks on a small machine
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    reference = train(rank, steps, None)
    state = srt.SparseReduceState.from_process_group(aggregator, job, record=True, connect_timeout=10,
                                                     join_timeout=30, collective_timeout=30)
    hooked = train(rank, steps, state)
    state.close()
    dist.destroy_process_group()
    torch.save({"reference": reference, "sparsereduce": hooked}, f"{out_dir}/rank{rank}.pt")
