//! The plain structs and constants of the C API: frame kinds, control
//! messages (the original's `ControlMessage`), counters.

use leap_common::control::{ControlMessage, ControlType, LayerRange, MAX_WORKERS};
use leap_rs::transport::{Drops, FrameKind, Stats};

use crate::error::{Error, leap_status};

/// Whether a frame carries activations or a control message.
#[repr(C)]
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum leap_frame_kind {
    /// Activations (an 8-byte header and `dim` floats, in the engines).
    LEAP_FRAME_DATA = 0,
    /// A control message, padded with zeros to the frame length.
    LEAP_FRAME_CONTROL = 1,
}

impl From<FrameKind> for leap_frame_kind {
    fn from(k: FrameKind) -> Self {
        match k {
            FrameKind::Data => Self::LEAP_FRAME_DATA,
            FrameKind::Control => Self::LEAP_FRAME_CONTROL,
        }
    }
}

/// `leap_control.kind`: one worker changes its layers.
pub const LEAP_CONTROL_RESIZE_LAYERS: u8 = 1;
/// `leap_control.kind`: every worker takes `ranges[worker_index]`,
/// increments `worker_index` and forwards.
pub const LEAP_CONTROL_RESIZE_CHAIN: u8 = 2;
/// `leap_control.kind`: the answer travelling back to the head.
pub const LEAP_CONTROL_ACK: u8 = 3;
/// Workers a RESIZE_CHAIN message describes at most.
pub const LEAP_MAX_WORKERS: usize = 16;
/// The shortest control frame: the 0xC0DE marker and the 162-byte packed
/// message. `leap_send_control` pads to the frame length given.
pub const LEAP_CONTROL_FRAME_MIN: usize = 164;
/// The u16 at the start of a control frame, in host byte order.
pub const LEAP_CONTROL_MARKER: u16 = 0xC0DE;

// The header's numbers are the library's.
const _: () = assert!(LEAP_CONTROL_RESIZE_LAYERS == ControlType::ResizeLayers as u8);
const _: () = assert!(LEAP_CONTROL_RESIZE_CHAIN == ControlType::ResizeChain as u8);
const _: () = assert!(LEAP_CONTROL_ACK == ControlType::Ack as u8);
const _: () = assert!(LEAP_MAX_WORKERS == MAX_WORKERS);
const _: () = assert!(LEAP_CONTROL_FRAME_MIN == leap_common::control::CONTROL_FRAME_MIN);
const _: () = assert!(LEAP_CONTROL_MARKER == leap_common::control::CONTROL_MARKER);

/// Layers assigned to one worker.
#[repr(C)]
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct leap_layer_range {
    /// First layer (inclusive).
    pub start_layer: i32,
    /// Last layer (exclusive).
    pub end_layer: i32,
    /// 1: this worker is the tail of the ring; 0: not.
    pub is_tail: u8,
    /// Zero.
    pub reserved: [u8; 3],
}

/// A control message (layer re-assignment), field for field the original
/// engine's `ControlMessage`; on the wire it is the packed 162-byte form
/// after the 0xC0DE marker.
#[repr(C)]
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct leap_control {
    /// `LEAP_CONTROL_RESIZE_LAYERS`, `LEAP_CONTROL_RESIZE_CHAIN` or
    /// `LEAP_CONTROL_ACK`.
    pub kind: u8,
    /// RESIZE_LAYERS: 1 when the receiver becomes the tail.
    pub is_tail: u8,
    /// Zero.
    pub reserved: [u8; 2],
    /// RESIZE_LAYERS: first layer.
    pub split_layer: i32,
    /// RESIZE_LAYERS: end layer.
    pub end_layer: i32,
    /// RESIZE_CHAIN: index of the worker that reads this message.
    pub worker_index: i32,
    /// RESIZE_CHAIN: workers in `ranges` (0..=16).
    pub total_workers: i32,
    /// RESIZE_CHAIN: one range per worker.
    pub ranges: [leap_layer_range; LEAP_MAX_WORKERS],
}

const _: () = assert!(size_of::<leap_layer_range>() == 12);
const _: () = assert!(size_of::<leap_control>() == 20 + 12 * LEAP_MAX_WORKERS);

fn flag(v: u8, what: &str) -> Result<bool, Error> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::new(leap_status::LEAP_ERR_CONTROL, format_args!("{what} is {v}: use 0 or 1"))),
    }
}

impl leap_control {
    /// The message in the library's form.
    ///
    /// # Errors
    ///
    /// `LEAP_ERR_CONTROL` for an unknown kind or a flag other than 0 or 1.
    pub fn to_message(&self) -> Result<ControlMessage, Error> {
        let kind = match self.kind {
            LEAP_CONTROL_RESIZE_LAYERS => ControlType::ResizeLayers,
            LEAP_CONTROL_RESIZE_CHAIN => ControlType::ResizeChain,
            LEAP_CONTROL_ACK => ControlType::Ack,
            k => {
                return Err(Error::new(
                    leap_status::LEAP_ERR_CONTROL,
                    format_args!("control kind {k}: use LEAP_CONTROL_RESIZE_LAYERS, _RESIZE_CHAIN or _ACK"),
                ));
            }
        };
        let mut m = ControlMessage::new(kind);
        m.split_layer = self.split_layer;
        m.end_layer = self.end_layer;
        m.is_tail = flag(self.is_tail, "is_tail")?;
        m.worker_index = self.worker_index;
        m.total_workers = self.total_workers;
        for (i, (r, c)) in m.ranges.iter_mut().zip(&self.ranges).enumerate() {
            *r = LayerRange {
                start_layer: c.start_layer,
                end_layer: c.end_layer,
                is_tail: flag(c.is_tail, &format!("ranges[{i}].is_tail"))?,
            };
        }
        Ok(m)
    }

    /// The C form of a message.
    pub fn from_message(m: &ControlMessage) -> Self {
        let mut c = Self {
            kind: m.kind as u8,
            is_tail: u8::from(m.is_tail),
            split_layer: m.split_layer,
            end_layer: m.end_layer,
            worker_index: m.worker_index,
            total_workers: m.total_workers,
            ..Self::default()
        };
        for (c, r) in c.ranges.iter_mut().zip(&m.ranges) {
            *c = leap_layer_range {
                start_layer: r.start_layer,
                end_layer: r.end_layer,
                is_tail: u8::from(r.is_tail),
                reserved: [0; 3],
            };
        }
        c
    }
}

/// Datagrams dropped on receive, by reason (the library's `Drops`).
#[repr(C)]
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct leap_drops {
    /// Shorter than a chunk header.
    pub too_short: u64,
    /// Not starting with the LEAP magic.
    pub bad_magic: u64,
    /// A chunk id beyond the frame's chunks.
    pub bad_chunk_id: u64,
    /// Longer than any chunk or train.
    pub oversize: u64,
    /// A payload length that breaks the data rule.
    pub bad_length: u64,
    /// Chunks of one frame disagreeing on the chunk count.
    pub total_mismatch: u64,
    /// From another source than the previous node.
    pub wrong_source: u64,
    /// A chunk already taken.
    pub duplicate: u64,
    /// Of a frame already delivered or given up.
    pub stale: u64,
    /// Too far ahead of the expected frame.
    pub out_of_window: u64,
    /// Of a frame larger than the receiver takes.
    pub too_large: u64,
    /// Frames whose CRC32C did not match.
    pub bad_crc: u64,
    /// IPv4 header checksum wrong (XDP paths).
    pub bad_ip_checksum: u64,
    /// UDP checksum wrong (XDP paths).
    pub bad_udp_checksum: u64,
    /// To another host's MAC (XDP paths).
    pub foreign_mac: u64,
    /// On a VLAN the node was not given (XDP paths).
    pub foreign_vlan: u64,
    /// To another host's address (XDP paths).
    pub foreign_dst: u64,
    /// From a v4-mapped IPv6 source (XDP paths).
    pub mapped_source: u64,
    /// A frame or datagram whose ring-key tag did not verify.
    pub bad_tag: u64,
    /// A keyed datagram taken before, too old, or from an older run.
    pub replayed: u64,
    /// Without a ring-key tag at a keyed node, or keyed at an unkeyed one.
    pub unkeyed: u64,
}

/// Counters of one transport (both halves of a split one), the library's
/// `Stats`; `copied_bytes` includes what this binding copied (a frame
/// peeked with `leap_peek_prev`, then received with `leap_recv_prev`).
#[repr(C)]
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct leap_stats {
    /// Frames handed to the network.
    pub frames_sent: u64,
    /// Frames delivered to the caller.
    pub frames_received: u64,
    /// Datagrams (chunks) sent, retransmissions included.
    pub chunks_sent: u64,
    /// Datagrams that carried frames' first copies (a train counts once).
    pub datagrams_sent: u64,
    /// Valid chunks taken into a frame.
    pub chunks_received: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Payload bytes delivered.
    pub bytes_received: u64,
    /// Frames given up.
    pub frames_lost: u64,
    /// Chunks sent again in answer to a NACK.
    pub retransmits: u64,
    /// Chunks only a retransmission or probe brought (really lost).
    pub chunks_recovered: u64,
    /// Tail-loss probes sent.
    pub probes: u64,
    /// NACKs sent to the previous node.
    pub nacks_sent: u64,
    /// NACKs received from the next node.
    pub nacks_received: u64,
    /// Receives that hit their deadline (a receive that does not wait is
    /// not counted).
    pub timeouts: u64,
    /// NACKs refused: too many for one frame.
    pub nacks_refused: u64,
    /// NACKs for frames no longer kept.
    pub nacks_unknown: u64,
    /// Sends that failed.
    pub send_errors: u64,
    /// Hellos sent.
    pub hellos_sent: u64,
    /// Hellos taken from a neighbour.
    pub hellos_received: u64,
    /// Datagrams the kernel dropped on the node's UDP socket.
    pub kernel_drops: u64,
    /// Frame bytes copied in user space: divided by `bytes_received`, the
    /// copies per hop.
    pub copied_bytes: u64,
    /// Dropped datagrams by reason.
    pub drops: leap_drops,
}

impl leap_stats {
    /// The C form of the library's counters, plus `copied` bytes of the
    /// binding. Every field is named: a counter added to the library fails
    /// to compile here until it is mirrored.
    pub fn from_stats(s: &Stats, copied: u64) -> Self {
        let Stats {
            frames_sent,
            frames_received,
            chunks_sent,
            datagrams_sent,
            chunks_received,
            bytes_sent,
            bytes_received,
            frames_lost,
            retransmits,
            chunks_recovered,
            probes,
            nacks_sent,
            nacks_received,
            timeouts,
            nacks_refused,
            nacks_unknown,
            send_errors,
            hellos_sent,
            hellos_received,
            kernel_drops,
            copied_bytes,
            drops,
        } = *s;
        let Drops {
            short,
            bad_magic,
            bad_chunk_id,
            oversize,
            bad_length,
            total_mismatch,
            wrong_source,
            duplicate,
            stale,
            out_of_window,
            too_large,
            bad_crc,
            bad_ip_checksum,
            bad_udp_checksum,
            foreign_mac,
            foreign_vlan,
            foreign_dst,
            mapped_source,
            bad_tag,
            replayed,
            unkeyed,
        } = drops;
        Self {
            frames_sent,
            frames_received,
            chunks_sent,
            datagrams_sent,
            chunks_received,
            bytes_sent,
            bytes_received,
            frames_lost,
            retransmits,
            chunks_recovered,
            probes,
            nacks_sent,
            nacks_received,
            timeouts,
            nacks_refused,
            nacks_unknown,
            send_errors,
            hellos_sent,
            hellos_received,
            kernel_drops,
            copied_bytes: copied_bytes + copied,
            drops: leap_drops {
                too_short: short,
                bad_magic,
                bad_chunk_id,
                oversize,
                bad_length,
                total_mismatch,
                wrong_source,
                duplicate,
                stale,
                out_of_window,
                too_large,
                bad_crc,
                bad_ip_checksum,
                bad_udp_checksum,
                foreign_mac,
                foreign_vlan,
                foreign_dst,
                mapped_source,
                bad_tag,
                replayed,
                unkeyed,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_round_trip_through_the_c_struct() {
        let mut m = ControlMessage::new(ControlType::ResizeChain);
        m.total_workers = 2;
        m.worker_index = 1;
        m.ranges[1] = LayerRange { start_layer: 16, end_layer: 32, is_tail: true };
        let c = leap_control::from_message(&m);
        assert_eq!((c.kind, c.ranges[1].is_tail, c.ranges[1].end_layer), (2, 1, 32));
        assert_eq!(c.to_message().unwrap(), m);
        let bad = leap_control { kind: 9, ..c };
        assert_eq!(bad.to_message().unwrap_err().status(), leap_status::LEAP_ERR_CONTROL);
        let bad = leap_control { is_tail: 2, ..c };
        assert_eq!(bad.to_message().unwrap_err().status(), leap_status::LEAP_ERR_CONTROL);
    }

    #[test]
    fn stats_keep_every_counter() {
        let mut s = Stats { frames_sent: 1, copied_bytes: 10, ..Stats::default() };
        s.drops.mapped_source = 7;
        let c = leap_stats::from_stats(&s, 5);
        assert_eq!((c.frames_sent, c.copied_bytes, c.drops.mapped_source), (1, 15, 7));
    }
}
