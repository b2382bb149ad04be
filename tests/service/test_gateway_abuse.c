/* `mllama gateway` under bad input and abuse, with API keys on:
 *
 * - no key, a wrong key: 401 with WWW-Authenticate; the right key passes;
 *   SIGHUP loads a new keys file, and a broken one keeps the old keys;
 * - malformed JSON and a body that is not an object: 400 invalid_json;
 * - a body declared larger than limits.max_request_bytes: 413 answered
 *   from the headers, before a byte of the body is sent;
 * - a slow-loris client trickling its request: dropped once
 *   gateway.header_timeout_ms has passed since its accept, while probes and
 *   other clients are answered meanwhile;
 * - 2000 idle connections: held without a thread each, probes and requests
 *   still answered, every one closed after the header timeout, and the
 *   gateway's resident memory grows by less than IDLE_BYTES_MAX each;
 * - a request no worker answers: 504 deadline_exceeded from the gateway's
 *   own timer, a grace after its deadline_ms;
 * - image URLs under the default policy (no gateway.image_fetch_* set):
 *   http refused, and https to loopback by address and by name, to the
 *   cloud metadata address and to IPv6 loopback refused on the socket,
 *   each a 400 invalid_image_url naming the part, counted as refused;
 * - more requests than the tenant's burst: 429 with Retry-After;
 * - connections past gateway.max_connections are closed at accept.
 * The gateway stops on SIGTERM with exit code 0 and a clean log.
 * Skipped (77) without redis-server. */
#include <sys/resource.h>

#include "gw_client.h"

#define CALL_MS 20000
#define HEADER_TIMEOUT_MS 3000     /* gateway.header_timeout_ms of this test */
#define TRICKLE_MS 100             /* the slow-loris client's pace */
#define DROP_MS (HEADER_TIMEOUT_MS + 2000) /* when it must be gone by */
#define IDLE_CONNECTIONS 2000      /* under the test's own descriptor limit */
#define IDLE_BYTES_MAX (32 << 10)  /* resident growth per idle connection, at most */
#define MAX_CONNECTIONS 2050       /* gateway.max_connections of this test */
#define BURST 12                   /* gateway.tenant_burst of this test */
#define BIG_BODY "1048576"         /* declared, never sent: over max_request_bytes */
#define FD_SPARE 256               /* the test's other descriptors */
#define SLOWDOWN_RSS (PU_SLOWDOWN * PU_SLOWDOWN) /* ASan's shadow and quarantine */

static pu_stack st;
static gwt_gateway gw;
static char key[128], key2[128], auth[200], auth2[200], keys_path[PU_PATH_MAX + 16];

static const char *const gateway_sets[] = {
    "gateway.header_timeout_ms=3000", "gateway.tenant_burst=12",
    "gateway.tenant_requests_per_s=1", "gateway.max_connections=2050",
    "limits.max_request_bytes=65536", NULL, NULL};
_Static_assert(HEADER_TIMEOUT_MS == 3000 && BURST == 12 && MAX_CONNECTIONS == 2050,
               "gateway_sets spells them");

/* A fresh key for the default tenant: the key, and its line appended to path. */
static void new_key(char *out, size_t cap, const char *path, bool append)
{
    char cmd[PU_PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "%s gateway --new-key default 2>>%s", PU_MLLAMA, path);
    if (!append)
        unlink(path);
    int code;
    char *s = pu_shell(cmd, &code);
    if (!s || code)
        pu_die("mllama gateway --new-key");
    snprintf(out, cap, "%.*s", (int)strcspn(s, "\n"), s);
    free(s);
}

static int status_of(const char *method, const char *path, const char *headers, const char *body)
{
    gwt_response r;
    gwt_call(gw.port, method, path, headers, body, &r, CALL_MS);
    int status = r.status;
    gwt_response_free(&r);
    return status;
}

static long rss_kib(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    char *s = pu_slurp(path, NULL);
    const char *at = s ? strstr(s, "VmRSS:") : NULL;
    long kib = at ? atol(at + 6) : -1;
    free(s);
    return kib;
}

static bool probes_answer(void)
{
    char *h = pu_http_get(gw.ops_port, "/healthz"), *r = pu_http_get(gw.ops_port, "/readyz");
    bool ok = h && r && strstr(h, "ok") && strstr(r, "ready");
    free(h);
    free(r);
    return ok;
}

static void test_keys(void)
{
    check(status_of("GET", "/v1/models", NULL, NULL) == 401, "no key: 401");
    gwt_response r;
    gwt_call(gw.port, "GET", "/v1/models", "Authorization: Bearer mk-wrong\r\n", NULL, &r, CALL_MS);
    char www[64];
    check(r.status == 401 && gwt_header(&r, "WWW-Authenticate", www, sizeof www),
          "wrong key: 401 with WWW-Authenticate (%d)", r.status);
    check(r.body && strstr(r.body, "\"type\":\"authentication_error\""), "authentication_error");
    gwt_response_free(&r);
    check(status_of("GET", "/v1/models", auth, NULL) == 200, "the right key: 200");
    check(status_of("GET", "/v1/models", auth2, NULL) == 401, "a key not yet in the file");
    new_key(key2, sizeof key2, keys_path, true);
    snprintf(auth2, sizeof auth2, "Authorization: Bearer %s\r\n", key2);
    pu_signal(&gw.proc, SIGHUP);
    bool loaded = false;
    for (int64_t t0 = pu_now_ms(); !loaded && pu_now_ms() - t0 < CALL_MS; pu_sleep_ms(50))
        loaded = status_of("GET", "/v1/models", auth2, NULL) == 200;
    check(loaded, "SIGHUP loads the new key");
    pu_write_file(keys_path, "not a keys file\n", 16);
    pu_signal(&gw.proc, SIGHUP);
    check(pu_wait_log(&gw.proc, "gateway_keys_rejected", 1, CALL_MS), "the broken file is refused");
    check(status_of("GET", "/v1/models", auth, NULL) == 200 &&
              status_of("GET", "/v1/models", auth2, NULL) == 200,
          "the previous keys stay");
}

static void test_bad_bodies(void)
{
    check(status_of("POST", "/v1/chat/completions", auth, "{\"messages\": [") == 400,
          "malformed JSON: 400");
    check(status_of("POST", "/v1/chat/completions", auth, "\"a string\"") == 400,
          "not an object: 400");
    check(status_of("POST", "/v1/chat/completions", auth, "{}x") == 400,
          "trailing bytes after the object: 400");
    /* Declared too large: answered from the headers, the body never sent. */
    int fd = gwt_connect(gw.port, CALL_MS);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: " BIG_BODY
                     "\r\n\r\n",
                     auth);
    gwt_response r = {0};
    check(fd >= 0 && gwt_send(fd, head, (size_t)n) && gwt_read(fd, &r, NULL, CALL_MS) &&
              r.status == 413,
          "oversized body: 413 before it is read (%d)", r.status);
    gwt_response_free(&r);
    close(fd);
}

static void test_slow_loris(void)
{
    static const char req[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaa"
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    int fd = gwt_connect(gw.port, TRICKLE_MS);
    check(fd >= 0, "slow client connects");
    int64_t t0 = pu_now_ms();
    bool dropped = false, probed = false, served = false;
    for (size_t i = 0; !dropped && pu_now_ms() - t0 < DROP_MS; i++) {
        if (!gwt_send(fd, req + i % (sizeof req - 1), 1)) {
            dropped = true;
            break;
        }
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_DONTWAIT);
        dropped = k == 0;
        if (!probed && pu_now_ms() - t0 > HEADER_TIMEOUT_MS / 2) {
            probed = probes_answer();
            served = status_of("GET", "/v1/models", auth, NULL) == 200;
        }
        pu_sleep_ms(TRICKLE_MS);
    }
    int64_t took = pu_now_ms() - t0;
    check(dropped, "the slow client is dropped (after %lld ms)", (long long)took);
    check(took >= HEADER_TIMEOUT_MS - TRICKLE_MS, "not before the header timeout: %lld ms",
          (long long)took);
    check(probed && served, "probes and other clients answered meanwhile");
    close(fd);
    check(pu_metric(gw.ops_port, "mllama_gateway_http_errors_total{status=\"408\",code=\"request_timeout\"}") >= 1,
          "counted as 408");
}

static void test_idle_connections(void)
{
    int fds[IDLE_CONNECTIONS];
    long before = rss_kib(gw.proc.pid);
    for (int i = 0; i < IDLE_CONNECTIONS; i++)
        fds[i] = gwt_connect(gw.port, CALL_MS);
    bool all = true;
    for (int i = 0; i < IDLE_CONNECTIONS; i++)
        all = all && fds[i] >= 0;
    check(all, "%d idle connections open", IDLE_CONNECTIONS);
    double open = -1;
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < CALL_MS / 4; pu_sleep_ms(20))
        if ((open = pu_metric(gw.ops_port, "mllama_gateway_connections_open")) >= IDLE_CONNECTIONS)
            break;
    check(open >= IDLE_CONNECTIONS, "the gateway holds them: %g open", open);
    long during = rss_kib(gw.proc.pid);
    check(probes_answer(), "probes answered with %d idle connections", IDLE_CONNECTIONS);
    check(status_of("GET", "/v1/models", auth, NULL) == 200, "requests answered too");
    long per = (during - before) * 1024 / IDLE_CONNECTIONS;
    check(per < (long)IDLE_BYTES_MAX * SLOWDOWN_RSS, "%ld bytes resident per idle connection", per);
    fprintf(stderr, "idle connections: %ld KiB -> %ld KiB resident (%ld bytes each)\n", before,
            during, per);
    /* Past max_connections: closed at accept. */
    int extra[MAX_CONNECTIONS - IDLE_CONNECTIONS + 8];
    int n_extra = (int)(sizeof extra / sizeof extra[0]);
    for (int i = 0; i < n_extra; i++)
        extra[i] = gwt_connect(gw.port, CALL_MS);
    int closed = 0;
    pu_sleep_ms(200);
    for (int i = 0; i < n_extra; i++) {
        char c;
        struct pollfd p = {extra[i], POLLIN, 0};
        if (extra[i] < 0 || (poll(&p, 1, 1000) == 1 && recv(extra[i], &c, 1, 0) <= 0))
            closed++;
        if (extra[i] >= 0)
            close(extra[i]);
    }
    check(closed > 0, "connections past max_connections closed at once (%d)", closed);
    /* The idle ones go at the header timeout. */
    int gone = 0;
    for (int i = 0; i < IDLE_CONNECTIONS; i++) {
        char c;
        struct pollfd p = {fds[i], POLLIN, 0};
        if (fds[i] >= 0 && poll(&p, 1, DROP_MS) == 1 && recv(fds[i], &c, 1, 0) == 0)
            gone++;
        if (fds[i] >= 0)
            close(fds[i]);
    }
    check(gone == IDLE_CONNECTIONS, "every idle connection closed after the timeout: %d", gone);
}

/* No worker runs in this test: a request past its deadline is answered
 * by the gateway's own timer, 504. */
static void test_unanswered(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char body[256];
    snprintf(body, sizeof body,
             "{\"deadline_ms\":%lld,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
             (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000 - 1);
    gwt_response r;
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", auth, body, &r, CALL_MS) &&
              r.status == 504 && r.body && strstr(r.body, "\"deadline_exceeded\""),
          "an unanswered request past its deadline: 504 (%d)", r.status);
    gwt_response_free(&r);
}

/* The SSRF defaults: nothing of the gateway's own network is reachable
 * through an image URL, whatever name or form the address takes. */
static void test_image_url_defaults(void)
{
    static const struct {
        const char *url, *says;
    } cases[] = {
        {"http://127.0.0.1:1/a.jpg", "scheme http is not fetched (https only)"},
        {"https://127.0.0.1:1/a.jpg", "not public"},
        {"https://localhost:1/a.jpg", "not public"},
        {"https://169.254.169.254/latest/meta-data/", "not public"},
        {"https://[::1]:1/a.jpg", "not public"},
    };
    static const char refused[] = "mllama_gateway_image_fetches_total{result=\"refused\"}";
    double refused0 = pu_metric(gw.ops_port, refused);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
                 "\"image_url\":{\"url\":\"%s\"}},{\"type\":\"text\",\"text\":\"hi\"}]}]}",
                 cases[i].url);
        gwt_response r;
        gwt_call(gw.port, "POST", "/v1/chat/completions", auth, body, &r, CALL_MS);
        check(r.status == 400 && r.body && strstr(r.body, "\"invalid_image_url\"") &&
                  strstr(r.body, "messages[0].content[0].image_url.url") &&
                  strstr(r.body, cases[i].says),
              "%s: 400 invalid_image_url, '%s' (%d %.200s)", cases[i].url, cases[i].says,
              r.status, r.body ? r.body : "");
        gwt_response_free(&r);
    }
    /* The scheme is refused before any fetch; the other four on the socket. */
    check(pu_metric(gw.ops_port, refused) == refused0 + 4, "four fetches refused by address");
}

static void test_rate_limit(void)
{

    bool limited = false;
    char retry[32] = "";
    for (int i = 0; i < 2 * BURST && !limited; i++) {
        gwt_response r;
        gwt_call(gw.port, "POST", "/v1/chat/completions", auth, "[1]", &r, CALL_MS);
        limited = r.status == 429 && gwt_header(&r, "Retry-After", retry, sizeof retry);
        gwt_response_free(&r);
    }
    check(limited && atoi(retry) >= 1, "429 with Retry-After past the burst (%s)", retry);
}

int main(void)
{
    /* The idle connections, at both ends (the gateway inherits the limit). */
    struct rlimit nofile;
    getrlimit(RLIMIT_NOFILE, &nofile);
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
    if (nofile.rlim_cur < 2 * MAX_CONNECTIONS + FD_SPARE)
        ml_test_skip("RLIMIT_NOFILE too low for the idle connections");
    pu_stack_start(&st, "gwabuse", GWT_TOPICS);
    snprintf(keys_path, sizeof keys_path, "%s/keys", st.dir);
    new_key(key, sizeof key, keys_path, false);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    snprintf(auth2, sizeof auth2, "Authorization: Bearer mk-not-yet\r\n");
    static char keys_set[PU_PATH_MAX + 64];
    snprintf(keys_set, sizeof keys_set, "gateway.api_keys_file=%s", keys_path);
    const char *sets[sizeof gateway_sets / sizeof gateway_sets[0]];
    memcpy(sets, gateway_sets, sizeof sets);
    sets[5] = keys_set;
    if (!gwt_start(&gw, &st.env, "gateway", sets))
        pu_die("gateway start");
    test_keys();
    test_bad_bodies();
    test_slow_loris();
    test_idle_connections();
    test_unanswered();
    test_image_url_defaults();
    test_rate_limit();
    check(pu_running(&gw.proc), "the gateway is still up");
    int code = pu_stop(&gw.proc, PU_STOP_MS);
    check(code == 0, "gateway exit code %d after SIGTERM", code);
    pu_check_log_clean(gw.proc.log);
    return check_done();
}
