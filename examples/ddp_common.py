"""What both training examples share: the command line, spawning the DDP ranks, the timed training loop and
the per-step measurements (loss per rank, step time, block density of the gradient buckets).

A run writes one JSON file (--out) that run_comparison.py turns into a table.
"""

import argparse
import json
import os
import tempfile
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def parse_args(description, steps):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend", choices=["gloo", "sparsereduce"], required=True,
                   help="gloo: DDP's built-in allreduce; sparsereduce: the sparsereduce.torch comm hook")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--aggregators", default=os.environ.get("SPARSEREDUCE_AGGREGATORS", ""),
                   help="HOST:PORT,... of the aggregators (default: $SPARSEREDUCE_AGGREGATORS)")
    p.add_argument("--job", type=int, default=1, help="sparsereduce job id, unique on the aggregators")
    p.add_argument("--out", required=True, help="JSON file for the per-step results")
    p.add_argument("--rank", type=int, default=None,
                   help="run only this rank (one process per host, e.g. on the testbed); needs --store")
    p.add_argument("--store", default=None,
                   help="with --rank: FileStore path every rank can reach, new for each run")
    p.add_argument("--codec", default="none",
                   help="sparsereduce codec: none, fp16, bf16, 3lc, diana, topk or adaptive (docs/PROTOCOL.md §11)")
    p.add_argument("--sparsity", type=float, default=1.0, help="3lc: sparsity multiplier s in [1, 2)")
    p.add_argument("--fp32-results", action="store_true", help="3lc: sums come back in fp32")
    p.add_argument("--fraction", type=float, default=0.01, help="topk: fraction of blocks")
    p.add_argument("--tensor-scale", action="store_true", help="3lc: one scale for the whole tensor")
    p.add_argument("--alpha", type=float, default=0.0, help="diana: step of the shift h (0: 1/sqrt(block size))")
    p.add_argument("--l2-norm", action="store_true", help="diana: scale by the block's l2 norm, not its max")
    return p


def launch(args, build, batches, loss_fn, make_optimizer, evaluate=None):
    """Runs `args.world_size` ranks (spawned processes, gloo process group over a FileStore), or with --rank just
    that one (the others run elsewhere with the same --store). `evaluate(model)`, if given, runs on rank 0 after
    training and returns a dict of held-out metrics for the JSON file."""
    if args.backend == "sparsereduce" and not args.aggregators:
        raise SystemExit("--backend sparsereduce needs --aggregators (or SPARSEREDUCE_AGGREGATORS)")
    if args.rank is not None:
        if args.store is None or not 0 <= args.rank < args.world_size:
            raise SystemExit("--rank needs --store and 0 <= rank < --world-size")
        _rank_main(args.rank, args, args.store, build, batches, loss_fn, make_optimizer, evaluate)
        return
    with tempfile.TemporaryDirectory() as work:
        mp.start_processes(_rank_main, args=(args, f"{work}/store", build, batches, loss_fn, make_optimizer, evaluate),
                           nprocs=args.world_size, start_method="spawn")


def block_density(buffer, block_size):
    """Fraction of the buffer's blocks that hold a nonzero element (what the sparse allreduce moves)."""
    x = buffer.detach().numpy()
    full = len(x) // block_size * block_size
    nonzero = np.count_nonzero(x[:full].reshape(-1, block_size).any(axis=1)) + int(x[full:].any())
    return nonzero, -(-len(x) // block_size)


def _rank_main(rank, args, store, build, batches, loss_fn, make_optimizer, evaluate):
    torch.set_num_threads(1)  # world_size processes share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.world_size,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)  # the same initial weights in both runs (DDP also broadcasts rank 0's)
    model = build()
    ddp = DistributedDataParallel(model)
    state = None
    if args.backend == "sparsereduce":
        import sparsereduce
        import sparsereduce.torch as srt
        codec = sparsereduce.Codec(args.codec, sparsity=args.sparsity, fp32_results=args.fp32_results,
                                   fraction=args.fraction, tensor_scale=args.tensor_scale, alpha=args.alpha,
                                   l2_norm=args.l2_norm)
        state = srt.SparseReduceState.from_process_group(args.aggregators, args.job, record=True, codec=codec)
        ddp.register_comm_hook(state, srt.allreduce_hook)
    optimizer = make_optimizer(ddp.parameters())
    steps, gathered = [], []
    for step, batch in enumerate(batches(rank, args.world_size, args.steps)):
        dist.barrier()  # every rank starts the step together: the time is the step's, not a straggler's
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(ddp, batch)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        steps.append(_measure(step, loss.item(), elapsed, state, args.world_size, gathered))
    if state is not None:
        state.close()
    if rank == 0:
        held_out = evaluate(model) if evaluate is not None else {}
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "codec": args.codec if args.backend == "sparsereduce" else None,
                       "world_size": args.world_size, "steps": steps, "evaluation": held_out,
                       "gradient_elements": sum(p.numel() for p in model.parameters())}, f, indent=1)
    # torch 1.13 can deadlock here: destroying the gloo process group joins its worker threads while holding
    # the GIL, and a worker thread that drops the last reference to a tensor Python created needs the GIL. So
    # the tensors given to gloo stay referenced from here until the group is gone.
    dist.barrier()
    del ddp
    dist.destroy_process_group()
    del gathered


def _measure(step, loss, elapsed, state, world_size, gathered):
    """Outside the timed region: gathers every rank's loss and time, and (sparsereduce) the block densities.
    The tensors given to gloo are appended to `gathered` (see the end of _rank_main)."""
    local_nonzero = local_blocks = union_nonzero = union_blocks = bytes_sent = bytes_received = collective_s = 0
    local_known = state is not None
    if state is not None:
        for record in state.take_records():
            nonzero, blocks = block_density(record.buffer, state.worker.block_size)  # the reduced result
            union_nonzero, union_blocks = union_nonzero + nonzero, union_blocks + blocks
            if record.stats is None:  # the Worker had replaced them already: this step's local density unknown
                local_known = False
            else:
                local_nonzero += record.stats.nonzero_blocks
                local_blocks += record.stats.blocks
                bytes_sent += record.stats.bytes_sent
                bytes_received += record.stats.bytes_received
                collective_s += record.stats.seconds  # start to end on the Worker's I/O thread
    mine = torch.tensor([loss, elapsed, local_nonzero, local_blocks if local_known else 0, bytes_sent,
                         collective_s, bytes_received], dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    gathered.append((mine, everyone))
    rows = torch.stack(everyone)
    known = bool((rows[:, 3] > 0).all())
    return {
        "step": step + 1,
        "losses": rows[:, 0].tolist(),  # per rank: each rank's own batch
        "time_s": float(rows[:, 1].max()),  # the slowest rank's step
        "local_density": float((rows[:, 2] / rows[:, 3]).mean()) if known else None,  # mean over ranks
        "union_density": union_nonzero / union_blocks if union_blocks else None,
        "bytes_sent_rank_mean": float(rows[:, 4].mean()) if known else None,
        "collective_s_rank_mean": float(rows[:, 5].mean()) if known else None,
        "bytes_received_rank_mean": float(rows[:, 6].mean()) if known else None,
    }
