"""The GIL is released while a call blocks; the halves of a split transport
work from two threads."""

import threading
import time

import numpy as np

import leap
from conftest import pair

LEN = leap.frame_len(4096)


def test_another_python_thread_runs_while_one_blocks_in_a_receive(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        b.set_recv_timeout(10.0)
        got = {}

        def receive():
            started = time.monotonic()
            with b.recv_prev() as f:
                got["len"], got["waited"] = len(f), time.monotonic() - started

        t = threading.Thread(target=receive)
        t.start()
        # Pure Python work in this thread while the other blocks: it gets
        # the GIL all along (with the GIL held by the receive, this loop
        # would stall until the 10 s deadline).
        count, until = 0, time.monotonic() + 0.5
        while time.monotonic() < until:
            count += 1
        assert t.is_alive(), "the receive should still be waiting"
        assert count > 10_000, f"only {count} iterations in 0.5 s while the other thread blocked"
        a.send_next(bytes(LEN))
        t.join(10)
        assert not t.is_alive() and got["len"] == LEN
        assert 0.4 < got["waited"] < 5


def test_halves_of_a_split_transport_send_and_receive_from_two_threads(kind):
    a, b = pair(kind, frame_size=LEN)
    sender, _ = a.split()
    _, receiver = b.split()
    n, seen = 300, []

    def receive():
        for _ in range(n):
            with receiver.recv_prev() as f:
                seen.append(int(np.frombuffer(f, np.int32, count=1)[0]))

    t = threading.Thread(target=receive)
    t.start()
    frame = np.zeros(LEN // 4, np.int32)
    for i in range(n):
        frame[0] = i
        sender.send_next(frame)
    t.join(30)
    assert seen == list(range(n))
    assert sender.stats()["frames_sent"] == n and receiver.stats()["frames_received"] == n
    for h in (sender, receiver):
        h.close()
    a.close()
    b.close()
