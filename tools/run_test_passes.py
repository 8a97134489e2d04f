"""Run pytest passes side by side, at most ``--lanes`` at once: ``make test``'s two vLLM passes and its first main
pass together, then the other main passes, each in the lane the next pass frees.

Most of a vLLM pass on this project's 2-core machines keeps at most one core busy (an engine or server start:
processes that import vLLM by spawn; the tiny talker's Python-bound steps; the official talker) or none (a test
waiting on a socket limit or a browser), so the two together leave part of a core idle for most of their ten
minutes. The main venv's tests fill it: three passes (the ExecuTorch toolchain with its session artifacts, the
other toolchains, the rest) at niceness 5 (``--nice NAME=N``), so that they take what the vLLM passes, the longest,
leave rather than slow them down. Measured on 2026-12-07 (988 tests, ``make test`` with its set-up and lint): two
lanes, the main tests in two passes after the vLLM ones, 20 min; three lanes at equal niceness, 16.9 min (the
ExecuTorch pass got 0.4 of a core and ended last); the vLLM passes at niceness 5 instead, stopped at 16 min with
the engines' pass at 43% (it is the longest and can use only one core); as ``make test`` runs it now, 15.9 min.
Every pass runs in this process's session: a session of its own would be a scheduling group of its own under
Linux's autogroup, which shares the CPU equally between groups and applies a niceness only inside one.

Each pass gets its share of the cores as OpenMP threads (``--threads``; by default ``OMP_NUM_THREADS`` if the
environment sets it, else the cores over the lanes, at least one): ``OMP_NUM_THREADS`` for torch in the tests and
every process they start, and ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (unless set) so that vLLM's CPU engines keep it (by
default they bind one OpenMP thread to every core and set the count themselves). OpenMP threads meet at a barrier
after every parallel region, so a pass whose threads span both cores waits, op by op, for the other pass to give up
a core. Measured on 2 cores, the tiny talker's 50-frame greedy generate beside one busy process: 4.3-5.5 s wall and
4.9-6.2 s of CPU with vLLM's binding, 0.7-0.8 s and 0.5 s with one thread (0.55 s either way on an idle machine).
The whole suite went from 44 to 27 core-minutes, and ``make test`` on two lanes from 29.5 to 20 min.

Usage::

    python tools/run_test_passes.py --logs out/test-logs --lanes 3 --nice main=5 \\
        served=".venv-vllm/bin/python -m pytest -q -m vllm ..." engines="..." main=".venv/bin/python -m pytest ..."

Each ``NAME=COMMAND`` starts, in the order given, as soon as fewer than ``--lanes`` passes run (the command split
as a shell would, run without one), with its output in ``LOGS/NAME.log``. Every minute one line tells how far each
pass has come (tests done, pytest's ``[ NN%]``). At the end: the whole log of each pass that failed, each pass's
closing line, and one total line ``tests: N passed, N failed``. The exit status is 0 only when every pass exited
0. A pass still running after ``--timeout-s`` is killed (with what it started) and counts as failed; so does every
pass on an interrupt.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# a line of pytest -q's progress: one character per test (. F E s x X), "[ NN%]" at the end of a full line
PROGRESS = re.compile(r"^([.FEsxX]+)(?:\s+\[\s*(\d+)%\])?$", re.MULTILINE)
# pytest's closing line in -q mode: "521 passed, 4 deselected, 29 warnings in 534.19s (0:08:54)"
CLOSING = re.compile(r"^(?:=+ )?(?:\d+ \w+(?:, )?)+.* in [\d.]+s")
COUNTS = re.compile(r"(\d+) (passed|failed|errors?)")


@dataclass
class TestPass:
    """One pytest run: its name, command, log and, once it ended, its exit status and wall time."""

    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    returncode: int | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    niceness: int = 0

    def start(self, environment: dict[str, str] | None = None) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            # its own process group (a kill reaches the servers and builds the pass started) in this session (the
            # module's docstring says why), its niceness added to this process's
            try:
                self.process = subprocess.Popen(
                    self.command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    process_group=0,
                    preexec_fn=(lambda: os.nice(self.niceness)) if self.niceness else None,
                    env=environment,
                )
            except OSError as exc:  # a venv not built: the pass fails with what to do, the others go on
                out.write(f"could not start {self.command[0]}: {exc} (run the make target that sets it up)\n".encode())
                self.returncode = 127
                self.notes.append("did not start")

    def poll(self) -> bool:
        """True once the pass has ended (False while it waits for a lane)."""
        if self.returncode is None and self.process is not None:
            pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)  # the pass's CPU time with its children's
            if pid:
                self.process.returncode = self.returncode = os.waitstatus_to_exitcode(status)
                self.seconds, self.cpu_seconds = time.monotonic() - self.started, usage.ru_utime + usage.ru_stime
        return self.returncode is not None

    def kill(self, why: str) -> None:
        if self.poll():
            return
        self.notes.append(why)
        if self.process is None:
            self.returncode = -1  # never started
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        while not self.poll():
            time.sleep(0.1)

    def progress(self) -> str:
        if self.returncode is not None:
            return f"{self.name} done (exit {self.returncode})"
        if self.process is None:
            return f"{self.name} waiting"
        lines = PROGRESS.findall(self.log.read_text(errors="replace")) if self.log.exists() else []
        done, failed = sum(len(marks) for marks, _ in lines), sum(marks.count("F") for marks, _ in lines)
        percent = next((f" ({share}%)" for _, share in reversed(lines) if share), "")
        return f"{self.name} {done} tests{percent}" + (f", {failed} failed" if failed else "")

    def summary(self) -> str:
        """pytest's closing line of the pass ("521 passed, 4 deselected in 534.19s"), or what stands in for it."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return next((line.strip("= ") for line in reversed(lines) if CLOSING.match(line)), "no closing line")

    def report(self) -> str:
        notes = "".join(f"; {note}" for note in self.notes)
        ended = f"exit {self.returncode}, {self.seconds / 60:.1f} min, CPU {self.cpu_seconds / 60:.1f} min{notes}"
        return f"{self.name}: {self.summary()} [{ended}] ({self.log})"

    def counts(self) -> dict[str, int]:
        """passed / failed (failed tests and errors together) from the closing line."""
        counts = {"passed": 0, "failed": 0}
        for number, kind in COUNTS.findall(self.summary()):
            counts["passed" if kind == "passed" else "failed"] += int(number)
        if self.returncode != 0 and counts["failed"] == 0:
            counts["failed"] = 1  # the pass failed without a failed test (collection, a crash, a kill)
        return counts


def parse_pass(text: str, logs: Path) -> TestPass:
    name, sep, command = text.partition("=")
    if not sep or not re.fullmatch(r"[\w-]+", name) or not command.strip():
        raise SystemExit(f"run_test_passes: expected NAME=COMMAND (NAME of letters, digits, - and _), got {text!r}")
    return TestPass(name, shlex.split(command), logs / f"{name}.log")


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # a SIGTERM (a CI time limit) stops the passes' process groups too


def pass_environment(threads: int) -> dict[str, str]:
    """This process's environment with ``threads`` OpenMP threads per pass, unbound (the module docstring says
    why); a ``VLLM_CPU_OMP_THREADS_BIND`` already set is kept."""
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", **os.environ, "OMP_NUM_THREADS": str(threads)}


def default_threads(lanes: int) -> int:
    """``OMP_NUM_THREADS`` when the environment sets it to a number, else this process's cores over ``lanes``."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else max(1, len(os.sched_getaffinity(0)) // lanes)


def run(passes: list[TestPass], lanes: int, timeout_s: float, report_s: float, threads: int) -> int:
    signal.signal(signal.SIGTERM, interrupt)
    names = ", ".join(p.name for p in passes)
    environment = pass_environment(threads)
    print(
        f"[tests] {len(passes)} passes, {lanes} at a time, {threads} OpenMP thread(s) each: {names} "
        f"(logs in {passes[0].log.parent})",
        flush=True,
    )
    began = last_report = time.monotonic()
    try:
        while not all(p.poll() for p in passes):
            waiting = [p for p in passes if p.process is None and p.returncode is None]  # not started yet
            running = [p for p in passes if p.process is not None and not p.poll()]
            for test_pass in waiting[: max(0, lanes - len(running))]:
                test_pass.start(environment)
            time.sleep(1)
            now = time.monotonic()
            for test_pass in passes:
                if test_pass.process is not None and not test_pass.poll() and now - test_pass.started > timeout_s:
                    test_pass.kill(f"killed after {timeout_s:g} s")
            if now - last_report >= report_s:
                last_report = now
                minutes, seconds = divmod(int(now - began), 60)
                print(f"[tests] {minutes}m{seconds:02d}s: " + ", ".join(p.progress() for p in passes), flush=True)
    except KeyboardInterrupt:
        for test_pass in passes:
            test_pass.kill("interrupted")
    for test_pass in passes:
        if test_pass.returncode != 0 and test_pass.log.exists():
            print(f"\n[tests] ===== the log of {test_pass.name} ({test_pass.log}) =====", flush=True)
            sys.stdout.write(test_pass.log.read_text(errors="replace"))
    print()
    totals = {"passed": 0, "failed": 0}
    for test_pass in passes:
        print(test_pass.report())
        for kind, number in test_pass.counts().items():
            totals[kind] += number
    print(f"tests: {totals['passed']} passed, {totals['failed']} failed", flush=True)
    return 0 if all(p.returncode == 0 for p in passes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("passes", nargs="+", metavar="NAME=COMMAND", help="a pass: its name and its command line")
    parser.add_argument("--logs", type=Path, default=Path("out/test-logs"), help="where each pass's log goes")
    parser.add_argument("--lanes", type=int, default=2, help="how many passes run at once (at least 1)")
    parser.add_argument("--timeout-s", type=float, default=3600, help="a pass running longer is killed (failed)")
    parser.add_argument("--report-s", type=float, default=60, help="seconds between progress lines")
    parser.add_argument(
        "--nice",
        action="append",
        default=[],
        metavar="NAME=N",
        help="run pass NAME (and all it starts) N nicer than this runner (0-19): it yields the CPU to the others",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="OpenMP threads per pass (default: OMP_NUM_THREADS, else cores/lanes)"
    )
    args = parser.parse_args(argv)
    passes = [parse_pass(text, args.logs) for text in args.passes]
    if len({p.name for p in passes}) != len(passes):
        raise SystemExit("run_test_passes: two passes have the same name; give each its own")
    if args.lanes < 1:
        raise SystemExit(f"run_test_passes: --lanes must be at least 1, got {args.lanes}")
    by_name = {p.name: p for p in passes}
    for text in args.nice:
        name, _, number = text.partition("=")
        if name not in by_name or not number.isdigit() or int(number) > 19:
            raise SystemExit(f"run_test_passes: --nice expects NAME=N with a pass's name and N in 0-19, got {text!r}")
        by_name[name].niceness = int(number)
    threads = args.threads if args.threads is not None else default_threads(args.lanes)
    if threads < 1:
        raise SystemExit(f"run_test_passes: --threads must be at least 1, got {threads}")
    return run(passes, args.lanes, args.timeout_s, args.report_s, threads)


if __name__ == "__main__":
    sys.exit(main())
