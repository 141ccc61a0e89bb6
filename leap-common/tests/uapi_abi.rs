//! Proves that `leap_common::kmod` agrees with the kernel module's C header
//! `kmod/leap_uapi.h`: a C program compiled against the header prints the
//! sizes, field offsets, ioctl numbers and constants, and each is compared
//! with the Rust mirror.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use leap_common::kmod::*;

/// Every value checked: (C expression, Rust value).
fn expected() -> Vec<(&'static str, u64)> {
    macro_rules! off {
        ($c:literal, $t:ty, $($f:tt)+) => {
            (concat!("offsetof(struct ", $c, ", ", stringify!($($f)+), ")"), offset_of!($t, $($f)+) as u64)
        };
    }
    vec![
        ("sizeof(struct leap_bank_metadata)", size_of::<BankMetadata>() as u64),
        off!("leap_bank_metadata", BankMetadata, bank_idx),
        off!("leap_bank_metadata", BankMetadata, saddr),
        off!("leap_bank_metadata", BankMetadata, sport),
        ("sizeof(struct leap_counters)", size_of::<Counters>() as u64),
        off!("leap_counters", Counters, rx_chunks),
        off!("leap_counters", Counters, rx_duplicates),
        off!("leap_counters", Counters, rx_frames_completed),
        off!("leap_counters", Counters, rx_frames_delivered),
        off!("leap_counters", Counters, rx_frames_timed_out),
        off!("leap_counters", Counters, rx_lost_overflow),
        off!("leap_counters", Counters, rx_passthrough),
        off!("leap_counters", Counters, rx_not_leap),
        off!("leap_counters", Counters, drop_short),
        off!("leap_counters", Counters, drop_bad_chunk_id),
        off!("leap_counters", Counters, drop_oversize),
        off!("leap_counters", Counters, drop_bad_length),
        off!("leap_counters", Counters, drop_total_mismatch),
        off!("leap_counters", Counters, drop_too_big),
        off!("leap_counters", Counters, drop_peer),
        off!("leap_counters", Counters, drop_bad_checksum),
        off!("leap_counters", Counters, drop_bank_busy),
        off!("leap_counters", Counters, drop_stale),
        off!("leap_counters", Counters, drop_source_mismatch),
        off!("leap_counters", Counters, tx_frames),
        off!("leap_counters", Counters, tx_chunks),
        off!("leap_counters", Counters, tx_errors),
        off!("leap_counters", Counters, drop_stranger),
        off!("leap_counters", Counters, drop_not_unicast),
        off!("leap_counters", Counters, _reserved),
        ("sizeof(struct leap_info)", size_of::<Info>() as u64),
        off!("leap_info", Info, abi_version),
        off!("leap_info", Info, info_size),
        off!("leap_info", Info, features),
        off!("leap_info", Info, scope),
        off!("leap_info", Info, open_files),
        off!("leap_info", Info, rx_banks),
        off!("leap_info", Info, bank_size),
        off!("leap_info", Info, tx_size),
        off!("leap_info", Info, chunk_payload_max),
        off!("leap_info", Info, frame_timeout_ms),
        off!("leap_info", Info, port),
        off!("leap_info", Info, tx_port),
        off!("leap_info", Info, dest_addr),
        off!("leap_info", Info, peer_addr),
        off!("leap_info", Info, peer_port),
        off!("leap_info", Info, busy_wait_limit),
        off!("leap_info", Info, counters),
        ("sizeof(struct leap_peer)", size_of::<Peer>() as u64),
        off!("leap_peer", Peer, addr),
        off!("leap_peer", Peer, port),
        ("sizeof(struct leap_wait)", size_of::<Wait>() as u64),
        off!("leap_wait", Wait, timeout_ms),
        off!("leap_wait", Wait, status),
        off!("leap_wait", Wait, bank),
        off!("leap_wait", Wait, len),
        off!("leap_wait", Wait, saddr),
        off!("leap_wait", Wait, sport),
        off!("leap_wait", Wait, seq),
        off!("leap_wait", Wait, total_chunks),
        off!("leap_wait", Wait, flags),
        off!("leap_wait", Wait, chunks),
        ("sizeof(struct leap_send)", size_of::<Send>() as u64),
        off!("leap_send", Send, len),
        off!("leap_send", Send, flags),
        off!("leap_send", Send, seq),
        ("LEAP_IOCTL_WAIT_DATA", IOCTL_WAIT_DATA.into()),
        ("LEAP_IOCTL_SET_DEST", IOCTL_SET_DEST.into()),
        ("LEAP_IOCTL_SET_PORT", IOCTL_SET_PORT.into()),
        ("LEAP_IOCTL_SEND", IOCTL_SEND.into()),
        ("LEAP_IOCTL_SET_TX_PORT", IOCTL_SET_TX_PORT.into()),
        ("LEAP_IOCTL_GET_BANK_SRC", IOCTL_GET_BANK_SRC.into()),
        ("LEAP_IOCTL_GET_INFO", IOCTL_GET_INFO.into()),
        ("LEAP_IOCTL_RELEASE_BANK", IOCTL_RELEASE_BANK.into()),
        ("LEAP_IOCTL_SET_PEER", IOCTL_SET_PEER.into()),
        ("LEAP_IOCTL_WAIT_FRAME", IOCTL_WAIT_FRAME.into()),
        ("LEAP_IOCTL_SET_FRAME_TIMEOUT", IOCTL_SET_FRAME_TIMEOUT.into()),
        ("LEAP_IOCTL_SEND_FRAME", IOCTL_SEND_FRAME.into()),
        ("LEAP_ABI_VERSION", ABI_VERSION.into()),
        ("LEAP_HALF_SIZE", HALF_LEN as u64),
        ("LEAP_MMAP_SIZE", MMAP_LEN as u64),
        ("LEAP_RX_BANKS", RX_BANKS as u64),
        ("LEAP_BANK_SIZE", BANK_LEN as u64),
        ("LEAP_TX_OFFSET", TX_OFFSET as u64),
        ("LEAP_BANK_CHUNKS_MAX", BANK_CHUNKS_MAX as u64),
        ("LEAP_CHUNK_MAGIC", leap_common::chunk::LEAP_MAGIC.into()),
        ("LEAP_CHUNK_HDR_LEN", leap_common::chunk::CHUNK_HEADER_LEN as u64),
        ("LEAP_CHUNK_PAYLOAD_MAX", leap_common::chunk::CHUNK_PAYLOAD_MAX as u64),
        ("LEAP_CHUNK_F_LEAP", leap_common::chunk::flags::LEAP.into()),
        ("LEAP_CHUNK_KIND_MASK", leap_common::chunk::flags::KIND_MASK.into()),
        ("LEAP_IOCTL_MAGIC", IOCTL_MAGIC.into()),
        ("LEAP_INFO_SCOPE_FILE", INFO_SCOPE_FILE.into()),
        ("LEAP_INFO_SCOPE_MODULE", INFO_SCOPE_MODULE.into()),
        ("LEAP_WAIT_FOREVER", WAIT_FOREVER.into()),
        ("LEAP_WAIT_STATUS_FRAME", WAIT_STATUS_FRAME.into()),
        ("LEAP_WAIT_STATUS_LOST", WAIT_STATUS_LOST.into()),
        ("LEAP_FEAT_PER_OPEN", features::PER_OPEN),
        ("LEAP_FEAT_RELEASE_BANK", features::RELEASE_BANK),
        ("LEAP_FEAT_PEER_FILTER", features::PEER_FILTER),
        ("LEAP_FEAT_WAIT_FRAME", features::WAIT_FRAME),
        ("LEAP_FEAT_LOST_REPORT", features::LOST_REPORT),
        ("LEAP_FEAT_RX_CSUM", features::RX_CSUM),
        ("LEAP_FEAT_TX_CSUM", features::TX_CSUM),
        ("LEAP_FEAT_FRAGMENTS", features::FRAGMENTS),
        ("LEAP_FEAT_SEND_FRAME", features::SEND_FRAME),
        ("LEAP_FEAT_POLL", features::POLL),
        ("LEAP_FEAT_FRAME_TIMEOUT", features::FRAME_TIMEOUT),
        ("LEAP_FEAT_LOCAL_ONLY", features::LOCAL_ONLY),
        ("LEAP_FEAT_SENDER_LOCK", features::SENDER_LOCK),
        ("LEAP_FEAT_TRAINS", features::TRAINS),
        ("LEAP_TRAIN_CHUNKS_MAX", leap_common::chunk::TRAIN_CHUNKS_MAX as u64),
    ]
}

/// Compiles and runs a C program printing `expr value` for every expression.
fn values_from_c(exprs: &[&str]) -> BTreeMap<String, u64> {
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kmod/leap_uapi.h");
    let header = header.canonicalize().expect("kmod/leap_uapi.h exists");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("uapi_abi");
    std::fs::create_dir_all(&dir).unwrap();
    let mut src =
        format!("#include <stdio.h>\n#include <stddef.h>\n#include \"{}\"\nint main(void)\n{{\n", header.display());
    for e in exprs {
        src.push_str(&format!("\tprintf(\"%s %llu\\n\", \"{e}\", (unsigned long long)({e}));\n"));
    }
    src.push_str("\treturn 0;\n}\n");
    let c = dir.join("abi.c");
    let exe = dir.join("abi");
    std::fs::write(&c, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc} (a C compiler is needed to check the header): {e}"));
    assert!(out.status.success(), "compiling against leap_uapi.h failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn rust_mirror_matches_leap_uapi_h() {
    let expected = expected();
    let exprs: Vec<&str> = expected.iter().map(|(e, _)| *e).collect();
    let c = values_from_c(&exprs);
    let mismatches: Vec<String> = expected
        .iter()
        .filter(|(e, v)| c.get(*e) != Some(v))
        .map(|(e, v)| format!("{e}: C says {:?}, Rust says {v}", c.get(*e)))
        .collect();
    assert!(mismatches.is_empty(), "leap_uapi.h and leap_common::kmod disagree:\n{}", mismatches.join("\n"));
}

#[test]
fn every_struct_field_is_checked() {
    // Sum of the field sizes equals the struct size (no hidden padding), so
    // checking each field's offset pins the whole layout.
    assert_eq!(size_of::<Info>(), 64 + size_of::<Counters>());
    assert_eq!(size_of::<Counters>(), 22 * 8 + 10 * 8);
}
