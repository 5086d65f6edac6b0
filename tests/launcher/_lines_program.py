"""A rank program for the output tests: `python _lines_program.py DIR ROUNDS`.

Each round rank 1 writes a line in two pieces, its text and then its newline (as Python does with
PYTHONUNBUFFERED=1), and rank 0 writes a whole line of its own between the two: files in DIR order the
three writes, and rank 0 waits 20 ms so that rank 1's text reaches mpiexec first. Every rank then
prints 100 lines with flush=True.
"""

import os
import sys
import time
from pathlib import Path

import unison

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
unison.init()
rank = unison.rank()


def wait_for(name: str) -> None:
    deadline = time.monotonic() + 30
    while not (out / name).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: {name} did not come within 30 s")
        time.sleep(0.001)


for number in range(rounds):
    if rank == 1:
        os.write(1, f"rank 1 round {number} ".encode() + b"x" * 60)
        (out / f"half-{number}").touch()
        wait_for(f"between-{number}")
        os.write(1, b"\n")
    elif rank == 0:
        wait_for(f"half-{number}")
        time.sleep(0.02)
        os.write(1, f"rank 0 round {number} ".encode() + b"y" * 60 + b"\n")
        (out / f"between-{number}").touch()
for line in range(100):
    print(f"rank {rank} line {line} " + "z" * 80, flush=True)
unison.shutdown()
