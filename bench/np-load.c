// SPDX-License-Identifier: Apache-2.0
//
// np-load: the NodePort load generator (bench/nodeport-e2e.ts,
// test/e2e/nodeport-sustained.ts).
//
//   np-load -a ADDR -p PORT (-n COUNT | -d SECONDS) [-r RATE | -c CONCURRENCY]
//           [-w WARMUP] [-t TIMEOUT_MS] [-m rst|fin|server] [-f MAX_FAILED]
//
// Each connection: a non-blocking socket, connect(), a 64-byte request, the
// 64-byte reply (bench/server.c answers it), then the close (-m):
//   rst     (default) close() with SO_LINGER {1,0}: a reset, no TIME_WAIT
//           anywhere; done when close() returns.
//   fin     the client closes first: a plain close() (a FIN; the client holds
//           TIME_WAIT); done when close() returns.
//   server  the server closes first (bench/server.c -c, as an HTTP server
//           answering "Connection: close" does; the server holds TIME_WAIT
//           on the tuple it saw): done when the server's FIN arrives
//           (read() == 0), then close().
// What is timed per connection is from just before connect() to done.
//
// Two ways to make load:
//   closed loop (-c, default 32): CONCURRENCY connections in flight, each
//           followed by the next as soon as it ends. The rate is what the
//           path gives: its saturation rate when CONCURRENCY is enough.
//   open loop (-r): connections start on a fixed schedule, RATE a second
//           (connection i at i / RATE s), however many are in flight and
//           however slow they are: a stall shows as failures, not as a lower
//           rate. A start the generator makes late (it was not scheduled in
//           time, or every descriptor RLIMIT_NOFILE allows was in flight) is
//           still made, and the lateness reported (max_lag_ms).
//           When the schedule ends every connection still in flight is
//           waited for (at most TIMEOUT), so each started one has an outcome.
// -f: stop starting connections once MAX_FAILED have failed ("stopped": true):
// a path that drops everything would otherwise take the whole window and,
// with thousands of SYNs in flight, starve the generator itself.
//
// A connection fails by kind:
//   timeout  not done within TIMEOUT ms (default 1000), by the phase it was
//            in: connect (no SYN-ACK: a SYN dropped, or a SYN retransmit
//            pending), reply, or close (the server's FIN never came)
//   reset    ECONNRESET or EPIPE, or an EOF before the whole reply
//   refused  ECONNREFUSED (a RST answered the SYN)
//   other    any other error (errors: counts by errno name, e.g.
//            EADDRNOTAVAIL: the client ran out of ports)
// A failed or timed-out connection is closed with a reset.
//
// After WARMUP connections (default 200 closed loop, 0 open loop; not
// counted) it counts COUNT connections, or those started in SECONDS.
// Connections are binned by the second (of the counted window) they were
// started in: per_second.{started,completed,timeout,reset,refused,other}.
//
// Output: one JSON line. completed, failed (all kinds), timeout, reset,
// refused, other, timeouts {connect,reply,close}, errors, seconds (the
// counted window; open loop: to the last start, at least the schedule's
// length), rps (completed per second of it), rate (open loop: asked), started,
// stopped (-f),
// max_in_flight, max_lag_ms (open loop), p50_us, p90_us, p99_us, max_us of
// the completed ones, per_second.
// Exit: 0 measured (whatever failed); 1 usage or setup error.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG_SIZE 64
#define MAX_CONC 1024		/* closed loop */
#define MAX_EVENTS 1024
#define MAX_SAMPLES (1 << 24)
#define MAX_ERRNO 134		/* errno values counted by name; beyond: "other" */

enum close_style { CLOSE_RST, CLOSE_FIN, CLOSE_SERVER };
enum phase { IDLE, CONNECTING, REPLY, CLOSING };
enum fail { F_TIMEOUT, F_RESET, F_REFUSED, F_OTHER, F_KINDS };
static const char *fail_names[F_KINDS] = { "timeout", "reset", "refused", "other" };

struct conn {
	int fd;
	enum phase phase;
	int got;
	int counted;
	unsigned gen;		/* bumped at each start: ring entries of an earlier use are stale */
	long bin;		/* per-second bin (counted connections) */
	double started;
};

/* Connections in start order, for the timeouts: the head is the oldest. */
struct ring_entry {
	unsigned idx, gen;
};

static struct {
	struct ring_entry *e;
	size_t cap, head, len;
} ring;

/* Per-second counts, by the second a connection was started in. */
enum { B_STARTED, B_COMPLETED, B_TIMEOUT, B_RESET, B_REFUSED, B_OTHER, B_KINDS };
static const char *bin_names[B_KINDS] = { "started", "completed", "timeout", "reset", "refused", "other" };
static long *bins[B_KINDS];
static long nbins;

static struct sockaddr_in target;
static enum close_style close_style = CLOSE_RST;
static double timeout = 1.0;
static int epfd;
static struct conn *conns;
static unsigned nconns;
static unsigned *free_list;
static unsigned nfree;
static double *samples;
static long nsamples, failed, started_counted, in_flight, max_in_flight;
static long fails[F_KINDS], timeouts[3], errs[MAX_ERRNO + 1];
static int counting;	/* 0 warming up, 2 warm-up just over, 1 counting */
static long warm_left, count_left = -1;
static double t_start;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n);
	if (!p) {
		perror("np-load: realloc");
		exit(1);
	}
	return p;
}

static void bin_add(long bin, int kind)
{
	if (bin < 0)
		return;
	if (bin >= nbins) {
		long n = bin + 64;

		for (int k = 0; k < B_KINDS; k++) {
			bins[k] = xrealloc(bins[k], n * sizeof(long));
			memset(bins[k] + nbins, 0, (n - nbins) * sizeof(long));
		}
		nbins = n;
	}
	bins[kind][bin]++;
}

static void ring_push(unsigned idx, unsigned gen)
{
	if (ring.len == ring.cap) {
		size_t cap = ring.cap ? ring.cap * 2 : 4096;
		struct ring_entry *e = xrealloc(NULL, cap * sizeof(*e));

		for (size_t i = 0; i < ring.len; i++)
			e[i] = ring.e[(ring.head + i) % ring.cap];
		free(ring.e);
		ring.e = e;
		ring.cap = cap;
		ring.head = 0;
	}
	ring.e[(ring.head + ring.len++) % ring.cap] = (struct ring_entry){ idx, gen };
}

/* ok: 1 done, 0 failed (kind, and errno for F_OTHER / the timeout's phase). */
static void finish(struct conn *c, int ok, enum fail kind, int err)
{
	/* A clean close keeps the style asked for; anything else resets, so a
	 * failed connection leaves nothing behind. */
	if (!ok || close_style == CLOSE_RST) {
		struct linger lg = { 1, 0 };

		setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	close(c->fd);
	if (c->counted) {
		if (ok) {
			if (nsamples < MAX_SAMPLES)
				samples[nsamples++] = (now() - c->started) * 1e6;
			bin_add(c->bin, B_COMPLETED);
		} else {
			failed++;
			fails[kind]++;
			bin_add(c->bin, B_TIMEOUT + kind);
			if (kind == F_TIMEOUT)
				timeouts[c->phase == CONNECTING ? 0 : c->phase == REPLY ? 1 : 2]++;
			if (kind == F_OTHER)
				errs[err > 0 && err < MAX_ERRNO ? err : MAX_ERRNO]++;
		}
		if (count_left > 0)
			count_left--;
	} else if (counting == 0 && --warm_left <= 0) {
		counting = 2; /* the main loop starts the clock */
	}
	c->fd = -1;
	c->phase = IDLE;
	c->gen++;
	in_flight--;
	free_list[nfree++] = c - conns;
}

static void fail_errno(struct conn *c, int err)
{
	if (err == ECONNREFUSED)
		finish(c, 0, F_REFUSED, err);
	else if (err == ECONNRESET || err == EPIPE)
		finish(c, 0, F_RESET, err);
	else if (err == ETIMEDOUT)
		finish(c, 0, F_TIMEOUT, err);
	else
		finish(c, 0, F_OTHER, err);
}

/* Starts a connection on a free slot; `sched` is when it was due (its bin). */
static void start(double sched)
{
	struct epoll_event ev = { .events = EPOLLOUT | EPOLLIN };
	struct conn *c = &conns[free_list[--nfree]];
	int one = 1;

	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (c->fd < 0) {
		perror("np-load: socket");
		exit(1);
	}
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->got = 0;
	c->counted = counting == 1;
	c->started = now();
	c->bin = c->counted ? (long)(sched - t_start) : -1;
	c->phase = CONNECTING;
	if (++in_flight > max_in_flight && c->counted)
		max_in_flight = in_flight;
	if (c->counted) {
		started_counted++;
		bin_add(c->bin, B_STARTED);
	}
	ring_push(c - conns, c->gen);
	if (connect(c->fd, (struct sockaddr *)&target, sizeof(target)) < 0 && errno != EINPROGRESS) {
		fail_errno(c, errno);
		return;
	}
	ev.data.ptr = c;
	epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
}

static void step(struct conn *c, uint32_t events)
{
	char buf[MSG_SIZE];

	if (c->phase == CONNECTING) {
		int err = 0;
		socklen_t len = sizeof(err);

		if (events & (EPOLLERR | EPOLLHUP)) {
			getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
			fail_errno(c, err ? err : ECONNRESET);
			return;
		}
		if (!(events & EPOLLOUT))
			return;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };

		memset(buf, 'q', sizeof(buf));
		if (write(c->fd, buf, sizeof(buf)) != sizeof(buf)) {
			fail_errno(c, errno);
			return;
		}
		c->phase = REPLY;
		epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
		return;
	}
	if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
		return;
	for (;;) {
		ssize_t n = read(c->fd, buf, sizeof(buf));

		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			fail_errno(c, errno);
			return;
		}
		if (n == 0) {
			if (c->phase == CLOSING)
				finish(c, 1, 0, 0); /* the server's FIN, after the whole reply */
			else
				finish(c, 0, F_RESET, 0); /* the server ended it before the reply */
			return;
		}
		if (c->phase == REPLY) {
			c->got += n;
			if (c->got < MSG_SIZE)
				continue;
			if (close_style != CLOSE_SERVER) {
				finish(c, 1, 0, 0);
				return;
			}
			c->phase = CLOSING;
		}
		/* CLOSING: bytes past the reply are ignored; wait for the FIN */
	}
}

/* Times out the oldest connections; drops ring entries of finished ones. */
static void expire(double t)
{
	while (ring.len) {
		struct ring_entry *e = &ring.e[ring.head];
		struct conn *c = &conns[e->idx];

		if (c->gen == e->gen) {
			if (t - c->started <= timeout)
				return;
			finish(c, 0, F_TIMEOUT, 0);
		}
		ring.head = (ring.head + 1) % ring.cap;
		ring.len--;
	}
}

static void print_json(double elapsed, double rate, int conc, double max_lag, int stopped)
{
	const char *sep = "";

	qsort(samples, nsamples, sizeof(double), cmp);
#define PCT(p) (nsamples ? samples[(long)((p) / 100.0 * (nsamples - 1))] : 0)
	printf("{\"completed\":%ld,\"failed\":%ld,\"seconds\":%.3f,\"rps\":%.1f,\"started\":%ld,",
	       nsamples, failed, elapsed, elapsed > 0 ? nsamples / elapsed : 0, started_counted);
	if (rate > 0)
		printf("\"rate\":%.1f,\"max_lag_ms\":%.1f,", rate, max_lag * 1e3);
	else
		printf("\"concurrency\":%d,", conc);
	if (stopped)
		printf("\"stopped\":true,");
	printf("\"close\":\"%s\",\"timeout_ms\":%.0f,\"max_in_flight\":%ld,",
	       close_style == CLOSE_RST ? "rst" : close_style == CLOSE_FIN ? "fin" : "server", timeout * 1e3,
	       max_in_flight);
	for (int k = 0; k < F_KINDS; k++)
		printf("\"%s\":%ld,", fail_names[k], fails[k]);
	printf("\"timeouts\":{\"connect\":%ld,\"reply\":%ld,\"close\":%ld},\"errors\":{", timeouts[0], timeouts[1],
	       timeouts[2]);
	for (int e = 0; e <= MAX_ERRNO; e++) {
		if (!errs[e])
			continue;
		const char *name = e < MAX_ERRNO ? strerrorname_np(e) : NULL;

		printf("%s\"%s\":%ld", sep, name ? name : "other", errs[e]);
		sep = ",";
	}
	printf("},\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f,\"per_second\":{", PCT(50), PCT(90),
	       PCT(99), nsamples ? samples[nsamples - 1] : 0);
	/* Only the window's seconds (a late start may land one past it). */
	long shown = nbins;

	while (shown > 0 && bins[B_STARTED][shown - 1] == 0)
		shown--;
	for (int k = 0; k < B_KINDS; k++) {
		printf("%s\"%s\":[", k ? "," : "", bin_names[k]);
		for (long i = 0; i < shown; i++)
			printf("%s%ld", i ? "," : "", bins[k][i]);
		printf("]");
	}
	printf("}}\n");
}

static void usage(void)
{
	fprintf(stderr, "usage: np-load -a ADDR -p PORT (-n COUNT | -d SECONDS) [-r RATE | -c CONC] [-w WARMUP] "
			"[-t TIMEOUT_MS] [-m rst|fin|server]\n");
	exit(1);
}

int main(int argc, char **argv)
{
	const char *addr = NULL;
	int port = 0, conc = 32, opt;
	double seconds = 0, rate = 0;
	long count = 0, warmup = -1, max_failed = -1;
	struct epoll_event evs[MAX_EVENTS];

	while ((opt = getopt(argc, argv, "a:p:d:n:c:r:w:t:m:f:")) != -1) {
		switch (opt) {
		case 'a': addr = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'd': seconds = atof(optarg); break;
		case 'n': count = atol(optarg); break;
		case 'c': conc = atoi(optarg); break;
		case 'r': rate = atof(optarg); break;
		case 'w': warmup = atol(optarg); break;
		case 't': timeout = atoi(optarg) / 1000.0; break;
		case 'f': max_failed = atol(optarg); break;
		case 'm':
			if (!strcmp(optarg, "rst"))
				close_style = CLOSE_RST;
			else if (!strcmp(optarg, "fin"))
				close_style = CLOSE_FIN;
			else if (!strcmp(optarg, "server"))
				close_style = CLOSE_SERVER;
			else
				usage();
			break;
		default:
			usage();
		}
	}
	if (!addr || port <= 0 || (seconds <= 0) == (count <= 0) || conc < 1 || conc > MAX_CONC || rate < 0 ||
	    timeout <= 0) {
		fprintf(stderr, "np-load: -a, -p and one of -n, -d are required; 1 <= -c <= %d; -r, -t > 0\n",
			MAX_CONC);
		return 1;
	}
	if (warmup < 0)
		warmup = rate > 0 ? 0 : 200;
	target.sin_family = AF_INET;
	target.sin_port = htons(port);
	if (inet_pton(AF_INET, addr, &target.sin_addr) != 1) {
		fprintf(stderr, "np-load: bad address %s\n", addr);
		return 1;
	}
	/* Open loop: as many slots as can be in flight, every connection ending
	 * within the timeout, and a late generator's catch-up burst beside them;
	 * at most what RLIMIT_NOFILE allows. A start that finds no free slot
	 * waits for one: it is late, and max_lag_ms and the rate show it. */
	struct rlimit rl;

	nconns = rate > 0 ? (unsigned)(rate * (timeout + 0.25)) + 1024 : (unsigned)conc;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && nconns + 64 > rl.rlim_cur) {
		if (rate <= 0 || rl.rlim_cur < 64 + 1024) {
			fprintf(stderr, "np-load: %u connections need more descriptors than RLIMIT_NOFILE %lu\n", nconns,
				(unsigned long)rl.rlim_cur);
			return 1;
		}
		nconns = rl.rlim_cur - 64;
	}
	conns = calloc(nconns, sizeof(*conns));
	free_list = calloc(nconns, sizeof(*free_list));
	samples = malloc(sizeof(double) * MAX_SAMPLES);
	epfd = epoll_create1(0);
	if (!conns || !free_list || !samples || epfd < 0) {
		perror("np-load: setup");
		return 1;
	}
	for (unsigned i = 0; i < nconns; i++) {
		conns[i].fd = -1;
		free_list[nfree++] = nconns - 1 - i;
	}

	double t_end = 1e18, elapsed, max_lag = 0, t0 = now(), last_start = 0;
	long total = count > 0 ? count : seconds > 0 && rate > 0 ? (long)(seconds * rate) : -1;
	long scheduled = 0; /* open loop: counted starts made */
	int stopped = 0;
	long warm_sched = 0;

	warm_left = warmup;
	counting = warmup > 0 ? 0 : 2;
	if (count > 0)
		count_left = count;
	for (;;) {
		double t = now();

		if (counting == 2) {
			/* the warm-up is over: connections started from now on are counted */
			counting = 1;
			t_start = t;
			if (seconds > 0)
				t_end = t + seconds;
		}
		if (max_failed >= 0 && failed >= max_failed && !stopped) {
			stopped = 1;
			if (rate <= 0)
				break;
			total = scheduled; /* open loop: drain what is in flight */
		}
		if (rate > 0) {
			/* Open loop: every start that is due, late or not. */
			if (counting == 0) {
				while (warm_sched < warmup && t0 + warm_sched / rate <= t && nfree) {
					start(t);
					warm_sched++;
				}
			} else {
				while (scheduled < total && nfree) {
					double due = t_start + scheduled / rate;

					if (due > t)
						break;
					if (t - due > max_lag)
						max_lag = t - due;
					start(due);
					last_start = now();
					scheduled++;
				}
			}
			if (counting == 1 && scheduled >= total && in_flight == 0)
				break;
		} else {
			if (t >= t_end || count_left == 0)
				break;
			/* closed loop: the slots are the connections in flight; refill
			 * them (once each a turn: a connect() that fails at once frees its
			 * slot again) */
			for (unsigned i = 0; i < nconns && nfree && count_left != 0; i++)
				start(now());
		}
		int n = epoll_wait(epfd, evs, MAX_EVENTS, 1);

		for (int i = 0; i < n; i++)
			step(evs[i].data.ptr, evs[i].events);
		expire(now());
	}
	if (rate > 0) {
		/* the schedule's length, or longer if the last starts were late */
		elapsed = stopped ? 0 : total / rate;
		if (last_start - t_start > elapsed)
			elapsed = last_start - t_start;
	} else {
		elapsed = now() - t_start;
	}
	print_json(elapsed, rate, conc, max_lag, stopped);
	return 0;
}
