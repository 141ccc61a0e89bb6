//! The `leap` binary's command line: errors in the arguments (clap's whole
//! message, exit 2), errors found later (one line, exit 1), and `leap node`
//! taking every flag over the node file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leap-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `leap node --check`'s settings: name → (value, source).
fn node_settings(args: &[&str]) -> BTreeMap<String, (String, String)> {
    let mut all = vec!["node", "--check"];
    all.extend(args);
    let (code, out, err) = leap(&all);
    assert_eq!(code, 0, "{all:?}: {err}");
    out.lines()
        .take_while(|l| !l.starts_with("configuration ok"))
        .map(|l| {
            let (rest, source) = l.rsplit_once(" (").unwrap_or_else(|| panic!("not NAME VALUE (SOURCE): {l}"));
            let (name, value) = rest.split_once(' ').unwrap_or_else(|| panic!("not NAME VALUE (SOURCE): {l}"));
            (name.to_owned(), (value.to_owned(), source.trim_end_matches(')').to_owned()))
        })
        .collect()
}

/// CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect()
}

/// A node file that sets every key to something other than its default.
fn full_node_file(dir: &Path, cpu: usize) -> PathBuf {
    let object = dir.join("file.o");
    std::fs::write(&object, b"").unwrap();
    let text = format!(
        r#"[ring]
me = "a"
frame_size = 8192
frames = 5
inflight = 4
compute_us = 100
members = [{{ name = "a", addr = "127.0.0.1:9300" }}, {{ name = "b", addr = "127.0.0.1:9301" }}, {{ name = "c", addr = "127.0.0.1:9302" }}]

[transport]
order = ["tcp"]
interface = "lo"
xdp_mode = "skb"
xdp_object = "{}"
queues = [0]
vlans = [5]
reliability = "best-effort"
crc = false
trains = false
recv_timeout_ms = 500
setup_timeout_s = 5
window = 32
keep_frames = 64
window_memory_mib = 64
busy_poll_us = 50
tcp_source_port = 7101
tcp_prev_port = 7102

[node]
log = "info"
on_neighbour_loss = "exit"
metrics = "127.0.0.1:9464"
stats_socket = "/run/leap/file.sock"
cpus = [{cpu}]
"#,
        object.display()
    );
    let f = dir.join("full.toml");
    std::fs::write(&f, text).unwrap();
    f
}

#[test]
fn node_check_lists_every_setting_from_the_file() {
    let dir = tmpdir("file");
    let cpu = allowed_cpus()[0];
    let f = full_node_file(&dir, cpu);
    let f = f.to_str().unwrap();
    let s = node_settings(&["--config", f]);
    let object = dir.join("file.o");
    let expect = [
        ("transport", "tcp"),
        ("listen", "127.0.0.1:9300"),
        ("next", "127.0.0.1:9301"),
        ("prev", "127.0.0.1:9302"),
        ("iface", "lo"),
        ("role", "head"),
        ("frame-size", "8192"),
        ("frames", "5"),
        ("inflight", "4"),
        ("compute-us", "100"),
        ("on-neighbour-loss", "exit"),
        ("metrics", "127.0.0.1:9464"),
        ("stats-socket", "/run/leap/file.sock"),
        ("log", "info"),
        ("timeout-ms", "500"),
        ("setup-timeout-s", "5"),
        ("tcp-source-port", "7101"),
        ("tcp-prev-port", "7102"),
        ("xdp-object", object.to_str().unwrap()),
        ("xdp-mode", "skb"),
        ("xdp-queues", "0"),
        ("xdp-vlan", "5"),
        ("reliability", "best-effort"),
        ("no-crc", "true"),
        ("no-trains", "true"),
        ("busy-poll", "50"),
        ("cpus", &cpu.to_string()),
        ("window", "32"),
        ("keep-frames", "64"),
        ("window-memory-mib", "64"),
    ];
    for (name, value) in expect {
        assert_eq!(s.get(name), Some(&(value.to_owned(), "file".to_owned())), "{name}: {s:?}");
    }
    // Only flags set these.
    for (name, value) in [("workers", "0"), ("json", "false"), ("tcp-framing", "raw"), ("spin-us", "0")] {
        assert_eq!(s.get(name), Some(&(value.to_owned(), "default".to_owned())), "{name}: {s:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn node_check_without_a_file_lists_the_defaults() {
    let s = node_settings(&["--transport", "udp", "--listen", "127.0.0.1:9310", "--next", "127.0.0.1:9311"]);
    for (name, value) in [("transport", "udp"), ("listen", "127.0.0.1:9310"), ("next", "127.0.0.1:9311")] {
        assert_eq!(s.get(name), Some(&(value.to_owned(), "flag".to_owned())), "{name}: {s:?}");
    }
    for (name, value) in [
        ("prev", "none"),
        ("role", "worker"),
        ("frame-size", "16392"),
        ("frames", "1000"),
        ("inflight", "1"),
        ("log", "warn"),
        ("timeout-ms", "1000"),
        ("setup-timeout-s", "30"),
        ("xdp-mode", "auto"),
        ("xdp-queues", "all"),
        ("xdp-vlan", "none"),
        ("reliability", "reliable"),
        ("no-crc", "false"),
        ("no-trains", "false"),
        ("busy-poll", "none"),
        ("window", "none"),
        ("window-memory-mib", "256"),
    ] {
        assert_eq!(s.get(name), Some(&(value.to_owned(), "default".to_owned())), "{name}: {s:?}");
    }
}

/// Every flag that has a node-file key, given at its default value where
/// a flag can spell it (else at another value than the file's), wins over
/// the file, which sets every key to something else.
#[test]
fn every_flag_wins_over_the_node_file_even_at_its_default() {
    let dir = tmpdir("flags");
    let cpus = allowed_cpus();
    let f = full_node_file(&dir, cpus[0]);
    let f = f.to_str().unwrap();
    let object = dir.join("flag.o");
    std::fs::write(&object, b"").unwrap();
    let object = object.to_str().unwrap();
    // Another interface than the file's `lo`, if this host has one.
    let iface = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|i| i != "lo")
        .unwrap_or_else(|| "lo".into());
    // Every CPU there is: another list than the file's first one, if there
    // are two.
    let all_cpus = cpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--transport", "udp"], "transport", "udp"),
        (&["--listen", "127.0.0.1:7000"], "listen", "127.0.0.1:7000"),
        (&["--next", "127.0.0.1:7001"], "next", "127.0.0.1:7001"),
        (&["--prev", "127.0.0.1:7002"], "prev", "127.0.0.1:7002"),
        (&["--iface", &iface], "iface", &iface),
        (&["--role", "worker"], "role", "worker"),
        (&["--frame-size", "16392"], "frame-size", "16392"),
        (&["--frames", "1000"], "frames", "1000"),
        (&["--inflight", "1"], "inflight", "1"),
        (&["--compute-us", "0"], "compute-us", "0"),
        (&["--on-neighbour-loss", "wait"], "on-neighbour-loss", "wait"),
        (&["--metrics", "127.0.0.1:9465"], "metrics", "127.0.0.1:9465"),
        (&["--stats-socket", "/run/leap/flag.sock"], "stats-socket", "/run/leap/flag.sock"),
        (&["--log", "warn"], "log", "warn"),
        (&["--timeout-ms", "1000"], "timeout-ms", "1000"),
        (&["--setup-timeout-s", "30"], "setup-timeout-s", "30"),
        (&["--tcp-source-port", "7201"], "tcp-source-port", "7201"),
        (&["--tcp-prev-port", "7202"], "tcp-prev-port", "7202"),
        (&["--xdp-object", object], "xdp-object", object),
        (&["--xdp-mode", "auto"], "xdp-mode", "auto"),
        (&["--xdp-queues", "all"], "xdp-queues", "all"),
        (&["--xdp-vlan", "7"], "xdp-vlan", "7"),
        (&["--reliability", "reliable"], "reliability", "reliable"),
        (&["--no-crc=false"], "no-crc", "false"),
        (&["--no-trains=false"], "no-trains", "false"),
        (&["--busy-poll", "0"], "busy-poll", "none"),
        (&["--cpus", &all_cpus], "cpus", &all_cpus),
        (&["--window", "16"], "window", "16"),
        (&["--keep-frames", "48"], "keep-frames", "48"),
        (&["--window-memory-mib", "256"], "window-memory-mib", "256"),
    ];
    for (flags, name, value) in cases {
        let mut args = vec!["--config", f];
        args.extend(*flags);
        let s = node_settings(&args);
        assert_eq!(s.get(*name), Some(&((*value).to_owned(), "flag".to_owned())), "{flags:?}");
        // The others still come from the file.
        let from_file = s.iter().filter(|(_, (_, src))| src == "file").count();
        assert_eq!(from_file, cases.len() - 1, "{flags:?}: {s:?}");
    }
    // `--log` before the subcommand counts the same.
    let (code, out, err) = leap(&["--log", "warn", "node", "--check", "--config", f]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l == "log warn (flag)"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn keyed_tcp_and_udp_rings_run_tagged_and_encrypted() {
    let d = tmpdir("key");
    let key = d.join("ring.key");
    let _ = std::fs::remove_file(&key);
    let k = key.to_str().unwrap();
    let (code, out, err) = leap(&["key", "new", k]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("new ring key, id "), "{out}");
    assert_one_line_error(&["key", "new", k], "never overwritten");
    let (code, out, err) = leap(&["key", "check", k]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ring key, id "), "{out}");
    for (transport, encrypt) in [("tcp", false), ("tcp", true), ("udp", false), ("udp", true)] {
        let mut args = vec!["ring", "--transport", transport, "--nodes", "3", "--frames", "50", "--loopback"];
        args.extend(["--key-file", k, "--json"]);
        if encrypt {
            args.push("--encrypt");
        }
        let (code, out, err) = leap(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!((v["frames_delivered"].as_u64(), v["frames_corrupt"].as_u64()), (Some(50), Some(0)), "{v}");
    }
    std::fs::write(d.join("open.key"), "00".repeat(32)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.join("open.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_one_line_error(
        &["ring", "--transport", "tcp", "--loopback", "--key-file", d.join("open.key").to_str().unwrap()],
        "chmod 600",
    );
    let _ = std::fs::remove_dir_all(&d);
}
