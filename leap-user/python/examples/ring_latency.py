"""Round-trip latency of a 3-node ring driven from Python, comparable with
`leap ring --nodes 3 --loopback`: the head sends a frame and waits for it to
come back; each worker is its own process and relays like leap's own
worker (`relay`: the frame read where it was received, copied once into
the memory it is sent from), through the lending API and split halves.

    python ring_latency.py udp --frames 2000 --frame-size 16392
    # p50 ... us  p90 ... us  p99 ... us
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

import leap
from pipeline import free_port


def worker(t: leap.Transport, frames: int) -> None:
    sender, receiver = t.split()
    done = 0
    while done < frames:
        try:
            frame = receiver.recv_prev()
        except leap.Timeout:
            continue
        with frame:
            src = memoryview(frame)

            def fill(out):
                memoryview(out)[:] = src

            sender.send_next_with(len(frame), fill)
            src.release()
        done += 1


def head(t: leap.Transport, frames: int, size: int, warmup: int) -> list[float]:
    payload = np.zeros(size, np.uint8)
    rtts = []
    for i in range(frames + warmup):
        payload[:4] = np.frombuffer(np.int32(i).tobytes(), np.uint8)
        started = time.perf_counter()
        t.send_next(payload)
        while True:
            try:
                frame = t.recv_prev()
                break
            except leap.Timeout:
                continue
        rtts.append(time.perf_counter() - started)
        frame.release()
    return rtts[warmup:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", nargs="?", default="udp", choices=["tcp", "udp"])
    p.add_argument("--frames", type=int, default=2000)
    p.add_argument("--frame-size", type=int, default=16392)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", nargs=3, metavar=("LISTEN", "NEXT", "PREV"), help=argparse.SUPPRESS)
    a = p.parse_args()
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
            rtts = np.array(head(t, a.frames, a.frame_size, warmup)) * 1e6
        for proc in procs:
            proc.wait(60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    p50, p90, p99 = np.percentile(rtts, [50, 90, 99])
    if a.json:
        print(json.dumps({"transport": a.kind, "frames": a.frames, "p50_us": p50, "p90_us": p90, "p99_us": p99}))
    else:
        print(f"{a.kind} {a.frame_size} B x {a.frames}: p50 {p50:.0f} us  p90 {p90:.0f} us  p99 {p99:.0f} us")


if __name__ == "__main__":
    main()
