//! AF_XDP on an interface with two receive queues: one socket per queue,
//! each in the XSKMAP at its queue index, and every chunk reaches user space
//! through AF_XDP whichever queue the flow hashes to; by default every queue
//! is bound, and chunks on a queue without a socket are warned about once.
//! Needs root and BPF:
//! `cargo xtask ci`.

mod xdp_common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use leap::Transport;
use leap::netns::{NodeNet, Topology, exec_in};
use leap::transport::config::Reliability;
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap::transport::xdp::{AttachMode, Delivery, XdpTransport, XdpTransportConfig};
use leap_common::xdp::Counter;
use xdp_common::{in_netns, object, pattern};

/// A veth pair with two queues each way from `n0` (`rx_if`, `NET.1`) to
/// `n1` (`tx_if`, `NET.2`); it goes with the namespaces.
fn two_queue_link(n0: &NodeNet, n1: &NodeNet, rx_if: &str, tx_if: &str, net: &str) {
    let st = Command::new("ip")
        .args(["link", "add", rx_if, "netns", &n0.netns, "numrxqueues", "2", "numtxqueues", "2", "type", "veth"])
        .args(["peer", "name", tx_if, "netns", &n1.netns, "numrxqueues", "2", "numtxqueues", "2"])
        .status()
        .unwrap();
    assert!(st.success());
    exec_in(&n0.netns, &["ip", "addr", "add", &format!("{net}.1/24"), "dev", rx_if]).unwrap();
    exec_in(&n1.netns, &["ip", "addr", "add", &format!("{net}.2/24"), "dev", tx_if]).unwrap();
    exec_in(&n0.netns, &["ip", "link", "set", rx_if, "up"]).unwrap();
    exec_in(&n1.netns, &["ip", "link", "set", tx_if, "up"]).unwrap();
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn every_receive_queue_gets_its_own_socket() {
    let topo = Topology::ring(&xdp_common::unique("lxq"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    // A two-queue veth pair between the test's namespaces; it goes with them.
    let (rx_if, tx_if) = ("lxqm0", "lxqm1");
    two_queue_link(&n0, &n1, rx_if, tx_if, "10.78.0");
    let (me, peer): (SocketAddr, SocketAddr) = ("10.78.0.1:9999".parse().unwrap(), "10.78.0.2:9999".parse().unwrap());
    let frames = 200usize;
    let ready = Arc::new(Barrier::new(2));

    let receiver = {
        let ready = ready.clone();
        std::thread::spawn(move || {
            in_netns(n0.path(), move || {
                let mut udp = UdpConfig::new(me, peer);
                udp.prev = Some(peer);
                udp.reliability = Reliability::BestEffort;
                udp.recv_timeout = Some(Duration::from_secs(2));
                let mut cfg = XdpTransportConfig::new(rx_if, udp, Delivery::Xsk);
                cfg.object = object();
                cfg.mode = AttachMode::Drv;
                cfg.queues = vec![0, 1];
                let mut t = XdpTransport::open(cfg).unwrap();
                ready.wait();
                let mut buf = vec![0u8; 16392];
                for i in 0..frames {
                    let got = t.recv_prev(&mut buf).unwrap_or_else(|e| panic!("frame {i}: {e}"));
                    assert!(buf[..got.len] == pattern(i as u32, 16392)[..], "frame {i}");
                }
                (t.xdp_counters().unwrap(), t.chunks_via_kernel())
            })
        })
    };
    in_netns(n1.path(), move || {
        let mut udp = UdpConfig::new(peer, me);
        udp.reliability = Reliability::BestEffort;
        let mut t = UdpTransport::bind(udp).unwrap();
        ready.wait();
        for i in 0..frames {
            t.send_next(&pattern(i as u32, 16392)).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let (c, via_kernel) = receiver.join().unwrap();
    assert_eq!(c.get(Counter::ToXsk), frames as u64 * 12, "{c}");
    assert_eq!(c.get(Counter::NoSocket), 0, "{c}");
    assert_eq!(via_kernel, 0);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn flows_spread_over_queues_all_reach_their_queues_socket() {
    use leap::transport::xdp::packet::parse_udp;
    use leap::transport::xdp::{XdpProgram, XskConfig, XskSocket};
    use leap_common::chunk::ChunkHeader;
    use leap_common::xdp::{XdpConfig, delivery};

    let topo = Topology::ring(&xdp_common::unique("lxp"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let (rx_if, tx_if) = ("lxpm0", "lxpm1");
    two_queue_link(&n0, &n1, rx_if, tx_if, "10.79.0");
    let flows = 32u16;
    let ready = Arc::new(Barrier::new(2));
    let sent = Arc::new(Barrier::new(2));
    let receiver = {
        let (ready, sent) = (ready.clone(), sent.clone());
        std::thread::spawn(move || {
            in_netns(n0.path(), move || {
                let mut prog = XdpProgram::load(&object()).unwrap();
                prog.add_port(9999).unwrap();
                let mut socks: Vec<XskSocket> =
                    (0..2).map(|q| XskSocket::open(rx_if, q, &XskConfig::default()).unwrap()).collect();
                for s in &socks {
                    prog.register_xsk(s.queue(), s.fd()).unwrap();
                }
                prog.configure(&XdpConfig { delivery: delivery::XSK, ..XdpConfig::default() }).unwrap();
                prog.attach(rx_if, AttachMode::Drv).unwrap();
                ready.wait();
                sent.wait();
                std::thread::sleep(Duration::from_millis(100));
                let mut per_queue = [0u32; 2];
                let mut sources = Vec::new();
                for (q, s) in socks.iter_mut().enumerate() {
                    per_queue[q] = s.recv(256, |f| sources.push(parse_udp(f).unwrap().src.port()));
                }
                sources.sort_unstable();
                (per_queue, sources, prog.counters().unwrap())
            })
        })
    };
    in_netns(n1.path(), move || {
        ready.wait();
        for i in 0..flows {
            let s = std::net::UdpSocket::bind(("10.79.0.2", 20000 + i)).unwrap();
            let mut d = ChunkHeader::data(i, 0, 1).to_bytes().to_vec();
            d.extend_from_slice(&[1; 32]);
            s.send_to(&d, "10.79.0.1:9999").unwrap();
        }
        sent.wait();
    });
    let (per_queue, sources, c) = receiver.join().unwrap();
    assert_eq!(sources, (20000..20000 + flows).collect::<Vec<_>>(), "{c}");
    assert_eq!(c.get(Counter::ToXsk), u64::from(flows), "{c}");
    assert_eq!(c.get(Counter::NoSocket), 0, "{c}");
    assert!(per_queue.iter().all(|&n| n > 0), "32 flows should use both queues: {per_queue:?}");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn by_default_every_receive_queue_is_bound() {
    use leap::transport::config::{Endpoint, Options};
    use leap::transport::xdp::open_endpoint;

    let topo = Topology::ring(&xdp_common::unique("lxa"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let (rx_if, tx_if) = ("lxam0", "lxam1");
    two_queue_link(&n0, &n1, rx_if, tx_if, "10.80.0");
    let queues = in_netns(n0.path(), move || {
        let ep = Endpoint::new("10.80.0.1:9999".parse().unwrap(), "10.80.0.2:9999".parse().unwrap()).with_iface(rx_if);
        let mut opts = Options::default();
        opts.xdp_object = match object() {
            leap::transport::xdp::ObjectSource::File(p) => Some(p),
            _ => None,
        };
        let t = open_endpoint(Delivery::Xsk, &ep, &opts).unwrap();
        t.queues().to_vec()
    });
    assert_eq!(queues, [0, 1], "the default binds every receive queue");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn chunks_on_a_queue_without_a_socket_warn_once() {
    use leap_common::chunk::ChunkHeader;

    let topo = Topology::ring(&xdp_common::unique("lxw"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let (rx_if, tx_if) = ("lxwm0", "lxwm1");
    two_queue_link(&n0, &n1, rx_if, tx_if, "10.81.0");
    let (me, peer): (SocketAddr, SocketAddr) = ("10.81.0.1:9999".parse().unwrap(), "10.81.0.2:9999".parse().unwrap());
    let ready = Arc::new(Barrier::new(2));
    let sent = Arc::new(Barrier::new(2));
    // 32 single-chunk flows from different ports: RSS puts some on queue 1.
    let flows = |round: u16| {
        for i in 0..32u16 {
            let s = std::net::UdpSocket::bind(("10.81.0.2", 21000 + i)).unwrap();
            let mut d = ChunkHeader::data(round * 32 + i, 0, 1).to_bytes().to_vec();
            d.extend_from_slice(&[1; 32]);
            s.send_to(&d, "10.81.0.1:9999").unwrap();
        }
    };
    let receiver = {
        let (ready, sent) = (ready.clone(), sent.clone());
        std::thread::spawn(move || {
            in_netns(n0.path(), move || {
                let mut udp = UdpConfig::new(me, peer);
                udp.reliability = Reliability::BestEffort;
                udp.recv_timeout = Some(Duration::from_millis(100));
                let mut cfg = XdpTransportConfig::new(rx_if, udp, Delivery::Xsk);
                cfg.object = object();
                cfg.mode = AttachMode::Drv;
                cfg.queues = vec![0];
                let mut t = XdpTransport::open(cfg).unwrap();
                let mut buf = vec![0u8; 16392];
                let mut warnings = Vec::new();
                for _round in 0..2 {
                    ready.wait();
                    sent.wait();
                    // The receive path looks at `no_socket` at most once a
                    // second: receive (or time out) for 2.5 s.
                    let until = std::time::Instant::now() + Duration::from_millis(2500);
                    while std::time::Instant::now() < until {
                        let _ = t.recv_prev(&mut buf);
                    }
                    warnings.push(t.no_socket_warnings());
                }
                (warnings, t.xdp_counters().unwrap())
            })
        })
    };
    in_netns(n1.path(), move || {
        for round in 0..2 {
            ready.wait();
            flows(round);
            sent.wait();
        }
    });
    let (warnings, c) = receiver.join().unwrap();
    assert!(c.get(Counter::NoSocket) > 0, "no chunk hashed to queue 1: {c}");
    assert_eq!(warnings, [1, 1], "warned once, not again on more such chunks: {c}");
}
