#!/usr/bin/python3
"""A --spawn run of a baseline (sparsereduce-gloo-bench, torch_sparse_baseline.py) stopped by a signal to the
spawning process alone: the ranks must not outlive it.

stop_spawner() starts the run with this process a child subreaper (whatever the run leaves behind becomes this
process's child), waits for the first result row on its stdout (the ranks have joined and measure), notes the ranks
(the spawner's children) and their /tmp/sparsereduce-* directory, sends the signal to the spawner only, and reports
how it ended and what it left. Every wait has a deadline; whatever is left is killed and reaped before it returns.

Used by python/tests/test_torch_sparse_baseline.py and, as a script, by the ctest gloo_bench.stop_signal and
gloo_bench.killed_spawner (bench/gloo/CMakeLists.txt):

    spawn_stop_test.py TERM|INT|HUP|KILL JSON -- sparsereduce-gloo-bench --spawn 2 ... --json JSON

TERM, INT, HUP: the spawner stops every rank, waits for them, removes its directory and exits 128 + the signal; the
JSON holds the rows measured so far with "complete": false. KILL: every rank ends within RANK_END_S by itself
(PR_SET_PDEATHSIG). The baselines used to die alone, leaving the ranks to run their sweep to its end.
"""

import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PR_SET_CHILD_SUBREAPER = 36
ROW_TIMEOUT_S = 60.0  # the first row: rank startup (torch imports in a few s) and the smallest size
EXIT_TIMEOUT_S = 30.0  # the spawner's exit after the signal
RANK_END_S = 20.0  # after a SIGKILL of the spawner, the ranks' own end


def _set_subreaper(on):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _children_of(parent):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if _parent_of(int(name)) == parent:
                found.append(int(name))
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
    return sorted(found)


def _run_dirs(pid):
    """The /tmp/sparsereduce-* directories named on pid's command line (the store or rendezvous directory)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return set()
    dirs = set()
    for a in args:
        parts = a.split("/")
        if len(parts) >= 3 and parts[0] == "" and parts[1] == "tmp" and parts[2].startswith("sparsereduce-"):
            dirs.add("/tmp/" + parts[2])
    return dirs


def _reap_leftovers(before):
    """Kills and reaps this process's children left by the run (it is their subreaper), not those of `before` (its
    children from before the run, e.g. a test session's aggregator); returns how many there were that had not
    exited yet (zombies are reaped, not counted)."""
    running = 0
    for pid in _children_of(os.getpid()):
        if pid in before:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            if stat[stat.rindex(")") + 2] != "Z":
                running += 1
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            continue
    return running


def _is_row(line):
    fields = line.split()
    return bool(fields) and not line.startswith("#") and fields[0].isdigit()


def _read_until_row(fd, deadline):
    """stdout up to and including the first result row, or all of it (EOF or the deadline) if none came."""
    out = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
        if any(_is_row(line) for line in out.decode(errors="replace").splitlines(keepends=True) if line.endswith("\n")):
            return out.decode(errors="replace"), True
    return out.decode(errors="replace"), False


def _read_available(fd, deadline):
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return out.decode(errors="replace")
        chunk = os.read(fd, 65536)
        if not chunk:
            return out.decode(errors="replace")
        out += chunk


def stop_spawner(cmd, sig):
    """Runs cmd (a --spawn run), sends sig to it once its first row is out, and returns a dict: status (the
    spawner's returncode, negative for a signal), stdout, stderr, ranks (the pids of its children when signalled),
    rank_status (pid -> 'exited' for a rank reaped by the spawner, its waitpid status if this process reaped it, None
    if it was still running after the deadline), dirs (the run's /tmp/sparsereduce-* directories), dirs_left (those
    still there after the run), leftovers (processes of the run still running at the end: killed), row (a row came)."""
    before = set(_children_of(os.getpid()))
    _set_subreaper(True)
    err_file = tempfile.TemporaryFile()
    spawner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file)
    fd = spawner.stdout.fileno()
    result = {"ranks": [], "rank_status": {}, "dirs": set(), "dirs_left": set(), "leftovers": 0}
    pidfds = {}
    try:
        result["stdout"], result["row"] = _read_until_row(fd, time.monotonic() + ROW_TIMEOUT_S)
        if result["row"]:
            result["ranks"] = _children_of(spawner.pid)
            for pid in result["ranks"]:
                result["dirs"] |= _run_dirs(pid)
                try:
                    pidfds[pid] = os.pidfd_open(pid)  # the very process, whatever happens to its pid later
                except ProcessLookupError:
                    pass
            os.kill(spawner.pid, sig)
        try:
            spawner.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        result["status"] = spawner.returncode
        # A rank the spawner reaped is gone already; after a SIGKILL the ranks get RANK_END_S to end by themselves.
        deadline = time.monotonic() + (RANK_END_S if sig == signal.SIGKILL else 0.0)
        for pid, pidfd in pidfds.items():
            ready, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                result["rank_status"][pid] = None
                continue
            try:
                got, status = os.waitpid(pid, os.WNOHANG)  # ours now if the spawner died before reaping it
                result["rank_status"][pid] = status if got == pid else "exited"
            except ChildProcessError:
                result["rank_status"][pid] = "exited"
        result["stdout"] += _read_available(fd, time.monotonic() + (1.0 if spawner.returncode is not None else 0))
    finally:
        if spawner.poll() is None:
            spawner.kill()
            spawner.wait()
        result["leftovers"] = _reap_leftovers(before)
        for pidfd in pidfds.values():
            os.close(pidfd)
        spawner.stdout.close()
        err_file.seek(0)
        result["stderr"] = err_file.read().decode(errors="replace")
        err_file.close()
        _set_subreaper(False)
        result["dirs_left"] = {d for d in result["dirs"] if os.path.exists(d)}
        for d in result["dirs_left"]:
            shutil.rmtree(d, ignore_errors=True)
    if "status" not in result:
        result["status"] = spawner.returncode
    return result


def problems(result, sig, json_path=None):
    """What is wrong with a run stopped by sig (stop_spawner's result), as a list of messages."""
    found = []
    if not result["row"]:
        return [f"no result row within {ROW_TIMEOUT_S} s"]
    if not result["ranks"]:
        found.append("the spawner had no children when its first row was out")
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig
    if result["status"] != expected:
        found.append(f"the spawner ended with {result['status']}, expected {expected}")
    still = [pid for pid, status in result["rank_status"].items() if status is None]
    if still:
        found.append(f"ranks {still} were still running " +
                     ("after the spawner exited" if sig != signal.SIGKILL else f"{RANK_END_S} s after the SIGKILL"))
    if result["leftovers"]:
        found.append(f"{result['leftovers']} processes of the run were left running")
    if sig != signal.SIGKILL:
        if not result["dirs"]:
            found.append("no /tmp/sparsereduce-* directory on the ranks' command lines")
        if result["dirs_left"]:
            found.append(f"the spawner left {sorted(result['dirs_left'])} behind")
    if json_path is not None:
        try:
            with open(json_path) as f:
                doc = json.load(f)
            if doc.get("complete") is not False or not doc.get("results"):
                found.append(f"the JSON has complete {doc.get('complete')} and {len(doc.get('results', []))} rows, "
                             "expected false and at least the first row")
        except (OSError, ValueError) as e:
            found.append(f"the JSON {json_path} cannot be read: {e}")
    return found


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    sig = signal.Signals["SIG" + argv[0]]
    json_path, cmd = argv[1], argv[3:]
    if os.path.exists(json_path):
        os.remove(json_path)
    result = stop_spawner(cmd, sig)
    found = problems(result, sig, json_path)
    summary = (f"{sig.name} to {' '.join(cmd)}:\nexit {result['status']}, ranks {result['ranks']} "
               f"({result['rank_status']}), dirs {sorted(result['dirs'])}\nstdout:\n{result['stdout']}\n"
               f"stderr:\n{result['stderr']}")
    if found:
        print("FAILED: " + "; ".join(found) + "\n" + summary, file=sys.stderr)
        return 1
    print("ok: " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
