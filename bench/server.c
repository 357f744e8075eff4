// SPDX-License-Identifier: Apache-2.0
//
// server: the "pod" of the lbctl connection benchmark.
//
//   server [-p PORT] [-a ADDR] [-c]  (defaults: port 8080, ADDR :: dual-stack)
//
// Accepts TCP connections; for each one it reads a request of up to 64 bytes
// and, once a full 64-byte request has arrived, writes a 64-byte reply. The
// connection is closed when the client closes it (read() == 0) or resets it
// (ECONNRESET, e.g. the client closed with SO_LINGER {1,0}); with -c the
// server closes first, right after the reply (a FIN, as an HTTP server
// answering "Connection: close" does: the server, not the client, then holds
// the tuple in TIME_WAIT; bench/np-load.c -m server waits for it). Clients that
// connect and close without sending anything are the common case (the
// connect()+close() benchmark) and cost one accept() + one read() + close().
//
// Design: one thread, epoll, non-blocking sockets, with an optimistic read
// straight after accept(). A plain blocking accept()+read() loop would be a
// few syscalls cheaper, but it is not correct: one client that connects and
// then sends nothing would stall every other connection. With the optimistic
// read the common cases never touch epoll for the connection at all:
//   - connect()+close(): by the time we accept, the RST/FIN has usually
//     arrived, so read() returns ECONNRESET/0 and we close at once;
//   - request/reply: the 64-byte request is usually already queued, so we
//     reply immediately and only register the fd to wait for the close.
// Only connections that are not finished yet are added to the epoll set.
//
// Prints "listening on ADDR:PORT" once ready; exits 0 on SIGTERM/SIGINT,
// 1 on a setup error.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSG_SIZE 64      /* request and reply size, bytes */
#define BACKLOG 4096     /* capped by net.core.somaxconn */
#define MAX_EVENTS 256

static const char *prog = "server";

/* Request bytes received so far, per connection, indexed by fd. A connection
 * is answered once, when this reaches MSG_SIZE; later bytes are ignored. */
static uint8_t *received;
static size_t nfds_max;

static int epfd = -1;
static int listen_fd = -1;
/* Spare descriptor, released to accept-and-drop when we hit EMFILE/ENFILE,
 * so the level-triggered listening socket cannot spin the loop. */
static int spare_fd = -1;
/* -c: close right after the reply. */
static int close_first;

static void usage(void)
{
	fprintf(stderr, "usage: %s [-p PORT] [-a ADDR] [-c]\n"
			"  -p PORT  TCP port to listen on (default 8080)\n"
			"  -a ADDR  IPv4 or IPv6 address (default :: = dual-stack)\n"
			"  -c       close each connection first, right after the reply\n", prog);
	exit(1);
}

static void close_conn(int fd)
{
	/* close() also removes fd from the epoll set, if it was in it. */
	received[fd] = 0;
	close(fd);
}

/* Drains what fd has to read and answers a complete request. Returns 1 if
 * the connection is still open and must wait for more input, 0 if it was
 * closed (peer closed or reset, or an error). */
static int serve(int fd)
{
	char buf[MSG_SIZE];

	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));

		if (n > 0) {
			if (received[fd] >= MSG_SIZE)
				continue; /* already answered: discard */
			size_t got = received[fd] + (size_t)n;

			received[fd] = got >= MSG_SIZE ? MSG_SIZE : (uint8_t)got;
			if (received[fd] == MSG_SIZE) {
				static const char reply[MSG_SIZE] = { 'r' };
				/* A fresh socket's send buffer always takes 64
				 * bytes, so a short write only happens if the
				 * peer is gone: drop the connection then. */
				if (write(fd, reply, sizeof(reply)) != sizeof(reply) || close_first) {
					close_conn(fd);
					return 0;
				}
			}
			continue;
		}
		if (n == 0) {
			close_conn(fd); /* orderly close by the client */
			return 0;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 1;
		/* ECONNRESET (client closed with SO_LINGER 0) or other error */
		close_conn(fd);
		return 0;
	}
}

static void accept_all(void)
{
	for (;;) {
		int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if ((errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
				/* Out of descriptors: accept and drop one
				 * connection with the spare, then re-arm it. */
				perror("server: accept");
				close(spare_fd);
				fd = accept(listen_fd, NULL, NULL);
				if (fd >= 0)
					close(fd);
				spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
				return;
			}
			perror("server: accept");
			return;
		}
		if ((size_t)fd >= nfds_max) { /* cannot happen: nfds_max = RLIMIT_NOFILE */
			close(fd);
			continue;
		}
		received[fd] = 0;
		if (!serve(fd))
			continue; /* finished already: never touched epoll */

		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.fd = fd };

		if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			perror("server: epoll_ctl(ADD connection)");
			close_conn(fd);
		}
	}
}

int main(int argc, char **argv)
{
	const char *addr_str = "::";
	long port = 8080;
	int opt;

	while ((opt = getopt(argc, argv, "p:a:ch")) != -1) {
		switch (opt) {
		case 'p': {
			char *end;

			port = strtol(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || port < 1 || port > 65535) {
				fprintf(stderr, "%s: invalid port '%s'\n", prog, optarg);
				return 1;
			}
			break;
		}
		case 'a':
			addr_str = optarg;
			break;
		case 'c':
			close_first = 1;
			break;
		default:
			usage();
		}
	}
	if (optind != argc)
		usage();

	/* Parse ADDR: IPv6 first (so "::" is dual-stack), then IPv4. */
	struct sockaddr_storage ss;
	socklen_t sslen;
	int family;
	char shown[INET6_ADDRSTRLEN + 2];

	memset(&ss, 0, sizeof(ss));
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

	if (inet_pton(AF_INET6, addr_str, &sin6->sin6_addr) == 1) {
		family = AF_INET6;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t)port);
		sslen = sizeof(*sin6);
		snprintf(shown, sizeof(shown), "[%s]", addr_str);
	} else if (inet_pton(AF_INET, addr_str, &sin->sin_addr) == 1) {
		family = AF_INET;
		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)port);
		sslen = sizeof(*sin);
		snprintf(shown, sizeof(shown), "%s", addr_str);
	} else {
		fprintf(stderr, "%s: invalid address '%s' (want IPv4 or IPv6)\n", prog, addr_str);
		return 1;
	}

	/* Hundreds of thousands of connections go through here, a few at a
	 * time; still, raise the fd limit so bursts never hit EMFILE. */
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		perror("server: getrlimit(RLIMIT_NOFILE)");
		return 1;
	}
	nfds_max = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 20) ? (1u << 20) : rl.rlim_cur;
	received = calloc(nfds_max, 1);
	if (!received) {
		perror("server: calloc");
		return 1;
	}

	/* SIGTERM/SIGINT arrive through a signalfd in the epoll set: no
	 * handler races with epoll_wait(). */
	sigset_t mask;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0) {
		perror("server: sigprocmask");
		return 1;
	}
	int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);

	if (sfd < 0) {
		perror("server: signalfd");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN); /* writing to a reset peer: EPIPE, not death */

	listen_fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (listen_fd < 0) {
		perror("server: socket");
		return 1;
	}
	int one = 1, zero = 0;

	if (setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0) {
		perror("server: setsockopt(SO_REUSEADDR)");
		return 1;
	}
	/* "::" accepts IPv4 too (v4-mapped), whatever net.ipv6.bindv6only says. */
	if (family == AF_INET6 &&
	    setsockopt(listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) < 0) {
		perror("server: setsockopt(IPV6_V6ONLY)");
		return 1;
	}
	if (bind(listen_fd, (struct sockaddr *)&ss, sslen) < 0) {
		fprintf(stderr, "%s: bind %s:%ld: %s\n", prog, shown, port, strerror(errno));
		return 1;
	}
	if (listen(listen_fd, BACKLOG) < 0) {
		fprintf(stderr, "%s: listen %s:%ld: %s\n", prog, shown, port, strerror(errno));
		return 1;
	}

	epfd = epoll_create1(EPOLL_CLOEXEC);
	if (epfd < 0) {
		perror("server: epoll_create1");
		return 1;
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = listen_fd };

	if (epoll_ctl(epfd, EPOLL_CTL_ADD, listen_fd, &ev) < 0) {
		perror("server: epoll_ctl(ADD listen)");
		return 1;
	}
	ev.data.fd = sfd;
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, sfd, &ev) < 0) {
		perror("server: epoll_ctl(ADD signalfd)");
		return 1;
	}
	spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	printf("listening on %s:%ld\n", shown, port);
	fflush(stdout);

	struct epoll_event events[MAX_EVENTS];

	for (;;) {
		int n = epoll_wait(epfd, events, MAX_EVENTS, -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("server: epoll_wait");
			return 1;
		}
		for (int i = 0; i < n; i++) {
			int fd = events[i].data.fd;

			if (fd == listen_fd) {
				accept_all();
			} else if (fd == sfd) {
				struct signalfd_siginfo si;

				if (read(sfd, &si, sizeof(si)) == sizeof(si))
					return 0; /* SIGTERM/SIGINT: clean exit */
			} else {
				serve(fd); /* closes fd (and leaves epoll) when done */
			}
		}
	}
}
