//! The kernel module `leap_kmod` for real: these tests need `/dev/leap_tensor`
//! and root, so they are ignored by plain `cargo test` and run inside the VM
//! by `cargo xtask vm` (`kmod_vm --ignored --test-threads=1`).
//!
//! Packets are crafted with std sockets (and raw IPv4 sockets for checksums
//! and fragments) to 127.0.0.1 only; every wait is bounded.

mod member;
mod original;
mod support;

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leap::sys::kmod::Device;
use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_PAYLOAD_MAX, ChunkHeader, flags};
use leap_common::kmod::{
    ABI_VERSION, BANK_FRAME_MAX, BANK_LEN, Counters, DEVICE_PATH, HALF_LEN, INFO_SCOPE_FILE, INFO_SCOPE_MODULE,
    MMAP_LEN, RX_BANKS, WAIT_STATUS_FRAME, WAIT_STATUS_LOST, Wait, features,
};
use nix::poll::{PollFd, PollFlags};

/// Counts allocations per thread: the lending path must make none per frame.
#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

const LO: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// Bound of every wait for the module to act on a packet.
const PATIENCE: Duration = Duration::from_secs(5);
/// Frame timeout of the tests' nodes: long enough that a slow emulated CPU
/// never has a complete burst reported lost.
const FRAME_TIMEOUT: Duration = Duration::from_secs(1);
/// Frame timeout of the tests about lost frames: short, so they show quickly.
const LOST_TIMEOUT: Duration = Duration::from_millis(100);

/// A fresh port per node, so tests never see each other's packets.
fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(21000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// An open device bound to a fresh port.
fn node() -> (Device, u16) {
    let dev = Device::open(Path::new(DEVICE_PATH)).expect("open /dev/leap_tensor");
    let port = next_port();
    dev.set_port(port).expect("LEAP_IOCTL_SET_PORT");
    dev.set_frame_timeout(FRAME_TIMEOUT).expect("LEAP_IOCTL_SET_FRAME_TIMEOUT");
    (dev, port)
}

fn counters(dev: &Device) -> Counters {
    dev.info(INFO_SCOPE_FILE).expect("LEAP_IOCTL_GET_INFO").counters
}

/// Polls the counters until `pred` holds, failing after [`PATIENCE`].
fn wait_counters(dev: &Device, what: &str, pred: impl Fn(&Counters) -> bool) -> Counters {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let c = counters(dev);
        if pred(&c) {
            return c;
        }
        assert!(Instant::now() < deadline, "the module never counted {what}: {c:#?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Deterministic frame bytes that differ per seq.
fn pattern(seq: u16, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(u32::from(seq) * 7 + 1) as u8).collect()
}

fn chunk(seq: u16, chunk_id: u16, total_chunks: u16, reserved: u16, payload: &[u8]) -> Vec<u8> {
    let hdr = ChunkHeader { seq, chunk_id, total_chunks, reserved };
    let mut d = hdr.to_bytes().to_vec();
    d.extend_from_slice(payload);
    d
}

/// Every chunk of `frame` as frame `seq`, as leap's data chunks.
fn chunks_of(seq: u16, frame: &[u8]) -> Vec<Vec<u8>> {
    let total = frame.len().div_ceil(CHUNK_PAYLOAD_MAX) as u16;
    frame.chunks(CHUNK_PAYLOAD_MAX).enumerate().map(|(i, p)| chunk(seq, i as u16, total, flags::LEAP, p)).collect()
}

fn sender() -> UdpSocket {
    UdpSocket::bind((LO, 0)).expect("bind a sender")
}

fn send_all(sock: &UdpSocket, port: u16, datagrams: &[Vec<u8>]) {
    for d in datagrams {
        sock.send_to(d, (LO, port)).expect("send_to");
    }
}

fn wait(dev: &Device, timeout: Duration) -> Option<Wait> {
    dev.wait_frame(Some(timeout)).expect("LEAP_IOCTL_WAIT_FRAME")
}

/// Waits for the next complete frame and checks it is `frame` as seq `seq`.
fn expect_frame(dev: &Device, seq: u16, frame: &[u8]) -> Wait {
    let w = wait(dev, PATIENCE).unwrap_or_else(|| panic!("frame {seq} never completed: {:#?}", counters(dev)));
    assert_eq!(w.status, WAIT_STATUS_FRAME, "{w:?}");
    assert_eq!(w.seq, seq, "{w:?}");
    assert_eq!(w.bank, i32::from(seq) % RX_BANKS as i32);
    assert_eq!(w.len as usize, frame.len());
    let mut got = vec![0u8; frame.len()];
    dev.read_bank(w.bank as usize, 0, &mut got);
    assert!(got == frame, "bank {} does not hold frame {seq}", w.bank);
    w
}

fn banks(dev: &Device) -> Vec<u8> {
    let mut all = vec![0u8; HALF_LEN];
    dev.read_all_banks(&mut all);
    all
}

/// Sends `datagram`, waits until `counter` went up by one, and checks that
/// no byte of any bank changed and no frame or report came out of it.
fn assert_rejected(dev: &Device, port: u16, datagram: &[u8], what: &str, counter: fn(&Counters) -> u64) {
    let before = banks(dev);
    let c0 = counter(&counters(dev));
    sender().send_to(datagram, (LO, port)).expect("send_to");
    // Check the banks whether or not the drop was counted: a wrongly taken
    // chunk must be reported as the write it is.
    let counted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_counters(dev, what, |c| counter(c) == c0 + 1);
    }));
    let after = banks(dev);
    if let Some(i) = (0..HALF_LEN).find(|&i| before[i] != after[i]) {
        panic!("{what}: byte {} of bank {} changed", i % BANK_LEN, i / BANK_LEN);
    }
    if let Err(e) = counted {
        std::panic::resume_unwind(e);
    }
    assert_eq!(wait(dev, Duration::ZERO), None, "{what} produced an event");
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn device_reports_abi_version_features_and_layout() {
    let (dev, port) = node();
    let info = dev.info(INFO_SCOPE_FILE).unwrap();
    assert_eq!(info.abi_version, ABI_VERSION);
    assert_eq!(info.info_size as usize, size_of::<leap_common::kmod::Info>());
    for f in [
        features::PER_OPEN,
        features::RELEASE_BANK,
        features::PEER_FILTER,
        features::WAIT_FRAME,
        features::LOST_REPORT,
        features::RX_CSUM,
        features::TX_CSUM,
        features::FRAGMENTS,
        features::SEND_FRAME,
        features::TRAINS,
    ] {
        assert_ne!(info.features & f, 0, "feature bit {f:#x} missing");
    }
    assert_eq!(info.rx_banks as usize, RX_BANKS);
    assert_eq!(info.bank_size as usize, BANK_LEN);
    assert_eq!(info.tx_size as usize, HALF_LEN);
    assert_eq!(info.port, port);
    assert_eq!(info.frame_timeout_ms, 1000);
    assert!(info.open_files >= 1);
    assert_eq!(info.counters, Counters::default());
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn complete_frame_lands_in_bank_seq_mod_64_at_chunk_offsets() {
    let (dev, port) = node();
    let tx = sender();
    let frame = pattern(70, 3 * CHUNK_PAYLOAD_MAX - 100);
    let mut cs = chunks_of(70, &frame);
    cs.reverse(); // order of arrival does not matter
    send_all(&tx, port, &cs);
    let w = expect_frame(&dev, 70, &frame);
    assert_eq!(w.bank, 6);
    assert_eq!((w.total_chunks, w.chunks), (3, 3));
    assert_eq!(w.saddr, u32::from_ne_bytes(LO.octets()));
    assert_eq!(w.sport, tx.local_addr().unwrap().port());
    assert_eq!(w.flags, flags::LEAP);
    // The original's byte order: sport in network order.
    let src = dev.bank_src(6).unwrap();
    assert_eq!((src.saddr, u16::from_be(src.sport)), (w.saddr, w.sport));
    dev.release_bank(6).unwrap();
    let c = counters(&dev);
    assert_eq!((c.rx_chunks, c.rx_frames_completed, c.rx_frames_delivered), (3, 1, 1));
    assert_eq!(c.dropped(), 0, "{c:#?}");
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn original_wait_data_holds_the_bank_until_the_next_call() {
    let (dev, port) = node();
    let tx = sender();
    let first = pattern(1, 2000);
    send_all(&tx, port, &chunks_of(1, &first));
    assert_eq!(dev.wait_data().unwrap(), 1);

    // Seq 65 maps to the bank user space still reads: refused, bytes kept.
    let intruder = pattern(65, 2000);
    send_all(&tx, port, &chunks_of(65, &intruder));
    wait_counters(&dev, "drop_bank_busy", |c| c.drop_bank_busy == 2);
    let mut got = vec![0u8; first.len()];
    dev.read_bank(1, 0, &mut got);
    assert!(got == first, "a held bank was overwritten");

    // The next WAIT_DATA releases bank 1 implicitly, as the original did.
    let second = pattern(2, 100);
    send_all(&tx, port, &chunks_of(2, &second));
    assert_eq!(dev.wait_data().unwrap(), 2);
    send_all(&tx, port, &chunks_of(65, &intruder));
    assert_eq!(dev.wait_data().unwrap(), 1);
    dev.read_bank(1, 0, &mut got);
    assert!(got == intruder);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn explicitly_held_banks_stay_held_until_released() {
    let (dev, port) = node();
    let tx = sender();
    let frame = pattern(3, 1400);
    send_all(&tx, port, &chunks_of(3, &frame));
    expect_frame(&dev, 3, &frame);
    send_all(&tx, port, &chunks_of(3 + 64, &pattern(67, 1400)));
    wait_counters(&dev, "drop_bank_busy", |c| c.drop_bank_busy == 1);
    assert_eq!(dev.release_bank(3).map_err(|e| e.raw_os_error()), Ok(()));
    // Releasing twice, or a bank out of range, is refused.
    assert_eq!(dev.release_bank(3).map_err(|e| e.raw_os_error()), Err(Some(libc::EINVAL)));
    assert_eq!(dev.release_bank(64).map_err(|e| e.raw_os_error()), Err(Some(libc::EINVAL)));
    let frame = pattern(67, 1400);
    send_all(&tx, port, &chunks_of(67, &frame));
    expect_frame(&dev, 67, &frame);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn oldest_complete_frame_is_delivered_first_across_the_bank_wrap() {
    let (dev, port) = node();
    let tx = sender();
    // Banks 62, 63, 0, 1: the original returned bank 0 first.
    let seqs = [62u16, 63, 64, 65];
    let frames: Vec<Vec<u8>> = seqs.iter().map(|&s| pattern(s, 1500)).collect();
    for (s, f) in seqs.iter().zip(&frames) {
        send_all(&tx, port, &chunks_of(*s, f));
    }
    wait_counters(&dev, "4 completed frames", |c| c.rx_frames_completed == 4);
    for (s, f) in seqs.iter().zip(&frames) {
        let w = expect_frame(&dev, *s, f);
        dev.release_bank(w.bank as u32).unwrap();
    }
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn oversize_payload_never_changes_any_bank() {
    let (dev, port) = node();
    // The original wrote chunk 92's 3000 bytes past the end of bank 5.
    let d = chunk(5, 92, 93, flags::LEAP, &[0xAB; 3000]);
    assert_rejected(&dev, port, &d, "drop_oversize", |c| c.drop_oversize);
    let d = chunk(5, 0, 1, 0, &[0xAB; CHUNK_PAYLOAD_MAX + 1]);
    assert_rejected(&dev, port, &d, "drop_oversize", |c| c.drop_oversize);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn chunk_trains_are_split_and_every_chunk_taken() {
    let (dev, port) = node();
    let tx = sender();
    // 16 392 bytes: 12 chunks, sent as trains of 6 and 6, then one of 5
    // full chunks and the short last one of another frame, then in the
    // kernel's GSO form (two trains in one send, as leap cuts them).
    let trains = |seq: u16, per: usize| -> Vec<Vec<u8>> {
        let frame = pattern(seq, 16_392);
        chunks_of(seq, &frame).chunks(per).map(|t| t.concat()).collect()
    };
    send_all(&tx, port, &trains(7, 6));
    expect_frame(&dev, 7, &pattern(7, 16_392));
    dev.release_bank(7).unwrap();
    let t = trains(8, 5);
    assert_eq!(t.len(), 3);
    send_all(&tx, port, &t);
    expect_frame(&dev, 8, &pattern(8, 16_392));
    dev.release_bank(8).unwrap();
    let c = counters(&dev);
    assert_eq!((c.rx_chunks, c.rx_frames_completed), (24, 2));
    assert_eq!(c.dropped(), 0, "{c:#?}");
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn trains_that_are_not_all_chunks_never_change_any_bank() {
    let (dev, port) = node();
    let frame = pattern(9, 3 * CHUNK_PAYLOAD_MAX);
    let cs = chunks_of(9, &frame);
    // The second piece lacks the magic: one oversize datagram, nothing taken.
    let mut bad = cs.concat();
    bad[CHUNK_DATAGRAM_MAX] ^= 0xFF;
    assert_rejected(&dev, port, &bad, "drop_oversize", |c| c.drop_oversize);
    // A last piece too short for a header.
    let mut short = cs[..2].concat();
    short.extend_from_slice(&cs[2][..5]);
    assert_rejected(&dev, port, &short, "drop_oversize", |c| c.drop_oversize);
    // Longer than the longest train.
    let long: Vec<u8> = (0..7).flat_map(|i| chunk(10, i, 7, flags::LEAP, &[1; CHUNK_PAYLOAD_MAX])).collect();
    assert_rejected(&dev, port, &long, "drop_oversize", |c| c.drop_oversize);
    assert_eq!(counters(&dev).rx_chunks, 0);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn bad_chunk_id_never_changes_any_bank() {
    let (dev, port) = node();
    let d = chunk(7, 4, 4, flags::LEAP, &[0xAB; 100]);
    assert_rejected(&dev, port, &d, "drop_bad_chunk_id (id == total)", |c| c.drop_bad_chunk_id);
    let d = chunk(7, 0, 0, flags::LEAP, &[0xAB; 100]);
    assert_rejected(&dev, port, &d, "drop_bad_chunk_id (total 0)", |c| c.drop_bad_chunk_id);
    let d = chunk(7, u16::MAX, 3, 0, &[0xAB; 100]);
    assert_rejected(&dev, port, &d, "drop_bad_chunk_id (id 65535)", |c| c.drop_bad_chunk_id);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn disagreeing_total_chunks_never_changes_any_bank() {
    let (dev, port) = node();
    // Keep the incomplete frame from being reported lost during the test.
    dev.set_frame_timeout(Duration::from_secs(30)).unwrap();
    let tx = sender();
    // Chunk 0 of a 2-chunk frame is taken...
    tx.send_to(&chunk(9, 0, 2, flags::LEAP, &[0x11; CHUNK_PAYLOAD_MAX]), (LO, port)).unwrap();
    wait_counters(&dev, "rx_chunks", |c| c.rx_chunks == 1);
    // ...then chunk 1 of the same seq claims 3 chunks: rejected, from the
    // same sender (another sender would be a source mismatch).
    let before = banks(&dev);
    tx.send_to(&chunk(9, 1, 3, flags::LEAP, &[0xAB; CHUNK_PAYLOAD_MAX]), (LO, port)).unwrap();
    wait_counters(&dev, "drop_total_mismatch", |c| c.drop_total_mismatch == 1);
    assert!(before == banks(&dev), "a chunk with a disagreeing total_chunks changed a bank");
    // A chunk of the same seq from another sender is refused too: with no
    // peer set, the first sender is locked in.
    let d = chunk(9, 1, 2, flags::LEAP, &[0xAB; 100]);
    assert_rejected(&dev, port, &d, "drop_stranger", |c| c.drop_stranger);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn total_too_big_for_a_bank_never_changes_any_bank() {
    let (dev, port) = node();
    let d = chunk(11, 0, 95, flags::LEAP, &[0xAB; CHUNK_PAYLOAD_MAX]);
    assert_rejected(&dev, port, &d, "drop_too_big", |c| c.drop_too_big);
    // The 94th chunk may hold 872 bytes (131072 in all), not one more.
    let d = chunk(11, 93, 94, flags::LEAP, &[0xAB; BANK_LEN - 93 * CHUNK_PAYLOAD_MAX + 1]);
    assert_rejected(&dev, port, &d, "drop_too_big (last chunk past the bank)", |c| c.drop_too_big);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn short_and_wrong_length_chunks_never_change_any_bank() {
    let (dev, port) = node();
    let full = chunk(12, 0, 1, flags::LEAP, &[0xAB; 20]);
    for len in [0usize, 1, 4, 11] {
        assert_rejected(&dev, port, &full[..len], "drop_short", |c| c.drop_short);
    }
    // Not the last chunk, yet not 1400 bytes.
    let d = chunk(12, 0, 2, flags::LEAP, &[0xAB; 1000]);
    assert_rejected(&dev, port, &d, "drop_bad_length (short middle chunk)", |c| c.drop_bad_length);
    // An empty last chunk.
    let d = chunk(12, 0, 1, flags::LEAP, &[]);
    assert_rejected(&dev, port, &d, "drop_bad_length (empty)", |c| c.drop_bad_length);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn wrong_magic_and_other_kinds_never_change_any_bank() {
    let (dev, port) = node();
    let mut d = chunk(13, 0, 1, flags::LEAP, &[0xAB; 100]);
    d[0] = b'X';
    assert_rejected(&dev, port, &d, "rx_not_leap", |c| c.rx_not_leap);
    // A NACK (kind 2) is not frame data.
    let d = chunk(13, 0, 1, flags::LEAP | 2, &[0xAB; 100]);
    assert_rejected(&dev, port, &d, "rx_passthrough", |c| c.rx_passthrough);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn lost_chunk_surfaces_as_an_error_to_the_waiter() {
    let (dev, port) = node();
    dev.set_frame_timeout(LOST_TIMEOUT).unwrap();
    let tx = sender();
    let cs = chunks_of(20, &pattern(20, 3 * CHUNK_PAYLOAD_MAX));
    send_all(&tx, port, &[cs[0].clone(), cs[2].clone()]); // chunk 1 lost
    let start = Instant::now();
    let w = wait(&dev, PATIENCE).expect("the lost frame was never reported");
    assert!(start.elapsed() < Duration::from_secs(2), "reported after {:?}", start.elapsed());
    assert_eq!(w.status, WAIT_STATUS_LOST, "{w:?}");
    assert_eq!((w.bank, w.seq, w.total_chunks, w.chunks), (-1, 20, 3, 2));
    assert_eq!(counters(&dev).rx_frames_timed_out, 1);

    // The original call reports it as ETIMEDOUT rather than hanging.
    send_all(&tx, port, &cs[..1]);
    let (done_tx, done_rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r = dev.wait_data().map_err(|e| e.raw_os_error());
        let _ = done_tx.send(r);
        dev
    });
    let r = done_rx.recv_timeout(PATIENCE).expect("LEAP_IOCTL_WAIT_DATA hung on a lost frame");
    assert_eq!(r, Err(Some(libc::ETIMEDOUT)));
    let dev = waiter.join().unwrap();

    // The bank is free again: the frame resent in full arrives.
    let frame = pattern(20, 3 * CHUNK_PAYLOAD_MAX);
    send_all(&tx, port, &chunks_of(20, &frame));
    expect_frame(&dev, 20, &frame);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn waiter_sleeps_until_a_frame_arrives_and_times_out_with_nothing() {
    let (dev, port) = node();
    let start = Instant::now();
    assert_eq!(wait(&dev, Duration::from_millis(200)), None);
    assert!(start.elapsed() >= Duration::from_millis(150), "{:?}", start.elapsed());
    let frame = pattern(30, 500);
    let datagrams = chunks_of(30, &frame);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        send_all(&sender(), port, &datagrams);
    });
    expect_frame(&dev, 30, &frame);
    t.join().unwrap();
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn peer_filter_accepts_only_the_configured_sender() {
    let (dev, port) = node();
    let good = sender();
    dev.set_peer(Some(LO), Some(good.local_addr().unwrap().port())).unwrap();
    let d = chunk(40, 0, 1, flags::LEAP, &[0xAB; 100]);
    assert_rejected(&dev, port, &d, "drop_peer", |c| c.drop_peer);
    let frame = pattern(40, 100);
    send_all(&good, port, &chunks_of(40, &frame));
    expect_frame(&dev, 40, &frame);
    // A filter on another address rejects even that sender.
    dev.set_peer(Some(Ipv4Addr::new(127, 0, 0, 2)), None).unwrap();
    let before = counters(&dev).drop_peer;
    send_all(&good, port, &chunks_of(41, &pattern(41, 100)));
    wait_counters(&dev, "drop_peer", |c| c.drop_peer == before + 1);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn open_close_cycles_release_port_socket_and_memory() {
    let port = next_port();
    for i in 0..100 {
        let dev = Device::open(Path::new(DEVICE_PATH)).unwrap_or_else(|e| panic!("open #{i}: {e}"));
        dev.set_port(port).unwrap_or_else(|e| panic!("SET_PORT #{i}: {e}"));
    }
    let (dev, _) = node();
    assert_eq!(dev.info(INFO_SCOPE_FILE).unwrap().open_files, 1);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn two_opens_with_different_ports_coexist_and_share_nothing() {
    let (a, pa) = node();
    let (b, pb) = node();
    assert_eq!(b.set_port(pa).map_err(|e| e.raw_os_error()), Err(Some(libc::EADDRINUSE)));
    b.set_port(pb).unwrap();
    let tx = sender();
    let fa = pattern(1, 3000);
    let fb = pattern(2, 3000);
    send_all(&tx, pa, &chunks_of(5, &fa));
    send_all(&tx, pb, &chunks_of(5, &fb));
    expect_frame(&a, 5, &fa);
    expect_frame(&b, 5, &fb);
    assert_eq!(counters(&a).rx_chunks, 3);
    assert_eq!(counters(&b).rx_chunks, 3);
    let module = a.info(INFO_SCOPE_MODULE).unwrap();
    assert!(module.open_files >= 2 && module.counters.rx_chunks >= 6, "{module:#?}");
}

/// Opens the device until the module refuses, keeping every file open.
fn open_until_refused() -> (Vec<Device>, io::Error) {
    let mut open = Vec::new();
    let err = loop {
        match Device::open(Path::new(DEVICE_PATH)) {
            Ok(d) => open.push(d),
            Err(e) => break e,
        }
        assert!(open.len() <= 64, "no limit on open files");
    };
    (open, err)
}

/// Runs `f` on a thread of its own in a fresh network namespace.
fn in_new_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            f()
        })
        .join()
        .unwrap()
    })
}

/// `max_opens_per_net` (8) per namespace, `max_opens` (16) in all: one
/// namespace never takes the slots of the others.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn opens_beyond_the_namespace_and_module_limits_are_refused() {
    let (here, err) = open_until_refused();
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY));
    assert_eq!(here.len(), 8, "opens from one namespace");
    assert_eq!(here[0].info(INFO_SCOPE_FILE).unwrap().open_files, 8);
    let (there, err) = in_new_netns(open_until_refused);
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY));
    assert_eq!(there.len(), 8, "another namespace still opens, up to its own limit");
    assert_eq!(here[0].info(INFO_SCOPE_MODULE).unwrap().open_files, 16);
    let (third, err) = in_new_netns(open_until_refused);
    assert_eq!((third.len(), err.raw_os_error()), (0, Some(libc::EBUSY)), "the module's limit");
    drop(there);
    let (third, _) = in_new_netns(open_until_refused);
    assert_eq!(third.len(), 8, "slots closed in one namespace serve another");
    drop((here, third));
    Device::open(Path::new(DEVICE_PATH)).expect("a slot is free again");
}

/// A member of the device's group without any capability owns a
/// user namespace (`unshare -Urn`) and so has CAP_NET_ADMIN over its own
/// network namespace. It must not open the device (by default), and a real
/// node must still open afterwards.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn a_group_member_owning_a_user_namespace_cannot_open() {
    let _access = member::DeviceAccess::new(false);
    let mut m = member::Member::spawn(member::Place::OwnUserns, -1, member::open_until_refused);
    assert_eq!(m.report(), [0, libc::EPERM as u8], "[files opened, errno]");
    // Without a capability and without a namespace of its own: refused too.
    let mut plain = member::Member::spawn(member::Place::Here, -1, member::open_until_refused);
    assert_eq!(plain.report(), [0, libc::EPERM as u8], "[files opened, errno]");
    let (dev, port) = node();
    let frame = pattern(3, 2000);
    send_all(&sender(), port, &chunks_of(3, &frame));
    expect_frame(&dev, 3, &frame);
}

/// With `allow_userns=1` (containers), a user namespace's CAP_NET_ADMIN
/// opens, but only up to the per-namespace limit: real nodes still open.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn with_allow_userns_a_user_namespace_opens_only_its_share() {
    let _access = member::DeviceAccess::new(true);
    let mut m = member::Member::spawn(member::Place::OwnUserns, -1, member::open_until_refused);
    assert_eq!(m.report(), [8, libc::EBUSY as u8], "[files opened, errno]");
    let (dev, port) = node();
    let frame = pattern(4, 2000);
    send_all(&sender(), port, &chunks_of(4, &frame));
    expect_frame(&dev, 4, &frame);
    // Without a namespace of its own the member has no capability at all.
    let mut plain = member::Member::spawn(member::Place::Here, -1, member::open_until_refused);
    assert_eq!(plain.report(), [0, libc::EPERM as u8], "[files opened, errno]");
}

/// Module-scope counters (every node's, every namespace's) only for
/// CAP_NET_ADMIN in the initial user namespace: EPERM for a user
/// namespace's root (allow_userns=1) and for a process that holds a file a
/// real node opened but has no capability itself; file scope still answers.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn module_scope_info_needs_cap_net_admin_in_the_initial_namespace() {
    let _access = member::DeviceAccess::new(true);
    let (root_dev, _) = node();
    root_dev.info(INFO_SCOPE_MODULE).expect("module scope for the host's administrator");
    let mut m = member::Member::spawn(member::Place::OwnUserns, -1, member::info_scopes_own_file);
    assert_eq!(m.report(), [0, libc::EPERM as u8], "[file scope errno, module scope errno], user namespace root");
    drop(m);
    let fd = root_dev.as_fd().as_raw_fd();
    let mut h = member::Member::spawn(member::Place::Here, fd, member::info_scopes_inherited);
    assert_eq!(h.report(), [0, libc::EPERM as u8], "[file scope errno, module scope errno], inherited file");
}

/// SET_PORT while a stranger floods the old port: the sender lock is reset
/// only once no chunk to the old port can reach the file, so the first
/// sender to the new port (the real one) takes it, round after round, and
/// no chunk of the stranger's is ever taken.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn set_port_under_a_flood_to_the_old_port_never_locks_on_the_stranger() {
    const ROUNDS: u16 = 150;
    const STRANGER_SEQ: u16 = 1;
    let dev = Device::open(Path::new(DEVICE_PATH)).unwrap();
    dev.set_frame_timeout(FRAME_TIMEOUT).unwrap();
    let real = sender();
    let target = AtomicU16::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let frame = |seq: u16| pattern(seq, 100);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let tx = sender();
                let c = chunk(STRANGER_SEQ, 0, 1, flags::LEAP, &[0x5a; 100]);
                while !stop.load(Ordering::Relaxed) {
                    match target.load(Ordering::Relaxed) {
                        0 => std::thread::yield_now(),
                        p => {
                            let _ = tx.send_to(&c, (LO, p));
                        }
                    }
                }
            });
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for round in 0..ROUNDS {
                let port = next_port();
                dev.set_port(port).unwrap();
                let seq = round + 2;
                send_all(&real, port, &chunks_of(seq, &frame(seq)));
                let w = wait(&dev, PATIENCE).unwrap_or_else(|| {
                    panic!("round {round}: the real sender's frame was not taken: {:#?}", counters(&dev))
                });
                assert_eq!((w.status, w.seq), (WAIT_STATUS_FRAME, seq), "round {round}: {w:?}");
                dev.release_bank(w.bank as u32).unwrap();
                // The stranger floods this port now, while the real sender
                // holds its lock; the next SET_PORT leaves it behind.
                let c0 = counters(&dev).drop_stranger;
                target.store(port, Ordering::Relaxed);
                wait_counters(&dev, "the stranger's flood", |c| c.drop_stranger > c0);
            }
        }));
        stop.store(true, Ordering::Relaxed);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    });
    let c = counters(&dev);
    assert_eq!(c.rx_frames_completed, u64::from(ROUNDS), "{c:#?}");
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn mapping_past_16_mib_and_unknown_ioctls_are_refused() {
    let dev = Device::open(Path::new(DEVICE_PATH)).unwrap();
    let too_long = memmap2::MmapOptions::new().len(MMAP_LEN + 4096).map_raw(&dev.as_fd());
    assert!(too_long.is_err(), "a mapping longer than the buffer was allowed");
    let offset = memmap2::MmapOptions::new().offset(4096).len(MMAP_LEN).map_raw(&dev.as_fd());
    assert!(offset.is_err(), "a mapping past the end was allowed");
    nix::ioctl_none!(unknown_request, leap_common::kmod::IOCTL_MAGIC, 0x63);
    // SAFETY: an open file of the device and a request without argument; the
    // module must refuse it without touching memory.
    let r = unsafe { unknown_request(dev.as_fd().as_raw_fd()) };
    assert_eq!(r, Err(nix::errno::Errno::ENOTTY));
}

/// A node sending through the module to another: original SEND, then
/// SEND_FRAME, frames up to the largest a bank holds.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn module_to_module_frames_arrive_intact_with_checksums() {
    let (mut a, pa) = node();
    let (b, pb) = node();
    assert_eq!(a.send(100).map_err(|e| e.raw_os_error()), Err(Some(libc::EDESTADDRREQ)));
    a.set_dest(LO, pb).unwrap();
    b.set_peer(Some(LO), Some(pa)).unwrap();
    let mut seq = 0u16;
    for len in [1usize, 1400, 1401, 16392, 32776, BANK_FRAME_MAX] {
        let frame = pattern(len as u16, len);
        a.write_tx(&[&frame]);
        seq = if len == 1 {
            a.send(len as u32).unwrap();
            1
        } else {
            a.send_frame(len as u32, flags::LEAP).unwrap()
        };
        let w = expect_frame(&b, seq, &frame);
        b.release_bank(w.bank as u32).unwrap();
    }
    // One byte more than a bank holds: the 94th chunk would end past the
    // bank and is refused (the frame is then reported lost).
    let frame = pattern(0, BANK_FRAME_MAX + 1);
    a.write_tx(&[&frame]);
    assert_eq!(a.send_frame(frame.len() as u32, flags::LEAP).unwrap(), seq + 1);
    wait_counters(&b, "drop_too_big", |c| c.drop_too_big == 1);
    let c = counters(&b);
    assert_eq!(c.drop_bad_checksum, 0);
    assert_eq!(c.dropped(), 1, "{c:#?}");
    let sent = counters(&a);
    assert_eq!(sent.tx_frames, 7);
    assert_eq!(sent.tx_errors, 0);
}

/// The multi-node ring over the module: three nodes on loopback, one port
/// each, frames going round and checked at the head.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn three_node_ring_over_loopback_delivers_300_frames_in_order() {
    let mut nodes: Vec<(Device, u16)> = (0..3).map(|_| node()).collect();
    for i in 0..3 {
        let (next, prev) = (nodes[(i + 1) % 3].1, nodes[(i + 2) % 3].1);
        nodes[i].0.set_dest(LO, next).unwrap();
        nodes[i].0.set_peer(Some(LO), Some(prev)).unwrap();
    }
    let mut buf = vec![0u8; 16392];
    for round in 0..300u32 {
        let mut frame = pattern(round as u16, 16392);
        frame[..4].copy_from_slice(&round.to_le_bytes());
        nodes[0].0.write_tx(&[&frame]);
        nodes[0].0.send_frame(frame.len() as u32, flags::LEAP).unwrap();
        for hop in 1..=3 {
            let (dev, _) = &mut nodes[hop % 3];
            let w = wait(dev, PATIENCE).unwrap_or_else(|| panic!("round {round}: hop {hop} got nothing"));
            assert_eq!(w.status, WAIT_STATUS_FRAME, "round {round} hop {hop}: {w:?}");
            assert_eq!(w.len as usize, frame.len());
            dev.read_bank(w.bank as usize, 0, &mut buf);
            dev.release_bank(w.bank as u32).unwrap();
            if hop < 3 {
                dev.write_tx(&[&buf]);
                dev.send_frame(buf.len() as u32, flags::LEAP).unwrap();
            }
        }
        assert!(buf == frame, "round {round}: the frame changed on the way round");
    }
    for (dev, _) in &nodes {
        let c = counters(dev);
        assert_eq!((c.rx_frames_delivered, c.rx_frames_timed_out, c.dropped()), (300, 0, 0), "{c:#?}");
    }
}

/// IPv4 + UDP datagram from 127.0.0.1 to `port`, with its UDP checksum
/// (or a wrong one), for a raw socket.
fn udp_packet(sport: u16, port: u16, payload: &[u8], good_csum: bool) -> Vec<u8> {
    let ulen = (8 + payload.len()) as u16;
    let mut udp = Vec::with_capacity(ulen as usize);
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&port.to_be_bytes());
    udp.extend_from_slice(&ulen.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    add(&LO.octets());
    add(&LO.octets());
    add(&[0, 17]);
    add(&ulen.to_be_bytes());
    add(&udp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let mut csum = !(sum as u16);
    if csum == 0 {
        csum = 0xffff;
    }
    if !good_csum {
        csum ^= 0x5a5a;
    }
    udp[6..8].copy_from_slice(&csum.to_be_bytes());
    udp
}

/// IPv4 header for a raw IP_HDRINCL socket (the kernel fills the checksum).
fn ipv4(id: u16, frag: u16, body: &[u8]) -> Vec<u8> {
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&((20 + body.len()) as u16).to_be_bytes());
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&frag.to_be_bytes());
    p.extend_from_slice(&[64, 17, 0, 0]);
    p.extend_from_slice(&LO.octets());
    p.extend_from_slice(&LO.octets());
    p.extend_from_slice(body);
    p
}

fn raw_socket() -> socket2::Socket {
    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::from(libc::IPPROTO_RAW)))
        .expect("raw socket (needs root)")
}

fn raw_send(sock: &socket2::Socket, packet: &[u8]) {
    let to = socket2::SockAddr::from(SocketAddr::V4(SocketAddrV4::new(LO, 0)));
    sock.send_to(packet, &to).expect("raw send_to");
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn bad_udp_checksum_never_changes_any_bank() {
    let (dev, port) = node();
    let raw = raw_socket();
    let d = udp_packet(4000, port, &chunk(50, 0, 1, flags::LEAP, &[0xAB; 100]), false);
    let before = banks(&dev);
    let errors = udp_csum_errors();
    raw_send(&raw, &ipv4(0x1111, 0, &d));
    // The stack checks the checksum before the module sees the datagram.
    let deadline = Instant::now() + PATIENCE;
    while udp_csum_errors() == errors {
        assert!(Instant::now() < deadline, "the stack never counted the bad checksum");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(before == banks(&dev), "a datagram with a bad checksum changed a bank");
    assert_eq!(counters(&dev).dropped(), 0, "the module saw a datagram with a bad checksum");
    assert_eq!(wait(&dev, Duration::ZERO), None);
    // The same datagram with the right checksum is taken.
    let frame = vec![0xAB; 100];
    raw_send(&raw, &ipv4(0x1112, 0, &udp_packet(4000, port, &chunk(50, 0, 1, flags::LEAP, &frame), true)));
    expect_frame(&dev, 50, &frame);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn ipv4_fragments_are_reassembled_by_the_stack_then_taken() {
    let (dev, port) = node();
    let raw = raw_socket();
    let frame = pattern(51, 1000);
    let d = udp_packet(4001, port, &chunk(51, 0, 1, flags::LEAP, &frame), true);
    const MF: u16 = 0x2000;
    raw_send(&raw, &ipv4(0x2222, MF, &d[..504]));
    raw_send(&raw, &ipv4(0x2222, 504 / 8, &d[504..]));
    expect_frame(&dev, 51, &frame);
}

/// The backend behind the `Transport` trait: a three-node ring, control
/// frames, deadlines and lost frames as typed errors.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn kmod_transport_ring_of_three_and_its_errors() {
    use leap::transport::kmod::{KmodConfig, KmodTransport};
    use leap::{FrameKind, Transport, TransportError};

    let ports: Vec<u16> = (0..3).map(|_| next_port()).collect();
    let mut nodes: Vec<KmodTransport> = (0..3)
        .map(|i| {
            let mut cfg = KmodConfig::new(ports[i], SocketAddrV4::new(LO, ports[(i + 1) % 3]));
            cfg.prev = Some(SocketAddrV4::new(LO, ports[(i + 2) % 3]));
            cfg.recv_timeout = Some(PATIENCE);
            cfg.frame_timeout = FRAME_TIMEOUT;
            KmodTransport::open(cfg).expect("open the kmod transport")
        })
        .collect();
    let mut buf = vec![0u8; 32776];
    for round in 0..200u16 {
        let frame = pattern(round, 32776);
        nodes[0].send_multipart_next(&frame[..8], &frame[8..]).unwrap();
        for hop in 1..=3 {
            let got = nodes[hop % 3].recv_prev(&mut buf).unwrap_or_else(|e| panic!("round {round} hop {hop}: {e}"));
            assert_eq!((got.len, got.kind), (frame.len(), FrameKind::Data));
            if hop < 3 {
                nodes[hop % 3].send_next(&buf[..got.len]).unwrap();
            }
        }
        assert!(buf == frame, "round {round}: frame changed on the way round");
    }
    let msg = leap_common::control::ControlMessage::new(leap_common::control::ControlType::Ack);
    nodes[0].send_control(&msg, 16392).unwrap();
    let got = nodes[1].recv_prev(&mut buf).unwrap();
    assert_eq!((got.len, got.kind), (16392, FrameKind::Control));

    // Nothing sent: a typed timeout, in about the deadline.
    nodes[1].set_recv_timeout(Some(Duration::from_millis(200)));
    let start = Instant::now();
    assert!(matches!(nodes[1].recv_prev(&mut buf), Err(TransportError::Timeout(_))));
    assert!(start.elapsed() < Duration::from_secs(2));

    // A frame bigger than the caller's buffer is refused and its bank freed.
    nodes[0].send_next(&pattern(1, 3000)).unwrap();
    let mut small = [0u8; 100];
    assert!(matches!(nodes[1].recv_prev(&mut small), Err(TransportError::FrameTooLarge { len: 3000, capacity: 100 })));

    // A lost chunk: a typed FrameLost naming the seq and what is missing.
    let lport = next_port();
    let mut cfg = KmodConfig::new(lport, SocketAddrV4::new(LO, ports[0]));
    cfg.recv_timeout = Some(PATIENCE);
    let mut lonely = KmodTransport::open(cfg).unwrap();
    let cs = chunks_of(9000, &pattern(9000, 3 * CHUNK_PAYLOAD_MAX));
    send_all(&sender(), lport, &[cs[0].clone(), cs[2].clone()]);
    match lonely.recv_prev(&mut buf) {
        Err(TransportError::FrameLost { seq: 9000, missing: 1, total: 3 }) => {}
        other => panic!("expected FrameLost for seq 9000, got {other:?}"),
    }
    assert_eq!(lonely.stats().frames_lost, 1);
    let info = leap::transport::kmod::status(Path::new(DEVICE_PATH), INFO_SCOPE_MODULE).unwrap();
    assert!(info.open_files >= 5, "{info:#?}");

    let stats = nodes[1].stats();
    assert_eq!(stats.frames_received, 201);
    assert_eq!(stats.drops.total(), 0, "{stats:#?}");
}

/// Runs iproute2's `ip` in the calling thread's network namespace.
fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Per-namespace state: a node in a fresh network namespace binds the same
/// port as a node in the initial one, each sees only its own namespace's
/// packets, and the two exchange frames over a veth pair.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn nodes_in_two_namespaces_share_a_port_and_talk_over_veth() {
    const ROUNDS: usize = 50;
    const A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
    let port = next_port();
    let a = Device::open(Path::new(DEVICE_PATH)).unwrap();
    a.set_port(port).unwrap();
    a.set_frame_timeout(FRAME_TIMEOUT).unwrap();

    let (tid_tx, tid_rx) = mpsc::channel::<libc::pid_t>();
    let (moved_tx, moved_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let b_thread = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        ip(&["link", "set", "lo", "up"]);
        tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
        moved_rx.recv_timeout(PATIENCE).expect("veth peer never arrived");
        ip(&["addr", "add", "10.77.0.2/24", "dev", "lvb"]);
        ip(&["link", "set", "lvb", "up"]);
        let mut b = Device::open(Path::new(DEVICE_PATH)).unwrap();
        b.set_port(port).expect("the same port in another namespace is free");
        b.set_frame_timeout(FRAME_TIMEOUT).unwrap();
        // Loopback of this namespace reaches this node only.
        let local = pattern(7, 2000);
        send_all(&sender(), port, &chunks_of(7, &local));
        let w = expect_frame(&b, 7, &local);
        b.release_bank(w.bank as u32).unwrap();
        b.set_dest(A, port).unwrap();
        b.set_peer(Some(A), Some(port)).unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = vec![0u8; 16392];
        for round in 0..ROUNDS {
            let w = wait(&b, PATIENCE).unwrap_or_else(|| panic!("B: round {round} never arrived"));
            assert_eq!(w.status, WAIT_STATUS_FRAME, "B round {round}: {w:?}");
            b.read_bank(w.bank as usize, 0, &mut buf[..w.len as usize]);
            b.release_bank(w.bank as u32).unwrap();
            b.write_tx(&[&buf[..w.len as usize]]);
            b.send_frame(w.len, flags::LEAP).unwrap();
        }
        counters(&b)
    });

    let tid = tid_rx.recv_timeout(PATIENCE).unwrap();
    let _ = std::process::Command::new("ip").args(["link", "del", "lva"]).output();
    ip(&["link", "add", "lva", "type", "veth", "peer", "name", "lvb"]);
    ip(&["link", "set", "lvb", "netns", &tid.to_string()]);
    ip(&["addr", "add", "10.77.0.1/24", "dev", "lva"]);
    ip(&["link", "set", "lva", "up"]);
    moved_tx.send(()).unwrap();
    ready_rx.recv_timeout(PATIENCE).expect("node B never got ready");
    a.set_dest(B, port).unwrap();
    a.set_peer(Some(B), Some(port)).unwrap();
    let mut a = a;
    let mut buf = vec![0u8; 16392];
    for round in 0..ROUNDS {
        let frame = pattern(round as u16 + 100, 16392);
        a.write_tx(&[&frame]);
        a.send_frame(frame.len() as u32, flags::LEAP).unwrap();
        let w = wait(&a, PATIENCE).unwrap_or_else(|| panic!("A: round {round} never came back"));
        assert_eq!(w.status, WAIT_STATUS_FRAME, "A round {round}: {w:?}");
        a.read_bank(w.bank as usize, 0, &mut buf);
        a.release_bank(w.bank as u32).unwrap();
        assert!(buf == frame, "round {round}: frame changed over veth");
    }
    let cb = b_thread.join().expect("node B failed");
    let ca = counters(&a);
    // B's namespace is gone with its thread and device, taking the pair.
    let _ = std::process::Command::new("ip").args(["link", "del", "lva"]).output();
    // A never saw B's loopback frame: exactly the echoed chunks.
    assert_eq!(ca.rx_chunks, ROUNDS as u64 * 12, "{ca:#?}");
    assert_eq!(cb.rx_chunks, 2 + ROUNDS as u64 * 12, "{cb:#?}");
    assert_eq!((ca.dropped(), cb.dropped()), (0, 0));
}

/// The original's write(): a frame straight from a user buffer.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn write_sends_a_frame_like_the_original() {
    let (a, _) = node();
    let (b, pb) = node();
    a.set_dest(LO, pb).unwrap();
    let frame = pattern(77, 5000);
    assert_eq!(nix::unistd::write(a.as_fd(), &frame), Ok(frame.len()), "write");
    expect_frame(&b, 1, &frame);
    assert_eq!(nix::unistd::write(a.as_fd(), &[]), Ok(0), "write of 0 bytes: the original returns 0");
    assert_eq!(a.send(0).map_err(|e| e.raw_os_error()), Ok(()), "SEND of 0 bytes");
    assert_eq!(counters(&a).tx_frames, 1, "0 bytes sent a frame");
}

/// poll() reports a complete frame as readable, and nothing before.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn poll_reports_a_complete_frame() {
    let (dev, port) = node();
    let poll = |ms: u16| {
        let mut p = [PollFd::new(dev.as_fd(), PollFlags::POLLIN)];
        nix::poll::poll(&mut p, ms).expect("poll");
        p[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN))
    };
    assert!(!poll(50), "readable with nothing received");
    let frame = pattern(90, 3000);
    let cs = chunks_of(90, &frame);
    let tx = sender(); // one sender: chunks of a frame from another are refused
    send_all(&tx, port, &cs[..2]);
    wait_counters(&dev, "2 chunks", |c| c.rx_chunks == 2);
    assert!(!poll(0), "readable with an incomplete frame");
    send_all(&tx, port, &cs[2..]);
    assert!(poll(5000), "a complete frame did not make the device readable");
    expect_frame(&dev, 90, &frame);
    assert!(!poll(0), "still readable after the frame was taken");
}

/// `InCsumErrors` of the UDP MIB (`/proc/net/snmp`) of this namespace.
fn udp_csum_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").expect("read /proc/net/snmp");
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().expect("Udp header"), udp.next().expect("Udp values"));
    let i = names.split_whitespace().position(|n| n == "InCsumErrors").expect("InCsumErrors");
    values.split_whitespace().nth(i).and_then(|v| v.parse().ok()).expect("InCsumErrors value")
}

/// A stranger's chunks (a newer seq for the same bank, a whole frame, the
/// missing chunk of a frame being filled) neither evict nor fill a bank.
fn stranger_is_refused(dev: &Device, port: u16, friend: &UdpSocket, counter: fn(&Counters) -> u64, what: &str) {
    // Keep the incomplete frame from being reported lost during the test.
    dev.set_frame_timeout(Duration::from_secs(30)).unwrap();
    let frame = pattern(1, 2 * CHUNK_PAYLOAD_MAX);
    let cs = chunks_of(1, &frame);
    send_all(friend, port, &cs[..1]);
    wait_counters(dev, "the first chunk", |c| c.rx_chunks == 1);
    // Seq 65 maps to the filling bank 1: it would evict frame 1.
    for c in chunks_of(65, &pattern(65, 2 * CHUNK_PAYLOAD_MAX)) {
        assert_rejected(dev, port, &c, what, counter);
    }
    // The chunk frame 1 misses, from the stranger.
    assert_rejected(dev, port, &chunk(1, 1, 2, flags::LEAP, &[0xEE; CHUNK_PAYLOAD_MAX]), what, counter);
    // A whole frame of its own.
    assert_rejected(dev, port, &chunk(2, 0, 1, flags::LEAP, &[0xEE; 100]), what, counter);
    let c = counters(dev);
    assert_eq!((c.rx_chunks, c.rx_frames_timed_out), (1, 0), "{c:#?}");
    send_all(friend, port, &cs[1..]);
    expect_frame(dev, 1, &frame);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn stranger_never_evicts_or_fills_a_bank_without_a_peer() {
    let (dev, port) = node();
    stranger_is_refused(&dev, port, &sender(), |c| c.drop_stranger, "drop_stranger");
    assert_eq!(counters(&dev).drop_peer, 0);
}

#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn stranger_never_evicts_or_fills_a_bank_with_a_peer() {
    let (dev, port) = node();
    let friend = sender();
    dev.set_peer(Some(LO), Some(friend.local_addr().unwrap().port())).unwrap();
    stranger_is_refused(&dev, port, &friend, |c| c.drop_peer, "drop_peer");
    assert_eq!(counters(&dev).drop_stranger, 0);
}

/// A broadcast to the port is refused (the old hook took broadcasts too).
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn broadcast_to_the_port_never_changes_any_bank() {
    let (dev, port) = node();
    let before = banks(&dev);
    let tx = sender();
    tx.set_broadcast(true).unwrap();
    tx.send_to(&chunk(3, 0, 1, flags::LEAP, &[0xEE; 100]), (Ipv4Addr::new(127, 255, 255, 255), port))
        .expect("send a broadcast");
    let c = wait_counters(&dev, "drop_not_unicast", |c| c.drop_not_unicast == 1);
    assert_eq!(c.rx_chunks, 0, "{c:#?}");
    assert!(before == banks(&dev), "a broadcast changed a bank");
    assert_eq!(wait(&dev, Duration::ZERO), None);
}

/// poll() reports a lost frame without anybody waiting in an ioctl.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn poll_reports_a_lost_frame() {
    let (dev, port) = node();
    dev.set_frame_timeout(LOST_TIMEOUT).unwrap();
    let cs = chunks_of(33, &pattern(33, 2 * CHUNK_PAYLOAD_MAX));
    send_all(&sender(), port, &cs[..1]);
    let mut p = [PollFd::new(dev.as_fd(), PollFlags::POLLIN)];
    let n = nix::poll::poll(&mut p, 5000u16);
    assert_eq!(n, Ok(1), "poll never reported the lost frame: {:#?}", counters(&dev));
    let w = wait(&dev, Duration::ZERO).expect("readable, yet nothing to take");
    assert_eq!((w.status, w.seq, w.chunks), (WAIT_STATUS_LOST, 33, 1), "{w:?}");
}

/// Two WAIT_DATA on one file at once: each gets a bank, and neither bank
/// stays held once the next WAIT_DATA is made.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn two_concurrent_wait_data_on_one_fd_leak_no_bank() {
    let (dev, port) = node();
    let tx = sender();
    let got: Vec<usize> = std::thread::scope(|s| {
        let waiters: Vec<_> = (0..2).map(|_| s.spawn(|| dev.wait_data())).collect();
        std::thread::sleep(Duration::from_millis(300)); // both asleep in the module
        send_all(&tx, port, &chunks_of(1, &pattern(1, 100)));
        send_all(&tx, port, &chunks_of(2, &pattern(2, 100)));
        waiters.into_iter().map(|w| w.join().unwrap().expect("LEAP_IOCTL_WAIT_DATA")).collect()
    });
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [1, 2], "{got:?}");
    send_all(&tx, port, &chunks_of(3, &pattern(3, 100)));
    assert_eq!(dev.wait_data().unwrap(), 3);
    // Banks 1 and 2 are free: frames 65 and 66 land there.
    send_all(&tx, port, &chunks_of(65, &pattern(65, 100)));
    send_all(&tx, port, &chunks_of(66, &pattern(66, 100)));
    let c = wait_counters(&dev, "frames 65 and 66", |c| c.rx_frames_completed + c.drop_bank_busy >= 5);
    assert_eq!((c.rx_frames_completed, c.drop_bank_busy), (5, 0), "a bank stayed held: {c:#?}");
}

/// A SET_PORT that fails leaves the file bound where it was.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn failed_set_port_keeps_the_old_binding() {
    let (a, pa) = node();
    let (_b, pb) = node();
    assert_eq!(a.set_port(pb).map_err(|e| e.raw_os_error()), Err(Some(libc::EADDRINUSE)));
    assert_eq!(a.info(INFO_SCOPE_FILE).unwrap().port, pa);
    let frame = pattern(4, 3000);
    send_all(&sender(), pa, &chunks_of(4, &frame));
    expect_frame(&a, 4, &frame);
}

/// mmap: shared only, never executable (not even later, via mprotect).
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn mmap_refuses_private_and_executable_mappings() {
    let dev = Device::open(Path::new(DEVICE_PATH)).unwrap();
    let fd = dev.as_fd().as_raw_fd();
    let map = |prot, flags| {
        // SAFETY: a fresh mapping chosen by the kernel; nothing of ours is
        // replaced, and every successful one is unmapped below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, prot, flags, fd, 0) };
        if p == libc::MAP_FAILED { Err(io::Error::last_os_error().raw_os_error()) } else { Ok(p) }
    };
    assert_eq!(map(libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE), Err(Some(libc::EINVAL)));
    assert_eq!(map(libc::PROT_READ | libc::PROT_EXEC, libc::MAP_SHARED), Err(Some(libc::EPERM)));
    let p = map(libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED).expect("a shared mapping");
    // SAFETY: p is the 4096-byte mapping made just above.
    let r = unsafe { libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC) };
    let err = io::Error::last_os_error().raw_os_error();
    // SAFETY: as above; unmapped once.
    unsafe { libc::munmap(p, 4096) };
    assert_eq!((r, err), (-1, Some(libc::EACCES)), "mprotect(PROT_EXEC) was allowed");
}

/// A module-wide GET_INFO does not wait for sends in progress on other
/// files (it used to take every file's mutex under the global lock, so a
/// long send also held up every open() and close()).
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn module_info_is_not_blocked_by_sends_in_progress() {
    let (mut a, _) = node();
    let (b, pb) = node();
    a.set_dest(LO, pb).unwrap();
    a.write_tx(&[&vec![0x5A; HALF_LEN]]);
    let start = Instant::now();
    for _ in 0..3 {
        a.send(HALF_LEN as u32).unwrap();
    }
    let one_send = start.elapsed() / 3;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let lat = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) && n < 1000 {
                a.send(HALF_LEN as u32).unwrap();
                n += 1;
            }
        });
        std::thread::sleep(one_send / 2);
        let mut lat = Vec::new();
        let end = Instant::now() + (one_send * 10).max(Duration::from_millis(500));
        while Instant::now() < end && lat.len() < 10_000 {
            let t = Instant::now();
            b.info(INFO_SCOPE_MODULE).unwrap();
            lat.push(t.elapsed());
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        sender.join().unwrap();
        lat
    });
    let mut sorted = lat.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    assert!(
        median < one_send / 4,
        "a module GET_INFO took {median:?} (median of {}) while one 8 MiB send takes {one_send:?}",
        sorted.len()
    );
}

/// An original program's control frame (0xC0DE marker, `reserved` 0, sent
/// with write()) is a control frame to leap's kmod backend.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn original_programs_control_frame_is_control_to_leap() {
    use leap::transport::kmod::{KmodConfig, KmodTransport};
    use leap::{FrameKind, Transport};

    let prog = std::env::var("KMOD_VM_ORIGINAL_ABI").unwrap_or_else(|_| "/bin/original_abi".into());
    let port = next_port();
    let mut cfg = KmodConfig::new(port, SocketAddrV4::new(LO, next_port()));
    cfg.recv_timeout = Some(PATIENCE);
    let mut node = KmodTransport::open(cfg).expect("open the kmod transport");
    let status = std::process::Command::new(&prog).args(["control", &port.to_string()]).status();
    assert!(status.as_ref().is_ok_and(|s| s.success()), "{prog} control {port}: {status:?}");
    let mut buf = vec![0u8; 16392];
    let got = node.recv_prev(&mut buf).expect("the control frame");
    assert_eq!((got.len, got.kind), (16392, FrameKind::Control));
    let msg = leap_common::control::ControlMessage::decode_frame(&buf).expect("decodes as control");
    assert_eq!(msg.kind, leap_common::control::ControlType::ResizeChain);
}

/// A leap head over the module with the original as its one worker, the
/// tail: the ACK the original's KernelTransport makes (fresh: its own range,
/// every other field zero; padded to the frame size; one datagram per
/// 1400-byte chunk, `reserved` 0) answers the head's RESIZE_CHAIN, and the
/// data frames after it come back intact.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn kmod_head_takes_the_fresh_ack_of_an_original_tail() {
    use leap::ring::{HeadConfig, run_head};
    use leap::transport::kmod::{KmodConfig, KmodTransport};
    use original::{FRAME, Original, Role};

    let tail = UdpSocket::bind((LO, 0)).expect("bind the original tail");
    let SocketAddr::V4(tail_addr) = tail.local_addr().unwrap() else { unreachable!("bound to IPv4") };
    let port = next_port();
    let mut cfg = KmodConfig::new(port, tail_addr);
    cfg.prev = Some(tail_addr);
    cfg.recv_timeout = Some(PATIENCE);
    cfg.frame_timeout = FRAME_TIMEOUT;
    let mut head = KmodTransport::open(cfg).expect("open the kmod transport");
    let original = Original::kernel(tail, SocketAddr::from((LO, port)), Role::Worker { compute: Duration::ZERO });
    let mut hc = HeadConfig::new(FRAME, 50);
    hc.control_workers = Some(1);
    hc.stall_timeout = 2 * PATIENCE;
    let rep = run_head(&mut head, &hc).expect("the head's run");
    let o = &original.report;
    assert_eq!(rep.control_ack, Some(true), "the original's ACK was not taken: {o:?}");
    assert_eq!((rep.delivered, rep.corrupt, rep.lost), (50, 0, 0), "{o:?}");
    assert_eq!(*o.range.lock().unwrap(), leap::ring::control::chain(1, 32).ranges[0]);
    let (control, hangs, trains) =
        (o.control.load(Ordering::Relaxed), o.hangs.load(Ordering::Relaxed), o.trains.load(Ordering::Relaxed));
    assert_eq!((control, hangs, trains), (1, 0, 0), "control frames, hangs, trains the original got");
}

/// Runs `f` in a thread that joined the named network namespace.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            leap::netns::enter(Path::new(&format!("/run/netns/{ns}"))).expect("setns");
            f()
        })
        .join()
        .expect("thread in namespace")
    })
}

/// Transit traffic: UDP to leap's port, routed through a namespace whose
/// leap node has the module open on that very port, reaches its real
/// destination intact, and the module never sees it.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn routed_transit_traffic_to_the_port_passes_through_untouched() {
    const N: usize = 200;
    let port = next_port();
    let run = |args: &[&str]| ip(args);
    for ns in ["lra", "lrm", "lrb"] {
        let _ = std::process::Command::new("ip").args(["netns", "del", ns]).output();
        run(&["netns", "add", ns]);
    }
    run(&["link", "add", "lra0", "netns", "lra", "type", "veth", "peer", "name", "lrm0", "netns", "lrm"]);
    run(&["link", "add", "lrb0", "netns", "lrb", "type", "veth", "peer", "name", "lrm1", "netns", "lrm"]);
    for (ns, dev, addr) in [
        ("lra", "lra0", "10.81.1.2/24"),
        ("lrm", "lrm0", "10.81.1.1/24"),
        ("lrm", "lrm1", "10.81.2.1/24"),
        ("lrb", "lrb0", "10.81.2.2/24"),
    ] {
        run(&["-n", ns, "addr", "add", addr, "dev", dev]);
        run(&["-n", ns, "link", "set", dev, "up"]);
        run(&["-n", ns, "link", "set", "lo", "up"]);
    }
    run(&["-n", "lra", "route", "add", "default", "via", "10.81.1.1"]);
    run(&["-n", "lrb", "route", "add", "default", "via", "10.81.2.1"]);
    in_netns("lrm", || std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("ip_forward"));

    let middle = in_netns("lrm", || {
        let dev = Device::open(Path::new(DEVICE_PATH)).unwrap();
        dev.set_port(port).unwrap();
        dev
    });
    let receiver = in_netns("lrb", || {
        let s = UdpSocket::bind(("0.0.0.0", port)).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s
    });
    let frame = pattern(9, N * CHUNK_PAYLOAD_MAX);
    let sent = chunks_of(9, &frame);
    // Read while the datagrams come, so the socket buffer never overflows.
    let got = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            while got.len() < N {
                match receiver.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        assert_eq!(from.ip(), std::net::IpAddr::V4(Ipv4Addr::new(10, 81, 1, 2)));
                        got.push(buf[..n].to_vec());
                    }
                    Err(e) => return Err(format!("{} of {N} datagrams reached their destination: {e}", got.len())),
                }
            }
            Ok(got)
        });
        in_netns("lra", || {
            let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
            for d in &sent {
                s.send_to(d, ("10.81.2.2", port)).unwrap();
                std::thread::sleep(Duration::from_micros(200)); // no drops on the veth queues
            }
        });
        reader.join().expect("reader")
    });
    let c = counters(&middle);
    drop(middle);
    for ns in ["lra", "lrm", "lrb"] {
        run(&["netns", "del", ns]);
    }
    let got = got.unwrap_or_else(|e| panic!("{e}"));
    assert!(got == sent, "transit datagrams changed on the way");
    assert_eq!(c, Counters::default(), "the middle node's module saw transit traffic");
}

/// Three kmod transports on loopback, node `i` sending to node `i + 1`
/// and accepting only node `i - 1`.
fn kmod_ring() -> Vec<leap::transport::kmod::KmodTransport> {
    use leap::transport::kmod::{KmodConfig, KmodTransport};
    let ports: Vec<u16> = (0..3).map(|_| next_port()).collect();
    (0..3)
        .map(|i| {
            let mut cfg = KmodConfig::new(ports[i], SocketAddrV4::new(LO, ports[(i + 1) % 3]));
            cfg.prev = Some(SocketAddrV4::new(LO, ports[(i + 2) % 3]));
            cfg.recv_timeout = Some(PATIENCE);
            cfg.frame_timeout = FRAME_TIMEOUT;
            KmodTransport::open(cfg).expect("open the kmod transport")
        })
        .collect()
}

/// One frame around a kmod ring through the lending API: written in place
/// into the head's TX area, relayed by each worker from its bank straight
/// into its TX area (adding 1 to every byte), read in place at the head.
/// Returns whether it came back as `frame` + 2.
fn lend_round(
    nodes: &mut [leap::transport::kmod::KmodTransport],
    frame: &[u8],
    want: &[u8],
    control: &mut [u8],
) -> bool {
    use leap::{FrameKind, Transport};
    nodes[0].send_next_with(FrameKind::Data, frame.len(), &mut |tx| tx.copy_from_slice(frame)).expect("send_next_with");
    for (hop, node) in nodes.iter_mut().enumerate().skip(1) {
        let got = node
            .relay(control, &mut |input, output| {
                for (o, i) in output.iter_mut().zip(input) {
                    *o = i.wrapping_add(1);
                }
            })
            .unwrap_or_else(|e| panic!("hop {hop}: relay: {e}"));
        assert_eq!((got.len, got.kind), (frame.len(), FrameKind::Data), "hop {hop}");
    }
    let back = nodes[0].recv_prev_lent().expect("recv_prev_lent at the head");
    back.kind() == FrameKind::Data && *back == *want
}

/// The lending API on the module: the head writes into its TX area, the
/// workers relay bank to TX area, the head reads its bank; every frame is
/// intact and no node copies a byte in user space, unlike the copying path.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn kmod_ring_through_the_lending_api_copies_nothing_in_user_space() {
    use leap::Transport;
    const LEN: usize = 16392;
    let mut nodes = kmod_ring();
    let mut control = vec![0u8; LEN];
    for round in 0..300u16 {
        let frame = pattern(round, LEN);
        let want: Vec<u8> = frame.iter().map(|b| b.wrapping_add(2)).collect();
        assert!(
            lend_round(&mut nodes, &frame, &want, &mut control),
            "round {round}: the frame changed on the way round"
        );
    }
    for (i, n) in nodes.iter().enumerate() {
        let s = n.stats();
        assert_eq!((s.frames_sent, s.frames_received, s.copied_bytes), (300, 300, 0), "node {i}: {s:#?}");
    }
    // The same ring through recv_prev / send_next copies each frame out of
    // the bank and into the TX area on every node.
    let mut buf = vec![0u8; LEN];
    for round in 0..10u16 {
        let frame = pattern(round, LEN);
        nodes[0].send_next(&frame).unwrap();
        for hop in 1..=3 {
            let got = nodes[hop % 3].recv_prev(&mut buf).unwrap();
            assert_eq!(got.len, LEN);
            if hop < 3 {
                nodes[hop % 3].send_next(&buf).unwrap();
            }
        }
        assert!(buf == frame, "round {round}: the frame changed on the way round");
    }
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n.stats().copied_bytes, 2 * 10 * LEN as u64, "node {i}");
        let c = n.counters().unwrap();
        assert_eq!((c.rx_frames_delivered, c.dropped()), (310, 0), "node {i}: {c:#?}");
    }
}

/// After warm-up, a frame around the ring through the lending API
/// allocates nothing on the thread that drives all three nodes.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn kmod_lending_api_allocates_nothing_per_frame() {
    const LEN: usize = 16392;
    let mut nodes = kmod_ring();
    let mut control = vec![0u8; LEN];
    let frame = pattern(5, LEN);
    let want: Vec<u8> = frame.iter().map(|b| b.wrapping_add(2)).collect();
    for _ in 0..20 {
        assert!(lend_round(&mut nodes, &frame, &want, &mut control));
    }
    let before = support::allocations();
    for round in 0..300 {
        assert!(lend_round(&mut nodes, &frame, &want, &mut control), "round {round}");
    }
    assert_eq!(support::allocations() - before, 0, "allocations on the lending path over 300 frames");
}

/// A split kmod node: its receiving half waits in the module on one thread
/// while its sending half sends on another; neither blocks the other, and
/// every frame arrives intact, in bounded time.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn split_kmod_node_receives_on_one_thread_while_sending_on_another() {
    use leap::{FrameKind, Transport};
    use std::sync::atomic::AtomicUsize;
    const N: usize = 200;
    const LEN: usize = 16392;
    /// Frames a sender may be ahead of its receiver: fewer than its banks.
    const AHEAD: usize = 32;
    let mut nodes = kmod_ring().into_iter();
    let (mut a, b, mut c) = (nodes.next().unwrap(), nodes.next().unwrap(), nodes.next().unwrap());
    let leap::transport::Halves { mut sender, mut receiver } = Box::new(b).split().unwrap();
    let (b_got, c_got) = (&AtomicUsize::new(0), &AtomicUsize::new(0));
    let pace = |seq: usize, got: &AtomicUsize| {
        let deadline = Instant::now() + PATIENCE;
        while seq >= got.load(Ordering::Acquire) + AHEAD {
            assert!(Instant::now() < deadline, "the receiver stalled at {}", got.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let frame = |seq: usize| pattern(seq as u16, LEN);
    let start = Instant::now();
    let (done_tx, done_rx) = mpsc::channel::<&'static str>();
    std::thread::scope(|s| {
        // B's receiver waits in WAIT_FRAME before anything is sent to it.
        let d = done_tx.clone();
        s.spawn(move || {
            for seq in 0..N {
                let got = receiver.recv_prev_lent().unwrap_or_else(|e| panic!("B received {seq} of {N}: {e}"));
                assert!(got.kind() == FrameKind::Data && *got == frame(seq)[..], "B: frame {seq} changed");
                b_got.fetch_add(1, Ordering::Release);
            }
            assert_eq!(receiver.stats().copied_bytes, 0);
            d.send("B's receiver").unwrap();
        });
        std::thread::sleep(Duration::from_millis(200));
        // Meanwhile B's sender sends to C, in place.
        let d = done_tx.clone();
        s.spawn(move || {
            for seq in 0..N {
                pace(seq, c_got);
                let f = frame(seq + 1000);
                sender.send_next_with(FrameKind::Data, LEN, &mut |tx| tx.copy_from_slice(&f)).unwrap();
            }
            d.send("B's sender").unwrap();
        });
        let d = done_tx.clone();
        s.spawn(move || {
            for seq in 0..N {
                let got = c.recv_prev_lent().unwrap_or_else(|e| panic!("C received {seq} of {N}: {e}"));
                assert!(*got == frame(seq + 1000)[..], "C: frame {seq} changed");
                c_got.fetch_add(1, Ordering::Release);
            }
            d.send("C").unwrap();
        });
        // A feeds B's receiver.
        for seq in 0..N {
            pace(seq, b_got);
            let f = frame(seq);
            a.send_next_with(FrameKind::Data, LEN, &mut |tx| tx.copy_from_slice(&f)).unwrap();
        }
        for _ in 0..3 {
            let who = done_rx.recv_timeout(Duration::from_secs(60)).expect("a half deadlocked or a thread failed");
            eprintln!("{who} done after {:?}", start.elapsed());
        }
    });
}

/// A lent bank is held while the `Lent` lives (a frame for the same bank is
/// refused), free once it is dropped, and released once only: a new frame
/// lent from the same bank stays held after the first one's release.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn lent_bank_is_held_until_dropped_and_released_once() {
    use leap::transport::kmod::{KmodConfig, KmodTransport, status};
    use leap::{FrameKind, Transport};
    let port = next_port();
    let mut cfg = KmodConfig::new(port, SocketAddrV4::new(LO, next_port()));
    cfg.recv_timeout = Some(PATIENCE);
    cfg.frame_timeout = FRAME_TIMEOUT;
    let mut node = KmodTransport::open(cfg).unwrap();
    let tx = sender();
    // The lent frame borrows the node: read its counters through the module.
    let busy = || status(Path::new(DEVICE_PATH), INFO_SCOPE_MODULE).unwrap().counters.drop_bank_busy;
    let wait_busy = |n: u64, what: &str| {
        let deadline = Instant::now() + PATIENCE;
        while busy() != n {
            assert!(Instant::now() < deadline, "{what}: drop_bank_busy {} != {n}", busy());
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let (f1, f65, f129) = (pattern(1, 100), pattern(65, 100), pattern(129, 100));
    send_all(&tx, port, &chunks_of(1, &f1));
    let lent = node.recv_prev_lent().unwrap();
    assert!(lent.kind() == FrameKind::Data && *lent == f1[..]);
    // Seq 65 maps to bank 1, which the lent frame holds.
    let b0 = busy();
    send_all(&tx, port, &chunks_of(65, &f65));
    wait_busy(b0 + 1, "frame 65 while bank 1 is lent");
    drop(lent);
    // Bank 1 is free: frame 65 lands there.
    send_all(&tx, port, &chunks_of(65, &f65));
    let lent = node.recv_prev_lent().unwrap();
    assert!(*lent == f65[..], "bank 1 did not take frame 65 after the lent frame was dropped");
    // The first frame's release did not free bank 1 again under this one.
    send_all(&tx, port, &chunks_of(129, &f129));
    wait_busy(b0 + 2, "frame 129 while bank 1 is lent again");
    drop(lent);
    // Through relay, too, the bank is released once the step is done.
    send_all(&tx, port, &chunks_of(129, &f129));
    let mut control = [0u8; 128];
    let mut seen = Vec::new();
    let got = node.relay(&mut control, &mut |input, output| {
        seen.extend_from_slice(input);
        output.copy_from_slice(input);
    });
    assert_eq!(got.unwrap().len, 100);
    assert!(seen == f129);
    send_all(&tx, port, &chunks_of(193, &pattern(193, 100)));
    let lent = node.recv_prev_lent().unwrap();
    assert!(*lent == pattern(193, 100)[..], "bank 1 stayed held after relay");
    drop(lent);
    let c = node.counters().unwrap();
    assert_eq!((c.rx_frames_delivered, c.drop_bank_busy, c.dropped()), (4, 2, 2), "{c:#?}");
}

/// Event loops on the module: a receive with a zero deadline polls once
/// (returns at once, counts no timeout), the device's descriptor becomes
/// readable when a frame is complete in a bank, and a frame written in
/// place with `send_next_begin` / `send_next_commit` arrives intact.
#[test]
#[ignore = "needs /dev/leap_tensor: run inside the VM by cargo xtask vm"]
fn kmod_poll_once_never_blocks_and_the_descriptor_wakes_for_a_frame() {
    use leap::{FrameKind, Transport};
    const LEN: usize = 16392;
    let mut nodes = kmod_ring();
    let (head, rest) = nodes.split_at_mut(1);
    let (head, node) = (&mut head[0], &mut rest[0]);
    node.set_recv_timeout(Some(Duration::ZERO));
    let mut buf = vec![0u8; LEN];
    let timeouts = node.stats().timeouts;
    for _ in 0..100 {
        let start = Instant::now();
        let e = node.recv_prev(&mut buf).unwrap_err();
        assert!(e.is_would_block(), "{e}");
        assert!(start.elapsed() < Duration::from_millis(50), "a poll took {:?}", start.elapsed());
    }
    assert_eq!(node.stats().timeouts, timeouts, "a poll is not a timeout");
    let fd = node.ready_fd().unwrap().as_raw_fd();
    let readable = |ms: u16| {
        // SAFETY: `fd` is the node's device descriptor, open while it lives.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut p = [PollFd::new(fd, PollFlags::POLLIN)];
        nix::poll::poll(&mut p, nix::poll::PollTimeout::from(ms)).unwrap() > 0
    };
    assert!(!readable(0), "readable with nothing there");
    for round in 0..20u16 {
        let frame = pattern(round, LEN);
        head.send_next_begin(FrameKind::Data, LEN).unwrap().copy_from_slice(&frame);
        head.send_next_commit().unwrap();
        assert!(readable(2000), "round {round}: a complete frame must make the device readable");
        let got = node.recv_prev_lent().unwrap();
        assert!(*got == *frame, "round {round}: the frame changed");
        drop(got);
        assert!(node.recv_prev(&mut buf).unwrap_err().is_would_block());
        assert!(!readable(0), "round {round}: readable with nothing there");
    }
}
