//! The toy three-stage pipeline of `examples/pipeline.rs` on tokio: each
//! stage is a task on one current-thread runtime, with its UDP transport
//! split into an async sender and receiver. A stage awaits the next frame
//! (lent in place by its transport), computes, and writes its output where
//! the transport sends from; while it computes, the transport's driver
//! answers the next stage's NACKs.
//!
//! ```sh
//! cargo run --example async_pipeline --features tokio
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use leap::FrameKind;
use leap::transport::udp::{AsyncUdp, UdpConfig, UdpTransport};
use leap_common::frame::{FrameHeader, frame_len};

const DIM: usize = 4096;
const STEPS: i32 = 100;

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

fn open(addrs: &[SocketAddr; 3], i: usize) -> Result<AsyncUdp, Box<dyn std::error::Error>> {
    let mut cfg = UdpConfig::new(addrs[i], addrs[(i + 1) % 3]);
    cfg.prev = Some(addrs[(i + 2) % 3]);
    cfg.max_frame_len = frame_len(DIM);
    cfg.recv_timeout = Some(Duration::from_secs(2));
    Ok(UdpTransport::bind(cfg)?.into_async()?)
}

/// Reads activation `i` of a frame.
fn act(frame: &[u8], i: usize) -> f32 {
    let at = FrameHeader::LEN + 4 * i;
    f32::from_ne_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]])
}

/// A middle stage: `STEPS` times, await a frame, apply `layer` from the lent
/// frame into the outgoing one.
async fn stage(t: AsyncUdp, layer: fn(f32) -> f32) -> Result<(), leap::TransportError> {
    let (mut tx, mut rx) = t.split();
    for _ in 0..STEPS {
        let frame = rx.recv_prev_lent().await?;
        tx.send_next_with(FrameKind::Data, frame.len(), |out| {
            out[..FrameHeader::LEN].copy_from_slice(&frame[..FrameHeader::LEN]);
            for (i, o) in out[FrameHeader::LEN..].chunks_exact_mut(4).enumerate() {
                o.copy_from_slice(&layer(act(&frame, i)).to_ne_bytes());
            }
        })
        .await?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let addrs = [free_addr(), free_addr(), free_addr()];
        let mut head = open(&addrs, 0)?;
        // Stage 1 doubles, stage 2 adds one.
        let s1 = tokio::spawn(stage(open(&addrs, 1)?, |v| v * 2.0));
        let s2 = tokio::spawn(stage(open(&addrs, 2)?, |v| v + 1.0));
        let x = |pos: i32, i: usize| (i as f32) * 0.001 + pos as f32;
        for pos in 0..STEPS {
            head.send_next_with(FrameKind::Data, frame_len(DIM), |buf| {
                buf[..FrameHeader::LEN].copy_from_slice(&FrameHeader { pos, flags: FrameHeader::REPLY }.to_bytes());
                for (i, v) in buf[FrameHeader::LEN..].chunks_exact_mut(4).enumerate() {
                    v.copy_from_slice(&x(pos, i).to_ne_bytes());
                }
            })
            .await?;
            let back = head.recv_prev_lent().await?;
            assert_eq!(FrameHeader::read(&back).expect("header").pos, pos, "frames come back in order");
            assert!((0..DIM).all(|i| (x(pos, i) * 2.0 + 1.0 - act(&back, i)).abs() < 1e-3), "stage arithmetic");
        }
        s1.await??;
        s2.await??;
        let s = head.stats();
        println!(
            "{STEPS} steps through 3 async stages over udp: ok ({} frames sent, {} received)",
            s.frames_sent, s.frames_received
        );
        Ok(())
    })
}
