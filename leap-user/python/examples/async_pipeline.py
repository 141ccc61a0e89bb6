"""examples/pipeline.py on asyncio: the three stages are tasks of one event
loop in one thread; every receive awaits the transport's readiness
descriptor (leap.aio), nothing blocks the loop.

    python async_pipeline.py udp --frames 300 --dim 1024
"""

import argparse
import asyncio
import time

import numpy as np

import leap
import leap.aio
from pipeline import HEADER, activations, apply, free_port, header, layer


async def worker(t: leap.aio.AsyncTransport, stage: int, dim: int, frames: int) -> None:
    w = layer(stage, dim)
    sender, receiver = t.split()
    for _ in range(frames):
        with await receiver.recv_prev() as frame:
            x = np.frombuffer(frame, np.float32, offset=HEADER)

            def fill(out):
                memoryview(out)[:HEADER] = memoryview(frame)[:HEADER]
                apply(x, w, np.frombuffer(out, np.float32, offset=HEADER))

            await sender.send_next_with(len(frame), fill)
            del x
    sender.close()
    receiver.close()


async def head(t: leap.aio.AsyncTransport, dim: int, frames: int) -> float:
    w = [layer(i, dim) for i in range(3)]
    length = leap.frame_len(dim)
    times = []
    for pos in range(frames):
        x = activations(pos, dim)

        def fill(out):
            memoryview(out)[:HEADER] = header(pos)
            apply(x, w[0], np.frombuffer(out, np.float32, offset=HEADER))

        started = time.perf_counter()
        await t.send_next_with(length, fill)
        with await t.recv_prev() as frame:
            times.append(time.perf_counter() - started)
            back_pos = int(np.frombuffer(frame, np.int32, count=1)[0])
            y = np.frombuffer(frame, np.float32, offset=HEADER)
            want = np.tanh(np.tanh(np.tanh(x @ w[0]) @ w[1]) @ w[2])
            ok = back_pos == pos and np.allclose(y, want, rtol=1e-5, atol=1e-6)
            del y
        if not ok:
            raise AssertionError(f"frame {pos} came back wrong")
    return float(np.median(times))


async def ring(kind: str, dim: int, frames: int) -> str:
    addrs = [("127.0.0.1", free_port()) for _ in range(3)]
    # Opened concurrently (TCP: each connects while it accepts), each in a
    # worker thread; everything after runs on this loop's thread.
    ts = await asyncio.gather(*(
        leap.aio.open(kind, listen=addrs[i], next=addrs[(i + 1) % 3], prev=addrs[(i + 2) % 3],
                      frame_size=leap.frame_len(dim), recv_timeout_ms=5000)
        for i in range(3)))
    workers = [asyncio.create_task(worker(ts[i], i, dim, frames)) for i in (1, 2)]
    rtt = await head(ts[0], dim, frames)
    await asyncio.gather(*workers)
    ts[0].close()
    return (f"{frames} frames of {leap.frame_len(dim)} bytes through 3 asyncio stages over {kind}: "
            f"every frame checked, median round trip {rtt * 1e6:.0f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", nargs="?", default="udp", choices=["tcp", "udp"])
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--frames", type=int, default=200)
    a = p.parse_args()
    print(asyncio.run(ring(a.kind, a.dim, a.frames)))


if __name__ == "__main__":
    main()
