"""Every exception class, raised by a real condition, carrying the library's
message; all of them are leap.Error."""

import threading
import time

import numpy as np
import pytest

import leap
from conftest import Relay, free_port, loopback, pair

LEN = leap.frame_len(4096)


def test_timeout_when_nothing_arrives(kind):
    a, b = pair(kind, recv_timeout_ms=200)
    with a, b:
        with pytest.raises(leap.Timeout, match="no frame within 200ms"):
            b.recv_prev()
        with pytest.raises(leap.Timeout):
            b.recv_prev_into(bytearray(LEN))
        b.set_recv_timeout(0.05)
        started = time.monotonic()
        with pytest.raises(leap.Timeout):
            b.recv_prev()
        assert time.monotonic() - started < 1
        with pytest.raises(ValueError, match="above 0"):
            b.set_recv_timeout(-1)
        assert b.stats()["timeouts"] >= 2 or kind == "tcp"


def test_frame_lost_when_a_chunk_never_arrives_in_best_effort_mode():
    pa, pb = free_port(), free_port()
    seen = {"chunks": 0}

    def third_chunk(datagram: bytes) -> bool:
        if len(datagram) < 1000:  # hellos
            return False
        seen["chunks"] += 1
        return seen["chunks"] == 3

    relay = Relay(pa, pb, third_chunk)
    opts = dict(reliability="best-effort", trains=False, gso=False, recv_timeout_ms=500, frame_size=LEN)
    try:
        with leap.open("udp", listen=loopback(pa), next=loopback(relay.port), **opts) as a, \
                leap.open("udp", listen=loopback(pb), next=loopback(relay.port), prev=loopback(relay.port),
                          **opts) as b:
            time.sleep(0.2)
            a.send_next(bytes(LEN))
            a.send_next(bytes(LEN))
            with pytest.raises(leap.FrameLost, match="frame seq 0 lost: 1 of 12 chunks missing") as e:
                b.recv_prev()
            assert (e.value.seq, e.value.missing, e.value.total) == (0, 1, 12)
            with b.recv_prev() as f:
                assert len(f) == LEN
            assert relay.dropped == 1 and b.stats()["frames_lost"] == 1
    finally:
        relay.close()


def test_frame_too_large_for_the_buffer_given():
    a, b = pair("tcp", frame_size=LEN)
    with a, b:
        a.send_next(bytes(LEN))
        with pytest.raises(leap.FrameTooLarge, match=f"frame of {LEN} bytes does not fit a 100-byte buffer") as e:
            b.recv_prev_into(bytearray(100))
        assert (e.value.length, e.value.capacity) == (LEN, 100)


def test_a_datagram_frame_too_large_for_the_buffer_is_dropped_and_counted():
    # The datagram transports put chunks together in the caller's buffer:
    # a frame that cannot fit is dropped as it arrives (drops.too_large).
    a, b = pair("udp", frame_size=LEN, recv_timeout_ms=300)
    with a, b:
        a.send_next(bytes(LEN))
        with pytest.raises(leap.Timeout):
            b.recv_prev_into(bytearray(100))
        assert b.stats()["drops"]["too_large"] >= 1


def test_bad_frame_length_for_an_empty_frame(kind):
    a, b = pair(kind)
    with a, b:
        with pytest.raises(leap.BadFrameLength, match="cannot send a frame of 0 bytes") as e:
            a.send_next(b"")
        assert e.value.length == 0


def test_peer_closed_when_the_previous_node_goes():
    a, b = pair("tcp", frame_size=LEN)
    a.close()
    with pytest.raises(leap.PeerClosed, match="closed the connection"):
        b.recv_prev()
    b.close()


def test_connect_error_when_nobody_listens():
    with pytest.raises(leap.ConnectError, match="cannot connect to") as e:
        leap.open("tcp", listen=loopback(free_port()), next=loopback(free_port()), setup_timeout_s=1)
    assert e.value.errno == 111  # ECONNREFUSED


def test_system_call_error_for_an_address_not_on_this_host(kind):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: bind fails
    # before anything is sent.
    with pytest.raises(leap.SystemCallError, match="Cannot assign requested address") as e:
        leap.open(kind, listen="192.0.2.1:9000", next="127.0.0.1:9", setup_timeout_s=1)
    assert (e.value.call, e.value.errno) == ("bind", 99)  # EADDRNOTAVAIL


@pytest.mark.parametrize(
    "settings, key, says",
    [
        (dict(listen="localhost", next="127.0.0.1:9"), "listen", "is not ADDR:PORT"),
        (dict(listen="127.0.0.1:9"), "next", "not set"),
        (dict(listen="127.0.0.1:9", next="127.0.0.1:10", pigeon=1), "pigeon", "the settings are: listen, next"),
        (dict(listen="127.0.0.1:9", next="127.0.0.1:10", crc="maybe"), "crc", "choose true or false"),
        (dict(listen="127.0.0.1:9", next="127.0.0.1:10", inflight=48, window=16), "window", "inflight = 48"),
        (dict(listen="127.0.0.1:9", next="127.0.0.1:10", queues=["a"]), "queues", "list of whole numbers"),
    ],
)
def test_config_error_names_the_key_and_the_fix(settings, key, says):
    with pytest.raises(leap.ConfigError, match=says) as e:
        leap.open("udp", **settings)
    assert e.value.key == key and says in str(e.value)


def test_config_error_for_an_unknown_transport():
    with pytest.raises(leap.ConfigError, match="choose one of: tcp, udp, xdp, xdp-ringbuf, kmod") as e:
        leap.open("quic", listen="127.0.0.1:9", next="127.0.0.1:10")
    assert e.value.key == "kind"


def test_control_error_for_a_frame_that_cannot_hold_it_or_is_not_one(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        msg = leap.Control(leap.ControlType.ACK)
        with pytest.raises(leap.ControlError, match="needs 164 bytes"):
            a.send_control(msg, frame_len=100)
        with pytest.raises(leap.ControlError, match="start is after its end"):
            a.send_control(leap.Control(leap.ControlType.RESIZE_LAYERS, split_layer=5, end_layer=2))
        a.send_next(np.ones(LEN // 4, np.float32))
        with b.recv_prev() as f:
            with pytest.raises(leap.ControlError, match="data frame"):
                f.control()
            with pytest.raises(leap.ControlError, match="0xC0DE"):
                leap.Control.decode(f)


def test_closed_after_close_and_after_split(kind):
    a, b = pair(kind)
    a.close()
    a.close()  # twice: nothing
    with pytest.raises(leap.Closed, match="closed"):
        a.send_next(b"x")
    halves = b.split()
    with pytest.raises(leap.Closed, match="split"):
        b.recv_prev()
    for h in halves:
        h.close()
        with pytest.raises(leap.Closed):
            h.stats()


def test_frame_lent_while_a_frame_is_out(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        a.send_next(bytes(LEN))
        with b.recv_prev():
            for call in (b.recv_prev, lambda: b.send_next(b"x"), b.stats, lambda: b.recv_prev_into(bytearray(LEN))):
                with pytest.raises(leap.FrameLent, match="still lent"):
                    call()


def test_every_class_is_a_leap_error():
    classes = [leap.Timeout, leap.FrameLost, leap.FrameTooLarge, leap.BadFrameLength, leap.PeerClosed,
               leap.ConnectError, leap.SystemCallError, leap.ConfigError, leap.ControlError, leap.Closed,
               leap.FrameLent]
    assert all(issubclass(c, leap.Error) for c in classes)
    assert issubclass(leap.Error, Exception)


def test_a_blocked_receive_is_not_disturbed_by_close_from_another_thread():
    # close() waits for the receive that holds the transport, then closes.
    a, b = pair("udp", recv_timeout_ms=300)
    errors = []

    def receive():
        try:
            b.recv_prev()
        except leap.Error as e:
            errors.append(e)

    t = threading.Thread(target=receive)
    t.start()
    time.sleep(0.05)
    b.close()
    t.join(5)
    assert b.closed and len(errors) == 1 and isinstance(errors[0], leap.Timeout)
    a.close()
