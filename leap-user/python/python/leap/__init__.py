"""leap: moves activation frames around a ring of machines that run one
model split layer-wise, over TCP, UDP, XDP or the kernel module, with the
Rust library underneath (the Rust extension ``leap._leap``).

    import leap, numpy as np

    with leap.open("udp", listen="127.0.0.1:9000", next="127.0.0.1:9001",
                   recv_timeout_ms=500) as t:
        t.send_next(np.arange(4, dtype=np.float32))    # no copy
        with t.recv_prev() as frame:                   # lent by the transport
            x = np.frombuffer(frame, np.float32)       # no copy
            y = x * 2                                  # y is yours
            del x                                      # views first, then release

``open`` takes the node file's ``[transport]`` keys as keyword arguments
(``leap.KEYS``). Every blocking call releases the GIL. ``leap.aio`` has the
asyncio interface.
"""

from ._leap import (
    CONTROL_FRAME_MIN,
    FRAME_LEN_MAX,
    HEADER_LEN,
    KEYS,
    TRANSPORTS,
    BadFrameLength,
    Closed,
    ConfigError,
    ConnectError,
    Control,
    ControlError,
    ControlType,
    Error,
    Frame,
    FrameKind,
    FrameLent,
    FrameLost,
    FrameTooLarge,
    KeyControl,
    PeerClosed,
    Receiver,
    SendBuffer,
    Sender,
    SystemCallError,
    Timeout,
    Transport,
    frame_len,
    open,
)

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

from . import aio  # noqa: E402  (the asyncio interface, leap.aio)
