"""Round-trip latency of a 3-node ring driven from Python, comparable with
`leap ring --nodes 3 --loopback`: the head sends a frame and waits for it to
come back; each worker is its own process and relays like leap's own
worker (`relay`: the frame read where it was received, copied once into
the memory it is sent from, one call per frame).

    python ring_latency.py udp --frames 2000 --frame-size 16392
    # p50 ... us  p90 ... us  p99 ... us

With --role it is one member of a ring `leap bench` starts, in the
protocol of `leap bench --ring-program` (rows `KIND·python`):

    python ring_latency.py --kind udp --role worker --listen A --next B --prev C \\
        --frames 500 --frame-size 16392 --workers 2 --index 0 --set recv_timeout_ms=200
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import time

# numpy's BLAS starts a pool of threads when it is imported, which spin for
# a while (under `leap bench`, as real-time threads: the benchmark's class is
# inherited), keeping CPUs from idling and taking them from the ring. This
# program does no linear algebra: one thread, as the Rust and C members run.
for _blas in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas, "1")

import numpy as np  # noqa: E402

import leap  # noqa: E402
from pipeline import free_port, option  # noqa: E402


def worker(t: leap.Transport, frames: int) -> dict:
    """Passes `frames` frames on unchanged (or until SIGINT), as `leap ring`'s
    workers do: `relay` reads each frame where it arrived and copies it once
    into the memory it is sent from, one call per frame; a control message
    goes on as it came. Returns the transport's counters."""
    relay, send_control = t.relay, t.send_control
    done = 0
    try:
        while done < frames:
            try:
                msg = relay()
            except leap.Timeout:
                continue
            if msg is None:
                done += 1
            else:
                send_control(msg)
    except KeyboardInterrupt:  # leap bench stops its workers with SIGINT
        pass
    return t.stats()


# Frame `pos` carries payload pattern `pos % PATTERNS`, as `leap ring`'s head.
PATTERNS = 4
# The head gives up when no frame came back for this long (leap bench's bound).
STALL_S = 20.0


def bench_head(t: leap.Transport, frames: int, size: int, warmup: int = 0) -> dict:
    """`leap bench`'s head: `frames` frames one at a time (after `warmup`
    untimed ones), each sent with `send_next` (one copy, into the memory
    the transport sends from, as it would send a numpy array's) and read
    where it arrived (`recv_prev`); every byte checked. Returns the JSON line.

    The loop runs as few Python steps per frame as it can: the head shares
    its CPU with a worker (`--cpus`) and finds its caches cold after every
    frame, so each step in the timed region costs far more than in a warm
    loop. Each pattern is one `bytearray` that the frame's header is packed
    into; the check compares that buffer with the lent frame in place
    (`bytearray.__eq__` takes any buffer: one memcmp, nothing allocated).
    With `send_next_with`'s context manager (an object, a memoryview and
    two slice copies per frame) the Python ring was 1.14x Rust's processes
    at 16 392 B in `leap bench`'s rounds, with this loop 1.03x (udp)."""
    hlen = leap.HEADER_LEN
    bufs = [bytearray(hlen) + np.random.default_rng(k).integers(0, 256, size - hlen, dtype=np.uint8).tobytes()
            for k in range(PATTERNS)]
    pack = struct.Struct("<ii").pack_into
    rtts = [0] * frames
    clock = time.perf_counter_ns
    send, recv = t.send_next, t.recv_prev
    corrupt = 0
    started = clock()
    for pos in range(-warmup, frames):
        buf = bufs[pos % PATTERNS]
        pack(buf, 0, pos, 1)
        t0 = clock()
        send(buf)
        while True:
            try:
                frame = recv()
                break
            except leap.Timeout:
                if (clock() - t0) / 1e9 > STALL_S:
                    raise
        if pos >= 0:
            rtts[pos] = clock() - t0
        if buf != frame:  # lengths differ, or a byte does
            corrupt += 1
        frame.release()
    elapsed = (clock() - started) / 1e9
    us = np.array(rtts, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    return {"role": "head", "rtt_us": {"p50": p50, "p90": p90, "p99": p99, "max": us.max(), "mean": us.mean()},
            "frames_sent": frames + warmup, "frames_delivered": frames + warmup - corrupt, "frames_corrupt": corrupt,
            "elapsed_s": elapsed, "stats": t.stats()}


def member(a: argparse.Namespace) -> None:
    """One member of `leap bench`'s ring (its `--ring-program` protocol)."""
    settings = dict(option(s) for s in a.set)
    settings.setdefault("frame_size", str(a.frame_size))
    with leap.open(a.kind_opt, listen=a.listen, next=a.next, prev=a.prev or None, **settings) as t:
        if a.role == "worker":
            print("ready", flush=True)
            stats = worker(t, a.frames)
            print(json.dumps({"role": "worker", "index": a.index, "stats": stats}), flush=True)
            return
        out = bench_head(t, a.frames, a.frame_size)
    print(json.dumps(out), flush=True)
    if out["frames_corrupt"]:
        raise SystemExit(f"{out['frames_corrupt']} corrupt frames")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", nargs="?", default="udp", choices=["tcp", "udp"])
    p.add_argument("--frames", type=int, default=2000)
    p.add_argument("--frame-size", type=int, default=16392)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", nargs=3, metavar=("LISTEN", "NEXT", "PREV"), help=argparse.SUPPRESS)
    # The protocol of `leap bench --ring-program` (one member per process).
    p.add_argument("--role", choices=["head", "worker"])
    p.add_argument("--kind", dest="kind_opt", choices=leap.TRANSPORTS)
    p.add_argument("--listen")
    p.add_argument("--next")
    p.add_argument("--prev")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args()
    if a.role:
        if not (a.kind_opt and a.listen and a.next):
            p.error("--role needs --kind, --listen and --next")
        member(a)
        return
    warmup = 100
    if a.worker:
        listen, nxt, prev = a.worker
        with leap.open(a.kind, listen=listen, next=nxt, prev=prev, frame_size=a.frame_size) as t:
            print("ready", flush=True)
            worker(t, a.frames + warmup)
        return
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    procs = [subprocess.Popen([sys.executable, __file__, a.kind, "--frames", str(a.frames), "--frame-size",
                               str(a.frame_size), "--worker", addrs[i], addrs[(i + 1) % 3], addrs[(i + 2) % 3]],
                              stdout=subprocess.PIPE, text=True)
             for i in (1, 2)]
    try:
        with leap.open(a.kind, listen=addrs[0], next=addrs[1], prev=addrs[2], frame_size=a.frame_size) as t:
            for proc in procs:  # each worker has opened its transport (TCP: after the head's)
                if proc.stdout.readline().strip() != "ready":
                    raise SystemExit("a worker failed to open its transport")
            out = bench_head(t, a.frames, a.frame_size, warmup)
        for proc in procs:
            proc.wait(60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    if out["frames_corrupt"]:
        raise SystemExit(f"{out['frames_corrupt']} corrupt frames")
    p50, p90, p99 = (out["rtt_us"][k] for k in ("p50", "p90", "p99"))
    if a.json:
        print(json.dumps({"transport": a.kind, "frames": a.frames, "p50_us": p50, "p90_us": p90, "p99_us": p99}))
    else:
        print(f"{a.kind} {a.frame_size} B x {a.frames}: p50 {p50:.0f} us  p90 {p90:.0f} us  p99 {p99:.0f} us")


if __name__ == "__main__":
    main()
