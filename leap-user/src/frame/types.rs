//! The plain types frames are received as and dropped datagrams are counted
//! in: shared by reassembly and every transport (re-exported from
//! [`crate::transport`], where embedders find them).

use serde::Serialize;

/// What a received frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FrameKind {
    /// Activations (header + floats).
    Data,
    /// A control message (0xC0DE marker + message, zero padded).
    Control,
}

/// A frame written into the caller's buffer by
/// [`Transport::recv_prev`](crate::transport::Transport::recv_prev).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Bytes of the frame at the start of the buffer.
    pub len: usize,
    /// Data or control.
    pub kind: FrameKind,
}

/// Declares a struct of counters (`u64`s and structs of counters, every
/// field `pub`) and its `add`, which adds each field of another instance:
/// a counter added to the struct is summed without a line more.
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        impl $name {
            /// Adds another instance's counters, every field (for ring-wide
            /// sums).
            pub fn add(&mut self, o: &Self) {
                $($crate::frame::types::AddCounters::add_counters(&mut self.$field, &o.$field);)*
            }
        }
    };
}
pub(crate) use counters;

/// A field of a [`counters!`] struct: how it is summed.
pub(crate) trait AddCounters {
    /// Adds `o` to `self`.
    fn add_counters(&mut self, o: &Self);
}

impl AddCounters for u64 {
    fn add_counters(&mut self, o: &Self) {
        *self += *o;
    }
}

impl AddCounters for Drops {
    fn add_counters(&mut self, o: &Self) {
        self.add(o);
    }
}

counters! {
/// Datagrams dropped on receive, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Drops {
    /// Shorter than a chunk header.
    pub short: u64,
    /// Not "LEAP".
    pub bad_magic: u64,
    /// `chunk_id >= total_chunks` or `total_chunks == 0`.
    pub bad_chunk_id: u64,
    /// More than 1400 payload bytes.
    pub oversize: u64,
    /// A non-last chunk that is not full, or an empty last chunk.
    pub bad_length: u64,
    /// `total_chunks` disagrees with earlier chunks of the same seq.
    pub total_mismatch: u64,
    /// From a source other than the configured previous node.
    pub wrong_source: u64,
    /// A chunk already received.
    pub duplicate: u64,
    /// A chunk of a frame already delivered or given up.
    pub stale: u64,
    /// A chunk too far ahead of the frame being assembled.
    pub out_of_window: u64,
    /// A frame larger than the receive buffer.
    pub too_large: u64,
    /// A complete frame whose CRC32C did not match (dropped; fetched again
    /// in reliable mode).
    pub bad_crc: u64,
    /// A wrong IPv4 header checksum (XDP receive path).
    pub bad_ip_checksum: u64,
    /// A wrong UDP checksum (XDP receive path; partial ones where they
    /// cannot be legitimate).
    pub bad_udp_checksum: u64,
    /// A unicast destination MAC of another host (XDP receive path).
    pub foreign_mac: u64,
    /// A VLAN the interface is not configured for (XDP receive path).
    pub foreign_vlan: u64,
    /// A destination address that is not this host's (XDP receive path).
    pub foreign_dst: u64,
    /// An IPv6 source `::ffff:a.b.c.d` (XDP receive path).
    pub mapped_source: u64,
    /// A frame or datagram whose ring-key tag did not verify: forged,
    /// altered, replayed or reordered (keyed rings only).
    pub bad_tag: u64,
    /// A keyed datagram whose tag verified but that was taken before, is
    /// too old for the replay window, or comes from an older run of its
    /// sender (keyed rings only).
    pub replayed: u64,
    /// A datagram whose keying is not this node's: without a ring-key tag
    /// (an unkeyed leap node or an original peer) at a keyed node, or a
    /// keyed chunk at an unkeyed node. Refused.
    pub unkeyed: u64,
}
}

impl Drops {
    /// All drops.
    pub fn total(&self) -> u64 {
        self.short
            + self.bad_magic
            + self.bad_chunk_id
            + self.oversize
            + self.bad_length
            + self.total_mismatch
            + self.wrong_source
            + self.duplicate
            + self.stale
            + self.out_of_window
            + self.too_large
            + self.bad_crc
            + self.bad_ip_checksum
            + self.bad_udp_checksum
            + self.foreign_mac
            + self.foreign_vlan
            + self.foreign_dst
            + self.mapped_source
            + self.bad_tag
            + self.replayed
            + self.unkeyed
    }

    /// Counts a chunk-header parse error.
    pub fn count_parse(&mut self, e: leap_common::chunk::ChunkError) {
        use leap_common::chunk::ChunkError as E;
        match e {
            E::Short => self.short += 1,
            E::BadMagic => self.bad_magic += 1,
            E::ZeroTotal | E::BadChunkId => self.bad_chunk_id += 1,
            E::Oversize => self.oversize += 1,
            E::BadLength => self.bad_length += 1,
        }
    }
}
