// SPDX-License-Identifier: Apache-2.0
//
// np-load: the NodePort benchmark's load generator (bench/nodeport-e2e.ts).
//
//   np-load -a ADDR -p PORT (-n COUNT | -d SECONDS) [-c CONCURRENCY] [-w WARMUP] [-t TIMEOUT_MS]
//
// Keeps CONCURRENCY connections in flight, each: a non-blocking socket,
// connect(), a 64-byte request, the 64-byte reply (bench/server.c answers
// it), close() with SO_LINGER {1,0} (a reset: no TIME_WAIT), then the next
// one. One thread, epoll. What is timed per connection, from just before
// connect() to just after close(), is what bench/connect.c -m rr times.
// After WARMUP connections (default 200, not counted) it counts COUNT
// connections (completed or failed), or as many as SECONDS allow.
// A connection that does not complete within TIMEOUT ms (default 1000)
// counts as failed and is closed.
//
// Output: one JSON line: completed, failed, seconds, rps (completed per
// second), p50_us, p90_us, p99_us of the completed connections.
// Exit: 0 measured; 1 usage or setup error.
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
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG_SIZE 64
#define MAX_CONC 1024
#define MAX_SAMPLES (1 << 24)

struct conn {
	int fd;
	int state; /* 0 idle, 1 connecting, 2 waiting for the reply */
	int got;
	int counted;
	double started;
};

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

static struct sockaddr_in target;
static int epfd;
static struct conn conns[MAX_CONC];
static double *samples;
static long nsamples, failed;
static int counting;
static long warm_left, count_left = -1;

static void finish(struct conn *c, int ok)
{
	struct linger lg = { 1, 0 };

	setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(c->fd);
	if (c->counted) {
		if (ok && nsamples < MAX_SAMPLES)
			samples[nsamples++] = (now() - c->started) * 1e6;
		else if (!ok)
			failed++;
		if (count_left > 0)
			count_left--;
	} else if (counting == 0 && --warm_left <= 0) {
		counting = 2; /* the main loop starts the clock */
	}
	c->fd = -1;
	c->state = 0;
}

static void start(struct conn *c)
{
	struct epoll_event ev = { .events = EPOLLOUT | EPOLLIN };
	int one = 1;

	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (c->fd < 0) {
		perror("socket");
		exit(1);
	}
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->got = 0;
	c->counted = counting == 1;
	c->started = now();
	if (connect(c->fd, (struct sockaddr *)&target, sizeof(target)) < 0 && errno != EINPROGRESS) {
		finish(c, 0);
		return;
	}
	c->state = 1;
	ev.data.ptr = c;
	epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
}

static void step(struct conn *c, uint32_t events)
{
	char buf[MSG_SIZE];

	if (events & (EPOLLERR | EPOLLHUP) && c->state == 1) {
		finish(c, 0);
		return;
	}
	if (c->state == 1 && (events & EPOLLOUT)) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };

		memset(buf, 'q', sizeof(buf));
		if (write(c->fd, buf, sizeof(buf)) != sizeof(buf)) {
			finish(c, 0);
			return;
		}
		c->state = 2;
		epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
		return;
	}
	if (c->state == 2 && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
		ssize_t n = read(c->fd, buf, sizeof(buf));

		if (n <= 0) {
			if (n < 0 && errno == EAGAIN)
				return;
			finish(c, 0);
			return;
		}
		c->got += n;
		if (c->got >= MSG_SIZE)
			finish(c, 1);
	}
}

int main(int argc, char **argv)
{
	const char *addr = NULL;
	int port = 0, conc = 32, opt;
	double seconds = 0, timeout = 1.0;
	long count = 0, warmup = 200;
	struct epoll_event evs[MAX_CONC];

	while ((opt = getopt(argc, argv, "a:p:d:n:c:w:t:")) != -1) {
		switch (opt) {
		case 'a': addr = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'd': seconds = atof(optarg); break;
		case 'n': count = atol(optarg); break;
		case 'c': conc = atoi(optarg); break;
		case 'w': warmup = atol(optarg); break;
		case 't': timeout = atoi(optarg) / 1000.0; break;
		default:
			fprintf(stderr, "usage: np-load -a ADDR -p PORT -d SECONDS [-c CONC] [-w WARMUP] [-t TIMEOUT_MS]\n");
			return 1;
		}
	}
	if (!addr || port <= 0 || (seconds <= 0) == (count <= 0) || conc < 1 || conc > MAX_CONC) {
		fprintf(stderr, "np-load: -a, -p and one of -n, -d are required; 1 <= -c <= %d\n", MAX_CONC);
		return 1;
	}
	target.sin_family = AF_INET;
	target.sin_port = htons(port);
	if (inet_pton(AF_INET, addr, &target.sin_addr) != 1) {
		fprintf(stderr, "np-load: bad address %s\n", addr);
		return 1;
	}
	samples = malloc(sizeof(double) * MAX_SAMPLES);
	epfd = epoll_create1(0);
	if (!samples || epfd < 0) {
		perror("np-load: setup");
		return 1;
	}
	double t_start = 0, t_end = 1e18, elapsed;
	warm_left = warmup;
	counting = warmup > 0 ? 0 : 2;
	if (count > 0)
		count_left = count;
	for (int i = 0; i < conc; i++)
		start(&conns[i]);
	for (;;) {
		double t = now();

		if (counting == 2) {
			/* the warm-up is over: connections started from now on are counted */
			counting = 1;
			t_start = t;
			if (seconds > 0)
				t_end = t + seconds;
		}
		if (t >= t_end || (count_left == 0))
			break;
		int n = epoll_wait(epfd, evs, MAX_CONC, 10);

		for (int i = 0; i < n; i++)
			step(evs[i].data.ptr, evs[i].events);
		t = now();
		for (int i = 0; i < conc; i++) {
			struct conn *c = &conns[i];

			if (c->state != 0 && t - c->started > timeout)
				finish(c, 0);
			if (c->state == 0 && t < t_end && count_left != 0)
				start(c);
		}
	}
	elapsed = now() - t_start;
	qsort(samples, nsamples, sizeof(double), cmp);
#define PCT(p) (nsamples ? samples[(long)((p) / 100.0 * (nsamples - 1))] : 0)
	printf("{\"completed\":%ld,\"failed\":%ld,\"seconds\":%.3f,\"rps\":%.1f,\"concurrency\":%d,"
	       "\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f}\n",
	       nsamples, failed, elapsed, nsamples / elapsed, conc, PCT(50), PCT(90), PCT(99));
	return 0;
}
