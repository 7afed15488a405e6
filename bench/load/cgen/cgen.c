// cgen: a TCP connection-rate generator in C, the cross-check of
// bench/load's Go generator (vipd-bench builds it with gcc and runs it
// beside the Go one). It shares no code with it: plain pthreads, epoll and
// non-blocking sockets, no Go runtime.
//
//   cgen NETNS_PATH PORT_LO PORT_HI SECONDS INFLIGHT THREADS IP:PORT...
//
// Each thread enters the network namespace at NETNS_PATH and keeps its share
// of INFLIGHT connections going for SECONDS: connect, send "end\n", read the
// one-line reply, read the server's FIN, close (the server closes first).
// Source ports come from PORT_LO..PORT_HI (IP_LOCAL_PORT_RANGE). It prints
// one line: "ok FAILED_COUNT ELAPSED_SECONDS CONNECTIONS".
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_LOCAL_PORT_RANGE
#define IP_LOCAL_PORT_RANGE 51
#endif

struct slot {
	int fd;
	int sent, done;
	int n;
	char buf[64];
	double t0;
};

static const char *netns_path;
static unsigned port_lo, port_hi;
static double seconds;
static int ndst;
static struct sockaddr_in *dsts;
static long next_dst;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long total_ok, total_failed;

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct sockaddr_in *pick(void) {
	long i = __atomic_fetch_add(&next_dst, 1, __ATOMIC_RELAXED);
	return &dsts[i % ndst];
}

// start opens slot s's next connection and registers it with epfd; it
// returns -1 when the connection failed at once.
static int start(int epfd, struct slot *s, int idx) {
	memset(s, 0, sizeof *s);
	s->t0 = now();
	s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->fd < 0)
		return -1;
	unsigned range = port_hi << 16 | port_lo;
	setsockopt(s->fd, IPPROTO_IP, IP_LOCAL_PORT_RANGE, &range, sizeof range);
	struct sockaddr_in *d = pick();
	if (connect(s->fd, (struct sockaddr *)d, sizeof *d) < 0 && errno != EINPROGRESS) {
		close(s->fd);
		s->fd = -1;
		return -1;
	}
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.u32 = idx};
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, s->fd, &ev) < 0) {
		close(s->fd);
		s->fd = -1;
		return -1;
	}
	return 0;
}

// advance handles events on s: 1 when the connection completed, -1 when it
// failed, 0 when it goes on.
static int advance(struct slot *s, unsigned evs) {
	if (evs & EPOLLERR)
		return -1;
	if (!s->sent && (evs & EPOLLOUT)) {
		if (write(s->fd, "end\n", 4) != 4)
			return -1;
		s->sent = 1;
	}
	if (!(evs & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)))
		return 0;
	for (;;) {
		ssize_t m = read(s->fd, s->buf + s->n, sizeof s->buf - s->n);
		if (m < 0)
			return errno == EAGAIN ? 0 : -1;
		if (m == 0)
			return s->done ? 1 : -1;
		if (s->done)
			return -1;
		s->n += m;
		if (s->buf[s->n - 1] == '\n')
			s->done = 1;
		else if (s->n == sizeof s->buf)
			return -1;
	}
}

static void *run(void *arg) {
	long inflight = (long)arg;
	int ns = open(netns_path, O_RDONLY | O_CLOEXEC);
	if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
		perror("setns");
		exit(1);
	}
	close(ns);
	int epfd = epoll_create1(EPOLL_CLOEXEC);
	struct slot *slots = calloc(inflight, sizeof *slots);
	struct epoll_event *evs = calloc(inflight, sizeof *evs);
	long ok = 0, failed = 0;
	double stop = now() + seconds;
	for (int i = 0; i < inflight; i++)
		if (start(epfd, &slots[i], i) < 0)
			failed++;
	for (;;) {
		double t = now();
		if (t >= stop)
			break;
		int n = epoll_wait(epfd, evs, inflight, 100);
		for (int k = 0; k < n; k++) {
			struct slot *s = &slots[evs[k].data.u32];
			if (s->fd < 0)
				continue;
			int r = advance(s, evs[k].events);
			if (r == 0)
				continue;
			close(s->fd);
			s->fd = -1;
			if (r > 0)
				ok++;
			else
				failed++;
		}
		t = now();
		for (int i = 0; i < inflight; i++) {
			if (slots[i].fd >= 0 && t - slots[i].t0 > 3) {
				close(slots[i].fd);
				slots[i].fd = -1;
				failed++;
			}
			if (slots[i].fd < 0 && t < stop && start(epfd, &slots[i], i) < 0)
				failed++;
		}
	}
	struct linger lg = {1, 0};
	for (int i = 0; i < inflight; i++)
		if (slots[i].fd >= 0) {
			setsockopt(slots[i].fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
			close(slots[i].fd);
		}
	pthread_mutex_lock(&mu);
	total_ok += ok;
	total_failed += failed;
	pthread_mutex_unlock(&mu);
	return NULL;
}

int main(int argc, char **argv) {
	if (argc < 8) {
		fprintf(stderr, "usage: cgen NETNS_PATH PORT_LO PORT_HI SECONDS INFLIGHT THREADS IP:PORT...\n");
		return 2;
	}
	netns_path = argv[1];
	port_lo = atoi(argv[2]);
	port_hi = atoi(argv[3]);
	seconds = atof(argv[4]);
	int inflight = atoi(argv[5]), threads = atoi(argv[6]);
	ndst = argc - 7;
	dsts = calloc(ndst, sizeof *dsts);
	for (int i = 0; i < ndst; i++) {
		char *a = strdup(argv[7 + i]), *colon = strrchr(a, ':');
		if (!colon || threads < 1 || inflight < threads) {
			fprintf(stderr, "cgen: bad arguments\n");
			return 2;
		}
		*colon = 0;
		dsts[i].sin_family = AF_INET;
		dsts[i].sin_port = htons(atoi(colon + 1));
		if (inet_pton(AF_INET, a, &dsts[i].sin_addr) != 1) {
			fprintf(stderr, "cgen: bad address %s\n", a);
			return 2;
		}
	}
	pthread_t *th = calloc(threads, sizeof *th);
	double t0 = now();
	for (long i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, run, (void *)(long)(inflight / threads + (i < inflight % threads)));
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	printf("ok %ld %.6f %ld\n", total_failed, now() - t0, total_ok);
	return 0;
}
