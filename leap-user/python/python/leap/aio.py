"""asyncio over leap: ``await t.recv_prev()`` and ``await t.send_next(buf)``
on the running loop, without threads.

A receive first takes what has arrived (``try_recv_prev``: a complete frame,
or at once None); on None it waits for the transport's readiness descriptor
(``fileno()``) with ``loop.add_reader`` and tries again. The descriptor is the
library's: it becomes readable when a receive may make progress, also for
frames the transport completed in the background. The receive deadline is
the transport's (``recv_timeout_ms`` when opened, ``set_recv_timeout``):
past it, ``leap.Timeout``.

Sends are the library's sends, made directly: a datagram transport hands a
frame to the kernel in one call and never waits for the peer; TCP may wait
while the kernel's send buffer is full (as a blocking socket does), and the
first datagram frame may wait for the next node to prove itself.

    import asyncio, leap, leap.aio, numpy as np

    async def main():
        async with leap.aio.open("udp", listen="127.0.0.1:9000",
                                 next="127.0.0.1:9001") as t:
            await t.send_next(np.zeros(4098, np.float32))
            with await t.recv_prev() as frame:
                print(np.frombuffer(frame, np.float32)[:4])

    asyncio.run(main())
"""

import asyncio
import time

from . import _leap

__all__ = ["AsyncReceiver", "AsyncSender", "AsyncTransport", "open"]


class _Receiving:
    """Receives of a Transport or a Receiver on the running loop."""

    def __init__(self, rx):
        self._rx = rx
        self._waiting = asyncio.Lock()  # one waiter per descriptor

    async def _wait(self, attempt):
        timeout = self._rx.recv_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self._waiting:
            loop = asyncio.get_running_loop()
            fd = self._rx.fileno()
            while True:
                got = attempt()
                if got is not None:
                    return got
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise _leap.Timeout(f"no frame within {timeout}s")
                ready = loop.create_future()
                loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
                try:
                    await asyncio.wait_for(ready, left)
                except TimeoutError:
                    pass  # one more try, then Timeout
                finally:
                    loop.remove_reader(fd)

    async def recv_prev(self) -> "_leap.Frame":
        """The next frame, lent (see leap.Frame)."""
        return await self._wait(self._rx.try_recv_prev)

    async def recv_prev_into(self, buf) -> "tuple[int, _leap.FrameKind]":
        """The next frame, written into `buf`: its length and kind."""
        return await self._wait(lambda: self._rx.try_recv_prev_into(buf))

    def set_recv_timeout(self, seconds):
        self._rx.set_recv_timeout(seconds)


class _Sending:
    """Sends of a Transport or a Sender (made directly, see the module)."""

    def __init__(self, tx):
        self._tx = tx

    async def send_next(self, buf) -> None:
        self._tx.send_next(buf)

    async def send_multipart_next(self, header, payload) -> None:
        self._tx.send_multipart_next(header, payload)

    async def send_next_with(self, length: int, fill, kind=_leap.FrameKind.DATA) -> None:
        self._tx.send_next_with(length, fill, kind)

    async def send_control(self, msg, frame_len=None) -> None:
        self._tx.send_control(msg, frame_len)


class AsyncTransport(_Receiving, _Sending):
    """A leap.Transport driven by asyncio."""

    def __init__(self, transport: "_leap.Transport"):
        _Receiving.__init__(self, transport)
        _Sending.__init__(self, transport)
        self.transport = transport

    def stats(self) -> dict:
        return self.transport.stats()

    def split(self) -> "tuple[AsyncSender, AsyncReceiver]":
        """A sender and a receiver for two tasks (this object is closed)."""
        sender, receiver = self.transport.split()
        return AsyncSender(sender), AsyncReceiver(receiver)

    def close(self) -> None:
        self.transport.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
        return False


class AsyncSender(_Sending):
    """The sending half of a split AsyncTransport."""

    def __init__(self, sender: "_leap.Sender"):
        super().__init__(sender)
        self.sender = sender

    def stats(self) -> dict:
        return self.sender.stats()

    def close(self) -> None:
        self.sender.close()


class AsyncReceiver(_Receiving):
    """The receiving half of a split AsyncTransport."""

    def __init__(self, receiver: "_leap.Receiver"):
        super().__init__(receiver)
        self.receiver = receiver

    def stats(self) -> dict:
        return self.receiver.stats()

    def close(self) -> None:
        self.receiver.close()


class _Opening:
    """What `open` returns: awaited, the AsyncTransport; in `async with`,
    the AsyncTransport closed at the end of the block."""

    def __init__(self, kind: str, settings: dict):
        self._kind, self._settings, self._t = kind, settings, None

    async def _open(self) -> AsyncTransport:
        return AsyncTransport(await asyncio.to_thread(_leap.open, self._kind, **self._settings))

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> AsyncTransport:
        self._t = await self._open()
        return self._t

    async def __aexit__(self, *exc):
        self._t.close()
        return False


def open(kind: str, **settings) -> _Opening:  # noqa: A001 (leap.open's name)
    """leap.open without blocking the loop (TCP connects and accepts in a
    worker thread): ``t = await leap.aio.open(...)`` or
    ``async with leap.aio.open(...) as t``."""
    return _Opening(kind, settings)
