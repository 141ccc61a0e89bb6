//! The floor: one 64-byte UDP datagram per hop around the same ring, with a
//! plain blocking socket per node. No transport can beat it on this host, so
//! every figure of the benchmark can be read as a multiple of it.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::netns::Topology;
use crate::ring::Percentiles;

/// Port of the floor's sockets.
const PORT: u16 = 9997;

/// Measures `rounds` round trips of a 64-byte datagram around `n` nodes, in
/// namespaces when `topo` is given, else on loopback; node `i` pinned like
/// a ring's node `i` when `cpus` is not empty.
///
/// # Errors
///
/// A socket or namespace error, as text.
pub fn measure(topo: Option<&Topology>, n: usize, rounds: usize, cpus: &[usize]) -> Result<Percentiles, String> {
    let addrs: Vec<SocketAddr> = match topo {
        Some(t) => t.nodes().iter().map(|nd| SocketAddr::new(nd.addr.into(), PORT)).collect(),
        None => (0..n)
            .map(|_| UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut workers = Vec::new();
    for i in 1..n {
        let (me, next, stop, ready) = (addrs[i], addrs[(i + 1) % n], stop.clone(), ready_tx.clone());
        let ns = topo.map(|t| t.nodes()[i].path());
        let cpus = cpus.to_vec();
        workers.push(std::thread::spawn(move || -> Result<(), String> {
            let sock = (|| {
                crate::ring::pin(&cpus, i).map_err(std::io::Error::other)?;
                if let Some(ns) = &ns {
                    crate::sys::netns::enter(ns)?;
                }
                let s = UdpSocket::bind(me)?;
                s.set_read_timeout(Some(Duration::from_millis(100)))?;
                Ok::<_, std::io::Error>(s)
            })();
            let _ = ready.send(sock.as_ref().err().map(|e| e.to_string()));
            let sock = sock.map_err(|e| e.to_string())?;
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                if let Ok(len) = sock.recv(&mut buf) {
                    let _ = sock.send_to(&buf[..len], next);
                }
            }
            Ok(())
        }));
    }
    drop(ready_tx);
    let (me, next) = (addrs[0], addrs[1 % n]);
    let ns = topo.map(|t| t.nodes()[0].path());
    let cpus = cpus.to_vec();
    let head = std::thread::spawn(move || -> Result<Vec<u64>, String> {
        crate::ring::pin(&cpus, 0).map_err(|e| e.to_string())?;
        if let Some(ns) = &ns {
            crate::sys::netns::enter(ns).map_err(|e| e.to_string())?;
        }
        let sock = UdpSocket::bind(me).map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| e.to_string())?;
        let mut rtts = Vec::with_capacity(rounds);
        let mut buf = [0u8; 64];
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut i = 0u64;
        while rtts.len() < rounds && Instant::now() < deadline {
            buf[..8].copy_from_slice(&i.to_le_bytes());
            let t = Instant::now();
            sock.send_to(&buf, next).map_err(|e| e.to_string())?;
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
    if let Some(e) = ready_rx.iter().take(n - 1).flatten().next() {
        stop.store(true, Ordering::Relaxed);
        return Err(e);
    }
    let res = head.join().map_err(|_| "floor head panicked".to_string());
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let rtts = res??;
    if rtts.len() < rounds / 2 {
        return Err(format!("floor: only {} of {rounds} datagrams came back", rtts.len()));
    }
    // Warm-up: the first tenth pays for cold caches and ARP.
    let skip = rtts.len() / 10;
    let mut h = crate::ring::RttHistogram::new();
    rtts[skip..].iter().for_each(|&ns| h.record_ns(ns));
    Ok(h.percentiles())
}
