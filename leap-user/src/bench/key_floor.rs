//! The key floor: what sealing and opening every datagram of one frame
//! costs on this host, with the link's own code (`datagram_auth`'s
//! [`Seals`] and [`Opener`]), no socket and no wake-up. A keyed ring pays
//! it once per hop (the sender seals, the next node opens), so hops times
//! it is the part of a keyed round trip's extra over the plain ring that
//! the cryptography alone takes, and a frame's bytes over it is the rate
//! one core can seal and open: a keyed ring's ceiling.
//!
//! Measured as the floor is ([`super::floor`]): in every round, as part of
//! the floor's slot of the rotation, on the CPU and with the scheduling of
//! the ring's first node ([`crate::ring::spawn_node`]), so that it meets
//! the machine at the same moments as the rings it is compared with.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Instant;

use leap_common::chunk::flags;

use crate::frame::Chunker;
use crate::transport::datagram_auth::{Opener, Seals, TRAILER_LEN};
use crate::transport::ring_key::KeySet;

/// Frame bytes sealed and opened per measurement, at most (fewer frames
/// for larger ones): a few milliseconds of work on a current core.
const BYTES: usize = 8 << 20;
/// Frames per measurement, at least and at most.
const FRAMES: (usize, usize) = (8, 200);

/// What fails in the measuring thread.
type FloorError = Box<dyn Error + Send + Sync>;

/// Frames sealed and opened for a frame of `size` bytes.
pub fn frames_for(size: usize) -> usize {
    (BYTES / size.max(1)).clamp(FRAMES.0, FRAMES.1)
}

/// The median time, in microseconds, to seal every datagram of one frame
/// of `size` bytes with `keys` (tagged, or encrypted when `keys.encrypt`)
/// and open each again, over [`frames_for`]`(size)` frames (the first
/// tenth, which derives the keys and warms the caches, left out); run on
/// the CPU of the ring's first node of `cpus`.
///
/// # Errors
///
/// The thread could not start or be pinned, or a sealed datagram did not
/// open (a bug: the measurement would not be of the link's path).
pub fn measure(keys: &KeySet, size: usize, cpus: &[usize]) -> Result<f64, String> {
    let keys = keys.clone();
    let worker = crate::ring::spawn_node("leap-key-floor".into(), cpus, 0, move || -> Result<f64, FloorError> {
        seal_and_open(&keys, size, frames_for(size))
    })
    .map_err(|e| format!("starting the key floor: {e}"))?;
    worker.join().map_err(|_| "the key floor panicked".to_string())?.map_err(|e| e.to_string())
}

/// [`measure`] on the calling thread, over `frames` frames.
fn seal_and_open(keys: &KeySet, size: usize, frames: usize) -> Result<f64, FloorError> {
    let (from, to): (SocketAddr, SocketAddr) = (([127, 0, 0, 1], 1).into(), ([127, 0, 0, 2], 2).into());
    let mut seals = Seals::new(keys, 1, from);
    let mut opener = Opener::new(keys.clone(), to);
    let frame: Vec<u8> = (0..size).map(|i| i as u8).collect();
    // The datagrams as the link writes them (chunks of a keyed frame, room
    // for the trailer), written once: only sealing and opening are timed.
    let reserved = flags::LEAP | flags::AUTH | flags::RELIABLE;
    let chunker = Chunker::with_trailer(0, reserved, &frame, &[], &[]).ok_or("no frame of this size")?;
    let mut datagrams: Vec<(Vec<u8>, usize)> = (0..chunker.total())
        .map(|id| {
            let c = chunker.chunk(id).expect("id below total");
            let mut d = vec![0; c.datagram_len() + TRAILER_LEN];
            let len = c.write(&mut d);
            (d, len)
        })
        .collect();
    let mut times = Vec::with_capacity(frames);
    for _ in 0..frames {
        let t = Instant::now();
        for (d, len) in &mut datagrams {
            seals.seal(to, false, d, *len);
        }
        for (d, len) in &datagrams {
            let opened = opener.open(from, d).map_err(|e| format!("a sealed datagram did not open: {e}"))?;
            if opened.len != *len {
                return Err("a sealed datagram opened to another length".into());
            }
        }
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut kept = times.split_off(frames / 10);
    kept.sort_by(f64::total_cmp);
    Ok(kept[kept.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ring_key::RingKey;

    #[test]
    fn every_datagram_of_a_frame_is_sealed_and_opened_tagged_or_encrypted() {
        for encrypt in [false, true] {
            let keys = KeySet { encrypt, ..KeySet::new(RingKey::from_bytes([3; 32])) };
            // 3 chunks, the last one short; then a single short chunk.
            for size in [3000, 10] {
                let us = seal_and_open(&keys, size, 4).unwrap();
                assert!(us > 0.0 && us.is_finite(), "{us}");
            }
        }
    }

    #[test]
    fn frames_are_bounded_both_ways() {
        assert_eq!(frames_for(16_392), FRAMES.1);
        assert_eq!(frames_for(1 << 20), FRAMES.0);
        assert_eq!(frames_for(0), FRAMES.1);
    }
}
