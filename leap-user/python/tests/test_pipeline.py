"""The 3-stage numpy pipeline of examples/pipeline.py: each stage applies
tanh(x @ W_i) to what it receives, the head checks every frame that comes
back against the same computation done locally; on loopback (threads), in
network namespaces (one process per node) over tcp and udp, and over xdp."""

import json
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, need

sys.path.insert(0, str(EXAMPLES))
import pipeline  # noqa: E402

FRAMES = 300
DIM = 2048


def test_pipeline_on_loopback(kind, capsys):
    pipeline.on_loopback(kind, DIM, FRAMES, {})
    out = capsys.readouterr().out
    assert f"{FRAMES} frames of {pipeline.leap.frame_len(DIM)} bytes through 3 stages over {kind}: every frame" in out


def ring_of_processes(ring, kind: str, options: dict[int, list[str]], frames: int = FRAMES) -> str:
    """Runs stage i of the pipeline in namespace i, the head last; returns
    what the head printed."""
    port = 9000
    procs = []
    try:
        for i in (1, 2, 0):
            cmd = ["ip", "netns", "exec", ring.ns(i), sys.executable, str(EXAMPLES / "pipeline.py"), kind,
                   "--stage", str(i), "--dim", str(DIM), "--frames", str(frames),
                   "--listen", f"{ring.addr(i)}:{port}", "--next", f"{ring.addr((i + 1) % 3)}:{port}",
                   "--prev", f"{ring.addr((i + 2) % 3)}:{port}"]
            for opt in options.get(i, []):
                cmd += ["--opt", opt]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            outs.append((p.returncode, out, err))
        for rc, out, err in outs:
            assert rc == 0, f"a stage failed:\n{out}\n{err}"
        return outs[-1][1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


@pytest.mark.netns
def test_pipeline_in_network_namespaces(kind, netns_ring):
    out = ring_of_processes(netns_ring, kind, {})
    assert f"head: {FRAMES} frames over {kind} checked" in out


@pytest.mark.xdp
def test_pipeline_over_xdp_in_network_namespaces(netns_ring):
    obj = os.environ.get("LEAP_XDP_OBJECT", "")
    need(bool(obj) and os.path.isfile(obj), "LEAP_XDP_OBJECT names no XDP object (cargo xtask build-ebpf)")
    options = {i: [f"interface={netns_ring.rx(i)}", f"xdp_object={obj}"] for i in range(3)}
    out = ring_of_processes(netns_ring, "xdp", options)
    assert f"head: {FRAMES} frames over xdp checked" in out


def test_the_latency_ring_runs_as_three_processes(kind):
    # examples/ring_latency.py, the figure to compare with `leap ring`.
    r = subprocess.run([sys.executable, str(EXAMPLES / "ring_latency.py"), kind, "--frames", "200", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["frames"] == 200 and 0 < out["p50_us"] < 100_000
