//! Mixed TCP rings: leap nodes (raw framing, the original's wire) next to a
//! stand-in for the original TcpTransport (see `original/mod.rs`) as the
//! tail, as a worker in the middle and as the head, each with a control
//! round, on loopback.

mod original;

use leap_common::control::{ControlType, LayerRange};
use original::{Net, Node, Outcome, Resize, fresh_ack, ring};

const FRAMES: u64 = 100;

/// All frames back intact, no stand-in stuck in the middle of a frame.
fn assert_intact(o: &Outcome, frames: u64) {
    assert_eq!(
        (o.delivered, o.corrupt, o.lost, o.hangs),
        (frames, 0, 0, 0),
        "delivered, corrupt, lost, original hangs: {o:?}"
    );
}

/// What leap's head gives `workers` workers.
fn leap_chain(workers: usize) -> Vec<LayerRange> {
    leap::ring::control::chain(workers, 32).ranges[..workers].to_vec()
}

#[test]
fn leap_head_takes_the_fresh_ack_of_an_original_tail() {
    for (nodes, workers) in [(&[Node::Leap, Node::Original][..], 1), (&[Node::Leap, Node::Leap, Node::Original], 2)] {
        let o = ring(Net::Tcp, nodes, Some(Resize::Chain(workers)), FRAMES);
        assert_eq!(o.control_ack, Some(true), "{nodes:?}: {o:?}");
        assert_intact(&o, FRAMES);
        assert_eq!(o.ranges, leap_chain(workers), "{nodes:?}");
    }
}

#[test]
fn original_worker_in_the_middle_passes_the_chain_on() {
    let o = ring(Net::Tcp, &[Node::Leap, Node::Original, Node::Leap], Some(Resize::Chain(2)), FRAMES);
    assert_eq!(o.control_ack, Some(true), "{o:?}");
    assert_intact(&o, FRAMES);
    assert_eq!(o.ranges, leap_chain(2));
}

#[test]
fn original_head_gets_the_ack_of_a_leap_tail() {
    let chain = Resize::Chain(2).message();
    let o = ring(Net::Tcp, &[Node::Original, Node::Leap, Node::Leap], Some(Resize::Chain(2)), FRAMES);
    assert_eq!(o.control_ack, Some(true), "{o:?}");
    assert_intact(&o, FRAMES);
    assert_eq!(o.ranges, chain.ranges[..2]);
    let ack = o.ack_msg.expect("the ACK decodes");
    assert_eq!((ack.kind, ack.worker_index, ack.total_workers, ack.ranges), (ControlType::Ack, 2, 2, chain.ranges));
}

#[test]
fn original_head_gets_a_resize_layers_ack_passed_on_unchanged() {
    let range = LayerRange { start_layer: 8, end_layer: 32, is_tail: true };
    for nodes in [[Node::Original, Node::Leap, Node::Leap], [Node::Original, Node::Original, Node::Leap]] {
        let o = ring(Net::Tcp, &nodes, Some(Resize::Layers), FRAMES);
        assert_eq!(o.control_ack, Some(true), "{nodes:?}: {o:?}");
        assert_intact(&o, FRAMES);
        assert_eq!(o.ack_msg, Some(fresh_ack(range)), "{nodes:?}");
        assert_eq!(o.ranges, [range, LayerRange::default()], "{nodes:?}");
    }
}

#[test]
fn leap_worker_between_an_original_head_and_an_original_tail() {
    let chain = Resize::Chain(2).message();
    let o = ring(Net::Tcp, &[Node::Original, Node::Leap, Node::Original], Some(Resize::Chain(2)), FRAMES);
    assert_eq!(o.control_ack, Some(true), "{o:?}");
    assert_intact(&o, FRAMES);
    assert_eq!(o.ranges, chain.ranges[..2]);
    assert_eq!(o.ack_msg, Some(fresh_ack(chain.ranges[1])));
}
