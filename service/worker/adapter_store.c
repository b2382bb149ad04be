/* Adapters held in Redis, pinned by content and copied into
 * model.adapters_dir (adapter_store.h).
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

#include "engine.h"

#include "log.h"
#include "metrics.h"
#include "util.h"

#define STAGING_PREFIX ".staging-"
#define CONTENT_PREFIX '@' /* <dir>/@<sha256>: a copy from Redis */
#define CONFIG_FILE "adapter_config.json"
#define WEIGHTS_FILE "adapter_model.safetensors"
/* <dir>/<name> and <dir>/.staging-<name>-XXXXXX; a file inside either. */
#define DIR_PATH_MAX (SVC_CONFIG_STR + SVC_ADAPTER_NAME_MAX + 32)
#define FILE_PATH_MAX (DIR_PATH_MAX + 32)

/* ---- Remembered failures and pins --------------------------------------- */

/* The live failure of key, copied into msg; SVC_ERROR_NONE when none. */
static svc_error failure_find(svc_adapter_store *s, const char *key, char *msg, size_t msglen)
{
    svc_error code = SVC_ERROR_NONE;
    long long now = svc_now_ms();
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < SVC_ADAPTER_FAILURES_MAX; i++) {
        const svc_adapter_failure *f = &s->failures[i];
        if (f->until_ms > now && !strcmp(f->key, key)) {
            code = f->code;
            svc_errf(msg, msglen, "%s (remembered for %d s)", f->message,
                     SVC_ADAPTER_FAILURE_TTL_MS / 1000);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return code;
}

/* Remember key's failure: in its entry, else in the one that expires
 * first (free and expired entries before live ones). */
static void failure_remember(svc_adapter_store *s, const char *key, svc_error code,
                             const char *msg)
{
    long long now = svc_now_ms();
    pthread_mutex_lock(&s->lock);
    svc_adapter_failure *slot = &s->failures[0];
    for (int i = 0; i < SVC_ADAPTER_FAILURES_MAX; i++) {
        svc_adapter_failure *f = &s->failures[i];
        if (!strcmp(f->key, key)) {
            slot = f;
            break;
        }
        if (f->until_ms < slot->until_ms)
            slot = f;
    }
    snprintf(slot->key, sizeof slot->key, "%s", key);
    slot->code = code;
    snprintf(slot->message, sizeof slot->message, "%s", msg);
    slot->until_ms = now + SVC_ADAPTER_FAILURE_TTL_MS;
    pthread_mutex_unlock(&s->lock);
}

/* name's known digest into sha256 ("" when none); whether it was looked up
 * within SVC_ADAPTER_PIN_TTL_MS. */
static bool pin_get(svc_adapter_store *s, const char *name, char sha256[SVC_SHA256_HEX_LEN + 1])
{
    bool fresh = false;
    sha256[0] = '\0';
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < SVC_ADAPTER_PINS_MAX; i++) {
        const svc_adapter_pin *p = &s->pins[i];
        if (!strcmp(p->name, name)) {
            memcpy(sha256, p->sha256, sizeof p->sha256);
            fresh = svc_now_ms() - p->checked_ms < SVC_ADAPTER_PIN_TTL_MS;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return fresh;
}

/* name maps to sha256 as of now ("" forgets it): in its entry, else in the
 * least recently checked one (forgetting a name without one is a no-op). */
static void pin_set(svc_adapter_store *s, const char *name, const char *sha256)
{
    pthread_mutex_lock(&s->lock);
    svc_adapter_pin *slot = &s->pins[0];
    bool found = false;
    for (int i = 0; i < SVC_ADAPTER_PINS_MAX && !found; i++) {
        svc_adapter_pin *p = &s->pins[i];
        found = !strcmp(p->name, name);
        if (found || p->checked_ms < slot->checked_ms)
            slot = p;
    }
    if (!found && !sha256[0]) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    snprintf(slot->name, sizeof slot->name, "%s", sha256[0] ? name : "");
    snprintf(slot->sha256, sizeof slot->sha256, "%s", sha256);
    slot->checked_ms = sha256[0] ? svc_now_ms() : 0;
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

/* Whether <dir>/<entry> holds a whole adapter (its config is written last). */
static bool adapter_present(const svc_adapter_store *s, const char *entry)
{
    char path[FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s/" CONFIG_FILE, s->dir, entry);
    return access(path, R_OK) == 0;
}

/* ---- The byte cap --------------------------------------------------------- */

typedef struct copy_entry {
    char name[SVC_ADAPTER_REF_MAX];
    size_t bytes;
    long long mtime_ms;
} copy_entry;

static int by_mtime(const void *a, const void *b)
{
    const copy_entry *x = a, *y = b;
    return (x->mtime_ms > y->mtime_ms) - (x->mtime_ms < y->mtime_ms);
}

/* Bytes of the two files of copy dir/name (0 for what cannot be read). */
static size_t copy_bytes(const char *dir, const char *name)
{
    static const char *const files[] = {CONFIG_FILE, WEIGHTS_FILE};
    size_t n = 0;
    char path[FILE_PATH_MAX];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s/%s", dir, name, files[i]);
        if (stat(path, &st) == 0)
            n += (size_t)st.st_size;
    }
    return n;
}

/* Delete copy dir/name: its config first, so the resolver sees it gone at
 * once, never half there. */
static void copy_remove(const char *dir, const char *name)
{
    char path[FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s/" CONFIG_FILE, dir, name);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s/" WEIGHTS_FILE, dir, name);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    rmdir(path);
}

/* Keep the copies from Redis under dir_max_bytes: the least recently used
 * go first, never one used within SVC_ADAPTER_KEEP_MS. Under the lock, so
 * two threads do not count the same copies. */
static void prune(svc_adapter_store *s)
{
    copy_entry *e = NULL;
    size_t n = 0, cap = 0, total = 0;
    pthread_mutex_lock(&s->lock);
    DIR *d = opendir(s->dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        struct stat st;
        char path[FILE_PATH_MAX];
        if (de->d_name[0] != CONTENT_PREFIX || strlen(de->d_name) >= SVC_ADAPTER_REF_MAX)
            continue;
        snprintf(path, sizeof path, "%s/%s", s->dir, de->d_name);
        if (stat(path, &st) != 0)
            continue;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 16;
            copy_entry *m = realloc(e, c * sizeof *e);
            if (!m)
                break; /* pruned at the next copy */
            e = m;
            cap = c;
        }
        snprintf(e[n].name, sizeof e[n].name, "%s", de->d_name);
        e[n].bytes = copy_bytes(s->dir, de->d_name);
        e[n].mtime_ms = (long long)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
        total += e[n++].bytes;
    }
    if (d)
        closedir(d);
    qsort(e, n, sizeof *e, by_mtime);
    long long keep_after = svc_wall_ms() - SVC_ADAPTER_KEEP_MS;
    for (size_t i = 0; i < n && total > s->dir_max_bytes && e[i].mtime_ms < keep_after; i++) {
        copy_remove(s->dir, e[i].name);
        total -= e[i].bytes;
        svc_log(SVC_LOG_INFO, "adapter_evicted",
                "adapter copy %s/%s (%zu bytes, least recently used) deleted: the copies are "
                "over limits.adapters_dir_bytes (%zu)",
                s->dir, e[i].name, e[i].bytes, s->dir_max_bytes);
    }
    pthread_mutex_unlock(&s->lock);
    free(e);
}

/* ---- Failures ------------------------------------------------------------- */

/* The directory cannot take the adapter: the operator's problem, logged
 * with the path, counted, and remembered for name. */
static svc_error store_failed(svc_adapter_store *s, const char *name, const char *what,
                              const char *path, int err, char *msg, size_t msglen)
{
    svc_metrics_add(SVC_COUNTER_ADAPTER_STORE_ERRORS, 1);
    svc_log(SVC_LOG_ERROR, "adapter_store_failed",
            "adapter %s: cannot %s %s: %s; model.adapters_dir (%s) must be a writable "
            "directory with room for the adapters served from Redis",
            name, what, path, strerror(err), s->dir);
    svc_errf(msg, msglen, "adapter '%s' cannot be stored on this worker", name);
    failure_remember(s, name, SVC_ERROR_ADAPTER_UNAVAILABLE, msg);
    return SVC_ERROR_ADAPTER_UNAVAILABLE;
}

static svc_error redis_failed(const char *name, svc_redis_status rs, char *msg, size_t msglen)
{
    svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
    svc_errf(msg, msglen, "adapter '%s' is not on this worker and Redis failed (%s)", name,
             svc_redis_status_name(rs));
    return SVC_ERROR_ADAPTER_UNAVAILABLE;
}

static svc_error too_large(svc_adapter_store *s, const char *name, char *msg, size_t msglen)
{
    svc_errf(msg, msglen, "adapter '%s' in Redis is over limits.max_adapter_bytes (%zu)", name,
             s->max_bytes);
    failure_remember(s, name, SVC_ERROR_ADAPTER_TOO_LARGE, msg);
    return SVC_ERROR_ADAPTER_TOO_LARGE;
}

/* The bytes Redis holds for name (digest sha256) cannot be served (why,
 * with paths: the log's); remembered for the digest, so the same bytes are
 * not fetched again while a republished adapter is. */
static svc_error refused(svc_adapter_store *s, const char *name, const char *sha256,
                         const char *why, char *msg, size_t msglen)
{
    svc_log(SVC_LOG_ERROR, "adapter_refused", "adapter %s (sha256 %s) from Redis refused: %s",
            name, sha256[0] ? sha256 : "none", why);
    svc_errf(msg, msglen, "adapter '%s' cannot be served by this worker", name);
    char key[SVC_ADAPTER_KEY_MAX];
    snprintf(key, sizeof key, "%c%s", CONTENT_PREFIX, sha256);
    failure_remember(s, key, SVC_ERROR_ADAPTER_UNAVAILABLE, msg);
    return SVC_ERROR_ADAPTER_UNAVAILABLE;
}

/* Load the adapter in dir as the runtime will; "" or why not in why. */
static void check_adapter(const svc_adapter_store *s, const char *dir, char *why, size_t n)
{
    ml_lora_adapter *a = NULL;
    why[0] = '\0';
    if (ml_lora_adapter_load(&a, dir, s->model, why, n) != ML_OK)
        return;
    if (ml_lora_adapter_rank(a) > s->max_rank)
        snprintf(why, n, "rank %d is over runtime.max_adapter_rank (%d)",
                 ml_lora_adapter_rank(a), s->max_rank);
    ml_lora_adapter_destroy(a);
}

/* ---- The store ----------------------------------------------------------- */

void svc_adapter_store_init(svc_adapter_store *s, const svc_adapter_store_config *cfg)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", cfg->dir);
    s->max_bytes = cfg->max_bytes;
    s->dir_max_bytes = cfg->dir_max_bytes;
    s->model = cfg->model;
    s->max_rank = cfg->max_rank;
    pthread_mutex_init(&s->lock, NULL);
    DIR *d = opendir(s->dir);
    if (!d)
        return;
    char staging[sizeof s->dir + sizeof((struct dirent *)0)->d_name + 1];
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, STAGING_PREFIX, strlen(STAGING_PREFIX)))
            continue;
        snprintf(staging, sizeof staging, "%s/%s", s->dir, e->d_name);
        staging_remove(staging);
    }
    closedir(d);
}

void svc_adapter_store_deinit(svc_adapter_store *s) { pthread_mutex_destroy(&s->lock); }

/* Fetch name's bytes from Redis into <dir>/@<sha256>, checked, and write
 * that name to ref. */
static svc_error fetch(svc_adapter_store *s, svc_redis *r, const char *name,
                       char ref[SVC_ADAPTER_REF_MAX], char *msg, size_t msglen)
{
    char staging[DIR_PATH_MAX], final[DIR_PATH_MAX], why[SVC_ERRMSG_MAX];
    /* Writable before anything moves: a misconfigured volume costs no
     * transfer. */
    if (mkdir(s->dir, 0755) != 0 && errno != EEXIST)
        return store_failed(s, name, "create", s->dir, errno, msg, msglen);
    snprintf(staging, sizeof staging, "%s/" STAGING_PREFIX "%s-XXXXXX", s->dir, name);
    if (!mkdtemp(staging))
        return store_failed(s, name, "create a directory in", s->dir, errno, msg, msglen);

    svc_redis_adapter a;
    svc_redis_status rs = svc_redis_adapter_get(r, name, s->max_bytes, &a);
    if (rs == SVC_REDIS_OK)
        svc_metrics_add(SVC_COUNTER_ADAPTER_FETCHES, 1); /* bytes moved */
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
    svc_error code = SVC_ERROR_NONE;
    if (strcmp(digest, a.sha256)) {
        code = refused(s, name, a.sha256, "its bytes do not hash to its sha256 field", msg,
                       msglen);
    } else if (write_synced(staging, WEIGHTS_FILE, a.weights, a.weights_len) ||
               write_synced(staging, CONFIG_FILE, a.config, a.config_len)) {
        code = store_failed(s, name, "write into", staging, errno, msg, msglen);
    } else {
        check_adapter(s, staging, why, sizeof why);
        if (why[0])
            code = refused(s, name, digest, why, msg, msglen);
    }
    size_t total = a.config_len + a.weights_len;
    svc_redis_adapter_deinit(&a);
    if (code != SVC_ERROR_NONE) {
        staging_remove(staging);
        return code;
    }
    snprintf(ref, SVC_ADAPTER_REF_MAX, "%c%s", CONTENT_PREFIX, digest);
    snprintf(final, sizeof final, "%s/%s", s->dir, ref);
    if (rename(staging, final) != 0) {
        int err = errno;
        staging_remove(staging);
        /* Another prep thread copied the same bytes first: theirs serves. */
        if ((err != EEXIST && err != ENOTEMPTY) || !adapter_present(s, ref))
            return store_failed(s, name, "rename a copy to", final, err, msg, msglen);
    } else {
        svc_log(SVC_LOG_INFO, "adapter_fetched", "adapter %s (%zu bytes, sha256 %s) into %s",
                name, total, digest, final);
    }
    pin_set(s, name, digest);
    prune(s);
    return SVC_ERROR_NONE;
}

svc_error svc_adapter_store_ensure(svc_adapter_store *s, svc_redis *r, const char *name,
                                   char ref[SVC_ADAPTER_REF_MAX], char *msg, size_t msglen)
{
    snprintf(ref, SVC_ADAPTER_REF_MAX, "%s", name);
    if (adapter_present(s, name))
        return SVC_ERROR_NONE; /* the operator's copy */
    svc_error code = failure_find(s, name, msg, msglen);
    if (code != SVC_ERROR_NONE)
        return code;
    if (!r) {
        svc_errf(msg, msglen, "adapter '%s' is unknown", name);
        return SVC_ERROR_UNKNOWN_ADAPTER;
    }
    char sha[SVC_SHA256_HEX_LEN + 1];
    if (!pin_get(s, name, sha)) {
        char known[SVC_SHA256_HEX_LEN + 1];
        memcpy(known, sha, sizeof known);
        svc_redis_status rs = svc_redis_adapter_sha256(r, name, sha);
        if (rs == SVC_REDIS_NOT_FOUND) {
            pin_set(s, name, "");
            svc_errf(msg, msglen, "adapter '%s' is unknown", name);
            return SVC_ERROR_UNKNOWN_ADAPTER;
        }
        if (rs != SVC_REDIS_OK) {
            /* Redis is a hint: the copy of the last digest known serves. */
            snprintf(ref, SVC_ADAPTER_REF_MAX, "%c%s", CONTENT_PREFIX, known);
            if (known[0] && adapter_present(s, ref))
                return SVC_ERROR_NONE;
            return redis_failed(name, rs, msg, msglen);
        }
        pin_set(s, name, sha);
    }
    snprintf(ref, SVC_ADAPTER_REF_MAX, "%c%s", CONTENT_PREFIX, sha);
    if (adapter_present(s, ref)) {
        char path[DIR_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", s->dir, ref);
        utimensat(AT_FDCWD, path, NULL, 0); /* used now: the last to go */
        return SVC_ERROR_NONE;
    }
    if ((code = failure_find(s, ref, msg, msglen)) != SVC_ERROR_NONE)
        return code;
    return fetch(s, r, name, ref, msg, msglen);
}
