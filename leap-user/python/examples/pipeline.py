"""A 3-stage pipeline the way a Python inference engine would use leap.

Each stage owns one "layer", a dim x dim float32 matrix W_i, and applies
tanh(x @ W_i) to the activations it receives. The head (stage 0) makes the
activations of position `pos`, applies its layer and sends the frame (an
8-byte header `pos, flags` and dim float32s) to stage 1; stage 1 and 2 do
theirs and stage 2 sends the result back to the head, which checks it
against the same three layers computed locally, frame by frame.

Frames are not copied by the binding: a worker reads the frame where its
transport received it (`recv_prev()` lends it; `np.frombuffer` views it)
and writes its output where its transport sends from (`send_next_with`),
with the transport split into a sender and a receiver.

    python pipeline.py udp                 # 3 stages as threads on loopback
    python pipeline.py tcp --frames 300 --dim 1024
    python pipeline.py xdp --stage 1 --listen 10.77.0.2:9000 \\
        --next 10.77.0.3:9000 --prev 10.77.0.1:9000 --opt interface=lpyr1
                                           # one stage (one process per node)
"""

import argparse
import random
import socket
import sys
import threading
import time

import numpy as np

import leap

HEADER = leap.HEADER_LEN


def layer(stage: int, dim: int) -> np.ndarray:
    """Stage `stage`'s weights, the same in every process."""
    rng = np.random.default_rng(1000 + stage)
    return (rng.standard_normal((dim, dim), dtype=np.float32) / np.float32(np.sqrt(dim))).astype(np.float32)


def activations(pos: int, dim: int) -> np.ndarray:
    """The head's input for position `pos`."""
    return np.random.default_rng(pos).standard_normal(dim, dtype=np.float32)


def header(pos: int) -> bytes:
    return np.array([pos, 1], dtype=np.int32).tobytes()  # pos, flags = REPLY


def apply(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """One layer, written into `out` (no temporary of the frame's size)."""
    np.matmul(x, w, out=out)
    np.tanh(out, out=out)


def worker(t: leap.Transport, stage: int, dim: int, frames: int) -> None:
    """Receives, applies layer `stage` in place, forwards, `frames` times."""
    w = layer(stage, dim)
    sender, receiver = t.split()
    done = 0
    while done < frames:
        try:
            frame = receiver.recv_prev()
        except leap.Timeout:
            continue
        with frame:
            if frame.kind == leap.FrameKind.CONTROL:
                print(f"stage {stage}: control {frame.control()}", file=sys.stderr)
                continue
            x = np.frombuffer(frame, np.float32, offset=HEADER)  # the lent frame, in place

            def fill(out: leap.SendBuffer) -> None:
                memoryview(out)[:HEADER] = memoryview(frame)[:HEADER]
                apply(x, w, np.frombuffer(out, np.float32, offset=HEADER))

            sender.send_next_with(len(frame), fill)
            del x  # no view may outlive the frame's release
        done += 1
    sender.close()
    receiver.close()


def head(t: leap.Transport, dim: int, frames: int) -> float:
    """Sends `frames` positions around the ring and checks each result;
    returns the seconds per round trip (median)."""
    w = [layer(i, dim) for i in range(3)]
    length = leap.frame_len(dim)
    times = []
    for pos in range(frames):
        x = activations(pos, dim)

        def fill(out: leap.SendBuffer) -> None:
            memoryview(out)[:HEADER] = header(pos)
            apply(x, w[0], np.frombuffer(out, np.float32, offset=HEADER))

        started = time.perf_counter()
        t.send_next_with(length, fill)
        while True:
            try:
                frame = t.recv_prev()
                break
            except leap.Timeout:
                continue
        times.append(time.perf_counter() - started)
        with frame:
            back_pos, _flags = np.frombuffer(frame, np.int32, count=2)
            y = np.frombuffer(frame, np.float32, offset=HEADER)
            want = np.tanh(np.tanh(np.tanh(x @ w[0]) @ w[1]) @ w[2])
            ok = len(frame) == length and back_pos == pos and np.allclose(y, want, rtol=1e-5, atol=1e-6)
            del y
        if not ok:
            raise AssertionError(f"frame {pos} came back wrong (pos {back_pos}, {len(frame)} bytes)")
    return float(np.median(times))


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free for both TCP and UDP, never handed out before by
    this process, and below the kernel's ephemeral range: a port the kernel
    picked for `bind(0)` is one it may pick again at once for somebody's
    outgoing connection before our node binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = max(low, 2048)
    for _ in range(1000):
        port = random.randrange(1024 + (top - 1024) // 2, top)
        if port in _HANDED_OUT:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                t.bind(("127.0.0.1", port))
                u.bind(("127.0.0.1", port))
        except OSError:
            continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range after 1000 tries")


def option(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    return key, value


def on_loopback(kind: str, dim: int, frames: int, options: dict) -> None:
    """The three stages as threads of this process (every blocking call and
    numpy's matmul release the GIL)."""
    addrs = [("127.0.0.1", free_port()) for _ in range(3)]
    opened: dict[int, leap.Transport] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            t = leap.open(kind, listen=addrs[i], next=addrs[(i + 1) % 3], prev=addrs[(i + 2) % 3],
                          frame_size=leap.frame_len(dim), **options)
            opened[i] = t
            if i > 0:
                worker(t, i, dim, frames)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(3)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 30
    while len(opened) + len(errors) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    if errors or 0 not in opened:
        raise SystemExit(f"opening the ring failed: {errors or 'timeout'}")
    with opened[0] as t:
        rtt = head(t, dim, frames)
        stats = t.stats()
    for th in threads:
        th.join(timeout=30)
    if errors:
        raise errors[0]
    print(f"{frames} frames of {leap.frame_len(dim)} bytes through 3 stages over {kind}: every frame checked, "
          f"median round trip {rtt * 1e6:.0f} us, copied_bytes {stats['copied_bytes']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", nargs="?", default="udp", choices=leap.TRANSPORTS)
    p.add_argument("--dim", type=int, default=4096, help="activations per frame (16 392-byte frames at 4096)")
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--stage", type=int, choices=[0, 1, 2], help="run this one stage (0: the head)")
    p.add_argument("--listen")
    p.add_argument("--next")
    p.add_argument("--prev")
    p.add_argument("--opt", type=option, action="append", default=[], metavar="KEY=VALUE",
                   help="a transport setting (leap.KEYS), e.g. interface=eth0")
    a = p.parse_args()
    options = dict(a.opt)
    if a.stage is None:
        on_loopback(a.kind, a.dim, a.frames, options)
        return
    with leap.open(a.kind, listen=a.listen, next=a.next, prev=a.prev, frame_size=leap.frame_len(a.dim),
                   **options) as t:
        if a.stage == 0:
            time.sleep(0.2)  # the workers open their transports
            rtt = head(t, a.dim, a.frames)
            print(f"head: {a.frames} frames over {a.kind} checked, median round trip {rtt * 1e6:.0f} us")
        else:
            worker(t, a.stage, a.dim, a.frames)


if __name__ == "__main__":
    main()
