#!/usr/bin/python3
"""Runs each training example with DDP's built-in gloo allreduce and with the sparsereduce hook (4 CPU processes
each, one aggregator) and prints, per step: the loss of both runs (mean over the ranks), the largest difference
between the runs over the ranks' losses, the block density of the gradient buckets (each rank's own, mean over
ranks; and of the reduced sum), the bytes each rank sent, both step times (slowest rank) and how long the step's
sparsereduce collectives ran.

    /usr/bin/python3 examples/run_comparison.py [--build-dir build] [--world-size 4] [--markdown]
    /usr/bin/python3 examples/run_comparison.py --testbed [--rate 1gbit] ...   # as root
    /usr/bin/python3 examples/run_comparison.py --codecs none,fp16,3lc,diana,topk,adaptive -- --steps 300

With --codecs, each example runs once per sparsereduce codec instead (the first, normally "none", is the exact
reference), and one table compares final training loss, held-out loss and accuracy, and bytes per step.

By default everything runs on 127.0.0.1 with one aggregator. With --testbed, each rank gets a host of its own on
the network-namespace testbed (tools/testbed), each link shaped to --rate in both directions, and every host also
runs an aggregator (the colocated layout OmniReduce deploys: the same hosts and links gloo uses); the testbed is
deleted on exit, also on failure or Ctrl-C.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent
EXAMPLES = {"embedding": "embedding_ddp.py", "fashion_mlp": "fashion_mlp_ddp.py"}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", type=Path, default=SOURCE / "build")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated subset of " + ",".join(EXAMPLES))
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    p.add_argument("--testbed", action="store_true", help="one network-namespace host per process (root)")
    p.add_argument("--rate", default="1gbit", help="with --testbed: link rate in both directions (tc tbf)")
    p.add_argument("--codecs", default="",
                   help="comma-separated sparsereduce codecs to compare, each NAME or NAME:OPTION=VALUE:... "
                        "(e.g. topk:fraction=0.1, 3lc:sparsity=1.5:fp32-results=1)")
    p.add_argument("--check-identical", action="store_true",
                   help="exit 1 unless gloo and sparsereduce give the same loss on every rank at every step (exact "
                        "with 2 ranks, where the order of a sum cannot matter; not with --codecs)")
    p.add_argument("extra", nargs="*", help="passed to every example (after --), e.g. -- --steps 10")
    args = p.parse_args()
    if args.check_identical and args.codecs:
        p.error("--check-identical compares gloo with sparsereduce, which --codecs does not run")
    unknown = [name for name in args.examples.split(",") if name not in EXAMPLES]
    if unknown:
        p.error(f"--examples: unknown example {unknown[0]!r} (known: {', '.join(EXAMPLES)})")
    env = dict(os.environ, PYTHONPATH=f"{args.build_dir / 'python'}:{SOURCE / 'python'}")
    # SIGTERM ends the run like Ctrl-C, so the context managers below stop the processes and delete the testbed.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with tempfile.TemporaryDirectory() as work:
        cluster = (Testbed(args.build_dir, Path(work), args.world_size, args.rate) if args.testbed
                   else Aggregator(args.build_dir, Path(work)))
        with cluster:
            job = 0
            for name in args.examples.split(","):
                variants = ([("sparsereduce", c) for c in args.codecs.split(",")] if args.codecs
                            else [("gloo", "none"), ("sparsereduce", "none")])
                runs = {}
                for backend, codec in variants:
                    job += 1
                    out = Path(work) / f"{name}-{backend}-{job}.json"
                    command = [sys.executable, str(HERE / EXAMPLES[name]), "--backend", backend,
                               "--world-size", str(args.world_size), "--aggregators", cluster.address,
                               "--job", str(job), *codec_arguments(codec), "--out", str(out), *args.extra]
                    print(f"# {' '.join(command[1:])}", file=sys.stderr, flush=True)
                    try:
                        cluster.run(command, env, Path(work) / f"{name}-{backend}-{job}.store")
                    except subprocess.CalledProcessError as e:
                        raise SystemExit(f"run_comparison: {name} with {backend} (codec {codec}) failed "
                                         f"(exit code {e.returncode}); its output is above") from None
                    runs[(backend, codec)] = dict(json.loads(out.read_text()), codec=codec)
                if args.codecs:
                    print_codec_table(name, [runs[v] for v in variants], args.markdown)
                else:
                    identical, steps = print_table(name, runs[("gloo", "none")], runs[("sparsereduce", "none")],
                                                   args.markdown)
                    if args.check_identical and identical != steps:
                        raise SystemExit(f"run_comparison: {name}: the losses differ in {steps - identical} of "
                                         f"{steps} steps (--check-identical)")


class Aggregator:
    """sparsereduce-aggregator from the build on 127.0.0.1, port chosen by the kernel, stopped on exit; the
    example spawns its ranks itself."""

    def __init__(self, build_dir, work, listen="127.0.0.1:0", prefix=()):
        self.binary = build_dir / "aggregator" / "sparsereduce-aggregator"
        self.port_file, self.log = work / "aggregator.port", work / "aggregator.log"
        self.listen, self.prefix = listen, list(prefix)
        self.address = None

    def __enter__(self):
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [*self.prefix, str(self.binary), "--listen", self.listen, "--metrics-listen", "", "--port-file",
                 str(self.port_file)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.process.poll() is None:
            text = self.port_file.read_text().strip() if self.port_file.exists() else ""
            if text.isdigit() and int(text) > 0:
                self.address = f"{self.listen.rsplit(':', 1)[0]}:{text}"
                return self
            time.sleep(0.02)  # poll interval
        self.__exit__()
        raise SystemExit(f"the aggregator did not start:\n{self.log.read_text()}")

    def __exit__(self, *exc):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def run(self, command, env, store):
        subprocess.run(command, env=env, check=True, timeout=1800)


class Testbed:
    """tools/testbed with world_size hosts; host r + 1 runs rank r and aggregator r. Each rank runs the example
    with --rank (gloo over the hosts' eth0, a FileStore on the shared file system)."""

    def __init__(self, build_dir, work, world_size, rate):
        self.script = SOURCE / "tools" / "testbed" / "testbed.sh"
        self.name = f"ex{os.getpid()}"
        self.world_size, self.rate = world_size, rate
        self.build_dir, self.work = build_dir, work
        self.aggregators = []

    def __enter__(self):
        try:
            subprocess.run(["bash", str(self.script), "up", self.name, str(self.world_size), "--rate", self.rate],
                           check=True, stdout=sys.stderr, timeout=120)
            for host in range(1, self.world_size + 1):
                work = self.work / f"aggregator{host}"
                work.mkdir()
                self.aggregators.append(Aggregator(self.build_dir, work, listen=f"{self.addr(host)}:19875",
                                                   prefix=self.exec_prefix(host)).__enter__())
            self.address = ",".join(a.address for a in self.aggregators)
            return self
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc):
        for aggregator in self.aggregators:
            aggregator.__exit__()
        subprocess.run(["bash", str(self.script), "down", self.name], timeout=120)

    def addr(self, host):
        return subprocess.run(["bash", str(self.script), "addr", self.name, str(host)], check=True, timeout=30,
                              capture_output=True, text=True).stdout.strip()

    def exec_prefix(self, host):
        return ["ip", "netns", "exec", f"{self.name}-h{host}"]

    def run(self, command, env, store):
        env = dict(env, GLOO_SOCKET_IFNAME="eth0")  # gloo's address: the host's testbed interface
        ranks = [subprocess.Popen([*self.exec_prefix(r + 1), *command, "--rank", str(r), "--store", str(store)],
                                  env=env) for r in range(self.world_size)]
        try:
            deadline = time.monotonic() + 1800
            for p in ranks:
                if p.wait(timeout=max(1, deadline - time.monotonic())) != 0:
                    raise SystemExit(f"a rank failed: {' '.join(p.args)}")
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def print_table(name, gloo, sr, markdown):
    header = ["step", "loss gloo", "loss sparsereduce", "max abs diff", "density local", "density union",
              "sent MB/rank", "step ms gloo", "step ms sparsereduce", "of which collectives"]
    rows, identical, worst = [], 0, 0.0
    for g, s in zip(gloo["steps"], sr["steps"]):
        diff = max(abs(a - b) for a, b in zip(g["losses"], s["losses"]))
        identical += g["losses"] == s["losses"]
        worst = max(worst, diff)
        rows.append([str(g["step"]), f"{mean(g['losses']):.6f}", f"{mean(s['losses']):.6f}", f"{diff:.1e}",
                     percent(s["local_density"]), percent(s["union_density"]),
                     "n/a" if s["bytes_sent_rank_mean"] is None else f"{s['bytes_sent_rank_mean'] / 1e6:.2f}",
                     f"{g['time_s'] * 1e3:.1f}", f"{s['time_s'] * 1e3:.1f}",
                     "n/a" if s["collective_s_rank_mean"] is None else f"{s['collective_s_rank_mean'] * 1e3:.1f}"])
    dense_mb = gloo["gradient_elements"] * 4 / 1e6
    print(f"\n## {name}: {gloo['world_size']} ranks, {gloo['gradient_elements']:,} parameters "
          f"({dense_mb:.1f} MB of fp32 gradients per step)\n")
    print_rows(header, rows, markdown)
    later = slice(1, None)  # step 1 is the first pass over the model and its buffers (DDP's rebuild, step 2, the median absorbs)
    tg = statistics.median(s["time_s"] for s in gloo["steps"][later]) * 1e3
    ts = statistics.median(s["time_s"] for s in sr["steps"][later]) * 1e3
    print(f"\nloss identical on every rank in {identical} of {len(rows)} steps (largest difference {worst:.1e}); "
          f"median step time from step 2: gloo {tg:.1f} ms, sparsereduce {ts:.1f} ms")
    # A backend that recorded fewer steps differs too (zip above compares the common steps only).
    return identical, max(len(gloo["steps"]), len(sr["steps"]))


SWITCHES = ("fp32-results", "tensor-scale", "l2-norm")


def codec_arguments(text):
    """"topk:fraction=0.1" -> ["--codec", "topk", "--fraction", "0.1"]; a switch is set by =1 (or no value) and
    left off by =0.

    >>> codec_arguments("3lc:sparsity=1.5:fp32_results=1:tensor-scale=0")
    ['--codec', '3lc', '--sparsity', '1.5', '--fp32-results']
    >>> codec_arguments("3lc:fp32-results")
    ['--codec', '3lc', '--fp32-results']
    """
    name, *options = text.split(":")
    arguments = ["--codec", name]
    for option in options:
        key, has_value, value = option.partition("=")
        flag = "--" + key.replace("_", "-")
        if flag[2:] in SWITCHES:
            if value not in ("", "0", "1") or (has_value and not value):
                raise SystemExit(f"--codecs {text}: {key} takes 0 or 1, not '{value}'")
            arguments += [flag] if value != "0" else []
        elif not value:
            raise SystemExit(f"--codecs {text}: {key} needs a value ({key}=VALUE)")
        else:
            arguments += [flag, value]
    return arguments


def print_codec_table(name, runs, markdown):
    """One row per codec: final training loss (mean over ranks and the last 10 steps), held-out loss and
    accuracy of rank 0's model, bytes per rank and step (library counters, headers included), step time."""
    header = ["codec", "train loss (last 10 steps)", "held-out loss", "held-out accuracy", "MB sent/rank/step",
              "MB received/rank/step", "bytes vs first", "median step ms"]
    rows, reference, uncounted = [], None, []
    for run in runs:
        later = run["steps"][1:]
        # A step whose counters the Worker had already replaced has none (None): left out, not counted as 0 bytes.
        counted = [s for s in later
                   if s["bytes_sent_rank_mean"] is not None and s["bytes_received_rank_mean"] is not None]
        if len(counted) < len(later):
            uncounted.append(f"{run['codec']}: {len(later) - len(counted)} of {len(later)}")
        if not counted:
            counted = [{"bytes_sent_rank_mean": float("nan"), "bytes_received_rank_mean": float("nan")}]
        sent = statistics.mean(s["bytes_sent_rank_mean"] for s in counted)
        received = statistics.mean(s["bytes_received_rank_mean"] for s in counted)
        reference = reference or (sent + received)
        train = statistics.mean(mean(s["losses"]) for s in run["steps"][-10:])
        ev = run.get("evaluation", {})
        rows.append([run["codec"], f"{train:.4f}", f"{ev.get('loss', float('nan')):.4f}",
                     f"{100 * ev.get('accuracy', float('nan')):.2f}%", f"{sent / 1e6:.3f}", f"{received / 1e6:.3f}",
                     f"{(sent + received) / reference:.3f}x",
                     f"{statistics.median(s['time_s'] for s in later) * 1e3:.1f}"])
    print(f"\n## {name}: {runs[0]['world_size']} ranks, {len(runs[0]['steps'])} steps, "
          f"{runs[0]['gradient_elements']:,} parameters\n")
    print_rows(header, rows, markdown)
    if uncounted:
        print(f"\nsteps without byte counts, left out of the byte columns: {', '.join(uncounted)}")


def print_rows(header, rows, markdown):
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        for r in [header, *rows]:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def mean(values):
    return sum(values) / len(values)


def percent(x):
    return "n/a" if x is None else f"{100 * x:.2f}%"


if __name__ == "__main__":
    main()
