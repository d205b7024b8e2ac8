#!/usr/bin/python3
"""Sparse baseline for sparsereduce: PyTorch's gloo all_reduce of a sparse COO tensor.

torch.distributed (gloo backend) reduces a sparse tensor by allgathering every rank's indices and values and
summing them locally, so each rank receives the nonzeros of every other rank. This script measures that on synthetic
tensors with the same parameters as our perf tool's (blocks of --block-size elements, a --density fraction of them
nonzero per rank, placed at random per rank, identically on all ranks, or on disjoint blocks; drawn by its own
generator, values in [0.5, 1.5)) and prints one row per size and density in the same table format as
sparsereduce-gloo-bench (sent/recv as "-": torch does not report them).

Sizes sweep as sparsereduce-perf's and sparsereduce-gloo-bench's do: -b/--minbytes to -e/--maxbytes (K/M/G
suffixes, powers of 1024), each size -f/--stepfactor times the one before, rounded down to whole float elements (a
size equal to the one before is skipped). --size S is the single-size sweep -b S -e S; without any of them the
sweep is the one size 64M. With several densities, each density sweeps the sizes in turn.

Run it with Debian's interpreter, which has python3-torch (scripts/install-bench-deps.sh):

    /usr/bin/python3 bench/torch_sparse_baseline.py --spawn 4 --size 64M --density 0.01,0.1 -n 5 -w 2
    /usr/bin/python3 bench/torch_sparse_baseline.py --spawn 4 -b 64K -e 64M -f 4 --density 0.01 --overlap disjoint

or one process per rank: --rank R --world-size W and either --init-file PATH (shared file, absent or empty before
the run) or --master-addr/--master-port (rank 0 listens there).

Timing: per iteration a fresh copy of the sparse input, a barrier, one timed all_reduce, a barrier (so that no rank
copies or checks while another is still timed), then the check; per-iteration times
are reduced with max over ranks and the median over iterations is reported. Every result is coalesced, made dense
and compared with the dense sum of all ranks' inputs (each rank regenerates them from the seed); #wrong counts
elements failing allclose(rtol=1e-5), summed over ranks (the worst iteration on each rank).

--json names its fields as sparsereduce-perf does where the meaning is the same (time_us_median, wrong, density,
union_density, iterations, warmup_iterations, check (a boolean), complete, ...); bytes_sent and bytes_received are
null: torch does not report them. Rank 0 rewrites the file before the first row and after every row, with
"complete": false until the sweep has ended, so a run that fails or is stopped part-way (--run-timeout, Ctrl-C)
leaves the rows measured so far, with "complete": false.

Signals, as sparsereduce-perf's --spawn: SIGINT, SIGTERM or SIGHUP to the --spawn process (not only Ctrl-C, which
reaches the whole process group) stops every rank with SIGTERM, waits for them, removes the rendezvous directory and
exits 128 + the signal; rank 0's --json keeps the rows measured so far, with "complete": false. The ranks get
SIGTERM when the --spawn process ends in any way (PR_SET_PDEATHSIG), so one killed outright (SIGKILL) leaves no rank
running (only its /tmp/sparsereduce-torch-* directory).

Exit status, as sparsereduce-perf's: 0 ok, 1 the run failed (a rank failed, --run-timeout passed), 2 usage error
(also a --json file that cannot be opened), 3 wrong results (-c 1 found elements that differ from the sum), 128 + N
a --spawn run stopped by signal N (SIGINT, SIGTERM, SIGHUP).
"""

import argparse
import contextlib
import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


DEFAULT_BYTES = 64 << 20  # the sweep without -b, -e or --size: one size, 64M
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_WRONG = 0, 1, 2, 3
EXIT_STATUS = ("exit status: 0 ok; 1 the run failed (a rank failed, --run-timeout passed); 2 usage error (also a "
               "--json file that cannot be opened); 3 wrong results (-c 1 found elements that differ from the sum); "
               "128 + N a --spawn run stopped by signal N (SIGINT, SIGTERM, SIGHUP). As sparsereduce-perf's.")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 10.0  # after a stop signal, the ranks' time to end on SIGTERM before they are killed
PR_SET_PDEATHSIG = 1


def parse_bytes(text):
    """'64M' -> 67108864; K, M, G are powers of 1024."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    suffix = text[-1:].upper()
    try:
        if suffix in scale:
            return int(text[:-1]) * scale[suffix]
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad byte count '{text}' (suffixes: K, M, G)")


def parse_step_factor(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad factor '{text}'")
    if not math.isfinite(value) or value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a finite factor above 1")
    return value


def sweep_sizes(min_bytes, max_bytes, factor, element_bytes=4):
    """The sizes of a -b/-e/-f sweep, as sparsereduce-perf's: each factor times the one before, rounded down to whole
    elements, a size equal to the one before skipped, none above max_bytes."""
    sizes, size = [], float(min_bytes)
    while size <= max_bytes * 1.0000001:
        nbytes = min(int(size), max_bytes) // element_bytes * element_bytes
        if not sizes or nbytes != sizes[-1]:  # a factor below 2 rounds two steps down to one size
            sizes.append(nbytes)
        size *= factor
    return sizes


def parse_densities(text):
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad density list '{text}'")
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError("densities must be in [0, 1]")
    return values


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EXIT_STATUS)
    p.add_argument("--world-size", type=int, help="number of ranks (manual mode)")
    p.add_argument("--rank", type=int, help="this process's rank (manual mode; default: $RANK)")
    p.add_argument("--spawn", type=int, metavar="W",
                   help="start W ranks on this host and wait for them; SIGINT, SIGTERM or SIGHUP to this process stops "
                   "them (SIGTERM), waits for them, removes their rendezvous directory and exits 128 + the signal; "
                   "killed outright (SIGKILL), its ranks get SIGTERM")
    p.add_argument("-b", "--minbytes", type=parse_bytes, help="smallest size in bytes (K/M/G = 2^10/2^20/2^30; "
                   "default 64M)")
    p.add_argument("-e", "--maxbytes", type=parse_bytes, help="largest size in bytes (default 64M)")
    p.add_argument("-f", "--stepfactor", type=parse_step_factor, default=2.0,
                   help="size multiplier between rows (above 1, default 2; sizes round down to whole elements)")
    p.add_argument("--size", type=parse_bytes, help="bytes per tensor (K/M/G): the single-size sweep -b SIZE -e SIZE")
    p.add_argument("--density", type=parse_densities, default=[0.01],
                   help="fraction of nonzero blocks per rank; a comma-separated list sweeps the sizes once for each")
    p.add_argument("--block-size", type=int, default=256, help="elements per block")
    p.add_argument("--overlap", choices=["random", "full", "disjoint"], default="random",
                   help="random: each rank picks its own blocks; full: all ranks pick the same blocks; disjoint: "
                   "blocks are dealt to the ranks round-robin and each rank keeps a density*W fraction of its own "
                   "(capped at all of them: at most 1/W of the blocks per rank)")
    p.add_argument("-n", "--iters", type=int, default=10, help="timed iterations per size and density")
    p.add_argument("-w", "--warmup", type=int, default=3, help="untimed iterations per size and density")
    p.add_argument("-c", "--check", type=int, choices=[0, 1], default=1, help="check every result")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--master-addr", help="rendezvous over TCP: rank 0's address")
    p.add_argument("--master-port", type=int, help="rendezvous over TCP: rank 0's port")
    p.add_argument("--init-file", help="rendezvous through this shared file")
    p.add_argument("--timeout", type=int, default=300, help="seconds allowed for each collective")
    p.add_argument("--run-timeout", type=int, default=3600, help="seconds allowed for the whole --spawn run")
    p.add_argument("--json", help="also write the results as JSON (rank 0 rewrites it after every row: a run that "
                   "fails or is stopped part-way leaves the rows measured so far, with \"complete\": false)")
    return p


# ---------------------------------------------------------------------------------------------------------------
# Synthetic tensors


def nonzero_blocks(args, size, rank, density, torch):
    """Sorted indices of rank's nonzero blocks in a tensor of size bytes.

    random and full: round(density x blocks) blocks (at least one if density > 0) picked at random, with a seed of
    the rank's own (random) or one seed for all ranks (full). disjoint, as the C++ synthetic tensors
    (tools/common/synthetic_tensor.cc): block b is rank b % W's, and each rank keeps round(min(density x W, 1) x its
    blocks) of its own (at least one if density > 0), so at most 1/W of the blocks per rank and none shared.
    """
    num_blocks = (size // 4 + args.block_size - 1) // args.block_size
    if args.overlap == "disjoint":
        candidates = torch.arange(rank, num_blocks, args.world_size)
        fraction = min(density * args.world_size, 1.0)
    else:
        candidates = torch.arange(num_blocks)
        fraction = density
    k = min(candidates.numel(), round(fraction * candidates.numel()))
    if density > 0:
        k = max(k, min(1, candidates.numel()))
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + (0 if args.overlap == "full" else rank + 1))
    return torch.sort(candidates[torch.randperm(candidates.numel(), generator=g)[:k]]).values


def make_dense(args, rank, density, size, torch):
    """rank's float32 tensor of size bytes: nonzero blocks hold values in [0.5, 1.5) (no zeros, so to_sparse keeps
    them all)."""
    elements = size // 4
    out = torch.zeros(elements, dtype=torch.float32)
    blocks = nonzero_blocks(args, size, rank, density, torch)
    g = torch.Generator().manual_seed(args.seed * 7_000_003 + rank)
    index = (blocks.unsqueeze(1) * args.block_size + torch.arange(args.block_size)).reshape(-1)
    index = index[index < elements]
    out[index] = torch.rand(index.numel(), generator=g) + 0.5
    return out


def union_density(args, world, density, size, torch):
    num_blocks = (size // 4 + args.block_size - 1) // args.block_size
    seen = torch.zeros(num_blocks, dtype=torch.bool)
    for r in range(world):
        seen[nonzero_blocks(args, size, r, density, torch)] = True
    return seen.sum().item() / num_blocks


# ---------------------------------------------------------------------------------------------------------------
# One rank


def run_rank(args):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    world, rank = args.world_size, args.rank
    results = []
    if rank == 0 and args.json:  # no rows yet: what a run stopped before its first row leaves
        write_json(args, world, results, False, torch)
    try:  # a run that fails, from the rendezvous on, still writes what it measured ("complete": false)
        measure(args, world, rank, results, torch, dist, datetime)
    except Exception:
        if rank == 0 and args.json:
            write_json(args, world, results, False, torch)
        raise
    if rank == 0 and args.json:
        write_json(args, world, results, True, torch)
    dist.destroy_process_group()
    return exit_status(results)


def exit_status(results):
    """0, or EXIT_WRONG if any row found wrong elements (a row with wrong None was not checked)."""
    return EXIT_WRONG if any(r["wrong"] for r in results) else EXIT_OK


def write_json(args, world, results, complete, torch):
    """Replaces the --json file's content with the whole document (serialized first, then renamed over it); rank 0 calls
    it before the first row, after every row (before printing it) and at the end. Names as sparsereduce-perf's where
    the meaning is the same ("check" a boolean, as perf's); the rows carry their own densities."""
    doc = {"tool": "torch-sparse", "torch": torch.__version__, "world_size": world, "dtype": "float",
           "block_size": args.block_size, "overlap": args.overlap, "transports": ["tcp"],
           "iterations": args.iters, "warmup_iterations": args.warmup, "check": bool(args.check), "seed": args.seed,
           "complete": complete, "results": results}
    text = json.dumps(doc, indent=1) + "\n"
    # A regular file is replaced by a rename, as sparsereduce-perf does: a reader never sees half a document.
    # Anything else (a symlink, a FIFO, /dev/stdout) is written in place.
    if os.path.isfile(args.json) and not os.path.islink(args.json):
        temp = f"{args.json}.tmp.{os.getpid()}"
        try:
            with open(temp, "w") as f:
                f.write(text)
            os.replace(temp, args.json)
            return
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
    with open(args.json, "w") as f:
        f.write(text)


def measure(args, world, rank, results, torch, dist, datetime):
    """Joins the group and measures one row per density and size, appended to results (and written to --json) as it
    is measured."""
    if args.init_file:
        init = "file://" + os.path.abspath(args.init_file)
    else:
        init = f"tcp://{args.master_addr}:{args.master_port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))

    if rank == 0:
        print(f"# torch_sparse_baseline: {world} ranks, torch {torch.__version__} gloo all_reduce of a sparse COO "
              f"tensor (allgather-based), float, block {args.block_size}, overlap {args.overlap}")
        print(f"# time: median over {args.iters} iterations of the slowest rank's all_reduce (after a barrier); "
              "busbw uses the dense formula algbw*2(n-1)/n")
        if args.overlap == "disjoint" and any(d > 1 / world for d in args.density):
            print(f"# disjoint overlap gives each rank at most 1/{world} of the blocks: a density above "
                  f"{1 / world:g} is capped (the table shows the density used)")
        print("#%11s %12s %6s %6s %11s %12s %12s %7s %8s %7s %12s %12s" % (
            "size", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "density",
            "union", "sent(B)", "recv(B)"), flush=True)

    for density in args.density:
        for size in args.sizes:
            measure_size(args, world, rank, results, torch, dist, density, size)  # writes --json (rank 0)


def measure_size(args, world, rank, results, torch, dist, density, size):
    """One row: size bytes at density."""
    elements = size // 4
    dense = make_dense(args, rank, density, size, torch)
    sparse = dense.to_sparse()
    expected = None
    if args.check:
        expected = torch.zeros(elements, dtype=torch.float32)
        for r in range(world):
            expected += dense if r == rank else make_dense(args, r, density, size, torch)
    del dense

    times, worst_wrong = [], 0
    for it in range(args.warmup + args.iters):
        tensor = sparse.clone()
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        elapsed = time.perf_counter() - start
        if it >= args.warmup:
            times.append(elapsed * 1e6)
        # No rank checks (nor clones the next input) while another is still timed: a rank whose all_reduce ended
        # first used to do both meanwhile, on the cores the others' all_reduce needed.
        dist.barrier()
        if args.check:
            got = tensor.coalesce().to_dense()
            wrong = (~torch.isclose(got, expected, rtol=1e-5, atol=1e-6)).sum().item()
            worst_wrong = max(worst_wrong, wrong)

    # The collective takes as long as its slowest rank: max over ranks, per iteration.
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    w = torch.tensor([worst_wrong], dtype=torch.int64)
    dist.all_reduce(w)
    per_iter = t.tolist()
    median = statistics.median(per_iter)
    algbw = size / 1e9 / (median / 1e6)
    busbw = algbw * 2 * (world - 1) / world
    num_blocks = (elements + args.block_size - 1) // args.block_size
    actual_density = nonzero_blocks(args, size, rank, density, torch).numel() / num_blocks
    row = {"size": size, "count": elements, "density": actual_density, "requested_density": density,
           "union_density": union_density(args, world, density, size, torch), "time_us_median": median,
           "time_us_min": min(per_iter), "time_us_max": max(per_iter), "algbw": algbw, "busbw": busbw,
           "wrong": int(w.item()) if args.check else None, "bytes_sent": None, "bytes_received": None,
           "nnz_per_rank": sparse._nnz()}
    results.append(row)
    if rank == 0 and args.json:  # before the row is printed: a row printed is in the file, whenever the run stops
        write_json(args, world, results, False, torch)
    if rank == 0 and row["wrong"]:
        print(f"torch_sparse_baseline: {row['wrong']} wrong elements at {size} bytes, density {density:g}",
              file=sys.stderr, flush=True)
    if rank == 0:
        print("%12d %12d %6s %6s %11.1f %12.2f %12.2f %7s %8.3f %7.3f %12s %12s" % (
            size, elements, "float", "sum", median, algbw, busbw,
            "N/A" if row["wrong"] is None else str(row["wrong"]), row["density"], row["union_density"], "-", "-"),
            flush=True)


# ---------------------------------------------------------------------------------------------------------------
# --spawn: W ranks on this host


def rank_preexec(parent):
    """The ranks' preexec_fn: SIGTERM when the --spawn process (parent) ends, even killed outright
    (PR_SET_PDEATHSIG), and no start at all if it ended already (before the prctl). prctl is looked up here, in
    the parent: the child only calls it between fork and exec."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec():
        if prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(127)
    return preexec


def run_spawn(args, argv):
    # Forward everything except the spawn-mode options; each rank gets its identity and a fresh rendezvous file.
    forwarded, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--spawn", "--json"):
            skip = True
            continue
        if a.startswith("--spawn=") or a.startswith("--json="):
            continue
        forwarded.append(a)
    # A stop signal is noted here and acted on by wait_for_ranks (it stops the ranks, waits for them, and the
    # directory is removed on the way out); the default action killed this process alone, the ranks ran on.
    stopped = []
    previous = {sig: signal.signal(sig, lambda signum, frame: stopped.append(signum)) for sig in STOP_SIGNALS}
    try:
        with tempfile.TemporaryDirectory(prefix="sparsereduce-torch-") as tmp:
            init_file = os.path.join(tmp, "rendezvous")
            procs, preexec = [], rank_preexec(os.getpid())
            for r in range(args.spawn):
                if stopped:  # no more ranks once stopped
                    break
                cmd = [sys.executable, os.path.abspath(__file__), *forwarded, "--rank", str(r),
                       "--world-size", str(args.spawn), "--init-file", init_file]
                if r == 0 and args.json:
                    cmd += ["--json", args.json]
                procs.append(subprocess.Popen(cmd, stdout=None if r == 0 else subprocess.DEVNULL,
                                              preexec_fn=preexec))
            return wait_for_ranks(procs, args.run_timeout, stop=lambda: stopped[0] if stopped else 0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def describe_exit(code):
    """Popen.returncode -> 'exit code 3' or 'killed by signal 9 (SIGKILL)', as the C++ tools say it."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"killed by signal {-code}"


def wait_for_ranks(procs, run_timeout, poll_s=0.05, stop=lambda: 0):
    """Waits for the rank processes (procs[r] is rank r); returns the exit status for --spawn.

    Every process is polled on every pass, so the first rank to fail is noticed at once, whichever it is: that rank
    is named with its exit status, the others are killed (they would wait for it until --timeout) and 1 is returned.
    A rank that exits 3 finished with wrong results (all ranks count the same sum): the others are left to finish
    (rank 0 still writes --json), and 3 is returned once all have exited with 0 or 3. Past run_timeout seconds all
    are killed and 1 is returned; 0 once every rank has exited with 0. Once stop() gives a signal number, every
    rank still running gets SIGTERM (and SIGKILL if it has not ended STOP_GRACE_S later), and 128 + the signal is
    returned once all have ended.
    """
    deadline = time.monotonic() + run_timeout
    try:
        while True:
            if stop():
                return stop_ranks(procs, stop())
            codes = [p.poll() for p in procs]  # a list, not any(): every rank is polled
            failed = [(r, code) for r, code in enumerate(codes) if code not in (None, EXIT_OK, EXIT_WRONG)]
            if failed and stop():  # Ctrl-C reaches the ranks too: they end as this process notes the signal
                return stop_ranks(procs, stop())
            if failed:
                for r, code in failed:
                    print(f"torch_sparse_baseline: rank {r} failed ({describe_exit(code)}); stopping the other ranks",
                          file=sys.stderr, flush=True)
                return EXIT_FAILED
            if all(code is not None for code in codes):
                return EXIT_WRONG if EXIT_WRONG in codes else EXIT_OK
            if time.monotonic() > deadline:
                print(f"torch_sparse_baseline: run exceeded --run-timeout {run_timeout} s; stopping the ranks",
                      file=sys.stderr, flush=True)
                return EXIT_FAILED
            time.sleep(poll_s)
    finally:  # also on an exception (Ctrl-C): no rank outlives the run
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()


def stop_ranks(procs, signum):
    """Stops the ranks of a run stopped by signum (SIGTERM, then SIGKILL after STOP_GRACE_S) and waits for them;
    returns 128 + signum."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    grace = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, grace - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    print(f"torch_sparse_baseline: stopped by signal {signum} ({signal.Signals(signum).name}): ranks stopped",
          file=sys.stderr, flush=True)
    return 128 + signum


def check_json(parser, args):
    """Before anything starts: a --json path that cannot be written is a usage error, not a failure at the end."""
    if args.json:
        try:
            open(args.json, "w").close()
        except OSError as e:
            parser.error(f"--json {args.json}: cannot open for writing: {e.strerror}")


def resolve_sizes(parser, args):
    """args.sizes from -b/-e/-f, or --size (the single-size sweep); usage errors name the option."""
    if args.size is not None:
        if args.minbytes is not None or args.maxbytes is not None:
            parser.error("--size SIZE is -b SIZE -e SIZE: give either --size or -b/--minbytes and -e/--maxbytes")
        args.minbytes = args.maxbytes = args.size
    if args.minbytes is None:
        args.minbytes = DEFAULT_BYTES
    if args.maxbytes is None:
        args.maxbytes = DEFAULT_BYTES
    option = "--size" if args.size is not None else "-b/--minbytes"
    if args.minbytes < 4:
        parser.error(f"{option} {args.minbytes}: the smallest size must hold at least one element (4 bytes of float)")
    if args.minbytes > args.maxbytes:
        parser.error(f"need -b/--minbytes <= -e/--maxbytes (got {args.minbytes} > {args.maxbytes})")
    args.sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)


def main():
    parser = build_parser()
    args = parser.parse_args()
    resolve_sizes(parser, args)
    if args.block_size < 1 or args.iters < 1 or args.warmup < 0:
        parser.error("need --block-size >= 1, -n >= 1, -w >= 0")
    if args.spawn is not None:
        if args.spawn < 1 or args.rank is not None or args.world_size is not None or args.init_file \
                or args.master_addr:
            parser.error("--spawn W (W >= 1) excludes --rank, --world-size, --init-file and --master-addr")
        check_json(parser, args)
        return run_spawn(args, sys.argv[1:])
    if args.rank is None and "RANK" in os.environ:
        args.rank = int(os.environ["RANK"])
    if args.world_size is None and "WORLD_SIZE" in os.environ:
        args.world_size = int(os.environ["WORLD_SIZE"])
    if args.world_size is None or args.rank is None or not 0 <= args.rank < args.world_size:
        parser.error("need --spawn W, or --rank R --world-size W with 0 <= R < W")
    if not args.init_file and (args.master_addr is None or args.master_port is None):
        parser.error("need --init-file PATH or --master-addr ADDR --master-port PORT")
    if args.rank == 0:
        check_json(parser, args)
    try:
        return run_rank(args)
    except Exception as e:  # report which rank failed, then exit non-zero
        print(f"torch_sparse_baseline: rank {args.rank} of {args.world_size}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
