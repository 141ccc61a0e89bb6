//! The `leap` binary's handling of bad input: one line, non-zero exit.

use std::process::Command;

fn leap(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leap")).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(args: &[&str], needle: &str) {
    let (code, _, err) = leap(args);
    assert_ne!(code, 0, "{args:?} succeeded");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?} printed: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
}

#[test]
fn bad_ring_arguments_fail_with_one_line() {
    assert_one_line_error(&["ring", "--transport", "udp", "--frame-size", "0"], "--frame-size 0");
    assert_one_line_error(&["ring", "--transport", "udp", "--nodes", "0"], "--nodes 0");
    assert_one_line_error(&["ring", "--transport", "carrier-pigeon"], "carrier-pigeon");
    assert_one_line_error(&["ring", "--transport", "udp", "--frames", "x"], "--frames");
    assert_one_line_error(&["node", "--transport", "udp", "--listen", "1.2.3", "--next", "127.0.0.1:1"], "1.2.3");
    assert_one_line_error(
        &["ring", "--transport", "udp", "--loopback", "--cpus", "100000"],
        "CPU 100000 is not available",
    );
    assert_one_line_error(
        &["bench", "--quick", "--loopback", "--cpus", "100000", "--out", "/tmp/leap-cli-test"],
        "CPU 100000",
    );
}

#[test]
fn pinned_ring_delivers_every_frame() {
    let (code, out, err) =
        leap(&["ring", "--transport", "udp", "--nodes", "3", "--frames", "50", "--loopback", "--cpus", "0", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["frames_delivered"], 50, "{v}");
}

#[test]
fn ring_json_is_the_last_line() {
    let (code, out, err) =
        leap(&["ring", "--transport", "udp", "--nodes", "2", "--frames", "50", "--loopback", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    for k in ["transport", "nodes", "frame_size", "frames_sent", "frames_delivered", "frames_corrupt", "frames_lost"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    for k in ["p50", "p90", "p99", "max"] {
        assert!(v["rtt_us"].get(k).is_some(), "missing rtt_us.{k}");
    }
    assert_eq!(v["frames_delivered"], 50);
    assert!(v["round_trips_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["gbit_per_s"].as_f64().unwrap() > 0.0);
}
