/* Adapters held in Redis, copied into model.adapters_dir (adapter_store.h).
 * @locality: any prep thread, except init (the main thread). */
#include "worker/adapter_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

#define STAGING_PREFIX ".staging-"
#define CONFIG_FILE "adapter_config.json"
#define WEIGHTS_FILE "adapter_model.safetensors"
/* <dir>/<name> and <dir>/.staging-<name>-XXXXXX; a file inside either. */
#define DIR_PATH_MAX (SVC_CONFIG_STR + SVC_ADAPTER_NAME_MAX + 32)
#define FILE_PATH_MAX (DIR_PATH_MAX + 32)

/* ---- Remembered failures ------------------------------------------------- */

/* The live failure of name, copied into msg; SVC_ERROR_NONE when none. */
static svc_error failure_find(svc_adapter_store *s, const char *name, char *msg, size_t msglen)
{
    svc_error code = SVC_ERROR_NONE;
    long long now = svc_now_ms();
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < SVC_ADAPTER_FAILURES_MAX; i++) {
        const svc_adapter_failure *f = &s->failures[i];
        if (f->until_ms > now && !strcmp(f->name, name)) {
            code = f->code;
            svc_errf(msg, msglen, "%s (remembered for %d s)", f->message,
                     SVC_ADAPTER_FAILURE_TTL_MS / 1000);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return code;
}

/* Remember name's failure: in its entry, else in the one that expires
 * first (free and expired entries before live ones). */
static void failure_remember(svc_adapter_store *s, const char *name, svc_error code,
                             const char *msg)
{
    long long now = svc_now_ms();
    pthread_mutex_lock(&s->lock);
    svc_adapter_failure *slot = &s->failures[0];
    for (int i = 0; i < SVC_ADAPTER_FAILURES_MAX; i++) {
        svc_adapter_failure *f = &s->failures[i];
        if (!strcmp(f->name, name)) {
            slot = f;
            break;
        }
        if (f->until_ms < slot->until_ms)
            slot = f;
    }
    snprintf(slot->name, sizeof slot->name, "%s", name);
    slot->code = code;
    snprintf(slot->message, sizeof slot->message, "%s", msg);
    slot->until_ms = now + SVC_ADAPTER_FAILURE_TTL_MS;
    pthread_mutex_unlock(&s->lock);
}

/* ---- Files --------------------------------------------------------------- */

/* Write all of data to dir/file (created, never replaced) and sync it.
 * Returns 0, or -1 with errno set. */
static int write_synced(const char *dir, const char *file, const uint8_t *data, size_t n)
{
    char path[FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    while (n > 0) {
        ssize_t k = write(fd, data, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            close(fd);
            errno = e;
            return -1;
        }
        data += k;
        n -= (size_t)k;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

/* Remove a staging directory and the files it may hold; best effort (a
 * leftover is removed at the next start). */
static void staging_remove(const char *staging)
{
    static const char *const files[] = {WEIGHTS_FILE, CONFIG_FILE};
    char path[FILE_PATH_MAX];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", staging, files[i]);
        unlink(path);
    }
    if (rmdir(staging) != 0 && errno != ENOENT)
        svc_log(SVC_LOG_WARN, "adapter_staging_left", "cannot remove %s: %s", staging,
                strerror(errno));
}

/* The directory cannot take the adapter: the operator's problem, said
 * loudly, counted, and remembered for name. */
static svc_error store_failed(svc_adapter_store *s, const char *name, const char *what,
                              const char *path, int err, char *msg, size_t msglen)
{
    svc_metrics_add(SVC_COUNTER_ADAPTER_STORE_ERRORS, 1);
    svc_log(SVC_LOG_ERROR, "adapter_store_failed",
            "adapter %s: cannot %s %s: %s; model.adapters_dir (%s) must be a writable "
            "directory with room for the adapters served from Redis",
            name, what, path, strerror(err), s->dir);
    svc_errf(msg, msglen, "adapter '%s' cannot be stored on this worker (cannot %s %s: %s)",
             name, what, path, strerror(err));
    failure_remember(s, name, SVC_ERROR_ADAPTER_UNAVAILABLE, msg);
    return SVC_ERROR_ADAPTER_UNAVAILABLE;
}

static svc_error redis_failed(const char *name, svc_redis_status rs, char *msg, size_t msglen)
{
    svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
    svc_errf(msg, msglen, "adapter '%s' is not in this worker's directory and Redis failed (%s)",
             name, svc_redis_status_name(rs));
    return SVC_ERROR_ADAPTER_UNAVAILABLE;
}

static svc_error too_large(svc_adapter_store *s, const char *name, char *msg, size_t msglen)
{
    svc_errf(msg, msglen, "adapter '%s' in Redis is over limits.max_adapter_bytes (%zu)", name,
             s->max_bytes);
    failure_remember(s, name, SVC_ERROR_ADAPTER_TOO_LARGE, msg);
    return SVC_ERROR_ADAPTER_TOO_LARGE;
}

/* The adapter Redis holds cannot be served (why): the log says why, the
 * client only that it is refused; remembered for name. */
static svc_error refused(svc_adapter_store *s, const char *name, const char *why, char *msg,
                         size_t msglen)
{
    svc_log(SVC_LOG_ERROR, "adapter_refused", "adapter %s from Redis refused: %s", name, why);
    svc_errf(msg, msglen, "adapter '%s' is refused by this worker", name);
    failure_remember(s, name, SVC_ERROR_ADAPTER_UNAVAILABLE, msg);
    return SVC_ERROR_ADAPTER_UNAVAILABLE;
}

/* ---- The store ----------------------------------------------------------- */

void svc_adapter_store_init(svc_adapter_store *s, const char *dir, size_t max_bytes)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    s->max_bytes = max_bytes;
    pthread_mutex_init(&s->lock, NULL);
    DIR *d = opendir(dir);
    if (!d)
        return;
    char staging[FILE_PATH_MAX];
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, STAGING_PREFIX, strlen(STAGING_PREFIX)))
            continue;
        snprintf(staging, sizeof staging, "%s/%s", dir, e->d_name);
        staging_remove(staging);
    }
    closedir(d);
}

void svc_adapter_store_deinit(svc_adapter_store *s) { pthread_mutex_destroy(&s->lock); }

svc_error svc_adapter_store_ensure(svc_adapter_store *s, svc_redis *r, const char *name,
                                   char *msg, size_t msglen)
{
    char final[DIR_PATH_MAX], path[FILE_PATH_MAX], staging[DIR_PATH_MAX];
    snprintf(final, sizeof final, "%s/%s", s->dir, name);
    snprintf(path, sizeof path, "%s/" CONFIG_FILE, final);
    if (access(path, R_OK) == 0)
        return SVC_ERROR_NONE;
    svc_error code = failure_find(s, name, msg, msglen);
    if (code != SVC_ERROR_NONE)
        return code;
    if (!r) {
        svc_errf(msg, msglen, "adapter '%s' is not in %s (and this worker has no Redis)", name,
                 s->dir);
        return SVC_ERROR_UNKNOWN_ADAPTER;
    }

    /* Writable before anything moves: a misconfigured volume costs no
     * transfer. */
    if (mkdir(s->dir, 0755) != 0 && errno != EEXIST)
        return store_failed(s, name, "create", s->dir, errno, msg, msglen);
    snprintf(staging, sizeof staging, "%s/" STAGING_PREFIX "%s-XXXXXX", s->dir, name);
    if (!mkdtemp(staging))
        return store_failed(s, name, "create a directory in", s->dir, errno, msg, msglen);

    svc_redis_adapter a;
    svc_metrics_add(SVC_COUNTER_ADAPTER_FETCHES, 1);
    svc_redis_status rs = svc_redis_adapter_get(r, name, s->max_bytes, &a);
    if (rs != SVC_REDIS_OK) {
        staging_remove(staging);
        if (rs == SVC_REDIS_NOT_FOUND) {
            svc_errf(msg, msglen, "adapter '%s' is unknown", name);
            return SVC_ERROR_UNKNOWN_ADAPTER;
        }
        return rs == SVC_REDIS_ERR_TOO_LARGE ? too_large(s, name, msg, msglen)
                                             : redis_failed(name, rs, msg, msglen);
    }
    char digest[SVC_SHA256_HEX_LEN + 1];
    svc_redis_adapter_digest(a.config, a.config_len, a.weights, a.weights_len, digest);
    if (strcmp(digest, a.sha256)) {
        svc_redis_adapter_deinit(&a);
        staging_remove(staging);
        return refused(s, name, a.sha256[0] ? "its bytes do not hash to its sha256 field"
                                            : "it has no sha256 field (unpinned)",
                       msg, msglen);
    }
    size_t total = a.config_len + a.weights_len;
    /* Both files, then the rename: the directory appears whole or not at
     * all (the config is written last all the same, as a copy by hand
     * should be: the resolver takes its presence for completeness). */
    int failed = write_synced(staging, WEIGHTS_FILE, a.weights, a.weights_len) ||
                 write_synced(staging, CONFIG_FILE, a.config, a.config_len);
    int err = errno;
    svc_redis_adapter_deinit(&a);
    if (failed) {
        staging_remove(staging);
        return store_failed(s, name, "write into", staging, err, msg, msglen);
    }
    if (rename(staging, final) != 0) {
        err = errno;
        staging_remove(staging);
        /* Another prep thread copied it first: theirs serves. */
        if ((err == EEXIST || err == ENOTEMPTY) && access(path, R_OK) == 0)
            return SVC_ERROR_NONE;
        return store_failed(s, name, "rename a copy to", final, err, msg, msglen);
    }
    svc_log(SVC_LOG_INFO, "adapter_fetched", "adapter %s (%zu bytes) from Redis into %s", name,
            total, final);
    return SVC_ERROR_NONE;
}
