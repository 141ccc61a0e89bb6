//! The control protocol on the ring: RESIZE_CHAIN travels from the head
//! through every worker, each applying its own range and incrementing
//! `worker_index`; the tail turns it into an ACK that travels on to the head.
//!
//! Two forms of ACK reach a head: leap's tail keeps the chain in it (every
//! range, `worker_index == total_workers`); an original tail makes a fresh
//! one holding only its own new range (`split_layer`, `end_layer`,
//! `is_tail`), every other field zero. [`acknowledges`] takes both.

use leap_common::control::{ControlMessage, ControlType, LayerRange};

/// The layers a node runs, as control messages set them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layers {
    /// The assigned range.
    pub range: LayerRange,
    /// How many control messages changed it.
    pub changes: u32,
}

/// Applies `msg` to a worker's layers and returns what the worker sends on:
/// as in the original, every control message is passed on or answered.
pub fn apply(layers: &mut Layers, msg: &ControlMessage) -> ControlMessage {
    match msg.kind {
        ControlType::ResizeLayers => {
            layers.range = LayerRange { start_layer: msg.split_layer, end_layer: msg.end_layer, is_tail: msg.is_tail };
            layers.changes += 1;
            // The original head waits for an ACK of a RESIZE_LAYERS too; it
            // takes any ACK, so answer as an original worker does.
            fresh_ack(layers.range)
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
                // The tail answers in leap's form: the ACK keeps the ranges
                // for a leap head to check (an original head takes any ACK).
                out.kind = ControlType::Ack;
            }
            out
        }
        // An ACK is on its way to the head: pass it on.
        ControlType::Ack => *msg,
    }
}

/// The ACK an original worker makes: its own new range, every other field
/// zero.
fn fresh_ack(range: LayerRange) -> ControlMessage {
    let mut ack = ControlMessage::new(ControlType::Ack);
    ack.split_layer = range.start_layer;
    ack.end_layer = range.end_layer;
    ack.is_tail = range.is_tail;
    ack
}

/// Whether `ack` answers the RESIZE_CHAIN `chain`: leap's form (the chain's
/// ranges, `worker_index == total_workers` of the chain), or the original's
/// fresh ACK whose range is exactly the one the chain gave its last worker,
/// the tail. Anything else (another round's ACK, a tail that applied some
/// other range) is not an answer.
pub fn acknowledges(chain: &ControlMessage, ack: &ControlMessage) -> bool {
    if ack.kind != ControlType::Ack {
        return false;
    }
    let leap =
        ack.total_workers == chain.total_workers && ack.worker_index == ack.total_workers && ack.ranges == chain.ranges;
    let tail =
        usize::try_from(chain.total_workers).ok().and_then(|n| n.checked_sub(1)).and_then(|i| chain.ranges.get(i));
    let original = tail.is_some_and(|&tail| tail.is_tail && *ack == fresh_ack(tail));
    leap || original
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
        let m1 = apply(&mut w[0], &msg);
        assert_eq!((m1.kind, m1.worker_index), (ControlType::ResizeChain, 1));
        let m2 = apply(&mut w[1], &m1);
        let m3 = apply(&mut w[2], &m2);
        assert_eq!(m3.kind, ControlType::Ack);
        assert_eq!(w[0].range, LayerRange { start_layer: 0, end_layer: 10, is_tail: false });
        assert_eq!(w[2].range, LayerRange { start_layer: 20, end_layer: 32, is_tail: true });
        assert!(m3.validate().is_ok());
    }

    /// What an original tail sends back: its own range, the rest zero.
    fn original_ack(start_layer: i32, end_layer: i32, is_tail: bool) -> ControlMessage {
        let mut ack = ControlMessage::new(ControlType::Ack);
        (ack.split_layer, ack.end_layer, ack.is_tail) = (start_layer, end_layer, is_tail);
        ack
    }

    #[test]
    fn head_takes_the_ack_of_a_leap_tail_and_of_an_original_tail() {
        let msg = chain(2, 32);
        let mut w = [Layers::default(); 2];
        let m1 = apply(&mut w[0], &msg);
        let leap = apply(&mut w[1], &m1);
        assert!(acknowledges(&msg, &leap), "{leap:?}");
        assert!(acknowledges(&msg, &original_ack(16, 32, true)));
        // An original tail of one worker gets the whole range.
        assert!(acknowledges(&chain(1, 32), &original_ack(0, 32, true)));
    }

    #[test]
    fn head_refuses_acks_that_do_not_answer_its_chain() {
        let msg = chain(2, 32);
        // The original's form with a range the chain did not give the tail.
        assert!(!acknowledges(&msg, &original_ack(0, 16, false)));
        assert!(!acknowledges(&msg, &original_ack(0, 16, true)));
        assert!(!acknowledges(&msg, &original_ack(16, 32, false)));
        assert!(!acknowledges(&msg, &original_ack(16, 31, true)));
        // The original's form with anything else set.
        let mut extra = original_ack(16, 32, true);
        extra.worker_index = 1;
        assert!(!acknowledges(&msg, &extra));
        let mut extra = original_ack(16, 32, true);
        extra.ranges[0].end_layer = 16;
        assert!(!acknowledges(&msg, &extra));
        // Leap's form of another chain, or not at its end.
        let mut w = [Layers::default(); 3];
        let other = chain(3, 32);
        let m1 = apply(&mut w[0], &other);
        let m2 = apply(&mut w[1], &m1);
        let other_ack = apply(&mut w[2], &m2);
        assert!(acknowledges(&other, &other_ack));
        assert!(!acknowledges(&msg, &other_ack));
        let mut early = msg;
        early.kind = ControlType::Ack;
        early.worker_index = 1;
        assert!(!acknowledges(&msg, &early));
        // The chain itself come back round is no ACK.
        let mut back = msg;
        back.worker_index = 2;
        assert!(!acknowledges(&msg, &back));
    }

    #[test]
    fn worker_answers_resize_layers_as_the_original_and_forwards_acks_unchanged() {
        let mut resize = ControlMessage::new(ControlType::ResizeLayers);
        (resize.split_layer, resize.end_layer, resize.is_tail) = (8, 32, true);
        let mut layers = Layers::default();
        assert_eq!(apply(&mut layers, &resize), original_ack(8, 32, true));
        assert_eq!(layers.range, LayerRange { start_layer: 8, end_layer: 32, is_tail: true });
        let msg = chain(2, 32);
        let m1 = apply(&mut Layers::default(), &msg);
        let leap = apply(&mut Layers::default(), &m1);
        for ack in [leap, original_ack(16, 32, true)] {
            let mut layers = Layers::default();
            assert_eq!(apply(&mut layers, &ack), ack);
            assert_eq!(layers, Layers::default(), "an ACK changed a worker's layers");
        }
    }
}
