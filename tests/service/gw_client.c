/* The gateway tests' helpers (gw_client.h). */
#include "gw_client.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <poll.h>
#include <strings.h>

#define GWT_SETS_MAX 32
#define GWT_READ_CHUNK 65536

/* Every test gateway: ephemeral ports, its own reply topic (created by the
 * test's mock cluster, which has no Admin API), the mock's short fetch wait
 * (see pu_worker_defaults). */
static const char *const gwt_defaults[] = {
    "gateway.listen=127.0.0.1:0",         "http.listen=127.0.0.1:0",
    "gateway.instance=" GWT_INSTANCE,     "gateway.create_reply_topics=false",
    "kafka.fetch.wait.max.ms=20",
};

bool gwt_start(gwt_gateway *g, const pu_worker_env *env, const char *name,
               const char *const *extra)
{
    static char sets[GWT_SETS_MAX][2 * PU_PATH_MAX];
    int n = 0;
    snprintf(sets[n++], sizeof sets[0], "kafka.brokers=%s", env->brokers);
    snprintf(sets[n++], sizeof sets[0], "model.dir=%s", env->model_dir);
    snprintf(sets[n++], sizeof sets[0], "redis.url=%s", env->redis_url);
    for (size_t i = 0; i < sizeof gwt_defaults / sizeof gwt_defaults[0]; i++)
        snprintf(sets[n++], sizeof sets[0], "%s", gwt_defaults[i]);
    for (size_t i = 0; extra && extra[i] && n < GWT_SETS_MAX; i++)
        snprintf(sets[n++], sizeof sets[0], "%s", extra[i]);
    char port_file[PU_PATH_MAX + 64], log[PU_PATH_MAX + 64];
    snprintf(port_file, sizeof port_file, "%s/%s.ports", env->dir, name);
    snprintf(log, sizeof log, "%s/%s.log", env->dir, name);
    unlink(port_file);
    char *argv[6 + 2 * GWT_SETS_MAX] = {PU_MLLAMA, "gateway", "--port-file", port_file};
    int argc = 4;
    for (int i = 0; i < n; i++) {
        argv[argc++] = "--set";
        argv[argc++] = sets[i];
    }
    argv[argc] = NULL;
    if (!pu_spawn(&g->proc, log, argv))
        return false;
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < PU_START_MS; pu_sleep_ms(PU_POLL_MS)) {
        char *s = pu_slurp(port_file, NULL);
        bool ok = s && sscanf(s, "%d %d", &g->port, &g->ops_port) == 2;
        free(s);
        if (ok)
            return true;
        if (!pu_running(&g->proc))
            break;
    }
    pu_show_log(log, 4000);
    return false;
}

int gwt_connect(int port, int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

bool gwt_send(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        p += k;
        len -= (size_t)k;
    }
    return true;
}

int gwt_send_request(int port, const char *method, const char *path, const char *extra_headers,
                     const char *body, int timeout_ms)
{
    int fd = gwt_connect(port, timeout_ms);
    if (fd < 0)
        return -1;
    char head[4096];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s%s%s%zu\r\n\r\n", method, path,
                     port, extra_headers ? extra_headers : "",
                     body ? "Content-Type: application/json\r\n" : "",
                     "Content-Length: ", body ? strlen(body) : 0);
    if (n < 0 || (size_t)n >= sizeof head || !gwt_send(fd, head, (size_t)n) ||
        (body && !gwt_send(fd, body, strlen(body)))) {
        close(fd);
        return -1;
    }
    return fd;
}

static void append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = realloc(*buf, *cap);
        if (!*buf)
            pu_die("out of memory");
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
}

/* Move what raw holds into head and body, decoding chunks. */
static void decode(gwt_response *r)
{
    if (!r->head) {
        char *end = r->raw ? strstr(r->raw, "\r\n\r\n") : NULL;
        if (!end)
            return;
        size_t hl = (size_t)(end - r->raw) + 4;
        r->head = pu_strndup0(r->raw, hl);
        r->status = atoi(r->head + strcspn(r->head, " "));
        memmove(r->raw, r->raw + hl, r->raw_len - hl + 1);
        r->raw_len -= hl;
        size_t bcap = 0;
        append(&r->body, &r->body_len, &bcap, "", 0);
    }
    char te[32], cl[32];
    bool chunked = gwt_header(r, "Transfer-Encoding", te, sizeof te) && !strcasecmp(te, "chunked");
    if (!chunked) {
        size_t cap = r->body_len + 1;
        append(&r->body, &r->body_len, &cap, r->raw, r->raw_len);
        r->raw_len = 0;
        if (gwt_header(r, "Content-Length", cl, sizeof cl) && r->body_len >= (size_t)atol(cl))
            r->complete = true;
        return;
    }
    for (;;) {
        char *eol = r->raw_len ? strstr(r->raw, "\r\n") : NULL;
        if (!eol)
            return;
        size_t size = strtoul(r->raw, NULL, 16), hl = (size_t)(eol - r->raw) + 2;
        if (r->raw_len < hl + size + 2)
            return;
        size_t cap = r->body_len + 1;
        append(&r->body, &r->body_len, &cap, r->raw + hl, size);
        memmove(r->raw, r->raw + hl + size + 2, r->raw_len - hl - size - 2 + 1);
        r->raw_len -= hl + size + 2;
        if (size == 0) {
            r->complete = true;
            return;
        }
    }
}

bool gwt_read(int fd, gwt_response *r, const char *until, int timeout_ms)
{
    int64_t deadline = pu_now_ms() + timeout_ms;
    char buf[GWT_READ_CHUNK];
    for (;;) {
        decode(r);
        if (until ? (r->body && strstr(r->body, until)) : r->complete)
            return true;
        if (r->complete || r->closed)
            return false;
        int left = (int)(deadline - pu_now_ms());
        if (left <= 0)
            return false;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, left) <= 0)
            continue;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) {
            r->closed = true;
            decode(r);
            if (r->head && !r->complete && !gwt_header(r, "Transfer-Encoding", buf, 16) &&
                !gwt_header(r, "Content-Length", buf, 16))
                r->complete = true; /* a body delimited by the close */
            continue;
        }
        append(&r->raw, &r->raw_len, &r->raw_cap, buf, (size_t)k);
    }
}

void gwt_response_free(gwt_response *r)
{
    free(r->head);
    free(r->body);
    free(r->raw);
    memset(r, 0, sizeof *r);
}

bool gwt_header(const gwt_response *r, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *l = r->head ? strstr(r->head, "\r\n") : NULL; l && l[2]; l = strstr(l + 2, "\r\n")) {
        const char *s = l + 2;
        if (!strncasecmp(s, name, n) && s[n] == ':') {
            s += n + 1;
            while (*s == ' ')
                s++;
            size_t len = strcspn(s, "\r\n");
            snprintf(out, cap, "%.*s", (int)len, s);
            return true;
        }
    }
    return false;
}

bool gwt_call(int port, const char *method, const char *path, const char *extra_headers,
              const char *body, gwt_response *r, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    int fd = gwt_send_request(port, method, path, extra_headers, body, timeout_ms);
    if (fd < 0)
        return false;
    bool ok = gwt_read(fd, r, NULL, timeout_ms);
    close(fd);
    return ok;
}

int gwt_events(const char *body, long first_id, char ***datas)
{
    int n = 0, cap = 0;
    char **out = NULL;
    const char *p = body;
    while (*p) {
        if (*p == ':') { /* a comment: ": keep-alive\n\n" */
            const char *end = strstr(p, "\n\n");
            if (!end) {
                check(0, "SSE: an unterminated comment at byte %zu", (size_t)(p - body));
                break;
            }
            p = end + 2;
            continue;
        }
        char prefix[32];
        int plen = snprintf(prefix, sizeof prefix, "id: %ld\ndata: ", first_id + n);
        const char *end = strstr(p, "\n\n");
        if (strncmp(p, prefix, (size_t)plen) || !end || memchr(p + plen, '\n', (size_t)(end - p - plen))) {
            check(0, "SSE: event %d is not 'id: %ld\\ndata: ...\\n\\n': %.80s", n, first_id + n, p);
            gwt_events_free(out, n);
            return -1;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            out = realloc(out, (size_t)cap * sizeof *out);
            if (!out)
                pu_die("out of memory");
        }
        out[n++] = pu_strndup0(p + plen, (size_t)(end - p - plen));
        p = end + 2;
    }
    if (datas)
        *datas = out;
    else
        gwt_events_free(out, n);
    return n;
}

void gwt_events_free(char **datas, int n)
{
    for (int i = 0; i < n; i++)
        free(datas[i]);
    free(datas);
}

char *gwt_stream_text(char **datas, int n)
{
    char *text = NULL;
    size_t len = 0, cap = 0;
    append(&text, &len, &cap, "", 0);
    for (int i = 0; i < n; i++) {
        cJSON *j = cJSON_Parse(datas[i]);
        const char *c = pu_json_str(j, PU_PATH("choices", "0", "delta", "content"));
        if (c)
            append(&text, &len, &cap, c, strlen(c));
        cJSON_Delete(j);
    }
    return text;
}

char *gwt_chat_body(const char *text, const char *image_part, const char *extra)
{
    cJSON *t = cJSON_CreateString(text);
    char *quoted = cJSON_PrintUnformatted(t);
    cJSON_Delete(t);
    if (!quoted)
        pu_die("out of memory");
    size_t cap = strlen(quoted) + (image_part ? strlen(image_part) : 0) + strlen(extra) + 128;
    char *s = malloc(cap);
    if (!s)
        pu_die("out of memory");
    snprintf(s, cap,
             "{%s%s\"messages\":[{\"role\":\"user\",\"content\":[%s%s{\"type\":\"text\","
             "\"text\":%s}]}]}",
             extra, extra[0] ? "," : "", image_part ? image_part : "", image_part ? "," : "",
             quoted);
    free(quoted);
    return s;
}
