//! `cargo xtask vm [-- CMD...]`: boots Debian's two LTS kernels (6.1 and
//! 6.12) in turn in qemu, each with a busybox initramfs carrying
//! `leap_kmod.ko` built for it, the modules it needs from the same release,
//! `leap`, the `kmod_vm` test binary, the C program `original_abi`
//! (static) and, for the suite, the C library's example ring (`ring`) and
//! the C++ drop-in's engine example (`engine`) with the installed
//! `libleap.so`, and runs the kernel-module test suite (or CMD) on each.
//!
//! The host kernel here cannot load modules, so this is where the module is
//! proven. The guest has no network device: every packet stays on its
//! loopback or on veth pairs the tests create inside it.
//!
//! qemu runs under TCG (software emulation, about 10 s to boot and load);
//! `LEAP_VM_ACCEL=kvm` uses KVM where nested virtualisation works.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::kmod::{self, Lts};
use crate::tools::{self, Tool};
use crate::util;

/// Arguments of `cargo xtask vm`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kernel build tree to build the module against instead of Debian's
    /// LTS headers; the guest kernel is Debian's image of the same release.
    #[arg(long)]
    kernel_dir: Option<PathBuf>,
    /// Which of Debian's LTS kernels to boot (repeatable; default: both).
    #[arg(long = "kernel", value_enum)]
    kernels: Vec<Lts>,
    /// Only the module and the shell steps: skip building the Rust binaries.
    #[arg(long)]
    kmod_only: bool,
    /// Give up on the guest after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Another host program in the guest's `/bin`, as NAME=PATH (repeatable),
    /// e.g. a `leap` built from an older commit to compare with in one boot.
    #[arg(long = "bin", value_name = "NAME=PATH", value_parser = parse_bin)]
    bins: Vec<(String, PathBuf)>,
    /// Command to run in the guest instead of the test suite (the module is
    /// loaded first; PATH holds `leap` and `kmod_vm`; `ring` and `engine`
    /// are the suite's: give them with --bin).
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// Host programs the guest gets in `/sbin` (ahead of busybox's applets on
/// PATH): iproute2's `ip` has `ip netns`, which busybox's lacks.
/// util-linux's `setpriv` runs the capability tests as an unprivileged user.
const HOST_TOOLS: &[Tool] = &[Tool::Ip, Tool::Setpriv];

/// What the host runs to build and boot the guest (kbuild's own tools are
/// ensured per tree by [`kmod::build`]).
const VM_TOOLS: &[Tool] = &[
    Tool::Qemu,
    Tool::Busybox,
    Tool::Ip,
    Tool::Setpriv,
    Tool::Gcc,
    Tool::Gxx,
    Tool::PkgConfig,
    Tool::Ldd,
    Tool::Strip,
    Tool::Xz,
    Tool::Zstd,
    Tool::AptGet,
    Tool::AptCache,
    Tool::DpkgDeb,
    Tool::DpkgQuery,
];

/// Debian packages without a program of the table: the C library's
/// headers and static archive (`original_abi`, `ring`).
const VM_PACKAGES: &[&str] = &["libc6-dev"];

/// Extra modules of the Debian kernel the guest needs (with their deps).
const GUEST_MODULES: &[&str] = &["veth"];

/// Marker lines that init prints on the console.
const EXIT_MARKER: &str = "LEAP_VM_EXIT=";

/// `/init` of the guest.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/sbin:/bin
mkdir -p /run/netns /var/run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mkdir -p /sys/fs/bpf && mount -t bpf bpf /sys/fs/bpf 2>/dev/null
ip link set lo up
for m in $(cat /etc/leap/modules); do
	insmod /lib/modules/$m || echo "LEAP_VM: insmod $m failed"
done
echo "LEAP_VM: booted $(uname -r), $(nproc) cpus"
if [ -s /etc/leap/cmd ]; then
	insmod /lib/modules/leap_kmod.ko || echo "LEAP_VM: insmod leap_kmod failed"
	sh /etc/leap/cmd
	echo "LEAP_VM_EXIT=$?"
else
	sh /etc/leap/suite.sh
fi
poweroff -f
"#;

/// The default suite: the Rust tests plus the steps that need a shell.
const SUITE: &str = r#"
KO=/lib/modules/leap_kmod.ko
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "LEAP_VM_STEP ok: $1"; }
ko() { fail=$((fail + 1)); echo "LEAP_VM_STEP FAILED: $1"; }
check() { name=$1; shift; if "$@"; then ok "$name"; else ko "$name"; fi; }

check "insmod leap_kmod" insmod $KO
check "/dev/leap_tensor is a character device" test -c /dev/leap_tensor

if [ -x /bin/kmod_vm ]; then
	KMOD_VM_KO=$KO /bin/kmod_vm --ignored --test-threads=1 >/tmp/kmod_vm.log 2>&1
	rc=$?
	cat /tmp/kmod_vm.log
	line=$(grep '^test result:' /tmp/kmod_vm.log | tail -n 1)
	p=$(echo "$line" | sed -n 's/.* \([0-9][0-9]*\) passed.*/\1/p')
	f=$(echo "$line" | sed -n 's/.* \([0-9][0-9]*\) failed.*/\1/p')
	if [ -z "$p" ] || [ -z "$f" ]; then
		ko "kmod_vm test binary printed no summary (exit $rc)"
	else
		pass=$((pass + p))
		fail=$((fail + f))
		if [ "$rc" != 0 ] && [ "$f" = 0 ]; then ko "kmod_vm exited $rc"; fi
	fi
fi

# A C program written against the original ABI only (ioctls 1-6, write,
# mmap): the bytes of sent chunks, GET_BANK_SRC's byte order, a 131072-byte
# frame, a 0-byte send.
check "original ABI program: reserved 0, GET_BANK_SRC network order, 131072-byte frame, 0-byte SEND" \
	/bin/original_abi all

# Opening needs CAP_NET_ADMIN (the device is made world-writable for the test).
# util-linux's setpriv: busybox's applet lacks --reuid.
chmod 0666 /dev/leap_tensor
/sbin/setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all \
	/bin/original_abi bind 24100
rc=$?
if [ $rc = 3 ]; then ok "a user without CAP_NET_ADMIN cannot open and bind"; else ko "a user without CAP_NET_ADMIN cannot open and bind (exit $rc)"; fi
check "a user with only CAP_NET_ADMIN can open and bind" \
	/sbin/setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all,+net_admin \
	--ambient-caps=-all,+net_admin --bounding-set=-all,+net_admin /bin/original_abi bind 24101
chmod 0600 /dev/leap_tensor

# A member of the device's group (as the packaged udev rule makes
# it) with no capability runs busybox's `unshare -Urn`: it owns a user and a
# network namespace and holds CAP_NET_ADMIN there, which must not open the
# device (EPERM from the module, not EACCES from the file mode: the same
# member with CAP_NET_ADMIN in the initial namespace opens).
chown 0:1000 /dev/leap_tensor && chmod 0660 /dev/leap_tensor
/sbin/setpriv --reuid=1000 --regid=1000 --groups=1000 --inh-caps=-all --bounding-set=-all \
	unshare -Urn /bin/original_abi bind 24102 2>/tmp/userns.err
rc=$?
if [ $rc = 3 ] && grep -q "^open /dev/leap_tensor: Operation not permitted" /tmp/userns.err; then
	ok "a group member in its own user namespace (unshare -Urn) cannot open: EPERM"
else
	ko "a group member in its own user namespace (unshare -Urn) cannot open: EPERM (exit $rc: $(cat /tmp/userns.err))"
fi
check "a group member with CAP_NET_ADMIN in the initial namespace can open and bind" \
	/sbin/setpriv --reuid=1000 --regid=1000 --groups=1000 --inh-caps=-all,+net_admin \
	--ambient-caps=-all,+net_admin --bounding-set=-all,+net_admin /bin/original_abi bind 24103
chown 0:0 /dev/leap_tensor && chmod 0600 /dev/leap_tensor

# The 16 MiB buffer and the file state are charged to the opener's cgroup
# (at least 15 MiB: memcg charges in per-CPU batches, the delta is not exact).
mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/leaptest
delta=$(sh -c 'echo $$ >/sys/fs/cgroup/leaptest/cgroup.procs
	before=$(cat /sys/fs/cgroup/leaptest/memory.current)
	exec 3<>/dev/leap_tensor
	after=$(cat /sys/fs/cgroup/leaptest/memory.current)
	echo $((after - before))')
echo "memory.current grew by $delta bytes on open"
if [ -n "$delta" ] && [ "$delta" -ge 15728640 ]; then ok "the buffer is charged to the opener's memory cgroup"; else ko "the buffer is charged to the opener's memory cgroup ($delta bytes)"; fi
rmdir /sys/fs/cgroup/leaptest 2>/dev/null

# Hostile input: 120 000 random and malformed LEAP packets (bad lengths, ids,
# totals, sources; oversize ones fragmented on the 1500-byte veth) at a node
# on the module, before the rings below run through it.
if [ -x /bin/leap ]; then
	# busybox sh prefers its own `ip` applet, which lacks -n and netns.
	IP=/sbin/ip
	$IP netns add fa && $IP netns add fb &&
		$IP link add fva netns fa type veth peer name fvb netns fb &&
		$IP -n fa addr add 10.9.0.1/24 dev fva && $IP -n fb addr add 10.9.0.2/24 dev fvb &&
		$IP -n fa link set fva up && $IP -n fb link set fvb up &&
		$IP -n fa link set lo up && $IP -n fb link set lo up
	$IP netns exec fb leap node --transport kmod --listen 10.9.0.2:9990 --next 10.9.0.1:9991 \
		--prev 10.9.0.1:9992 --role worker >/tmp/flood-node.log 2>&1 &
	fpid=$!
	sleep 1
	$IP netns exec fa leap flood --target 10.9.0.2:9990 --count 100000 --bind 10.9.0.1:0 &&
		$IP netns exec fa leap flood --malformed-only --target 10.9.0.2:9990 --count 20000 --bind 10.9.0.1:9992
	frc=$?
	leap kmod status --json >/tmp/kmod-status.json
	cat /tmp/kmod-status.json
	if [ $frc = 0 ] && kill -0 $fpid 2>/dev/null && grep -q '"loaded":true' /tmp/kmod-status.json &&
		grep -Eq '"drop_(oversize|bad_chunk_id|bad_length|total_mismatch|peer)":[1-9]' /tmp/kmod-status.json; then
		ok "the module drops and counts a 120000-packet flood"
	else
		tail -n 20 /tmp/flood-node.log
		ko "the module drops and counts a 120000-packet flood"
	fi
	kill $fpid 2>/dev/null
	wait $fpid 2>/dev/null
	$IP netns del fa
	$IP netns del fb
fi

# A ring through `leap`: its JSON line must show every frame delivered intact.
ring() {
	n=$1
	name=$2
	shift 2
	leap ring "$@" --frames $n --json >/tmp/ring.out 2>/tmp/ring.err
	rc=$?
	line=$(tail -n 1 /tmp/ring.out)
	echo "$line"
	if [ $rc = 0 ] && echo "$line" | grep -q "\"frames_delivered\":$n," &&
		echo "$line" | grep -q '"frames_corrupt":0,'; then
		ok "$name"
	else
		tail -n 20 /tmp/ring.err
		ko "$name (exit $rc)"
	fi
}
if [ -x /bin/leap ]; then
	ring 1000 "leap ring: kmod, 3 nodes on loopback" --transport kmod --nodes 3 --frame-size 16392
	ring 300 "leap ring: kmod, 3 nodes in namespaces over veth" --transport kmod --netns --nodes 3 --frame-size 16392
	ring 300 "leap ring: kmod, 3 nodes on loopback, 32 KiB frames" --transport kmod --nodes 3 --frame-size 32776
	echo 0 >/sys/module/leap_kmod/parameters/tx_gso
	ring 300 "leap ring: kmod one datagram per chunk (tx_gso=0), 3 nodes in namespaces" --transport kmod --netns --nodes 3 --frame-size 16392
	echo 1 >/sys/module/leap_kmod/parameters/tx_gso
	echo 2000 >/sys/module/leap_kmod/parameters/busy_wait_limit
	ring 300 "leap ring: kmod spinning before sleep (busy_wait_limit=2000), 3 nodes in namespaces" --transport kmod --netns --nodes 3 --frame-size 16392
	echo 0 >/sys/module/leap_kmod/parameters/busy_wait_limit
	if dmesg | grep -q 'UDP_GRO refused'; then ko "the module's socket refused UDP_GRO"; else ok "GSO datagrams taken whole (UDP_GRO accepted)"; fi
	ring 300 "leap ring: udp at MTU 9000 (chunk trains), 3 nodes in namespaces" --transport udp --netns --nodes 3 --frame-size 16392 --mtu 9000
	if [ -e /etc/leap/xdp ]; then
		ring 300 "leap ring: xdp, 3 nodes in namespaces ($(uname -r) verifier)" --transport xdp --netns --nodes 3 --frame-size 16392
		# As the packaged service runs them: each node keeps only the unit's
		# capabilities (root only sets up the namespaces).
		ring 300 "leap ring: xdp with only the packaged unit's capabilities ($(uname -r))" --transport xdp --netns --nodes 3 --frame-size 16392 --unit-caps
		ring 300 "leap ring: xdp-ringbuf with only the packaged unit's capabilities ($(uname -r))" --transport xdp-ringbuf --netns --nodes 3 --frame-size 16392 --unit-caps
		# Jumbo frames: the multi-buffer (frags) program on veths at MTU 9000,
		# chunk trains between the nodes; then the same with busy polling.
		for t in xdp xdp-ringbuf; do
			ring 300 "leap ring: $t at MTU 9000 (multi-buffer program, trains), unit's capabilities ($(uname -r))" --transport $t --netns --nodes 3 --frame-size 16392 --mtu 9000 --unit-caps
			if grep -q "refuses the multi-buffer XDP program" /tmp/ring.err; then ko "$t at MTU 9000: the program without multi-buffer support was attached"; fi
			ring 300 "leap ring: $t at MTU 9000 with busy polling, unit's capabilities ($(uname -r))" --transport $t --netns --nodes 3 --frame-size 16392 --mtu 9000 --busy-poll --unit-caps
			if grep -q "busy polling is off" /tmp/ring.err; then ko "$t --busy-poll: the kernel refused busy polling"; fi
		done
	else
		echo "LEAP_VM_STEP skipped: xdp ring (leap built without the XDP object)"
	fi
fi

# The C library and the C++ drop-in over the module: the C example ring
# (ring.c: lending, leap_send_begin/commit, a RESIZE_CHAIN round halfway)
# and the C++ engine example with `--transport kernel` (KernelTransport:
# the original engine's calls, a RESIZE_CHAIN round and its ACK first),
# each process bounded by `timeout`, its output in /tmp/b.NAME.{out,err}.
IP=/sbin/ip
# start NAME CMD...: CMD in the background, killed after 180 s.
start() { sn=$1; shift; timeout 180 "$@" >/tmp/b.$sn.out 2>/tmp/b.$sn.err & eval "pid_$sn=\$!"; }
# fin NAME: waits for it; fails (showing its stderr) unless it exited 0.
fin() {
	eval "wait \$pid_$1"
	rc=$?
	if [ $rc != 0 ]; then echo "$1 exited $rc"; tail -n 20 /tmp/b.$1.err; return 1; fi
}
# has NAME TEXT: its last line on stdout holds TEXT.
has() {
	tail -n 1 /tmp/b.$1.out | grep -qF -- "$2" && return 0
	echo "$1: no $2 in: $(tail -n 1 /tmp/b.$1.out)"
	return 1
}
# The C++ program's counters (LEAP_STATS=1) say it ran the kmod backend.
on_kmod() {
	grep -qF '{"leap_stats":"kmod"' /tmp/b.$1.err && return 0
	echo "$1 did not run over kmod: $(grep leap_stats /tmp/b.$1.err)"
	return 1
}
# Three namespaces in a ring of veth pairs: link i joins node i (10.66.i.1)
# and node i+1 (10.66.i.2).
lr_up() {
	for i in 0 1 2; do $IP netns add lr$i || return 1; done
	for i in 0 1 2; do
		j=$(((i + 1) % 3))
		$IP link add l${i}a netns lr$i type veth peer name l${i}b netns lr$j &&
			$IP -n lr$i addr add 10.66.$i.1/24 dev l${i}a && $IP -n lr$j addr add 10.66.$i.2/24 dev l${i}b &&
			$IP -n lr$i link set l${i}a up && $IP -n lr$j link set l${i}b up && $IP -n lr$i link set lo up || return 1
	done
}
lr_down() { for i in 0 1 2; do $IP netns del lr$i 2>/dev/null; done; }
# lent NAME FRAMES: ring.c's worker copied no data frame: its copies per
# hop (counted from its 10th frame on) add up to at most the one frame
# leap_send_control writes when it forwards the control round.
lent() {
	c=$(tail -n 1 /tmp/b.$1.out | sed -n 's/.*"copies_per_hop":\([0-9.]*\).*/\1/p')
	awk -v c="$c" -v n=$2 'BEGIN { exit !(c != "" && c * (n - 9) <= 1.01) }' && return 0
	echo "$1 copied more than the control frame: copies_per_hop $c over $(($2 - 9)) frames"
	return 1
}
# c_ring NAME FRAMES NETNS(0|1): a head and two workers of ring.c over kmod;
# every frame back intact, the control round back, no data frame copied in
# the workers.
c_ring() {
	name=$1
	n=$2
	for i in 1 2 0; do
		if [ "$3" = 1 ]; then
			wrap="$IP netns exec lr$i"
			a="10.66.$i.1:9999 --next 10.66.$i.2:9999 --prev 10.66.$(((i + 2) % 3)).1:9999"
		else
			wrap=
			a="127.0.0.1:$((24300 + i)) --next 127.0.0.1:$((24300 + (i + 1) % 3)) --prev 127.0.0.1:$((24300 + (i + 2) % 3))"
		fi
		if [ $i = 0 ]; then
			sleep 1
			r="head --workers 2"
		else
			r="worker --index $((i - 1))"
		fi
		start c$i $wrap ring --kind kmod --role $r --listen $a --frames $n --dim 4096
	done
	good=1
	for i in 0 1 2; do fin c$i || good=0; done
	cat /tmp/b.c0.out /tmp/b.c1.out /tmp/b.c2.out
	has c0 "\"intact\":$n," && has c0 '"control_back":true' && has c0 '"kind":"kmod"' || good=0
	for i in 1 2; do has c$i "\"relayed\":$n," && lent c$i $n || good=0; done
	if [ $good = 1 ]; then ok "$name"; else ko "$name"; fi
}
# engine as the original engine runs: LEAP_OPTIONS gives a stalled ring a
# deadline (the drop-in has none by default).
ENGINE="env LEAP_STATS=1 LEAP_OPTIONS=recv_timeout_ms=30000 engine --transport kernel --frames 300 --dim 4096"
if [ -x /bin/ring ]; then
	c_ring "C ring (libleap, ring.c): kmod, 3 processes on loopback, 300 frames intact, control round, workers copy no data frame" 300 0
	if lr_up; then
		c_ring "C ring (libleap, ring.c): kmod, 3 processes in namespaces over veth, 300 frames intact" 300 1
	else
		ko "C ring in namespaces: the veth ring could not be set up"
	fi
	lr_down
else
	echo "LEAP_VM_STEP skipped: C ring (no /bin/ring: --kmod-only or CMD)"
fi
if [ -x /bin/engine ]; then
	# A head and two workers, all KernelTransport, on loopback.
	for i in 1 2 0; do
		if [ $i = 0 ]; then
			sleep 1
			r="head --workers 2"
		else
			r="worker --index $((i - 1))"
		fi
		start e$i $ENGINE --role $r --host 127.0.0.1 --port $((24310 + i)) \
			--next-host 127.0.0.1 --next-port $((24310 + (i + 1) % 3))
	done
	good=1
	for i in 0 1 2; do fin e$i || good=0; done
	cat /tmp/b.e0.out /tmp/b.e1.out /tmp/b.e2.out
	has e0 '"frames_delivered":300,' && has e0 '"frames_corrupt":0,' && has e0 '"control_ack":true' &&
		has e0 '"end_layer":32,' || good=0
	for i in 1 2; do has e$i '"relayed":300,' && has e$i "\"chain_index\":$((i - 1))," || good=0; done
	for i in 0 1 2; do on_kmod e$i || good=0; done
	if [ $good = 1 ]; then
		ok "C++ engine (KernelTransport): head + 2 workers over kmod, RESIZE_CHAIN acked, 300 frames intact"
	else
		ko "C++ engine (KernelTransport): head + 2 workers over kmod, RESIZE_CHAIN acked, 300 frames intact"
	fi
	# Mixed: a C++ KernelTransport head, `leap node` over kmod, `leap node`
	# over udp (the module's neighbours are original to it: single chunks,
	# no NACKs) and a C++ KernelTransport tail that computes and ACKs.
	if [ -x /bin/leap ]; then
		start m1 leap node --transport kmod --role worker --frame-size 16392 --listen 127.0.0.1:24321 \
			--next 127.0.0.1:24322 --prev 127.0.0.1:24320
		start m2 leap node --transport udp --role worker --frame-size 16392 --listen 127.0.0.1:24322 \
			--next 127.0.0.1:24323 --prev 127.0.0.1:24321
		start m3 $ENGINE --role worker --index 2 --host 127.0.0.1 --port 24323 --next-host 127.0.0.1 --next-port 24320
		sleep 1
		start m0 $ENGINE --role head --workers 3 --compute-workers 1 --host 127.0.0.1 --port 24320 \
			--next-host 127.0.0.1 --next-port 24321
		good=1
		for i in 0 3; do fin m$i || good=0; done
		for i in 1 2; do
			if ! kill $(eval echo \$pid_m$i) 2>/dev/null; then
				echo "leap node m$i ended before the head did"
				tail -n 20 /tmp/b.m$i.err
				good=0
			fi
			eval "wait \$pid_m$i"
		done
		cat /tmp/b.m0.out /tmp/b.m3.out
		has m0 '"frames_delivered":300,' && has m0 '"frames_corrupt":0,' && has m0 '"control_ack":true' &&
			has m0 '"end_layer":32,' && has m3 '"relayed":300,' && has m3 '"chain_index":2,' &&
			on_kmod m0 && on_kmod m3 || good=0
		if [ $good = 1 ]; then
			ok "mixed ring: C++ KernelTransport head, leap node kmod, leap node udp, C++ KernelTransport tail; 300 frames intact, ACK back"
		else
			ko "mixed ring: C++ KernelTransport head, leap node kmod, leap node udp, C++ KernelTransport tail; 300 frames intact, ACK back"
		fi
	fi
else
	echo "LEAP_VM_STEP skipped: C++ engine (no /bin/engine: --kmod-only or CMD)"
fi

exec 3</dev/leap_tensor
if rmmod leap_kmod 2>/dev/null; then
	ko "rmmod is refused while the device is open"
	insmod $KO
else
	ok "rmmod is refused while the device is open"
fi
exec 3<&-

i=0
good=1
while [ $i -lt 10 ]; do
	rmmod leap_kmod || good=0
	[ -e /dev/leap_tensor ] && good=0
	insmod $KO || good=0
	[ -c /dev/leap_tensor ] || good=0
	i=$((i + 1))
done
if [ $good = 1 ]; then ok "rmmod/insmod repeated 10 times"; else ko "rmmod/insmod repeated 10 times"; fi

rmmod leap_kmod
if insmod $KO leap_buffer_size=4096 2>/dev/null; then
	ko "insmod refuses a leap_buffer_size other than the ABI's"
	rmmod leap_kmod
else
	ok "insmod refuses a leap_buffer_size other than the ABI's"
fi
check "insmod takes the original's leap_buffer_size=8388608" insmod $KO leap_buffer_size=8388608

if dmesg | grep -E 'BUG|WARNING|Oops|general protection|leak'; then
	ko "kernel log has no BUG, WARNING or Oops"
else
	ok "kernel log has no BUG, WARNING or Oops"
fi

echo "$pass passed, $fail failed"
if [ $fail = 0 ] && [ $pass -gt 0 ]; then echo "LEAP_VM_EXIT=0"; else echo "LEAP_VM_EXIT=1"; fi
"#;

impl Args {
    /// The arguments of `cargo xtask vm WORDS...`, e.g. `["--", "sh", "-c",
    /// script]`: the defaults, for `ci` and `bench`.
    pub fn parse_words(words: &[&str]) -> Self {
        #[derive(clap::Parser)]
        struct Vm {
            #[command(flatten)]
            args: Args,
        }
        <Vm as clap::Parser>::parse_from(std::iter::once("vm").chain(words.iter().copied())).args
    }
}

/// Runs `cargo xtask vm`.
///
/// # Errors
///
/// When something cannot be built or downloaded, the guest does not finish
/// in time, or the suite (or CMD) fails on any kernel.
pub fn run(args: Args) -> Result<()> {
    let guests = run_guests(&args)?;
    let mut failed = Vec::new();
    for g in &guests {
        match g.outcome.as_ref().map_err(|e| format!("{e:#}")).and_then(|c| c.verdict().map_err(|e| e.to_string())) {
            Ok(summary) => eprintln!("vm: {}: {summary} ({:.0} s)", g.kernel, g.secs),
            Err(e) => {
                eprintln!("vm: {}: FAILED ({:.0} s): {e}", g.kernel, g.secs);
                failed.push(g.kernel.clone());
            }
        }
    }
    if !failed.is_empty() {
        bail!("the suite failed on {} (see `vm: ... FAILED` above)", failed.join(" and "));
    }
    Ok(())
}

/// One kernel's guest run.
#[derive(Debug)]
pub struct Guest {
    /// `6.1`, `6.12`, or the `--kernel-dir` tree.
    pub kernel: String,
    /// Wall time: module build, initramfs, boot.
    pub secs: f64,
    /// What the guest printed, or why it did not boot or finish.
    pub outcome: Result<Console>,
}

/// Builds what every guest needs, then for each kernel builds the module,
/// boots the guest and runs the suite (or CMD). One kernel's failure does
/// not keep the others from running.
///
/// # Errors
///
/// When a tool cannot be installed or the user-space binaries cannot be built.
pub fn run_guests(args: &Args) -> Result<Vec<Guest>> {
    tools::ensure(VM_TOOLS)?;
    tools::apt_install(VM_PACKAGES)?;
    check_static(Tool::Busybox)?;
    let mut user = if args.kmod_only {
        UserBinaries { bins: Vec::new(), xdp: false }
    } else {
        build_user_binaries(args.cmd.is_empty())?
    };
    user.bins.push(("original_abi".into(), build_original_abi()?));
    user.bins.extend(args.bins.iter().cloned());
    let trees: Vec<(String, Option<Lts>)> = match (&args.kernel_dir, args.kernels.as_slice()) {
        (Some(dir), _) => vec![(dir.display().to_string(), None)],
        (None, []) => [Lts::V6_1, Lts::V6_12].map(|k| (k.name().to_owned(), Some(k))).into(),
        (None, ks) => ks.iter().map(|k| (k.name().to_owned(), Some(*k))).collect(),
    };
    let mut guests = Vec::new();
    for (kernel, lts) in trees {
        let started = Instant::now();
        let outcome = (|| {
            let tree = match (lts, &args.kernel_dir) {
                (Some(lts), _) => kmod::tree(lts)?,
                (None, dir) => dir.clone().context("a kernel directory or an LTS kernel")?,
            };
            run_on(args, &kmod::build(&tree)?, &user)
        })();
        let secs = started.elapsed().as_secs_f64();
        let passed = outcome.as_ref().is_ok_and(|c| c.verdict().is_ok());
        eprintln!("vm: {kernel}: {} in {secs:.0} s", if passed { "passed" } else { "FAILED" });
        guests.push(Guest { kernel, secs, outcome });
    }
    Ok(guests)
}

/// Fails unless `tool` is statically linked (the guest has no libraries
/// for it).
fn check_static(tool: Tool) -> Result<()> {
    let path = tools::find(tool).with_context(|| format!("{} is missing", tool.describe()))?;
    let ldd = util::capture(tools::command(Tool::Ldd)?.arg(&path), util::DEFAULT_LIMIT)?;
    let text = String::from_utf8_lossy(&ldd.stdout) + String::from_utf8_lossy(&ldd.stderr);
    if !text.contains("not a dynamic executable") && !text.contains("statically linked") {
        let pkg = match tool.source() {
            tools::Source::Apt(p) => p,
            _ => "a static build",
        };
        bail!(
            "{} is dynamically linked and the guest has no libraries for it: `{}`",
            path.display(),
            tools::install_command(&[pkg])
        );
    }
    Ok(())
}

/// `NAME=PATH` of `--bin`.
fn parse_bin(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !name.contains('/') && !path.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(path)))
        }
        _ => Err(format!("{s}: expected NAME=PATH, NAME without '/'")),
    }
}

/// Builds the C test program written against the original ABI, statically,
/// so the guest needs no library for it.
fn build_original_abi() -> Result<PathBuf> {
    let src = util::root().join("kmod/tests/original_abi.c");
    let out = util::root().join("target/vm/original_abi");
    std::fs::create_dir_all(util::root().join("target/vm"))?;
    util::run(
        tools::command(Tool::Gcc)?.args(["-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o"]).arg(&out).arg(&src),
    )?;
    Ok(out)
}

/// Boots Debian's image of `module.release` with the module and runs the
/// suite (or CMD); returns what the guest printed.
fn run_on(args: &Args, module: &kmod::BuiltModule, user: &UserBinaries) -> Result<Console> {
    let kernel = debian_kernel(&module.release)?;

    let mut cpio = Cpio::default();
    cpio.file("init", 0o755, INIT.as_bytes())?;
    cpio.file("etc/leap/suite.sh", 0o644, SUITE.as_bytes())?;
    cpio.file("etc/leap/cmd", 0o644, shell_join(&args.cmd).as_bytes())?;
    for dir in ["proc", "sys", "dev", "tmp", "root", "run", "var"] {
        cpio.dir(dir)?;
    }
    let busybox = tools::find(Tool::Busybox).context("busybox is missing")?;
    cpio.file(
        "bin/busybox",
        0o755,
        &std::fs::read(&busybox).with_context(|| format!("reading {}", busybox.display()))?,
    )?;
    cpio.file("lib/modules/leap_kmod.ko", 0o644, &std::fs::read(&module.ko)?)?;
    let mut load_order = Vec::new();
    for m in kernel.modules_with_deps(GUEST_MODULES)? {
        let name = m.file_name().and_then(|n| n.to_str()).context("module name")?;
        let name = name.trim_end_matches(".xz").trim_end_matches(".zst").to_owned();
        cpio.file(&format!("lib/modules/{name}"), 0o644, &read_module(&m)?)?;
        load_order.push(name);
    }
    cpio.file("etc/leap/modules", 0o644, load_order.join("\n").as_bytes())?;
    let mut libs = BTreeSet::new();
    for &tool in HOST_TOOLS {
        let path = tools::find(tool).with_context(|| format!("{} is missing", tool.describe()))?;
        let data = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        cpio.file(&format!("sbin/{}", tool.program()), 0o755, &data)?;
        libs.extend(shared_libraries(&path)?);
    }
    if user.xdp {
        cpio.file("etc/leap/xdp", 0o644, b"1")?;
    }
    for (name, path) in &user.bins {
        cpio.file(&format!("bin/{name}"), 0o755, &stripped(path)?)?;
        libs.extend(shared_libraries(path)?);
    }
    for lib in &libs {
        // libleap.so carries the release profile's debug info.
        cpio.file(lib.to_str().context("library path")?.trim_start_matches('/'), 0o755, &stripped(lib)?)?;
    }
    let initrd = util::root().join(format!("target/vm/initrd-{}.cpio", module.release));
    std::fs::write(&initrd, cpio.finish())?;

    boot(&kernel.vmlinuz, &initrd, Duration::from_secs(args.timeout))
}

/// What a guest printed on its console.
#[derive(Debug)]
pub struct Console {
    /// The code init printed after [`EXIT_MARKER`].
    pub code: i32,
    /// The suite's `N passed, M failed` line.
    pub summary: Option<String>,
    /// Every line.
    pub lines: Vec<String>,
}

impl Console {
    /// The summary when the guest reported success.
    ///
    /// # Errors
    ///
    /// The guest reported failure.
    pub fn verdict(&self) -> Result<String> {
        if self.code != 0 {
            bail!(
                "the guest reported failure ({EXIT_MARKER}{}); {}",
                self.code,
                self.summary.as_deref().unwrap_or("no summary")
            );
        }
        Ok(self.summary.clone().unwrap_or_else(|| "passed".into()))
    }
}

/// Debian's kernel image of one release, unpacked under `target/vm/`.
struct Kernel {
    vmlinuz: PathBuf,
    modules: PathBuf,
}

impl Kernel {
    /// Paths of `names` and of every module they depend on, dependencies
    /// first. The package ships no `modules.dep` (depmod makes it at install
    /// time), so dependencies come from each module's `depends=` modinfo.
    fn modules_with_deps(&self, names: &[&str]) -> Result<Vec<PathBuf>> {
        let mut index = std::collections::BTreeMap::new();
        let mut stack = vec![self.modules.join("kernel")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
                let path = entry?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Some(file) = path.file_name().and_then(|n| n.to_str())
                    && let Some((name, _)) = file.split_once(".ko")
                {
                    index.insert(name.replace('-', "_"), path);
                }
            }
        }
        let mut order = Vec::new();
        for name in names {
            visit(&name.replace('-', "_"), &index, &mut order, 0)?;
        }
        return Ok(order);

        fn visit(
            name: &str,
            index: &std::collections::BTreeMap<String, PathBuf>,
            order: &mut Vec<PathBuf>,
            depth: usize,
        ) -> Result<()> {
            if depth > 32 {
                bail!("module dependency chain too long at {name}");
            }
            let path = index.get(name).with_context(|| format!("module {name} is not in the kernel image"))?;
            if order.contains(path) {
                return Ok(());
            }
            let data = read_module(path)?;
            for dep in modinfo(&data, "depends").split(',').filter(|d| !d.is_empty()) {
                visit(&dep.replace('-', "_"), index, order, depth + 1)?;
            }
            order.push(path.clone());
            Ok(())
        }
    }
}

/// The value of `key=` in a module's `.modinfo` strings ("" when absent).
fn modinfo(module: &[u8], key: &str) -> String {
    let needle = format!("{key}=");
    module
        .split(|&b| b == 0)
        .find_map(|s| s.strip_prefix(needle.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// Downloads (once) Debian's `linux-image-<release>` and unpacks it under
/// `target/vm/`, without installing it on the host.
fn debian_kernel(release: &str) -> Result<Kernel> {
    let dir = util::root().join("target/vm").join(format!("linux-image-{release}"));
    let kernel = Kernel {
        vmlinuz: dir.join(format!("boot/vmlinuz-{release}")),
        modules: dir.join(format!("lib/modules/{release}")),
    };
    if kernel.vmlinuz.is_file() && kernel.modules.join("kernel").is_dir() {
        return Ok(kernel);
    }
    let debs = util::root().join("target/vm/debs");
    std::fs::create_dir_all(&debs)?;
    let pkg = format!("linux-image-{release}");
    let download = || util::run(tools::command(Tool::AptGet)?.args(["download", "-q", &pkg]).current_dir(&debs));
    if download().is_err() {
        // The package lists may be older than the headers: refresh once.
        tools::apt_update()?;
        download()?;
    }
    let deb = std::fs::read_dir(&debs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb"))
        })
        .max()
        .with_context(|| format!("apt-get download left no {pkg}_*.deb in {}", debs.display()))?;
    let tmp = dir.with_file_name(format!("linux-image-{release}.partial"));
    let _ = std::fs::remove_dir_all(&tmp);
    util::run(tools::command(Tool::DpkgDeb)?.arg("-x").arg(&deb).arg(&tmp))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)?;
    if !kernel.vmlinuz.is_file() {
        bail!("{} holds no {}", deb.display(), kernel.vmlinuz.display());
    }
    Ok(kernel)
}

/// A module file, decompressed when Debian ships it compressed.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Tool::Xz
    } else if name.ends_with(".zst") {
        Tool::Zstd
    } else {
        return std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    let out = util::capture(tools::command(tool)?.arg("-dc").arg(path), util::DEFAULT_LIMIT)?;
    if !out.status.success() {
        bail!("{} -dc {} failed", tool.program(), path.display());
    }
    Ok(out.stdout)
}

/// The user-space binaries for the guest.
struct UserBinaries {
    /// `(name in the guest, path)`.
    bins: Vec<(String, PathBuf)>,
    /// Whether `leap` carries the XDP object (so the XDP ring can run).
    xdp: bool,
}

/// Builds `leap` (release, with the XDP object embedded when it can be
/// built; always in CI) and the `kmod_vm` test binary; with `bindings`,
/// also the C and C++ programs of [`build_bindings`].
fn build_user_binaries(bindings: bool) -> Result<UserBinaries> {
    let root = util::root();
    let object = match crate::ebpf::build_ebpf(util::in_ci()) {
        Ok(object) => Some(object),
        Err(e) if !util::in_ci() => {
            eprintln!("vm: no XDP object ({e:#}); the guest's leap runs without XDP and skips the XDP ring");
            None
        }
        Err(e) => return Err(e.context("building the XDP object for the VM's XDP ring")),
    };
    // Both commands build the `leap` binary (cargo builds a package's
    // binaries for its integration tests): both must embed the same object.
    let cargo = |args: &[&str]| -> Result<_> {
        let mut cmd = tools::cargo()?;
        cmd.args(args).current_dir(&root);
        if let Some(object) = &object {
            cmd.env(crate::ebpf::OBJECT_ENV, object);
        }
        Ok(cmd)
    };
    util::run(&mut cargo(&["build", "--release", "-p", "leap", "--bin", "leap"])?)?;
    let json = util::output(&mut cargo(&[
        "test",
        "--release",
        "-p",
        "leap",
        "--test",
        "kmod_vm",
        "--no-run",
        "--message-format=json",
    ])?)?;
    let test = json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "kmod_vm")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .context("cargo printed no kmod_vm test executable")?;
    let mut bins = vec![("leap".into(), root.join("target/release/leap")), ("kmod_vm".into(), test)];
    if bindings {
        bins.extend(build_bindings(object.as_deref())?);
    }
    Ok(UserBinaries { bins, xdp: object.is_some() })
}

/// The C library's example ring (`ring`, `leap-user/capi/examples/ring.c`)
/// and the C++ drop-in's engine example (`engine`, whose `--transport
/// kernel` is `KernelTransport` over the library's kmod backend), built as
/// CI builds them: against libleap installed under `target/vm/capi/prefix`
/// (with the same XDP object as `leap`, so that cargo builds the library
/// once). Their rpath is that prefix's `lib`, where the guest gets
/// `libleap.so.0` too (with the other libraries `ldd` names).
fn build_bindings(object: Option<&Path>) -> Result<Vec<(String, PathBuf)>> {
    let base = util::root().join("target/vm/capi");
    let prefix = base.join("prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let inst = crate::capi::install(&prefix, object)?;
    let out = base.join("bin");
    Ok(vec![
        ("ring".into(), crate::capi::build_ring(&inst, &out)?),
        ("engine".into(), crate::cpp::build_engine(&inst, &out)?),
    ])
}

/// The binary without debug info (smaller initramfs, faster boot), or as is
/// when `strip` is missing.
fn stripped(path: &Path) -> Result<Vec<u8>> {
    if let Ok(mut strip) = tools::command(Tool::Strip) {
        let out = util::root().join("target/vm/stripped");
        let done = util::capture(strip.arg("--strip-debug").arg("-o").arg(&out).arg(path), util::DEFAULT_LIMIT)?;
        if done.status.success() {
            return Ok(std::fs::read(&out)?);
        }
    }
    Ok(std::fs::read(path)?)
}

/// Shared libraries (and the ELF interpreter) a dynamic binary needs.
fn shared_libraries(path: &Path) -> Result<Vec<PathBuf>> {
    let out = util::capture(tools::command(Tool::Ldd)?.arg(path), util::DEFAULT_LIMIT)?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"
            let l = l.trim();
            let p = l.split_once("=>").map_or(l, |(_, r)| r.trim());
            p.split_whitespace().next().filter(|p| p.starts_with('/')).map(PathBuf::from)
        })
        .collect())
}

/// CMD as one shell line, every word single-quoted.
fn shell_join(words: &[String]) -> String {
    words.iter().map(|w| format!("'{}'", w.replace('\'', r"'\''"))).collect::<Vec<_>>().join(" ")
}

/// Boots the guest and streams its console; returns the code init printed
/// after [`EXIT_MARKER`], the suite's summary line and every line.
fn boot(vmlinuz: &Path, initrd: &Path, timeout: Duration) -> Result<Console> {
    let accel = std::env::var("LEAP_VM_ACCEL").unwrap_or_else(|_| "tcg".into());
    let mut cmd = tools::command(Tool::Qemu)?;
    cmd.args(["-accel", &accel, "-cpu", if accel == "kvm" { "host" } else { "max" }])
        .args(["-m", "1024", "-smp", "2", "-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 quiet loglevel=4 panic=-1 oops=panic"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!("+ {}", util::show(&cmd));
    let start = Instant::now();
    let mut qemu = util::Watched::spawn(&mut cmd)?;
    let stdout = qemu.child.stdout.take().context("qemu stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut code = None;
    let mut summary = None;
    let mut lines = Vec::new();
    let deadline = start + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let line = line.trim_end_matches('\r');
                println!("{line}");
                let _ = std::io::stdout().flush();
                if let Some(c) = line.trim().strip_prefix(EXIT_MARKER) {
                    code = c.trim().parse::<i32>().ok().or(Some(-1));
                }
                if line.ends_with(" failed") && line.contains(" passed, ") {
                    summary = Some(line.to_owned());
                }
                lines.push(line.to_owned());
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                qemu.kill_group();
                bail!("the guest did not finish within {} s: killed qemu", timeout.as_secs());
            }
        }
    }
    // The console closed: qemu is exiting.
    let status = qemu.wait(timeout + Duration::from_secs(60))?;
    eprintln!("guest finished in {:.1}s ({status})", start.elapsed().as_secs_f64());
    if let Some(s) = &summary {
        eprintln!("vm: {s}");
    }
    let code = code.with_context(|| format!("the guest printed no {EXIT_MARKER} line (qemu {status})"))?;
    Ok(Console { code, summary, lines })
}

/// A cpio archive in the "newc" format the kernel unpacks as initramfs
/// (uncompressed: the guest unpacks it faster than it would gunzip it).
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    dirs: BTreeSet<String>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        if name.is_empty() || name.starts_with('/') || name.split('/').any(|c| c == "..") {
            bail!("bad initramfs path {name:?}");
        }
        self.ino += 1;
        let size = u32::try_from(data.len()).context("file too big for cpio")?;
        let fields = [self.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, name.len() as u32 + 1, 0];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, path: &str) -> Result<()> {
        let mut at = String::new();
        for part in path.split('/') {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            if self.dirs.insert(at.clone()) {
                let name = at.clone();
                self.entry(&name, 0o040_755, &[])?;
            }
        }
        Ok(())
    }

    fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> Result<()> {
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent)?;
        }
        self.entry(path, 0o100_000 | perm, data)
    }

    fn finish(mut self) -> Vec<u8> {
        let _ = self.entry("TRAILER!!!", 0, &[]);
        self.buf
    }
}
