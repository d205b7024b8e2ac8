#!/usr/bin/python3
"""Click-through prediction with a large embedding table under DDP: naturally sparse gradients.

Each sample is a bag of item ids drawn with a power-law (Zipf) popularity, as in recommendation logs; ids are
scattered over the table as hashed ids are. The table's gradient is dense to DDP (sparse=False) but only the
rows a batch touched are nonzero, so most 256-element blocks of the gradient bucket are zero.

    /usr/bin/python3 examples/embedding_ddp.py --backend gloo --out gloo.json
    /usr/bin/python3 examples/embedding_ddp.py --backend sparsereduce --aggregators 127.0.0.1:19875 --out sr.json

(PYTHONPATH must reach the sparsereduce package: build/python and python/; run_comparison.py sets it.)
"""

import numpy as np
import torch
from torch import nn

import ddp_common

ZIPF_S = 1.05  # popularity exponent, typical of item and query logs


def make_parser():
    p = ddp_common.parse_args(__doc__.splitlines()[0], steps=30)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=256, help="bags per rank and step")
    p.add_argument("--bag", type=int, default=20, help="ids per bag")
    return p


class ClickModel(nn.Module):
    def __init__(self, rows, dim):
        super().__init__()
        self.items = nn.EmbeddingBag(rows, dim, mode="mean", sparse=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, ids, offsets):
        return self.mlp(self.items(ids, offsets)).squeeze(1)


class ClickLog:
    """Synthetic, deterministic click log: popularity rank k has probability proportional to 1/k^s; a hidden
    per-item score decides the click probability of a bag."""

    def __init__(self, rows, batch, bag):
        self.rows, self.batch, self.bag = rows, batch, bag
        weights = 1.0 / np.arange(1, rows + 1) ** ZIPF_S
        self.cdf = np.cumsum(weights) / weights.sum()
        fixed = np.random.default_rng(2024)
        self.row_of_rank = fixed.permutation(rows)  # hashing scatters popular ids over the table
        self.score = fixed.standard_normal(rows)

    def batches(self, rank, world_size, steps):
        rng = np.random.default_rng([rank, world_size])
        for _ in range(steps):
            popularity = np.minimum(np.searchsorted(self.cdf, rng.random(self.batch * self.bag)), self.rows - 1)
            ids = self.row_of_rank[popularity]
            bag_score = self.score[ids].reshape(self.batch, self.bag).mean(axis=1)
            clicks = rng.random(self.batch) < 1 / (1 + np.exp(-3 * bag_score))
            offsets = np.arange(0, self.batch * self.bag, self.bag)
            yield (torch.from_numpy(ids), torch.from_numpy(offsets), torch.from_numpy(clicks.astype(np.float32)))


class HeldOut:
    """20 batches from a stream no rank trains on: loss and click accuracy (logit > 0 predicts a click)."""

    def __init__(self, log):
        self.log = log

    def __call__(self, model):
        losses, correct, total = [], 0, 0
        with torch.no_grad():
            for ids, offsets, clicks in self.log.batches(10_000, 1, 20):
                logits = model(ids, offsets)
                losses.append(float(nn.functional.binary_cross_entropy_with_logits(logits, clicks)))
                correct += int(((logits > 0).float() == clicks).sum())
                total += len(clicks)
        return {"loss": sum(losses) / len(losses), "accuracy": correct / total}


def loss_fn(ddp, batch):
    ids, offsets, clicks = batch
    return nn.functional.binary_cross_entropy_with_logits(ddp(ids, offsets), clicks)


class Build:
    def __init__(self, rows, dim):
        self.rows, self.dim = rows, dim

    def __call__(self):
        return ClickModel(self.rows, self.dim)


def make_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.5)


if __name__ == "__main__":
    args = make_parser().parse_args()
    log = ClickLog(args.rows, args.batch, args.bag)
    ddp_common.launch(args, Build(args.rows, args.dim), log.batches, loss_fn, make_optimizer, HeldOut(log))
