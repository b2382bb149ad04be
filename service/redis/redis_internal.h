/* Internals shared by service/redis_*.c: the client state and the call and
 * command helpers. Not for use outside those files.
 * @locality the thread that owns the svc_redis (all of it). */
#ifndef SVC_REDIS_INTERNAL_H
#define SVC_REDIS_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "protocol/protocol.h"
#include "redis/redis.h"

#define PREFIX_MAX 64
#define WORKER_ID_MAX 128
#define KEY_MAX 512          /* longest key: prefix + ":attempts:" + topic + two numbers */
#define NUM_MAX 24           /* a formatted int64 plus sign and NUL */
#define SHA_BUF (SVC_SHA256_HEX_LEN + 1)
/* Redis refuses strings over proto-max-bulk-len (512 MiB by default). */
#define REDIS_VALUE_MAX ((size_t)512 << 20)

typedef struct img_entry {
    char sha[SHA_BUF];
    uint64_t bytes;
    uint32_t tiles;
    int64_t last_use_ms;
} img_entry;

struct svc_redis {
    svc_redis_url url;
    char prefix[PREFIX_MAX + 1];
    char worker_id[WORKER_ID_MAX + 1];
    svc_redis_config cfg; /* url, prefix, worker_id are NULL here: copied above */

    redisContext *c;      /* owned; NULL while disconnected */
    long long deadline_ms; /* svc_now_ms() by which the current call ends */

    /* Breaker, on a monotonic clock. */
    int consecutive_failures;
    int open_ms;          /* current open period */
    int64_t open_until_ms;
    bool needs_reconcile; /* a write may have been lost since the last sync */

    /* Mirror of this worker's resident images, sorted by sha. */
    img_entry *imgs;
    size_t n_imgs, cap_imgs;

    /* Evictions not yet deleted in Redis, oldest first. */
    char (*pending)[SHA_BUF];
    size_t n_pending;

    /* Last heartbeat info, re-sent by reconciliation. */
    bool have_info;
    char *partitions;
    uint64_t free_pool_bytes;
    int64_t heartbeat_ms;

    /* Counters read by svc_redis_stats_get from any thread. */
    _Atomic uint64_t n_calls, n_errors, n_fast_fails, n_opens, n_connects, n_reconciliations,
        n_pending_dropped, n_resident, n_pending_now;
    _Atomic int breaker;
};

/* ---- Calls -------------------------------------------------------------- */

/* Start a call: refuse it while the breaker is open, else set its deadline
 * (call_timeout_ms from now) and connect and reconcile as needed. OK means
 * r->c is ready for the call's commands; any other status is the call's
 * result (already counted). */
svc_redis_status svc_redis_call_begin(svc_redis *r);

/* Finish a call whose commands returned `st` and return it: success,
 * NOT_FOUND and ERR_TOO_LARGE close the breaker; other statuses count as a
 * failure and drop the connection. */
svc_redis_status svc_redis_call_end(svc_redis *r, svc_redis_status st);

/* ---- Commands ----------------------------------------------------------- */

#define ARGS_MAX 12

/* One command's arguments; strings borrowed until it is appended. */
typedef struct svc_redis_cmd {
    int argc;
    const char *argv[ARGS_MAX];
    size_t len[ARGS_MAX];
} svc_redis_cmd;

/* Keys and numbers of one command, alive until it is appended (append
 * copies them into the output buffer at once). */
typedef struct svc_redis_scratch {
    char key[KEY_MAX];
    char n[4][NUM_MAX];
} svc_redis_scratch;

/* Add an argument (borrowed) of len bytes / a NUL-terminated one. */
void svc_redis_arg(svc_redis_cmd *c, const void *s, size_t len);
void svc_redis_arg_str(svc_redis_cmd *c, const char *s);

/* Queue a command on the output buffer (no I/O yet). ERR_IO when hiredis
 * could not allocate (the context is then in error). */
svc_redis_status svc_redis_append(svc_redis *r, svc_redis_cmd *c);

/* Read the next reply into *reply (owned by the caller: freeReplyObject),
 * sending what is queued first, all within the call's deadline. ERR_IO
 * (also past the deadline) leaves it NULL; an error reply is returned as
 * ERR_REPLY. */
svc_redis_status svc_redis_next_reply(svc_redis *r, redisReply **reply);

/* Read and discard n replies; the first non-OK status wins; stops at an
 * I/O error. */
svc_redis_status svc_redis_drain(svc_redis *r, size_t n);

void svc_redis_fmt_i64(char buf[NUM_MAX], int64_t v);
void svc_redis_fmt_u64(char buf[NUM_MAX], uint64_t v);

#endif
