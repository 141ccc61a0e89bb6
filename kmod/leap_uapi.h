/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * leap_uapi.h - user-space ABI of /dev/leap_tensor (kernel module leap_kmod).
 *
 * Ioctls 1 to 6 and the mmap layout are those of the original LEAP module,
 * so programs written for it keep working. Everything added by leap uses
 * ioctl numbers 7 and up; LEAP_IOCTL_GET_INFO reports the ABI version and
 * the feature bits, so user space can discover what the loaded module has.
 *
 * leap-common/src/kmod.rs mirrors this file; leap-common/tests/uapi_abi.rs
 * compiles a program against it and checks that both agree.
 */
#ifndef _UAPI_LEAP_UAPI_H
#define _UAPI_LEAP_UAPI_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/ioctl.h>
#else
#include <linux/types.h>
#include <sys/ioctl.h>
#endif

#define LEAP_DEVICE_NAME	"leap_tensor"
#define LEAP_ABI_VERSION	1

/* mmap layout: 64 RX banks of 128 KiB, then the 8 MiB TX staging area. */
#define LEAP_HALF_SIZE		(8u << 20)
#define LEAP_MMAP_SIZE		(2u * LEAP_HALF_SIZE)
#define LEAP_RX_BANKS		64u
#define LEAP_BANK_SIZE		(LEAP_HALF_SIZE / LEAP_RX_BANKS)
#define LEAP_TX_OFFSET		LEAP_HALF_SIZE

/* Chunk format on the wire (all fields big-endian). */
#define LEAP_CHUNK_MAGIC	0x4C454150u
#define LEAP_CHUNK_HDR_LEN	12u
#define LEAP_CHUNK_PAYLOAD_MAX	1400u
/* A chunk train: up to this many chunks back to back in one datagram, every
 * one but the last a full header + 1400 bytes. */
#define LEAP_TRAIN_CHUNKS_MAX	6u
/*
 * Most chunks of a frame, as the original: a frame may fill the whole bank
 * (131072 bytes = 93 chunks of 1400 and a last one of 872).
 */
#define LEAP_BANK_CHUNKS_MAX	((LEAP_BANK_SIZE + LEAP_CHUNK_PAYLOAD_MAX - 1) / LEAP_CHUNK_PAYLOAD_MAX)

/*
 * Bits of the chunk header's `reserved` field: 0 from the original, and 0
 * from LEAP_IOCTL_SEND and write(), as the original; set only through
 * LEAP_IOCTL_SEND_FRAME.
 */
#define LEAP_CHUNK_F_LEAP	0x8000u	/* sender is leap: other bits valid */
#define LEAP_CHUNK_KIND_MASK	0x000fu
#define LEAP_CHUNK_KIND_DATA	0u
#define LEAP_CHUNK_KIND_CONTROL	1u
#define LEAP_CHUNK_KIND_NACK	2u

/* Feature bits of struct leap_info.features. */
#define LEAP_FEAT_PER_OPEN	(1ull << 0)	/* state per open file, per netns */
#define LEAP_FEAT_RELEASE_BANK	(1ull << 1)	/* LEAP_IOCTL_RELEASE_BANK */
#define LEAP_FEAT_PEER_FILTER	(1ull << 2)	/* LEAP_IOCTL_SET_PEER */
#define LEAP_FEAT_WAIT_FRAME	(1ull << 3)	/* LEAP_IOCTL_WAIT_FRAME */
#define LEAP_FEAT_LOST_REPORT	(1ull << 4)	/* incomplete frames reported */
#define LEAP_FEAT_RX_CSUM	(1ull << 5)	/* UDP checksums verified */
#define LEAP_FEAT_TX_CSUM	(1ull << 6)	/* UDP checksums sent */
#define LEAP_FEAT_FRAGMENTS	(1ull << 7)	/* reassembled datagrams taken */
#define LEAP_FEAT_SEND_FRAME	(1ull << 8)	/* LEAP_IOCTL_SEND_FRAME */
#define LEAP_FEAT_POLL		(1ull << 9)	/* poll()/epoll on the device */
#define LEAP_FEAT_FRAME_TIMEOUT	(1ull << 10)	/* LEAP_IOCTL_SET_FRAME_TIMEOUT */
#define LEAP_FEAT_LOCAL_ONLY	(1ull << 11)	/* only datagrams delivered to this host */
#define LEAP_FEAT_SENDER_LOCK	(1ull << 12)	/* no peer set: first sender locked */
#define LEAP_FEAT_TRAINS	(1ull << 13)	/* chunk trains split (LEAP_TRAIN_CHUNKS_MAX) */

/* Sender of a bank (LEAP_IOCTL_GET_BANK_SRC), as in the original. */
struct leap_bank_metadata {
	__s32 bank_idx;		/* in */
	__u32 saddr;		/* out: IPv4, network order */
	__u16 sport;		/* out: network order, as the original */
	__u16 _pad;
};

/* Counters, per open file or summed over the module (leap_info.scope). */
struct leap_counters {
	__u64 rx_chunks;		/* chunks copied into a bank */
	__u64 rx_duplicates;		/* chunks already received, ignored */
	__u64 rx_frames_completed;	/* banks that got all their chunks */
	__u64 rx_frames_delivered;	/* banks handed to user space */
	__u64 rx_frames_timed_out;	/* frames reported lost */
	__u64 rx_lost_overflow;		/* lost reports that found the queue full */
	__u64 rx_passthrough;		/* LEAP chunks of other kinds, left alone */
	__u64 rx_not_leap;		/* datagrams to the port without the magic */
	__u64 drop_short;		/* shorter than the chunk header */
	__u64 drop_bad_chunk_id;	/* chunk_id >= total_chunks, or total 0 */
	__u64 drop_oversize;		/* payload > 1400 */
	__u64 drop_bad_length;		/* non-last chunk not 1400, or empty */
	__u64 drop_total_mismatch;	/* total_chunks disagrees within a frame */
	__u64 drop_too_big;		/* total_chunks * 1400 > bank size */
	__u64 drop_peer;		/* not from the configured peer */
	__u64 drop_bad_checksum;	/* unused: the stack drops bad checksums (UDP InCsumErrors) */
	__u64 drop_bank_busy;		/* bank still held by user space */
	__u64 drop_stale;		/* older seq than the bank's frame */
	__u64 drop_source_mismatch;	/* another sender for the same frame */
	__u64 tx_frames;
	__u64 tx_chunks;
	__u64 tx_errors;
	__u64 drop_stranger;		/* no peer set: not the first sender, locked */
	__u64 drop_not_unicast;		/* broadcast or multicast to the port */
	__u64 _reserved[8];
};

#define LEAP_INFO_SCOPE_FILE	0u
/* EPERM unless opener and caller hold CAP_NET_ADMIN in the initial user namespace. */
#define LEAP_INFO_SCOPE_MODULE	1u

/* LEAP_IOCTL_GET_INFO: versioned discovery and counters. */
struct leap_info {
	__u32 abi_version;	/* out: LEAP_ABI_VERSION */
	__u32 info_size;	/* out: sizeof(struct leap_info) */
	__u64 features;		/* out: LEAP_FEAT_* */
	__u32 scope;		/* in: LEAP_INFO_SCOPE_* */
	__u32 open_files;	/* out: module scope: files open on the device; file scope: in this file's netns */
	__u32 rx_banks;		/* out */
	__u32 bank_size;	/* out */
	__u32 tx_size;		/* out */
	__u32 chunk_payload_max;	/* out */
	__u32 frame_timeout_ms;	/* out: this file's */
	__u16 port;		/* out: listening port, host order, 0 unset */
	__u16 tx_port;		/* out: next node's port, host order */
	__u32 dest_addr;	/* out: next node, IPv4 network order */
	__u32 peer_addr;	/* out: peer filter, network order, 0 any */
	__u16 peer_port;	/* out: peer filter, host order, 0 any */
	__u16 _pad0;
	__u32 busy_wait_limit;	/* out: module parameter */
	struct leap_counters counters;	/* out */
};

/* LEAP_IOCTL_SET_PEER: accept chunks only from this sender (0 = any). */
struct leap_peer {
	__u32 addr;		/* IPv4, network order; 0 any address */
	__u16 port;		/* host order; 0 any port */
	__u16 _pad;
};

#define LEAP_WAIT_FOREVER	0xffffffffu

#define LEAP_WAIT_STATUS_FRAME	0u	/* bank holds a complete frame */
#define LEAP_WAIT_STATUS_LOST	1u	/* frame `seq` timed out incomplete */

/* LEAP_IOCTL_WAIT_FRAME: the oldest complete frame or lost-frame report. */
struct leap_wait {
	__u32 timeout_ms;	/* in: 0 poll, LEAP_WAIT_FOREVER block */
	__u32 status;		/* out: LEAP_WAIT_STATUS_* */
	__s32 bank;		/* out: bank index, -1 when lost */
	__u32 len;		/* out: frame bytes received */
	__u32 saddr;		/* out: sender IPv4, network order */
	__u16 sport;		/* out: sender port, host order */
	__u16 seq;		/* out: frame seq */
	__u16 total_chunks;	/* out */
	__u16 flags;		/* out: `reserved` field of the frame's chunks */
	__u32 chunks;		/* out: chunks received (< total when lost) */
};

/* LEAP_IOCTL_SEND_FRAME: send `len` bytes of the TX area as one frame. */
struct leap_send {
	__u32 len;		/* in: bytes, 1 .. LEAP_HALF_SIZE */
	__u16 flags;		/* in: `reserved` field to put on the wire */
	__u16 seq;		/* out: seq the frame was sent with */
};

#define LEAP_IOCTL_MAGIC	'k'

/* The original ABI. */
#define LEAP_IOCTL_WAIT_DATA	_IO(LEAP_IOCTL_MAGIC, 1)
#define LEAP_IOCTL_SET_DEST	_IOW(LEAP_IOCTL_MAGIC, 2, unsigned int)
#define LEAP_IOCTL_SET_PORT	_IOW(LEAP_IOCTL_MAGIC, 3, unsigned short)
#define LEAP_IOCTL_SEND		_IOW(LEAP_IOCTL_MAGIC, 4, unsigned int)
#define LEAP_IOCTL_SET_TX_PORT	_IOW(LEAP_IOCTL_MAGIC, 5, unsigned short)
#define LEAP_IOCTL_GET_BANK_SRC	_IOWR(LEAP_IOCTL_MAGIC, 6, struct leap_bank_metadata)

/* leap additions. */
#define LEAP_IOCTL_GET_INFO	_IOWR(LEAP_IOCTL_MAGIC, 7, struct leap_info)
#define LEAP_IOCTL_RELEASE_BANK	_IOW(LEAP_IOCTL_MAGIC, 8, __u32)
#define LEAP_IOCTL_SET_PEER	_IOW(LEAP_IOCTL_MAGIC, 9, struct leap_peer)
#define LEAP_IOCTL_WAIT_FRAME	_IOWR(LEAP_IOCTL_MAGIC, 10, struct leap_wait)
#define LEAP_IOCTL_SET_FRAME_TIMEOUT _IOW(LEAP_IOCTL_MAGIC, 11, __u32)
#define LEAP_IOCTL_SEND_FRAME	_IOWR(LEAP_IOCTL_MAGIC, 12, struct leap_send)

#endif /* _UAPI_LEAP_UAPI_H */
