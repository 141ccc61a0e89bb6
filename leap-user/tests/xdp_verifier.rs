//! The XDP program in the real kernel: the verifier accepts it, and it
//! attaches to a veth in native and in generic mode and goes away again.
//! Needs root and BPF: `cargo xtask ci` runs these with `--ignored`.

mod xdp_common;

use leap::netns::Topology;
use leap::transport::xdp::{AttachMode, AttachedMode, ProgramKind, XdpError, XdpProgram};
use xdp_common::{in_netns, object, xdp_attachment};

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn program_passes_the_verifier() {
    // Both entry points, each on its own.
    for kind in [ProgramKind::Frags, ProgramKind::Linear] {
        let prog =
            XdpProgram::load_kind(&object(), None, kind).unwrap_or_else(|e| panic!("the verifier accepts {kind}: {e}"));
        assert_eq!(prog.kind(), kind);
        assert!(prog.attached().is_none());
        let c = prog.counters().unwrap();
        assert_eq!(c.total(), 0, "a fresh program has counted nothing");
    }
    // By default, the multi-buffer one (this kernel has it).
    assert_eq!(XdpProgram::load(&object()).unwrap().kind(), ProgramKind::Frags);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn both_programs_pass_the_verifier_with_only_the_units_capabilities() {
    // CAP_BPF (+ CAP_NET_ADMIN, CAP_NET_RAW, CAP_IPC_LOCK), not CAP_PERFMON:
    // the verifier then applies its Spectre-v1 rules, which refuse any
    // packet-pointer arithmetic with a register and `data_end - data`.
    // Capabilities are per thread: only this one drops them.
    std::thread::spawn(|| {
        // Exactly the packaged unit's capabilities, which hold no
        // CAP_PERFMON (the VM suite checks the same on 6.1 and 6.12).
        const CAPS: &[u32] = &[12, 13, 14, 39];
        assert_eq!(leap::sys::UNIT_CAPS, CAPS);
        leap::sys::restrict_thread_caps(CAPS).unwrap();
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim();
        let eff = u64::from_str_radix(eff, 16).unwrap();
        const PERFMON: u32 = 38;
        const BPF: u32 = 39;
        assert_eq!(eff & (1 << PERFMON), 0, "CAP_PERFMON still held: {eff:#x}");
        assert_ne!(eff & (1 << BPF), 0, "CAP_BPF missing: {eff:#x}");
        for kind in [ProgramKind::Frags, ProgramKind::Linear] {
            let prog = XdpProgram::load_kind(&object(), None, kind)
                .unwrap_or_else(|e| panic!("the verifier accepts {kind} without CAP_PERFMON: {e:?}"));
            assert_eq!(prog.kind(), kind);
        }
    })
    .join()
    .expect("the load thread panicked");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn program_attaches_to_veth_in_both_modes_and_detaches_on_drop() {
    let topo = Topology::ring(&xdp_common::unique("lxv"), 2).unwrap();
    let node = topo.nodes()[0].clone();
    for (mode, want, kernel) in
        [(AttachMode::Drv, AttachedMode::Drv, "xdp"), (AttachMode::Skb, AttachedMode::Skb, "xdpgeneric")]
    {
        let (ns, iface) = (node.netns.clone(), node.rx_iface.clone());
        let obj = object();
        let prog = in_netns(node.path(), move || {
            let mut prog = XdpProgram::load(&obj).unwrap();
            let got = prog.attach(&iface, mode).unwrap();
            assert_eq!(got, want);
            assert_eq!(xdp_attachment(&ns, &iface), Some(kernel));
            // A second program on the same interface is refused clearly.
            let mut other = XdpProgram::load(&object()).unwrap();
            assert!(matches!(other.attach(&iface, mode), Err(XdpError::Busy { .. })));
            prog
        });
        drop(prog);
        assert_eq!(xdp_attachment(&node.netns, &node.rx_iface), None, "{mode:?}: detached on drop");
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn auto_mode_falls_back_to_generic_where_native_is_missing() {
    let topo = Topology::ring(&xdp_common::unique("lxa"), 2).unwrap();
    let node = topo.nodes()[0].clone();
    let ns = node.netns.clone();
    let obj = object();
    in_netns(node.path(), move || {
        let mut prog = XdpProgram::load(&obj).unwrap();
        // Loopback has no native XDP.
        assert_eq!(prog.attach("lo", AttachMode::Auto).unwrap(), AttachedMode::Skb);
        assert_eq!(xdp_attachment(&ns, "lo"), Some("xdpgeneric"));
        let mut forced = XdpProgram::load(&obj).unwrap();
        drop(prog);
        assert!(matches!(forced.attach("lo", AttachMode::Drv), Err(XdpError::Attach { .. })));
        assert!(matches!(forced.attach("nonexistent0", AttachMode::Auto), Err(XdpError::NoInterface(_))));
    });
}

/// Collects log records of the program (target `leap_xdp`).
struct Capture(std::sync::Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        self.0.lock().unwrap().push(r.args().to_string());
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture(std::sync::Mutex::new(Vec::new()));

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn debug_events_are_logged_only_when_enabled() {
    use leap_common::chunk::ChunkHeader;
    use leap_common::xdp::{XdpConfig, cfg, delivery};

    log::set_logger(&CAPTURE).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    // The variant with the events (root: this kernel takes it), and the
    // one every node loads, which has none whatever the flags say.
    let mut logging = XdpProgram::load_logged(&object(), None, true).unwrap();
    assert!(logging.logs(), "root loads the program with the debug events");
    let mut quiet = XdpProgram::load(&object()).unwrap();
    assert!(!quiet.logs());
    for prog in [&mut logging, &mut quiet] {
        prog.add_port(9999).unwrap();
        prog.enable_log().unwrap();
    }
    // Ethernet + IPv4 + UDP to 9999 + a LEAP header with chunk_id >= total.
    let mut chunk = ChunkHeader::data(1, 5, 2).to_bytes().to_vec();
    chunk.extend_from_slice(&[0; 20]);
    let p = leap::transport::xdp::packet::FrameSpec {
        src_mac: [0x02, 0, 0, 0, 0, 2],
        dst_mac: [0x02, 0, 0, 0, 0, 1],
        vlan: None,
        src: "10.1.0.1:7000".parse().unwrap(),
        dst: "10.1.0.2:9999".parse().unwrap(),
        checksum: leap::transport::xdp::packet::ChecksumFill::Zero,
        payload: &chunk,
    }
    .build();

    let malformed_logged = |prog: &mut XdpProgram, flags: u32| {
        prog.configure(&XdpConfig { delivery: delivery::XSK, flags, ..XdpConfig::default() }).unwrap();
        let before = prog.counters().unwrap().get(leap_common::xdp::Counter::Malformed);
        prog.test_run(&p).unwrap();
        assert_eq!(prog.counters().unwrap().get(leap_common::xdp::Counter::Malformed), before + 1);
        prog.flush_log();
        let mut got = CAPTURE.0.lock().unwrap();
        let hit = got.iter().any(|m| m.contains("malformed chunk 5/2"));
        got.clear();
        hit
    };
    assert!(!malformed_logged(&mut logging, 0), "no events unless asked for");
    assert!(malformed_logged(&mut logging, cfg::LOG));
    assert!(!malformed_logged(&mut quiet, cfg::LOG), "the program without events emits none");
}
