//! After warm-up, moving a frame through the XDP backend (send through UDP,
//! receive through AF_XDP or the ring buffer, reassemble) allocates nothing
//! on either node, through the copying API and through the lending one
//! (`send_next_with`, `relay`, `recv_prev_lent`). Needs root and BPF:
//! `cargo xtask ci`.

mod xdp_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use leap::netns::{NodeNet, Topology};
use leap::transport::udp::UdpConfig;
use leap::transport::xdp::{Delivery, XdpTransport, XdpTransportConfig};
use leap::{FrameKind, Transport};
use xdp_common::{in_netns, object, pattern};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether allocations of this thread are counted.
    static COUNT: Cell<bool> = const { Cell::new(false) };
}

fn counted() {
    if COUNT.with(Cell::get) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const LEN: usize = 16392;
const WARM_UP: usize = 100;
const MEASURED: usize = 500;

fn transport(node: &NodeNet, peer: &NodeNet, delivery: Delivery) -> XdpTransport {
    let me = SocketAddr::from((node.addr, 9999));
    let other = SocketAddr::from((peer.addr, 9999));
    let mut udp = UdpConfig::new(me, other);
    udp.prev = Some(other);
    udp.max_frame_len = LEN;
    udp.recv_timeout = Some(Duration::from_secs(2));
    let mut cfg = XdpTransportConfig::new(&node.rx_iface, udp, delivery);
    cfg.object = object();
    XdpTransport::open(cfg).unwrap()
}

fn no_allocations_per_frame(delivery: Delivery) {
    let topo = Topology::ring(&xdp_common::unique("lxm"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let ready = Arc::new(Barrier::new(2));
    ALLOCS.store(0, Ordering::SeqCst);
    let echo = {
        let (n0, n1, ready) = (n0.clone(), n1.clone(), ready.clone());
        std::thread::spawn(move || {
            in_netns(n1.path(), move || {
                let mut t = transport(&n1, &n0, delivery);
                let mut buf = vec![0u8; LEN];
                ready.wait();
                for i in 0..WARM_UP + MEASURED {
                    COUNT.with(|c| c.set(i >= WARM_UP));
                    if i % 2 == 0 {
                        let got = t.recv_prev(&mut buf).unwrap();
                        t.send_next(&buf[..got.len]).unwrap();
                    } else {
                        // The lending API: read in place, write in place.
                        t.relay(&mut buf, &mut |input, out| out.copy_from_slice(input)).unwrap();
                    }
                }
                COUNT.with(|c| c.set(false));
            })
        })
    };
    in_netns(n0.path(), move || {
        let mut t = transport(&n0, &n1, delivery);
        let frame = pattern(1, LEN);
        let mut buf = vec![0u8; LEN];
        ready.wait();
        for i in 0..WARM_UP + MEASURED {
            COUNT.with(|c| c.set(i >= WARM_UP));
            if i % 2 == 0 {
                t.send_next(&frame).unwrap();
                let got = t.recv_prev(&mut buf).unwrap();
                assert_eq!(got.len, LEN);
            } else {
                t.send_next_with(FrameKind::Data, LEN, &mut |out| out.copy_from_slice(&frame)).unwrap();
                assert!(*t.recv_prev_lent().unwrap() == frame[..]);
            }
        }
        COUNT.with(|c| c.set(false));
        assert!(buf == frame);
    });
    echo.join().unwrap();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), 0, "allocations in {MEASURED} round trips");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn af_xdp_path_allocates_nothing_per_frame() {
    no_allocations_per_frame(Delivery::Xsk);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_path_allocates_nothing_per_frame() {
    no_allocations_per_frame(Delivery::RingBuf);
}
