//! The head and worker loops of one ring member, over any [`Transport`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leap_common::control::{ControlMessage, ControlType};
use leap_common::frame::FrameHeader;

use super::Progress;
use super::control::{Layers, acknowledges, apply, chain};
use super::latency::RttHistogram;
use crate::telemetry::Telemetry;
use crate::transport::{FrameKind, Transport, TransportError};

/// What the head does.
#[derive(Clone, Debug)]
#[non_exhaustive]
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
    /// long and a receive deadline passes (`None`: never).
    pub lost_after: Option<Duration>,
    /// Send a frame again (up to 4 times) instead of counting it lost: a node
    /// that died holding it, restarted, gets it anew. Reliable mode.
    pub retry: bool,
    /// Send a RESIZE_CHAIN for this many workers first and wait for the ACK.
    pub control_workers: Option<usize>,
    /// Progress callback.
    pub progress: Option<Progress>,
    /// Where to publish counters and round trips (a `leap node`).
    pub telemetry: Option<Arc<Telemetry>>,
    /// Stop early when set (SIGTERM); the report covers what was done.
    pub stop: Option<Arc<AtomicBool>>,
    /// Idle this long before sending each frame (a head between requests).
    pub pause: Duration,
    /// Move frames through the copying API (`send_next_parts`,
    /// `recv_prev` into a buffer of the head) instead of the lending one.
    pub copying: bool,
}

impl HeadConfig {
    /// A head driving `frames` frames of `frame_size` bytes one at a time,
    /// giving up after 10 s without a frame back, counting nothing lost
    /// early, without control messages, telemetry or pauses.
    pub fn new(frame_size: usize, frames: u64) -> Self {
        Self {
            frame_size,
            frames,
            inflight: 1,
            stall_timeout: Duration::from_secs(10),
            lost_after: None,
            retry: false,
            control_workers: None,
            progress: None,
            telemetry: None,
            stop: None,
            pause: Duration::ZERO,
            copying: false,
        }
    }
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
    /// Frames sent again after `lost_after` (retry).
    pub resent: u64,
    /// Copies of frames that came back after a re-sent copy (harmless).
    pub duplicates: u64,
    /// Round-trip times of the delivered frames.
    pub rtt: RttHistogram,
    /// Wall time of the data phase.
    pub elapsed: Duration,
    /// When the data phase began.
    pub started: Option<Instant>,
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
    let mut rep = HeadReport::default();
    let mut buf = vec![0u8; cfg.frame_size];
    if let Some(workers) = cfg.control_workers {
        rep.control_ack = Some(control_round(t, workers, cfg.frame_size, &mut buf)?);
    }
    let payload_len = cfg.frame_size - FrameHeader::LEN;
    let patterns = Patterns::new((cfg.inflight * 2 + 2).min(16), payload_len);
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(cfg.inflight);
    // Recently delivered positions, to tell a late copy of a re-sent frame
    // from garbage; bounded so that endless runs stay small.
    let mut recent: std::collections::VecDeque<i32> = std::collections::VecDeque::with_capacity(RECENT);
    let mut next_pos: i64 = 0;
    let start = Instant::now();
    let mut last_progress = Instant::now();
    // Frames are written where the transport sends them from, and read
    // where it received them (the lending API): the transport copies none.
    let frame_size = cfg.frame_size;
    let copying = cfg.copying;
    let send = |t: &mut dyn Transport, pos: i32| {
        let hdr = FrameHeader { pos, flags: FrameHeader::REPLY }.to_bytes();
        if copying {
            return t.send_multipart_next(&hdr, patterns.payload(pos));
        }
        t.send_next_with(FrameKind::Data, frame_size, &mut |buf| {
            buf[..FrameHeader::LEN].copy_from_slice(&hdr);
            buf[FrameHeader::LEN..].copy_from_slice(patterns.payload(pos));
        })
    };
    while rep.delivered + rep.corrupt + rep.lost < cfg.frames {
        if cfg.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            log::info!("head stopped after {} frames", rep.delivered);
            break;
        }
        if let Some(tel) = &cfg.telemetry {
            tel.publish(&*t, rep.delivered, false);
        }
        while (next_pos as u64) < cfg.frames && in_flight.len() < cfg.inflight {
            if !cfg.pause.is_zero() {
                std::thread::sleep(cfg.pause);
            }
            let pos = next_pos as i32;
            // The round trip includes our own send.
            let now = Instant::now();
            send(t, pos)?;
            in_flight.push_back(InFlight { pos, sent: now, attempts: 1 });
            rep.sent += 1;
            next_pos += 1;
        }
        let mut on_frame = |frame: &[u8]| {
            let now = Instant::now();
            last_progress = now;
            let Some(hdr) = FrameHeader::read(frame) else {
                rep.corrupt += 1;
                return;
            };
            let intact = |p: i32| {
                frame.len() == cfg.frame_size
                    && hdr.flags == FrameHeader::REPLY
                    && frame[FrameHeader::LEN..] == *patterns.payload(p)
            };
            if !cfg.retry {
                // Without retries frames come back in order: older
                // ones still in flight were lost on the way.
                while in_flight.front().is_some_and(|f| f.pos < hdr.pos) {
                    in_flight.pop_front();
                    rep.lost += 1;
                }
            }
            if let Some(i) = in_flight.iter().position(|f| f.pos == hdr.pos) {
                let f = in_flight.remove(i).expect("index from position");
                if intact(f.pos) {
                    rep.delivered += 1;
                    if recent.len() == RECENT {
                        recent.pop_front();
                    }
                    recent.push_back(f.pos);
                    let rtt = now.duration_since(f.sent);
                    rep.rtt.record(rtt);
                    if let Some(tel) = &cfg.telemetry {
                        tel.latency.record(rtt);
                    }
                } else {
                    rep.corrupt += 1;
                }
            } else if recent.contains(&hdr.pos) && intact(hdr.pos) {
                // A frame re-sent by us whose first copy also made it.
                rep.duplicates += 1;
            } else {
                // Never sent, or not what we sent.
                rep.corrupt += 1;
            }
        };
        let error = if cfg.copying {
            match t.recv_prev(&mut buf) {
                // A late ACK of the control round: nothing to do.
                Ok(got) if got.kind == FrameKind::Control => continue,
                Ok(got) => {
                    on_frame(&buf[..got.len]);
                    None
                }
                Err(e) => Some(e),
            }
        } else {
            match t.recv_prev_lent() {
                Ok(frame) if frame.kind() == FrameKind::Control => continue,
                Ok(frame) => {
                    on_frame(&frame);
                    None
                }
                Err(e) => Some(e),
            }
        };
        match error {
            None => {}
            Some(TransportError::FrameLost { .. }) => last_progress = Instant::now(),
            Some(e @ (TransportError::Timeout(_) | TransportError::PeerClosed(_))) => {
                if last_progress.elapsed() >= cfg.stall_timeout {
                    return Err(TransportError::Stalled { waited: cfg.stall_timeout, last: Box::new(e) });
                }
                if let (Some(after), Some(f)) = (cfg.lost_after, in_flight.front())
                    && f.sent.elapsed() >= after
                {
                    let mut f = in_flight.pop_front().expect("front exists");
                    if cfg.retry && f.attempts < HEAD_ATTEMPTS {
                        // A node died with the frame: send it again.
                        f.sent = Instant::now();
                        send(t, f.pos)?;
                        f.attempts += 1;
                        rep.resent += 1;
                        in_flight.push_back(f);
                    } else {
                        rep.lost += 1;
                    }
                }
            }
            Some(e) => return Err(e),
        }
        if let Some(p) = &cfg.progress {
            let done = rep.delivered + rep.corrupt + rep.lost;
            if done.is_multiple_of(64) || done == cfg.frames {
                (p.0)(done);
            }
        }
    }
    rep.elapsed = start.elapsed();
    rep.started = Some(start);
    if let Some(tel) = &cfg.telemetry {
        tel.publish(&*t, rep.delivered, true);
    }
    Ok(rep)
}

/// Delivered positions remembered to recognise late duplicates.
const RECENT: usize = 4096;

/// How often the head sends a frame before counting it lost (with retry).
const HEAD_ATTEMPTS: u32 = 4;

#[derive(Debug)]
struct InFlight {
    pos: i32,
    sent: Instant,
    attempts: u32,
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
                    // Leap's tail or an original one (see `acknowledges`).
                    if let Ok(ack) = ControlMessage::decode(&buf[..got.len])
                        && ack.kind == ControlType::Ack
                    {
                        return Ok(acknowledges(&msg, &ack));
                    }
                }
                Ok(_) | Err(TransportError::Timeout(_) | TransportError::FrameLost { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(false)
}

/// What a worker does when a neighbour goes silent or away.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NeighbourPolicy {
    /// Keep waiting for it to come back (TCP reconnects, datagram backends
    /// resynchronise with a restarted sender).
    #[default]
    Wait,
    /// Return the error: the receive deadline (default 1 s) without a frame,
    /// or a closed connection, ends the worker.
    Exit,
}

/// What a worker does.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Bytes per frame (the receive buffer).
    pub frame_size: usize,
    /// Simulated compute per frame.
    pub compute: Duration,
    /// Silent or departed neighbours.
    pub policy: NeighbourPolicy,
    /// Where to publish counters and forward times (a `leap node`).
    pub telemetry: Option<Arc<Telemetry>>,
    /// Receive into a buffer of the worker and send from it (the copying
    /// API) instead of [`Transport::relay`].
    pub copying: bool,
    /// Stop after this many data frames (`None`: only at `stop`).
    pub max_frames: Option<u64>,
}

impl WorkerConfig {
    /// A worker of frames of `frame_size` bytes, without compute or
    /// telemetry, with the default [`NeighbourPolicy`].
    pub fn new(frame_size: usize) -> Self {
        Self { frame_size, ..Self::default() }
    }
}

/// A worker: receives, computes, forwards, until `stop`. Control messages
/// are applied and forwarded as the protocol says.
///
/// # Errors
///
/// A transport error other than a lost frame; with
/// [`NeighbourPolicy::Wait`] also not a deadline or a closed connection.
/// Nothing once `stop` is set (the head finished and closed its connections).
pub fn run_worker(t: &mut dyn Transport, cfg: &WorkerConfig, stop: &AtomicBool) -> Result<Layers, TransportError> {
    let (frame_size, compute, policy) = (cfg.frame_size, cfg.compute, cfg.policy);
    let mut frames = 0u64;
    let mut buf = vec![0u8; frame_size];
    let mut layers = Layers::default();
    let mut silent_since: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) && cfg.max_frames.is_none_or(|m| frames < m) {
        if let Some(tel) = &cfg.telemetry {
            tel.publish(&*t, frames, false);
        }
        // Receive, "compute" (spin), and send on what the layer wrote: the
        // frame is read where it arrived and written where it leaves.
        let mut received_at = None;
        let mut layer = |input: &[u8], out: Option<&mut [u8]>| {
            received_at = Some(Instant::now());
            if !compute.is_zero() {
                let until = Instant::now() + compute;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            if let Some(out) = out {
                out.copy_from_slice(input);
            }
        };
        let relayed = if cfg.copying {
            // The frame stays in `buf`: the layer works in place there.
            match t.recv_prev(&mut buf) {
                Ok(got) if got.kind == FrameKind::Data => {
                    layer(&buf[..got.len], None);
                    t.send_next(&buf[..got.len]).map(|()| got)
                }
                other => other,
            }
        } else {
            t.relay(&mut buf, &mut |input, out| layer(input, Some(out)))
        };
        let got = match relayed {
            Ok(got) => got,
            Err(_) if stop.load(Ordering::Relaxed) => break,
            Err(TransportError::FrameLost { .. }) => continue,
            Err(_) if stop.load(Ordering::Relaxed) => break,
            Err(e @ (TransportError::Timeout(_) | TransportError::PeerClosed(_))) => {
                if policy == NeighbourPolicy::Exit {
                    return Err(e);
                }
                if silent_since.is_none() {
                    log::warn!("previous node: {e}; waiting for it");
                    silent_since = Some(Instant::now());
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(since) = silent_since.take() {
            log::info!("previous node back after {:.1} s", since.elapsed().as_secs_f64());
        }
        if got.kind == FrameKind::Control {
            if let Ok(msg) = ControlMessage::decode(&buf[..got.len]) {
                t.send_control(&apply(&mut layers, &msg), got.len)?;
            }
            continue;
        }
        frames += 1;
        if let Some(tel) = &cfg.telemetry
            && let Some(received_at) = received_at
        {
            tel.latency.record(received_at.elapsed());
            tel.publish(&*t, frames, false);
        }
    }
    if let Some(tel) = &cfg.telemetry {
        tel.publish(&*t, frames, true);
    }
    Ok(layers)
}
