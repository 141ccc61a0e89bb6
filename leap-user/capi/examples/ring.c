/*
 * ring.c: one stage of a model split layer-wise, on libleap.
 *
 * The head sends every step's frame (an 8-byte header {pos, flags} and dim
 * floats) with leap_send_multipart_next and waits for it to come back round
 * the ring with leap_recv_prev, as the original engine does; it checks every
 * returned frame. A worker takes each frame lent (leap_recv_prev_lent),
 * writes its output in place where the transport sends from
 * (leap_send_begin / leap_send_commit), adding 1 to every activation, and
 * gives the input back: no copy of its own. Halfway, the head sends a
 * RESIZE_CHAIN control message that every worker applies and forwards.
 *
 *   ring --kind udp --role worker --listen 127.0.0.1:9002 \
 *        --next 127.0.0.1:9003 --prev 127.0.0.1:9001 [--frames N] [--dim D]
 *   ring --kind udp --role head --listen 127.0.0.1:9001 \
 *        --next 127.0.0.1:9002 --prev 127.0.0.1:9003 --workers 2 ...
 *
 * More settings with --set key=value (the node file's [transport] keys);
 * --frame-size BYTES instead of --dim (8 + 4 * dim bytes).
 *
 * With --copy, every node does what `leap ring`'s do (the protocol of
 * `leap bench --ring-program`): the head writes each frame where the
 * transport sends it from and reads it where it arrived, without a
 * control round; workers pass frames on unchanged.
 *
 * A worker prints `ready` once its transport is open. Each node prints one
 * JSON line at the end (the head's with rtt_us and the counters); exits 0
 * when every frame came back intact.
 *
 * Build: cc ring.c $(pkg-config --cflags --libs leap) -o ring
 */

#define _POSIX_C_SOURCE 200809L

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <leap.h>

#define MAX_SETS 32

struct header {
	int32_t pos;
	int32_t flags;
};

static int fail(const char *what, leap_status s)
{
	fprintf(stderr, "ring: %s: %s: %s\n", what, leap_status_name(s), leap_last_error());
	return 1;
}

static float activation(int32_t pos, size_t i)
{
	return (float)((pos * 31 + (int32_t)i) % 1024);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The transport's counters that `leap bench` adds up, as a JSON object. */
static void print_stats(const leap_stats *st)
{
	printf("{\"frames_sent\":%llu,\"frames_received\":%llu,\"datagrams_sent\":%llu,\"bytes_received\":%llu,"
	       "\"copied_bytes\":%llu,\"frames_lost\":%llu,\"retransmits\":%llu}",
	       (unsigned long long)st->frames_sent, (unsigned long long)st->frames_received,
	       (unsigned long long)st->datagrams_sent, (unsigned long long)st->bytes_received,
	       (unsigned long long)st->copied_bytes, (unsigned long long)st->frames_lost,
	       (unsigned long long)st->retransmits);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The control message the head sends: worker w takes layers [8w, 8w+8). */
static leap_control chain(int workers)
{
	leap_control m;
	int w;

	memset(&m, 0, sizeof(m));
	m.kind = LEAP_CONTROL_RESIZE_CHAIN;
	m.total_workers = workers;
	for (w = 0; w < workers; w++) {
		m.ranges[w].start_layer = 8 * w;
		m.ranges[w].end_layer = 8 * w + 8;
		m.ranges[w].is_tail = w == workers - 1;
	}
	return m;
}

/* With --copy the workers pass frames on unchanged (as `leap ring`'s do,
 * for comparisons): each adds nothing. */
static int copy_only;

/* Prints the head's JSON line: every frame came back intact in `elapsed`
 * microseconds, with these round trips (sorted here). */
static int head_report(leap_transport *t, long frames, double *rtt, double elapsed, int control_back)
{
	leap_stats st;
	leap_status s;
	double sum = 0;
	long i;

	if ((s = leap_get_stats(t, &st)) != LEAP_OK)
		return fail("leap_get_stats", s);
	qsort(rtt, frames, sizeof(double), cmp_double);
	for (i = 0; i < frames; i++)
		sum += rtt[i];
	printf("{\"role\":\"head\",\"kind\":\"%s\",\"frames\":%ld,\"intact\":%ld,\"control_back\":%s,"
	       "\"p50_us\":%.1f,\"p99_us\":%.1f,\"frames_lost\":%llu,\"retransmits\":%llu,"
	       "\"frames_sent\":%ld,\"frames_delivered\":%ld,\"frames_corrupt\":0,\"elapsed_s\":%.6f,"
	       "\"rtt_us\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f,\"mean\":%.3f},\"stats\":",
	       leap_kind(t), frames, frames, control_back ? "true" : "false", rtt[frames / 2],
	       rtt[frames * 99 / 100], (unsigned long long)st.frames_lost, (unsigned long long)st.retransmits,
	       frames, frames, elapsed / 1e6, rtt[frames / 2], rtt[frames * 9 / 10], rtt[frames * 99 / 100],
	       rtt[frames - 1], sum / frames);
	print_stats(&st);
	printf("}\n");
	return 0;
}

/* How long a node waits for a frame (over several receive deadlines)
 * before it gives up: a worker's head may start long after it. */
#define WORKER_IDLE_US 20e6

/* Frame pos carries payload pattern pos % PATTERNS (as `leap ring`'s head:
 * chunks of neighbouring frames mixed into one are caught). */
#define PATTERNS 4

/* The head as `leap ring`'s (--copy): each frame written where the
 * transport sends it from (leap_send_begin), read where it arrived
 * (leap_recv_prev_lent) and compared byte for byte; no control round. */
static int run_head_lent(leap_transport *t, long frames, size_t dim)
{
	size_t payload = dim * sizeof(float), frame_len = sizeof(struct header) + payload, i;
	unsigned char *pat = malloc(PATTERNS * payload);
	double *rtt = malloc(frames * sizeof(double)), started;
	leap_status s;
	long pos;
	int k;

	if (!pat || !rtt)
		return 1;
	for (k = 0; k < PATTERNS; k++) {
		for (i = 0; i < dim; i++) {
			float v = activation(k, i);

			memcpy(pat + k * payload + i * sizeof(float), &v, sizeof(v));
		}
	}
	started = now_us();
	for (pos = 0; pos < frames; pos++) {
		struct header h = { (int32_t)pos, 1 }, got = { -1, 0 };
		const unsigned char *want = pat + (pos % PATTERNS) * payload;
		const void *in;
		void *out;
		size_t len;
		leap_frame_kind kind;
		double t0 = now_us();

		if ((s = leap_send_begin(t, frame_len, &out)) != LEAP_OK)
			return fail("leap_send_begin", s);
		memcpy(out, &h, sizeof(h));
		memcpy((unsigned char *)out + sizeof(h), want, payload);
		if ((s = leap_send_commit(t)) != LEAP_OK)
			return fail("leap_send_commit", s);
		/* A deadline is no failure while the ring may still answer. */
		while ((s = leap_recv_prev_lent(t, &in, &len, &kind)) == LEAP_ERR_TIMEOUT && now_us() - t0 < WORKER_IDLE_US)
			;
		if (s != LEAP_OK)
			return fail("leap_recv_prev_lent", s);
		rtt[pos] = now_us() - t0;
		memcpy(&got, in, len < sizeof(got) ? 0 : sizeof(got));
		if (kind != LEAP_FRAME_DATA || len != frame_len || got.pos != h.pos || got.flags != h.flags ||
		    memcmp((const unsigned char *)in + sizeof(h), want, payload) != 0) {
			fprintf(stderr, "ring: frame %ld came back as %zu bytes of kind %d, other bytes\n", pos, len,
				(int)kind);
			leap_release(t);
			return 1;
		}
		if ((s = leap_release(t)) != LEAP_OK)
			return fail("leap_release", s);
	}
	s = head_report(t, frames, rtt, now_us() - started, 0);
	free(pat);
	free(rtt);
	return s;
}

static int run_head(leap_transport *t, long frames, size_t dim, int workers)
{
	float added = copy_only ? 0.0f : (float)workers;

	size_t frame_len = sizeof(struct header) + dim * sizeof(float);
	float *act = malloc(dim * sizeof(float));
	unsigned char *back = malloc(frame_len);
	double *rtt = malloc(frames * sizeof(double));
	leap_status s;
	long pos;
	int control_back = 0;
	double started = now_us();

	if (!act || !back || !rtt)
		return 1;
	for (pos = 0; pos < frames; pos++) {
		struct header h = { (int32_t)pos, 1 };
		size_t len, i;
		leap_frame_kind kind;
		double t0;

		if (pos == frames / 2) {
			leap_control m = chain(workers), got;

			if ((s = leap_send_control(t, &m, frame_len)) != LEAP_OK)
				return fail("leap_send_control", s);
			if ((s = leap_recv_prev(t, back, frame_len, &len, &kind)) != LEAP_OK)
				return fail("leap_recv_prev (control)", s);
			if (kind != LEAP_FRAME_CONTROL || (s = leap_decode_control(back, len, &got)) != LEAP_OK)
				return fail("the control message did not come back", s);
			if (got.worker_index != workers || got.total_workers != workers) {
				fprintf(stderr, "ring: control came back with worker_index %d of %d\n",
					got.worker_index, got.total_workers);
				return 1;
			}
			control_back = 1;
		}
		for (i = 0; i < dim; i++)
			act[i] = activation(h.pos, i);
		t0 = now_us();
		s = leap_send_multipart_next(t, &h, sizeof(h), act, dim * sizeof(float));
		if (s != LEAP_OK)
			return fail("leap_send_multipart_next", s);
		s = leap_recv_prev(t, back, frame_len, &len, &kind);
		if (s != LEAP_OK)
			return fail("leap_recv_prev", s);
		rtt[pos] = now_us() - t0;
		if (kind != LEAP_FRAME_DATA || len != frame_len) {
			fprintf(stderr, "ring: frame %ld came back as %zu bytes of kind %d\n", pos, len, (int)kind);
			return 1;
		}
		memcpy(&h, back, sizeof(h));
		if (h.pos != pos) {
			fprintf(stderr, "ring: frame %ld came back as pos %d (out of order)\n", pos, h.pos);
			return 1;
		}
		for (i = 0; i < dim; i++) {
			float v;

			memcpy(&v, back + sizeof(h) + i * sizeof(float), sizeof(v));
			if (v != activation(h.pos, i) + added) {
				fprintf(stderr, "ring: frame %ld activation %zu is %f, not %f\n", pos, i, v,
					activation(h.pos, i) + added);
				return 1;
			}
		}
	}
	s = head_report(t, frames, rtt, now_us() - started, control_back);
	free(act);
	free(back);
	free(rtt);
	return s;
}

static int run_worker(leap_transport *t, long frames, int index)
{
	unsigned long long copied0 = 0, bytes0 = 0;
	leap_stats st;
	leap_status s;
	long relayed = 0;
	double last = now_us();

	while (relayed < frames) {
		const void *in;
		void *out;
		size_t len, i;
		leap_frame_kind kind;

		s = leap_recv_prev_lent(t, &in, &len, &kind);
		if (s == LEAP_ERR_TIMEOUT && now_us() - last < WORKER_IDLE_US)
			continue;
		if (s != LEAP_OK)
			return fail("leap_recv_prev_lent", s);
		last = now_us();
		if (kind == LEAP_FRAME_CONTROL) {
			leap_control m;

			if ((s = leap_decode_control(in, len, &m)) != LEAP_OK)
				return fail("leap_decode_control", s);
			if (m.kind == LEAP_CONTROL_RESIZE_CHAIN && m.worker_index < m.total_workers) {
				/* This worker's layers are now ranges[worker_index]. */
				if (m.worker_index != index)
					fprintf(stderr, "ring: worker %d got the range of worker %d\n", index,
						m.worker_index);
				m.worker_index++;
			}
			s = leap_send_control(t, &m, len);
			leap_release(t);
			if (s != LEAP_OK)
				return fail("leap_send_control", s);
			continue;
		}
		if (len < sizeof(struct header))
			return fail("a frame shorter than its header", LEAP_ERR_ARGUMENT);
		/* Write the output where the transport sends it from. */
		if ((s = leap_send_begin(t, len, &out)) != LEAP_OK)
			return fail("leap_send_begin", s);
		memcpy(out, in, copy_only ? len : sizeof(struct header));
		for (i = sizeof(struct header); !copy_only && i + sizeof(float) <= len; i += sizeof(float)) {
			float v;

			memcpy(&v, (const unsigned char *)in + i, sizeof(v));
			v += 1.0f;
			memcpy((unsigned char *)out + i, &v, sizeof(v));
		}
		if ((s = leap_send_commit(t)) != LEAP_OK)
			return fail("leap_send_commit", s);
		if ((s = leap_release(t)) != LEAP_OK)
			return fail("leap_release", s);
		relayed++;
		if (relayed == 10 && leap_get_stats(t, &st) == LEAP_OK) {
			copied0 = st.copied_bytes;
			bytes0 = st.bytes_received;
		}
	}
	if ((s = leap_get_stats(t, &st)) != LEAP_OK)
		return fail("leap_get_stats", s);
	printf("{\"role\":\"worker\",\"index\":%d,\"kind\":\"%s\",\"relayed\":%ld,\"copies_per_hop\":%.3f,\"stats\":",
	       index, leap_kind(t), relayed,
	       st.bytes_received > bytes0 ? (double)(st.copied_bytes - copied0) / (double)(st.bytes_received - bytes0)
					  : 0.0);
	print_stats(&st);
	printf("}\n");
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: ring --kind KIND --role head|worker --listen ADDR:PORT --next ADDR:PORT "
			"--prev ADDR:PORT [--frames N] [--dim D | --frame-size BYTES] [--workers N] [--index I] [--copy] "
			"[--set KEY=VALUE]...\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "kind", required_argument, 0, 'k' },	  { "role", required_argument, 0, 'r' },
		{ "listen", required_argument, 0, 'l' },  { "next", required_argument, 0, 'n' },
		{ "prev", required_argument, 0, 'p' },	  { "frames", required_argument, 0, 'f' },
		{ "dim", required_argument, 0, 'd' },	  { "workers", required_argument, 0, 'w' },
		{ "index", required_argument, 0, 'i' },	  { "set", required_argument, 0, 's' },
		{ "copy", no_argument, 0, 'c' },	  { "frame-size", required_argument, 0, 'F' },
		{ 0, 0, 0, 0 },
	};
	const char *kind = NULL, *role = NULL, *listen = NULL, *next = NULL, *prev = NULL;
	char *sets[MAX_SETS];
	int nsets = 0, workers = 2, index = 0, c, i, rc;
	long frames = 1000;
	size_t dim = 4096;
	char frame_size[32];
	leap_config *cfg;
	leap_transport *t;
	leap_status s;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'k': kind = optarg; break;
		case 'r': role = optarg; break;
		case 'l': listen = optarg; break;
		case 'n': next = optarg; break;
		case 'p': prev = optarg; break;
		case 'f': frames = atol(optarg); break;
		case 'd': dim = (size_t)atol(optarg); break;
		case 'w': workers = atoi(optarg); break;
		case 'i': index = atoi(optarg); break;
		case 'c': copy_only = 1; break;
		case 'F': {
			long bytes = atol(optarg);

			if (bytes < (long)sizeof(struct header) + 4 || (bytes - (long)sizeof(struct header)) % 4 != 0) {
				fprintf(stderr, "ring: --frame-size %s: give 8 + 4 * dim bytes (16392 for dim 4096)\n",
					optarg);
				return 2;
			}
			dim = (size_t)(bytes - (long)sizeof(struct header)) / sizeof(float);
			break;
		}
		case 's':
			if (nsets == MAX_SETS)
				return usage(), 2;
			sets[nsets++] = optarg;
			break;
		default: return usage(), 2;
		}
	}
	if (!kind || !role || !listen || !next || !prev || frames < 2 || dim == 0)
		return usage(), 2;

	if ((s = leap_config_new(kind, &cfg)) != LEAP_OK)
		return fail("leap_config_new", s);
	snprintf(frame_size, sizeof(frame_size), "%zu", sizeof(struct header) + dim * sizeof(float));
	if ((s = leap_config_set(cfg, "listen", listen)) != LEAP_OK ||
	    (s = leap_config_set(cfg, "next", next)) != LEAP_OK ||
	    (s = leap_config_set(cfg, "prev", prev)) != LEAP_OK ||
	    (s = leap_config_set(cfg, "frame_size", frame_size)) != LEAP_OK ||
	    /* A stalled ring fails instead of hanging. */
	    (s = leap_config_set(cfg, "recv_timeout_ms", "20000")) != LEAP_OK)
		return fail("leap_config_set", s);
	for (i = 0; i < nsets; i++) {
		char *eq = strchr(sets[i], '=');

		if (!eq)
			return usage(), 2;
		*eq = '\0';
		if ((s = leap_config_set(cfg, sets[i], eq + 1)) != LEAP_OK)
			return fail(sets[i], s);
	}
	s = leap_open(cfg, &t);
	leap_config_free(cfg);
	if (s != LEAP_OK)
		return fail("leap_open", s);

	if (strcmp(role, "head") == 0) {
		rc = copy_only ? run_head_lent(t, frames, dim) : run_head(t, frames, dim, workers);
	} else {
		/* For whoever starts the head: this worker takes frames now. */
		printf("ready\n");
		fflush(stdout);
		rc = run_worker(t, frames, index);
	}
	leap_free(t);
	return rc;
}
