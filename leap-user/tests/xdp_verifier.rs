//! The XDP program in the real kernel: the verifier accepts it, and it
//! attaches to a veth in native and in generic mode and goes away again.
//! Needs root and BPF: `cargo xtask ci` runs these with `--ignored`.

mod xdp_common;

use leap::netns::Topology;
use leap::transport::xdp::{AttachMode, AttachedMode, XdpError, XdpProgram};
use xdp_common::{in_netns, object, xdp_attachment};

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn program_passes_the_verifier() {
    let prog = XdpProgram::load(&object()).expect("the verifier accepts leap_xdp");
    assert!(prog.attached().is_none());
    let c = prog.counters().unwrap();
    assert_eq!(c.total(), 0, "a fresh program has counted nothing");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn program_attaches_to_veth_in_both_modes_and_detaches_on_drop() {
    let topo = Topology::ring("lxv", 2).unwrap();
    let node = topo.nodes()[0].clone();
    for (mode, want, kernel) in
        [(AttachMode::Drv, AttachedMode::Drv, "xdp"), (AttachMode::Skb, AttachedMode::Skb, "xdpgeneric")]
    {
        let (ns, iface) = (node.netns.clone(), node.rx_iface.clone());
        let obj = object();
        let prog = in_netns(&node, move || {
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
    let topo = Topology::ring("lxa", 2).unwrap();
    let node = topo.nodes()[0].clone();
    let ns = node.netns.clone();
    let obj = object();
    in_netns(&node, move || {
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
