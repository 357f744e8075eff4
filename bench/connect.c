// SPDX-License-Identifier: Apache-2.0
//
// connect: TCP connection latency client of the lbctl benchmark.
//
//   connect -a ADDR -p PORT -n COUNT [-w WARMUP] [-m cc|rr] [-s SANITY]
//           [-l] [-c CPU] [-t TIMEOUT_MS]
//
// One iteration, on a blocking socket:
//   cc: socket(); connect(); close()
//   rr: socket(); connect(); write(64-byte request); read(64-byte reply); close()
//   us: sendto(64-byte datagram) on one unconnected UDP socket, made once
//       (every datagram runs cgroup/sendmsg4 or 6; nothing needs to answer)
//
// What is timed (CLOCK_MONOTONIC), and reported as "timed" in the JSON:
//   from just before connect() to just after close(). socket() and the
//   setsockopt() calls (SO_LINGER, timeouts) are done before the clock starts.
//
// close() resets the connection (SO_LINGER {1,0}): no FIN handshake and no
// TIME_WAIT, so tens of thousands of iterations in one namespace never run
// out of ephemeral ports. -l turns that off (normal FIN close; the client then
// holds TIME_WAIT for every connection, ~28k ports per destination per 60 s).
//
// Sequence: SANITY untimed iterations that must all succeed (default 20),
// then WARMUP untimed iterations (default 1000, failures ignored), then COUNT
// timed iterations. Output: one JSON line on stdout.
//
// Exit codes:
//   0  measured; at most 1% of the timed iterations failed
//   1  usage or setup error (bad arguments, out of memory, sched_setaffinity)
//   2  a sanity iteration failed: {"error": "...", "sanityOk": k} on stdout
//   3  measured, but more than 1% of the timed iterations failed
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MSG_SIZE 64 /* request and reply size, bytes (server.c agrees) */

static const char *prog = "connect";

struct target {
	struct sockaddr_storage ss;
	socklen_t len;
	int family;
	char shown[INET6_ADDRSTRLEN + 8 + 3]; /* "[addr]:port" */
};

struct opts {
	int rr;           /* 0: connect+close, 1: request/reply */
	int udp;          /* 1: sendto on one UDP socket (mode us) */
	int linger_rst;   /* close with SO_LINGER {1,0} */
	struct timeval timeout; /* connect/send/recv timeout, 0 = none */
};

static void usage(void)
{
	fprintf(stderr,
		"usage: %s -a ADDR -p PORT -n COUNT [-w WARMUP] [-m cc|rr] [-s SANITY] [-l] [-c CPU] [-t MS]\n"
		"  -a ADDR    server IPv4 or IPv6 address\n"
		"  -p PORT    server TCP port\n"
		"  -n COUNT   timed iterations\n"
		"  -w WARMUP  untimed iterations before measuring (default 1000)\n"
		"  -m MODE    cc: connect+close (default); rr: connect+64B request/reply+close;\n"
		"             us: 64B sendto() on one unconnected UDP socket\n"
		"  -s SANITY  leading iterations that must all succeed (default 20)\n"
		"  -l         normal FIN close instead of RST (SO_LINGER {1,0})\n"
		"  -c CPU     pin to CPU with sched_setaffinity\n"
		"  -t MS      connect/read/write timeout in ms (default 5000, 0 = none)\n",
		prog);
	exit(1);
}

static long parse_long(const char *s, const char *what, long min, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || errno || v < min || v > max) {
		fprintf(stderr, "%s: invalid %s '%s' (want %ld..%ld)\n", prog, what, s, min, max);
		exit(1);
	}
	return v;
}

static inline int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Error of the last failed iteration, "<what> <addr>: <strerror>". */
static char last_err[256];

static void set_err(const struct target *t, const char *what, int err)
{
	/* connect() that runs into SO_SNDTIMEO fails with EINPROGRESS. */
	const char *msg = (err == EINPROGRESS || err == EAGAIN) ? "timed out" : strerror(err);

	snprintf(last_err, sizeof(last_err), "%s %s: %s", what, t->shown, msg);
}

/* Creates and configures the socket, outside the timed region. */
static int new_socket(const struct target *t, const struct opts *o)
{
	int fd = socket(t->family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0) {
		set_err(t, "socket", errno);
		return -1;
	}
	if (o->linger_rst) {
		struct linger lg = { .l_onoff = 1, .l_linger = 0 };

		if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
			goto fail;
	}
	if (o->timeout.tv_sec || o->timeout.tv_usec) {
		/* SO_SNDTIMEO also bounds a blocking connect(). */
		if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &o->timeout, sizeof(o->timeout)) < 0 ||
		    (o->rr && setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &o->timeout, sizeof(o->timeout)) < 0))
			goto fail;
	}
	return fd;
fail:
	set_err(t, "setsockopt", errno);
	close(fd);
	return -1;
}

/* One iteration on an already created socket; always closes fd. Returns the
 * time from connect() to the end of close() in ns, or -1 on failure (with
 * last_err set). */
static int64_t iteration(int fd, const struct target *t, const struct opts *o)
{
	static const char request[MSG_SIZE] = { 'q' };
	char reply[MSG_SIZE];
	int64_t t0, t1;

	t0 = now_ns();
	if (connect(fd, (const struct sockaddr *)&t->ss, t->len) < 0) {
		set_err(t, "connect", errno);
		goto fail;
	}
	if (o->rr) {
		ssize_t n = write(fd, request, sizeof(request));

		if (n != sizeof(request)) {
			set_err(t, "write", n < 0 ? errno : EIO);
			goto fail;
		}
		for (size_t got = 0; got < sizeof(reply); got += (size_t)n) {
			n = read(fd, reply + got, sizeof(reply) - got);
			if (n <= 0) {
				if (n < 0 && errno == EINTR) {
					n = 0;
					continue;
				}
				if (n == 0)
					snprintf(last_err, sizeof(last_err),
						 "read %s: connection closed after %zu of %d reply bytes",
						 t->shown, got, MSG_SIZE);
				else
					set_err(t, "read", errno);
				goto fail;
			}
		}
	}
	close(fd);
	t1 = now_ns();
	return t1 - t0;
fail:
	close(fd);
	return -1;
}

/* Mode us: the one UDP socket every datagram goes out on. */
static int udp_fd = -1;

/* One datagram; returns the time sendto() took in ns, or -1 (last_err set). */
static int64_t udp_iteration(const struct target *t)
{
	static const char datagram[MSG_SIZE] = { 'u' };
	int64_t t0, t1;

	t0 = now_ns();
	if (sendto(udp_fd, datagram, sizeof(datagram), 0, (const struct sockaddr *)&t->ss, t->len) != sizeof(datagram)) {
		set_err(t, "sendto", errno);
		return -1;
	}
	t1 = now_ns();
	return t1 - t0;
}

static int64_t run_once(const struct target *t, const struct opts *o)
{
	int fd;

	if (o->udp)
		return udp_iteration(t);
	fd = new_socket(t, o);
	return fd < 0 ? -1 : iteration(fd, t, o);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted[0..n), per-mille: rank = ceil(n*pm/1000). */
static double pct_us(const int64_t *sorted, size_t n, unsigned pm)
{
	if (n == 0)
		return 0;
	size_t rank = (n * pm + 999) / 1000;

	if (rank < 1)
		rank = 1;
	return (double)sorted[rank - 1] / 1000.0;
}

/* Writes s as a JSON string body (quotes and control characters escaped). */
static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

int main(int argc, char **argv)
{
	const char *addr_str = NULL;
	long port = -1, count = -1, warmup = 1000, sanity = 20, cpu = -1, timeout_ms = 5000;
	struct opts o = { .rr = 0, .linger_rst = 1 };
	int opt;

	while ((opt = getopt(argc, argv, "a:p:n:w:m:s:lc:t:h")) != -1) {
		switch (opt) {
		case 'a': addr_str = optarg; break;
		case 'p': port = parse_long(optarg, "port", 1, 65535); break;
		case 'n': count = parse_long(optarg, "count", 1, 100000000); break;
		case 'w': warmup = parse_long(optarg, "warmup", 0, 100000000); break;
		case 's': sanity = parse_long(optarg, "sanity count", 0, 100000000); break;
		case 'c': cpu = parse_long(optarg, "cpu", 0, CPU_SETSIZE - 1); break;
		case 't': timeout_ms = parse_long(optarg, "timeout", 0, 3600000); break;
		case 'l': o.linger_rst = 0; break;
		case 'm':
			if (strcmp(optarg, "cc") == 0)
				o.rr = 0;
			else if (strcmp(optarg, "rr") == 0)
				o.rr = 1;
			else if (strcmp(optarg, "us") == 0)
				o.udp = 1;
			else {
				fprintf(stderr, "%s: invalid mode '%s' (want cc, rr or us)\n", prog, optarg);
				return 1;
			}
			break;
		default:
			usage();
		}
	}
	if (!addr_str || port < 0 || count < 0 || optind != argc)
		usage();
	o.timeout.tv_sec = timeout_ms / 1000;
	o.timeout.tv_usec = (timeout_ms % 1000) * 1000;

	struct target t;

	memset(&t, 0, sizeof(t));
	struct sockaddr_in *sin = (struct sockaddr_in *)&t.ss;
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&t.ss;

	if (inet_pton(AF_INET, addr_str, &sin->sin_addr) == 1) {
		t.family = sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)port);
		t.len = sizeof(*sin);
		snprintf(t.shown, sizeof(t.shown), "%s:%ld", addr_str, port);
	} else if (inet_pton(AF_INET6, addr_str, &sin6->sin6_addr) == 1) {
		t.family = sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t)port);
		t.len = sizeof(*sin6);
		snprintf(t.shown, sizeof(t.shown), "[%s]:%ld", addr_str, port);
	} else {
		fprintf(stderr, "%s: invalid address '%s' (want IPv4 or IPv6)\n", prog, addr_str);
		return 1;
	}

	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET((int)cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) < 0) {
			fprintf(stderr, "%s: sched_setaffinity cpu %ld: %s\n", prog, cpu, strerror(errno));
			return 1;
		}
	}
	signal(SIGPIPE, SIG_IGN); /* write() to a reset server: EPIPE, not death */

	/* Preallocate and touch the samples so page faults stay out of the
	 * measurement. */
	int64_t *samples = calloc((size_t)count, sizeof(*samples));

	if (!samples) {
		fprintf(stderr, "%s: calloc %ld samples: %s\n", prog, count, strerror(errno));
		return 1;
	}
	for (long i = 0; i < count; i++)
		samples[i] = 0;

	const char *mode = o.udp ? "us" : o.rr ? "rr" : "cc";
	const char *timed = o.udp ? "sendto(64)" : o.rr ? "connect()+write(64)+read(64)+close()" : "connect()+close()";

	if (o.udp) {
		udp_fd = socket(t.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (udp_fd < 0) {
			fprintf(stderr, "%s: socket: %s\n", prog, strerror(errno));
			return 1;
		}
	}

	/* Sanity: every one must work, or the numbers would measure a broken
	 * path (nothing listening, translation not in place, ...). */
	for (long i = 0; i < sanity; i++) {
		if (run_once(&t, &o) < 0) {
			fprintf(stderr, "%s: sanity iteration %ld: %s\n", prog, i + 1, last_err);
			printf("{\"error\":");
			json_str(last_err);
			printf(",\"sanityOk\":%ld}\n", i);
			fflush(stdout);
			return 2;
		}
	}

	for (long i = 0; i < warmup; i++) {
		run_once(&t, &o);
		sched_yield();
	}

	size_t ok = 0;
	long failed = 0;

	for (long i = 0; i < count; i++) {
		int64_t ns = run_once(&t, &o);

		if (ns < 0) {
			if (failed++ < 5)
				fprintf(stderr, "%s: timed iteration %ld: %s\n", prog, i + 1, last_err);
			continue;
		}
		samples[ok++] = ns;
		/* Client and server share a CPU: let the server finish with this
		 * connection (accept, close) before the next one is timed, so its
		 * work never lands inside one iteration and not another (without
		 * this, samples split into two groups ~2x apart and the p50 flips
		 * between them from run to run). */
		sched_yield();
	}
	if (failed > 5)
		fprintf(stderr, "%s: %ld of %ld timed iterations failed, last: %s\n",
			prog, failed, count, last_err);

	qsort(samples, ok, sizeof(*samples), cmp_i64);
	double sum = 0;

	for (size_t i = 0; i < ok; i++)
		sum += (double)samples[i];

	printf("{\"mode\":\"%s\",\"timed\":\"%s\",\"count\":%ld,\"failed\":%ld,"
	       "\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,"
	       "\"min_us\":%.2f,\"mean_us\":%.2f,\"max_us\":%.2f}\n",
	       mode, timed, count, failed,
	       pct_us(samples, ok, 500), pct_us(samples, ok, 900),
	       pct_us(samples, ok, 990), pct_us(samples, ok, 999),
	       ok ? (double)samples[0] / 1000.0 : 0.0,
	       ok ? sum / (double)ok / 1000.0 : 0.0,
	       ok ? (double)samples[ok - 1] / 1000.0 : 0.0);
	fflush(stdout);
	free(samples);

	/* More than 1% failed: failed * 100 > count. */
	return failed * 100 > count ? 3 : 0;
}
