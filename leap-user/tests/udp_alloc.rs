//! After warm-up, moving frames over the UDP backend allocates nothing:
//! send (chunking, GSO batch, retransmit buffer) and receive (batch,
//! reassembly) reuse their buffers.

mod support;

use std::net::SocketAddr;

use leap::{FrameKind, Transport};

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

#[test]
fn udp_send_and_receive_allocate_nothing_per_frame_after_warm_up() {
    let (mut ta, mut tb) = support::udp_pair();
    let header = [7u8; 8];
    let payload = vec![3u8; 16384];
    let mut buf = vec![0u8; 1 << 20];
    let mut round = |n: usize| {
        for _ in 0..n {
            ta.send_multipart_next(&header, &payload).unwrap();
            let got = tb.recv_prev(&mut buf).unwrap();
            assert_eq!(got.len, 16392);
        }
    };
    // Warm-up: every retransmit-buffer slot and batch vector reaches size.
    round(100);
    let before = support::allocations();
    round(2000);
    assert_eq!(support::allocations(), before, "allocations on the frame path");
}

#[test]
fn the_lending_api_allocates_nothing_per_frame_after_warm_up() {
    // A writes frames in place, B relays them back (reads in place, writes
    // in place), A reads them lent: no allocation on any of these paths.
    let (mut ta, mut tb) = support::udp_pair();
    let mut control = vec![0u8; 16392];
    let mut round = |n: usize| {
        for i in 0..n {
            ta.send_next_with(FrameKind::Data, 16392, &mut |buf| buf.fill(i as u8)).unwrap();
            let got = tb.relay(&mut control, &mut |input, out| out.copy_from_slice(input)).unwrap();
            assert_eq!((got.len, got.kind), (16392, FrameKind::Data));
            let back = ta.recv_prev_lent().unwrap();
            assert!(back.len() == 16392 && back.iter().all(|&x| x == i as u8));
        }
    };
    round(100);
    let before = support::allocations();
    round(2000);
    assert_eq!(support::allocations(), before, "allocations on the lending path");
    assert_eq!(ta.stats().frames_received, 2100);
}

#[test]
fn tcp_allocates_nothing_per_frame_after_warm_up_either_way() {
    use leap::transport::tcp::{TcpConfig, TcpTransport};
    let (a, b) = (free_addr(), free_addr());
    let cb = TcpConfig::new(b, a, 16392);
    // Each side connects to the other while accepting: set up concurrently.
    let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
    let mut ta = TcpTransport::connect(TcpConfig::new(a, b, 16392)).unwrap();
    let mut tb = tb.join().unwrap();
    let frame = vec![5u8; 16392];
    let mut buf = vec![0u8; 16392];
    let mut control = vec![0u8; 16392];
    let mut round = |n: usize| {
        for i in 0..n {
            // Copying API one way, lending API the other.
            ta.send_next(&frame).unwrap();
            assert_eq!(tb.recv_prev(&mut buf).unwrap().len, 16392);
            tb.send_next_with(FrameKind::Data, 16392, &mut |out| out.fill(i as u8)).unwrap();
            assert!(ta.recv_prev_lent().unwrap().iter().all(|&x| x == i as u8));
            ta.send_next_with(FrameKind::Data, 16392, &mut |out| out.fill(1)).unwrap();
            tb.relay(&mut control, &mut |input, out| out.copy_from_slice(input)).unwrap();
            assert_eq!(ta.recv_prev(&mut buf).unwrap().len, 16392);
        }
    };
    round(50);
    let before = support::allocations();
    round(1000);
    assert_eq!(support::allocations(), before, "allocations on the TCP frame paths");
}
