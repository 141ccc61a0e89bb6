//! After warm-up, moving frames over the UDP backend allocates nothing:
//! send (chunking, GSO batch, retransmit buffer) and receive (batch,
//! reassembly) reuse their buffers.

mod support;

use std::net::{SocketAddr, UdpSocket};

use leap::Transport;
use leap::transport::udp::{UdpConfig, UdpTransport};

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

fn free_addr() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn udp_send_and_receive_allocate_nothing_per_frame_after_warm_up() {
    let (a, b) = (free_addr(), free_addr());
    let mut ca = UdpConfig::new(a, b);
    ca.prev = Some(b);
    let mut cb = UdpConfig::new(b, a);
    cb.prev = Some(a);
    let mut ta = UdpTransport::bind(ca).unwrap();
    let mut tb = UdpTransport::bind(cb).unwrap();
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
