//! A node's operator surfaces under abuse: `/metrics` and the stats socket
//! stay answering, small and prompt to stop while clients hold idle
//! connections, send endless request lines or garbage; the stats socket
//! never replaces a file that is not a socket and is private to its user;
//! `leap stats` bounds what it reads. Loopback only, no privileges.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{Reaper, terminate, wait_bounded};

fn leap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leap"))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leap-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Two free UDP ports and a free TCP port on 127.0.0.1.
fn ports() -> (u16, u16, u16) {
    let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let t = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port(), t.local_addr().unwrap().port())
}

/// Runs `cmd` at most `limit`, then kills it (and fails the test).
fn output_bounded(mut cmd: Command, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let mut c = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let _reaper = Reaper(vec![c.id()]);
    wait_bounded(&mut c, limit);
    (c.wait_with_output().unwrap(), start.elapsed())
}

fn worker(listen: u16, next: u16, extra: &[&str]) -> Child {
    let mut cmd = leap();
    cmd.args(["node", "--transport", "udp", "--role", "worker"])
        .args(["--listen", &format!("127.0.0.1:{listen}"), "--next", &format!("127.0.0.1:{next}")])
        .args(extra)
        .stdout(Stdio::null());
    cmd.spawn().unwrap()
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for_tcp(addr: SocketAddr) {
    let start = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `/proc/PID/status` field, in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// One HTTP exchange with a read deadline; the status line and the body.
fn http(addr: SocketAddr, request: &[u8]) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.set_write_timeout(Some(Duration::from_secs(3)))?;
    s.write_all(request)?;
    let mut reply = Vec::new();
    s.take(16 << 20).read_to_end(&mut reply)?;
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or(std::io::ErrorKind::InvalidData)?;
    Ok((head.lines().next().unwrap_or_default().to_string(), body.to_string()))
}

/// `GET /metrics`, retried until it answers 200 or `limit` passes; the body
/// and how long it took.
fn scrape_within(addr: SocketAddr, limit: Duration) -> (String, Duration) {
    let start = Instant::now();
    loop {
        if let Ok((status, body)) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            && status.contains(" 200 ")
        {
            return (body, start.elapsed());
        }
        assert!(start.elapsed() < limit, "no answer on /metrics within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `leap stats --json`, retried until it succeeds or `limit` passes.
fn stats_within(sock: &Path, limit: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let mut cmd = leap();
        cmd.args(["stats", "--json", "--socket"]).arg(sock);
        let (out, _) = output_bounded(cmd, Duration::from_secs(15));
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).unwrap();
        }
        assert!(start.elapsed() < limit, "leap stats: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes an endless request line (at most `max` bytes) until the server
/// hangs up; the bytes it took.
fn endless_request_line(addr: SocketAddr, max: usize) -> usize {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = s.write(b"GET /").unwrap();
    while sent < max {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    sent
}

#[test]
fn stats_socket_refuses_a_regular_file_and_leaves_it_alone() {
    let dir = tmpdir("notasocket");
    let file = dir.join("precious.txt");
    std::fs::write(&file, "not a socket\n").unwrap();
    let (a, b, _) = ports();
    let mut cmd = leap();
    cmd.args(["node", "--transport", "udp", "--role", "worker"])
        .args(["--listen", &format!("127.0.0.1:{a}"), "--next", &format!("127.0.0.1:{b}")])
        .arg("--stats-socket")
        .arg(&file);
    let (out, _) = output_bounded(cmd, Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the node started over a regular file");
    assert!(err.contains(&file.display().to_string()) && err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a socket\n");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn stats_socket_is_private_and_a_stale_one_is_replaced() {
    let dir = tmpdir("mode");
    let sock = dir.join("w.sock");
    // A crashed run's socket: bound, then nobody listening.
    drop(UnixListener::bind(&sock).unwrap());
    let (a, b, _) = ports();
    let mut w = worker(a, b, &["--stats-socket", sock.to_str().unwrap()]);
    let _reaper = Reaper(vec![w.id()]);
    let start = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "the node never answered on {}", sock.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "stats socket mode {mode:o}");
    terminate(&w);
    assert!(wait_bounded(&mut w, Duration::from_secs(5)).success());
    assert!(!sock.exists(), "stats socket left behind");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn prometheus_label_values_are_escaped() {
    let tel = leap::telemetry::Telemetry::new("a\"b\\c\nd", "worker", "udp");
    let text = tel.to_prometheus();
    assert!(text.contains(r#"node="a\"b\\c\nd""#), "{text}");
    for line in text.lines() {
        assert!(line.starts_with("# ") || line.starts_with("leap_"), "broken line {line:?} in:\n{text}");
    }
}

#[test]
fn stats_client_stops_reading_an_endless_reply() {
    let dir = tmpdir("endless-reply");
    let sock = dir.join("fake.sock");
    let l = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_write_timeout(Some(Duration::from_secs(15))).unwrap();
        let chunk = vec![b' '; 64 * 1024];
        let mut sent = 0;
        while sent < 64 << 20 {
            match s.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        sent
    });
    let mut cmd = leap();
    cmd.args(["stats", "--json", "--socket"]).arg(&sock);
    let (out, _) = output_bounded(cmd, Duration::from_secs(20));
    let sent = server.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("larger than"), "{err}");
    assert!(sent < 16 << 20, "leap stats read {sent} bytes");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn stats_client_gives_up_on_a_trickling_reply() {
    let dir = tmpdir("slow-reply");
    let sock = dir.join("fake.sock");
    let l = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        // One byte every 200 ms, for at most 30 s.
        for _ in 0..150 {
            if s.write_all(b" ").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let mut cmd = leap();
    cmd.args(["stats", "--json", "--socket"]).arg(&sock);
    let (out, took) = output_bounded(cmd, Duration::from_secs(12));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("within"), "{err}");
    assert!(took < Duration::from_secs(8), "leap stats took {took:?}");
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn node_serves_metrics_and_stats_under_abuse_and_stops_promptly() {
    let dir = tmpdir("abuse");
    let (a, b, m) = ports();
    let sock = dir.join("b.sock");
    let metrics: SocketAddr = format!("127.0.0.1:{m}").parse().unwrap();
    let mut w = worker(b, a, &["--metrics", &metrics.to_string(), "--stats-socket", sock.to_str().unwrap()]);
    let mut head = leap()
        .args(["node", "--transport", "udp", "--role", "head", "--frames", "0"])
        .args(["--listen", &format!("127.0.0.1:{a}"), "--next", &format!("127.0.0.1:{b}")])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _reaper = Reaper(vec![w.id(), head.id()]);
    wait_for(&sock);
    wait_for_tcp(metrics);
    let (body, _) = scrape_within(metrics, Duration::from_secs(5));
    assert!(body.contains("leap_frames_total{"), "{body}");
    let rss0 = status_kb(w.id(), "VmRSS:");
    let frames0 = stats_within(&sock, Duration::from_secs(5))["frames"].as_u64().unwrap();

    // An endless request line: cut off long before 64 MiB, nothing kept.
    let sent = endless_request_line(metrics, 64 << 20);
    assert!(sent < 32 << 20, "the server read {sent} bytes of one request line");
    // Garbage: a clear error or a hang-up, and the server carries on.
    if let Ok((status, _)) = http(metrics, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n") {
        assert!(status.contains(" 400 "), "{status}");
    }
    let (status, _) = http(metrics, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").unwrap();
    assert!(status.contains(" 405 "), "{status}");
    let (status, _) = http(metrics, b"GET /secret HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(status.contains(" 404 "), "{status}");

    // A slow-loris client, one byte a second, is cut off.
    let loris = std::thread::spawn(move || {
        let start = Instant::now();
        let mut s = TcpStream::connect_timeout(&metrics, Duration::from_secs(1)).unwrap();
        for _ in 0..30 {
            if s.write_all(b"G").is_err() {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        start.elapsed()
    });
    // 200 idle connections on each server.
    let mut idle_tcp = Vec::new();
    let mut idle_unix = Vec::new();
    for _ in 0..200 {
        if let Ok(s) = TcpStream::connect_timeout(&metrics, Duration::from_millis(200)) {
            idle_tcp.push(s);
        }
        if let Ok(s) = UnixStream::connect(&sock) {
            idle_unix.push(s);
        }
    }
    // Idle clients make room for a scrape, and are counted.
    let (body, took) = scrape_within(metrics, Duration::from_secs(3));
    eprintln!("GET /metrics answered in {took:?} under {} idle connections", idle_tcp.len());
    let refused = body
        .lines()
        .find(|l| l.starts_with("leap_telemetry_refused_connections_total{") && l.contains("server=\"metrics\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(refused > Some(0), "{body}");
    // The node publishes its counters every 100 ms: give the ring a few
    // publications to show progress.
    let until = Instant::now() + Duration::from_secs(5);
    let frames1 = loop {
        let f = stats_within(&sock, Duration::from_secs(5))["frames"].as_u64().unwrap();
        if f > frames0 || Instant::now() > until {
            break f;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(frames1 > frames0, "the ring stalled: {frames0} -> {frames1} frames");
    let fds = open_fds(w.id());
    assert!(fds < 200, "the node holds {fds} descriptors");
    let rss = status_kb(w.id(), "VmRSS:");
    assert!(rss < rss0 + 32 * 1024, "VmRSS grew from {rss0} kB to {rss} kB");
    let cut = loris.join().unwrap();
    assert!(cut < Duration::from_secs(15), "a slow-loris client kept its connection {cut:?}");

    // SIGTERM with the idle connections still open: out at once.
    let start = Instant::now();
    terminate(&w);
    let s = wait_bounded(&mut w, Duration::from_secs(10));
    assert!(s.success(), "worker exited with {s}");
    assert!(start.elapsed() < Duration::from_secs(3), "SIGTERM took {:?}", start.elapsed());
    drop((idle_tcp, idle_unix));
    terminate(&head);
    let _ = wait_bounded(&mut head, Duration::from_secs(10));
    assert!(!sock.exists(), "stats socket left behind");
    let _ = std::fs::remove_dir_all(dir);
}

/// `leap stats --release-source --json`.
fn release_source(sock: &Path) -> serde_json::Value {
    let mut cmd = leap();
    cmd.args(["stats", "--release-source", "--json", "--socket"]).arg(sock);
    let (out, _) = output_bounded(cmd, Duration::from_secs(15));
    assert!(out.status.success(), "leap stats --release-source: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_operator_releases_the_source_lock_through_the_stats_socket() {
    let dir = tmpdir("release");
    let sock = dir.join("w.sock");
    let (a, b, _) = ports();
    // The worker's next node: a socket that takes what is forwarded.
    let next = std::net::UdpSocket::bind(("127.0.0.1", b)).unwrap();
    let mut w = worker(a, b, &["--stats-socket", sock.to_str().unwrap()]);
    let _reaper = Reaper(vec![w.id()]);
    wait_for(&sock);
    let v = release_source(&sock);
    assert_eq!(v["released"], false, "{v}");
    // A stranger's chunk takes the lock (no previous node is configured).
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut chunk = leap_common::chunk::ChunkHeader::data(0, 0, 1).to_bytes().to_vec();
    chunk.extend_from_slice(&[0xEE; 64]);
    let start = Instant::now();
    let v = loop {
        stranger.send_to(&chunk, ("127.0.0.1", a)).unwrap();
        let v = release_source(&sock);
        if v["released"] == true || start.elapsed() > Duration::from_secs(10) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["source"], stranger.local_addr().unwrap().to_string(), "{v}");
    // Released once: nothing is locked until a source takes it again.
    assert_eq!(release_source(&sock)["released"], false);
    // Counters still come back on a plain query.
    assert!(stats_within(&sock, Duration::from_secs(5))["stats"].is_object());
    drop(next);
    terminate(&w);
    assert!(wait_bounded(&mut w, Duration::from_secs(5)).success());
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes `k` as a key file at `p` (mode 0600), over what was there.
fn write_key(p: &Path, k: &leap::transport::ring_key::RingKey) {
    let tmp = p.with_extension("new");
    std::fs::write(&tmp, k.to_file_text()).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, p).unwrap();
}

/// `leap stats --reload-keys --json`.
fn reload_keys(sock: &Path) -> serde_json::Value {
    let mut cmd = leap();
    cmd.args(["stats", "--reload-keys", "--json", "--socket"]).arg(sock);
    let (out, _) = output_bounded(cmd, Duration::from_secs(15));
    assert!(out.status.success(), "leap stats --reload-keys: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits up to 10 s for `log` to hold `what`; the log.
fn log_shows(log: &Path, what: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no `{what}` in the node's log:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_running_node_reads_its_key_files_again_on_sighup_and_on_request_and_keeps_its_keys_on_a_bad_file() {
    use leap::transport::ring_key::{KeySet, RingKey};
    let dir = tmpdir("reload-keys");
    let (sock, log) = (dir.join("w.sock"), dir.join("w.log"));
    let (cur, prev) = (dir.join("ring.key"), dir.join("previous.key"));
    let (k0, k1, k2) = (RingKey::from_bytes([0; 32]), RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
    write_key(&cur, &k1);
    write_key(&prev, &k0);
    let (a, b, _) = ports();
    let mut cmd = leap();
    cmd.args(["node", "--transport", "udp", "--role", "worker"])
        .args(["--listen", &format!("127.0.0.1:{a}"), "--next", &format!("127.0.0.1:{b}")])
        .args(["--prev", &format!("127.0.0.1:{b}"), "--stats-socket", sock.to_str().unwrap()])
        .args(["--key-file", cur.to_str().unwrap(), "--previous-key-file", prev.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut w = cmd.spawn().unwrap();
    let _reaper = Reaper(vec![w.id()]);
    wait_for(&sock);
    // On request: the same files, the same keys.
    let v = reload_keys(&sock);
    let first = KeySet { previous: Some(k0), ..KeySet::new(k1.clone()) }.describe();
    assert_eq!((&v["reloaded"], v["keys"].as_str()), (&serde_json::json!(true), Some(first.as_str())), "{v}");
    log_shows(&log, &format!("ring key: now {first}"));
    // The operator puts the new key in place, the old one as previous, and
    // sends SIGHUP.
    write_key(&cur, &k2);
    write_key(&prev, &k1);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(w.id() as i32), nix::sys::signal::Signal::SIGHUP);
    let second = KeySet { previous: Some(k1), ..KeySet::new(k2) }.describe();
    log_shows(&log, &format!("SIGHUP: key files read again, now {second}"));
    // An exposed key file: refused with the fix named, the keys in use stay.
    std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(0o644)).unwrap();
    let v = reload_keys(&sock);
    assert_eq!(v["reloaded"], false, "{v}");
    assert!(v["reason"].as_str().unwrap().contains("chmod 600"), "{v}");
    let mut cmd = leap();
    cmd.args(["stats", "--reload-keys", "--socket"]).arg(&sock);
    let (out, _) = output_bounded(cmd, Duration::from_secs(15));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("keys not reloaded"));
    let text = log_shows(&log, "ring key: reload refused, the keys in use stay");
    assert_eq!(text.matches("reload refused").count(), 2, "one line per refused reload:\n{text}");
    assert!(w.try_wait().unwrap().is_none(), "the node still runs");
    terminate(&w);
    assert!(wait_bounded(&mut w, Duration::from_secs(5)).success());
    let _ = std::fs::remove_dir_all(dir);
}

/// Three `leap node` processes in a keyed udp ring on loopback change their
/// key while the head moves frames, each by `SIGHUP` after its key files
/// were rewritten: K1 -> K2 + previous K1 -> K2 (the previous key file
/// then holds K2 as well). The head's report: every frame back intact,
/// none lost.
#[test]
fn a_ring_of_leap_nodes_changes_keys_by_sighup_while_moving_frames() {
    use leap::transport::ring_key::RingKey;
    let dir = tmpdir("rotate-ring");
    let (k1, k2) = (RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
    let ports: Vec<u16> = {
        let socks: Vec<_> = (0..3).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        socks.iter().map(|s| s.local_addr().unwrap().port()).collect()
    };
    let at = |i: usize| format!("127.0.0.1:{}", ports[i % 3]);
    let files = |i: usize| {
        (dir.join(format!("n{i}.key")), dir.join(format!("n{i}.previous.key")), dir.join(format!("n{i}.log")))
    };
    let mut nodes: Vec<Child> = Vec::new();
    // Workers first, the head last.
    for i in [1, 2, 0] {
        let (cur, prev, log) = files(i);
        write_key(&cur, &k1);
        write_key(&prev, &k1);
        let mut cmd = leap();
        cmd.args(["node", "--transport", "udp", "--role", if i == 0 { "head" } else { "worker" }])
            .args(["--listen", &at(i), "--next", &at(i + 1), "--prev", &at(i + 2)])
            .args(["--key-file", cur.to_str().unwrap(), "--previous-key-file", prev.to_str().unwrap()])
            .args(["--frames", "0", "--json"])
            .env("RUST_LOG", "info")
            .stdout(if i == 0 { Stdio::piped() } else { Stdio::null() })
            .stderr(std::fs::File::create(&log).unwrap());
        nodes.push(cmd.spawn().unwrap());
    }
    let _reaper = Reaper(nodes.iter().map(Child::id).collect());
    let pid = |i: usize| nix::unistd::Pid::from_raw(nodes[[2, 0, 1][i]].id() as i32);
    let hup = |i: usize| nix::sys::signal::kill(pid(i), nix::sys::signal::Signal::SIGHUP).unwrap();
    log_shows(&files(0).2, "is a leap node");
    std::thread::sleep(Duration::from_millis(500));
    for (cur_key, prev_key) in [(&k2, &k1), (&k2, &k2)] {
        for i in 0..3 {
            let (cur, prev, log) = files(i);
            write_key(&cur, cur_key);
            write_key(&prev, prev_key);
            let before = std::fs::read_to_string(&log).unwrap().matches("SIGHUP: key files read again").count();
            hup(i);
            let start = Instant::now();
            while std::fs::read_to_string(&log).unwrap().matches("SIGHUP: key files read again").count() == before {
                assert!(start.elapsed() < Duration::from_secs(10), "node {i} did not reload");
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(400));
        }
    }
    std::thread::sleep(Duration::from_millis(400));
    let mut head = nodes.pop().unwrap();
    terminate(&head);
    assert!(wait_bounded(&mut head, Duration::from_secs(15)).success());
    let mut out = String::new();
    head.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or("{}")).unwrap();
    let sent = v["frames_sent"].as_u64().unwrap();
    assert!(sent > 100, "frames moved all along: {v}");
    assert_eq!(
        (v["frames_delivered"].as_u64(), v["frames_corrupt"].as_u64(), v["frames_lost"].as_u64()),
        (Some(sent), Some(0), Some(0)),
        "{v}"
    );
    assert!(v["stats"]["drops"]["bad_tag"].as_u64().unwrap() <= 2, "{v}");
    for mut n in nodes {
        terminate(&n);
        assert!(wait_bounded(&mut n, Duration::from_secs(5)).success());
    }
    for i in 0..3 {
        let text = std::fs::read_to_string(files(i).2).unwrap();
        assert!(text.contains("the previous key was"), "node {i} said nothing of its previous key:\n{text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
