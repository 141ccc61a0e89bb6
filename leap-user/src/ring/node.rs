//! The head and worker loops of one ring member, over any [`Transport`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leap_common::control::{ControlMessage, ControlType};
use leap_common::frame::FrameHeader;

use super::Progress;
use super::control::{ControlAction, Layers, apply, chain};
use crate::transport::{FrameKind, Transport, TransportError};

/// What the head does.
#[derive(Clone, Debug)]
pub struct HeadConfig {
    /// Bytes per frame.
    pub frame_size: usize,
    /// Frames to drive.
    pub frames: u64,
    /// Frames in flight at once.
    pub inflight: usize,
    /// Give up when nothing comes back for this long.
    pub stall_timeout: Duration,
    /// Count the oldest frame in flight as lost when it has been out this
    /// long and a receive deadline passes (`None`: never, e.g. over TCP).
    pub lost_after: Option<Duration>,
    /// Send a RESIZE_CHAIN for this many workers first and wait for the ACK.
    pub control_workers: Option<usize>,
    /// Progress callback.
    pub progress: Option<Progress>,
}

/// What the head measured.
#[derive(Clone, Debug, Default)]
pub struct HeadReport {
    /// Frames sent.
    pub sent: u64,
    /// Frames back intact.
    pub delivered: u64,
    /// Frames back with wrong bytes, or that were never sent.
    pub corrupt: u64,
    /// Frames that never came back.
    pub lost: u64,
    /// Round-trip time of each delivered frame, nanoseconds.
    pub rtts_ns: Vec<u64>,
    /// Wall time of the data phase.
    pub elapsed: Duration,
    /// Whether the control ACK came back (None: not tried).
    pub control_ack: Option<bool>,
}

/// Payload patterns: frame `pos` carries pattern `pos % n`, so that chunks
/// of neighbouring frames mixed into one frame are detected.
#[derive(Debug)]
pub struct Patterns {
    bufs: Vec<Vec<u8>>,
}

impl Patterns {
    /// `n` patterns of `len` bytes.
    pub fn new(n: usize, len: usize) -> Self {
        let bufs = (0..n as u64)
            .map(|k| {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (k.wrapping_mul(0xD1B5_4A32_D192_ED03));
                let mut v = Vec::with_capacity(len + 8);
                while v.len() < len {
                    // xorshift64*: cheap, and no two patterns share a prefix.
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    v.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
                }
                v.truncate(len);
                v
            })
            .collect();
        Self { bufs }
    }

    /// The payload of frame `pos`.
    pub fn payload(&self, pos: i32) -> &[u8] {
        &self.bufs[pos.rem_euclid(self.bufs.len() as i32) as usize]
    }
}

/// The head: sends `frames` frames, `inflight` at a time, and checks every
/// byte of what the tail sends back.
///
/// # Errors
///
/// A transport error other than a timeout or a lost frame, or a stall longer
/// than `stall_timeout`.
pub fn run_head(t: &mut dyn Transport, cfg: &HeadConfig) -> Result<HeadReport, TransportError> {
    let mut rep = HeadReport { rtts_ns: Vec::with_capacity(cfg.frames as usize), ..Default::default() };
    let mut buf = vec![0u8; cfg.frame_size];
    if let Some(workers) = cfg.control_workers {
        rep.control_ack = Some(control_round(t, workers, cfg.frame_size, &mut buf)?);
    }
    let payload_len = cfg.frame_size - FrameHeader::LEN;
    let patterns = Patterns::new((cfg.inflight * 2 + 2).min(16), payload_len);
    let mut in_flight: VecDeque<(i32, Instant)> = VecDeque::with_capacity(cfg.inflight);
    let mut next_pos: i64 = 0;
    let start = Instant::now();
    let mut last_progress = Instant::now();
    while rep.delivered + rep.corrupt + rep.lost < cfg.frames {
        while (next_pos as u64) < cfg.frames && in_flight.len() < cfg.inflight {
            let pos = next_pos as i32;
            let hdr = FrameHeader { pos, flags: FrameHeader::REPLY }.to_bytes();
            t.send_multipart_next(&hdr, patterns.payload(pos))?;
            in_flight.push_back((pos, Instant::now()));
            rep.sent += 1;
            next_pos += 1;
        }
        match t.recv_prev(&mut buf) {
            Ok(got) if got.kind == FrameKind::Control => {
                // A late ACK of the control round: nothing to do.
                continue;
            }
            Ok(got) => {
                let now = Instant::now();
                last_progress = now;
                let Some(hdr) = FrameHeader::read(&buf[..got.len]) else {
                    rep.corrupt += 1;
                    continue;
                };
                // Frames older than this one were lost on the way.
                while in_flight.front().is_some_and(|&(p, _)| p < hdr.pos) {
                    in_flight.pop_front();
                    rep.lost += 1;
                }
                match in_flight.front() {
                    Some(&(p, sent_at)) if p == hdr.pos => {
                        in_flight.pop_front();
                        let ok = got.len == cfg.frame_size
                            && hdr.flags == FrameHeader::REPLY
                            && buf[FrameHeader::LEN..got.len] == *patterns.payload(p);
                        if ok {
                            rep.delivered += 1;
                            rep.rtts_ns.push(now.duration_since(sent_at).as_nanos() as u64);
                        } else {
                            rep.corrupt += 1;
                        }
                    }
                    // A frame that is not in flight: a duplicate or garbage.
                    _ => rep.corrupt += 1,
                }
            }
            Err(TransportError::FrameLost { .. }) => {
                // The tail's frame to us was given up; the next one that
                // arrives tells which positions are missing.
                last_progress = Instant::now();
            }
            Err(e @ TransportError::Timeout(_)) => {
                if last_progress.elapsed() >= cfg.stall_timeout {
                    return Err(TransportError::Backend(
                        format!("no frame came back for {:?} ({e})", cfg.stall_timeout).into(),
                    ));
                }
                if let (Some(after), Some(&(_, sent_at))) = (cfg.lost_after, in_flight.front())
                    && sent_at.elapsed() >= after
                {
                    // The oldest frame died on some hop.
                    in_flight.pop_front();
                    rep.lost += 1;
                }
            }
            Err(e) => return Err(e),
        }
        if let Some(p) = &cfg.progress {
            let done = rep.delivered + rep.corrupt + rep.lost;
            if done.is_multiple_of(64) || done == cfg.frames {
                (p.0)(done);
            }
        }
    }
    rep.elapsed = start.elapsed();
    Ok(rep)
}

/// Sends a RESIZE_CHAIN and waits for the tail's ACK (three tries).
fn control_round(
    t: &mut dyn Transport,
    workers: usize,
    frame_size: usize,
    buf: &mut [u8],
) -> Result<bool, TransportError> {
    let msg = chain(workers, 32);
    for _ in 0..3 {
        t.send_control(&msg, frame_size)?;
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            match t.recv_prev(buf) {
                Ok(got) if got.kind == FrameKind::Control => {
                    if let Ok(ack) = ControlMessage::decode(&buf[..got.len])
                        && ack.kind == ControlType::Ack
                    {
                        return Ok(ack.worker_index == ack.total_workers && ack.ranges == msg.ranges);
                    }
                }
                Ok(_) | Err(TransportError::Timeout(_) | TransportError::FrameLost { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(false)
}

/// A worker: receives, computes for `compute`, forwards, until `stop`.
/// Control messages are applied and forwarded as the protocol says.
///
/// # Errors
///
/// A transport error other than a timeout or a lost frame, unless `stop` is
/// already set (the head finished and closed its connections).
pub fn run_worker(
    t: &mut dyn Transport,
    frame_size: usize,
    compute: Duration,
    stop: &AtomicBool,
) -> Result<Layers, TransportError> {
    let mut buf = vec![0u8; frame_size];
    let mut layers = Layers::default();
    while !stop.load(Ordering::Relaxed) {
        let got = match t.recv_prev(&mut buf) {
            Ok(got) => got,
            Err(TransportError::Timeout(_) | TransportError::FrameLost { .. }) => continue,
            Err(_) if stop.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e),
        };
        if got.kind == FrameKind::Control {
            if let Ok(msg) = ControlMessage::decode(&buf[..got.len])
                && let ControlAction::Forward(out) = apply(&mut layers, &msg)
            {
                t.send_control(&out, got.len)?;
            }
            continue;
        }
        if !compute.is_zero() {
            let until = Instant::now() + compute;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        match t.send_next(&buf[..got.len]) {
            Ok(()) => {}
            Err(_) if stop.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(layers)
}
