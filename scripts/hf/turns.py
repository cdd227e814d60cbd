#!/usr/bin/env python3
"""Runs two benchmarks at once and hands the machine to one at a time, so
that each pair of their timed steps is measured seconds apart.

    turns.py [--pause S] [--log FILE] COMMAND_A COMMAND_B

Each COMMAND is one shell-quoted string in which `{turns}` stands for the
pair of named pipes `WAIT,DONE` that the side takes turns through
(`r2vpo bench step --turns`, `scripts/gpu/torch_step.py --turns`): after its
warm-up the side writes one byte to DONE (ready); then it reads one byte
from WAIT before each timed step and writes one to DONE after it. Both sides
warm up at once; once both are ready, turns go A, B, then B, A, then A, B, …
(the order alternates, so neither side always runs first after the pause),
with `--pause` seconds of an idle machine before each turn (threads that
spin after their side's step go to sleep). It ends when both have exited.

Why: on a shared 2-core machine the speed moved by 10–15 % within minutes
and PyTorch's CPU step times by up to 40 % between runs, so a ratio of two
benchmarks run one after the other minutes apart was mostly the drift
(#16). Taking turns, rep i of A and rep i of B are adjacent in time and a
drift moves both. The ratio is taken per pair (scripts/hf/summary.py).

Exit status: 0 when both sides exit 0; otherwise the first failing side's
status (the other side is then stopped). Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time


class Side:
    """One benchmark: its process and its two pipes (held open read-write
    here, so neither open nor a write ever blocks, and a side that dies
    shows as its process's exit rather than as a hung pipe)."""

    def __init__(self, name: str, command: str, d: str):
        self.name = name
        self.go_path, self.done_path = os.path.join(d, f"go-{name}"), os.path.join(d, f"done-{name}")
        os.mkfifo(self.go_path)
        os.mkfifo(self.done_path)
        self.go = os.open(self.go_path, os.O_RDWR)
        self.done = os.open(self.done_path, os.O_RDWR)
        argv = [a.replace("{turns}", f"{self.go_path},{self.done_path}") for a in shlex.split(command)]
        self.proc = subprocess.Popen(argv)
        self.turns = 0

    def wait_done(self) -> bool:
        """Waits for one byte on DONE: True, or False once the side has
        exited (with status 0: it has run all its steps)."""
        while True:
            r, _, _ = select.select([self.done], [], [], 0.5)
            if r:
                os.read(self.done, 1)
                return True
            if self.proc.poll() is not None:
                # Its last byte may have come just before it exited.
                if select.select([self.done], [], [], 0)[0]:
                    os.read(self.done, 1)
                    return True
                return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pause", type=float, default=1.0, help="seconds of idle machine before each turn")
    ap.add_argument("--log", help="a JSON list of the turns: side, start and end (monotonic seconds)")
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args()
    for name, command in (("A", args.a), ("B", args.b)):
        if not any("{turns}" in word for word in shlex.split(command)):
            ap.error(f"command {name} has no {{turns}} to stand for its pipes: {command}")
    with tempfile.TemporaryDirectory(prefix="r2vpo-turns-") as d:
        sides = [Side("a", args.a, d), Side("b", args.b, d)]
        log = []

        def fail(side: Side) -> int:
            code = side.proc.returncode
            print(f"turns: side {side.name} exited with status {code}; stopping the other", file=sys.stderr)
            for s in sides:
                if s.proc.poll() is None:
                    s.proc.terminate()
                    try:
                        s.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        s.proc.kill()
                        s.proc.wait()
            # A side killed by signal N shows as -N; exit as a shell would.
            return 128 - code if code and code < 0 else code or 1

        try:
            # Both warm up at once; neither is timed until both are ready,
            # and a side that dies while warming up ends the run at once.
            warming = list(sides)
            while warming:
                ready, _, _ = select.select([s.done for s in warming], [], [], 0.5)
                for s in list(warming):
                    if s.done in ready:
                        os.read(s.done, 1)
                        warming.remove(s)
                    elif s.proc.poll() is not None:
                        return fail(s)
            running = list(sides)
            pair = 0
            while running:
                order = sides if pair % 2 == 0 else sides[::-1]
                for s in order:
                    if s not in running:
                        continue
                    time.sleep(args.pause)
                    t0 = time.monotonic()
                    os.write(s.go, b".")
                    if s.wait_done():
                        log.append({"side": s.name, "start": t0, "end": time.monotonic()})
                        s.turns += 1
                        continue
                    running.remove(s)
                    if s.proc.returncode != 0:
                        return fail(s)
                pair += 1
        except KeyboardInterrupt:
            for s in sides:
                s.proc.terminate()
            raise
        finally:
            if args.log:
                tmp = args.log + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(log, f, indent=1)
                os.replace(tmp, args.log)
        counts = {s.name: s.turns for s in sides}
        print(f"turns: {counts['a']} timed turns of A and {counts['b']} of B, alternating", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
