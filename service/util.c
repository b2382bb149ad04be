/* Clocks, error buffers and the byte buffer (util.h). @locality any thread. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define BUF_MIN_CAP 512
#define NS_PER_MS 1000000L
#define NS_PER_S 1000000000L

/* ---- clocks -------------------------------------------------------------------- */

static int64_t ms_of(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / NS_PER_MS;
}

long long svc_now_ms(void) { return ms_of(CLOCK_MONOTONIC); }
double svc_now_s(void) { return (double)svc_now_ms() / 1000.0; }
int64_t svc_wall_ms(void) { return ms_of(CLOCK_REALTIME); }

void svc_deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * NS_PER_MS;
    if (ts->tv_nsec >= NS_PER_S) {
        ts->tv_sec++;
        ts->tv_nsec -= NS_PER_S;
    }
}

int svc_wake_pipe(int fds[2])
{
    if (pipe(fds))
        return -1;
    for (int i = 0; i < 2; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) ||
            fcntl(fds[i], F_SETFD, FD_CLOEXEC)) {
            int e = errno;
            close(fds[0]);
            close(fds[1]);
            fds[0] = fds[1] = -1;
            errno = e;
            return -1;
        }
    }
    return 0;
}

void svc_wake_pipe_drain(int fd)
{
    char drain[64];
    while (read(fd, drain, sizeof drain) > 0)
        ;
}

/* ---- error buffers -------------------------------------------------------------- */

void svc_verrf(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
}

void svc_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    svc_verrf(err, errlen, fmt, ap);
    va_end(ap);
}

int svc_parse_choice(const char *name, const char *value, const char *off, const char *on,
                     int *is_on, char *err, size_t errlen)
{
    if (strcmp(value, off) && strcmp(value, on)) {
        svc_errf(err, errlen, "%s: expected %s or %s, got '%s'", name, off, on, value);
        return -1;
    }
    *is_on = !strcmp(value, on);
    return 0;
}

/* ---- the byte buffer ------------------------------------------------------------- */

void svc_buf_init(svc_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void svc_buf_deinit(svc_buf *b)
{
    free(b->data);
    svc_buf_init(b);
}

int svc_buf_append(svc_buf *b, const void *s, size_t n)
{
    if (n == 0)
        return 0;
    if (svc_buf_reserve(b, n) != 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int svc_buf_reserve(svc_buf *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : BUF_MIN_CAP;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int svc_buf_printf(svc_buf *b, const char *fmt, ...)
{
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->cap ? b->data + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return 0;
        }
        if (svc_buf_reserve(b, (size_t)n) != 0)
            return -1;
    }
}

int svc_random_bytes(void *buf, size_t n)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(p + got, n - got, 0);
        if (k > 0)
            got += (size_t)k;
        else if (k < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}
