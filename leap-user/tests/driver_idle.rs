//! The datagram driver on an idle node: while a receive call waits for
//! the previous node's next frame, the driver thread sleeps (the call runs
//! the recovery timers itself). Its own test binary: the count of the
//! driver's context switches must not see other tests' transports.

use std::time::Duration;

use leap::{Transport, TransportError};

mod support;

/// Context switches of this process's threads named `leap-drive-*`.
fn driver_switches() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("leap-drive") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

#[test]
fn an_idle_receive_leaves_the_driver_asleep() {
    // A node waiting for its previous node's next frame: the receive call
    // runs the timers itself, so the driver has nothing to do until it
    // ends. It used to look every millisecond all the same (about 1 000
    // wake-ups a second on an idle node).
    let (mut a, b) = support::udp_pair();
    // Only the waiting node's driver is counted.
    drop(b);
    a.set_recv_timeout(Some(Duration::from_millis(1500)));
    let waiter = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64];
        matches!(a.recv_prev(&mut buf), Err(TransportError::Timeout(_)))
    });
    std::thread::sleep(Duration::from_millis(200));
    let before = driver_switches();
    std::thread::sleep(Duration::from_millis(1000));
    let woke = driver_switches() - before;
    assert!(waiter.join().unwrap(), "the receive timed out");
    // A look every 250 ms at most, each a switch or two.
    assert!(woke < 20, "the driver woke {woke} times in 1 s while a receive waited");
}
