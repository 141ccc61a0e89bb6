//! `leap flood` (hidden, for tests): sends a bounded number of random and
//! malformed LEAP packets at one address, the hostile input the XDP program
//! and the kernel module must drop and count without harm. Only for
//! addresses the caller owns (loopback, or a namespace it created).

use std::net::{SocketAddr, UdpSocket};

use anyhow::{Context, Result, bail};
use clap::Args;
use leap_common::chunk::{CHUNK_PAYLOAD_MAX, ChunkHeader, LEAP_MAGIC, flags};

/// Arguments of `leap flood`.
#[derive(Debug, Clone, Args)]
pub struct FloodArgs {
    /// Where to send (must be loopback or an address of a namespace you made).
    #[arg(long)]
    pub target: SocketAddr,
    /// Packets to send (at most 10 000 000).
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// Seed of the generator (the run is reproducible).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Source sockets to rotate through (different source ports).
    #[arg(long, default_value_t = 8)]
    pub sources: usize,
    /// Send from this address; with a port, from that one socket only (to
    /// pass a peer filter and reach the parser).
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// Only packets that break the format (no well-formed chunks of
    /// made-up frames): what a receiver must drop even from its real peer.
    /// Well-formed chunks from a spoofed peer address are indistinguishable
    /// from the peer's, as with any unauthenticated UDP or TCP.
    #[arg(long)]
    pub malformed_only: bool,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One hostile datagram into `buf`; returns its length. Kinds: random bytes,
/// short, wrong magic, chunk_id >= total, total 0, oversize payload (which
/// the network fragments when it exceeds the MTU), a non-last chunk that is
/// short, totals that disagree for one seq, a total too big for a bank,
/// NACKs with nonsense, and plausible chunks of frames nobody sends.
fn craft(rng: &mut Rng, buf: &mut [u8], malformed_only: bool) -> usize {
    let seq = (rng.below(8)) as u16; // few seqs, so that totals collide
    const MALFORMED: [u64; 7] = [1, 2, 3, 4, 5, 6, 8];
    let kind = if malformed_only { MALFORMED[rng.below(MALFORMED.len() as u64) as usize] } else { rng.below(11) };
    let fill = |rng: &mut Rng, b: &mut [u8]| b.iter_mut().for_each(|x| *x = rng.next() as u8);
    match kind {
        0 => {
            let n = rng.below(1600) as usize;
            fill(rng, &mut buf[..n]);
            n
        }
        1 => {
            let n = rng.below(12) as usize;
            buf[..n].copy_from_slice(&LEAP_MAGIC.to_be_bytes().repeat(3)[..n]);
            n
        }
        2 => {
            let mut h = ChunkHeader::data(seq, 0, 2).to_bytes();
            h[rng.below(4) as usize] ^= 0x20;
            buf[..12].copy_from_slice(&h);
            12 + CHUNK_PAYLOAD_MAX
        }
        3 => {
            let total = 1 + rng.below(20) as u16;
            ChunkHeader::data(seq, total + rng.below(100) as u16, total).write(buf);
            12 + CHUNK_PAYLOAD_MAX
        }
        4 => {
            ChunkHeader::data(seq, 0, 0).write(buf);
            12 + rng.below(CHUNK_PAYLOAD_MAX as u64) as usize
        }
        5 => {
            // Oversize: beyond 1400 bytes, up to 3000 (fragmented on a 1500 MTU).
            ChunkHeader::data(seq, rng.below(4) as u16, 4).write(buf);
            12 + CHUNK_PAYLOAD_MAX + 1 + rng.below(1600) as usize
        }
        6 => {
            ChunkHeader::data(seq, 0, 3).write(buf);
            12 + rng.below(CHUNK_PAYLOAD_MAX as u64) as usize
        }
        7 => {
            let total = [2u16, 5, 90, 200][rng.below(4) as usize];
            ChunkHeader::data(seq, rng.below(u64::from(total)) as u16, total).write(buf);
            12 + CHUNK_PAYLOAD_MAX
        }
        8 => {
            ChunkHeader::data(seq, rng.below(60_000) as u16, u16::MAX).write(buf);
            12 + CHUNK_PAYLOAD_MAX
        }
        9 => {
            let h =
                ChunkHeader { seq, chunk_id: 0, total_chunks: rng.below(400) as u16 + 1, reserved: flags::LEAP | 2 };
            h.write(buf);
            12 + rng.below(1400) as usize
        }
        _ => {
            let total = 1 + rng.below(12) as u16;
            let id = rng.below(u64::from(total)) as u16;
            let h =
                ChunkHeader { seq: rng.next() as u16, chunk_id: id, total_chunks: total, reserved: rng.next() as u16 };
            h.write(buf);
            let n = if id + 1 == total { 1 + rng.below(1400) as usize } else { CHUNK_PAYLOAD_MAX };
            fill(rng, &mut buf[12..12 + n]);
            12 + n
        }
    }
}

/// Runs `leap flood`.
///
/// # Errors
///
/// A target that is not loopback or private, or a socket error.
pub fn main(args: &FloodArgs) -> Result<()> {
    let ip = args.target.ip();
    let local = ip.is_loopback()
        || match ip {
            std::net::IpAddr::V4(v4) => v4.is_private(),
            std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xfe00) == 0xfc00,
        };
    if !local {
        bail!("--target {ip}: leap flood only targets loopback or private addresses of test namespaces");
    }
    if args.count > 10_000_000 {
        bail!("--count {}: at most 10 000 000", args.count);
    }
    let any: std::net::IpAddr = if ip.is_ipv4() { [0, 0, 0, 0].into() } else { std::net::Ipv6Addr::UNSPECIFIED.into() };
    let bind = args.bind.unwrap_or(SocketAddr::new(any, 0));
    let n = if bind.port() != 0 { 1 } else { args.sources.clamp(1, 64) };
    let socks: Vec<UdpSocket> =
        (0..n).map(|_| UdpSocket::bind(bind)).collect::<Result<_, _>>().context("binding the flood's sockets")?;
    let mut rng = Rng(args.seed.max(1) * 0x9E37_79B9_7F4A_7C15);
    let mut buf = vec![0u8; 4096];
    let mut sent = 0u64;
    let mut refused = 0u64;
    for i in 0..args.count {
        let n = craft(&mut rng, &mut buf, args.malformed_only);
        let s = &socks[(i as usize) % socks.len()];
        match s.send_to(&buf[..n], args.target) {
            Ok(_) => sent += 1,
            // ICMP port unreachable from an earlier packet, or a full queue.
            Err(_) => refused += 1,
        }
        if i % 1024 == 1023 {
            std::thread::yield_now();
        }
    }
    println!("{{\"sent\":{sent},\"refused\":{refused}}}");
    Ok(())
}
