//! A toy three-stage pipeline through the `Transport` trait, the way an
//! inference engine would use leap: stage 0 embeds a token into activations
//! and sends them on; stage 1 and 2 each apply "their layers" (here a scale
//! and a shift) and pass the result on; stage 2's output comes back to stage
//! 0, which reads the "logits". Runs on loopback with UDP or TCP. XDP and
//! the kernel module need one interface (or host) per node: an XDP program
//! and an AF_XDP queue belong to one node, so three nodes cannot share
//! `lo` (`leap ring --netns` gives each node its own namespace).
//!
//! Frames go through the lending API: a stage reads the frame where its
//! transport received it (`recv_prev_lent`) and writes its output where
//! its transport sends from (`send_next_with`), with the transport split in
//! a sender and a receiver. `examples/async_pipeline.rs` is the same on
//! tokio.
//!
//! ```sh
//! cargo run --example pipeline -- udp
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use leap::transport::Halves;
use leap::transport::open::{Endpoint, Options, TransportKind, open};
use leap::{FrameKind, Transport};
use leap_common::frame::{FrameHeader, frame_len};

const DIM: usize = 4096;

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

/// Writes stage `layer`'s output for the frame `input` into `out` (same
/// length): the header is kept, every activation is transformed. Reads the
/// frame where the transport lent it and writes where the transport sends
/// from: no copy of the frame in between.
fn apply(input: &[u8], out: &mut [u8], layer: impl Fn(f32) -> f32) {
    out[..FrameHeader::LEN].copy_from_slice(&input[..FrameHeader::LEN]);
    for (o, i) in out[FrameHeader::LEN..].chunks_exact_mut(4).zip(input[FrameHeader::LEN..].chunks_exact(4)) {
        o.copy_from_slice(&layer(f32::from_ne_bytes([i[0], i[1], i[2], i[3]])).to_ne_bytes());
    }
}

/// A middle stage: receive, apply `layer`, forward. Stops after `steps`.
/// The transport is split: the receiver lends frame N while the sender
/// writes the result in place.
fn stage(t: Box<dyn Transport>, steps: usize, layer: impl Fn(f32) -> f32) -> Result<(), leap::TransportError> {
    let Halves { mut sender, mut receiver } = t.split()?;
    let mut done = 0;
    while done < steps {
        let frame = match receiver.recv_prev_lent() {
            Ok(f) => f,
            Err(e) if e.is_timeout() => continue,
            Err(e) => return Err(e),
        };
        if frame.kind() == FrameKind::Control {
            continue;
        }
        sender.send_next_with(FrameKind::Data, frame.len(), &mut |out| apply(&frame, out, &layer))?;
        done += 1;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kind: TransportKind = std::env::args().nth(1).unwrap_or_else(|| "udp".into()).parse()?;
    let addrs = [free_addr(), free_addr(), free_addr()];
    let mut opts = Options::default();
    opts.frame_len = frame_len(DIM);
    opts.recv_timeout = Some(Duration::from_millis(200));
    let steps = 100;
    // Each stage opens its transport in its own thread, as separate
    // processes (or machines) would; TCP connects concurrently.
    let endpoint =
        |i: usize| Endpoint::new(addrs[i], addrs[(i + 1) % 3]).with_prev(addrs[(i + 2) % 3]).with_iface("lo");
    let mut workers = Vec::new();
    for i in [1usize, 2] {
        let (ep, opts) = (endpoint(i), opts.clone());
        workers.push(std::thread::spawn(move || {
            let t = open(kind, &ep, &opts).expect("open a middle stage");
            // Stage 1 doubles, stage 2 adds one.
            if i == 1 { stage(t, steps, |v| v * 2.0) } else { stage(t, steps, |v| v + 1.0) }
        }));
    }
    let mut head = open(kind, &endpoint(0), &opts)?;
    // Let UDP stages bind before the first frame (TCP waits by itself).
    std::thread::sleep(Duration::from_millis(100));
    let x = |pos: i32, i: usize| (i as f32) * 0.001 + pos as f32;
    for pos in 0..steps as i32 {
        // The head writes its frame where the transport sends it from.
        head.send_next_with(FrameKind::Data, frame_len(DIM), &mut |buf| {
            buf[..FrameHeader::LEN].copy_from_slice(&FrameHeader { pos, flags: FrameHeader::REPLY }.to_bytes());
            for (i, v) in buf[FrameHeader::LEN..].chunks_exact_mut(4).enumerate() {
                v.copy_from_slice(&x(pos, i).to_ne_bytes());
            }
        })?;
        let back = loop {
            match head.recv_prev_lent() {
                Ok(f) => break f,
                Err(e) if e.is_timeout() => continue,
                Err(e) => return Err(e.into()),
            }
        };
        assert_eq!(back.len(), frame_len(DIM));
        assert_eq!(FrameHeader::read(&back).expect("header").pos, pos, "frames come back in order");
        let ok = back[FrameHeader::LEN..]
            .chunks_exact(4)
            .enumerate()
            .all(|(i, b)| (x(pos, i) * 2.0 + 1.0 - f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).abs() < 1e-3);
        assert!(ok, "stage arithmetic");
    }
    for w in workers {
        w.join().expect("stage thread")?;
    }
    let s = head.stats();
    println!(
        "{steps} steps through 3 stages over {kind}: ok ({} frames sent, {} received)",
        s.frames_sent, s.frames_received
    );
    Ok(())
}
