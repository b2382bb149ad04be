/* Helpers for the tests that run `mllama worker` as a real process: spawning
 * and stopping processes (fork/execv, waitpid with a timeout, their output
 * in a file), a redis-server on a free port, `mllama mock-kafka`, the micro
 * model, a librdkafka client that produces requests and collects reply
 * records by request id, kcat through popen, and the checks every test
 * makes on a reply stream.
 *
 * Every wait polls for a condition up to a bound, so a broken worker fails
 * a test instead of hanging it, and nothing sleeps longer than it must.
 * Processes started here die with the test (PR_SET_PDEATHSIG) even when it
 * is killed by ctest's timeout. Everything runs on the test's main thread.
 *
 * Each test works in a fresh /tmp/mllama-<tag>-XXXXXX (model, logs of every
 * process), removed at the end unless a check failed or ML_KEEP_LOGS is set.
 *
 * Links svc (librdkafka, hiredis, cJSON). The helpers that run mllama
 * itself need ML_MLLAMA_BIN (the binary under test) as a compile
 * definition; a test that only runs redis-server (test_redis_index) leaves
 * it undefined and goes without them. */
#ifndef ML_TEST_PROC_UTIL_H
#define ML_TEST_PROC_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>

#include "protocol/base64.h"
#include "harness.h"
#include "sha256.h"

#define PU_REQUESTS "mllama.requests"
#define PU_REPLIES "mllama.replies"
#define PU_DLT "mllama.dlt"
#define PU_CANCEL "mllama.cancel"
#define PU_PATH_MAX 512
#define PU_START_MS 20000  /* a process reaching its ready state (ASan builds are slow) */
#define PU_STOP_MS 20000   /* a process exiting after SIGTERM */
#define PU_POLL_MS 20
#define PU_MAX_FD 65536    /* descriptors a child closes before exec */

/* A sanitizer build runs the model several times slower: a test that needs
 * requests to stream for a while divides their tokens by this, so both
 * builds stream for about as long. */
#if defined(__SANITIZE_ADDRESS__)
#define PU_SLOWDOWN 4
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PU_SLOWDOWN 4
#endif
#endif
#ifndef PU_SLOWDOWN
#define PU_SLOWDOWN 1
#endif

static inline int64_t pu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t pu_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline void pu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A fatal setup failure: the test cannot go on. */
static inline void pu_die(const char *what)
{
    fprintf(stderr, "FATAL: %s\n", what);
    exit(1);
}

/* ---- files -------------------------------------------------------------------- */

/* The whole file, NUL-terminated (malloc'd, owned by the caller), or NULL.
 * *len (if non-NULL) gets its size. */
static inline char *pu_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n - 1 == 0) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = n;
    }
    return buf;
}

/* The bytes of image file `path` (malloc'd, owned by the caller) and their
 * sha256 in lower-case hex into `hex`; exits when the file cannot be read. */
static inline uint8_t *pu_slurp_image(const char *path, size_t *len, char hex[ML_SHA256_HEX_SIZE])
{
    uint8_t *bytes = (uint8_t *)pu_slurp(path, len);
    if (!bytes)
        pu_die(path);
    uint8_t digest[ML_SHA256_DIGEST_SIZE];
    ml_sha256(bytes, *len, digest);
    ml_sha256_hex(digest, hex);
    return bytes;
}

static inline bool pu_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0) && ok;
}

/* A fresh directory /tmp/mllama-<tag>-XXXXXX into dir (PU_PATH_MAX). */
static inline void pu_tmpdir(const char *tag, char *dir)
{
    snprintf(dir, PU_PATH_MAX, "/tmp/mllama-%s-XXXXXX", tag);
    if (!mkdtemp(dir))
        pu_die("mkdtemp");
}

/* Remove a directory tree (the test's temporary directory). */
static inline void pu_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char path[PATH_MAX];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path)
            continue;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            pu_rmtree(path);
        else
            unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* At the end of a test: remove its directory, or keep it (and say where)
 * when a check failed or ML_KEEP_LOGS is set, for the workers' logs. */
static inline void pu_tmpdir_done(const char *dir)
{
    if (!dir[0])
        return;
    if (ml_test_failures || getenv("ML_KEEP_LOGS"))
        fprintf(stderr, "logs kept in %s\n", dir);
    else
        pu_rmtree(dir);
}

/* Occurrences of needle in the file at path (0 when unreadable). */
static inline int pu_file_count(const char *path, const char *needle)
{
    char *s = pu_slurp(path, NULL);
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    free(s);
    return n;
}

/* True when `prog` is an executable on PATH. */
static inline bool pu_which(const char *prog)
{
    const char *path = getenv("PATH");
    char buf[PU_PATH_MAX];
    for (const char *p = path; p && *p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
        if (access(buf, X_OK) == 0)
            return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

/* ---- processes ----------------------------------------------------------------- */

typedef struct pu_proc {
    pid_t pid;              /* 0: never started */
    int status;             /* waitpid status once reaped */
    bool reaped;
    char log[PU_PATH_MAX + 128]; /* stdout and stderr */
} pu_proc;

/* Start argv[0] (a path) with stdout and stderr appended to `log`. Returns
 * whether the fork succeeded (an exec failure shows as exit code 127). */
static inline bool pu_spawn(pu_proc *p, const char *log, char *const argv[])
{
    memset(p, 0, sizeof *p);
    snprintf(p->log, sizeof p->log, "%s", log);
    pid_t parent = getpid();
    long max_fd = sysconf(_SC_OPEN_MAX);
    if (max_fd < 0 || max_fd > PU_MAX_FD)
        max_fd = PU_MAX_FD;
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        /* Only async-signal-safe calls until exec: the test has threads. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        /* Inherited descriptors would keep the test's sockets open: a mock
         * broker (in the test process) that closes a connection must be
         * seen closing it, not kept alive by a child's copy. */
        for (long i = STDERR_FILENO + 1; i < max_fd; i++)
            close((int)i);
        execv(argv[0], argv);
        _exit(127);
    }
    p->pid = pid;
    return true;
}

/* Reap p if it has exited, waiting up to timeout_ms. Returns whether it has
 * exited (now or before). */
static inline bool pu_wait_exit(pu_proc *p, int timeout_ms)
{
    if (p->reaped || p->pid <= 0)
        return true;
    int64_t deadline = pu_now_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(p->pid, &p->status, WNOHANG);
        if (r == p->pid || (r < 0 && errno == ECHILD)) {
            p->reaped = true;
            return true;
        }
        if (pu_now_ms() >= deadline)
            return false;
        pu_sleep_ms(PU_POLL_MS);
    }
}

static inline bool pu_running(pu_proc *p) { return p->pid > 0 && !pu_wait_exit(p, 0); }

/* The exit code of a reaped process; 128 + signal when a signal ended it. */
static inline int pu_exit_code(const pu_proc *p)
{
    if (!p->reaped)
        return -1;
    return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status);
}

static inline void pu_signal(pu_proc *p, int sig)
{
    if (pu_running(p))
        kill(p->pid, sig);
}

/* SIGKILL and reap. */
static inline void pu_kill(pu_proc *p)
{
    pu_signal(p, SIGKILL);
    pu_wait_exit(p, PU_STOP_MS);
}

/* SIGTERM, wait up to timeout_ms, then SIGKILL. Returns the exit code (-1
 * when it had to be killed). */
static inline int pu_stop(pu_proc *p, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    pu_signal(p, SIGTERM);
    if (!pu_wait_exit(p, timeout_ms)) {
        fprintf(stderr, "%s: did not exit %d ms after SIGTERM; killing it\n", p->log,
                timeout_ms);
        pu_kill(p);
        return -1;
    }
    return pu_exit_code(p);
}

/* Wait until the process's log holds `needle` at least `count` times.
 * Returns false at the timeout or when the process exits first. */
static inline bool pu_wait_log(pu_proc *p, const char *needle, int count, int timeout_ms)
{
    int64_t deadline = pu_now_ms() + timeout_ms;
    for (;;) {
        if (pu_file_count(p->log, needle) >= count)
            return true;
        if (!pu_running(p)) {
            fprintf(stderr, "%s: exited (code %d) before logging '%s'\n", p->log,
                    pu_exit_code(p), needle);
            return false;
        }
        if (pu_now_ms() >= deadline)
            return false;
        pu_sleep_ms(PU_POLL_MS);
    }
}

/* Run argv to completion (output to log), up to timeout_ms. Returns the exit
 * code, or -1 when it had to be killed. */
static inline int pu_run(char *const argv[], const char *log, int timeout_ms)
{
    pu_proc p;
    if (!pu_spawn(&p, log, argv))
        return -1;
    if (!pu_wait_exit(&p, timeout_ms)) {
        pu_kill(&p);
        return -1;
    }
    return pu_exit_code(&p);
}

/* Print the tail of a process's log (to explain a failure). */
static inline void pu_show_log(const char *log, size_t tail)
{
    size_t n;
    char *s = pu_slurp(log, &n);
    if (!s)
        return;
    fprintf(stderr, "---- %s (last %zu bytes) ----\n%s\n----\n", log, n < tail ? n : tail,
            s + (n > tail ? n - tail : 0));
    free(s);
}

/* No sanitizer report in a log: ASan, LeakSanitizer and UBSan all write
 * these markers. Checked for every worker a test ran. */
static inline void pu_check_log_clean(const char *log)
{
    static const char *const markers[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                          "runtime error:"};
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        int n = pu_file_count(log, markers[i]);
        check(n == 0, "%s: %d sanitizer reports (%s)", log, n, markers[i]);
        if (n)
            pu_show_log(log, 6000);
    }
}

/* ---- redis-server ----------------------------------------------------------------- */

static inline int pu_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

typedef struct pu_redis {
    pu_proc proc;
    int port;
    char dir[PU_PATH_MAX];
    char url[64]; /* redis://127.0.0.1:<port>/0 */
} pu_redis;

/* A reply to one command on a new connection (NULL when the server is not
 * reachable); the caller frees it with freeReplyObject. */
static inline redisReply *pu_redis_cmd(const pu_redis *r, const char *fmt, ...)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return rep;
}

/* EXISTS key: 1, 0, or -1 when the server does not answer. */
static inline int pu_redis_exists(const pu_redis *r, const char *key)
{
    redisReply *rep = pu_redis_cmd(r, "EXISTS %s", key);
    int v = rep && rep->type == REDIS_REPLY_INTEGER ? (int)rep->integer : -1;
    freeReplyObject(rep);
    return v;
}

/* Start redis-server on r->port (0: a free one) with no persistence, its
 * files under dir, and wait until it answers PING. */
static inline bool pu_redis_start(pu_redis *r, const char *dir, int port)
{
    if (dir != r->dir) /* a restart passes r->dir */
        snprintf(r->dir, sizeof r->dir, "%s", dir);
    for (int tries = 0; tries < 3; tries++) {
        r->port = port ? port : pu_free_port();
        snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d/0", r->port);
        char port_s[16], log[PU_PATH_MAX + 16];
        snprintf(port_s, sizeof port_s, "%d", r->port);
        snprintf(log, sizeof log, "%s/redis.log", r->dir);
        char *argv[] = {"/usr/bin/env", "redis-server", "--port", port_s, "--bind", "127.0.0.1",
                        "--save", "", "--appendonly", "no", "--dir", r->dir, NULL};
        if (!pu_spawn(&r->proc, log, argv))
            return false;
        for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < PU_START_MS; pu_sleep_ms(PU_POLL_MS)) {
            redisReply *rep = pu_redis_cmd(r, "PING");
            bool ok = rep && rep->type == REDIS_REPLY_STATUS;
            freeReplyObject(rep);
            if (ok)
                return true;
            if (!pu_running(&r->proc))
                break; /* the port was taken meanwhile: try another */
        }
        pu_kill(&r->proc);
        if (port)
            break;
    }
    return false;
}

/* ---- mllama processes --------------------------------------------------------------- */

#ifdef ML_MLLAMA_BIN
#define PU_MLLAMA ML_MLLAMA_BIN

/* Write the micro model (56-pixel tiles: images cost milliseconds) to dir. */
static inline bool pu_make_model(const char *dir, const char *log)
{
    char *argv[] = {PU_MLLAMA, "mkmodel", "--preset", "micro", "--out", (char *)dir, NULL};
    return pu_run(argv, log, PU_START_MS) == 0;
}

/* More `mllama mock-kafka` arguments (up to PU_MOCK_ARGS_MAX, NULL-
 * terminated), for a test that injects faults (--topic-error); set before
 * the mock starts. */
#define PU_MOCK_ARGS_MAX 8
static const char *const *pu_mock_kafka_args = NULL;

/* `mllama mock-kafka` with topics "name:parts,..."; its bootstrap servers go
 * to bootstraps (cap bytes). */
static inline bool pu_mock_kafka_start(pu_proc *p, const char *dir, const char *topics,
                                       char *bootstraps, size_t cap)
{
    char port_file[PU_PATH_MAX + 16], log[PU_PATH_MAX + 16];
    snprintf(port_file, sizeof port_file, "%s/bootstrap", dir);
    snprintf(log, sizeof log, "%s/mock-kafka.log", dir);
    char *argv[8 + PU_MOCK_ARGS_MAX + 1] = {PU_MLLAMA, "mock-kafka", "--brokers", "1", "--topics",
                                            (char *)topics, "--port-file", port_file};
    for (int i = 0; pu_mock_kafka_args && pu_mock_kafka_args[i] && i < PU_MOCK_ARGS_MAX; i++)
        argv[8 + i] = (char *)pu_mock_kafka_args[i];
    if (!pu_spawn(p, log, argv))
        return false;
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < PU_START_MS; pu_sleep_ms(PU_POLL_MS)) {
        char *s = pu_slurp(port_file, NULL);
        if (s && s[0]) {
            s[strcspn(s, "\r\n")] = '\0';
            snprintf(bootstraps, cap, "%s", s);
            free(s);
            return true;
        }
        free(s);
        if (!pu_running(p))
            break;
    }
    pu_show_log(log, 2000);
    return false;
}

/* The usual stack of a worker test, in a fresh pu_tmpdir(tag, dir): the
 * micro model in dir/micro (path to model, PU_PATH_MAX + 16 bytes), a
 * redis-server and a mock Kafka cluster with `topics` (bootstraps to
 * brokers, cap bytes). Dies on any failure. */
static inline void pu_micro_stack_start(const char *tag, char *dir, char *model,
                                        pu_redis *redis, pu_proc *kafka, const char *topics,
                                        char *brokers, size_t cap)
{
    pu_tmpdir(tag, dir);
    snprintf(model, PU_PATH_MAX + 16, "%s/micro", dir);
    char log[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    if (!pu_make_model(model, log) || !pu_redis_start(redis, dir, 0) ||
        !pu_mock_kafka_start(kafka, dir, topics, brokers, cap))
        pu_die("setup");
}

/* What every worker of a test shares. */
typedef struct pu_worker_env {
    const char *brokers;
    const char *redis_url;
    const char *model_dir;
    const char *dir; /* logs go to <dir>/<name>.log */
} pu_worker_env;

#define PU_MAX_SETS 24

/* The settings every test worker gets after its addresses. Group timings
 * small enough for the mock's rebalance rounds (about session.timeout.ms -
 * 1 s each); frequent commits; a short fetch wait, because the mock answers
 * a Fetch that finds no data only after fetch.wait.max.ms and is not woken
 * by a produce (the 500 ms default delays every request by up to 500 ms);
 * fast Redis heartbeats; one CPU thread per worker (tests run several on
 * two cores); an ephemeral HTTP port. */
static const char *const pu_worker_defaults[] = {
    "http.listen=127.0.0.1:0",         "kafka.session.timeout.ms=3000",
    "kafka.heartbeat.interval.ms=500", "kafka.auto.commit.interval.ms=500",
    "kafka.fetch.wait.max.ms=20",      "redis.heartbeat_s=1",
    "model.threads=1",
};

/* Start `mllama worker` named `name` (its worker_id and log <dir>/<name>.log)
 * with pu_worker_defaults, then the `extra` --set overrides (NULL-terminated,
 * may be NULL; a later setting of a key wins). Waits for worker_started. */
static inline bool pu_worker_start(pu_proc *p, const pu_worker_env *env, const char *name,
                                   const char *const *extra)
{
    static char sets[PU_MAX_SETS][2 * PU_PATH_MAX];
    int n = 0;
    snprintf(sets[n++], sizeof sets[0], "kafka.brokers=%s", env->brokers);
    snprintf(sets[n++], sizeof sets[0], "redis.url=%s", env->redis_url);
    snprintf(sets[n++], sizeof sets[0], "model.dir=%s", env->model_dir);
    snprintf(sets[n++], sizeof sets[0], "worker_id=%s", name);
    for (size_t i = 0; i < sizeof pu_worker_defaults / sizeof pu_worker_defaults[0]; i++)
        snprintf(sets[n++], sizeof sets[0], "%s", pu_worker_defaults[i]);
    for (size_t i = 0; extra && extra[i] && n < PU_MAX_SETS; i++)
        snprintf(sets[n++], sizeof sets[0], "%s", extra[i]);
    char *argv[2 + 2 * PU_MAX_SETS + 1];
    int argc = 0;
    argv[argc++] = PU_MLLAMA;
    argv[argc++] = "worker";
    for (int i = 0; i < n; i++) {
        argv[argc++] = "--set";
        argv[argc++] = sets[i];
    }
    argv[argc] = NULL;
    char log[PU_PATH_MAX + 64];
    snprintf(log, sizeof log, "%s/%s.log", env->dir, name);
    if (!pu_spawn(p, log, argv) || !pu_wait_log(p, "\"worker_started\"", 1, PU_START_MS)) {
        pu_show_log(log, 4000);
        return false;
    }
    return true;
}

/* The worker's HTTP port, from its worker_started line; -1 if not found. */
static inline int pu_worker_http_port(const pu_proc *p)
{
    char *s = pu_slurp(p->log, NULL);
    const char *at = s ? strstr(s, "\"worker_started\"") : NULL;
    const char *http = at ? strstr(at, "http :") : NULL;
    int port = http ? atoi(http + 6) : -1;
    free(s);
    return port;
}

/* GET http://127.0.0.1:port/path; the response body (malloc'd) or NULL. */
static inline char *pu_http_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {2, 0};
    if (fd < 0)
        return NULL;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (ssize_t got; buf && len < cap - 1 && (got = read(fd, buf + len, cap - 1 - len)) > 0;)
        len += (size_t)got;
    close(fd);
    if (!buf)
        return NULL;
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (!body) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* Sum of every sample of a Prometheus metric (all label sets); -1 when the
 * page could not be read. */
static inline double pu_metric(int port, const char *name)
{
    char *page = pu_http_get(port, "/metrics");
    if (!page)
        return -1;
    double sum = 0;
    size_t n = strlen(name);
    for (const char *line = page; line && *line;) {
        if (!strncmp(line, name, n) && (line[n] == '{' || line[n] == ' ')) {
            const char *v = strchr(line, ' ');
            if (v)
                sum += strtod(v, NULL);
        }
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    free(page);
    return sum;
}

/* Wait until the worker holds at least one partition of the request topic
 * (its mllama_kafka_assigned_partitions gauge). */
static inline bool pu_wait_assigned(pu_proc *p, int timeout_ms)
{
    int port = pu_worker_http_port(p);
    for (int64_t deadline = pu_now_ms() + timeout_ms; pu_now_ms() < deadline && pu_running(p);
         pu_sleep_ms(50))
        if (pu_metric(port, "mllama_kafka_assigned_partitions") > 0)
            return true;
    return false;
}

#endif /* ML_MLLAMA_BIN */

/* ---- kcat ---------------------------------------------------------------------- */

/* Run a shell command and return its stdout (malloc'd; NULL if it could not
 * run). *code gets its exit status. */
static inline char *pu_shell(const char *cmd, int *code)
{
    FILE *f = popen(cmd, "r");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (cap - len - 1 == 0) {
            char *grown = realloc(buf, cap * 2);
            if (!grown)
                break;
            buf = grown;
            cap *= 2;
        }
    }
    int st = pclose(f);
    if (code)
        *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (buf)
        buf[len] = '\0';
    return buf;
}

/* ---- request bodies ------------------------------------------------------------- */

/* "data:image/jpeg;base64,..." of bytes (malloc'd). */
static inline char *pu_data_url(const void *bytes, size_t n)
{
    static const char prefix[] = "data:image/jpeg;base64,";
    char *url = malloc(sizeof prefix + svc_base64_encoded_len(n) + 1);
    if (!url)
        pu_die("out of memory");
    memcpy(url, prefix, sizeof prefix - 1);
    svc_base64_encode(bytes, n, url + sizeof prefix - 1);
    return url;
}

/* A chat request body: one user message with `image_part` (a JSON content
 * part, or NULL) then the text, reply_topic mllama.replies, and `extra`
 * top-level members ("\"max_tokens\":8,...", or ""). Malloc'd. */
static inline char *pu_chat_request(const char *id, const char *text, const char *image_part,
                                    const char *extra)
{
    cJSON *t = cJSON_CreateString(text);
    char *quoted = cJSON_PrintUnformatted(t);
    cJSON_Delete(t);
    if (!quoted)
        pu_die("out of memory");
    size_t cap = strlen(id) + strlen(quoted) + (image_part ? strlen(image_part) : 0) +
                 strlen(extra) + 256;
    char *s = malloc(cap);
    if (!s)
        pu_die("out of memory");
    snprintf(s, cap,
             "{\"id\":\"%s\",\"reply_topic\":\"" PU_REPLIES "\",%s%s\"messages\":[{\"role\":"
             "\"user\",\"content\":[%s%s{\"type\":\"text\",\"text\":%s}]}]}",
             id, extra, extra[0] ? "," : "", image_part ? image_part : "", image_part ? "," : "",
             quoted);
    free(quoted);
    return s;
}

/* {"type":"image_url","image_url":{"url":"<data url>"}} for bytes (malloc'd). */
static inline char *pu_image_part(const void *bytes, size_t n)
{
    char *url = pu_data_url(bytes, n);
    size_t cap = strlen(url) + 64;
    char *s = malloc(cap);
    if (!s)
        pu_die("out of memory");
    snprintf(s, cap, "{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}}", url);
    free(url);
    return s;
}

/* ---- a Kafka client ---------------------------------------------------------------- */

/* One record read back (replies or dead letters). */
typedef struct pu_record {
    char *topic, *key, *value;      /* owned, NUL-terminated ("" when absent) */
    int32_t partition;
    int64_t offset;
    int64_t attempt;                /* header; -1 when absent */
    int seq;                        /* header; -1 when absent */
    bool final;                     /* header final == "true" */
    char *headers;                  /* owned: "name=value\n..." of every header */
    int64_t t_us;                   /* monotonic microseconds when it was read */
} pu_record;

typedef struct pu_client {
    rd_kafka_t *producer, *consumer;
    pu_record *recs;
    size_t n, cap;
    int delivery_errors;
    int32_t last_partition; /* where the last produced record went */
    int64_t last_offset;
} pu_client;

/* fetch.wait.max.ms of the client's consumer: the mock answers a Fetch that
 * finds nothing only after it, so it bounds how late a reply is seen (a
 * benchmark lowers it before pu_client_init). */
static const char *pu_client_fetch_wait_ms = "10";
/* message.max.bytes of the client's producer: a test that sends records
 * over librdkafka's default raises it before pu_client_init. */
static const char *pu_client_message_max_bytes = "1000000";

static inline void pu_client_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    pu_client *c = opaque;
    if (m->err) {
        fprintf(stderr, "client delivery: %s\n", rd_kafka_err2str(m->err));
        c->delivery_errors++;
    }
    c->last_partition = m->partition;
    c->last_offset = m->offset;
}

static inline rd_kafka_conf_t *pu_client_conf(const char *brokers)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char err[256];
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err) ||
        rd_kafka_conf_set(conf, "log_level", "2", err, sizeof err))
        pu_die(err);
    return conf;
}

/* A producer (idempotent, no linger) and a consumer that reads every
 * partition of `topics` (n of them) from the beginning. */
static inline void pu_client_init(pu_client *c, const char *brokers, const char *const *topics,
                                  int n_topics)
{
    memset(c, 0, sizeof *c);
    char err[256];
    rd_kafka_conf_t *pc = pu_client_conf(brokers);
    if (rd_kafka_conf_set(pc, "enable.idempotence", "true", err, sizeof err) ||
        rd_kafka_conf_set(pc, "linger.ms", "0", err, sizeof err) ||
        rd_kafka_conf_set(pc, "message.max.bytes", pu_client_message_max_bytes, err, sizeof err))
        pu_die(err);
    rd_kafka_conf_set_dr_msg_cb(pc, pu_client_dr);
    rd_kafka_conf_set_opaque(pc, c);
    if (!(c->producer = rd_kafka_new(RD_KAFKA_PRODUCER, pc, err, sizeof err)))
        pu_die(err);

    rd_kafka_conf_t *cc = pu_client_conf(brokers);
    if (rd_kafka_conf_set(cc, "group.id", "pu-client", err, sizeof err) ||
        rd_kafka_conf_set(cc, "enable.auto.commit", "false", err, sizeof err) ||
        rd_kafka_conf_set(cc, "fetch.wait.max.ms", pu_client_fetch_wait_ms, err, sizeof err) ||
        rd_kafka_conf_set(cc, "fetch.error.backoff.ms", "50", err, sizeof err))
        pu_die(err);
    if (!(c->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, cc, err, sizeof err)))
        pu_die(err);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(16);
    for (int t = 0; t < n_topics; t++) {
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(c->consumer, topics[t], NULL);
        const rd_kafka_metadata_t *md = NULL;
        rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR__TIMED_OUT;
        for (int tries = 0; tries < 20 && e; tries++) {
            e = rd_kafka_metadata(c->consumer, 0, rkt, &md, 5000);
            if (!e && (md->topic_cnt != 1 || md->topics[0].err ||
                       md->topics[0].partition_cnt == 0)) {
                rd_kafka_metadata_destroy(md);
                e = RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
                pu_sleep_ms(100);
            }
        }
        if (e)
            pu_die("client: no metadata for a topic");
        for (int p = 0; p < md->topics[0].partition_cnt; p++)
            rd_kafka_topic_partition_list_add(parts, topics[t], p)->offset =
                RD_KAFKA_OFFSET_BEGINNING;
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(rkt);
    }
    if (rd_kafka_assign(c->consumer, parts))
        pu_die("client: assign");
    rd_kafka_topic_partition_list_destroy(parts);
}

static inline void pu_client_deinit(pu_client *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->recs[i].topic);
        free(c->recs[i].key);
        free(c->recs[i].value);
        free(c->recs[i].headers);
    }
    free(c->recs);
    if (c->consumer) {
        rd_kafka_consumer_close(c->consumer);
        rd_kafka_destroy(c->consumer);
    }
    if (c->producer) {
        rd_kafka_flush(c->producer, 5000);
        rd_kafka_destroy(c->producer);
    }
    memset(c, 0, sizeof *c);
}

static inline char *pu_strndup0(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        pu_die("out of memory");
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* Produce one record (key may be NULL; headers: n_headers name/value pairs
 * as 2*n strings) and wait for its delivery. partition -1: by key. */
static inline bool pu_client_send_to(pu_client *c, const char *topic, int32_t partition,
                                     const char *key, const void *value, size_t len,
                                     const char *const *headers, int n_headers)
{
    rd_kafka_headers_t *hs = rd_kafka_headers_new((size_t)n_headers);
    for (int i = 0; i < n_headers; i++)
        rd_kafka_header_add(hs, headers[2 * i], -1, headers[2 * i + 1], -1);
    int errors = c->delivery_errors;
    rd_kafka_resp_err_t e = rd_kafka_producev(
        c->producer, RD_KAFKA_V_TOPIC(topic),
        RD_KAFKA_V_PARTITION(partition < 0 ? RD_KAFKA_PARTITION_UA : partition),
        RD_KAFKA_V_KEY(key, key ? strlen(key) : 0), RD_KAFKA_V_VALUE((void *)value, len),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hs), RD_KAFKA_V_END);
    if (e) {
        rd_kafka_headers_destroy(hs);
        fprintf(stderr, "client produce: %s\n", rd_kafka_err2str(e));
        return false;
    }
    return rd_kafka_flush(c->producer, 30000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
           c->delivery_errors == errors;
}

/* A request keyed by its id. */
static inline bool pu_client_send(pu_client *c, const char *id, const char *body)
{
    return pu_client_send_to(c, PU_REQUESTS, -1, id, body, strlen(body), NULL, 0);
}

/* A decimal header (attempts go up to 2^32 - 1: worker.h); -1 when absent. */
static inline int64_t pu_header_num(rd_kafka_headers_t *hs, const char *name)
{
    const void *v;
    size_t n;
    if (!hs || rd_kafka_header_get_last(hs, name, &v, &n) || !v || n == 0 || n > 20)
        return -1;
    char buf[24];
    memcpy(buf, v, n);
    buf[n] = '\0';
    return strtoll(buf, NULL, 10);
}

/* Read whatever arrived within timeout_ms (at least one poll). Returns the
 * number of records read. */
static inline int pu_client_poll(pu_client *c, int timeout_ms)
{
    int got = 0;
    int64_t deadline = pu_now_ms() + timeout_ms;
    do {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->consumer, PU_POLL_MS);
        if (!m)
            continue;
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                fprintf(stderr, "client consume: %s\n", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            continue;
        }
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 256;
            c->recs = realloc(c->recs, c->cap * sizeof *c->recs);
            if (!c->recs)
                pu_die("out of memory");
        }
        pu_record *r = &c->recs[c->n++];
        r->topic = pu_strndup0(rd_kafka_topic_name(m->rkt), strlen(rd_kafka_topic_name(m->rkt)));
        r->key = pu_strndup0(m->key, m->key ? m->key_len : 0);
        r->value = pu_strndup0(m->payload, m->payload ? m->len : 0);
        r->partition = m->partition;
        r->offset = m->offset;
        r->t_us = pu_now_us();
        rd_kafka_headers_t *hs = NULL;
        rd_kafka_message_headers(m, &hs);
        r->attempt = pu_header_num(hs, "attempt");
        r->seq = (int)pu_header_num(hs, "seq");
        const void *v;
        size_t n;
        r->final = hs && !rd_kafka_header_get_last(hs, "final", &v, &n) && n == 4 &&
                   !memcmp(v, "true", 4);
        size_t cap = 1;
        const char *name;
        for (size_t i = 0; hs && !rd_kafka_header_get_all(hs, i, &name, &v, &n); i++)
            cap += strlen(name) + n + 2;
        r->headers = malloc(cap);
        if (!r->headers)
            pu_die("out of memory");
        size_t len = 0;
        for (size_t i = 0; hs && !rd_kafka_header_get_all(hs, i, &name, &v, &n); i++)
            len += (size_t)snprintf(r->headers + len, cap - len, "%s=%.*s\n", name, (int)n,
                                    v ? (const char *)v : "");
        r->headers[len] = '\0';
        rd_kafka_message_destroy(m);
        got++;
    } while (pu_now_ms() < deadline);
    return got;
}

/* Records of request `id` on the reply topic, in arrival order: up to max
 * pointers into the client (valid until the next poll). Returns the count. */
static inline size_t pu_client_replies(const pu_client *c, const char *id, const pu_record **out,
                                       size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->recs[i].topic, PU_REPLIES) && !strcmp(c->recs[i].key, id)) {
            if (n < max)
                out[n] = &c->recs[i];
            n++;
        }
    return n;
}

/* The last final record of request `id`, or NULL. */
static inline const pu_record *pu_client_final(const pu_client *c, const char *id)
{
    const pu_record *f = NULL;
    for (size_t i = 0; i < c->n; i++)
        if (c->recs[i].final && !strcmp(c->recs[i].topic, PU_REPLIES) &&
            !strcmp(c->recs[i].key, id))
            f = &c->recs[i];
    return f;
}

/* The first record on `topic` whose key is `key`, or NULL. */
static inline const pu_record *pu_client_find(const pu_client *c, const char *topic,
                                              const char *key)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->recs[i].topic, topic) && !strcmp(c->recs[i].key, key))
            return &c->recs[i];
    return NULL;
}

/* Poll until every one of the n ids (id i is ids + i * stride) has a final
 * record, up to timeout_ms. Returns how many have one. */
static inline int pu_client_wait_finals(pu_client *c, const char *ids, size_t stride, int n,
                                        int timeout_ms)
{
    int64_t deadline = pu_now_ms() + timeout_ms;
    for (;;) {
        int done = 0;
        for (int i = 0; i < n; i++)
            done += pu_client_final(c, ids + (size_t)i * stride) != NULL;
        if (done == n || pu_now_ms() >= deadline)
            return done;
        pu_client_poll(c, 50);
    }
}

/* Wait for the final record of one request (NULL at the timeout). */
static inline const pu_record *pu_client_wait(pu_client *c, const char *id, int timeout_ms)
{
    pu_client_wait_finals(c, id, 0, 1, timeout_ms);
    return pu_client_final(c, id);
}

/* End offsets (high watermarks) of partitions 0..n-1 of topic. */
static inline bool pu_end_offsets(pu_client *c, const char *topic, int n, int64_t *out)
{
    for (int p = 0; p < n; p++) {
        int64_t lo;
        if (rd_kafka_query_watermark_offsets(c->consumer, topic, p, &lo, &out[p], 5000))
            return false;
    }
    return true;
}

/* Offsets committed by `group` for partitions 0..n-1 of topic (negative
 * when none), read through a handle of its own that does not join. */
static inline bool pu_committed(const char *brokers, const char *group, const char *topic, int n,
                                int64_t *out)
{
    rd_kafka_conf_t *conf = pu_client_conf(brokers);
    char err[256];
    if (rd_kafka_conf_set(conf, "group.id", group, err, sizeof err))
        pu_die(err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk)
        pu_die(err);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int p = 0; p < n; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    rd_kafka_resp_err_t e = rd_kafka_committed(rk, l, 10000);
    for (int p = 0; p < n; p++)
        out[p] = l->elems[p].err ? -1 : l->elems[p].offset;
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return e == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* The delivery contract on the records of one request: within each attempt
 * the seqs run 0, 1, 2, ... in order with no gap or duplicate, at most one
 * final record which is the attempt's last; at least one attempt ends with a
 * final record. Attempts are told apart by their number, whatever it is
 * (uncounted ones are large: worker.h). With `lossy` (a worker may have
 * lost records: worker.h), an attempt superseded by a later one may skip
 * seqs, and may show a record again, byte for byte: librdkafka's mock
 * cluster does not drop an idempotent producer's retry of a batch it stored
 * just before its broker went down (a broker drops it by its sequence
 * number), and a frontend drops an (attempt, seq) it has seen (README.md,
 * "Delivery contract"). Returns the number of attempts seen (0 when there
 * are no records), reporting violations as check failures. */
typedef struct pu_attempt_state {
    int64_t attempt;
    int next_seq;
    bool done;
} pu_attempt_state;

/* Whether a record before c->recs[i] has r's topic, key, attempt, seq and value. */
static inline bool pu_seen_before(const pu_client *c, size_t i, const pu_record *r)
{
    for (size_t k = 0; k < i; k++) {
        const pu_record *e = &c->recs[k];
        if (e->attempt == r->attempt && e->seq == r->seq && !strcmp(e->topic, r->topic) &&
            !strcmp(e->key, r->key) && !strcmp(e->value, r->value))
            return true;
    }
    return false;
}

static inline int pu_check_stream_at(const pu_client *c, const char *id, bool lossy)
{
    enum { MAX_ATTEMPTS = 16 };
    pu_attempt_state at[MAX_ATTEMPTS];
    int n = 0, finals = 0;
    /* Attempts in the order they began; all but the last are superseded. */
    for (size_t i = 0; i < c->n; i++) {
        const pu_record *r = &c->recs[i];
        if (strcmp(r->topic, PU_REPLIES) || strcmp(r->key, id))
            continue;
        int a = 0;
        while (a < n && at[a].attempt != r->attempt)
            a++;
        if (a == n && n == MAX_ATTEMPTS) {
            check(0, "%s: more than %d attempts", id, MAX_ATTEMPTS);
            return n;
        }
        if (a == n)
            at[n++] = (pu_attempt_state){r->attempt, 0, false};
    }
    for (size_t i = 0; i < c->n; i++) {
        const pu_record *r = &c->recs[i];
        if (strcmp(r->topic, PU_REPLIES) || strcmp(r->key, id))
            continue;
        int a = 0;
        while (at[a].attempt != r->attempt)
            a++;
        check(r->attempt >= 1, "%s: record with attempt header %lld", id, (long long)r->attempt);
        check(!at[a].done, "%s: attempt %lld has a record after its final one", id,
              (long long)r->attempt);
        bool superseded = lossy && a < n - 1;
        if (superseded && r->seq < at[a].next_seq && pu_seen_before(c, i, r)) {
            check(!r->final, "%s: attempt %lld: its final record again", id,
                  (long long)r->attempt);
            continue;
        }
        bool skipped = superseded && r->seq > at[a].next_seq;
        check(r->seq == at[a].next_seq || skipped, "%s: attempt %lld: seq %d where %d was due",
              id, (long long)r->attempt, r->seq, at[a].next_seq);
        at[a].next_seq = r->seq + 1;
        if (r->final) {
            at[a].done = true;
            finals++;
        }
    }
    check(n == 0 || finals >= 1, "%s: %d attempts and no final record", id, n);
    return n;
}

static inline int pu_check_stream(const pu_client *c, const char *id)
{
    return pu_check_stream_at(c, id, false);
}

/* Parse a record value (cJSON, owned by the caller) and return it, or NULL
 * after a check failure. */
static inline cJSON *pu_json(const pu_record *r)
{
    cJSON *j = r ? cJSON_Parse(r->value) : NULL;
    check(j != NULL, "record value is not JSON: %.200s", r ? r->value : "(no record)");
    return j;
}

/* The item at a path of object keys / array indexes ("choices", "0",
 * "finish_reason"), NULL-terminated; NULL when absent. */
static inline const cJSON *pu_json_at(const cJSON *j, const char *const *path)
{
    for (; j && *path; path++)
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(*path))
                             : cJSON_GetObjectItemCaseSensitive(j, *path);
    return j;
}

/* The string at a path (pu_json_at); NULL when absent or not a string. */
static inline const char *pu_json_str(const cJSON *j, const char *const *path)
{
    j = pu_json_at(j, path);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

/* The number at a path (pu_json_at); NAN when absent. */
static inline double pu_json_num(const cJSON *j, const char *const *path)
{
    j = pu_json_at(j, path);
    return cJSON_IsNumber(j) ? j->valuedouble : NAN;
}

#define PU_PATH(...) ((const char *const[]){__VA_ARGS__, NULL})

/* finish_reason of a chunk or completion record. */
static inline const char *pu_finish_reason(const cJSON *j)
{
    return pu_json_str(j, PU_PATH("choices", "0", "finish_reason"));
}

/* error.code of a final record, or NULL. */
static inline const char *pu_error_code(const cJSON *j)
{
    return pu_json_str(j, PU_PATH("error", "code"));
}

#endif
