// SPDX-License-Identifier: Apache-2.0
/*
 * The pod sandbox's process: holds the pod's namespaces open and does
 * nothing else. It sleeps until SIGTERM or SIGINT, and as PID 1 of a pod
 * that shares its PID namespace it reaps the orphans re-parented to it.
 * The same job as Kubernetes' build/pause, written for this project.
 *
 * Built static (gcc -static), so the image needs no libc:
 * scripts/cluster/images.sh.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAUSE_VERSION "lbctl-pause 1.0"

static volatile sig_atomic_t stop_signal;

static void on_stop(int signo)
{
	stop_signal = signo;
}

static void on_child(int signo)
{
	int saved = errno;

	(void)signo;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	sigset_t stops, none;

	if (argc > 1 && (!strcmp(argv[1], "-v") || !strcmp(argv[1], "--version"))) {
		puts(PAUSE_VERSION);
		return 0;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: not PID 1; orphans are reaped only by PID 1\n");

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_stop;
	if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL))
		return 1;
	sa.sa_handler = on_child;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL))
		return 2;

	/* Blocked outside sigsuspend(), so a signal between the test and the
	 * sleep is not lost: sigsuspend() unblocks it and returns at once. */
	sigemptyset(&stops);
	sigaddset(&stops, SIGINT);
	sigaddset(&stops, SIGTERM);
	sigprocmask(SIG_BLOCK, &stops, NULL);
	sigemptyset(&none);
	while (!stop_signal)
		sigsuspend(&none);
	fprintf(stderr, "pause: %s, exiting\n", strsignal(stop_signal));
	return 0;
}
