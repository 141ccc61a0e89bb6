"""Helpers of the Python package's tests: free loopback ports, pairs of
transports that are each other's previous and next node, a UDP relay that
can lose a datagram, and rings of network namespaces (marker `netns`;
marker `xdp` also needs the BPF object in LEAP_XDP_OBJECT).

Tests without a marker run on loopback as any user. As root with CI=true a
missing privilege or object is a failure, never a skip.
"""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import leap

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
IN_CI = os.environ.get("CI") in ("true", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "netns: needs root: network namespaces with veth pairs")
    config.addinivalue_line("markers", "xdp: needs root and the XDP object (LEAP_XDP_OBJECT)")


def need(ok: bool, why: str) -> None:
    """Skips without `ok`, or fails in CI."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{why}, and CI=true forbids skipping")
    pytest.skip(why)


sys.path.insert(0, str(EXAMPLES))
from pipeline import free_port  # noqa: E402  (one picker for the examples and the tests)


def loopback(port: int) -> tuple[str, int]:
    return ("127.0.0.1", port)


def pair(kind: str, **options) -> tuple[leap.Transport, leap.Transport]:
    """Two transports, each the other's next and previous node (TCP opens
    both at once: each connects while it accepts)."""
    a, b = loopback(free_port()), loopback(free_port())
    options.setdefault("recv_timeout_ms", 2000)
    options.setdefault("setup_timeout_s", 10)
    got: dict[str, object] = {}

    def open_b():
        try:
            got["b"] = leap.open(kind, listen=b, next=a, prev=a, **options)
        except BaseException as e:
            got["b"] = e

    th = threading.Thread(target=open_b)
    th.start()
    ta = leap.open(kind, listen=a, next=b, prev=b, **options)
    th.join(30)
    tb = got.get("b")
    if not isinstance(tb, leap.Transport):
        ta.close()
        raise RuntimeError(f"opening the second transport failed: {tb!r}")
    return ta, tb


@pytest.fixture(params=["tcp", "udp"])
def kind(request) -> str:
    return request.param


class Relay:
    """A UDP relay between a sender A and a receiver B on loopback: what A
    sends to the relay goes to B, what B sends to it goes to A. `drop`
    decides, per datagram from A, whether it is lost."""

    def __init__(self, a_port: int, b_port: int, drop):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.a, self.b, self.drop = loopback(a_port), loopback(b_port), drop
        self.dropped = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        deadline = time.monotonic() + 60  # bounded whatever the test does
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                data, src = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            if src == self.a:
                if self.drop(data):
                    self.dropped += 1
                    continue
                self.sock.sendto(data, self.b)
            elif src == self.b:
                self.sock.sendto(data, self.a)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def run_bounded(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """Runs `cmd`, killing it after `timeout` seconds."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)


class NetnsRing:
    """Three namespaces linked in a ring by veth pairs, as leap's own
    `netns::Topology`: node i in `<prefix>n<i>` owns 10.77.0.<i+1>, its
    `<prefix>t<i>` veth leads to node i+1's `<prefix>r<i+1>`. Removed in
    `close()`, also when building it failed half-way."""

    def __init__(self, prefix: str, n: int = 3):
        self.prefix, self.n, self.created = prefix, n, []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def ns(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    def addr(self, i: int) -> str:
        return f"10.77.0.{i + 1}"

    def rx(self, i: int) -> str:
        return f"{self.prefix}r{i}"

    def tx(self, i: int) -> str:
        return f"{self.prefix}t{i}"

    @staticmethod
    def ip(*args: str) -> None:
        r = run_bounded(["ip", *args], 20)
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def exec(self, i: int, *args: str) -> None:
        self.ip("netns", "exec", self.ns(i), *args)

    def _build(self):
        for i in range(self.n):
            run_bounded(["ip", "netns", "del", self.ns(i)], 20)  # a stale one of a killed run
            self.ip("netns", "add", self.ns(i))
            self.created.append(self.ns(i))
            self.exec(i, "ip", "link", "set", "lo", "up")
            self.exec(i, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0")
            self.exec(i, "sysctl", "-qw", "net.ipv4.conf.default.rp_filter=0")
        for i in range(self.n):
            j = (i + 1) % self.n
            self.ip("link", "add", self.tx(i), "netns", self.ns(i), "type", "veth", "peer", "name", self.rx(j),
                    "netns", self.ns(j))
        for i in range(self.n):
            prev, nxt = (i + self.n - 1) % self.n, (i + 1) % self.n
            self.exec(i, "ip", "addr", "add", f"{self.addr(i)}/32", "dev", self.rx(i))
            for dev in (self.rx(i), self.tx(i)):
                self.exec(i, "ip", "link", "set", dev, "up")
                self.exec(i, "sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0")
            self.exec(i, "ip", "route", "add", f"{self.addr(nxt)}/32", "dev", self.tx(i))
            self.exec(i, "ip", "route", "add", f"{self.addr(prev)}/32", "dev", self.rx(i))

    def close(self):
        # Deleting a namespace deletes its veths (and their XDP programs).
        for ns in reversed(self.created):
            run_bounded(["ip", "netns", "del", ns], 20)
        self.created.clear()


@pytest.fixture
def netns_ring():
    need(os.geteuid() == 0, "network namespaces need root")
    ring = NetnsRing(f"lpy{os.getpid() % 10000}")
    try:
        yield ring
    finally:
        ring.close()


def python() -> str:
    return sys.executable
