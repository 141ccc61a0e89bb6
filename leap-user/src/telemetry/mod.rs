//! What a running node shows operators: its counters, the backend's (XDP
//! program, kernel module) and a latency histogram, as JSON over a Unix
//! socket (`leap stats`) and as Prometheus text over HTTP (`--metrics`).
//!
//! Both servers run on a thread of their own (`serve`, feature
//! `telemetry-server`), so a slow or hostile client never holds up the
//! node's frame loop, and every connection is bounded in size, number and
//! time (`Limits`).

mod client;
#[cfg(feature = "telemetry-server")]
mod prometheus;
#[cfg(feature = "telemetry-server")]
pub(crate) mod server;

pub use client::{
    MAX_STATS_REPLY, STATS_TIMEOUT, StatsQueryError, query_stats, query_stats_within, release_source, reload_keys,
};
#[cfg(feature = "telemetry-server")]
pub use server::{Limits, Servers, TelemetryError, serve};

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::transport::{BackendCounters, Stats, Transport};

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

/// The two servers a node may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    /// HTTP `/metrics`.
    Metrics = 0,
    /// The Unix stats socket.
    Stats = 1,
}

impl Server {
    #[cfg(feature = "telemetry-server")]
    const ALL: [Self; 2] = [Self::Metrics, Self::Stats];

    #[cfg(feature = "telemetry-server")]
    fn name(self) -> &'static str {
        match self {
            Self::Metrics => "metrics",
            Self::Stats => "stats",
        }
    }
}

/// The latest published state of a node.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    stats: Stats,
    backend: Option<BackendCounters>,
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
    /// Connections each [`Server`] refused for being over its limit.
    refused: [AtomicU64; 2],
    /// Head: round trips; worker: receive-to-forwarded time per frame.
    pub latency: Histogram,
    /// Releases the transport's source lock (`leap stats --release-source`).
    source: Mutex<Option<crate::transport::SourceControl>>,
    /// Reads the ring key files again (`leap stats --reload-keys`).
    keys: Mutex<Option<KeyReload>>,
}

/// Reads a node's key files again and gives the keys to its transport (the
/// node's `SIGHUP`, the stats socket's `reload-keys`): a line saying which
/// keys it now uses, or why it kept the old ones.
#[derive(Clone)]
pub struct KeyReload(std::sync::Arc<dyn Fn() -> Result<String, String> + Send + Sync>);

impl KeyReload {
    /// The reload `f` does.
    pub fn new(f: impl Fn() -> Result<String, String> + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(f))
    }

    /// Reloads the keys.
    ///
    /// # Errors
    ///
    /// Why the keys in use stay (a key file that cannot be used, an
    /// unkeyed node), as a line naming the fix.
    pub fn reload(&self) -> Result<String, String> {
        (self.0)()
    }
}

impl std::fmt::Debug for KeyReload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyReload")
    }
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
            refused: [AtomicU64::new(0), AtomicU64::new(0)],
            latency: Histogram::default(),
            source: Mutex::new(None),
            keys: Mutex::new(None),
        }
    }

    /// Lets the stats socket release the transport's source lock.
    pub fn set_source_control(&self, c: Option<crate::transport::SourceControl>) {
        *self.source.lock().unwrap_or_else(|p| p.into_inner()) = c;
    }

    /// Releases the transport's source lock (the stats socket's
    /// `release-source` request); the reply, as JSON.
    pub fn release_source(&self) -> Value {
        let c = self.source.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match c {
            None => {
                json!({"released": false, "reason": "this node's transport locks no source (tcp, kmod, or not running)"})
            }
            Some(c) => match c.release() {
                Some(a) => json!({"released": true, "source": a.to_string()}),
                None => {
                    json!({"released": false, "reason": "no source is locked (the previous node is configured, or nothing arrived yet)"})
                }
            },
        }
    }

    /// Lets the stats socket reload the ring key files.
    pub fn set_key_reload(&self, r: Option<KeyReload>) {
        *self.keys.lock().unwrap_or_else(|p| p.into_inner()) = r;
    }

    /// Reloads the ring key files (the stats socket's `reload-keys`
    /// request); the reply, as JSON.
    pub fn reload_keys(&self) -> Value {
        let r = self.keys.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match r.map(|r| r.reload()) {
            None => json!({"reloaded": false, "reason": "this node reloads no keys (not running)"}),
            Some(Ok(keys)) => json!({"reloaded": true, "keys": keys}),
            Some(Err(why)) => json!({"reloaded": false, "reason": why}),
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
        self.json_of(&self.snapshot())
    }

    /// The latest publication.
    fn snapshot(&self) -> Snapshot {
        self.snap.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Everything as JSON, with the counters of `s`.
    fn json_of(&self, s: &Snapshot) -> Value {
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
            "refused_connections": {
                "metrics": self.refused(Server::Metrics),
                "stats": self.refused(Server::Stats),
            },
        })
    }

    /// Prometheus text exposition format (version 0.0.4).
    #[cfg(feature = "telemetry-server")]
    pub fn to_prometheus(&self) -> String {
        prometheus::encode(self)
    }

    /// Connections `server` refused so far.
    fn refused(&self, server: Server) -> u64 {
        self.refused[server as usize].load(Ordering::Relaxed)
    }

    /// Counts a connection a server refused because it had
    /// [`Limits::max_connections`] open; says so in the log the first time.
    #[cfg(feature = "telemetry-server")]
    fn refuse(&self, server: Server) {
        if self.refused[server as usize].fetch_add(1, Ordering::Relaxed) == 0 {
            log::warn!(
                "{}: too many connections open; closing the oldest idle one or the newest \
                 (counted in leap_telemetry_refused_connections_total)",
                server.name()
            );
        }
    }
}
