//! The `leap` binary's command line: errors in the arguments (clap's whole
//! message, exit 2) and errors found later (one line, exit 1).

use std::process::Command;

fn leap(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leap")).args(args).env_remove("RUST_LOG").output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(args: &[&str], needle: &str) {
    let (code, _, err) = leap(args);
    assert_eq!(code, 1, "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?} printed: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
}

#[test]
fn bad_ring_arguments_fail_with_one_line() {
    assert_one_line_error(&["ring", "--transport", "udp", "--frame-size", "0"], "--frame-size 0");
    assert_one_line_error(&["ring", "--transport", "udp", "--nodes", "0"], "--nodes 0");
    assert_one_line_error(
        &["ring", "--transport", "udp", "--loopback", "--cpus", "100000"],
        "CPU 100000 is not available",
    );
    assert_one_line_error(
        &["bench", "--quick", "--loopback", "--cpus", "100000", "--out", "/tmp/leap-cli-test"],
        "CPU 100000",
    );
}

/// A usage error: clap's whole message on stderr, every `needles` in it,
/// nothing on stdout, exit 2.
fn assert_usage_error(args: &[&str], needles: &[&str]) {
    let (code, out, err) = leap(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert!(out.is_empty(), "{args:?} printed on stdout: {out}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: no `{n}` in: {err}");
    }
    assert!(err.contains("--help"), "{args:?}: {err}");
}

#[test]
fn a_missing_argument_is_named() {
    assert_usage_error(
        &["ring", "--nodes", "3"],
        &["the following required arguments were not provided:", "--transport <TRANSPORT>", "Usage: leap ring"],
    );
    assert_usage_error(&["node", "--transport", "udp"], &["--listen <ADDR:PORT>", "--next <ADDR:PORT>"]);
}

#[test]
fn an_invalid_value_lists_the_possible_ones() {
    assert_usage_error(
        &["ring", "--transport", "udpp"],
        &["invalid value 'udpp' for '--transport <TRANSPORT>'", "[possible values: tcp, udp, xdp, xdp-ringbuf, kmod]"],
    );
    assert_usage_error(&["ring", "--transport", "udpp"], &["a similar value exists: 'udp'"]);
    assert_usage_error(&["ring", "--transport", "carrier-pigeon"], &["carrier-pigeon", "possible values"]);
    assert_usage_error(
        &["node", "--transport", "udp", "--listen", "1.2.3", "--next", "127.0.0.1:1"],
        &["invalid value '1.2.3' for '--listen <ADDR:PORT>'", "invalid socket address"],
    );
}

#[test]
fn an_unknown_argument_gets_a_suggestion() {
    assert_usage_error(
        &["ring", "--transprt", "udp"],
        &["unexpected argument '--transprt'", "a similar argument exists: '--transport'", "Usage: leap ring"],
    );
    assert_usage_error(&["rnig"], &["unrecognized subcommand 'rnig'", "a similar subcommand exists: 'ring'"]);
}

#[test]
fn a_bad_number_says_why() {
    assert_usage_error(
        &["ring", "--transport", "udp", "--frames", "x"],
        &["invalid value 'x' for '--frames <FRAMES>'", "invalid digit"],
    );
    assert_usage_error(&["node", "--xdp-vlan", "5000"], &["invalid value '5000' for '--xdp-vlan <ID>'", "0..=4095"]);
}

#[test]
fn help_and_version_go_to_stdout() {
    for args in [&["--help"][..], &["ring", "--help"], &["--version"], &["node", "-h"]] {
        let (code, out, err) = leap(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
        assert!(out.contains("Usage: leap") || out.starts_with("leap "), "{args:?}: {out}");
    }
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
