// SPDX-License-Identifier: GPL-2.0
/*
 * leap_kmod - /dev/leap_tensor: LEAP activation frames straight into an
 * mmap-able buffer.
 *
 * Each open file is one ring node: its own 16 MiB buffer (64 RX banks of
 * 128 KiB, then the TX staging area), its own listening port and peer, and a
 * kernel UDP socket in the network namespace of the opener. Only datagrams
 * the stack delivers locally to that socket reach the module: its encap_rcv
 * handler gets them after routing (never transit traffic), after IP
 * reassembly and after the stack checked the UDP checksum (CHECKSUM_COMPLETE
 * and offloads honoured). Chunks (12-byte big-endian header + at most 1400
 * bytes) are checked against the sender first (the configured peer, or the
 * first sender, learnt and locked), then validated and copied into bank
 * seq % 64 at chunk_id * 1400; a complete bank is handed to user space oldest
 * first and stays untouched until released. A frame that stays incomplete
 * for frame_timeout_ms is reported as lost (by a timer, so poll() sees it).
 *
 * Opening the device needs CAP_NET_ADMIN in the initial user namespace (or,
 * with allow_userns=1, over the opener's network namespace); at most
 * max_opens_per_net files are open per network namespace. Module-wide
 * counters are for CAP_NET_ADMIN in the initial user namespace only.
 *
 * The user-space ABI is in leap_uapi.h; ioctls 1 to 6 and the mmap layout
 * are those of the original LEAP module.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/bitmap.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/jiffies.h>
#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/net.h>
#include <linux/nsproxy.h>
#include <linux/poll.h>
#include <linux/sched/signal.h>
#include <linux/skbuff.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/timer.h>
#include <linux/udp.h>
#include <linux/uaccess.h>
#include <linux/user_namespace.h>
#include <linux/version.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <net/ip.h>
#include <net/net_namespace.h>
#include <net/route.h>
#include <net/sock.h>
#include <net/udp.h>
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0)
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

#include "leap_uapi.h"

#define LEAP_KMOD_VERSION	"0.1.0"
/* encap_type of our kernel sockets: any value no other encap user claims. */
#define LEAP_UDP_ENCAP		0x4c
#define LEAP_LOST_QUEUE		64
/* Chunks per GSO send: 44 * 1412 bytes stay below the 64 KiB IP limit. */
#define LEAP_GSO_CHUNKS		44
#define LEAP_CHUNK_WIRE_MAX	(LEAP_CHUNK_HDR_LEN + LEAP_CHUNK_PAYLOAD_MAX)

/*
 * Off by default: spinning pays only where every node has a core of its own.
 * With more nodes than cores the spinner holds the CPU its sender needs:
 * measured in the 2-CPU guest, 16 KiB frames, 3-node ring, p50 4100 us with
 * 5000 spins against 2500 us without.
 */
static unsigned int busy_wait_limit;
module_param(busy_wait_limit, uint, 0644);
MODULE_PARM_DESC(busy_wait_limit, "Spins on an empty queue before sleeping, while the CPU is not wanted (default 0)");

static unsigned int frame_timeout_ms = 200;
module_param(frame_timeout_ms, uint, 0644);
MODULE_PARM_DESC(frame_timeout_ms, "Default time after which an incomplete frame is reported lost (ms)");

/*
 * One sendmsg carries up to 44 chunks; the stack (or the NIC) cuts it into
 * datagrams of one chunk each where it has to, and a receiving module takes
 * it whole and walks the chunks in place (leap_encap_rcv). Measured in the
 * guest (16 KiB frames, 3-node veth ring, no spinning): p50 2500 -> 1550 us.
 */
static bool tx_gso = true;
module_param(tx_gso, bool, 0644);
MODULE_PARM_DESC(tx_gso, "Send up to 44 chunks per UDP GSO datagram where the route allows (default on)");

/* The original's parameter: the layout is ABI now, so only its value is taken. */
static unsigned long leap_buffer_size = LEAP_HALF_SIZE;
module_param(leap_buffer_size, ulong, 0444);
MODULE_PARM_DESC(leap_buffer_size, "Bytes per half of the buffer; must be 8388608 (the ABI)");

static unsigned int max_opens = 16;
module_param(max_opens, uint, 0444);
MODULE_PARM_DESC(max_opens, "Most files open at once (each owns a 16 MiB buffer)");

/* Below max_opens: one namespace alone cannot take every slot. */
static unsigned int max_opens_per_net = 8;
module_param(max_opens_per_net, uint, 0444);
MODULE_PARM_DESC(max_opens_per_net, "Most files open at once per network namespace (default 8)");

/*
 * Off by default: opening needs CAP_NET_ADMIN in the initial user namespace.
 * Anyone may create a user namespace and own a network namespace in it, so
 * CAP_NET_ADMIN there proves nothing about the host. On: CAP_NET_ADMIN over
 * the opener's network namespace (in the user namespace that owns it) is
 * enough, which lets containers run nodes, and lets anyone who may open the
 * file and create a user namespace do so too (up to max_opens_per_net per
 * namespace).
 */
static bool allow_userns;
module_param(allow_userns, bool, 0644);
MODULE_PARM_DESC(allow_userns, "Let CAP_NET_ADMIN in a non-initial user namespace owning the opener's netns open the device (default off: CAP_NET_ADMIN in the initial user namespace only)");

enum leap_bank_state {
	LEAP_BANK_FREE,
	LEAP_BANK_FILLING,	/* some chunks received */
	LEAP_BANK_READY,	/* complete, not yet handed out */
	LEAP_BANK_HELD,		/* handed to user space, not yet released */
};

struct leap_bank {
	enum leap_bank_state state;
	u16 seq;
	u16 total;
	u16 flags;
	u32 chunks;
	u32 bytes;
	__be32 saddr;
	__be16 sport;
	unsigned long deadline;	/* jiffies: reported lost after this */
	u64 stamp;		/* arrival order of the first chunk */
	DECLARE_BITMAP(map, LEAP_BANK_CHUNKS_MAX);
};

struct leap_lost {
	u16 seq;
	u16 total;
	u16 flags;
	u32 chunks;
	u32 bytes;
	__be32 saddr;
	__be16 sport;
	u64 stamp;
};

/* One open file of /dev/leap_tensor: one ring node. */
struct leap_file {
	struct list_head node;		/* in leap_files */
	struct net *net;		/* netns of the opener, referenced */
	void *buf;			/* LEAP_MMAP_SIZE, vmalloc, memcg-charged */

	struct mutex cfg_lock;		/* socket and TX; written under it: */
	struct socket *sock;		/* bound to the port, sends chunks */
	__be16 port;			/* WRITE_ONCE: GET_INFO reads it locklessly */
	__be32 dest_addr;		/* WRITE_ONCE, as port */
	__be16 dest_port;		/* WRITE_ONCE; 0: same as the listening port */
	u16 tx_seq;
	bool gso;			/* socket's gso_size set, not yet refused */
	u8 tx_hdr[LEAP_GSO_CHUNKS][LEAP_CHUNK_HDR_LEN];
	struct kvec tx_vec[2 * LEAP_GSO_CHUNKS];

	spinlock_t rx_lock;		/* everything below */
	wait_queue_head_t wq;
	unsigned int events;		/* READY banks + queued lost reports */
	__be32 peer_addr;		/* configured peer (SET_PEER), 0 any */
	__be16 peer_port;
	bool locked;			/* no peer configured: first sender learnt */
	__be32 locked_addr;
	__be16 locked_port;
	bool dying;			/* release: the timer must not re-arm */
	struct timer_list timer;	/* reports incomplete frames as lost */
	unsigned long timeout;		/* jiffies */
	u32 timeout_ms;
	u64 next_stamp;
	int implicit_bank;		/* held by WAIT_DATA, released by the next */
	struct leap_bank banks[LEAP_RX_BANKS];
	struct leap_lost lost[LEAP_LOST_QUEUE];
	unsigned int lost_head;
	unsigned int lost_count;
	struct leap_counters c;
};

static DEFINE_MUTEX(leap_files_lock);
static LIST_HEAD(leap_files);
static unsigned int leap_nr_open;
static struct leap_counters leap_closed;	/* counters of closed files */

static void leap_counters_add(struct leap_counters *sum, const struct leap_counters *c)
{
	u64 *s = (u64 *)sum;
	const u64 *a = (const u64 *)c;
	size_t i;

	BUILD_BUG_ON(sizeof(*c) % sizeof(u64));
	for (i = 0; i < sizeof(*c) / sizeof(u64); i++)
		s[i] += a[i];
}

/* Called with rx_lock held. */
static void leap_report_lost(struct leap_file *f, struct leap_bank *b)
{
	struct leap_lost *l;

	f->c.rx_frames_timed_out++;
	b->state = LEAP_BANK_FREE;
	if (f->lost_count == LEAP_LOST_QUEUE) {
		f->c.rx_lost_overflow++;
		return;
	}
	l = &f->lost[(f->lost_head + f->lost_count) % LEAP_LOST_QUEUE];
	l->seq = b->seq;
	l->total = b->total;
	l->flags = b->flags;
	l->chunks = b->chunks;
	l->bytes = b->bytes;
	l->saddr = b->saddr;
	l->sport = b->sport;
	l->stamp = b->stamp;
	f->lost_count++;
	f->events++;
	wake_up_interruptible(&f->wq);
}

/*
 * Reports every frame whose deadline passed. Returns the earliest deadline
 * still pending, or 0 when no frame is being filled. Called with rx_lock.
 */
static unsigned long leap_expire(struct leap_file *f)
{
	unsigned long now = jiffies, next = 0;
	unsigned int i;

	for (i = 0; i < LEAP_RX_BANKS; i++) {
		struct leap_bank *b = &f->banks[i];

		if (b->state != LEAP_BANK_FILLING)
			continue;
		if (time_after_eq(now, b->deadline))
			leap_report_lost(f, b);
		else if (!next || time_before(b->deadline, next))
			next = b->deadline;
	}
	return next;
}

/* Starts frame `seq` in bank b. Called with rx_lock. */
static void leap_bank_start(struct leap_file *f, struct leap_bank *b, u16 seq, u16 total, u16 flags,
			    __be32 saddr, __be16 sport)
{
	b->state = LEAP_BANK_FILLING;
	b->seq = seq;
	b->total = total;
	b->flags = flags;
	b->chunks = 0;
	b->bytes = 0;
	b->saddr = saddr;
	b->sport = sport;
	b->deadline = jiffies + f->timeout;
	b->stamp = f->next_stamp++;
	bitmap_zero(b->map, LEAP_BANK_CHUNKS_MAX);
	if (!f->dying)
		timer_reduce(&f->timer, b->deadline);
}

/* Reports frames whose deadline passed even when nobody waits (poll()). */
static void leap_timer_fn(struct timer_list *t)
{
	struct leap_file *f = container_of(t, struct leap_file, timer);
	unsigned long next;

	spin_lock(&f->rx_lock);
	next = leap_expire(f);
	if (next && !f->dying)
		timer_reduce(&f->timer, next);
	spin_unlock(&f->rx_lock);
}

/*
 * Whether a chunk from saddr:sport may touch a bank: it must come from the
 * configured peer or, with none configured, from the first sender seen on
 * this binding, which is learnt here and locked. Called with rx_lock.
 */
static bool leap_source_ok(struct leap_file *f, __be32 saddr, __be16 sport)
{
	if (f->peer_addr || f->peer_port) {
		if ((f->peer_addr && saddr != f->peer_addr) || (f->peer_port && sport != f->peer_port)) {
			f->c.drop_peer++;
			return false;
		}
		return true;
	}
	if (!f->locked) {
		f->locked = true;
		f->locked_addr = saddr;
		f->locked_port = sport;
		return true;
	}
	if (saddr != f->locked_addr || sport != f->locked_port) {
		f->c.drop_stranger++;
		return false;
	}
	return true;
}

/*
 * Validates one chunk whose 12-byte header starts at `off` in skb and whose
 * datagram payload (header included) is `len` bytes, and copies it into its
 * bank. Returns true when the chunk was taken (or was a harmless duplicate),
 * false when it was dropped; every outcome is counted.
 */
static bool leap_rx_chunk(struct leap_file *f, const struct sk_buff *skb, unsigned int off, unsigned int len,
			  const u8 *hdr, __be32 saddr, __be16 sport)
{
	u16 seq = get_unaligned_be16(hdr + 4);
	u16 id = get_unaligned_be16(hdr + 6);
	u16 total = get_unaligned_be16(hdr + 8);
	u16 flags = get_unaligned_be16(hdr + 10);
	unsigned int plen = len - LEAP_CHUNK_HDR_LEN;
	struct leap_bank *b;
	bool started = false;
	bool ok = false;
	void *dst;

	spin_lock(&f->rx_lock);
	if (total == 0 || id >= total) {
		f->c.drop_bad_chunk_id++;
		goto out;
	}
	if (plen > LEAP_CHUNK_PAYLOAD_MAX) {
		f->c.drop_oversize++;
		goto out;
	}
	if (id + 1 < total ? plen != LEAP_CHUNK_PAYLOAD_MAX : plen == 0) {
		f->c.drop_bad_length++;
		goto out;
	}
	/* The last chunk of a 131072-byte frame (the 94th) ends the bank. */
	if (total > LEAP_BANK_CHUNKS_MAX ||
	    (size_t)id * LEAP_CHUNK_PAYLOAD_MAX + plen > LEAP_BANK_SIZE) {
		f->c.drop_too_big++;
		goto out;
	}
	/* Before any bank is looked at: a stranger never evicts or fills one. */
	if (!leap_source_ok(f, saddr, sport))
		goto out;

	b = &f->banks[seq % LEAP_RX_BANKS];
	switch (b->state) {
	case LEAP_BANK_FREE:
		leap_bank_start(f, b, seq, total, flags, saddr, sport);
		started = true;
		break;
	case LEAP_BANK_FILLING:
		if (b->seq != seq) {
			if ((s16)(seq - b->seq) < 0) {
				f->c.drop_stale++;
				goto out;
			}
			/* The sender is 64 frames ahead: the old one is lost. */
			leap_report_lost(f, b);
			leap_bank_start(f, b, seq, total, flags, saddr, sport);
			started = true;
			break;
		}
		if (saddr != b->saddr || sport != b->sport) {
			f->c.drop_source_mismatch++;
			goto out;
		}
		if (total != b->total) {
			f->c.drop_total_mismatch++;
			goto out;
		}
		if (test_bit(id, b->map)) {
			f->c.rx_duplicates++;
			ok = true;
			goto out;
		}
		break;
	case LEAP_BANK_READY:
	case LEAP_BANK_HELD:
		if (b->seq == seq && saddr == b->saddr && sport == b->sport) {
			f->c.rx_duplicates++;
			ok = true;
		} else if ((s16)(seq - b->seq) < 0) {
			f->c.drop_stale++;
		} else {
			f->c.drop_bank_busy++;
		}
		goto out;
	}

	/* id * 1400 + plen <= LEAP_BANK_SIZE was checked: inside the bank. */
	dst = f->buf + (size_t)(seq % LEAP_RX_BANKS) * LEAP_BANK_SIZE + (size_t)id * LEAP_CHUNK_PAYLOAD_MAX;
	if (skb_copy_bits(skb, off + LEAP_CHUNK_HDR_LEN, dst, plen)) {
		f->c.drop_short++;
		if (started)
			b->state = LEAP_BANK_FREE;
		goto out;
	}
	__set_bit(id, b->map);
	b->chunks++;
	b->bytes += plen;
	f->c.rx_chunks++;
	ok = true;
	if (b->chunks == b->total) {
		b->state = LEAP_BANK_READY;
		f->c.rx_frames_completed++;
		f->events++;
		wake_up_interruptible(&f->wq);
	}
out:
	spin_unlock(&f->rx_lock);
	return ok;
}

/*
 * One UDP payload of `len` bytes at `off` in skb: the magic and the kind are
 * checked first (nothing else is read before), then the chunk. Returns
 * whether it was taken; every outcome is counted.
 */
static bool leap_rx_datagram(struct leap_file *f, const struct sk_buff *skb, unsigned int off,
			     unsigned int len, __be32 saddr, __be16 sport)
{
	u8 buf[LEAP_CHUNK_HDR_LEN];
	const u8 *hdr = NULL;
	u16 flags;

	if (len >= LEAP_CHUNK_HDR_LEN)
		hdr = skb_header_pointer(skb, off, sizeof(buf), buf);
	if (!hdr) {
		spin_lock(&f->rx_lock);
		f->c.drop_short++;
		spin_unlock(&f->rx_lock);
		return false;
	}
	flags = get_unaligned_be16(hdr + 10);
	if (get_unaligned_be32(hdr) != LEAP_CHUNK_MAGIC ||
	    ((flags & LEAP_CHUNK_F_LEAP) && (flags & LEAP_CHUNK_KIND_MASK) > LEAP_CHUNK_KIND_CONTROL)) {
		spin_lock(&f->rx_lock);
		if (get_unaligned_be32(hdr) != LEAP_CHUNK_MAGIC)
			f->c.rx_not_leap++;
		else
			f->c.rx_passthrough++;
		spin_unlock(&f->rx_lock);
		return false;
	}
	return leap_rx_chunk(f, skb, off, len, hdr, saddr, sport);
}

/*
 * One UDP payload of `len` bytes at `off`, which may be a chunk train (see
 * leap-common's chunk::train): full chunks (header + 1400 bytes) back to
 * back, the last taking the rest, at most LEAP_TRAIN_CHUNKS_MAX. A longer
 * payload is a train only when every piece after the first starts with the
 * magic and the last holds a header; anything else is one oversize chunk,
 * as the original would see it, and nothing of it is taken. Each chunk of a
 * train is then checked and counted on its own. Returns whether any was
 * taken.
 */
static bool leap_rx_train(struct leap_file *f, const struct sk_buff *skb, unsigned int off, unsigned int len,
			  __be32 saddr, __be16 sport)
{
	unsigned int pos, piece, tail = len % LEAP_CHUNK_WIRE_MAX;
	bool taken = false;
	const u8 *magic;
	u8 buf[4];

	if (len <= LEAP_CHUNK_WIRE_MAX)
		return leap_rx_datagram(f, skb, off, len, saddr, sport);
	if (len > LEAP_TRAIN_CHUNKS_MAX * LEAP_CHUNK_WIRE_MAX || (tail && tail < LEAP_CHUNK_HDR_LEN))
		goto oversize;
	for (pos = LEAP_CHUNK_WIRE_MAX; pos < len; pos += LEAP_CHUNK_WIRE_MAX) {
		magic = skb_header_pointer(skb, off + pos, sizeof(buf), buf);
		if (!magic || get_unaligned_be32(magic) != LEAP_CHUNK_MAGIC)
			goto oversize;
	}
	for (pos = 0; pos < len; pos += piece) {
		piece = min(len - pos, LEAP_CHUNK_WIRE_MAX);
		if (leap_rx_datagram(f, skb, off + pos, piece, saddr, sport))
			taken = true;
	}
	return taken;
oversize:
	spin_lock(&f->rx_lock);
	f->c.drop_oversize++;
	spin_unlock(&f->rx_lock);
	return false;
}

/*
 * Whether skb was addressed to this host alone: not a broadcast or multicast
 * copy (the UDP stack hands those to every socket bound to the port).
 */
static bool leap_is_unicast(const struct sk_buff *skb)
{
	const struct rtable *rt = skb_rtable(skb);
	__be32 daddr = ip_hdr(skb)->daddr;

	if (skb->pkt_type != PACKET_HOST || ipv4_is_multicast(daddr) || ipv4_is_lbcast(daddr))
		return false;
	return !rt || !(rt->rt_flags & (RTCF_BROADCAST | RTCF_MULTICAST));
}

/*
 * The only receive path: datagrams the stack delivers to this file's socket,
 * i.e. addressed to this host (after routing, so never transit traffic),
 * reassembled, and with the UDP checksum already verified by the stack
 * (udp_lib_checksum_complete, which honours CHECKSUM_COMPLETE and offloads)
 * before encap_rcv is called. Broadcast and multicast copies are refused. A
 * UDP GSO datagram (accepted whole, see leap_accept_gso) holds one datagram
 * (a chunk or a train) per gso_size bytes, as the sender cut it, and is
 * walked in place.
 */
static int leap_encap_rcv(struct sock *sk, struct sk_buff *skb)
{
	struct leap_file *f = rcu_dereference_sk_user_data(sk);
	unsigned int off = skb_transport_offset(skb) + sizeof(struct udphdr);
	unsigned int step, len, seg;
	__be32 saddr;
	__be16 sport;
	bool taken = false;

	if (!f || skb->len < off)
		goto drop;
	if (!leap_is_unicast(skb)) {
		spin_lock(&f->rx_lock);
		f->c.drop_not_unicast++;
		spin_unlock(&f->rx_lock);
		goto drop;
	}
	len = skb->len - off;
	step = len;
	if (skb_is_gso(skb) && (skb_shinfo(skb)->gso_type & SKB_GSO_UDP_L4) && skb_shinfo(skb)->gso_size)
		step = skb_shinfo(skb)->gso_size;
	saddr = ip_hdr(skb)->saddr;
	sport = udp_hdr(skb)->source;
	/* At least once: an empty datagram is counted as short. */
	do {
		seg = min(step, len);
		if (leap_rx_train(f, skb, off, seg, saddr, sport))
			taken = true;
		off += seg;
		len -= seg;
	} while (len);
	if (taken) {
		consume_skb(skb);
		return 0;
	}
drop:
	kfree_skb(skb);
	return 0;
}

/* Lets `sock` take UDP GSO datagrams whole (UDP_GRO), as a user socket can. */
static void leap_accept_gso(struct socket *sock)
{
	int one = 1;
	int err = sock->ops->setsockopt(sock, SOL_UDP, UDP_GRO, KERNEL_SOCKPTR(&one), sizeof(one));

	if (err)
		pr_info("UDP_GRO refused (%d): GSO datagrams are segmented before the module sees them\n", err);
}

/* Releases a socket of this file; waits until no packet uses it. */
static void leap_release_sock(struct socket *sock)
{
	sock_release(sock);
	udp_encap_disable();
	/* encap_rcv runs under RCU: wait it out before f can go. */
	synchronize_net();
}

/* Tears down the socket. Called with cfg_lock held, or at release. */
static void leap_unbind(struct leap_file *f)
{
	struct socket *sock = f->sock;

	WRITE_ONCE(f->port, 0);
	if (!sock)
		return;
	f->sock = NULL;
	leap_release_sock(sock);
}

/*
 * kernel_bind() takes a `struct sockaddr *` up to 6.18 and a
 * `struct sockaddr_unsized *` after. A `void *` converts to either without a
 * cast, so this one call builds on 6.1, 6.12 and later kernels alike.
 */
static int leap_kernel_bind(struct socket *sock, struct sockaddr_in *sin)
{
	void *addr = sin;

	return kernel_bind(sock, addr, sizeof(*sin));
}

/*
 * Binds a new socket to `port` and only then replaces the file's socket:
 * when binding fails, the old binding stays as it was. Resets the learnt
 * sender once no chunk to the old port can reach the file any more, and
 * before the new socket hands it any: nothing sent to the old port can take
 * the new binding's lock. Called with cfg_lock held.
 */
static int leap_bind(struct leap_file *f, u16 port)
{
	struct sockaddr_in sin = {
		.sin_family = AF_INET,
		.sin_port = htons(port),
		.sin_addr.s_addr = htonl(INADDR_ANY),
	};
	struct socket *sock, *old;
	int err;

	err = sock_create_kern(f->net, AF_INET, SOCK_DGRAM, IPPROTO_UDP, &sock);
	if (err)
		return err;
	/*
	 * UDP checksums stay on (sk_no_check_tx = 0), unlike the original.
	 * No sk_user_data yet: leap_encap_rcv drops what arrives before the
	 * file is attached below.
	 */
	udp_sk(sock->sk)->encap_type = LEAP_UDP_ENCAP;
	WRITE_ONCE(udp_sk(sock->sk)->encap_rcv, leap_encap_rcv);
	udp_encap_enable();

	err = leap_kernel_bind(sock, &sin);
	if (err)
		goto err_release_sock;
	leap_accept_gso(sock);
	/*
	 * Datagrams sized by the interface MTU; ICMP "fragmentation needed"
	 * ignored: anyone can send one quoting the node's well-known port, and
	 * it would lower the route's path MTU below a chunk for ten minutes,
	 * which every GSO send would then fail on.
	 */
	ip_sock_set_mtu_discover(sock->sk, IP_PMTUDISC_OMIT);
	/* Every send may carry up to LEAP_GSO_CHUNKS chunks of 1412 bytes. */
	f->gso = READ_ONCE(tx_gso);
	WRITE_ONCE(udp_sk(sock->sk)->gso_size, f->gso ? LEAP_CHUNK_WIRE_MAX : 0);

	old = f->sock;
	if (old) {
		/* encap_rcv runs under RCU: once this returns, none sees f. */
		rcu_assign_sk_user_data(old->sk, NULL);
		synchronize_net();
	}
	spin_lock_bh(&f->rx_lock);
	f->locked = false;
	spin_unlock_bh(&f->rx_lock);
	rcu_assign_sk_user_data(sock->sk, f);
	f->sock = sock;
	WRITE_ONCE(f->port, htons(port));
	if (old)
		leap_release_sock(old);
	return 0;

err_release_sock:
	leap_release_sock(sock);
	return err;
}

/*
 * Sends chunks [first, first + n) of the frame at `tx` in one sendmsg: one
 * datagram, or a GSO datagram the stack cuts into n chunks of 1412 bytes.
 */
static int leap_send_chunks(struct leap_file *f, struct sockaddr_in *to, const u8 *tx, u32 len, u16 seq,
			    u32 total, u16 flags, u32 first, u32 n)
{
	struct msghdr msg = {
		.msg_name = to,
		.msg_namelen = sizeof(*to),
	};
	size_t bytes = 0;
	u32 i;

	for (i = 0; i < n; i++) {
		u32 id = first + i;
		u32 off = id * LEAP_CHUNK_PAYLOAD_MAX;
		u32 plen = min_t(u32, LEAP_CHUNK_PAYLOAD_MAX, len - off);
		u8 *hdr = f->tx_hdr[i];

		put_unaligned_be32(LEAP_CHUNK_MAGIC, hdr);
		put_unaligned_be16(seq, hdr + 4);
		put_unaligned_be16(id, hdr + 6);
		put_unaligned_be16(total, hdr + 8);
		put_unaligned_be16(flags, hdr + 10);
		f->tx_vec[2 * i] = (struct kvec){ .iov_base = hdr, .iov_len = LEAP_CHUNK_HDR_LEN };
		f->tx_vec[2 * i + 1] = (struct kvec){ .iov_base = (void *)(tx + off), .iov_len = plen };
		bytes += LEAP_CHUNK_HDR_LEN + plen;
	}
	return kernel_sendmsg(f->sock, &msg, f->tx_vec, 2 * n, bytes);
}

/* Stops using GSO on this file's socket (the route cannot do it). */
static void leap_gso_off(struct leap_file *f, int err)
{
	f->gso = false;
	WRITE_ONCE(udp_sk(f->sock->sk)->gso_size, 0);
	pr_info_ratelimited("UDP GSO refused (%d) on port %u: one datagram per chunk from now on\n", err,
			    ntohs(f->port));
}

/*
 * Sends `len` bytes at `tx` (the TX area, or a copy of a write() buffer) as
 * the next frame. Called with cfg_lock held.
 */
static int leap_send_frame(struct leap_file *f, const u8 *tx, u32 len, u16 flags, u16 *seq_out)
{
	struct sockaddr_in to = { .sin_family = AF_INET };
	u32 total, id, n, sent = 0;
	u16 seq;
	int err = 0;

	if (!len || len > LEAP_HALF_SIZE)
		return -EINVAL;
	if (!f->sock)
		return -ENOTCONN;
	if (!f->dest_addr)
		return -EDESTADDRREQ;
	to.sin_addr.s_addr = f->dest_addr;
	to.sin_port = f->dest_port ? f->dest_port : f->port;
	total = DIV_ROUND_UP(len, LEAP_CHUNK_PAYLOAD_MAX);
	seq = ++f->tx_seq;

	for (id = 0; id < total; id += n) {
		int ret;

		n = f->gso ? min_t(u32, LEAP_GSO_CHUNKS, total - id) : 1;
		ret = leap_send_chunks(f, &to, tx, len, seq, total, flags, id, n);
		/* A segment above the interface MTU: -EINVAL, -EMSGSIZE on 6.x. */
		if (ret < 0 && f->gso && (ret == -EIO || ret == -EINVAL || ret == -EMSGSIZE)) {
			/* Nothing of this group left: send it again, chunk by chunk. */
			leap_gso_off(f, ret);
			n = 0;
			continue;
		}
		if (ret < 0) {
			err = ret;
			break;
		}
		sent += n;
		cond_resched();
	}
	/* Counters are rx_lock's: GET_INFO reads them without cfg_lock. */
	spin_lock_bh(&f->rx_lock);
	f->c.tx_chunks += sent;
	if (err)
		f->c.tx_errors++;
	else
		f->c.tx_frames++;
	spin_unlock_bh(&f->rx_lock);
	if (err)
		return err;
	if (seq_out)
		*seq_out = seq;
	return 0;
}

/*
 * Hands out the oldest event: a complete bank or a lost-frame report. With
 * `implicit` (WAIT_DATA), a bank handed out replaces the file's implicitly
 * held bank, which is freed here, under the same lock: two WAIT_DATA racing
 * on one file cannot leave a bank held that no later call releases.
 */
static bool leap_take_event(struct leap_file *f, struct leap_wait *w, bool implicit)
{
	struct leap_bank *best = NULL;
	struct leap_lost *l = f->lost_count ? &f->lost[f->lost_head] : NULL;
	unsigned int i;

	for (i = 0; i < LEAP_RX_BANKS; i++) {
		struct leap_bank *b = &f->banks[i];

		if (b->state == LEAP_BANK_READY && (!best || b->stamp < best->stamp))
			best = b;
	}
	if (l && (!best || l->stamp < best->stamp)) {
		w->status = LEAP_WAIT_STATUS_LOST;
		w->bank = -1;
		w->len = l->bytes;
		w->saddr = l->saddr;
		w->sport = ntohs(l->sport);
		w->seq = l->seq;
		w->total_chunks = l->total;
		w->flags = l->flags;
		w->chunks = l->chunks;
		f->lost_head = (f->lost_head + 1) % LEAP_LOST_QUEUE;
		f->lost_count--;
		f->events--;
		return true;
	}
	if (!best)
		return false;
	if (implicit) {
		if (f->implicit_bank >= 0 && f->banks[f->implicit_bank].state == LEAP_BANK_HELD)
			f->banks[f->implicit_bank].state = LEAP_BANK_FREE;
		f->implicit_bank = best - f->banks;
	}
	best->state = LEAP_BANK_HELD;
	w->status = LEAP_WAIT_STATUS_FRAME;
	w->bank = best - f->banks;
	w->len = best->bytes;
	w->saddr = best->saddr;
	w->sport = ntohs(best->sport);
	w->seq = best->seq;
	w->total_chunks = best->total;
	w->flags = best->flags;
	w->chunks = best->chunks;
	f->c.rx_frames_delivered++;
	f->events--;
	return true;
}

/*
 * Spins busy_wait_limit times, then sleeps until an event arrives or
 * `timeout` jiffies pass (MAX_SCHEDULE_TIMEOUT: forever). Wakes up at least
 * once per frame timeout to report incomplete frames.
 */
static int leap_wait(struct leap_file *f, long timeout, struct leap_wait *w, bool implicit)
{
	unsigned long end = jiffies + (timeout == MAX_SCHEDULE_TIMEOUT ? 0 : timeout);
	unsigned int spins = READ_ONCE(busy_wait_limit);
	unsigned int i;

	/* Spin only while no other task wants this CPU: it may be our sender. */
	for (i = 0; i < spins && !READ_ONCE(f->events) && !need_resched(); i++)
		cpu_relax();

	for (;;) {
		unsigned long next;
		long slice;
		bool got;
		int ret;

		spin_lock_bh(&f->rx_lock);
		next = leap_expire(f);
		got = leap_take_event(f, w, implicit);
		slice = f->timeout;
		spin_unlock_bh(&f->rx_lock);
		if (got)
			return 0;
		if (next)
			slice = max_t(long, (long)(next - jiffies), 1);
		if (timeout != MAX_SCHEDULE_TIMEOUT) {
			long left = (long)(end - jiffies);

			if (left <= 0)
				return -EAGAIN;
			slice = min(slice, left);
		}
		ret = wait_event_interruptible_timeout(f->wq, READ_ONCE(f->events), slice);
		if (ret < 0)
			return ret;
	}
}

/*
 * Whether the opener may run a node in `net`: a node takes a port's traffic,
 * a host network administrator's business. CAP_NET_ADMIN in the initial user
 * namespace, or with allow_userns, over `net` (in the user namespace owning
 * it: which anyone who creates a user namespace has, see allow_userns).
 */
static bool leap_may_open(const struct net *net)
{
	if (capable(CAP_NET_ADMIN))
		return true;
	return READ_ONCE(allow_userns) && ns_capable(net->user_ns, CAP_NET_ADMIN);
}

/* Files open in `net`. Called with leap_files_lock held. */
static unsigned int leap_net_opens(const struct net *net)
{
	const struct leap_file *o;
	unsigned int n = 0;

	list_for_each_entry(o, &leap_files, node)
		if (net_eq(o->net, net))
			n++;
	return n;
}

static int leap_open(struct inode *inode, struct file *file)
{
	struct net *net = current->nsproxy->net_ns;
	struct leap_file *f;
	int err;

	if (!leap_may_open(net))
		return -EPERM;
	/* Charged to the opener's memory cgroup, as its own memory would be. */
	f = kzalloc(sizeof(*f), GFP_KERNEL_ACCOUNT);
	if (!f)
		return -ENOMEM;
	f->buf = __vmalloc(LEAP_MMAP_SIZE, GFP_KERNEL_ACCOUNT | __GFP_ZERO);
	if (!f->buf) {
		err = -ENOMEM;
		goto err_free_file;
	}
	mutex_init(&f->cfg_lock);
	spin_lock_init(&f->rx_lock);
	init_waitqueue_head(&f->wq);
	timer_setup(&f->timer, leap_timer_fn, 0);
	f->timeout_ms = READ_ONCE(frame_timeout_ms) ?: 1;
	f->timeout = msecs_to_jiffies(f->timeout_ms) ?: 1;
	f->implicit_bank = -1;
	f->tx_seq = 0;

	mutex_lock(&leap_files_lock);
	/* One namespace never takes every slot: other namespaces still open. */
	if (leap_nr_open >= max_opens || leap_net_opens(net) >= max_opens_per_net) {
		mutex_unlock(&leap_files_lock);
		err = -EBUSY;
		goto err_free_buffer;
	}
	leap_nr_open++;
	f->net = get_net(net);
	list_add(&f->node, &leap_files);
	mutex_unlock(&leap_files_lock);

	file->private_data = f;
	return stream_open(inode, file);

err_free_buffer:
	vfree(f->buf);
err_free_file:
	kfree(f);
	return err;
}

static int leap_release(struct inode *inode, struct file *file)
{
	struct leap_file *f = file->private_data;

	leap_unbind(f);
	spin_lock_bh(&f->rx_lock);
	f->dying = true;
	spin_unlock_bh(&f->rx_lock);
	timer_delete_sync(&f->timer);
	mutex_lock(&leap_files_lock);
	list_del(&f->node);
	leap_nr_open--;
	leap_counters_add(&leap_closed, &f->c);
	mutex_unlock(&leap_files_lock);
	put_net(f->net);
	vfree(f->buf);
	kfree(f);
	return 0;
}

/* write(): the original's other way to send a frame, from a user buffer. */
static ssize_t leap_write(struct file *file, const char __user *ubuf, size_t len, loff_t *ppos)
{
	struct leap_file *f = file->private_data;
	void *copy;
	int err;

	if (!len)
		return 0;
	if (len > LEAP_HALF_SIZE)
		return -EMSGSIZE;
	copy = kvmalloc(len, GFP_KERNEL_ACCOUNT);
	if (!copy)
		return -ENOMEM;
	if (copy_from_user(copy, ubuf, len)) {
		err = -EFAULT;
		goto out_free_copy;
	}
	mutex_lock(&f->cfg_lock);
	/* As the original: `reserved` is 0 on the wire. */
	err = leap_send_frame(f, copy, len, 0, NULL);
	mutex_unlock(&f->cfg_lock);
out_free_copy:
	kvfree(copy);
	return err ? err : len;
}

/*
 * Shared mappings only (a private one would give copies that neither the
 * module nor the other side ever sees), never executable, now or later.
 * The buffer comes from __vmalloc (memcg-charged), so its pages are
 * inserted one by one, as remap_vmalloc_range() would.
 */
static int leap_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct leap_file *f = file->private_data;
	unsigned long len = vma->vm_end - vma->vm_start;
	unsigned long off, addr;
	int err;

	if (vma->vm_pgoff >= LEAP_MMAP_SIZE >> PAGE_SHIFT ||
	    len > LEAP_MMAP_SIZE - (vma->vm_pgoff << PAGE_SHIFT))
		return -EINVAL;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (vma->vm_flags & VM_EXEC)
		return -EPERM;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_mod(vma, VM_DONTEXPAND | VM_DONTDUMP, VM_MAYEXEC);
#else
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	vma->vm_flags &= ~VM_MAYEXEC;
#endif
	off = vma->vm_pgoff << PAGE_SHIFT;
	for (addr = vma->vm_start; addr < vma->vm_end; addr += PAGE_SIZE, off += PAGE_SIZE) {
		err = vm_insert_page(vma, addr, vmalloc_to_page(f->buf + off));
		if (err)
			return err;
	}
	return 0;
}

static __poll_t leap_poll(struct file *file, poll_table *wait)
{
	struct leap_file *f = file->private_data;

	poll_wait(file, &f->wq, wait);
	return READ_ONCE(f->events) ? EPOLLIN | EPOLLRDNORM : 0;
}

/*
 * Whether module-wide counters (every node's, in every namespace) may be
 * read through `file`: its opener and the caller both hold CAP_NET_ADMIN in
 * the initial user namespace, so neither a file handed to someone else nor
 * a caller that dropped the capability sees them.
 */
static bool leap_may_see_module(const struct file *file)
{
	return file_ns_capable(file, &init_user_ns, CAP_NET_ADMIN) && capable(CAP_NET_ADMIN);
}

static void leap_fill_info(struct leap_file *f, struct leap_info *info)
{
	struct leap_file *o;
	__be16 port, dest_port;

	info->abi_version = LEAP_ABI_VERSION;
	info->info_size = sizeof(*info);
	info->features = LEAP_FEAT_LOCAL_ONLY | LEAP_FEAT_SENDER_LOCK | LEAP_FEAT_PER_OPEN | LEAP_FEAT_RELEASE_BANK | LEAP_FEAT_PEER_FILTER |
			 LEAP_FEAT_WAIT_FRAME | LEAP_FEAT_LOST_REPORT | LEAP_FEAT_RX_CSUM | LEAP_FEAT_TX_CSUM |
			 LEAP_FEAT_FRAGMENTS | LEAP_FEAT_SEND_FRAME | LEAP_FEAT_POLL | LEAP_FEAT_FRAME_TIMEOUT | LEAP_FEAT_TRAINS;
	info->rx_banks = LEAP_RX_BANKS;
	info->bank_size = LEAP_BANK_SIZE;
	info->tx_size = LEAP_HALF_SIZE;
	info->chunk_payload_max = LEAP_CHUNK_PAYLOAD_MAX;
	info->busy_wait_limit = READ_ONCE(busy_wait_limit);

	/* No cfg_lock: a send in progress on any file never blocks GET_INFO. */
	port = READ_ONCE(f->port);
	dest_port = READ_ONCE(f->dest_port);
	info->port = ntohs(port);
	info->tx_port = ntohs(dest_port ? dest_port : port);
	info->dest_addr = READ_ONCE(f->dest_addr);

	memset(&info->counters, 0, sizeof(info->counters));
	mutex_lock(&leap_files_lock);
	/* Module scope: every file; file scope: this file's netns only. */
	info->open_files = info->scope == LEAP_INFO_SCOPE_MODULE ? leap_nr_open : leap_net_opens(f->net);
	if (info->scope == LEAP_INFO_SCOPE_MODULE)
		leap_counters_add(&info->counters, &leap_closed);
	list_for_each_entry(o, &leap_files, node) {
		if (info->scope != LEAP_INFO_SCOPE_MODULE && o != f)
			continue;
		spin_lock_bh(&o->rx_lock);
		leap_counters_add(&info->counters, &o->c);
		if (o == f) {
			info->frame_timeout_ms = f->timeout_ms;
			info->peer_addr = f->peer_addr;
			info->peer_port = ntohs(f->peer_port);
		}
		spin_unlock_bh(&o->rx_lock);
	}
	mutex_unlock(&leap_files_lock);
}

static long leap_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct leap_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;
	long ret;

	switch (cmd) {
	case LEAP_IOCTL_WAIT_DATA: {
		struct leap_wait w;

		spin_lock_bh(&f->rx_lock);
		if (f->implicit_bank >= 0 && f->banks[f->implicit_bank].state == LEAP_BANK_HELD)
			f->banks[f->implicit_bank].state = LEAP_BANK_FREE;
		f->implicit_bank = -1;
		spin_unlock_bh(&f->rx_lock);
		ret = leap_wait(f, MAX_SCHEDULE_TIMEOUT, &w, true);
		if (ret)
			return ret;
		if (w.status == LEAP_WAIT_STATUS_LOST)
			return -ETIMEDOUT;
		return w.bank;
	}
	case LEAP_IOCTL_WAIT_FRAME: {
		struct leap_wait w;
		long timeout;

		if (copy_from_user(&w, uarg, sizeof(w)))
			return -EFAULT;
		if (w.timeout_ms == LEAP_WAIT_FOREVER)
			timeout = MAX_SCHEDULE_TIMEOUT;
		else
			timeout = msecs_to_jiffies(w.timeout_ms);
		ret = leap_wait(f, timeout, &w, false);
		if (ret)
			return ret;
		if (copy_to_user(uarg, &w, sizeof(w))) {
			/* Nobody learnt of the bank: do not leave it held. */
			if (w.bank >= 0) {
				spin_lock_bh(&f->rx_lock);
				f->banks[w.bank].state = LEAP_BANK_FREE;
				spin_unlock_bh(&f->rx_lock);
			}
			return -EFAULT;
		}
		return 0;
	}
	case LEAP_IOCTL_RELEASE_BANK: {
		u32 bank;

		if (copy_from_user(&bank, uarg, sizeof(bank)))
			return -EFAULT;
		if (bank >= LEAP_RX_BANKS)
			return -EINVAL;
		ret = -EINVAL;
		spin_lock_bh(&f->rx_lock);
		if (f->banks[bank].state == LEAP_BANK_HELD) {
			f->banks[bank].state = LEAP_BANK_FREE;
			if (f->implicit_bank == bank)
				f->implicit_bank = -1;
			ret = 0;
		}
		spin_unlock_bh(&f->rx_lock);
		return ret;
	}
	case LEAP_IOCTL_SET_DEST: {
		u32 addr;

		if (copy_from_user(&addr, uarg, sizeof(addr)))
			return -EFAULT;
		mutex_lock(&f->cfg_lock);
		WRITE_ONCE(f->dest_addr, (__force __be32)addr);
		mutex_unlock(&f->cfg_lock);
		return 0;
	}
	case LEAP_IOCTL_SET_TX_PORT: {
		u16 port;

		if (copy_from_user(&port, uarg, sizeof(port)))
			return -EFAULT;
		mutex_lock(&f->cfg_lock);
		WRITE_ONCE(f->dest_port, htons(port));
		mutex_unlock(&f->cfg_lock);
		return 0;
	}
	case LEAP_IOCTL_SET_PORT: {
		u16 port;

		if (copy_from_user(&port, uarg, sizeof(port)))
			return -EFAULT;
		if (!port)
			return -EINVAL;
		mutex_lock(&f->cfg_lock);
		if (f->sock && f->port == htons(port))
			ret = 0;
		else
			ret = leap_bind(f, port);	/* keeps the old one on failure */
		mutex_unlock(&f->cfg_lock);
		return ret;
	}
	case LEAP_IOCTL_SEND: {
		u32 len;

		if (copy_from_user(&len, uarg, sizeof(len)))
			return -EFAULT;
		/* As the original: 0 bytes send nothing and succeed. */
		if (!len)
			return 0;
		if (len > INT_MAX)
			return -EINVAL;
		mutex_lock(&f->cfg_lock);
		/* As the original: `reserved` is 0 on the wire. */
		ret = leap_send_frame(f, f->buf + LEAP_TX_OFFSET, len, 0, NULL);
		mutex_unlock(&f->cfg_lock);
		return ret ? ret : len;
	}
	case LEAP_IOCTL_SEND_FRAME: {
		struct leap_send s;

		if (copy_from_user(&s, uarg, sizeof(s)))
			return -EFAULT;
		mutex_lock(&f->cfg_lock);
		ret = leap_send_frame(f, f->buf + LEAP_TX_OFFSET, s.len, s.flags, &s.seq);
		mutex_unlock(&f->cfg_lock);
		if (ret)
			return ret;
		return copy_to_user(uarg, &s, sizeof(s)) ? -EFAULT : 0;
	}
	case LEAP_IOCTL_GET_BANK_SRC: {
		struct leap_bank_metadata m;

		if (copy_from_user(&m, uarg, sizeof(m)))
			return -EFAULT;
		if (m.bank_idx < 0 || m.bank_idx >= LEAP_RX_BANKS)
			return -EINVAL;
		spin_lock_bh(&f->rx_lock);
		m.saddr = (__force u32)f->banks[m.bank_idx].saddr;
		/* Network order, as the original (its user space applies ntohs). */
		m.sport = (__force u16)f->banks[m.bank_idx].sport;
		spin_unlock_bh(&f->rx_lock);
		m._pad = 0;
		return copy_to_user(uarg, &m, sizeof(m)) ? -EFAULT : 0;
	}
	case LEAP_IOCTL_SET_PEER: {
		struct leap_peer p;

		if (copy_from_user(&p, uarg, sizeof(p)))
			return -EFAULT;
		spin_lock_bh(&f->rx_lock);
		f->peer_addr = (__force __be32)p.addr;
		f->peer_port = htons(p.port);
		f->locked = false;
		spin_unlock_bh(&f->rx_lock);
		return 0;
	}
	case LEAP_IOCTL_SET_FRAME_TIMEOUT: {
		u32 ms;

		if (copy_from_user(&ms, uarg, sizeof(ms)))
			return -EFAULT;
		if (ms > 60 * MSEC_PER_SEC)
			return -EINVAL;
		if (!ms)
			ms = READ_ONCE(frame_timeout_ms) ?: 1;
		spin_lock_bh(&f->rx_lock);
		f->timeout_ms = ms;
		f->timeout = msecs_to_jiffies(ms) ?: 1;
		spin_unlock_bh(&f->rx_lock);
		return 0;
	}
	case LEAP_IOCTL_GET_INFO: {
		struct leap_info *info;

		info = kzalloc(sizeof(*info), GFP_KERNEL);
		if (!info)
			return -ENOMEM;
		if (copy_from_user(&info->scope, uarg + offsetof(struct leap_info, scope), sizeof(info->scope))) {
			ret = -EFAULT;
			goto out_free_info;
		}
		/* Every node's counters: a host administrator's view only. */
		if (info->scope == LEAP_INFO_SCOPE_MODULE && !leap_may_see_module(file)) {
			ret = -EPERM;
			goto out_free_info;
		}
		leap_fill_info(f, info);
		ret = copy_to_user(uarg, info, sizeof(*info)) ? -EFAULT : 0;
out_free_info:
		kfree(info);
		return ret;
	}
	default:
		return -ENOTTY;
	}
}

static const struct file_operations leap_fops = {
	.owner = THIS_MODULE,
	.open = leap_open,
	.release = leap_release,
	.write = leap_write,
	.unlocked_ioctl = leap_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = leap_mmap,
	.poll = leap_poll,
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
	.llseek = no_llseek,
#endif
};

static struct miscdevice leap_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = LEAP_DEVICE_NAME,
	.fops = &leap_fops,
	.mode = 0600,
};

static int __init leap_init(void)
{
	int err;

	BUILD_BUG_ON(sizeof(struct leap_bank_metadata) != 12);
	BUILD_BUG_ON(sizeof(struct leap_counters) != 32 * 8);
	BUILD_BUG_ON(sizeof(struct leap_info) != 320);
	BUILD_BUG_ON(sizeof(struct leap_wait) != 32);
	BUILD_BUG_ON((LEAP_BANK_CHUNKS_MAX - 1) * LEAP_CHUNK_PAYLOAD_MAX >= LEAP_BANK_SIZE);
	BUILD_BUG_ON(LEAP_BANK_CHUNKS_MAX * LEAP_CHUNK_PAYLOAD_MAX < LEAP_BANK_SIZE);

	if (leap_buffer_size != LEAP_HALF_SIZE) {
		pr_err("leap_buffer_size=%lu: only %u is supported (the mmap layout is ABI)\n",
		       leap_buffer_size, LEAP_HALF_SIZE);
		return -EINVAL;
	}
	err = misc_register(&leap_misc);
	if (err) {
		pr_err("cannot register /dev/%s: %d\n", LEAP_DEVICE_NAME, err);
		return err;
	}
	pr_info("version %s, ABI %d, /dev/%s\n", LEAP_KMOD_VERSION, LEAP_ABI_VERSION, LEAP_DEVICE_NAME);
	return 0;
}

static void __exit leap_exit(void)
{
	/* fops.owner pins the module while any file is open. */
	misc_deregister(&leap_misc);
}

module_init(leap_init);
module_exit(leap_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("LEAP activation frames over UDP into an mmap-able buffer (/dev/leap_tensor)");
MODULE_VERSION(LEAP_KMOD_VERSION);
