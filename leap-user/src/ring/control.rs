//! The control protocol on the ring: RESIZE_CHAIN travels from the head
//! through every worker, each applying its own range and incrementing
//! `worker_index`; the tail turns it into an ACK that travels on to the head.

use leap_common::control::{ControlMessage, ControlType, LayerRange};

/// The layers a node runs, as control messages set them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layers {
    /// The assigned range.
    pub range: LayerRange,
    /// How many control messages changed it.
    pub changes: u32,
}

/// What a worker does with a control message after applying it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlAction {
    /// Send this message on to the next node.
    Forward(Box<ControlMessage>),
    /// Nothing more to do.
    Consume,
}

/// Applies `msg` to a worker's layers and says what to forward.
pub fn apply(layers: &mut Layers, msg: &ControlMessage) -> ControlAction {
    match msg.kind {
        ControlType::ResizeLayers => {
            layers.range = LayerRange { start_layer: msg.split_layer, end_layer: msg.end_layer, is_tail: msg.is_tail };
            layers.changes += 1;
            ControlAction::Consume
        }
        ControlType::ResizeChain => {
            let idx = msg.worker_index;
            let mut out = *msg;
            if idx < msg.total_workers {
                layers.range = msg.ranges[idx as usize];
                layers.changes += 1;
            }
            out.worker_index = (idx + 1).min(msg.total_workers);
            if out.worker_index >= msg.total_workers || layers.range.is_tail {
                // The tail answers; the ACK keeps the ranges for the head to check.
                out.kind = ControlType::Ack;
            }
            ControlAction::Forward(Box::new(out))
        }
        // An ACK is on its way to the head: pass it on.
        ControlType::Ack => ControlAction::Forward(Box::new(*msg)),
    }
}

/// The RESIZE_CHAIN the head sends to give `workers` workers consecutive
/// ranges of `layers` layers in total.
pub fn chain(workers: usize, layers: i32) -> ControlMessage {
    let workers = workers.min(leap_common::control::MAX_WORKERS);
    let mut m = ControlMessage::new(ControlType::ResizeChain);
    m.total_workers = workers as i32;
    let per = if workers == 0 { 0 } else { layers / workers as i32 };
    for i in 0..workers {
        m.ranges[i] = LayerRange {
            start_layer: per * i as i32,
            end_layer: if i + 1 == workers { layers } else { per * (i as i32 + 1) },
            is_tail: i + 1 == workers,
        };
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_is_applied_forwarded_and_acked_by_the_tail() {
        let msg = chain(3, 32);
        let mut w = [Layers::default(); 3];
        let ControlAction::Forward(m1) = apply(&mut w[0], &msg) else { panic!() };
        assert_eq!((m1.kind, m1.worker_index), (ControlType::ResizeChain, 1));
        let ControlAction::Forward(m2) = apply(&mut w[1], &m1) else { panic!() };
        let ControlAction::Forward(m3) = apply(&mut w[2], &m2) else { panic!() };
        assert_eq!(m3.kind, ControlType::Ack);
        assert_eq!(w[0].range, LayerRange { start_layer: 0, end_layer: 10, is_tail: false });
        assert_eq!(w[2].range, LayerRange { start_layer: 20, end_layer: 32, is_tail: true });
        assert!(m3.validate().is_ok());
    }
}
