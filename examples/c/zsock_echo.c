/* zsock_echo: a byte-exact echo over zsock sockets, in plain C.
 *
 * Shows the zs_* C API (sockets/zsock.h) as a sockets program uses it:
 *   - a server process: zs_socket/zs_bind/zs_listen on 127.0.0.1, port 0
 *     (read back with zs_getsockname), then one single-threaded zs_poll()
 *     loop that accepts non-blocking connections and echoes every byte,
 *     keeping each connection's unsent echo (partial writes, EAGAIN, EOF);
 *   - N client processes, each streaming a pseudo-random pattern (derived
 *     from its index) in chunks of varying sizes while reading the echo
 *     back, checking every byte, then half-closing and waiting for EOF.
 * The provider comes from the environment (ZSOCK_PROVIDER, default unet),
 * as for any zsock program. Every process creates its sockets only after
 * fork(): a child must not use zsock sockets its parent made, so the parent
 * here never calls zs_* at all.
 *
 * Build against the installed package and run:
 *   make && ./zsock_echo
 *   ZSOCK_PROVIDER='ofi:tcp;ofi_rxm' ./zsock_echo
 *   ./zsock_echo -c 8 -b 4194304
 * (zsock under a prefix: PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig make; see README.md.)
 * Options: -c CLIENTS (default 4), -b BYTES per client (default 1 MiB),
 * -t SECONDS before a hang is reported as a failure (default 60).
 * Exit status 0 only if every client got its bytes back exactly. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sockets/zsock.h"

#define MAX_CLIENTS 256
#define MAX_CHUNK 65536            /* sends and receives are 1..MAX_CHUNK bytes */
#define PENDING_MAX (256 * 1024)   /* unsent echo per connection before the server stops reading */

static char who[32] = "main";      /* "server", "client 3": names the process in messages */
static char alarm_msg[96];
static pid_t children[MAX_CLIENTS + 1]; /* the parent's: [0] the server, 0 once reaped */
static char names[MAX_CLIENTS + 1][32];
static int nchildren;
static unsigned timeout = 60;      /* -t */

/* Reports a failed call with errno's text; returns -1 for `return fail(...)`. */
static int fail(const char *call) {
  fprintf(stderr, "zsock_echo: %s: %s failed: %s\n", who, call, strerror(errno));
  return -1;
}

static void on_alarm(int sig) {
  (void)sig;
  for (int i = 0; i < nchildren; ++i)  /* empty in the children */
    if (children[i] > 0) kill(children[i], SIGKILL);
  if (write(STDERR_FILENO, alarm_msg, strlen(alarm_msg)) < 0) {}
  _exit(1);
}

/* Fails this process loudly after `seconds` (alarms do not survive fork). */
static void arm_timeout(unsigned seconds) {
  snprintf(alarm_msg, sizeof(alarm_msg), "zsock_echo: %s: timed out after %u s\n", who, seconds);
  struct sigaction sa = {.sa_handler = on_alarm};
  sigaction(SIGALRM, &sa, NULL);
  alarm(seconds);
}

/* The byte stream of client `idx`: byte `off` is byte off%8 of a splitmix64
 * hash of (idx, off/8), so any stretch can be regenerated from its offset. */
static void pattern(unsigned idx, uint64_t off, uint8_t *p, size_t n) {
  uint64_t word = 0;
  for (size_t i = 0; i < n; ++i, ++off) {
    if (i == 0 || off % 8 == 0) {
      uint64_t z = ((uint64_t)idx << 48 ^ off / 8) + 0x9e3779b97f4a7c15u;
      z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9u;
      z = (z ^ z >> 27) * 0x94d049bb133111ebu;
      word = z ^ z >> 31;
    }
    p[i] = (uint8_t)(word >> (8 * (off % 8)));
  }
}

/* A small xorshift generator for chunk sizes. */
static size_t chunk_size(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return 1 + (size_t)(*state % MAX_CHUNK);
}

static struct sockaddr_in loopback(uint16_t port) {
  return (struct sockaddr_in){
      .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
}

/* ---- server ---- */

struct conn {
  int fd;
  int eof;             /* the client has half-closed */
  size_t head, tail;   /* unsent echo: buf[head, tail) */
  uint8_t buf[PENDING_MAX];
};

/* Reads what fits, echoes what it can. Returns 1 once the client has
 * closed and its echo is all sent (the socket is then closed), 0 to keep
 * going, -1 on error. */
static int serve(struct conn *c) {
  while (!c->eof) {
    if (c->tail == PENDING_MAX && c->head > 0) {  /* make room */
      memmove(c->buf, c->buf + c->head, c->tail - c->head);
      c->tail -= c->head;
      c->head = 0;
    }
    if (c->tail == PENDING_MAX) break;  /* full: read again once the client reads */
    ssize_t n = zs_recv(c->fd, c->buf + c->tail, PENDING_MAX - c->tail, 0);
    if (n > 0) c->tail += (size_t)n;
    else if (n == 0) c->eof = 1;
    else if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    else if (errno != EINTR) return fail("zs_recv");
  }
  while (c->head < c->tail) {
    ssize_t n = zs_send(c->fd, c->buf + c->head, c->tail - c->head, MSG_NOSIGNAL);
    if (n >= 0) c->head += (size_t)n;
    else if (errno == EAGAIN || errno == EWOULDBLOCK) break;  /* POLLOUT will say when */
    else if (errno != EINTR) return fail("zs_send");
  }
  if (c->head == c->tail) c->head = c->tail = 0;
  if (!c->eof || c->tail > 0) return 0;
  if (zs_close(c->fd) != 0) return fail("zs_close");  /* graceful: the echo is delivered */
  return 1;
}

/* Listens, sends the port down `port_pipe`, echoes `nclients` connections. */
static int run_server(int port_pipe, int nclients) {
  int l = zs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (l < 0) return fail("zs_socket");
  struct sockaddr_in a = loopback(0);
  socklen_t len = sizeof(a);
  if (zs_bind(l, (struct sockaddr *)&a, sizeof(a)) != 0) return fail("zs_bind");
  if (zs_listen(l, SOMAXCONN) != 0) return fail("zs_listen");
  if (zs_getsockname(l, (struct sockaddr *)&a, &len) != 0) return fail("zs_getsockname");
  uint16_t port = ntohs(a.sin_port);
  if (write(port_pipe, &port, sizeof(port)) != (ssize_t)sizeof(port)) return fail("write(port)");
  close(port_pipe);

  struct conn *conns[MAX_CLIENTS];
  struct pollfd pfd[MAX_CLIENTS + 1];
  int nconns = 0, accepted = 0, done = 0;
  while (done < nclients) {
    /* pfd[i] watches conns[i]; the listener comes last, until all are in. */
    int polled = nconns, n = nconns;
    for (int i = 0; i < nconns; ++i) {
      struct conn *c = conns[i];
      short ev = 0;
      if (!c->eof && (c->tail < PENDING_MAX || c->head > 0)) ev |= POLLIN;
      if (c->head < c->tail) ev |= POLLOUT;
      pfd[i] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int listening = accepted < nclients;
    if (listening) pfd[n++] = (struct pollfd){.fd = l, .events = POLLIN};
    /* zs_poll is exact for zsock fds (it asks the SDP engine) and sleeps in
     * poll(2) on all of them; plain poll() works too (sockets/zsock.h). */
    if (zs_poll(pfd, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      return fail("zs_poll");
    }
    while (listening && pfd[polled].revents && accepted < nclients) {
      int fd = zs_accept4(l, NULL, NULL, SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;  /* all taken */
        if (errno == ECONNABORTED || errno == EINTR) continue;
        return fail("zs_accept4");
      }
      struct conn *c = calloc(1, sizeof(*c));
      if (!c) return fail("calloc");
      c->fd = fd;
      conns[nconns++] = c;
      ++accepted;
    }
    /* Last to first: a finished connection's slot takes the last one's,
     * which was visited already or was not polled (accepted just now). */
    for (int i = polled - 1; i >= 0; --i) {
      if (!pfd[i].revents) continue;
      int r = serve(conns[i]);
      if (r < 0) return -1;
      if (r == 1) {
        free(conns[i]);
        conns[i] = conns[--nconns];
        ++done;
      }
    }
  }
  if (zs_close(l) != 0) return fail("zs_close(listener)");
  return 0;
}

/* ---- client ---- */

static int run_client(unsigned idx, uint16_t port, uint64_t total) {
  static uint8_t out[MAX_CHUNK], in[MAX_CHUNK], want[MAX_CHUNK];
  uint64_t sent = 0, got = 0;
  uint64_t send_rng = 0x2545f4914f6cdd1du ^ idx, recv_rng = 0x9e3779b97f4a7c15u ^ idx;
  int fd = zs_socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return fail("zs_socket");
  struct sockaddr_in a = loopback(port);
  if (zs_connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) return fail("zs_connect");
  if (zs_fcntl(fd, F_SETFL, zs_fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) return fail("zs_fcntl");
  if (total == 0 && zs_shutdown(fd, SHUT_WR) != 0) return fail("zs_shutdown");

  for (;;) {  /* until the server's EOF */
    struct pollfd pfd = {.fd = fd, .events = POLLIN | (sent < total ? POLLOUT : 0)};
    if (zs_poll(&pfd, 1, -1) < 0) {
      if (errno == EINTR) continue;
      return fail("zs_poll");
    }
    /* Send while the socket takes it; half-close after the last byte. */
    while (sent < total && (pfd.revents & (POLLOUT | POLLERR | POLLHUP))) {
      size_t n = chunk_size(&send_rng);
      if (n > total - sent) n = (size_t)(total - sent);
      pattern(idx, sent, out, n);
      ssize_t k = zs_send(fd, out, n, MSG_NOSIGNAL);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) return fail("zs_send");
      sent += (uint64_t)k;
      if (sent == total && zs_shutdown(fd, SHUT_WR) != 0) return fail("zs_shutdown");
    }
    /* Read whatever has come back, and check it. */
    for (;;) {
      ssize_t k = zs_recv(fd, in, chunk_size(&recv_rng), 0);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) return fail("zs_recv");
      if (k == 0) {  /* the server has closed */
        if (got < total) {
          fprintf(stderr, "zsock_echo: %s: short read: end of stream after %" PRIu64
                  " of %" PRIu64 " bytes\n", who, got, total);
          return -1;
        }
        if (zs_close(fd) != 0) return fail("zs_close");
        return 0;
      }
      if ((uint64_t)k > total - got) {
        fprintf(stderr, "zsock_echo: %s: %" PRIu64 " bytes echoed but only %" PRIu64
                " sent\n", who, got + (uint64_t)k, total);
        return -1;
      }
      pattern(idx, got, want, (size_t)k);
      if (memcmp(in, want, (size_t)k) != 0) {
        size_t i = 0;
        while (in[i] == want[i]) ++i;
        fprintf(stderr, "zsock_echo: %s: echo differs at offset %" PRIu64
                ": got 0x%02x, expected 0x%02x\n", who, got + i, in[i], want[i]);
        return -1;
      }
      got += (uint64_t)k;
    }
  }
}

/* ---- main: fork the server, then the clients, and reap them all ---- */

static void usage(int status) {
  fprintf(status ? stderr : stdout, "usage: zsock_echo [-c CLIENTS (1-%d, default 4)]"
          " [-b BYTES per client (default 1048576)] [-t SECONDS (default 60)]\n", MAX_CLIENTS);
  exit(status);
}

static uint64_t number(const char *s, uint64_t min, uint64_t max) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v < min || v > max) usage(2);
  return v;
}

/* Forks a child named `name` with its own timeout: returns 0 in the child,
 * the child's pid (also kept in children[]) in the parent. */
static pid_t spawn(const char *name) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fail("fork");
    for (int i = 0; i < nchildren; ++i) kill(children[i], SIGKILL);
    exit(1);
  }
  if (pid == 0) {
    nchildren = 0;
    snprintf(who, sizeof(who), "%s", name);
    arm_timeout(timeout);
  } else {
    snprintf(names[nchildren], sizeof(names[0]), "%s", name);
    children[nchildren++] = pid;
  }
  return pid;
}

int main(int argc, char **argv) {
  int nclients = 4, opt;
  uint64_t bytes = 1 << 20;
  while ((opt = getopt(argc, argv, "c:b:t:h")) != -1) {
    switch (opt) {
      case 'c': nclients = (int)number(optarg, 1, MAX_CLIENTS); break;
      case 'b': bytes = number(optarg, 0, UINT64_MAX / 2); break;
      case 't': timeout = (unsigned)number(optarg, 1, 86400); break;
      case 'h': usage(0); break;
      default: usage(2);
    }
  }
  if (optind != argc) usage(2);
  const char *provider = getenv("ZSOCK_PROVIDER");
  if (!provider) provider = "unet (default)";
  arm_timeout(timeout + 2);  /* a backstop: each child reports its own hang first */

  /* The parent makes no zsock call: each child opens its own sockets. */
  int p[2];
  if (pipe(p) != 0) {
    fail("pipe");
    return 1;
  }
  if (spawn("server") == 0) {
    close(p[0]);
    exit(run_server(p[1], nclients) == 0 ? 0 : 1);
  }
  close(p[1]);
  uint16_t port = 0;
  ssize_t n;
  while ((n = read(p[0], &port, sizeof(port))) < 0 && errno == EINTR) {}
  close(p[0]);
  int failed = 0, server_stopped = 0;
  if (n == (ssize_t)sizeof(port)) {
    for (int i = 0; i < nclients; ++i) {
      char name[32];
      snprintf(name, sizeof(name), "client %d", i);
      if (spawn(name) == 0) exit(run_client((unsigned)i, port, bytes) == 0 ? 0 : 1);
    }
  } else {
    fprintf(stderr, "zsock_echo: the server exited before listening\n");
    failed = 1;
  }

  /* Reap everyone. After a failure, stop the server: it would wait for the
   * failed client until its timeout. */
  for (int left = nchildren; left > 0; --left) {
    int status, i = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, 0)) < 0 && errno == EINTR) {}
    if (pid < 0) {
      fail("waitpid");
      return 1;
    }
    while (children[i] != pid) ++i;
    children[i] = 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (WIFSIGNALED(status) && !(i == 0 && server_stopped))
      fprintf(stderr, "zsock_echo: %s killed by signal %d (%s)\n", names[i], WTERMSIG(status),
              strsignal(WTERMSIG(status)));
    failed = 1;
    if (children[0] > 0 && !server_stopped) {
      kill(children[0], SIGTERM);
      server_stopped = 1;
    }
  }
  if (failed) {
    fprintf(stderr, "zsock_echo: FAILED (provider %s)\n", provider);
    return 1;
  }
  printf("zsock_echo: provider %s, %d clients x %" PRIu64 " bytes echoed byte-exact\n", provider,
         nclients, bytes);
  return 0;
}
