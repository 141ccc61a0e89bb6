//! The floor: one 64-byte UDP datagram per hop around the same ring, with a
//! plain blocking socket per node. No transport can beat it on this host, so
//! every figure of the benchmark can be read as a multiple of it.
//!
//! That holds only if it is measured the way the rings are, so it is: its
//! nodes are threads of the benchmark's process, as `leap ring`'s are,
//! started by the same function ([`crate::ring::spawn_node`]): the same
//! scheduling class and priority (inherited from the benchmark's thread,
//! `--sched`), node `i` pinned to the same CPU (`--cpus`), in the same kind
//! of namespaces and veth pairs (or on loopback), and measured in every
//! round as one more slot of the rings' rotation ([`super::run_on`]), so
//! that it meets the machine at the same moments as the rings. Measured
//! once before them, unpinned, it once came out at 104.5 us against 89.4 us
//! for TCP's 16 392-byte frames: on a shared 2-CPU machine the time of a
//! wake-up moves with the other work, and a floor from another moment than
//! the rings' is no floor.
//!
//! Unpinned, each run's threads (the floor's and every ring's) are placed
//! afresh by the scheduler, and on fewer CPUs than nodes the placement
//! alone moves a round trip several times over: only `--cpus` makes it the
//! same for the floor and the rings.

use std::error::Error;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::netns::Topology;
use crate::ring::Percentiles;

/// Port of the floor's sockets.
const PORT: u16 = 9997;

/// What fails in a floor node's thread.
type HopError = Box<dyn Error + Send + Sync>;

/// Measures `rounds` round trips of a 64-byte datagram around `n` nodes, in
/// namespaces when `topo` is given, else on loopback; node `i` started as
/// a ring's node `i` is ([`crate::ring::spawn_node`]: pinned to its CPU of
/// `cpus`, scheduled as the calling thread).
///
/// # Errors
///
/// A socket or namespace error, as text.
pub fn measure(topo: Option<&Topology>, n: usize, rounds: usize, cpus: &[usize]) -> Result<Percentiles, String> {
    let addrs: Vec<SocketAddr> = match topo {
        Some(t) => t.nodes().iter().map(|nd| SocketAddr::new(nd.addr.into(), PORT)).collect(),
        None => (0..n)
            .map(|_| {
                crate::netns::loopback_port()
                    .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
                    .ok_or_else(|| "no free loopback port for the floor".to_string())
            })
            .collect::<Result<_, _>>()?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut workers = Vec::new();
    for i in 1..n {
        let (me, next, halt, ready) = (addrs[i], addrs[(i + 1) % n], stop.clone(), ready_tx.clone());
        let ns = topo.map(|t| t.nodes()[i].path());
        let worker = crate::ring::spawn_node(format!("leap-floor-{i}"), cpus, i, move || -> Result<(), HopError> {
            let sock = (|| {
                if let Some(ns) = &ns {
                    crate::netns::enter(ns)?;
                }
                let s = UdpSocket::bind(me)?;
                s.set_read_timeout(Some(Duration::from_millis(100)))?;
                Ok::<_, std::io::Error>(s)
            })();
            let _ = ready.send(sock.as_ref().err().map(|e| e.to_string()));
            let sock = sock?;
            let mut buf = [0u8; 64];
            while !halt.load(Ordering::Relaxed) {
                if let Ok(len) = sock.recv(&mut buf) {
                    let _ = sock.send_to(&buf[..len], next);
                }
            }
            Ok(())
        });
        match worker {
            Ok(w) => workers.push(w),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                return Err(format!("starting floor node {i}: {e}"));
            }
        }
    }
    drop(ready_tx);
    let (me, next) = (addrs[0], addrs[1 % n]);
    let ns = topo.map(|t| t.nodes()[0].path());
    let head = crate::ring::spawn_node("leap-floor-head".into(), cpus, 0, move || -> Result<Vec<u64>, HopError> {
        if let Some(ns) = &ns {
            crate::netns::enter(ns)?;
        }
        let sock = UdpSocket::bind(me)?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut rtts = Vec::with_capacity(rounds);
        let mut buf = [0u8; 64];
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut i = 0u64;
        while rtts.len() < rounds && Instant::now() < deadline {
            buf[..8].copy_from_slice(&i.to_le_bytes());
            let t = Instant::now();
            sock.send_to(&buf, next)?;
            // A lost datagram just costs one timeout; only matching ones count.
            while let Ok(len) = sock.recv(&mut buf) {
                if len == 64 && buf[..8] == i.to_le_bytes() {
                    rtts.push(t.elapsed().as_nanos() as u64);
                    break;
                }
            }
            i += 1;
        }
        Ok(rtts)
    });
    let head = head.map_err(|e| {
        stop.store(true, Ordering::Relaxed);
        format!("starting the floor's head: {e}")
    })?;
    // A node that could not be pinned ends without a word (its sender
    // goes unused): the wait is bounded.
    for _ in 1..n {
        let failed = match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(None) => continue,
            Ok(Some(e)) => e,
            Err(_) => "a floor node did not start (pinning failed, or it took over 10 s)".into(),
        };
        // The head gives up at its own deadline; the nodes stop now.
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            if let Ok(Err(e)) = w.join() {
                return Err(e.to_string());
            }
        }
        return Err(failed);
    }
    let res = head.join().map_err(|_| "floor head panicked".to_string());
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let rtts = res?.map_err(|e| e.to_string())?;
    if rtts.len() < rounds / 2 {
        return Err(format!("floor: only {} of {rounds} datagrams came back", rtts.len()));
    }
    // Warm-up: the first tenth pays for cold caches and ARP.
    let skip = rtts.len() / 10;
    let mut h = crate::ring::RttHistogram::new();
    rtts[skip..].iter().for_each(|&ns| h.record_ns(ns));
    Ok(h.percentiles())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_on_loopback_measures_every_round_trip_unprivileged() {
        let p = measure(None, 3, 200, &[]).unwrap();
        assert!(p.p50 > 0.0 && p.p50 <= p.p99 && p.p99 <= p.max, "{p:?}");
    }
}
