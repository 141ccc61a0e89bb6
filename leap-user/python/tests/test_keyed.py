"""Keyed TCP rings from Python: the node file's key_file, previous_key_file
and encrypt keys, through leap.open like every other setting."""

import os
import threading

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
