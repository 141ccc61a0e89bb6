//! What the kernel drops, the XDP paths drop too: frames crafted byte by
//! byte and injected through an `AF_PACKET` socket into the veth of a
//! namespace this test created, at a node running the `xdp` and the
//! `xdp-ringbuf` transport. Chunks with a bad IPv4 header checksum, a bad
//! UDP checksum, another host's destination address or MAC, a VLAN the
//! node was not given, or a v4-mapped IPv6 source never reach reassembly
//! and are counted by reason; well-formed chunks (with a complete, a
//! partial or no UDP checksum) are delivered. And the kernel's own sender
//! on veth does leave partial checksums, which is why veth accepts them. Needs root and BPF: `cargo
//! xtask ci`.

mod xdp_common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::Duration;

use leap::netns::{NodeNet, Topology};
use leap::transport::Transport;
use leap::transport::config::Reliability;
use leap::transport::udp::UdpConfig;
use leap::transport::xdp::packet::{ChecksumFill, FrameSpec};
use leap::transport::xdp::{self, Delivery, PartialChecksums, XdpTransport, XdpTransportConfig};
use leap_common::chunk::ChunkHeader;
use leap_common::xdp::Counter;
use xdp_common::{in_netns, object};

const PORT: u16 = 9999;
const PREV_PORT: u16 = 7000;
const SENDER_MAC: [u8; 6] = [0x02, 0x10, 0, 0, 0, 0x02];

/// An `AF_PACKET` socket bound to one interface of the namespace it was
/// opened in: sends Ethernet frames exactly as given.
struct Injector {
    fd: OwnedFd,
    ifindex: i32,
}

impl Injector {
    /// Opens the socket in the calling thread's namespace.
    fn open(iface: &str) -> Self {
        let name = std::ffi::CString::new(iface).unwrap();
        // SAFETY: `name` is NUL-terminated and outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
        assert!(ifindex > 0, "no interface {iface}");
        // Protocol 0: this socket sends only, it receives nothing.
        // SAFETY: plain socket(2) call.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        assert!(raw >= 0, "socket(AF_PACKET): {}", std::io::Error::last_os_error());
        // SAFETY: `raw` was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Self { fd, ifindex }
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: all-zero is a valid `sockaddr_ll`.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = self.ifindex;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: `frame` is readable for its length; `to` is a valid
        // `sockaddr_ll` of the size given; the socket is open.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(n, frame.len() as isize, "sendto: {}", std::io::Error::last_os_error());
    }
}

/// A LEAP chunk that is a whole one-chunk frame.
fn chunk(seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = ChunkHeader::data(seq, 0, 1).to_bytes().to_vec();
    d.extend_from_slice(payload);
    d
}

/// What the node reports after one injected frame.
#[derive(Debug)]
struct Report {
    /// The frame delivered, if any.
    frame: Option<Vec<u8>>,
    /// Program counters (by name) and user-space drops, JSON.
    xdp: serde_json::Value,
    drops: serde_json::Value,
    chunks_received: u64,
}

impl Report {
    fn xdp(&self, c: Counter) -> u64 {
        self.xdp[c.name()].as_u64().unwrap()
    }
    fn drop(&self, name: &str) -> u64 {
        self.drops[name].as_u64().unwrap()
    }
}

/// A node receiving through XDP in its own thread: each `()` sent makes it
/// wait for one frame (250 ms) and report.
struct Node {
    cmd: mpsc::Sender<()>,
    rep: mpsc::Receiver<Report>,
    mac: [u8; 6],
    thread: std::thread::JoinHandle<()>,
}

impl Node {
    fn start(rx: &NodeNet, local: SocketAddr, prev: SocketAddr, delivery: Delivery, partial: PartialChecksums) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::channel::<()>();
        let (rep_tx, rep_rx) = mpsc::channel::<Report>();
        let (mac_tx, mac_rx) = mpsc::channel::<[u8; 6]>();
        let (obj, iface, path) = (object(), rx.rx_iface.clone(), rx.path());
        let thread = std::thread::spawn(move || {
            in_netns(path, move || {
                let mut udp = UdpConfig::new(local, prev);
                udp.prev = Some(prev);
                udp.reliability = Reliability::BestEffort;
                let mut cfg = XdpTransportConfig::new(&iface, udp, delivery);
                cfg.object = obj;
                cfg.partial_checksums = partial;
                let mut t = XdpTransport::open(cfg).unwrap();
                mac_tx.send(t.rx_filter().mac.unwrap()).unwrap();
                t.set_recv_timeout(Some(Duration::from_millis(250)));
                let mut buf = vec![0u8; 4096];
                while cmd_rx.recv().is_ok() {
                    let frame = match t.recv_prev(&mut buf) {
                        Ok(got) => Some(buf[..got.len].to_vec()),
                        Err(e) if e.is_timeout() => None,
                        Err(e) => panic!("recv_prev: {e}"),
                    };
                    let stats = t.stats();
                    rep_tx
                        .send(Report {
                            frame,
                            xdp: serde_json::to_value(t.backend_counters().unwrap()).unwrap(),
                            drops: serde_json::to_value(stats.drops).unwrap(),
                            chunks_received: stats.chunks_received,
                        })
                        .unwrap();
                }
            })
        });
        let mac = mac_rx.recv().expect("the receiver failed to start");
        Self { cmd: cmd_tx, rep: rep_rx, mac, thread }
    }

    fn report(&self) -> Report {
        self.cmd.send(()).unwrap();
        self.rep.recv().expect("the receiver failed")
    }

    fn stop(self) {
        drop(self.cmd);
        self.thread.join().unwrap();
    }
}

fn run(delivery: Delivery) {
    // Named after the process: parallel runs of other tests do not clash.
    let prefix = xdp_common::unique(if delivery == Delivery::Xsk { "lxh" } else { "lxi" });
    let topo = Topology::ring(&prefix, 2).unwrap();
    let (rx, tx) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let local = SocketAddr::from((rx.addr, PORT));
    let prev = SocketAddr::from((tx.addr, PREV_PORT));
    let node = Node::start(&rx, local, prev, delivery, PartialChecksums::Auto);
    let host_mac = node.mac;
    let tx_iface = tx.tx_iface.clone();
    let injector = in_netns(tx.path(), move || Injector::open(&tx_iface));

    let ends = Ends { prev, local, host_mac };
    let report = || node.report();
    let inject = |frame: &[u8]| -> Report {
        injector.send(frame);
        node.report()
    };
    let what = delivery.transport_name();

    // The injection path works: a well-formed chunk is a frame, with a
    // complete, a partial (what a veth sender leaves) or no UDP checksum.
    for (seq, fill) in [(1, ChecksumFill::Full), (2, ChecksumFill::Partial), (3, ChecksumFill::Zero)] {
        let d = chunk(seq, b"well-formed");
        let r = inject(&FrameSpec { checksum: fill, ..ends.spec(&d) }.build());
        assert_eq!(r.frame.as_deref(), Some(&b"well-formed"[..]), "{what} {fill:?}: {r:?}");
    }

    // Everything the kernel would drop, each counted where it is dropped.
    let payload = b"must never be delivered";
    let d = chunk(4, payload);
    let base = ends.spec(&d);
    let mut bad_ip = base.build();
    bad_ip[14 + 8] -= 1; // TTL changed, header checksum not
    let mut bad_udp = base.build();
    let last = bad_udp.len() - 1;
    bad_udp[last] ^= 0x55; // payload changed after the UDP checksum, LEAP header intact
    let foreign_dst = FrameSpec { dst: SocketAddr::from(([10, 77, 0, 99], PORT)), ..base.clone() }.build();
    let foreign_mac = FrameSpec { dst_mac: [0x02, 0x10, 0, 0, 0, 0x99], ..base.clone() }.build();
    let foreign_vlan = FrameSpec { vlan: Some(7), ..base.clone() }.build();
    let mapped_src = FrameSpec {
        src: SocketAddr::new(IpAddr::V6(tx.addr.to_ipv6_mapped()), PREV_PORT),
        dst: "[fd00::1]:9999".parse().unwrap(),
        ..base.clone()
    }
    .build();
    let cases = [
        ("bad IPv4 header checksum", &bad_ip, CountedBy::Program(Counter::BadIpChecksum)),
        ("bad UDP checksum", &bad_udp, CountedBy::UserSpace("bad_udp_checksum")),
        ("foreign destination address", &foreign_dst, CountedBy::Program(Counter::ForeignDst)),
        ("foreign destination MAC", &foreign_mac, CountedBy::Program(Counter::ForeignMac)),
        ("foreign VLAN", &foreign_vlan, CountedBy::Program(Counter::ForeignVlan)),
        ("v4-mapped IPv6 source", &mapped_src, CountedBy::Program(Counter::MappedSource)),
    ];
    let mut before = report();
    for (name, frame, counted_by) in cases {
        let r = inject(frame);
        assert_eq!(r.frame, None, "{what}: {name} delivered");
        assert_eq!(r.chunks_received, before.chunks_received, "{what}: {name} reached reassembly");
        match counted_by {
            CountedBy::Program(c) => assert_eq!(r.xdp(c), before.xdp(c) + 1, "{what}: {name}: {}", r.xdp),
            CountedBy::UserSpace(d) => assert_eq!(r.drop(d), before.drop(d) + 1, "{what}: {name}: {}", r.drops),
        }
        before = r;
    }
    // The genuine chunk of the same frame still makes it, intact.
    let r = inject(&base.build());
    assert_eq!(r.frame.as_deref(), Some(&payload[..]), "{what}: {r:?}");

    node.stop();
    drop(topo);
}

/// Where a refusal is counted.
enum CountedBy {
    /// In the XDP program's counter.
    Program(Counter),
    /// In the node's drops, by name.
    UserSpace(&'static str),
}

/// Who sends what to whom.
struct Ends {
    prev: SocketAddr,
    local: SocketAddr,
    host_mac: [u8; 6],
}

impl Ends {
    /// A frame from the previous node to this node carrying `payload`, with
    /// every checksum right.
    fn spec<'a>(&self, payload: &'a [u8]) -> FrameSpec<'a> {
        FrameSpec {
            src_mac: SENDER_MAC,
            dst_mac: self.host_mac,
            vlan: None,
            src: self.prev,
            dst: self.local,
            checksum: ChecksumFill::Full,
            payload,
        }
    }
}

/// A node listening on the wildcard address takes chunks to every address
/// of its namespace but loopback: the kernel drops a packet to 127.0.0.1
/// that arrives on a veth ("martian destination"), so the program must
/// not have 127.0.0.1 among its local addresses.
#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn a_chunk_from_the_wire_to_loopback_is_dropped_with_a_wildcard_listen() {
    let topo = Topology::ring(&xdp_common::unique("lxl"), 2).unwrap();
    let (rx, tx) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let wildcard = SocketAddr::from(([0, 0, 0, 0], PORT));
    let prev = SocketAddr::from((tx.addr, PREV_PORT));
    for delivery in [Delivery::Xsk, Delivery::RingBuf] {
        let what = delivery.transport_name();
        let node = Node::start(&rx, wildcard, prev, delivery, PartialChecksums::Auto);
        let tx_iface = tx.tx_iface.clone();
        let injector = in_netns(tx.path(), move || Injector::open(&tx_iface));
        let ends = Ends { prev, local: SocketAddr::from((rx.addr, PORT)), host_mac: node.mac };
        // The injection path works: to the veth's own address, delivered.
        let d = chunk(1, b"to the veth's address");
        injector.send(&ends.spec(&d).build());
        let r = node.report();
        assert_eq!(r.frame.as_deref(), Some(&b"to the veth's address"[..]), "{what}: {r:?}");
        // To 127.0.0.1, from the wire: dropped and counted.
        let d = chunk(2, b"to loopback, from the wire");
        let to_loopback = FrameSpec { dst: SocketAddr::from(([127, 0, 0, 1], PORT)), ..ends.spec(&d) }.build();
        injector.send(&to_loopback);
        let after = node.report();
        assert_eq!(after.frame, None, "{what}: a chunk to 127.0.0.1 from the wire was delivered");
        assert_eq!(after.chunks_received, r.chunks_received, "{what}: it reached reassembly");
        assert_eq!(
            after.xdp(Counter::ForeignDst),
            r.xdp(Counter::ForeignDst) + 1,
            "{what}: not counted as a foreign destination: {}",
            after.xdp
        );
        node.stop();
    }
    drop(topo);
}

/// The `ETH_FLAG_*` offload flags of `iface` in the namespace at `path`,
/// after setting `set` (flag, on) when given.
fn offload_flags(path: std::path::PathBuf, iface: &str, set: Option<(u32, bool)>) -> u32 {
    let iface = iface.to_string();
    in_netns(path, move || {
        use std::os::fd::AsFd;
        let sock = xdp::netns_socket().unwrap();
        let flags = xdp::if_offload_flags(sock.as_fd(), &iface).unwrap();
        if let Some((flag, on)) = set {
            let want = if on { flags | flag } else { flags & !flag };
            xdp::set_if_offload_flags(sock.as_fd(), &iface, want).unwrap();
        }
        xdp::if_offload_flags(sock.as_fd(), &iface).unwrap()
    })
}

/// A NIC with receive VLAN offload strips 802.1Q tags and hands them over
/// beside the packet, where the XDP program does not see them: a chunk
/// from a VLAN the host does not carry would look untagged and be taken.
/// So the offload is off while the program is attached (and on again
/// after), and a chunk from VLAN 42, which the node was not given, tagged
/// in the packet as such a NIC then hands it over, is dropped and counted.
/// (veth keeps a tag beside the packet only when the sending side put it
/// there, through a VLAN device, which this host's kernel does not have;
/// the receiver's flag changes nothing on veth: see the README.)
#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn rx_vlan_offload_is_off_while_attached_and_a_foreign_vlan_chunk_is_dropped() {
    let topo = Topology::ring(&xdp_common::unique("lxo"), 2).unwrap();
    let (rx, tx) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let local = SocketAddr::from((rx.addr, PORT));
    let prev = SocketAddr::from((tx.addr, PREV_PORT));
    let rxvlan = |set: Option<bool>| {
        offload_flags(rx.path(), &rx.rx_iface, set.map(|on| (xdp::ETH_FLAG_RXVLAN, on))) & xdp::ETH_FLAG_RXVLAN != 0
    };
    assert!(rxvlan(Some(true)), "veth takes rx-vlan-offload on");

    for delivery in [Delivery::Xsk, Delivery::RingBuf] {
        let what = delivery.transport_name();
        let node = Node::start(&rx, local, prev, delivery, PartialChecksums::Auto);
        assert!(!rxvlan(None), "{what}: rx-vlan-offload still on while the XDP program is attached");
        let tx_iface = tx.tx_iface.clone();
        let injector = in_netns(tx.path(), move || Injector::open(&tx_iface));
        let ends = Ends { prev, local, host_mac: node.mac };
        // The path works: untagged, delivered.
        let d = chunk(1, b"untagged");
        injector.send(&ends.spec(&d).build());
        let before = node.report();
        assert_eq!(before.frame.as_deref(), Some(&b"untagged"[..]), "{what}: {before:?}");
        let d = chunk(2, b"from VLAN 42");
        injector.send(&FrameSpec { vlan: Some(42), ..ends.spec(&d) }.build());
        let r = node.report();
        assert_eq!(r.frame, None, "{what}: a chunk from a foreign VLAN was delivered");
        assert_eq!(r.chunks_received, before.chunks_received, "{what}: it reached reassembly");
        assert_eq!(r.xdp(Counter::ForeignVlan), before.xdp(Counter::ForeignVlan) + 1, "{what}: {}", r.xdp);
        node.stop();
        assert!(rxvlan(None), "{what}: rx-vlan-offload not turned back on after the program went");
    }
    drop(topo);
}

/// The case the partial-checksum rule exists for: the kernel's own UDP
/// sender on veth leaves only the pseudo-header sum, so refusing partial
/// sums there refuses every genuine chunk (and counts each).
#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn kernel_senders_on_veth_leave_partial_checksums() {
    let topo = Topology::ring(&xdp_common::unique("lxj"), 2).unwrap();
    let (rx, tx) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let local = SocketAddr::from((rx.addr, PORT));
    let prev = SocketAddr::from((tx.addr, PREV_PORT));
    for (partial, delivered) in [(PartialChecksums::Refuse, false), (PartialChecksums::Auto, true)] {
        let node = Node::start(&rx, local, prev, Delivery::Xsk, partial);
        let before = node.report();
        let d = chunk(1, b"from the kernel's UDP stack");
        in_netns(tx.path(), move || UdpSocket::bind(prev).unwrap().send_to(&d, local).unwrap());
        let r = node.report();
        assert_eq!(r.frame.is_some(), delivered, "{partial:?}: {r:?}");
        let refused = r.drop("bad_udp_checksum") - before.drop("bad_udp_checksum");
        assert_eq!(refused, u64::from(!delivered), "{partial:?}: {}", r.drops);
        node.stop();
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn af_xdp_path_drops_what_the_kernel_drops() {
    run(Delivery::Xsk);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_path_drops_what_the_kernel_drops() {
    run(Delivery::RingBuf);
}
