//! What a running node shows operators: its counters, the backend's (XDP
//! program, kernel module) and a latency histogram, as JSON over a Unix
//! socket (`leap stats`) and as Prometheus text over HTTP (`--metrics`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::transport::{Stats, Transport};

/// Upper bounds of the latency buckets, microseconds.
pub const BUCKETS_US: [f64; 14] = [5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4, 5e4, 1e5, 1e6];

/// A fixed-bucket latency histogram, updated without locks.
#[derive(Debug)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }
}

impl Histogram {
    /// Records one latency.
    pub fn record(&self, d: Duration) {
        let us = d.as_secs_f64() * 1e6;
        let i = BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(BUCKETS_US.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> (Vec<u64>, u64) {
        (self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(), self.sum_ns.load(Ordering::Relaxed))
    }
}

/// The latest published state of a node.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    stats: Stats,
    backend: Option<Value>,
    frames: u64,
    published: Option<SystemTime>,
}

/// Shared between the node's loop (which publishes) and the servers.
#[derive(Debug)]
pub struct Telemetry {
    node: String,
    role: String,
    transport: String,
    started: Instant,
    snap: Mutex<Snapshot>,
    last_publish: Mutex<Option<Instant>>,
    /// Head: round trips; worker: receive-to-forwarded time per frame.
    pub latency: Histogram,
}

impl Telemetry {
    /// Telemetry of node `node` in `role` over `transport`.
    pub fn new(node: &str, role: &str, transport: &str) -> Self {
        Self {
            node: node.into(),
            role: role.into(),
            transport: transport.into(),
            started: Instant::now(),
            snap: Mutex::new(Snapshot::default()),
            last_publish: Mutex::new(None),
            latency: Histogram::default(),
        }
    }

    /// Takes the transport's counters, at most every 100 ms unless `force`.
    pub fn publish(&self, t: &dyn Transport, frames: u64, force: bool) {
        {
            let mut last = self.last_publish.lock().unwrap_or_else(|p| p.into_inner());
            if !force && last.is_some_and(|l| l.elapsed() < Duration::from_millis(100)) {
                return;
            }
            *last = Some(Instant::now());
        }
        let snap =
            Snapshot { stats: t.stats(), backend: t.backend_counters(), frames, published: Some(SystemTime::now()) };
        *self.snap.lock().unwrap_or_else(|p| p.into_inner()) = snap;
    }

    /// Everything as JSON (what `leap stats --json` prints).
    pub fn to_json(&self) -> Value {
        let s = self.snap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (counts, sum_ns) = self.latency.snapshot();
        json!({
            "node": self.node,
            "role": self.role,
            "transport": self.transport,
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "frames": s.frames,
            "published_unix_s": s.published.and_then(|p| p.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs_f64()),
            "stats": s.stats,
            "backend": s.backend,
            "latency_us": {
                "buckets_le": BUCKETS_US,
                "counts": counts,
                "sum_us": sum_ns as f64 / 1e3,
            },
        })
    }

    /// Prometheus text exposition format.
    pub fn to_prometheus(&self) -> String {
        let j = self.to_json();
        let labels = format!("node=\"{}\",role=\"{}\",transport=\"{}\"", self.node, self.role, self.transport);
        let mut out = String::new();
        let mut metric = |name: &str, help: &str, kind: &str, value: f64, extra: &str| {
            if !out.contains(&format!("# TYPE {name} ")) {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            }
            let sep = if extra.is_empty() { "" } else { "," };
            out.push_str(&format!("{name}{{{labels}{sep}{extra}}} {value}\n"));
        };
        metric(
            "leap_frames_total",
            "Frames handled by this node's loop.",
            "counter",
            j["frames"].as_f64().unwrap_or(0.0),
            "",
        );
        if let Some(stats) = j["stats"].as_object() {
            for (k, v) in stats {
                if let Some(n) = v.as_f64() {
                    metric(&format!("leap_{k}_total"), &format!("Transport counter {k}."), "counter", n, "");
                }
            }
            if let Some(drops) = stats.get("drops").and_then(Value::as_object) {
                for (k, v) in drops {
                    metric(
                        "leap_drops_total",
                        "Datagrams dropped, by reason.",
                        "counter",
                        v.as_f64().unwrap_or(0.0),
                        &format!("reason=\"{k}\""),
                    );
                }
            }
        }
        if let Some(backend) = j["backend"].as_object() {
            for (k, v) in flatten("", backend) {
                metric(
                    "leap_backend_total",
                    "Counters of the XDP program or kernel module.",
                    "counter",
                    v,
                    &format!("counter=\"{k}\""),
                );
            }
        }
        let (counts, sum_ns) = self.latency.snapshot();
        let mut cum = 0;
        let name = "leap_latency_seconds";
        out.push_str(&format!(
            "# HELP {name} Head: round trip; worker: receive to forwarded.\n# TYPE {name} histogram\n"
        ));
        for (i, c) in counts.iter().enumerate() {
            cum += c;
            let le = BUCKETS_US.get(i).map_or("+Inf".to_string(), |b| format!("{}", b / 1e6));
            out.push_str(&format!("{name}_bucket{{{labels},le=\"{le}\"}} {cum}\n"));
        }
        out.push_str(&format!("{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {cum}\n", sum_ns as f64 / 1e9));
        out
    }
}

fn flatten(prefix: &str, o: &serde_json::Map<String, Value>) -> Vec<(String, f64)> {
    let mut v = Vec::new();
    for (k, val) in o {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}_{k}") };
        match val {
            Value::Object(inner) => v.extend(flatten(&key, inner)),
            Value::Number(n) => v.push((key, n.as_f64().unwrap_or(0.0))),
            _ => {}
        }
    }
    v
}

/// Serves `GET /metrics` on `addr` until `stop`; one short connection at a time.
///
/// # Errors
///
/// Binding the address.
pub fn serve_metrics(
    addr: SocketAddr,
    tel: Arc<Telemetry>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let l = TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut line = String::new();
                    let _ = BufReader::new(&mut s).read_line(&mut line);
                    let (status, body) = if line.starts_with("GET /metrics") {
                        ("200 OK", tel.to_prometheus())
                    } else {
                        ("404 Not Found", "try /metrics\n".to_string())
                    };
                    let _ = write!(
                        s,
                        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }))
}

/// Answers every connection on the Unix socket `path` with the JSON
/// counters, until `stop`; removes the socket file when done.
///
/// # Errors
///
/// Binding the socket (e.g. its directory does not exist).
pub fn serve_stats(
    path: &Path,
    tel: Arc<Telemetry>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    if path.exists() && UnixStream::connect(path).is_err() {
        // A stale socket of a crashed run.
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    l.set_nonblocking(true)?;
    let path: PathBuf = path.into();
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.write_all(tel.to_json().to_string().as_bytes());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let _ = std::fs::remove_file(&path);
    }))
}

/// Reads a node's counters from its stats socket.
///
/// # Errors
///
/// Connecting or parsing.
pub fn query_stats(path: &Path) -> std::io::Result<Value> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    serde_json::from_str(&text).map_err(std::io::Error::other)
}
