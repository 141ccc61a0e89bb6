"""Keyed rings from Python: the node file's key_file, previous_key_file
and encrypt keys, through leap.open like every other setting, and a key
rotation while the ring runs (Transport.key_control)."""

import os
import threading
import time

import numpy as np
import pytest

import leap
from conftest import free_port, loopback, pair

LEN = leap.frame_len(4096)


def new_key(tmp_path, name: str) -> str:
    path = tmp_path / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (os.urandom(32).hex() + "\n").encode())
    os.close(fd)
    return str(path)


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_keyed_pair_moves_frames_intact(tmp_path, encrypt):
    key = new_key(tmp_path, "ring.key")
    a, b = pair("tcp", frame_size=LEN, key_file=key, encrypt=encrypt)
    with a, b:
        dst = np.empty(LEN, np.uint8)
        for step in range(5):
            src = np.arange(LEN // 4, dtype=np.float32) + step
            a.send_next(src)
            assert b.recv_prev_into(dst) == (LEN, leap.FrameKind.DATA)
            assert np.array_equal(dst.view(np.float32), src)
        assert b.stats()["drops"]["bad_tag"] == 0


def test_nodes_with_different_keys_get_no_ring(tmp_path):
    a, b = loopback(free_port()), loopback(free_port())
    keys = new_key(tmp_path, "a.key"), new_key(tmp_path, "b.key")
    errors: list[BaseException] = []

    def open_b():
        try:
            leap.open("tcp", listen=b, next=a, frame_size=LEN, key_file=keys[1], setup_timeout_s=3)
        except leap.Error as e:
            errors.append(e)

    th = threading.Thread(target=open_b)
    th.start()
    try:
        with pytest.raises(leap.Error) as e:
            leap.open("tcp", listen=a, next=b, frame_size=LEN, key_file=keys[0], setup_timeout_s=3)
    finally:
        th.join(30)
    assert len(errors) == 1, "the other node was refused too"
    assert "another ring key" in str(e.value) or "timed out" in str(e.value).lower(), str(e.value)


def test_a_key_on_the_kernel_module_transport_is_refused(tmp_path):
    key = new_key(tmp_path, "ring.key")
    with pytest.raises(leap.Error) as e:
        leap.open("kmod", listen=("127.0.0.1", 1), next=("127.0.0.1", 2), key_file=key)
    assert "key_file" in str(e.value) and "tcp" in str(e.value)


def test_an_exposed_key_file_names_the_fix(tmp_path):
    path = tmp_path / "open.key"
    path.write_text(os.urandom(32).hex())
    path.chmod(0o644)
    with pytest.raises(leap.ConfigError) as e:
        leap.open("tcp", listen=("127.0.0.1", 1), next=("127.0.0.1", 2), key_file=str(path))
    assert e.value.key == "key_file" and "chmod 600" in str(e.value)


def one_frame(src: leap.Transport, dst: leap.Transport, value: int) -> None:
    frame = np.full(LEN, value, np.uint8)
    src.send_next(frame)
    with dst.recv_prev() as got:
        assert np.array_equal(np.frombuffer(got, np.uint8), frame)


@pytest.mark.parametrize("kind", ["udp", "tcp"])
def test_a_running_pair_changes_keys_without_losing_a_frame(tmp_path, kind):
    k1, k2 = new_key(tmp_path, "k1.key"), new_key(tmp_path, "k2.key")
    a, b = pair(kind, frame_size=LEN, key_file=k1)
    with a, b:
        ka, kb = a.key_control(), b.key_control()
        n = 0
        for n in range(3):
            one_frame(a, b, n)
        # a moves first (it keeps sealing with K1 towards b, not yet heard
        # under K2); b's change is made by another thread while a receive
        # waits on this one.
        assert "previous" in ka.set(k2, k1)
        for n in range(3, 6):
            one_frame(a, b, n)
        done: list[str] = []

        def rotate_then_send():
            time.sleep(0.05)
            done.append(kb.set(k2, previous_key_file=k1))
            a.send_next(np.full(LEN, 0x5A, np.uint8))

        th = threading.Thread(target=rotate_then_send)
        th.start()
        with b.recv_prev() as got:
            assert np.frombuffer(got, np.uint8)[0] == 0x5A
        th.join(10)
        assert done and "previous" in done[0]
        for n in range(6, 10):
            one_frame(a, b, n)
            one_frame(b, a, n)
        ka.set(k2)
        kb.set(k2)
        for n in range(10, 14):
            one_frame(a, b, n)
            one_frame(b, a, n)
        # The keys really changed: b back on K1 alone refuses a's K2
        # datagrams (tcp: the connection keeps the key it proved).
        kb.set(k1)
        b.set_recv_timeout(0.3)
        a.send_next(np.full(LEN, 0x77, np.uint8))
        if kind == "tcp":
            with b.recv_prev() as got:
                assert np.frombuffer(got, np.uint8)[0] == 0x77
        else:
            with pytest.raises(leap.Timeout):
                b.recv_prev()
            assert b.stats()["drops"]["bad_tag"] > 0


def test_key_control_errors_name_the_file_and_keep_the_keys(tmp_path):
    k1 = new_key(tmp_path, "k1.key")
    bad = tmp_path / "bad.key"
    fd = os.open(bad, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"not a key\n")
    os.close(fd)
    exposed = tmp_path / "exposed.key"
    exposed.write_text(os.urandom(32).hex())
    exposed.chmod(0o644)
    u, v = pair("udp", frame_size=LEN)
    with u, v:
        with pytest.raises(leap.ConfigError) as e:
            u.key_control()
        assert e.value.key == "key_file" and "without a ring key" in str(e.value)
    a, b = pair("udp", frame_size=LEN, key_file=k1)
    with a, b:
        k = a.key_control()
        with pytest.raises(leap.ConfigError) as e:
            k.set(tmp_path / "missing.key")
        assert e.value.key == "key_file", str(e.value)
        with pytest.raises(leap.ConfigError) as e:
            k.set(bad)
        assert e.value.key == "key_file" and "leap key new" in str(e.value)
        with pytest.raises(leap.ConfigError) as e:
            k.set(k1, exposed)
        assert e.value.key == "previous_key_file" and "chmod 600" in str(e.value)
        one_frame(a, b, 1)
        sender, receiver = a.split()
        with sender, receiver:
            k.set(k1)  # still usable after split
