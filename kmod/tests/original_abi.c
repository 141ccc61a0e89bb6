// SPDX-License-Identifier: GPL-2.0
/*
 * original_abi - a program written against the original LEAP module's ABI
 * only (ioctls 1 to 6, write() and mmap), as an original program would be.
 * It deliberately does not include leap_uapi.h: every definition below is
 * the original's.
 *
 *   original_abi all           chunk bytes of SEND and write() (reserved 0),
 *                              GET_BANK_SRC in network order, a 131072-byte
 *                              frame module to module, a 0-byte SEND
 *   original_abi control PORT  sends a RESIZE_CHAIN control frame (0xC0DE
 *                              marker, 16392 bytes) to 127.0.0.1:PORT
 *   original_abi bind PORT     opens the device and binds PORT; exits 3 when
 *                              refused with EPERM or EACCES
 *
 * Exits 0 on success, 1 on a failed check (printed), 2 on a usage error.
 * Every wait is bounded (SO_RCVTIMEO, alarm()).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* The original ABI. */
#define DEV			"/dev/leap_tensor"
#define HALF			(8u << 20)
#define BANK			(128u << 10)
#define CHUNK			1400u
#define HDR			12u
#define MAGIC			0x4C454150u
#define LEAP_IOCTL_WAIT_DATA	_IO('k', 1)
#define LEAP_IOCTL_SET_DEST	_IOW('k', 2, unsigned int)
#define LEAP_IOCTL_SET_PORT	_IOW('k', 3, unsigned short)
#define LEAP_IOCTL_SEND		_IOW('k', 4, unsigned int)
#define LEAP_IOCTL_SET_TX_PORT	_IOW('k', 5, unsigned short)
#define LEAP_IOCTL_GET_BANK_SRC	_IOWR('k', 6, struct leap_bank_metadata)

struct leap_bank_metadata {
	int bank_idx;
	uint32_t saddr;
	uint16_t sport;
};

static int failures;

#define CHECK(cond, ...)						\
	do {								\
		if (!(cond)) {						\
			fprintf(stderr, "original_abi: FAILED %s:%d: ",	\
				__FILE__, __LINE__);			\
			fprintf(stderr, __VA_ARGS__);			\
			fputc('\n', stderr);				\
			failures++;					\
		}							\
	} while (0)

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static uint8_t pattern(uint32_t seed, size_t i)
{
	return (uint8_t)(i * 131u + seed * 7u + 3u);
}

struct node {
	int fd;
	uint8_t *map;
	unsigned short port;
};

static void node_open(struct node *n, unsigned short port)
{
	n->fd = open(DEV, O_RDWR);
	if (n->fd < 0)
		die("open " DEV);
	n->map = mmap(NULL, 2 * HALF, PROT_READ | PROT_WRITE, MAP_SHARED, n->fd, 0);
	if (n->map == MAP_FAILED)
		die("mmap");
	n->port = port;
	if (ioctl(n->fd, LEAP_IOCTL_SET_PORT, &port))
		die("LEAP_IOCTL_SET_PORT");
}

static void node_dest(struct node *n, unsigned short port)
{
	unsigned int addr = htonl(INADDR_LOOPBACK);

	if (ioctl(n->fd, LEAP_IOCTL_SET_DEST, &addr))
		die("LEAP_IOCTL_SET_DEST");
	if (ioctl(n->fd, LEAP_IOCTL_SET_TX_PORT, &port))
		die("LEAP_IOCTL_SET_TX_PORT");
}

/* A plain UDP socket on 127.0.0.1:port, with a 5 s receive timeout. */
static int udp_socket(unsigned short port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct timeval tv = { .tv_sec = 5 };
	int s = socket(AF_INET, SOCK_DGRAM, 0);

	if (s < 0)
		die("socket");
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(s, (struct sockaddr *)&sin, sizeof(sin)))
		die("bind");
	if (setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)))
		die("SO_RCVTIMEO");
	return s;
}

/* Receives the `total` chunks of one frame and checks every header byte. */
static void expect_chunks(int s, const char *how, uint32_t seed, size_t len)
{
	uint32_t total = (len + CHUNK - 1) / CHUNK, got = 0, i;
	uint8_t d[HDR + CHUNK + 64];
	uint16_t seq = 0;

	for (i = 0; i < total; i++) {
		ssize_t n = recv(s, d, sizeof(d), 0);
		uint16_t id, t;
		size_t plen, k;

		if (n < 0) {
			CHECK(0, "%s: chunk %u of %u never arrived: %s", how, i, total, strerror(errno));
			return;
		}
		CHECK(n >= (ssize_t)HDR, "%s: datagram of %zd bytes", how, n);
		if (n < (ssize_t)HDR)
			return;
		CHECK(ntohl(*(uint32_t *)d) == MAGIC, "%s: magic %08x", how, ntohl(*(uint32_t *)d));
		if (i == 0)
			seq = ntohs(*(uint16_t *)(d + 4));
		CHECK(ntohs(*(uint16_t *)(d + 4)) == seq, "%s: seq changed within a frame", how);
		id = ntohs(*(uint16_t *)(d + 6));
		t = ntohs(*(uint16_t *)(d + 8));
		CHECK(t == total, "%s: total_chunks %u, expected %u", how, t, total);
		CHECK(d[10] == 0 && d[11] == 0, "%s: reserved bytes %02x %02x, the original sends 0 0",
		      how, d[10], d[11]);
		CHECK(id < total, "%s: chunk_id %u", how, id);
		if (id >= total)
			return;
		plen = (uint32_t)id + 1 < total ? CHUNK : len - (size_t)id * CHUNK;
		CHECK((size_t)n == HDR + plen, "%s: chunk %u is %zd bytes, expected %zu", how, id, n, HDR + plen);
		for (k = 0; k < plen && (size_t)n == HDR + plen; k++) {
			if (d[HDR + k] != pattern(seed, (size_t)id * CHUNK + k)) {
				CHECK(0, "%s: chunk %u byte %zu differs", how, id, k);
				break;
			}
		}
		got++;
	}
	CHECK(got == total, "%s: %u of %u chunks", how, got, total);
}

static int run_all(void)
{
	const unsigned short pa = 24001, pb = 24002, pr = 24003, pc = 24004;
	struct leap_bank_metadata m;
	struct node a, b, c;
	uint8_t buf[3000];
	unsigned int len;
	uint8_t d[HDR + 100];
	long ret;
	int r, bank;
	size_t i;

	node_open(&a, pa);
	node_open(&b, pb);
	node_open(&c, pc);
	r = udp_socket(pr);

	/* SEND: chunks carry reserved = 0, as the original's. */
	node_dest(&a, pr);
	for (i = 0; i < 3000; i++)
		a.map[HALF + i] = pattern(1, i);
	len = 3000;
	ret = ioctl(a.fd, LEAP_IOCTL_SEND, &len);
	CHECK(ret >= 0, "LEAP_IOCTL_SEND of 3000 bytes: %s", strerror(errno));
	expect_chunks(r, "SEND", 1, 3000);

	/* write(): the same. */
	for (i = 0; i < sizeof(buf); i++)
		buf[i] = pattern(2, i);
	ret = write(a.fd, buf, 1500);
	CHECK(ret == 1500, "write of 1500 bytes returned %ld: %s", ret, strerror(errno));
	expect_chunks(r, "write()", 2, 1500);

	/* SEND of 0 bytes returns 0 and sends nothing. */
	len = 0;
	ret = ioctl(a.fd, LEAP_IOCTL_SEND, &len);
	CHECK(ret == 0, "LEAP_IOCTL_SEND of 0 bytes returned %ld (%s), the original returns 0", ret,
	      strerror(errno));

	/* GET_BANK_SRC: saddr and sport in network order. */
	*(uint32_t *)d = htonl(MAGIC);
	*(uint16_t *)(d + 4) = htons(5);
	*(uint16_t *)(d + 6) = htons(0);
	*(uint16_t *)(d + 8) = htons(1);
	*(uint16_t *)(d + 10) = 0;
	memset(d + HDR, 0x5a, 100);
	{
		struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(pb) };

		to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		CHECK(sendto(r, d, sizeof(d), 0, (struct sockaddr *)&to, sizeof(to)) == sizeof(d), "sendto: %s",
		      strerror(errno));
	}
	alarm(10);
	bank = ioctl(b.fd, LEAP_IOCTL_WAIT_DATA);
	alarm(0);
	CHECK(bank == 5, "LEAP_IOCTL_WAIT_DATA returned %d (%s), expected bank 5", bank, strerror(errno));
	m.bank_idx = 5;
	CHECK(ioctl(b.fd, LEAP_IOCTL_GET_BANK_SRC, &m) == 0, "GET_BANK_SRC: %s", strerror(errno));
	CHECK(m.saddr == htonl(INADDR_LOOPBACK), "GET_BANK_SRC saddr %08x, expected 127.0.0.1 in network order",
	      m.saddr);
	CHECK(m.sport == htons(pr), "GET_BANK_SRC sport %04x, expected %u in network order (%04x)", m.sport, pr,
	      htons(pr));
	CHECK(ntohs(m.sport) == pr, "ntohs(sport) = %u, expected %u", ntohs(m.sport), pr);
	CHECK(b.map[5 * BANK] == 0x5a && b.map[5 * BANK + 99] == 0x5a, "bank 5 does not hold the chunk");

	/* A frame that fills the whole bank: 131072 bytes, 94 chunks. */
	node_dest(&a, pc);
	for (i = 0; i < BANK; i++)
		a.map[HALF + i] = pattern(3, i);
	len = BANK;
	ret = ioctl(a.fd, LEAP_IOCTL_SEND, &len);
	CHECK(ret >= 0, "LEAP_IOCTL_SEND of 131072 bytes: %s", strerror(errno));
	alarm(10);
	bank = ioctl(c.fd, LEAP_IOCTL_WAIT_DATA);
	alarm(0);
	CHECK(bank >= 0, "LEAP_IOCTL_WAIT_DATA after a 131072-byte frame: %s", strerror(errno));
	if (bank >= 0) {
		for (i = 0; i < BANK; i++) {
			if (c.map[(size_t)bank * BANK + i] != pattern(3, i)) {
				CHECK(0, "131072-byte frame: byte %zu of bank %d differs", i, bank);
				break;
			}
		}
		m.bank_idx = bank;
		CHECK(ioctl(c.fd, LEAP_IOCTL_GET_BANK_SRC, &m) == 0 && m.sport == htons(pa),
		      "module-to-module GET_BANK_SRC sport %04x, expected %04x", m.sport, htons(pa));
	}

	munmap(a.map, 2 * HALF);
	munmap(b.map, 2 * HALF);
	munmap(c.map, 2 * HALF);
	close(a.fd);
	close(b.fd);
	close(c.fd);
	close(r);
	if (failures)
		return 1;
	printf("original_abi: reserved 0 on SEND and write(), GET_BANK_SRC network order, 131072-byte frame, 0-byte SEND: ok\n");
	return 0;
}

/* A RESIZE_CHAIN control frame, as the original head sends it. */
static int run_control(unsigned short port)
{
	static uint8_t frame[16392];
	struct node a;
	uint8_t *p = frame;
	int32_t v;
	int i;

	node_open(&a, 24010);
	node_dest(&a, port);
	*(uint16_t *)p = 0xC0DE;	/* host order, as the original */
	p += 2;
	*p++ = 2;			/* RESIZE_CHAIN */
	v = 8;
	memcpy(p, &v, 4);		/* split_layer */
	p += 4;
	v = 32;
	memcpy(p, &v, 4);		/* end_layer */
	p += 4;
	*p++ = 0;			/* is_tail */
	v = 0;
	memcpy(p, &v, 4);		/* worker_index */
	p += 4;
	v = 2;
	memcpy(p, &v, 4);		/* total_workers */
	p += 4;
	for (i = 0; i < 16; i++) {
		v = i < 2 ? 16 * i : 0;
		memcpy(p, &v, 4);
		v = i < 2 ? 16 * i + 16 : 0;
		memcpy(p + 4, &v, 4);
		p[8] = i == 1;
		p += 9;
	}
	if (write(a.fd, frame, sizeof(frame)) != (ssize_t)sizeof(frame))
		die("write control frame");
	close(a.fd);
	return 0;
}

/* Exit status of a refused call; errno is read before perror() may change it. */
static int refused(const char *what)
{
	int err = errno;

	perror(what);
	return err == EPERM || err == EACCES ? 3 : 1;
}

static int run_bind(unsigned short port)
{
	int fd = open(DEV, O_RDWR);

	if (fd < 0)
		return refused("open " DEV);
	if (ioctl(fd, LEAP_IOCTL_SET_PORT, &port))
		return refused("LEAP_IOCTL_SET_PORT");
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "all"))
		return run_all();
	if (argc == 3 && !strcmp(argv[1], "control"))
		return run_control((unsigned short)atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "bind"))
		return run_bind((unsigned short)atoi(argv[2]));
	fprintf(stderr, "usage: original_abi all | control PORT | bind PORT\n");
	return 2;
}
