"""Benchmark: the gRPC coordinator service with N simulated workers on loopback.

The master process hosts the service and plays rank 0 (it runs the `Coordinator` on the gathered
requests, exactly as rank 0's engine does). The other ranks are threads spread over two worker
processes; each rank submits 100 tensors per cycle. With ``--ranks-per-host K`` (default 8, as on a
GPU node) each thread is a host leader speaking for K ranks, as with UNISON_SERVICE_HOST_AGGREGATION:
the shared-memory gather within a host is not simulated (tens of microseconds on the host itself);
``--ranks-per-host 1`` gives one stream per rank. *Cached* cycles are a status exchange only (steady-state training);
*uncached* cycles use new tensor names every cycle, so every request goes through the gather, the
Coordinator and the broadcast. Reported per N: cycle latency p50/p99 seen by rank 0 and the master
process's CPU time per cycle (service threads included). On a 2-core machine the simulated workers
compete with the master for the CPU, so latencies are upper bounds; the master CPU time is the number
that predicts a real cluster.

Run: python benchmarks/coordinator_scale.py [--sizes 8 64 256] [--cycles 20] [--quick] [--output PATH]

``--mpi-controller`` measures the MPI controller's status exchange instead, for 8 to 4096 simulated
ranks in one process: what one rank sends, receives and spends on the CPU per cycle, for the two designs
side by side. *rows*: every rank allgathers every rank's status row and decodes the whole matrix (the
exchange before the summary); *summary*: every rank reduces one fixed-size vector with a bitwise AND
(`unison.protocol.cycle`), and in the steady state's cycle (*solo*) the vector is kept per slot and the
result is looked up, not decoded. The exchange itself runs in MPI's C code: bytes are counted for the
algorithms MPICH uses for short messages (an allgather delivers every other rank's row to every rank; a
recursive-doubling allreduce sends and receives the vector once per doubling step, ceil(log2 N) times),
and the CPU time is the rank's own Python work around that one call. An uncached (slow) cycle also
gathers every row to rank 0: rank 0 receives N - 1 rows and decodes them, the other ranks send one.
Default: 512 cache slots, every rank voting for the same 161 (ResNet-50's tensors); results in
``benchmarks/results/coordinator_scale_mpi.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from unison.dtypes import DType
from unison.ops import CollectiveKind
from unison.protocol.cycle import (
    encode_status_row,
    encode_summary,
    read_summary,
    read_votes,
    words_for,
)
from unison.protocol.messages import Request, decode_request_lists, encode_requests, encode_responses
from unison.protocol.negotiation import Coordinator
from unison.service import coordinator_pb2 as pb
from unison.service.client import ControlClient
from unison.service.rendezvous import pack_parts
from unison.service.server import CoordinatorServer

SECRET = "b" * 64
DEFAULT_OUTPUT = str(Path(__file__).parent / "results" / "coordinator_scale.json")
TENSORS = 100
WORDS = (TENSORS + 63) // 64


def status_row(cached: bool, payload_bytes: int, ranks: int = 1) -> bytes:
    hits = [(1 << 64) - 1, (1 << (TENSORS - 64)) - 1] if cached else [0] * WORDS
    return np.array([0, payload_bytes, *hits, *([0] * WORDS)], dtype="<u8").tobytes() * ranks


def payload_for(host: list[int], cycle: int) -> bytes:
    """What a host leader sends in the gather: its ranks' request lists (packed when several)."""
    if len(host) == 1:
        return requests_for(host[0], cycle)
    return pack_parts([requests_for(rank, cycle) for rank in host])


def requests_for(rank: int, cycle: int) -> bytes:
    return encode_requests([
        Request(f"grad.{cycle}.{i}", CollectiveKind.ALLREDUCE, rank, DType.FLOAT32, (256, 64))
        for i in range(TENSORS)
    ])


def run_worker_ranks(address: str, hosts: list[list[int]], cycles: int, cached: bool, start: Any) -> None:
    """A worker process: one thread per simulated host leader, each running `cycles` cycles."""
    clients = [ControlClient(address, SECRET, host[0], speaks_for=host) for host in hosts]
    for client in clients:
        client.register("bench")
    # Payloads are made before the clock starts: on a real cluster ranks encode on their own CPUs.
    payloads = {c.rank: [b"" if cached else payload_for(list(c.speaks_for), cycle) for cycle in range(cycles)]
                for c in clients}
    start.wait()

    def rank_loop(client: ControlClient) -> None:
        for cycle in range(cycles):
            payload = payloads[client.rank][cycle]
            client.exchange(pb.STATUS, status_row(cached, len(payload), len(client.speaks_for)))
            if not cached:
                client.exchange(pb.GATHER, payload)  # answered with rank 0's broadcast

    threads = [threading.Thread(target=rank_loop, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for client in clients:
        client.close()


def measure(size: int, cycles: int, cached: bool, per_host: int) -> dict[str, float]:
    server = CoordinatorServer(size, SECRET, "127.0.0.1:0", "bench", heartbeat_timeout_seconds=600)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    hosts = [list(range(first, min(first + per_host, size))) for first in range(0, size, per_host)]
    others = hosts[1:]
    groups = [others[0::2], others[1::2]]
    workers = [ctx.Process(target=run_worker_ranks, args=(server.address, g, cycles, cached, start))
               for g in groups if g]
    for w in workers:
        w.start()
    master = ControlClient(server.address, SECRET, 0, speaks_for=hosts[0])
    master.register("bench")
    coordinator = Coordinator(size)
    while sum(1 for s in server.ranks if s.pid) < len(hosts):
        time.sleep(0.01)
    mine = [b"" if cached else payload_for(hosts[0], cycle) for cycle in range(cycles)]
    start.set()
    latencies: list[float] = []
    cpu_before = time.process_time()
    for cycle in range(cycles):
        t0 = time.perf_counter()
        payload = mine[cycle]
        reply = master.exchange(pb.STATUS, status_row(cached, len(payload), len(hosts[0])))
        matrix = np.frombuffer(reply.data, dtype="<u8").reshape(size, -1)
        if cached:
            np.bitwise_and.reduce(matrix[:, 2 : 2 + WORDS], axis=0)  # the engine's fast-path decision
        else:
            parts = master.exchange(pb.GATHER, payload).parts
            responses = coordinator.handle(decode_request_lists(parts), now=time.monotonic())
            assert len(responses) == TENSORS, len(responses)
            master.exchange(pb.BROADCAST, encode_responses(responses))
        latencies.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu_before) / cycles
    for w in workers:
        w.join(120)
    master.close()
    server.stop(0)
    latencies.sort()
    return {"p50_ms": 1e3 * statistics.median(latencies),
            "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "master_cpu_ms_per_cycle": 1e3 * cpu,
            "master_cpu_us_per_worker": 1e6 * cpu / size}


def _cpu_seconds(work: Any, repeats: int) -> float:
    """Median process CPU seconds of one call of `work`, over 5 batches of `repeats` calls."""
    batches = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeats):
            work()
        batches.append((time.process_time() - start) / repeats)
    return statistics.median(batches)


def mpi_controller(size: int, slots: int, voted: int) -> dict[str, float]:
    """One rank's bytes and CPU per status exchange at `size` simulated ranks, each design."""
    words = words_for(slots)
    hits = (1 << voted) - 1
    row = encode_status_row(joined=False, news=False, payload_bytes=0, hits=hits, invalid=0, words=words)
    matrix = np.array([row] * size, dtype=np.uint64)  # what the allgather hands every rank
    vector = encode_summary(joined=False, news=False, blocked=False, detail=False, payload=False, hits=hits,
                            own=hits, invalid=0, words=words)
    reduced = np.array(vector, dtype=np.uint64)  # what the AND hands every rank: every rank sent the same
    steps = max(1, (size - 1).bit_length())  # recursive doubling: ceil(log2 N) exchanges

    def rows_cycle() -> None:
        np.array(encode_status_row(joined=False, news=False, payload_bytes=0, hits=hits, invalid=0,
                                   words=words), dtype=np.uint64)
        gathered = matrix.tolist()
        votes = read_votes(gathered, words)
        votes.runnable()  # the decision: the runnable slots
        any(int(r[1]) for r in gathered)  # the slow-path test of the rows

    def summary_cycle() -> None:
        np.array(encode_summary(joined=False, news=False, blocked=False, detail=False, payload=False, hits=hits,
                                own=hits, invalid=0, words=words), dtype=np.uint64)
        read_summary(reduced.tolist(), words).runnable()

    known = {reduced.tobytes(): read_summary(reduced.tolist(), words)}

    def solo_cycle() -> None:
        known.get(reduced.tobytes())

    def slow_rank0() -> None:
        read_votes(matrix.tolist(), words).runnable()

    repeats = max(3, 20000 // size)
    row_bytes, vector_bytes = 8 * len(row), 8 * len(vector)
    return {
        "size": size, "slots": slots, "row_bytes": row_bytes, "vector_bytes": vector_bytes,
        "rows_sent_bytes": row_bytes * (size - 1) if size > 1 else 0,  # a ring allgather forwards N - 1 rows
        "rows_received_bytes": row_bytes * (size - 1),
        "summary_sent_bytes": vector_bytes * steps if size > 1 else 0,
        "summary_received_bytes": vector_bytes * steps if size > 1 else 0,
        "rows_cpu_us": 1e6 * _cpu_seconds(rows_cycle, repeats),
        "summary_cpu_us": 1e6 * _cpu_seconds(summary_cycle, 2000),
        "solo_cpu_us": 1e6 * _cpu_seconds(solo_cycle, 20000),
        "slow_cycle_rank0_received_bytes": row_bytes * (size - 1),
        "slow_cycle_rank0_cpu_us": 1e6 * _cpu_seconds(slow_rank0, repeats),
    }


def run_mpi_controller(sizes: list[int], slots: int, voted: int, output: Path) -> None:
    results: dict[str, Any] = {"load_before": os.getloadavg(), "slots": slots, "voted": voted, "cases": []}
    print(f"{'N':>6} | {'rows: B sent':>12} {'B recv':>10} {'CPU us':>8} | {'summary: B sent':>15} {'B recv':>7} "
          f"{'CPU us':>7} {'solo us':>8} | {'slow, rank 0: B recv':>20} {'CPU us':>8}")
    for size in sizes:
        case = mpi_controller(size, slots, voted)
        results["cases"].append(case)
        print(f"{size:>6} | {case['rows_sent_bytes']:>12} {case['rows_received_bytes']:>10} "
              f"{case['rows_cpu_us']:>8.1f} | {case['summary_sent_bytes']:>15} {case['summary_received_bytes']:>7} "
              f"{case['summary_cpu_us']:>7.1f} {case['solo_cpu_us']:>8.2f} | "
              f"{case['slow_cycle_rank0_received_bytes']:>20} {case['slow_cycle_rank0_cpu_us']:>8.1f}", flush=True)
    results["load_after"] = os.getloadavg()
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mpi-controller", action="store_true",
                        help="the MPI controller's status exchange at 8 to 4096 simulated ranks (see above)")
    parser.add_argument("--slots", type=int, default=512, help="cache slots (--mpi-controller)")
    parser.add_argument("--voted", type=int, default=161, help="slots every rank votes for (--mpi-controller)")
    parser.add_argument("--sizes", type=int, nargs="+", help="simulated ranks N (default 8 64 256; 8 64 with --quick)")
    parser.add_argument("--cycles", type=int, help="uncached cycles per N, 3x as many cached (default 20; 5 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and cycles (smoke run)")
    parser.add_argument("--ranks-per-host", type=int, default=8,
                        help="ranks each negotiation stream speaks for (1: one stream per rank)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    if args.mpi_controller:
        run_mpi_controller(args.sizes or ([8, 256] if args.quick else [8, 64, 256, 1024, 4096]),
                           args.slots, args.voted,
                           Path(args.output).with_name("coordinator_scale_mpi.json") if args.output == DEFAULT_OUTPUT
                           else Path(args.output))
        return
    sizes = args.sizes or ([8, 64] if args.quick else [8, 64, 256])
    cycles = args.cycles or (5 if args.quick else 20)
    results = {"load_before": os.getloadavg(), "tensors_per_cycle": TENSORS, "cycles": cycles,
               "ranks_per_host": args.ranks_per_host, "cases": []}
    print(f"{'N':>5} {'mode':>9} {'p50 ms':>9} {'p99 ms':>9} {'master CPU ms/cycle':>20} {'us/worker':>10}")
    for size in sizes:
        for cached in (True, False):
            row = measure(size, cycles * (3 if cached else 1), cached, args.ranks_per_host)
            mode = "cached" if cached else "uncached"
            results["cases"].append({"size": size, "mode": mode, **row})
            print(f"{size:>5} {mode:>9} {row['p50_ms']:>9.2f} {row['p99_ms']:>9.2f} "
                  f"{row['master_cpu_ms_per_cycle']:>20.2f} {row['master_cpu_us_per_worker']:>10.1f}",
                  flush=True)
    results["load_after"] = os.getloadavg()
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
