"""Type stubs of the Python package leap (the Rust extension leap._leap)."""

import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, ClassVar, Literal, Self, TypedDict, final, overload

from typing_extensions import Buffer

from . import aio as aio

__all__ = [
    "CONTROL_FRAME_MIN",
    "FRAME_LEN_MAX",
    "HEADER_LEN",
    "KEYS",
    "TRANSPORTS",
    "BadFrameLength",
    "Closed",
    "ConfigError",
    "ConnectError",
    "Control",
    "ControlError",
    "ControlType",
    "Error",
    "Frame",
    "FrameKind",
    "FrameLent",
    "FrameLost",
    "FrameTooLarge",
    "KeyControl",
    "PeerClosed",
    "Receiver",
    "SendBuffer",
    "Sender",
    "SystemCallError",
    "Timeout",
    "Transport",
    "frame_len",
    "open",
]

# Any object with the buffer protocol: numpy arrays, bytes, bytearray,
# memoryview, a leap.Frame (Buffer alone would refuse numpy arrays before
# Python 3.12, whose numpy stubs have no __buffer__).
_BufferLike = Buffer | Any
_TransportName = Literal["tcp", "udp", "xdp", "xdp-ringbuf", "kmod"]
_Address = str | tuple[str, int]
_SettingValue = str | int | float | bool | Sequence[int] | os.PathLike[str] | None

KEYS: dict[str, str]
"""Every setting `open` takes (the node file's [transport] keys), with what it sets."""
TRANSPORTS: list[str]
HEADER_LEN: int
"""Bytes of the engine's frame header (pos, flags) before the float32s."""
CONTROL_FRAME_MIN: int
FRAME_LEN_MAX: int

def frame_len(dim: int) -> int:
    """Bytes of a frame of `dim` float32 activations after the header."""

def open(
    kind: _TransportName | str,
    *,
    listen: _Address | None = None,
    next: _Address | None = None,
    prev: _Address | None = None,
    **options: _SettingValue,
) -> Transport:
    """Opens a transport; `options` are leap.KEYS. Raises ConfigError (with `key`)."""

@final
class FrameKind:
    DATA: ClassVar[FrameKind]
    CONTROL: ClassVar[FrameKind]

@final
class ControlType:
    RESIZE_LAYERS: ClassVar[ControlType]
    RESIZE_CHAIN: ClassVar[ControlType]
    ACK: ClassVar[ControlType]

@final
class Control:
    kind: ControlType
    split_layer: int
    end_layer: int
    is_tail: bool
    worker_index: int
    ranges: list[tuple[int, int, bool]]
    def __new__(
        cls,
        kind: ControlType,
        *,
        split_layer: int = 0,
        end_layer: int = 0,
        is_tail: bool = False,
        worker_index: int = 0,
        ranges: Sequence[tuple[int, int, bool]] = ...,
    ) -> Self: ...
    @property
    def total_workers(self) -> int: ...
    @staticmethod
    def decode(frame: _BufferLike) -> Control:
        """Raises ControlError when `frame` does not start with a control message."""
    def encode(self, frame_len: int) -> bytes: ...
    def to_dict(self) -> dict[str, Any]: ...

_ControlLike = Control | dict[str, Any]

@final
class Frame(Buffer):
    """A received frame lent by the transport (read-only buffer, no copy)."""

    @property
    def kind(self) -> FrameKind: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def released(self) -> bool: ...
    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    def release(self) -> None:
        """Gives the frame back; a second call does nothing. BufferError while views are alive."""
    def control(self) -> Control: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

@final
class SendBuffer(Buffer):
    """Memory of the transport a frame is written into in place (writable buffer)."""

    def __len__(self) -> int: ...
    def commit(self) -> None:
        """Sends the frame (the with form). BufferError while views are alive."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None = None, tb: TracebackType | None = None
    ) -> bool: ...

class _Stats(TypedDict, total=False):
    frames_sent: int
    frames_received: int
    chunks_sent: int
    datagrams_sent: int
    chunks_received: int
    bytes_sent: int
    bytes_received: int
    frames_lost: int
    retransmits: int
    chunks_recovered: int
    probes: int
    nacks_sent: int
    nacks_received: int
    timeouts: int
    nacks_refused: int
    nacks_unknown: int
    send_errors: int
    hellos_sent: int
    hellos_received: int
    kernel_drops: int
    copied_bytes: int
    drops: dict[str, int]
    backend: dict[str, int]

_Fill = Callable[[SendBuffer], object]

class _Sends:
    @property
    def frame_size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def send_next(self, buf: _BufferLike) -> None: ...
    def send_multipart_next(self, header: _BufferLike, payload: _BufferLike) -> None: ...
    @overload
    def send_next_with(self, length: int, fill: _Fill, kind: FrameKind = ...) -> None:
        """Calls `fill(out)` and sends the frame it wrote in place."""
    @overload
    def send_next_with(self, length: int, fill: None = None, kind: FrameKind = ...) -> SendBuffer:
        """The with form: `with t.send_next_with(n) as out:` sends at the end of the block."""
    def send_control(self, msg: _ControlLike, frame_len: int | None = None) -> None: ...
    def stats(self) -> _Stats: ...
    def close(self) -> None: ...

class _Receives:
    @property
    def closed(self) -> bool: ...
    @property
    def recv_timeout(self) -> float | None: ...
    def recv_prev(self) -> Frame: ...
    def recv_prev_into(self, buf: _BufferLike) -> tuple[int, FrameKind]: ...
    def try_recv_prev(self) -> Frame | None: ...
    def try_recv_prev_into(self, buf: _BufferLike) -> tuple[int, FrameKind] | None: ...
    def fileno(self) -> int: ...
    def set_recv_timeout(self, seconds: float | None) -> None: ...
    def stats(self) -> _Stats: ...
    def close(self) -> None: ...

@final
class Transport(_Sends, _Receives):
    @property
    def name(self) -> str: ...
    def relay(self) -> Control | None:
        """Receives the next frame and sends it on unchanged (read where it arrived, copied once where it
        leaves); None for a data frame, the `Control` of a control frame (not passed on)."""
    def key_control(self) -> KeyControl:
        """Changes the ring keys while the transport runs, from any thread (ConfigError when opened
        without key_file)."""
    def split(self) -> tuple[Sender, Receiver]: ...
    def stats(self) -> _Stats: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

@final
class KeyControl:
    def set(self, key_file: str | os.PathLike[str], previous_key_file: str | os.PathLike[str] | None = None) -> str:
        """Seals and opens with key_file's key from now on, also taking previous_key_file's while given;
        returns the keys' short name. ConfigError (naming the file) keeps the keys in use."""

@final
class Sender(_Sends):
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

@final
class Receiver(_Receives):
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

class Error(Exception): ...
class Timeout(Error): ...

class FrameLost(Error):
    seq: int
    missing: int
    total: int

class FrameTooLarge(Error):
    length: int
    capacity: int

class BadFrameLength(Error):
    length: int

class PeerClosed(Error): ...

class ConnectError(Error):
    errno: int | None

class SystemCallError(Error):
    call: str
    errno: int | None

class ConfigError(Error):
    key: str
    problem: str

class ControlError(Error): ...
class Closed(Error): ...
class FrameLent(Error): ...
