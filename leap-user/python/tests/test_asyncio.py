"""leap.aio: receives await the transport's readiness descriptor on the
loop (no thread, no blocking), the numpy pipeline runs as three tasks of
one loop, the receive deadline holds; the non-blocking receive under it
returns at once."""

import asyncio
import sys
import time

import numpy as np
import pytest

import leap
import leap.aio
from conftest import EXAMPLES, pair

sys.path.insert(0, str(EXAMPLES))
import async_pipeline  # noqa: E402

LEN = leap.frame_len(1024)


def test_the_asyncio_pipeline_checks_every_frame(kind):
    # The three stages are tasks of this one loop: a receive that blocked
    # the thread would stall the ring; a ticker task measures that the loop
    # keeps turning meanwhile.
    gaps = []

    async def run():
        task = asyncio.create_task(async_pipeline.ring(kind, 1024, 300))
        last = time.monotonic()
        while not task.done():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        return await task

    out = asyncio.run(run())
    assert f"300 frames of {LEN} bytes through 3 asyncio stages over {kind}: every frame checked" in out
    assert len(gaps) > 10 and max(gaps) < 0.5, f"the loop stalled for {max(gaps):.3f} s"


def test_a_receive_awaits_without_blocking_the_loop(kind):
    a, b = pair(kind, frame_size=LEN, recv_timeout_ms=5000)

    async def run():
        rx = leap.aio.AsyncTransport(b)
        got = asyncio.create_task(rx.recv_prev())
        ticks = 0
        for _ in range(20):  # the loop runs while the receive waits
            await asyncio.sleep(0.005)
            ticks += 1
        assert not got.done()
        a.send_next(np.full(LEN // 4, 3.0, np.float32))
        frame = await asyncio.wait_for(got, 5)
        with frame:
            assert np.frombuffer(frame, np.float32)[-1] == 3.0
        return ticks

    with a, b:
        assert asyncio.run(run()) == 20


def test_the_receive_deadline_raises_timeout_on_the_loop(kind):
    a, b = pair(kind, frame_size=LEN, recv_timeout_ms=200)

    async def run():
        rx = leap.aio.AsyncTransport(b)
        started = time.monotonic()
        with pytest.raises(leap.Timeout):
            await rx.recv_prev()
        return time.monotonic() - started

    with a, b:
        assert 0.15 < asyncio.run(run()) < 2


def test_the_non_blocking_receive_returns_at_once_and_keeps_the_blocking_deadline(kind):
    a, b = pair(kind, frame_size=LEN, recv_timeout_ms=300)
    with a, b:
        started = time.monotonic()
        assert b.try_recv_prev() is None and b.try_recv_prev_into(bytearray(LEN)) is None
        assert time.monotonic() - started < 0.1
        assert isinstance(b.fileno(), int) and b.recv_timeout == 0.3
        a.send_next(bytes(LEN))
        deadline = time.monotonic() + 5
        frame = None
        while frame is None and time.monotonic() < deadline:
            frame = b.try_recv_prev()
            if frame is None:
                time.sleep(0.001)
        assert frame is not None and len(frame) == LEN
        frame.release()
        # A blocking receive after non-blocking ones waits its deadline again.
        started = time.monotonic()
        with pytest.raises(leap.Timeout):
            b.recv_prev()
        assert time.monotonic() - started > 0.2


def test_async_halves_and_async_open():
    async def run():
        port_a, port_b = pair_ports()
        ta, tb = await asyncio.gather(
            leap.aio.open("tcp", listen=port_a, next=port_b, frame_size=LEN),
            leap.aio.open("tcp", listen=port_b, next=port_a, frame_size=LEN))
        sender, _ = ta.split()
        _, receiver = tb.split()
        for i in range(50):
            await sender.send_next(np.full(LEN // 4, i, np.float32))
        for i in range(50):
            with await receiver.recv_prev() as f:
                assert np.frombuffer(f, np.float32)[0] == i
        assert receiver.stats()["frames_received"] == 50
        for h in (sender, receiver):
            h.close()

    asyncio.run(run())


def pair_ports():
    from conftest import free_port, loopback

    return loopback(free_port()), loopback(free_port())
