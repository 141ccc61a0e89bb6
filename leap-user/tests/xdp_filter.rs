//! What the XDP program does with every kind of datagram to a leap port,
//! seen from both ends: an ordinary UDP socket on the same port, the AF_XDP
//! socket, and the program's counters. Needs root and BPF: `cargo xtask ci`.

mod xdp_common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::Duration;

use leap::netns::Topology;
use leap::transport::xdp::packet::parse_udp;
use leap::transport::xdp::{AttachMode, XdpCounters, XdpProgram, XskConfig, XskSocket};
use leap_common::chunk::{ChunkHeader, ChunkKind, flags};
use leap_common::xdp::{Counter, PeerRule, XdpConfig, cfg, delivery};
use xdp_common::{in_netns, object};

const PORT: u16 = 9999;

/// What the receiving namespace saw after one datagram.
#[derive(Debug, Default)]
struct Seen {
    /// Payloads the ordinary socket received.
    socket: Vec<Vec<u8>>,
    /// UDP payloads the AF_XDP socket received.
    xsk: Vec<Vec<u8>>,
    /// Counter changes.
    counters: XdpCounters,
}

enum Cmd {
    /// Apply this configuration, then acknowledge.
    Configure(XdpConfig),
    /// Remove the AF_XDP socket from the XSKMAP.
    Unregister,
    /// Collect what arrived since the last report.
    Report,
    Stop,
}

fn leap_chunk(hdr: ChunkHeader, payload_len: usize) -> Vec<u8> {
    let mut d = hdr.to_bytes().to_vec();
    d.extend((0..payload_len).map(|i| i as u8));
    d
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn every_datagram_is_delivered_passed_or_dropped_as_configured() {
    // Namespaces and veths named after the process: parallel runs do not clash.
    let topo = Topology::ring(&xdp_common::unique("lxf"), 2).unwrap();
    let (rx_node, tx_node) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let local = SocketAddr::from((rx_node.addr, PORT));
    let sender_addr = SocketAddr::from((tx_node.addr, 7000));
    let stranger_addr = SocketAddr::from((tx_node.addr, 7001));

    let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
    let (seen_tx, seen_rx) = mpsc::channel::<Seen>();
    let iface = rx_node.rx_iface.clone();
    let obj = object();
    let receiver = std::thread::spawn(move || {
        in_netns(rx_node.path(), move || {
            let mut prog = XdpProgram::load(&obj).unwrap();
            prog.add_port(PORT).unwrap();
            // The previous node may send data; the same address, another
            // port, only NACKs.
            prog.allow_peer(sender_addr, PORT, PeerRule::allow(&[ChunkKind::Data, ChunkKind::Control])).unwrap();
            prog.allow_peer(stranger_addr, PORT, PeerRule::allow(&[ChunkKind::Nack])).unwrap();
            let mut xsk = XskSocket::open(&iface, 0, &XskConfig::default()).unwrap();
            prog.register_xsk(0, xsk.fd()).unwrap();
            prog.attach(&iface, AttachMode::Drv).unwrap();
            let sock = UdpSocket::bind(local).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            let mut base = prog.counters().unwrap();
            let mut seen = Seen::default();
            seen_tx.send(Seen::default()).unwrap();
            loop {
                match cmd_rx.recv().unwrap() {
                    Cmd::Configure(c) => {
                        prog.configure(&c).unwrap();
                        seen_tx.send(Seen::default()).unwrap();
                    }
                    Cmd::Unregister => {
                        prog.unregister_xsk(0).unwrap();
                        seen_tx.send(Seen::default()).unwrap();
                    }
                    Cmd::Report => {
                        let mut buf = [0u8; 2048];
                        while let Ok(n) = sock.recv(&mut buf) {
                            seen.socket.push(buf[..n].to_vec());
                        }
                        xsk.wait(Duration::from_millis(50)).unwrap();
                        xsk.recv(64, |frame| seen.xsk.push(parse_udp(frame).expect("a UDP frame").payload.to_vec()));
                        let now = prog.counters().unwrap();
                        seen.counters = now.since(&base);
                        base = now;
                        seen_tx.send(std::mem::take(&mut seen)).unwrap();
                    }
                    Cmd::Stop => return,
                }
            }
        })
    });

    let (out_tx, out_rx) = mpsc::channel::<(SocketAddr, Vec<u8>)>();
    let sender = std::thread::spawn(move || {
        in_netns(tx_node.path(), move || {
            let a = UdpSocket::bind(sender_addr).unwrap();
            let b = UdpSocket::bind(stranger_addr).unwrap();
            while let Ok((from, d)) = out_rx.recv() {
                let s = if from == sender_addr { &a } else { &b };
                s.send_to(&d, local).unwrap();
            }
        })
    });

    // Set up and attached.
    seen_rx.recv().unwrap();
    let configure = |c: XdpConfig| {
        cmd_tx.send(Cmd::Configure(c)).unwrap();
        seen_rx.recv().unwrap();
    };
    let send = |from: SocketAddr, d: Vec<u8>| -> Seen {
        out_tx.send((from, d)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        cmd_tx.send(Cmd::Report).unwrap();
        seen_rx.recv().unwrap()
    };
    let xsk_cfg = |flags| XdpConfig { delivery: delivery::XSK, flags, ..XdpConfig::default() };
    let good = leap_chunk(ChunkHeader::data(1, 0, 1), 100);

    // Not configured yet: everything passes to the kernel (ARP too).
    let s = send(sender_addr, good.clone());
    assert_eq!((s.socket.len(), s.xsk.len()), (1, 0), "{s:?}");
    assert!(s.counters.get(Counter::Passed) >= 1, "{}", s.counters);
    assert_eq!(s.counters.get(Counter::ToXsk), 0, "{}", s.counters);

    configure(xsk_cfg(0));
    // A plain datagram to the leap port reaches the ordinary socket.
    let s = send(sender_addr, b"hello, not a LEAP chunk".to_vec());
    assert_eq!(s.socket, vec![b"hello, not a LEAP chunk".to_vec()]);
    assert!(s.xsk.is_empty());
    assert_eq!(s.counters.get(Counter::NotLeap), 1, "{}", s.counters);

    // A sane chunk goes to AF_XDP and nowhere else.
    let s = send(sender_addr, good.clone());
    assert_eq!(s.xsk, vec![good.clone()]);
    assert!(s.socket.is_empty());
    assert_eq!(s.counters.get(Counter::ToXsk), 1, "{}", s.counters);

    // Malformed chunks never reach AF_XDP; without DROP_REJECTED the
    // kernel gets them.
    let malformed = [
        leap_chunk(ChunkHeader::data(1, 2, 2), 10),   // chunk_id >= total
        leap_chunk(ChunkHeader::data(1, 0, 0), 10),   // total 0
        leap_chunk(ChunkHeader::data(1, 0, 2), 1401), // payload > 1400
    ];
    for m in &malformed {
        let s = send(sender_addr, m.clone());
        assert!(s.xsk.is_empty(), "{s:?}");
        assert_eq!(s.socket, vec![m.clone()]);
        assert_eq!(s.counters.get(Counter::Malformed), 1, "{}", s.counters);
    }
    configure(xsk_cfg(cfg::DROP_REJECTED));
    let s = send(sender_addr, malformed[0].clone());
    assert!(s.xsk.is_empty() && s.socket.is_empty(), "{s:?}");
    assert_eq!(s.counters.get(Counter::Malformed), 1, "{}", s.counters);

    // Peer filter: data only from the previous node, NACKs only from the
    // allowed NACK source.
    configure(xsk_cfg(cfg::DROP_REJECTED | cfg::PEER_FILTER));
    let s = send(stranger_addr, good.clone());
    assert!(s.xsk.is_empty() && s.socket.is_empty(), "{s:?}");
    assert_eq!(s.counters.get(Counter::WrongSource), 1, "{}", s.counters);
    let nack =
        leap_chunk(ChunkHeader { reserved: flags::LEAP | ChunkKind::Nack as u16, ..ChunkHeader::data(1, 0, 1) }, 4);
    let s = send(sender_addr, nack.clone());
    assert_eq!(s.counters.get(Counter::WrongSource), 1, "a NACK from the previous node: {}", s.counters);
    let s = send(stranger_addr, nack.clone());
    assert_eq!(s.xsk, vec![nack]);
    let s = send(sender_addr, good.clone());
    assert_eq!(s.xsk, vec![good.clone()]);

    // Without a socket at the queue: passed, counted as no_socket.
    cmd_tx.send(Cmd::Unregister).unwrap();
    seen_rx.recv().unwrap();
    let s = send(sender_addr, good.clone());
    assert_eq!(s.socket, vec![good.clone()]);
    assert!(s.xsk.is_empty());
    assert_eq!(s.counters.get(Counter::NoSocket), 1, "{}", s.counters);

    drop(out_tx);
    cmd_tx.send(Cmd::Stop).unwrap();
    sender.join().unwrap();
    receiver.join().unwrap();
}
