//! A toy three-stage pipeline through the `Transport` trait, the way an
//! inference engine would use leap: stage 0 embeds a token into activations
//! and sends them on; stage 1 and 2 each apply "their layers" (here a scale
//! and a shift) and pass the result on; stage 2's output comes back to stage
//! 0, which reads the "logits". Runs on loopback with UDP; swap the
//! transport kind for TCP, XDP or the kernel module.
//!
//! ```sh
//! cargo run --example pipeline -- udp
//! ```

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use leap::transport::open::{Endpoint, Options, TransportKind, open};
use leap::{FrameKind, Transport};
use leap_common::frame::{FrameHeader, frame_len};

const DIM: usize = 4096;

fn free_addr() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("a free loopback port")
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A middle stage: receive, apply `layer`, forward. Stops after `steps`.
fn stage(mut t: Box<dyn Transport>, steps: usize, layer: impl Fn(&mut [f32])) -> Result<(), leap::TransportError> {
    let mut buf = vec![0u8; frame_len(DIM)];
    let mut done = 0;
    while done < steps {
        let got = match t.recv_prev(&mut buf) {
            Ok(got) => got,
            Err(e) if e.is_timeout() => continue,
            Err(e) => return Err(e),
        };
        if got.kind == FrameKind::Control {
            continue;
        }
        let hdr = FrameHeader::read(&buf).expect("frames carry a header");
        let mut x = from_bytes(&buf[FrameHeader::LEN..got.len]);
        layer(&mut x);
        t.send_multipart_next(&hdr.to_bytes(), &to_bytes(&x))?;
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
    for (i, layer) in [(1, 2.0f32), (2, 1.0)] {
        let (ep, opts) = (endpoint(i), opts.clone());
        workers.push(std::thread::spawn(move || {
            let t = open(kind, &ep, &opts).expect("open a middle stage");
            // Stage 1 doubles, stage 2 adds one.
            if i == 1 {
                stage(t, steps, move |x| x.iter_mut().for_each(|v| *v *= layer))
            } else {
                stage(t, steps, move |x| x.iter_mut().for_each(|v| *v += layer))
            }
        }));
    }
    let mut head = open(kind, &endpoint(0), &opts)?;
    // Let UDP stages bind before the first frame (TCP waits by itself).
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = vec![0u8; frame_len(DIM)];
    for pos in 0..steps as i32 {
        let x: Vec<f32> = (0..DIM).map(|i| (i as f32) * 0.001 + pos as f32).collect();
        let hdr = FrameHeader { pos, flags: FrameHeader::REPLY };
        head.send_multipart_next(&hdr.to_bytes(), &to_bytes(&x))?;
        let got = loop {
            match head.recv_prev(&mut buf) {
                Ok(got) => break got,
                Err(e) if e.is_timeout() => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let back = FrameHeader::read(&buf).expect("header");
        let y = from_bytes(&buf[FrameHeader::LEN..got.len]);
        assert_eq!(back.pos, pos, "frames come back in order");
        assert!(x.iter().zip(&y).all(|(a, b)| (a * 2.0 + 1.0 - b).abs() < 1e-3), "stage arithmetic");
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
