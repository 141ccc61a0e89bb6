//! The path MTU across network namespaces linked by veth pairs (root): a
//! spoofed ICMP "fragmentation needed" quoting a node's ports changes
//! nothing for it (it would lower the kernel's path MTU below a chunk for
//! ten minutes and make every GSO send fail), an interface whose MTU
//! changes while leap runs gets trains that fit it, GSO kept, and one
//! below a chunk gets fragmented chunks.

mod support;
mod xdp_common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::time::{Duration, Instant};

use leap::Transport;
use leap::netns::Topology;
use leap::sys::udp::RouteProbe;
use leap::transport::udp::{UdpConfig, UdpTransport};
use xdp_common::{in_netns, pattern, unique};

const FRAME: usize = 16_392;
const PORT: u16 = 47_100;

/// Two leap nodes in the namespaces of a 2-node ring, node 0 sending to
/// node 1, proven to each other.
fn pair(t: &Topology) -> (UdpTransport, UdpTransport) {
    let addr = |i: usize| SocketAddr::V4(SocketAddrV4::new(t.nodes()[i].addr, PORT));
    let bind = |i: usize| {
        let mut c = UdpConfig::new(addr(i), addr(1 - i));
        c.prev = Some(addr(1 - i));
        c.max_frame_len = FRAME;
        in_netns(t.nodes()[i].path(), move || UdpTransport::bind(c).unwrap())
    };
    let (mut a, mut b) = (bind(0), bind(1));
    support::prove_link(&mut a, &mut b, Duration::from_secs(2));
    (a, b)
}

/// Sends `n` frames from `a` to `b`, each checked, and returns the
/// datagrams per frame `a` sent.
fn datagrams_per_frame(a: &mut UdpTransport, b: &mut UdpTransport, n: u32) -> f64 {
    let before = a.stats();
    let mut out = vec![0u8; FRAME];
    for i in 0..n {
        let f = pattern(i, FRAME);
        a.send_next(&f).unwrap();
        let got = b.recv_prev(&mut out).unwrap();
        assert!(out[..got.len] == f[..], "frame {i} differs");
    }
    let s = a.stats();
    assert_eq!(s.send_errors, before.send_errors, "{s:?}");
    (s.datagrams_sent - before.datagrams_sent) as f64 / f64::from(n)
}

fn ip(netns: &str, args: &[&str]) {
    let out = Command::new("ip").args(["-n", netns]).args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Sends ICMP `messages` to `to` from inside the namespace at `path`.
fn send_icmp(path: std::path::PathBuf, to: Ipv4Addr, messages: Vec<Vec<u8>>) {
    in_netns(path, move || support::send_icmp(to, &messages));
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn a_spoofed_fragmentation_needed_changes_nothing_for_a_leap_node() {
    let t = Topology::ring_with_mtu(&unique("pm"), 2, Some(9000)).unwrap();
    let (n0, n1) = (t.nodes()[0].clone(), t.nodes()[1].clone());
    // A second address in node 1's namespace, for the control below.
    let other = Ipv4Addr::new(10, 77, 9, 9);
    ip(&n1.netns, &["addr", "add", &format!("{other}/32"), "dev", &n1.rx_iface]);
    ip(&n0.netns, &["route", "add", &format!("{other}/32"), "dev", &n0.tx_iface]);
    let (mut a, mut b) = pair(&t);
    assert_eq!(datagrams_per_frame(&mut a, &mut b, 20), 2.0);
    assert_eq!(a.send_shape(), (6, true));

    // The control: an ordinary UDP socket of node 0 (to `other`), and a
    // probe that reads the path MTU towards `other`.
    let (ctl_src, ctl_dst) = (SocketAddrV4::new(n0.addr, PORT + 1), SocketAddrV4::new(other, PORT + 1));
    let (ctl, probe) = in_netns(n0.path(), move || {
        let ctl = std::net::UdpSocket::bind(ctl_src).unwrap();
        (ctl, RouteProbe::connect(SocketAddr::V4(ctl_src), SocketAddr::V4(ctl_dst)).unwrap())
    });
    assert_eq!(probe.mtu().unwrap(), 9000);
    // Node 0 is told that datagrams of its leap socket, and of the ordinary
    // one, need 552 bytes, the smallest path MTU Linux takes.
    let leap = (SocketAddrV4::new(n0.addr, PORT), SocketAddrV4::new(n1.addr, PORT));
    send_icmp(
        n1.path(),
        n0.addr,
        vec![support::icmp_frag_needed(leap.0, leap.1, 552), support::icmp_frag_needed(ctl_src, ctl_dst, 552)],
    );
    // Bounded: the kernel takes the ICMP in its receive softirq.
    let until = Instant::now() + Duration::from_secs(2);
    while probe.mtu().unwrap() != 552 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(probe.mtu().unwrap(), 552, "the ordinary socket's path MTU did not fall: no ICMP arrived?");

    // The leap node keeps its trains and GSO, loses and re-sends nothing,
    // and the kernel's path MTU towards node 1 is untouched.
    assert_eq!(datagrams_per_frame(&mut a, &mut b, 20), 2.0);
    assert_eq!(a.send_shape(), (6, true));
    let to_next = in_netns(n0.path(), move || {
        RouteProbe::connect(SocketAddr::V4(leap.0), SocketAddr::V4(leap.1)).unwrap().mtu().unwrap()
    });
    assert_eq!(to_next, 9000);
    support::assert_nothing_lost(&b.stats(), "node 0 to node 1");
    drop(ctl);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn trains_follow_an_interface_mtu_changed_while_leap_runs() {
    let t = Topology::ring_with_mtu(&unique("pm"), 2, Some(9000)).unwrap();
    let n0 = t.nodes()[0].clone();
    let (mut a, mut b) = pair(&t);
    assert_eq!(datagrams_per_frame(&mut a, &mut b, 10), 2.0);

    // 1 500 bytes hold one chunk: the kernel refuses the next frame's GSO
    // trains, that frame goes out as whole trains (fragmented), every later
    // one as single chunks, GSO still on.
    ip(&n0.netns, &["link", "set", &n0.tx_iface, "mtu", "1500"]);
    let first = datagrams_per_frame(&mut a, &mut b, 1);
    assert!(first == 2.0 || first == 12.0, "{first}");
    assert_eq!(datagrams_per_frame(&mut a, &mut b, 10), 12.0);
    assert_eq!(a.send_shape(), (1, true));

    // Back to 9 000: within a second trains again.
    ip(&n0.netns, &["link", "set", &n0.tx_iface, "mtu", "9000"]);
    std::thread::sleep(Duration::from_millis(1100));
    datagrams_per_frame(&mut a, &mut b, 1);
    assert_eq!(datagrams_per_frame(&mut a, &mut b, 10), 2.0);
    assert_eq!(a.send_shape(), (6, true));
    support::assert_nothing_lost(&b.stats(), "node 0 to node 1");
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn an_interface_mtu_below_a_chunk_gets_fragmented_chunks() {
    // 1 420 bytes (WireGuard's MTU) is below a chunk's 1 440-byte datagram:
    // the kernel refuses GSO at that size (EMSGSIZE on 6.x, EINVAL before),
    // so one datagram per chunk, fragmented, every frame intact.
    let t = Topology::ring_with_mtu(&unique("pm"), 2, Some(1420)).unwrap();
    let (mut a, mut b) = pair(&t);
    assert_eq!(datagrams_per_frame(&mut a, &mut b, 20), 12.0);
    assert_eq!(a.send_shape(), (1, false));
    support::assert_nothing_lost(&b.stats(), "node 0 to node 1");
}
