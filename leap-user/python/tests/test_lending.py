"""Frames lent to Python: read in place (no copy by the binding), given back
to the transport exactly once whatever the caller does, never freed under a
live numpy view; frames written in place; any buffer sent without a copy."""

import gc

import numpy as np
import pytest

import leap
from conftest import pair

LEN = leap.frame_len(4096)


def fill_with(value: float):
    def fill(out):
        np.frombuffer(out, np.float32)[:] = value

    return fill


def test_a_lent_frame_is_read_in_place_and_copies_nothing_on_tcp():
    # TCP's lending path copies no frame in user space (README: tcp 0 / 0):
    # through the binding it stays 0 on both sides.
    a, b = pair("tcp", frame_size=LEN)
    with a, b:
        addresses = set()
        for i in range(200):
            a.send_next_with(LEN, fill_with(i))
            with b.recv_prev() as f:
                x = np.frombuffer(f, np.float32)
                assert x[0] == i and x[-1] == i and not x.flags.writeable
                addresses.add(x.ctypes.data)
                del x
        sa, sb = a.stats(), b.stats()
        assert sb["frames_received"] == 200 and sb["bytes_received"] == 200 * LEN
        assert sa["copied_bytes"] == 0 and sb["copied_bytes"] == 0
        # Every frame was lent from the same transport buffer.
        assert len(addresses) == 1


def test_the_lending_path_copies_what_the_library_does_on_udp_and_the_copying_path_more():
    # UDP puts chunks together into one frame: one copy per frame received,
    # none for a frame written in place; the copying API one more, into the
    # retransmit buffer (README: udp 1 / 2 per hop, from `leap ring`, the
    # Rust lending path). Through the binding the same: it adds no copy.
    # (A chunk that arrives while no receive runs is kept aside and moved
    # once more by the library: a few hundred bytes over the run.)
    n = 200
    a, b = pair("udp", frame_size=LEN)
    with a, b:
        for i in range(n):
            a.send_next_with(LEN, fill_with(i))
            with b.recv_prev() as f:
                assert np.frombuffer(f, np.float32)[7] == i
        lent = a.stats()["copied_bytes"] + b.stats()["copied_bytes"]
        assert 1.0 <= lent / (n * LEN) < 1.05
        src, dst = np.full(LEN // 4, 3.0, np.float32), np.empty(LEN, np.uint8)
        for _ in range(n):
            a.send_next(src)
            assert b.recv_prev_into(dst) == (LEN, leap.FrameKind.DATA)
        copying = a.stats()["copied_bytes"] + b.stats()["copied_bytes"] - lent
        assert 2.0 <= copying / (n * LEN) < 2.05
        assert np.array_equal(dst.view(np.float32), src)


def test_with_release_and_collection_each_give_the_frame_back(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        for _ in range(3):
            a.send_next(bytes(LEN))
        with b.recv_prev() as f:
            assert not f.released
        assert f.released
        g = b.recv_prev()
        g.release()
        assert g.released
        h = b.recv_prev()
        del h  # collected: given back
        a.send_next(bytes(LEN))
        assert len(b.recv_prev()) == LEN  # so the transport lends again


def test_a_frame_is_given_back_exactly_once_whatever_the_caller_does(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        a.send_next(np.full(LEN // 4, 1.0, np.float32))
        a.send_next(np.full(LEN // 4, 2.0, np.float32))
        first = b.recv_prev()
        first.release()
        first.release()  # a second release does nothing
        second = b.recv_prev()
        # Releasing or collecting the first again must not give back the
        # second, which is lent now.
        first.release()
        with first:
            pass
        del first
        gc.collect()
        assert not second.released
        assert np.frombuffer(second, np.float32)[0] == 2.0
        with pytest.raises(leap.FrameLent):
            b.recv_prev()
        second.release()


def test_release_under_a_live_numpy_view_raises_and_keeps_the_memory(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        a.send_next(np.full(LEN // 4, 5.0, np.float32))
        f = b.recv_prev()
        x = np.frombuffer(f, np.float32)
        with pytest.raises(BufferError, match="alive"):
            f.release()
        with pytest.raises(BufferError):
            f.__exit__(None, None, None)
        assert not f.released and x.sum() == 5.0 * (LEN // 4)  # still valid
        with pytest.raises(leap.FrameLent):
            b.recv_prev()
        del x
        f.release()
        with pytest.raises(ValueError, match="released"):
            memoryview(f)
        with pytest.raises(ValueError, match="released"):
            bytes(f)


def test_a_frame_whose_views_outlive_its_with_block_goes_back_when_collected(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        a.send_next(bytes(LEN))
        a.send_next(bytes(LEN))
        x = None
        with pytest.raises(BufferError):
            with b.recv_prev() as f:
                x = np.frombuffer(f, np.uint8)
        del f, x  # the view goes, then the frame: collected, given back
        gc.collect()
        with b.recv_prev() as g:
            assert len(g) == LEN


def test_a_lent_frame_is_read_only():
    a, b = pair("udp", frame_size=LEN)
    with a, b:
        a.send_next(bytes(LEN))
        with b.recv_prev() as f:
            x = np.frombuffer(f, np.uint8)
            with pytest.raises(ValueError):
                x[0] = 1
            del x
            with pytest.raises(BufferError, match="read-only"):
                b.recv_prev_into(f)
            m = memoryview(f)
            assert m.readonly and m.nbytes == LEN
            with pytest.raises(TypeError):
                m[0] = 1
            m.release()


def test_close_while_a_frame_is_lent_waits_for_the_frame(kind):
    a, b = pair(kind, frame_size=LEN)
    a.send_next(np.full(LEN // 4, 9.0, np.float32))
    f = b.recv_prev()
    b.close()
    assert b.closed and not f.released
    assert np.frombuffer(f, np.float32)[-1] == 9.0  # memory still there
    with pytest.raises(leap.Closed):
        b.recv_prev()
    f.release()
    a.close()


def test_any_contiguous_buffer_is_sent_as_it_is(kind):
    a, b = pair(kind, frame_size=64)
    with a, b:
        payload = bytes(range(64))
        for buf in (payload, bytearray(payload), memoryview(payload), np.frombuffer(payload, np.uint8).copy(),
                    np.frombuffer(payload, np.float32).copy()):
            a.send_next(buf)
            with b.recv_prev() as f:
                assert bytes(f) == payload
        a.send_multipart_next(payload[:8], memoryview(payload)[8:])
        with b.recv_prev() as f:
            assert bytes(f) == payload
        with pytest.raises(BufferError, match="ascontiguousarray"):
            a.send_next(np.zeros((16, 16), np.float32)[:, ::2])
        with pytest.raises(TypeError, match="buffer"):
            a.send_next(42)


def test_recv_prev_into_writes_into_a_writable_buffer(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        a.send_next(np.full(LEN // 4, 4.0, np.float32))
        out = np.zeros(LEN // 4, np.float32)
        assert b.recv_prev_into(out) == (LEN, leap.FrameKind.DATA)
        assert (out == 4.0).all()
        with pytest.raises(BufferError, match="writable"):
            b.recv_prev_into(bytes(LEN))


def test_fill_writes_the_frame_in_place_and_raises_for_a_view_kept_past_it():
    a, b = pair("udp", frame_size=LEN)
    with a, b:
        kept = []

        def fill(out):
            assert len(out) == LEN
            x = np.frombuffer(out, np.float32)
            x[:] = 6.0
            kept.append((out, x))  # a view that outlives fill: refused

        with pytest.raises(BufferError, match="outlived fill"):
            a.send_next_with(LEN, fill)
        with b.recv_prev() as f:  # the frame was sent all the same
            assert np.frombuffer(f, np.float32)[3] == 6.0
        with pytest.raises(BufferError, match="gone"):
            memoryview(kept[0][0])  # no new views after fill


def test_fill_may_not_call_the_transport_and_its_exception_propagates():
    a, b = pair("udp", frame_size=LEN)
    with a, b:
        def calls_back(out):
            memoryview(out)[:] = bytes(LEN)
            a.stats()

        with pytest.raises(leap.Error, match="inside send_next_with"):
            a.send_next_with(LEN, calls_back)

        def fails(out):
            memoryview(out)[:] = bytes(LEN)
            raise KeyError("compute failed")

        with pytest.raises(KeyError):
            a.send_next_with(LEN, fails)
        for _ in range(2):  # both frames were sent as fill left them
            with b.recv_prev() as f:
                assert bytes(f) == bytes(LEN)


def test_control_messages_travel_padded_and_decode(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        chain = leap.Control(leap.ControlType.RESIZE_CHAIN, worker_index=1, ranges=[(0, 4, False), (4, 8, True)])
        a.send_control(chain)
        a.send_control({"kind": leap.ControlType.RESIZE_LAYERS, "split_layer": 2, "end_layer": 5, "is_tail": True})
        with b.recv_prev() as f:
            assert f.kind == leap.FrameKind.CONTROL and len(f) == LEN
            assert f.control() == chain and f.control().total_workers == 2
            assert leap.Control.decode(f) == chain
        with b.recv_prev() as f:
            c = f.control()
            assert (c.kind, c.split_layer, c.end_layer, c.is_tail) == (leap.ControlType.RESIZE_LAYERS, 2, 5, True)
        frame = chain.encode(LEN)
        assert len(frame) == LEN and leap.Control.decode(frame) == chain
        assert chain.to_dict()["ranges"] == [(0, 4, False), (4, 8, True)]


def test_the_with_form_sends_at_the_end_of_the_block_and_nothing_on_an_exception(kind):
    a, b = pair(kind, frame_size=LEN, recv_timeout_ms=300)
    with a, b:
        with a.send_next_with(LEN) as out:
            np.frombuffer(out, np.float32)[:] = 8.0
        with b.recv_prev() as f:
            assert np.frombuffer(f, np.float32)[11] == 8.0
        with pytest.raises(KeyError):
            with a.send_next_with(LEN) as out:
                memoryview(out)[:] = bytes(LEN)
                raise KeyError("compute failed")
        with pytest.raises(leap.Timeout):  # nothing was sent
            b.recv_prev()
        a.send_next(np.full(LEN // 4, 1.5, np.float32))  # and the transport goes on
        with b.recv_prev() as f:
            assert np.frombuffer(f, np.float32)[0] == 1.5
        if kind == "tcp":
            assert a.stats()["copied_bytes"] == 0


def test_the_with_form_commits_only_once_no_view_is_alive(kind):
    a, b = pair(kind, frame_size=LEN, recv_timeout_ms=300)
    with a, b:
        x = None
        with pytest.raises(BufferError, match="delete them, then commit"):
            with a.send_next_with(LEN) as out:
                x = np.frombuffer(out, np.float32)
                x[:] = 2.5
        with pytest.raises(leap.FrameLent, match="not sent yet"):
            a.send_next(b"x")
        x[0] = 3.5  # still the transport's memory, still valid
        del x
        out.commit()
        with pytest.raises(ValueError, match="already sent"):
            out.commit()
        with pytest.raises(BufferError, match="gone"):
            memoryview(out)
        with b.recv_prev() as f:
            y = np.frombuffer(f, np.float32)
            assert y[0] == 3.5 and y[1] == 2.5
            del y
        # Begun and collected without a commit: nothing sent, usable again.
        out = a.send_next_with(LEN)
        del out
        gc.collect()
        with pytest.raises(leap.Timeout):
            b.recv_prev()
        a.send_next(bytes(LEN))
        assert len(b.recv_prev()) == LEN


def test_relay_passes_data_frames_on_unchanged_and_returns_control_messages(kind):
    a, b = pair(kind, frame_size=LEN)
    with a, b:
        for i in range(50):
            a.send_next_with(LEN, fill_with(i))
            assert b.relay() is None                      # passed on to a
            with a.recv_prev() as f:
                x = np.frombuffer(f, np.float32)
                assert f.kind == leap.FrameKind.DATA and len(f) == LEN and (x == i).all()
                del x
        lent = b.stats()["copied_bytes"]
        a.send_control(leap.Control(leap.ControlType.RESIZE_LAYERS, split_layer=4, end_layer=8))
        msg = b.relay()                                   # not passed on
        assert isinstance(msg, leap.Control) and (msg.split_layer, msg.end_layer) == (4, 8)
        b.send_control(msg)
        with a.recv_prev() as f:
            assert f.kind == leap.FrameKind.CONTROL and f.control().end_layer == 8
        # The relay's one copy is its own (as `leap ring`'s workers'): the
        # library counts none beyond what its receive does.
        if kind == "tcp":
            assert lent == 0

