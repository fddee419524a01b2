"""The kernel's part of a request over HTTP: ours against the floor, one keep-alive client.

``bench/http.py`` times requests; this says where the server's time goes below user
space. It starts ``agentcanvas serve`` and the floor app as ``bench/http.py`` does
(SQLite, the same gunicorn settings, one session each), warms both up, then in each
round plays ``--requests`` requests to each subject in turn (the intake form's pause
and resume, alternating, on one connection) while watching every thread of the
server's worker processes:

* always: user and system CPU time, minor page faults and context switches per
  request (``/proc/PID/task/*``);
* ``--strace``: system calls per request by name (``strace -f -c`` attached to the
  workers). Counts only: strace stops the thread at every call, so its times are not
  the calls' own, and threads contend more (more ``futex``) than unwatched;
* ``--perf``: system calls per request with the time spent in each
  (``perf record`` of the ``raw_syscalls`` enter and exit tracepoints; each time
  includes the tracepoints' own cost, well under a microsecond). Calls that wait
  (``futex``, ``epoll_wait``, the background checkpoint's ``fdatasync``) are listed
  with their waits; the total leaves them out.

Figures are medians over the rounds, [min–max]. Needs ``strace`` / ``perf`` (and the
right to attach to one's own processes) for those options.

    .venv/bin/python bench/kernel.py [--requests 2000] [--rounds 3] [--strace] [--perf]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from _path import load_bench

bench_http = load_bench("http")

TICKS = os.sysconf("SC_CLK_TCK")
#: System calls that wait for something: listed, but left out of the kernel time's total.
WAITS = {"futex", "epoll_wait", "epoll_pwait", "poll", "select", "fdatasync", "fsync", "nanosleep"}
UNISTD = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"


def workers(subject: bench_http.Subject) -> list[int]:
    """The worker processes of the gunicorn master ``subject`` runs."""
    out = subprocess.run(["pgrep", "-P", str(subject.proc.pid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def thread_counters(pids: list[int]) -> collections.Counter:
    """User and system clock ticks, minor faults and context switches, summed over every
    thread of ``pids``."""
    total: collections.Counter = collections.Counter()
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/task/{tid}/status") as fh:
                    status = dict(line.split(":", 1) for line in fh if ":" in line)
            except FileNotFoundError:  # the thread ended meanwhile
                continue
            total["user"] += int(fields[11])
            total["system"] += int(fields[12])
            total["minor faults"] += int(fields[7])
            total["voluntary switches"] += int(status["voluntary_ctxt_switches"])
            total["involuntary switches"] += int(status["nonvoluntary_ctxt_switches"])
    return total


def play(subject: bench_http.Subject, count: int) -> None:
    """``count`` requests of the subject's first client on one keep-alive connection."""

    async def go() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", subject.port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = subject.clients[0]
        try:
            for _ in range(count):
                writer.write(client.requests[client.next])
                await writer.drain()
                status, body = await bench_http.read_response(reader)
                if status != 200:
                    raise RuntimeError(f"{subject.name} answered {status}: {body[:300]!r}")
                client.next = (client.next + 1) % len(client.requests)
        finally:
            writer.close()

    asyncio.run(go())


def syscall_names() -> dict[int, str]:
    names = {}
    try:
        with open(UNISTD) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("__NR_"):
                    names[int(parts[2])] = parts[1][5:]
    except OSError:
        pass
    return names


class Strace:
    """``strace -f -c`` attached to ``pids`` until :meth:`stop`: calls by name."""

    def __init__(self, pids: list[int], path: str):
        self.path = path
        args = ["strace", "-f", "-c", "-o", path] + [a for pid in pids for a in ("-p", str(pid))]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        attached = 0
        while attached < len(pids):  # "Process N attached [with M threads]", one per process
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("strace did not attach (installed? allowed to trace?)")
            attached += "attached" in line
        time.sleep(0.2)

    def stop(self) -> dict[str, tuple[float, float]]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.communicate()
        calls = {}
        with open(self.path) as fh:
            for line in fh:
                f = line.split()
                if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
                    calls[f[-1]] = (int(f[3]), float("nan"))
        return calls


class Perf:
    """``perf record`` of the raw_syscalls tracepoints of ``pids`` until :meth:`stop`:
    calls by name, with the microseconds between each call's entry and exit."""

    def __init__(self, pids: list[int], path: str):
        self.path = path
        args = [
            "perf",
            "record",
            "-q",
            "-m",
            "16M",
            "-e",
            "raw_syscalls:sys_enter,raw_syscalls:sys_exit",
            "-o",
            path,
        ]
        self.proc = subprocess.Popen(
            args + ["-p", ",".join(map(str, pids))], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        time.sleep(1.0)  # perf has no "attached" line; it is after well under a second
        if self.proc.poll() is not None:
            raise RuntimeError(f"perf record failed: {self.proc.stderr.read().decode()[:300]}")

    def stop(self) -> dict[str, tuple[float, float]]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.communicate()
        script = subprocess.run(
            ["perf", "script", "-i", self.path, "-F", "tid,time,event,trace"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        names = syscall_names()
        entered: dict[str, tuple[int, float]] = {}
        calls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for line in script.splitlines():
            fields = line.split()
            if len(fields) < 5 or "NR" not in fields:
                continue
            tid, at = fields[0], float(fields[1].rstrip(":"))
            number = int(fields[fields.index("NR") + 1])
            if fields[2].endswith("sys_enter:"):
                entered[tid] = (number, at)
            elif tid in entered:
                number, start = entered.pop(tid)
                found = calls[names.get(number, str(number))]
                found[0] += 1
                found[1] += (at - start) * 1e6
        return {name: (n, us) for name, (n, us) in calls.items()}


def spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests per subject and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=400, help="requests per subject before the first round")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    tool = parser.add_mutually_exclusive_group()
    tool.add_argument("--strace", action="store_true", help="count system calls (strace -f -c)")
    tool.add_argument("--perf", action="store_true", help="count and time system calls (perf record)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-kernel-")
    subjects: list[bench_http.Subject] = []
    cpu: dict[str, dict[str, list[float]]] = {}
    calls: dict[str, list[dict[str, tuple[float, float]]]] = {}
    try:
        subjects.append(bench_http.start_ours(f"sqlite:///{tmp}/ours.db", args.workers, args.threads, 1))
        subjects.append(
            bench_http.start_floor(f"sqlite:///{tmp}/floor.db", args.workers, args.threads, 1, tmp)
        )
        for subject in subjects:
            play(subject, args.warmup)
        for r in range(args.rounds):
            for subject in subjects:
                pids = workers(subject)
                trace_file = os.path.join(tmp, f"{subject.name}.{r}.trace")
                watch = (
                    Strace(pids, trace_file) if args.strace else Perf(pids, trace_file) if args.perf else None
                )
                before = thread_counters(pids)
                started = time.perf_counter()
                play(subject, args.requests)
                wall = time.perf_counter() - started
                after = thread_counters(pids)
                if watch is not None:
                    calls.setdefault(subject.name, []).append(
                        {k: (n / args.requests, us / args.requests) for k, (n, us) in watch.stop().items()}
                    )
                row = cpu.setdefault(subject.name, collections.defaultdict(list))
                row["wall ms"].append(1000 * wall / args.requests)
                for key in ("user", "system"):
                    row[f"{key} ms"].append(1000 * (after[key] - before[key]) / TICKS / args.requests)
                for key in ("minor faults", "voluntary switches", "involuntary switches"):
                    row[key].append((after[key] - before[key]) / args.requests)
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for subject in subjects:
            subject.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    names = [s.name for s in subjects]
    print(
        f"\nper request, {args.requests} requests x {args.rounds} rounds, 1 client, {args.workers} workers x "
        f"{args.threads} threads (all threads of the workers); median [min–max]"
    )
    print(f"{'':22}" + "".join(f"{n:>24}" for n in names))
    for key in cpu[names[0]]:
        fmt = "{:.3f}" if key.endswith("ms") else "{:.2f}"
        print(f"{key:22}" + "".join(f"{spread(cpu[n][key], fmt):>24}" for n in names))
    if calls:
        timed = args.perf
        print("\nsystem calls per request" + (" (n) and microseconds in the kernel (us)" if timed else ""))
        head = "".join(f"{n + ' n':>12}" + (f"{n + ' us':>12}" if timed else "") for n in names)
        print(f"{'':18}{head}")
        every = set().union(*(c for runs in calls.values() for c in runs))
        first = calls[names[0]]

        def median(name: str, key: str, i: int) -> float:
            return statistics.median(c.get(key, (0.0, 0.0))[i] for c in calls[name])

        totals = collections.Counter()
        for key in sorted(every, key=lambda k: -statistics.median(c.get(k, (0, 0))[0] for c in first)):
            if max(median(n, key, 0) for n in names) < 0.01:
                continue
            line = f"{key:18}"
            for n in names:
                count, us = median(n, key, 0), median(n, key, 1)
                totals[(n, 0)] += count
                if key not in WAITS:
                    totals[(n, 1)] += us
                line += f"{count:12.2f}" + (f"{us:12.1f}" if timed else "")
            print(line + ("   (waits)" if timed and key in WAITS else ""))
        line = f"{'total':18}" + "".join(
            f"{totals[(n, 0)]:12.2f}" + (f"{totals[(n, 1)]:12.1f}" if timed else "") for n in names
        )
        print(line + ("   (waits left out of us)" if timed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
