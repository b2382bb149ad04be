/* What every room of service/ uses and none owns: the clocks, a wake-up
 * pipe, printf into a caller's error buffer, and a growable byte buffer.
 * @locality any thread: nothing here keeps state between calls. */
#ifndef SVC_UTIL_H
#define SVC_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ---- clocks -------------------------------------------------------------------- */

/* Monotonic milliseconds: heartbeats, deadlines, durations. */
long long svc_now_ms(void);
/* Monotonic seconds, for the latency histograms. */
double svc_now_s(void);
/* Unix-epoch milliseconds: what crosses a process (deadline_ms, attempt numbers). */
int64_t svc_wall_ms(void);

/* n bytes from the kernel's CSPRNG (getrandom(2)), for ids and keys that
 * must not be guessable. Blocks only until the pool is first seeded;
 * retries short reads and EINTR. Returns 0, or -1 with errno set. */
int svc_random_bytes(void *buf, size_t n);
/* *ts = now + ms on CLOCK_REALTIME, the clock pthread_cond_timedwait waits on. */
void svc_deadline_in(struct timespec *ts, int ms);

/* A pipe with both ends non-blocking and close-on-exec: the wake-up channel
 * librdkafka writes to from its threads (rd_kafka_queue_io_event_enable),
 * which must never block them, and its reader drains without waiting.
 * Returns 0, or -1 with errno set (fds then closed and set to -1). */
int svc_wake_pipe(int fds[2]);
/* Read whatever the wake pipe's read end `fd` holds, without waiting. */
void svc_wake_pipe_drain(int fd);

/* ---- error buffers -------------------------------------------------------------- */

/* printf into a caller's error buffer: NULL-safe (err NULL or errlen 0 does
 * nothing), always NUL-terminated, truncated to fit. */
void svc_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void svc_verrf(char *err, size_t errlen, const char *fmt, va_list ap);

/* A setting that takes one of two values: *is_on = whether `value` is `on`.
 * Returns 0, or -1 (*is_on untouched) with err "NAME: expected OFF or ON,
 * got 'VALUE'", the one wording of the config file's keys and of mllama
 * run's options. */
int svc_parse_choice(const char *name, const char *value, const char *off, const char *on,
                     int *is_on, char *err, size_t errlen);

/* ---- the byte buffer ------------------------------------------------------------- */

/* A growable output buffer, reused record after record so that steady-state
 * streaming allocates nothing. Zero-initialise or svc_buf_init. */
typedef struct svc_buf {
    char *data; /* owned; NUL-terminated after every builder call */
    size_t len;
    size_t cap;
} svc_buf;

void svc_buf_init(svc_buf *b);
/* Free the storage; the buffer is empty and usable again. */
void svc_buf_deinit(svc_buf *b);
/* Room for `extra` more bytes and a NUL. Returns 0, or -1 when out of
 * memory or the size would overflow (the buffer is unchanged then). */
int svc_buf_reserve(svc_buf *b, size_t extra);
/* Append the n bytes at s (any bytes, NULs included), growing the buffer.
 * Returns 0, or -1 when out of memory (the buffer then keeps its previous
 * contents). Nothing to append changes nothing. */
int svc_buf_append(svc_buf *b, const void *s, size_t n);
/* Append printf output, growing the buffer. Returns 0, or -1 when out of
 * memory (the buffer then keeps its previous contents). */
int svc_buf_printf(svc_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
