/*
 * api.c: every error path of libleap returns its code and a message that
 * says what to do, and the calls around them work: NULL pointers, short
 * buffers, closed and split handles, bad settings, a lent frame not
 * released, a double release, a commit without a begin, the non-blocking
 * receive and the readiness descriptor, peeking without consuming, control
 * frames, split halves used from two threads, a key rotation from another
 * thread while a receive waits. Two UDP nodes on loopback
 * (or TCP: `api tcp`), one process.
 *
 * Prints one line per check and "N passed, 0 failed" at the end; exits 1
 * at the first failure.
 */

#define _DEFAULT_SOURCE

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <leap.h>

static int passed;
static const char *kind = "udp";

#define CHECK(cond, ...)                                                             \
	do {                                                                         \
		if (!(cond)) {                                                       \
			fprintf(stderr, "FAILED at line %d: %s: ", __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                \
			fprintf(stderr, " (last error: %s)\n", leap_last_error());   \
			printf("%d passed, 1 failed\n", passed);                     \
			exit(1);                                                     \
		}                                                                    \
	} while (0)

/* `call` returns `want` and leaves a message containing `needle`. */
#define EXPECT(call, want, needle)                                                                    \
	do {                                                                                          \
		leap_status got_ = (call);                                                            \
		CHECK(got_ == (want), "%s returned %s, not %s", #call, leap_status_name(got_),        \
		      leap_status_name(want));                                                        \
		CHECK((want) == LEAP_OK || strstr(leap_last_error(), (needle)) != NULL,               \
		      "%s: message lacks \"%s\"", #call, (needle));                                   \
		printf("ok %d - %s -> %s%s%s\n", ++passed, #call, leap_status_name(want),             \
		       (want) == LEAP_OK ? "" : ": ", (want) == LEAP_OK ? "" : leap_last_error());    \
	} while (0)

#define OK(call) EXPECT(call, LEAP_OK, "")

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

struct opener {
	int listen, next;
	size_t frame;
	const char *key; /* key_file, or NULL */
	leap_transport *t;
	leap_status s;
};

static void *open_node(void *arg)
{
	struct opener *o = arg;
	char listen[32], next[32], frame[32];
	leap_config *c;

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", o->listen);
	snprintf(next, sizeof(next), "127.0.0.1:%d", o->next);
	snprintf(frame, sizeof(frame), "%zu", o->frame);
	o->s = leap_config_new(kind, &c);
	if (o->s != LEAP_OK)
		return NULL;
	if ((o->s = leap_config_set(c, "listen", listen)) == LEAP_OK &&
	    (o->s = leap_config_set(c, "next", next)) == LEAP_OK &&
	    (o->s = leap_config_set(c, "prev", next)) == LEAP_OK &&
	    (o->s = leap_config_set(c, "frame_size", frame)) == LEAP_OK &&
	    (o->s = leap_config_set(c, "recv_timeout_ms", "5000")) == LEAP_OK &&
	    (!o->key || (o->s = leap_config_set(c, "key_file", o->key)) == LEAP_OK))
		o->s = leap_open(c, &o->t);
	leap_config_free(c);
	return NULL;
}

/* Two nodes that are each other's next and previous node (TCP opens both
 * at once: each connects to the other while accepting). */
static void keyed_pair(size_t frame, const char *key, leap_transport **a, leap_transport **b)
{
	struct opener oa = { .frame = frame, .key = key }, ob = { .frame = frame, .key = key };
	pthread_t th;

	oa.listen = ob.next = free_port();
	ob.listen = oa.next = free_port();
	pthread_create(&th, NULL, open_node, &ob);
	open_node(&oa);
	pthread_join(th, NULL);
	CHECK(oa.s == LEAP_OK && ob.s == LEAP_OK, "opening a pair: %s / %s", leap_status_name(oa.s),
	      leap_status_name(ob.s));
	*a = oa.t;
	*b = ob.t;
}

static void pair(size_t frame, leap_transport **a, leap_transport **b)
{
	keyed_pair(frame, NULL, a, b);
}

/* Receives with a deadline of 5 s, whatever the handle's timeout. */
static leap_status recv_wait(leap_transport *t, void *buf, size_t cap, size_t *len, leap_frame_kind *k)
{
	leap_status s;
	int fd;

	if (leap_ready_fd(t, &fd) != LEAP_OK)
		return LEAP_ERR_SYSTEM;
	for (int i = 0; i < 1000; i++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		s = leap_recv_prev(t, buf, cap, len, k);
		if (s != LEAP_ERR_AGAIN)
			return s;
		poll(&p, 1, 5);
	}
	return s;
}

static void settings(void)
{
	leap_config *c = NULL;
	leap_transport *t = NULL;
	const char *help = NULL;

	EXPECT(leap_config_new(NULL, &c), LEAP_ERR_NULL, "kind is NULL");
	EXPECT(leap_config_new("udp", NULL), LEAP_ERR_NULL, "out is NULL");
	EXPECT(leap_config_new("carrier-pigeon", &c), LEAP_ERR_SETTING, "choose one of: tcp, udp");
	OK(leap_config_new(kind, &c));
	EXPECT(leap_config_set(NULL, "listen", "127.0.0.1:1"), LEAP_ERR_NULL, "config is NULL");
	EXPECT(leap_config_set(c, NULL, "1"), LEAP_ERR_NULL, "key is NULL");
	EXPECT(leap_config_set(c, "inflight", NULL), LEAP_ERR_NULL, "value is NULL");
	EXPECT(leap_config_set(c, "pigeon", "1"), LEAP_ERR_SETTING, "unknown setting; the settings are: listen");
	EXPECT(leap_config_set(c, "inflight", "65"), LEAP_ERR_SETTING, "1..=64");
	EXPECT(leap_config_set(c, "listen", "localhost"), LEAP_ERR_SETTING, "is not ADDR:PORT");
	EXPECT(leap_config_set(c, "crc", "maybe"), LEAP_ERR_SETTING, "choose true or false");
	EXPECT(leap_config_set(c, "listen", "\xff\xfe"), LEAP_ERR_ARGUMENT, "not UTF-8");
	EXPECT(leap_config_check(c), LEAP_ERR_SETTING, "listen: not set");
	EXPECT(leap_open(c, &t), LEAP_ERR_SETTING, "listen: not set");
	EXPECT(leap_open(NULL, &t), LEAP_ERR_NULL, "config is NULL");
	EXPECT(leap_open(c, NULL), LEAP_ERR_NULL, "out is NULL");
	OK(leap_config_set(c, "listen", "127.0.0.1:9"));
	OK(leap_config_set(c, "next", "127.0.0.1:10"));
	OK(leap_config_check(c));
	leap_config_free(c);
	leap_config_free(NULL);
	CHECK(strcmp(leap_setting_key(0, &help), "listen") == 0 && help && *help, "the first key is listen");
	int n = 0;
	while (leap_setting_key(n, NULL))
		n++;
	CHECK(n > 20 && leap_setting_key(n, &help) == NULL, "%d keys, then NULL", n);
	printf("ok %d - %d settings listed\n", ++passed, n);
}

static void frames(leap_transport *a, leap_transport *b, size_t frame)
{
	unsigned char *buf = malloc(frame), *big = calloc(1, frame);
	const void *data, *data2;
	void *out;
	size_t len;
	leap_frame_kind k;
	leap_stats st;
	leap_control m, got;
	int fd;

	EXPECT(leap_send_next(NULL, big, 10), LEAP_ERR_NULL, "transport is NULL");
	EXPECT(leap_send_next(a, NULL, 10), LEAP_ERR_NULL, "buf is NULL");
	EXPECT(leap_send_next(a, big, 0), LEAP_ERR_BAD_LENGTH, "send between 1 byte");
	EXPECT(leap_send_multipart_next(a, NULL, 8, big, 10), LEAP_ERR_NULL, "header is NULL");
	EXPECT(leap_recv_prev(b, buf, frame, NULL, &k), LEAP_ERR_NULL, "len is NULL");
	EXPECT(leap_recv_prev(b, NULL, frame, &len, &k), LEAP_ERR_NULL, "buf is NULL");
	EXPECT(leap_recv_prev_lent(b, NULL, &len, &k), LEAP_ERR_NULL, "data is NULL");
	EXPECT(leap_peek_prev(b, &data, NULL, &k), LEAP_ERR_NULL, "len is NULL");
	EXPECT(leap_ready_fd(b, NULL), LEAP_ERR_NULL, "fd is NULL");
	EXPECT(leap_get_stats(b, NULL), LEAP_ERR_NULL, "stats is NULL");

	/* A short buffer: refused before anything is received. */
	memset(big, 7, frame);
	EXPECT(leap_recv_prev(b, buf, 100, &len, &k), LEAP_ERR_TOO_LARGE, "buffer of at least frame_size");

	/* The non-blocking receive and the readiness descriptor. */
	OK(leap_set_recv_timeout(b, 0));
	EXPECT(leap_recv_prev(b, buf, frame, &len, &k), LEAP_ERR_AGAIN, "leap_ready_fd");
	EXPECT(leap_peek_prev(b, &data, &len, &k), LEAP_ERR_AGAIN, "leap_ready_fd");
	OK(leap_ready_fd(b, &fd));
	{
		struct pollfd p = { .fd = fd, .events = POLLIN };

		CHECK(poll(&p, 1, 0) == 0, "readable with nothing there");
		OK(leap_send_next(a, big, frame));
		CHECK(poll(&p, 1, 5000) == 1, "a frame sent: the descriptor must become readable");
		printf("ok %d - the readiness descriptor woke for a frame\n", ++passed);
	}
	OK(recv_wait(b, buf, frame, &len, &k));
	CHECK(len == frame && k == LEAP_FRAME_DATA && buf[0] == 7, "the frame");
	OK(leap_set_recv_timeout(b, 50));
	EXPECT(leap_recv_prev(b, buf, frame, &len, &k), LEAP_ERR_TIMEOUT, "raise the timeout");
	OK(leap_set_recv_timeout(b, 5000));

	/* Lending: no second receive and no split while lent, one release. */
	OK(leap_send_next(a, big, frame));
	OK(leap_recv_prev_lent(b, &data, &len, &k));
	CHECK(len == frame && ((const unsigned char *)data)[0] == 7, "the lent frame");
	EXPECT(leap_recv_prev_lent(b, &data2, &len, &k), LEAP_ERR_STATE, "call leap_release");
	EXPECT(leap_recv_prev(b, buf, frame, &len, &k), LEAP_ERR_STATE, "not released");
	EXPECT(leap_peek_prev(b, &data2, &len, &k), LEAP_ERR_STATE, "not released");
	{
		leap_sender *s;
		leap_receiver *r;

		EXPECT(leap_split(b, &s, &r), LEAP_ERR_STATE, "release or commit it before splitting");
	}
	OK(leap_send_next(b, big, frame)); /* sending while a frame is lent is fine */
	OK(leap_release(b));
	EXPECT(leap_release(b), LEAP_ERR_STATE, "no frame is lent");
	OK(recv_wait(a, buf, frame, &len, &k));
	CHECK(len == frame, "the frame b sent while lending");

	/* Writing in place: commit needs a begin, once. */
	EXPECT(leap_send_commit(a), LEAP_ERR_STATE, "call leap_send_begin");
	EXPECT(leap_send_begin(a, 100, NULL), LEAP_ERR_NULL, "buf is NULL");
	EXPECT(leap_send_begin(a, 0, &out), LEAP_ERR_BAD_LENGTH, "send between 1 byte");
	OK(leap_send_begin(a, frame, &out));
	memset(out, 3, frame);
	OK(leap_send_commit(a));
	EXPECT(leap_send_commit(a), LEAP_ERR_STATE, "no frame is begun");
	OK(leap_recv_prev(b, buf, frame, &len, &k));
	CHECK(len == frame && buf[0] == 3 && buf[frame - 1] == 3, "the frame written in place");
	OK(leap_send_begin(a, frame, &out));
	OK(leap_send_next(a, big, frame)); /* discards the frame begun */
	EXPECT(leap_send_commit(a), LEAP_ERR_STATE, "no frame is begun");
	OK(leap_recv_prev(b, buf, frame, &len, &k));
	CHECK(buf[0] == 7, "the frame sent, not the one begun");

	/* Control messages. */
	memset(&m, 0, sizeof(m));
	m.kind = LEAP_CONTROL_RESIZE_CHAIN;
	m.total_workers = 2;
	m.ranges[1].start_layer = 16;
	m.ranges[1].end_layer = 32;
	m.ranges[1].is_tail = 1;
	EXPECT(leap_send_control(a, NULL, frame), LEAP_ERR_NULL, "msg is NULL");
	EXPECT(leap_send_control(a, &m, 100), LEAP_ERR_CONTROL, "at least LEAP_CONTROL_FRAME_MIN");
	m.kind = 9;
	EXPECT(leap_send_control(a, &m, frame), LEAP_ERR_CONTROL, "control kind 9");
	m.kind = LEAP_CONTROL_RESIZE_CHAIN;
	m.worker_index = 3;
	EXPECT(leap_send_control(a, &m, frame), LEAP_ERR_CONTROL, "worker_index <= total_workers");
	m.worker_index = 0;
	EXPECT(leap_decode_control(big, frame, &got), LEAP_ERR_CONTROL, "starts with 0xC0DE");
	EXPECT(leap_decode_control(big, frame, NULL), LEAP_ERR_NULL, "out is NULL");

	/* Peeking (how a C++ layer answers recv_control_nonblocking): a data
	 * frame stays for the next receive, a control frame is taken. */
	OK(leap_send_next(a, big, frame));
	OK(leap_send_control(a, &m, frame));
	{
		leap_status s = LEAP_ERR_AGAIN;

		for (int i = 0; i < 1000 && s == LEAP_ERR_AGAIN; i++) {
			s = leap_peek_prev(b, &data, &len, &k);
			if (s == LEAP_ERR_AGAIN)
				usleep(2000);
		}
		CHECK(s == LEAP_OK && k == LEAP_FRAME_DATA && len == frame, "peeked the data frame");
	}
	OK(leap_peek_prev(b, &data2, &len, &k));
	CHECK(data2 == data, "peeking again shows the same frame");
	OK(leap_recv_prev(b, buf, frame, &len, &k));
	CHECK(k == LEAP_FRAME_DATA && buf[0] == 7, "the peeked data frame is received, in order");
	{
		leap_status s = LEAP_ERR_AGAIN;

		for (int i = 0; i < 1000 && s == LEAP_ERR_AGAIN; i++) {
			s = leap_peek_prev(b, &data, &len, &k);
			if (s == LEAP_ERR_AGAIN)
				usleep(2000);
		}
		CHECK(s == LEAP_OK && k == LEAP_FRAME_CONTROL, "peeked the control frame");
	}
	OK(leap_decode_control(data, len, &got));
	CHECK(got.kind == LEAP_CONTROL_RESIZE_CHAIN && got.ranges[1].end_layer == 32 && got.ranges[1].is_tail == 1,
	      "the control message");
	OK(leap_release(b));
	EXPECT(leap_release(b), LEAP_ERR_STATE, "no frame is lent");
	OK(leap_set_recv_timeout(b, 0));
	EXPECT(leap_peek_prev(b, &data, &len, &k), LEAP_ERR_AGAIN, "leap_ready_fd");
	OK(leap_set_recv_timeout(b, 5000));

	OK(leap_get_stats(b, &st));
	CHECK(st.frames_received == 6 && st.timeouts == 1, "counters: %llu frames, %llu timeouts",
	      (unsigned long long)st.frames_received, (unsigned long long)st.timeouts);
	free(buf);
	free(big);
}

/* The frame length set after opening: what TCP's raw framing reads, and
 * the receive buffer the datagram transports need from then on. */
static void frame_len(leap_transport *a, leap_transport *b, size_t frame)
{
	unsigned char small[1000], out[1000];
	size_t len;
	leap_frame_kind k;

	EXPECT(leap_set_frame_len(NULL, 10), LEAP_ERR_NULL, "transport is NULL");
	EXPECT(leap_set_frame_len(b, 0), LEAP_ERR_SETTING, "frame_size: frames of 0 bytes");
	if (strcmp(kind, "tcp") == 0)
		OK(leap_set_frame_len(b, frame + 1));
	else
		EXPECT(leap_set_frame_len(b, frame + 1), LEAP_ERR_SETTING, "open it with frame_size = 16393");
	OK(leap_set_frame_len(b, sizeof(small)));
	memset(small, 0x5a, sizeof(small));
	OK(leap_send_next(a, small, sizeof(small)));
	OK(recv_wait(b, out, sizeof(out), &len, &k));
	CHECK(len == sizeof(small) && memcmp(out, small, len) == 0, "a frame of %zu bytes into %zu", len, sizeof(out));
	OK(leap_set_frame_len(b, frame));
}

static void closing(leap_transport *a)
{
	unsigned char x = 1;
	size_t len;

	OK(leap_close(a));
	EXPECT(leap_send_next(a, &x, 1), LEAP_ERR_CLOSED, "the transport is closed");
	EXPECT(leap_recv_prev(a, &x, 1, &len, NULL), LEAP_ERR_CLOSED, "the transport is closed");
	EXPECT(leap_close(a), LEAP_ERR_CLOSED, "the transport is closed");
	CHECK(leap_kind(a) == NULL, "no kind once closed");
	leap_free(a);
	leap_free(NULL);
}

struct echo {
	leap_sender *s;
	leap_receiver *r;
	size_t frame;
	int n;
	leap_status st;
	pthread_mutex_t m;
	pthread_cond_t cv;
	int received;
};

/* The receiving half: takes frame i, lets the sender echo it. */
static void *echo_rx(void *arg)
{
	struct echo *e = arg;
	unsigned char *buf = malloc(e->frame);
	size_t len;

	for (int i = 0; i < e->n; i++) {
		leap_status s = leap_receiver_recv_prev(e->r, buf, e->frame, &len, NULL);

		pthread_mutex_lock(&e->m);
		if (s != LEAP_OK || buf[0] != (unsigned char)i)
			e->st = s != LEAP_OK ? s : LEAP_ERR_ARGUMENT;
		e->received = i + 1;
		pthread_cond_signal(&e->cv);
		pthread_mutex_unlock(&e->m);
		if (s != LEAP_OK)
			break;
	}
	free(buf);
	return NULL;
}

/* The sending half: writes frame i in place once it was received. */
static void *echo_tx(void *arg)
{
	struct echo *e = arg;

	for (int i = 0; i < e->n; i++) {
		void *out;

		pthread_mutex_lock(&e->m);
		while (e->received <= i && e->st == LEAP_OK)
			pthread_cond_wait(&e->cv, &e->m);
		pthread_mutex_unlock(&e->m);
		if (e->st != LEAP_OK || leap_sender_send_begin(e->s, e->frame, &out) != LEAP_OK)
			return NULL;
		memset(out, i, e->frame);
		if (leap_sender_send_commit(e->s) != LEAP_OK)
			return NULL;
	}
	return NULL;
}

static void split(size_t frame)
{
	leap_transport *a, *b;
	struct echo e = { .frame = frame, .n = 200, .st = LEAP_OK };
	unsigned char *buf = malloc(frame), *f = malloc(frame);
	pthread_t rx, tx;
	size_t len;
	leap_stats st;

	pair(frame, &a, &b);
	EXPECT(leap_split(b, NULL, &e.r), LEAP_ERR_NULL, "sender is NULL");
	OK(leap_split(b, &e.s, &e.r));
	EXPECT(leap_send_next(b, f, 1), LEAP_ERR_CLOSED, "split: use its leap_sender and leap_receiver");
	EXPECT(leap_split(b, &e.s, &e.r), LEAP_ERR_CLOSED, "was split");
	leap_free(b);
	pthread_mutex_init(&e.m, NULL);
	pthread_cond_init(&e.cv, NULL);
	pthread_create(&rx, NULL, echo_rx, &e);
	pthread_create(&tx, NULL, echo_tx, &e);
	for (int i = 0; i < e.n; i++) {
		memset(f, i, frame);
		CHECK(leap_send_next(a, f, frame) == LEAP_OK, "send %d", i);
		CHECK(recv_wait(a, buf, frame, &len, NULL) == LEAP_OK, "echo %d", i);
		CHECK(len == frame && buf[0] == (unsigned char)i && buf[frame - 1] == (unsigned char)i, "echo %d", i);
	}
	pthread_join(rx, NULL);
	pthread_join(tx, NULL);
	CHECK(e.st == LEAP_OK, "the halves: %s", leap_status_name(e.st));
	printf("ok %d - split halves echoed %d frames from two threads\n", ++passed, e.n);
	OK(leap_receiver_get_stats(e.r, &st));
	CHECK(st.frames_received == (unsigned)e.n && st.frames_sent == (unsigned)e.n, "halves' counters");
	OK(leap_sender_get_stats(e.s, &st));
	EXPECT(leap_receiver_release(e.r), LEAP_ERR_STATE, "no frame is lent");
	EXPECT(leap_sender_send_commit(e.s), LEAP_ERR_STATE, "no frame is begun");
	EXPECT(leap_receiver_set_recv_timeout(e.r, 0), LEAP_OK, "");
	EXPECT(leap_receiver_recv_prev(e.r, buf, frame, &len, NULL), LEAP_ERR_AGAIN, "leap_ready_fd");
	leap_sender_free(e.s);
	leap_receiver_free(e.r);
	leap_sender_free(NULL);
	leap_receiver_free(NULL);
	leap_free(a);
	free(buf);
	free(f);
}

/* A key file in /tmp (0600, as mkstemp makes it) with a random key, or
 * with `text` when not NULL; its path in `path`. */
static void key_file(char path[64], const char *text)
{
	unsigned char k[32];
	char hex[66];
	FILE *r = fopen("/dev/urandom", "rb");

	CHECK(r && fread(k, 1, sizeof(k), r) == sizeof(k), "reading /dev/urandom");
	fclose(r);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", k[i]);
	hex[64] = '\n';
	hex[65] = 0;
	strcpy(path, "/tmp/leap-api-key-XXXXXX");
	int fd = mkstemp(path);
	const char *w = text ? text : hex;
	CHECK(fd >= 0 && write(fd, w, strlen(w)) == (ssize_t)strlen(w), "writing %s", path);
	close(fd);
}

struct rotate {
	const leap_keys *keys;
	const char *current, *previous;
	leap_transport *sender;
	size_t frame;
	leap_status set, sent;
};

/* Another thread: changes the receiver's keys while it waits, then sends. */
static void *rotate_then_send(void *arg)
{
	struct rotate *r = arg;
	unsigned char *f = malloc(r->frame);

	usleep(50 * 1000);
	r->set = leap_keys_set(r->keys, r->current, r->previous);
	memset(f, 0x5a, r->frame);
	r->sent = leap_send_next(r->sender, f, r->frame);
	free(f);
	return NULL;
}

/* One frame a -> b, intact. */
static void one_frame(leap_transport *a, leap_transport *b, unsigned char *f, unsigned char *buf, size_t frame,
		      int i)
{
	size_t len;

	memset(f, i, frame);
	CHECK(leap_send_next(a, f, frame) == LEAP_OK, "keyed send %d", i);
	CHECK(recv_wait(b, buf, frame, &len, NULL) == LEAP_OK, "keyed frame %d", i);
	CHECK(len == frame && memcmp(f, buf, frame) == 0, "keyed frame %d intact", i);
}

/* Rotating a pair's key while it runs: K1 -> K2 with K1 as previous, node
 * by node (the receiver's change made from another thread while it waits
 * in a receive), then K2 alone; frames intact throughout. */
static void keys(size_t frame)
{
	char k1[64], k2[64], bad[64], exposed[64];
	leap_transport *a, *b, *u, *v;
	leap_keys *ka = NULL, *kb = NULL, *none = NULL;
	unsigned char *f = malloc(frame), *buf = malloc(frame);
	struct rotate r = { .frame = frame };
	leap_stats st;
	pthread_t th;
	size_t len;
	int n = 0;

	key_file(k1, NULL);
	key_file(k2, NULL);
	key_file(bad, "not a key\n");
	key_file(exposed, NULL);
	chmod(exposed, 0644);

	pair(frame, &u, &v);
	EXPECT(leap_key_control(u, &none), LEAP_ERR_UNSUPPORTED, "runs without a ring key");
	CHECK(none == NULL, "no handle for an unkeyed transport");
	leap_free(u);
	leap_free(v);

	keyed_pair(frame, k1, &a, &b);
	EXPECT(leap_key_control(NULL, &ka), LEAP_ERR_NULL, "transport is NULL");
	EXPECT(leap_key_control(a, NULL), LEAP_ERR_NULL, "out is NULL");
	OK(leap_key_control(a, &ka));
	OK(leap_key_control(b, &kb));
	EXPECT(leap_keys_set(NULL, k2, NULL), LEAP_ERR_NULL, "keys is NULL");
	EXPECT(leap_keys_set(ka, NULL, NULL), LEAP_ERR_NULL, "key_file is NULL");
	EXPECT(leap_keys_set(ka, "/nonexistent/leap.key", NULL), LEAP_ERR_SETTING, "key_file");
	EXPECT(leap_keys_set(ka, bad, NULL), LEAP_ERR_SETTING, "leap key new");
	EXPECT(leap_keys_set(ka, k2, exposed), LEAP_ERR_SETTING, "chmod 600");
	EXPECT(leap_keys_set(ka, k2, bad), LEAP_ERR_SETTING, "previous_key_file");
	for (; n < 5; n++)
		one_frame(a, b, f, buf, frame, n);

	/* a moves first: it still seals with K1 towards b, not yet heard
	 * under K2; then b, from another thread while this one waits. */
	OK(leap_keys_set(ka, k2, k1));
	for (; n < 10; n++)
		one_frame(a, b, f, buf, frame, n);
	r.keys = kb;
	r.current = k2;
	r.previous = k1;
	r.sender = a;
	pthread_create(&th, NULL, rotate_then_send, &r);
	leap_status got = recv_wait(b, buf, frame, &len, NULL);
	pthread_join(th, NULL);
	CHECK(r.set == LEAP_OK && r.sent == LEAP_OK, "rotation from another thread: %s, send %s",
	      leap_status_name(r.set), leap_status_name(r.sent));
	CHECK(got == LEAP_OK && len == frame && buf[0] == 0x5a && buf[frame - 1] == 0x5a,
	      "the frame sent after the rotation: %s", leap_status_name(got));
	printf("ok %d - keys changed from another thread while a receive waited\n", ++passed);
	for (; n < 15; n++) {
		one_frame(a, b, f, buf, frame, n);
		one_frame(b, a, f, buf, frame, n);
	}
	/* The changeover done: K2 alone on both. */
	OK(leap_keys_set(ka, k2, NULL));
	OK(leap_keys_set(kb, k2, NULL));
	for (; n < 20; n++) {
		one_frame(a, b, f, buf, frame, n);
		one_frame(b, a, f, buf, frame, n);
	}
	printf("ok %d - %d frames intact across K1 -> K2+K1 -> K2\n", ++passed, n);
	/* The keys really changed: b back on K1 alone refuses a's K2 datagrams
	 * (tcp: the connection keeps the key it proved until it reconnects). */
	OK(leap_keys_set(kb, k1, NULL));
	OK(leap_set_recv_timeout(b, 300));
	memset(f, 0x77, frame);
	OK(leap_send_next(a, f, frame));
	got = leap_recv_prev(b, buf, frame, &len, NULL);
	OK(leap_get_stats(b, &st));
	if (strcmp(kind, "tcp") == 0)
		CHECK(got == LEAP_OK && buf[0] == 0x77, "an established connection keeps its key: %s", leap_status_name(got));
	else
		CHECK(got == LEAP_ERR_TIMEOUT && st.drops.bad_tag > 0, "refused under the old key alone: %s, bad_tag %llu",
		      leap_status_name(got), (unsigned long long)st.drops.bad_tag);
	printf("ok %d - back on K1 alone: %s\n", ++passed, strcmp(kind, "tcp") == 0 ? "the connection keeps K2" : "K2 datagrams refused");
	leap_free(a);
	/* The handle outlives the transport; setting keys then harms nothing. */
	OK(leap_keys_set(ka, k1, NULL));
	leap_keys_free(ka);
	leap_keys_free(kb);
	leap_keys_free(NULL);
	leap_free(b);
	unlink(k1);
	unlink(k2);
	unlink(bad);
	unlink(exposed);
	free(f);
	free(buf);
}

int main(int argc, char **argv)
{
	const size_t frame = 16392;
	leap_transport *a, *b;

	if (argc > 1)
		kind = argv[1];
	settings();
	pair(frame, &a, &b);
	frames(a, b, frame);
	frame_len(a, b, frame);
	closing(a);
	leap_free(b);
	split(frame);
	keys(frame);
	printf("%d passed, 0 failed\n", passed);
	return 0;
}
