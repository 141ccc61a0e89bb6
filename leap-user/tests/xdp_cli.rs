//! `leap xdp attach|status|stats|detach` on a veth in a test namespace: the
//! program stays attached after the attaching code has let go of it, keeps
//! counting, and is gone after `detach`. Needs root and BPF:
//! `cargo xtask ci`.

mod xdp_common;

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use leap::cli::xdp::{AttachArgs, XdpArgs, XdpCmd, main as xdp_main};
use leap::netns::Topology;
use leap::transport::xdp::program::pin_dir;
use leap::transport::xdp::{AttachMode, AttachedMode, ObjectSource, PinnedProgram, ProgramKind, XdpError};
use leap_common::chunk::ChunkHeader;
use leap_common::xdp::Counter;
use xdp_common::{in_netns, object, xdp_attachment};

/// Removes the pins of a failed test (bpffs is shared by every namespace).
struct PinGuard(PathBuf);

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.0) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
            let _ = std::fs::remove_dir(&self.0);
        }
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn attach_persists_until_detach_and_leaves_nothing_behind() {
    let topo = Topology::ring(&xdp_common::unique("lxc"), 2).unwrap();
    let (rx, tx) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let iface = rx.rx_iface.clone();
    let _guard = PinGuard(pin_dir(&iface));
    let ObjectSource::File(obj) = object() else { unreachable!() };

    let run = |cmd: XdpCmd| {
        let path = rx.path();
        in_netns(path, move || xdp_main(&XdpArgs { cmd }).map_err(|e| format!("{e:#}")))
    };
    run(XdpCmd::Attach(AttachArgs {
        iface: iface.clone(),
        mode: AttachMode::Auto,
        ports: vec![9999],
        drop_malformed: false,
        xdp_object: Some(obj),
        vlans: Vec::new(),
    }))
    .unwrap();
    // The attaching thread is gone; the pinned link keeps the program.
    assert_eq!(xdp_attachment(&rx.netns, &iface), Some("xdp"));
    let pinned = PinnedProgram::open(&iface).unwrap();
    assert_eq!(pinned.mode(), AttachedMode::Drv);
    assert_eq!(pinned.kind().unwrap(), Some(ProgramKind::Frags), "the multi-buffer program is attached");
    assert_eq!(pinned.ports().unwrap(), vec![9999]);
    // Only chunks for this host, as the kernel would take them.
    let config = pinned.config().unwrap();
    assert_ne!(config.flags & leap_common::xdp::cfg::LOCAL_ONLY, 0, "{config:?}");
    assert_ne!(config.mac, [0; 6], "{config:?}");
    // Attaching twice is refused.
    let again = run(XdpCmd::Attach(AttachArgs {
        iface: iface.clone(),
        mode: AttachMode::Auto,
        ports: vec![9999],
        drop_malformed: false,
        xdp_object: None,
        vlans: Vec::new(),
    }));
    assert!(again.is_err());

    // It still counts: a chunk to the port with no AF_XDP socket bound.
    let dst = SocketAddr::from((rx.addr, 9999));
    in_netns(tx.path(), move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let mut d = ChunkHeader::data(0, 0, 1).to_bytes().to_vec();
        d.extend_from_slice(&[7; 64]);
        s.send_to(&d, dst).unwrap();
    });
    let mut seen = 0;
    for _ in 0..50 {
        seen = pinned.counters().unwrap().get(Counter::NoSocket);
        if seen > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seen, 1);
    drop(pinned);

    run(XdpCmd::Status { iface: Some(iface.clone()), json: true }).unwrap();
    run(XdpCmd::Stats { iface: iface.clone(), json: false }).unwrap();
    run(XdpCmd::Detach { iface: iface.clone() }).unwrap();
    assert_eq!(xdp_attachment(&rx.netns, &iface), None, "detached");
    assert!(!pin_dir(&iface).exists(), "pins removed");
    assert!(matches!(PinnedProgram::open(&iface), Err(XdpError::NotAttached { .. })));
    assert!(run(XdpCmd::Detach { iface }).is_err());
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn a_running_node_is_visible_and_its_stale_pins_can_be_removed() {
    use leap::transport::udp::UdpConfig;
    use leap::transport::xdp::{Delivery, XdpTransport, XdpTransportConfig};

    let topo = Topology::ring(&xdp_common::unique("lxs"), 2).unwrap();
    let (rx, tx) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let iface = rx.rx_iface.clone();
    let _guard = PinGuard(pin_dir(&iface));
    let me = SocketAddr::from((rx.addr, 9999));
    let other = SocketAddr::from((tx.addr, 9999));
    let i2 = iface.clone();
    in_netns(rx.path(), move || {
        let mut cfg = XdpTransportConfig::new(&i2, UdpConfig::new(me, other), Delivery::Xsk);
        cfg.object = object();
        cfg.pin = true;
        let t = XdpTransport::open(cfg).unwrap();
        let p = PinnedProgram::open(&i2).unwrap();
        assert!(!p.is_persistent());
        assert!(p.is_live().unwrap());
        assert_eq!(p.mode(), t.attached_mode());
        assert_eq!(p.ports().unwrap(), vec![9999]);
        assert_eq!(p.counters().unwrap(), t.xdp_counters().unwrap());
        // `leap xdp detach` leaves a running node alone.
        assert!(matches!(p.unpin(), Err(XdpError::Busy { .. })));
        drop(t);
        assert!(!pin_dir(&i2).exists(), "a node removes its pins when it stops");

        // A node that died without cleaning up leaves stale pins: shown as
        // such, and removable.
        let mut prog = leap::transport::xdp::XdpProgram::load(&object()).unwrap();
        prog.attach(&i2, AttachMode::Skb).unwrap();
        std::mem::forget(prog.pin_running().unwrap());
        drop(prog);
        let p = PinnedProgram::open(&i2).unwrap();
        assert!(!p.is_live().unwrap());
        p.unpin().unwrap();
        assert!(!pin_dir(&i2).exists());
    });
    assert_eq!(xdp_attachment(&rx.netns, &iface), None);
}
