/* The process helpers of the worker tests (proc_util.h). Everything runs on
 * the test's main thread. */
#include "proc_util.h"

#include <arpa/inet.h>
#include <poll.h>

#include "config.h"

int64_t pu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t pu_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void pu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

_Noreturn void pu_die(const char *what)
{
    fprintf(stderr, "FATAL: %s\n", what);
    exit(1);
}

char *pu_slurp(const char *path, size_t *len)
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

uint8_t *pu_slurp_image(const char *path, size_t *len, char hex[ML_SHA256_HEX_SIZE])
{
    uint8_t *bytes = (uint8_t *)pu_slurp(path, len);
    if (!bytes)
        pu_die(path);
    uint8_t digest[ML_SHA256_DIGEST_SIZE];
    ml_sha256(bytes, *len, digest);
    ml_sha256_hex(digest, hex);
    return bytes;
}

bool pu_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0) && ok;
}

void pu_tmpdir(const char *tag, char *dir)
{
    snprintf(dir, PU_PATH_MAX, "/tmp/mllama-%s-XXXXXX", tag);
    if (!mkdtemp(dir))
        pu_die("mkdtemp");
}

void pu_rmtree(const char *dir)
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

void pu_tmpdir_done(const char *dir)
{
    if (!dir[0])
        return;
    if (ml_test_failures || getenv("ML_KEEP_LOGS"))
        fprintf(stderr, "logs kept in %s\n", dir);
    else
        pu_rmtree(dir);
}

int pu_file_count(const char *path, const char *needle)
{
    char *s = pu_slurp(path, NULL);
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    free(s);
    return n;
}

bool pu_which(const char *prog)
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

bool pu_spawn(pu_proc *p, const char *log, char *const argv[])
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

bool pu_wait_exit(pu_proc *p, int timeout_ms)
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

bool pu_running(pu_proc *p) { return p->pid > 0 && !pu_wait_exit(p, 0); }

int pu_exit_code(const pu_proc *p)
{
    if (!p->reaped)
        return -1;
    return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status);
}

void pu_signal(pu_proc *p, int sig)
{
    if (pu_running(p))
        kill(p->pid, sig);
}

void pu_kill(pu_proc *p)
{
    pu_signal(p, SIGKILL);
    pu_wait_exit(p, PU_STOP_MS);
}

int pu_stop(pu_proc *p, int timeout_ms)
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

bool pu_wait_log(pu_proc *p, const char *needle, int count, int timeout_ms)
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

int pu_run(char *const argv[], const char *log, int timeout_ms)
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

void pu_show_log(const char *log, size_t tail)
{
    size_t n;
    char *s = pu_slurp(log, &n);
    if (!s)
        return;
    fprintf(stderr, "---- %s (last %zu bytes) ----\n%s\n----\n", log, n < tail ? n : tail,
            s + (n > tail ? n - tail : 0));
    free(s);
}

void pu_check_log_clean(const char *log)
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

void pu_worker_drain(pu_proc *p)
{
    int code = pu_stop(p, PU_STOP_MS);
    check(code == 0, "exit code %d after SIGTERM", code);
    if (code != 0)
        pu_show_log(p->log, 3000);
    pu_check_log_clean(p->log);
}

int pu_free_port(void)
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

static redisReply *pu_redis_vcmd(int port, const char *user, const char *pw,
                                 const char *fmt, va_list ap)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (user)
        freeReplyObject(redisCommand(c, "AUTH %s %s", user, pw));
    redisReply *rep = redisvCommand(c, fmt, ap);
    redisFree(c);
    return rep;
}

redisReply *pu_redis_cmd(const pu_redis *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = pu_redis_vcmd(r->port, NULL, NULL, fmt, ap);
    va_end(ap);
    return rep;
}

redisReply *pu_redis_cmd_as(int port, const char *user, const char *pw, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = pu_redis_vcmd(port, user, pw, fmt, ap);
    va_end(ap);
    return rep;
}

long pu_redis_calls(const redisReply *info, const char *command)
{
    if (!info || info->type != REDIS_REPLY_STRING)
        return -1;
    char needle[64];
    snprintf(needle, sizeof needle, "cmdstat_%s:calls=", command);
    const char *at = strstr(info->str, needle);
    return at ? atol(at + strlen(needle)) : 0;
}

int pu_redis_exists(const pu_redis *r, const char *key)
{
    redisReply *rep = pu_redis_cmd(r, "EXISTS %s", key);
    int v = rep && rep->type == REDIS_REPLY_INTEGER ? (int)rep->integer : -1;
    freeReplyObject(rep);
    return v;
}

bool pu_redis_wait_exists(const pu_redis *r, const char *key, int timeout_ms)
{
    int64_t deadline = pu_now_ms() + timeout_ms;
    while (pu_redis_exists(r, key) != 1 && pu_now_ms() < deadline)
        pu_sleep_ms(50);
    return pu_redis_exists(r, key) == 1;
}

bool pu_redis_start(pu_redis *r, const char *dir, int port)
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

typedef struct trickle_conn {
    pu_trickle *t;
    int fd;
} trickle_conn;

/* Serve one connection of the trickling Redis (pu_trickle), on a thread of
 * its own. */
static void *trickle_serve(void *arg)
{
    trickle_conn *tc = arg;
    pu_trickle *t = tc->t;
    static const char reply[] = "$1048576\r\n";
    char buf[256];
    (void)!read(tc->fd, buf, sizeof buf); /* the command: whatever it is */
    for (int64_t t0 = pu_now_ms(), i = 0; !atomic_load(&t->stop) &&
                                          pu_now_ms() - t0 < PU_TRICKLE_FOR_MS; i++) {
        char c = i < (int64_t)sizeof reply - 1 ? reply[i] : 'x';
        if (send(tc->fd, &c, 1, MSG_NOSIGNAL) != 1)
            break; /* the client gave up */
        pu_sleep_ms(PU_TRICKLE_BYTE_MS);
    }
    close(tc->fd);
    free(tc);
    atomic_fetch_sub(&t->serving, 1);
    return NULL;
}

static void *trickle_main(void *arg)
{
    pu_trickle *t = arg;
    while (!atomic_load(&t->stop)) {
        struct pollfd p = {.fd = t->listen_fd, .events = POLLIN};
        if (poll(&p, 1, PU_POLL_MS) != 1)
            continue;
        trickle_conn *tc = malloc(sizeof *tc);
        int fd = accept(t->listen_fd, NULL, NULL);
        pthread_t th;
        if (!tc || fd < 0) {
            free(tc);
            if (fd >= 0)
                close(fd);
            continue;
        }
        *tc = (trickle_conn){t, fd};
        atomic_fetch_add(&t->serving, 1);
        if (pthread_create(&th, NULL, trickle_serve, tc) == 0) {
            pthread_detach(th);
        } else {
            atomic_fetch_sub(&t->serving, 1);
            close(fd);
            free(tc);
        }
    }
    return NULL;
}

bool pu_trickle_start(pu_trickle *t)
{
    memset(t, 0, sizeof *t);
    t->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (t->listen_fd < 0 || bind(t->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(t->listen_fd, 16) != 0 || getsockname(t->listen_fd, (struct sockaddr *)&a, &len))
        return false;
    t->port = ntohs(a.sin_port);
    snprintf(t->url, sizeof t->url, "redis://127.0.0.1:%d/0", t->port);
    return pthread_create(&t->thread, NULL, trickle_main, t) == 0;
}

void pu_trickle_stop(pu_trickle *t)
{
    atomic_store(&t->stop, true);
    pthread_join(t->thread, NULL);
    while (atomic_load(&t->serving) > 0)
        pu_sleep_ms(PU_TRICKLE_BYTE_MS);
    close(t->listen_fd);
}

bool pu_make_model(const char *dir, const char *log)
{
    char *argv[] = {PU_MLLAMA, "mkmodel", "--preset", "micro", "--out", (char *)dir, NULL};
    return pu_run(argv, log, PU_START_MS) == 0;
}

const char *const *pu_mock_kafka_args = NULL;

bool pu_mock_kafka_start(pu_proc *p, const char *dir, const char *topics,
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

void pu_micro_stack_start(const char *tag, char *dir, char *model,
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

/* The stack pu_stack_stop kills at exit: atexit takes no argument. */
static pu_stack *pu_stack_live;

static void pu_stack_atexit(void)
{
    pu_stack_stop(pu_stack_live);
}

void pu_stack_start(pu_stack *s, const char *tag, const char *topics)
{
    if (!pu_which("redis-server"))
        ml_test_skip("needs redis-server on PATH");
    if (pu_stack_live)
        pu_die("a second pu_stack");
    pu_stack_live = s;
    atexit(pu_stack_atexit);
    pu_micro_stack_start(tag, s->dir, s->model, &s->redis, &s->kafka, topics, s->brokers,
                         sizeof s->brokers);
    s->env = (pu_worker_env){s->brokers, s->redis.url, s->model, s->dir};
}

void pu_stack_stop(pu_stack *s)
{
    for (int i = 0; i < PU_STACK_WORKERS; i++)
        pu_kill(&s->workers[i]);
    pu_kill(&s->kafka);
    pu_kill(&s->redis.proc);
    pu_tmpdir_done(s->dir);
    s->dir[0] = '\0';
}

const char *pu_worker_config;

bool pu_worker_start(pu_proc *p, const pu_worker_env *env, const char *name,
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
    char *argv[4 + 2 * PU_MAX_SETS + 1];
    int argc = 0;
    argv[argc++] = PU_MLLAMA;
    argv[argc++] = "worker";
    if (pu_worker_config) {
        argv[argc++] = "--config";
        argv[argc++] = (char *)pu_worker_config;
    }
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

int pu_worker_http_port(const pu_proc *p)
{
    char *s = pu_slurp(p->log, NULL);
    const char *at = s ? strstr(s, "\"worker_started\"") : NULL;
    const char *http = at ? strstr(at, "http :") : NULL;
    int port = http ? atoi(http + 6) : -1;
    free(s);
    return port;
}

char *pu_http_get(int port, const char *path)
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

double pu_metric(int port, const char *name)
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

bool pu_wait_assigned(pu_proc *p, int timeout_ms)
{
    int port = pu_worker_http_port(p);
    for (int64_t deadline = pu_now_ms() + timeout_ms; pu_now_ms() < deadline && pu_running(p);
         pu_sleep_ms(50))
        if (pu_metric(port, "mllama_kafka_assigned_partitions") > 0)
            return true;
    return false;
}

char *pu_shell(const char *cmd, int *code)
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

void pu_image_key(const char *group, const char *content_hex, char out[ML_SHA256_HEX_SIZE])
{
    uint8_t salt[SVC_CACHE_SALT_BYTES], key[ML_IMAGE_KEY_BYTES];
    svc_cache_salt(group, salt);
    for (int i = 0; i < ML_IMAGE_KEY_BYTES; i++) {
        unsigned v = 0;
        sscanf(content_hex + 2 * i, "%2x", &v);
        key[i] = (uint8_t)v;
    }
    ml_image_state_key(salt, key, NULL, key);
    ml_sha256_hex(key, out);
}

char *pu_data_url(const void *bytes, size_t n)
{
    static const char prefix[] = "data:image/jpeg;base64,";
    char *url = malloc(sizeof prefix + svc_base64_encoded_len(n) + 1);
    if (!url)
        pu_die("out of memory");
    memcpy(url, prefix, sizeof prefix - 1);
    svc_base64_encode(bytes, n, url + sizeof prefix - 1);
    return url;
}

char *pu_chat_request(const char *id, const char *text, const char *image_part,
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

char *pu_image_part(const void *bytes, size_t n)
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
