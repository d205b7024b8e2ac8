#!/usr/bin/python3
"""A small dense model under DDP: an MLP on Fashion-MNIST (the Debian package dataset-fashion-mnist).

Every gradient block is nonzero here, so this is sparsereduce's worst case: it shows the cost of the hook when
there is nothing to skip. (scikit-learn's digits were the first choice, but python3-sklearn cannot be installed
next to the project's Boost 1.81: its python3-scipy -> python3-pythran dependency needs libboost1.74-dev.)

    /usr/bin/python3 examples/fashion_mlp_ddp.py --backend gloo --out gloo.json
"""

import gzip
import os

import numpy as np
import torch
from torch import nn

import ddp_common

DATA = "/usr/share/datasets/fashion-mnist"


def make_parser():
    p = ddp_common.parse_args(__doc__.splitlines()[0], steps=50)
    p.add_argument("--batch", type=int, default=64, help="images per rank and step")
    return p


def read_idx(path, offset):
    """IDX files (big-endian header, then unsigned bytes), as the dataset ships them."""
    try:
        with gzip.open(path) as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)
    except FileNotFoundError:
        raise SystemExit(f"{path} not found: install the dataset with scripts/install-python-deps.sh")


class FashionMnist:
    """Loaded in each rank (not pickled to it)."""

    def __init__(self, batch):
        self.batch = batch

    def batches(self, rank, world_size, steps):
        """Each rank walks its own shard of one fixed shuffle (as DistributedSampler does)."""
        images = read_idx(f"{DATA}/train-images-idx3-ubyte.gz", 16).reshape(-1, 784)
        labels = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz", 8)
        order = np.random.default_rng(0).permutation(len(labels))[rank::world_size]
        for step in range(steps):
            take = order[np.arange(step * self.batch, (step + 1) * self.batch) % len(order)]
            x = torch.from_numpy(images[take].astype(np.float32) / 255.0)
            yield x, torch.from_numpy(labels[take].astype(np.int64))


def evaluate(model):
    """Loss and accuracy on the 10,000 test images."""
    images = read_idx(f"{DATA}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784)
    labels = torch.from_numpy(read_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    with torch.no_grad():
        logits = model(torch.from_numpy(images.astype(np.float32) / 255.0))
    return {"loss": float(nn.functional.cross_entropy(logits, labels)),
            "accuracy": float((logits.argmax(1) == labels).float().mean())}


def build():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def loss_fn(ddp, batch):
    x, y = batch
    return nn.functional.cross_entropy(ddp(x), y)


def make_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9)


def check_dataset():
    """Before any rank starts: one message, not one traceback per rank."""
    missing = [name for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
               if not os.path.exists(f"{DATA}/{name}")]
    if missing:
        raise SystemExit(f"{DATA}/{missing[0]} not found: install the dataset (Debian package dataset-fashion-mnist) "
                         "with scripts/install-python-deps.sh")


if __name__ == "__main__":
    args = make_parser().parse_args()
    check_dataset()
    ddp_common.launch(args, build, FashionMnist(args.batch).batches, loss_fn, make_optimizer, evaluate)
