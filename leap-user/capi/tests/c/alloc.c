/*
 * alloc.c: after warm-up, moving frames through libleap allocates no
 * frame-sized memory per frame, and the lending path copies no more than
 * the Rust lending path does (README, "Embedding": copies per hop, lending
 * / copying: tcp 0 / 0, udp 1 / 2).
 *
 * malloc, calloc, realloc and the aligned allocators are interposed (glibc
 * lets a program define them; the real ones are __libc_*) and count the
 * calls of at least a frame's size, on every thread.
 *
 *   alloc udp|tcp
 *
 * Two nodes A and B in one process, each other's next and previous node.
 * Lending: A writes a frame in place, B relays it (lent in, written in
 * place out), A takes it lent. Copying: A sends header + payload, B
 * receives into a buffer and sends it back, A receives into a buffer.
 */

#define _GNU_SOURCE
#define _DEFAULT_SOURCE

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <leap.h>

#define FRAME 16392
#define WARM 200
#define WARM_SLOTS 64
#define ROUNDS 2000

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static atomic_long big;

static void count(size_t n)
{
	if (n >= FRAME)
		atomic_fetch_add(&big, 1);
}

void *malloc(size_t n)
{
	count(n);
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
	count(n * m);
	return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
	count(n);
	return __libc_realloc(p, n);
}

void free(void *p)
{
	__libc_free(p);
}

int posix_memalign(void **out, size_t align, size_t n)
{
	void *p;

	count(n);
	p = __libc_memalign(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
	count(n);
	return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n)
{
	count(n);
	return __libc_memalign(align, n);
}

static const char *kind;

static void die(const char *what, leap_status s)
{
	fprintf(stderr, "alloc: %s: %s: %s\n", what, leap_status_name(s), leap_last_error());
	printf("0 passed, 1 failed\n");
	exit(1);
}

#define TRY(call)                              \
	do {                                   \
		leap_status s_ = (call);       \
		if (s_ != LEAP_OK)             \
			die(#call, s_);        \
	} while (0)

static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, strcmp(kind, "tcp") == 0 ? SOCK_STREAM : SOCK_DGRAM, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || getsockname(fd, (struct sockaddr *)&a, &len))
		abort();
	close(fd);
	return ntohs(a.sin_port);
}

struct node {
	int listen, next;
	leap_transport *t;
	leap_status s;
};

static void *open_node(void *arg)
{
	struct node *n = arg;
	char listen[32], next[32];
	leap_config *c;

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", n->listen);
	snprintf(next, sizeof(next), "127.0.0.1:%d", n->next);
	if ((n->s = leap_config_new(kind, &c)) != LEAP_OK)
		return NULL;
	if ((n->s = leap_config_set(c, "listen", listen)) == LEAP_OK &&
	    (n->s = leap_config_set(c, "next", next)) == LEAP_OK &&
	    (n->s = leap_config_set(c, "prev", next)) == LEAP_OK &&
	    (n->s = leap_config_set(c, "recv_timeout_ms", "5000")) == LEAP_OK)
		n->s = leap_open(c, &n->t);
	leap_config_free(c);
	return NULL;
}

/* With `pause`, each frame waits a few milliseconds before it is received:
 * the transport's driver thread takes it off the socket into a side slot of
 * the reassembly (as it does when a stage computes for a while), so that
 * warm-up sizes those slots too. */
static void lending(leap_transport *a, leap_transport *b, int rounds, int pause)
{
	for (int i = 0; i < rounds; i++) {
		const void *in;
		void *out;
		size_t len;

		TRY(leap_send_begin(a, FRAME, &out));
		memset(out, i, FRAME);
		TRY(leap_send_commit(a));
		if (pause)
			usleep(3000);
		TRY(leap_recv_prev_lent(b, &in, &len, NULL));
		TRY(leap_send_begin(b, len, &out));
		memcpy(out, in, len);
		TRY(leap_send_commit(b));
		TRY(leap_release(b));
		if (pause)
			usleep(3000);
		TRY(leap_recv_prev_lent(a, &in, &len, NULL));
		if (len != FRAME || ((const unsigned char *)in)[FRAME - 1] != (unsigned char)i)
			die("the lent frame came back changed", LEAP_ERR_ARGUMENT);
		TRY(leap_release(a));
	}
}

static void copying(leap_transport *a, leap_transport *b, unsigned char *buf, unsigned char *frame, int rounds)
{
	for (int i = 0; i < rounds; i++) {
		size_t len;

		frame[FRAME - 1] = (unsigned char)i;
		TRY(leap_send_multipart_next(a, frame, 8, frame + 8, FRAME - 8));
		TRY(leap_recv_prev(b, buf, FRAME, &len, NULL));
		TRY(leap_send_next(b, buf, len));
		TRY(leap_recv_prev(a, buf, FRAME, &len, NULL));
		if (len != FRAME || buf[FRAME - 1] != (unsigned char)i)
			die("the frame came back changed", LEAP_ERR_ARGUMENT);
	}
}

/* Bytes copied per byte received at B over `rounds` of `path`. */
static double copies(leap_transport *a, leap_transport *b, int lend, unsigned char *buf, unsigned char *frame)
{
	leap_stats s0, s1;

	TRY(leap_get_stats(b, &s0));
	if (lend)
		lending(a, b, ROUNDS, 0);
	else
		copying(a, b, buf, frame, ROUNDS);
	TRY(leap_get_stats(b, &s1));
	return (double)(s1.copied_bytes - s0.copied_bytes) / (double)(s1.bytes_received - s0.bytes_received);
}

int main(int argc, char **argv)
{
	struct node na, nb;
	pthread_t th;
	unsigned char *buf, *frame;
	long before, lend_allocs, copy_allocs;
	double lend_copies, copy_copies, want_lend, want_copy;
	int failed = 0;

	kind = argc > 1 ? argv[1] : "udp";
	/* The README's figures for the Rust API. */
	want_lend = strcmp(kind, "tcp") == 0 ? 0.0 : 1.0;
	want_copy = strcmp(kind, "tcp") == 0 ? 0.0 : 2.0;
	na.listen = nb.next = free_port();
	nb.listen = na.next = free_port();
	pthread_create(&th, NULL, open_node, &nb);
	open_node(&na);
	pthread_join(th, NULL);
	if (na.s != LEAP_OK || nb.s != LEAP_OK)
		die("opening the pair", na.s != LEAP_OK ? na.s : nb.s);
	buf = malloc(FRAME);
	frame = malloc(FRAME);
	memset(frame, 5, FRAME);

	/* Warm-up: every buffer reaches its size, the reassembly's side slots
	 * (filled by the driver while nobody receives) included. */
	lending(na.t, nb.t, WARM_SLOTS, 1);
	lending(na.t, nb.t, WARM, 0);
	copying(na.t, nb.t, buf, frame, WARM);

	before = atomic_load(&big);
	lend_copies = copies(na.t, nb.t, 1, buf, frame);
	lend_allocs = atomic_load(&big) - before;
	before = atomic_load(&big);
	copy_copies = copies(na.t, nb.t, 0, buf, frame);
	copy_allocs = atomic_load(&big) - before;

	printf("%s lending: %ld allocations of >= %d bytes in %d round trips, %.3f copies per hop (Rust: %.0f)\n", kind,
	       lend_allocs, FRAME, ROUNDS, lend_copies, want_lend);
	printf("%s copying: %ld allocations of >= %d bytes in %d round trips, %.3f copies per hop (Rust: %.0f)\n", kind,
	       copy_allocs, FRAME, ROUNDS, copy_copies, want_copy);
	if (lend_allocs != 0 || copy_allocs != 0) {
		fprintf(stderr, "alloc: frame-sized allocations after warm-up\n");
		failed++;
	}
	/* Retransmissions on a busy machine may add a little; never a copy. */
	if (lend_copies > want_lend + 0.05 || copy_copies > want_copy + 0.05) {
		fprintf(stderr, "alloc: more copies per hop than the Rust API makes\n");
		failed++;
	}
	leap_free(na.t);
	leap_free(nb.t);
	printf("%d passed, %d failed\n", 2 - failed, failed);
	return failed ? 1 : 0;
}
