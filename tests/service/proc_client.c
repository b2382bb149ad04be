/* The Kafka client of the worker tests and the checks on a reply stream
 * (proc_util.h, "a Kafka client"). Everything runs on the test's main thread. */
#include "proc_util.h"

const char *pu_client_fetch_wait_ms = "10";

const char *pu_client_message_max_bytes = "1000000";

void pu_client_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
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

rd_kafka_conf_t *pu_client_conf(const char *brokers)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char err[256];
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err) ||
        rd_kafka_conf_set(conf, "log_level", "2", err, sizeof err))
        pu_die(err);
    return conf;
}

void pu_client_init(pu_client *c, const char *brokers, const char *const *topics,
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

void pu_client_deinit(pu_client *c)
{
    if (c->rereads)
        fprintf(stderr, "client: %d records delivered again, kept once\n", c->rereads);
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

char *pu_strndup0(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        pu_die("out of memory");
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

bool pu_client_send_to(pu_client *c, const char *topic, int32_t partition,
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

bool pu_client_send(pu_client *c, const char *id, const char *body)
{
    return pu_client_send_to(c, PU_REQUESTS, -1, id, body, strlen(body), NULL, 0);
}

int64_t pu_header_num(rd_kafka_headers_t *hs, const char *name)
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

/* True when the consumer delivered m before (its offset is below the
 * partition's position); advances the position otherwise. */
static bool reread(pu_client *c, const rd_kafka_message_t *m)
{
    const char *topic = rd_kafka_topic_name(m->rkt);
    int k = 0;
    while (k < c->n_pos && (c->pos[k].partition != m->partition || strcmp(c->pos[k].topic, topic)))
        k++;
    if (k == c->n_pos) {
        if (c->n_pos == PU_CLIENT_POSITIONS || strlen(topic) >= sizeof c->pos[k].topic)
            pu_die("client: too many partitions, or a topic name too long");
        c->n_pos++;
        c->pos[k] = (pu_client_position){.partition = m->partition, .next = 0};
        snprintf(c->pos[k].topic, sizeof c->pos[k].topic, "%s", topic);
    }
    if (m->offset < c->pos[k].next) {
        if (c->rereads++ == 0)
            fprintf(stderr, "client: %s [%d] delivered offset %lld again (due: %lld)\n", topic,
                    (int)m->partition, (long long)m->offset, (long long)c->pos[k].next);
        return true;
    }
    c->pos[k].next = m->offset + 1;
    return false;
}

int pu_client_poll(pu_client *c, int timeout_ms)
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
        if (reread(c, m)) {
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

size_t pu_client_replies(const pu_client *c, const char *id, const pu_record **out,
                         size_t max)
{
    return pu_client_replies_on(c, PU_REPLIES, id, out, max);
}

size_t pu_client_replies_on(const pu_client *c, const char *topic, const char *id,
                            const pu_record **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->recs[i].topic, topic) && !strcmp(c->recs[i].key, id)) {
            if (n < max)
                out[n] = &c->recs[i];
            n++;
        }
    return n;
}

const pu_record *pu_client_final(const pu_client *c, const char *id)
{
    return pu_client_final_on(c, PU_REPLIES, id);
}

const pu_record *pu_client_final_on(const pu_client *c, const char *topic, const char *id)
{
    const pu_record *f = NULL;
    for (size_t i = 0; i < c->n; i++)
        if (c->recs[i].final && !strcmp(c->recs[i].topic, topic) &&
            !strcmp(c->recs[i].key, id))
            f = &c->recs[i];
    return f;
}

const pu_record *pu_client_find(const pu_client *c, const char *topic,
                                const char *key)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->recs[i].topic, topic) && !strcmp(c->recs[i].key, key))
            return &c->recs[i];
    return NULL;
}

int pu_client_wait_finals(pu_client *c, const char *ids, size_t stride, int n,
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

const pu_record *pu_client_wait(pu_client *c, const char *id, int timeout_ms)
{
    pu_client_wait_finals(c, id, 0, 1, timeout_ms);
    return pu_client_final(c, id);
}

bool pu_end_offsets(pu_client *c, const char *topic, int n, int64_t *out)
{
    for (int p = 0; p < n; p++) {
        int64_t lo;
        if (rd_kafka_query_watermark_offsets(c->consumer, topic, p, &lo, &out[p], 5000))
            return false;
    }
    return true;
}

bool pu_committed(const char *brokers, const char *group, const char *topic, int n,
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

bool pu_seen_before(const pu_client *c, size_t i, const pu_record *r)
{
    for (size_t k = 0; k < i; k++) {
        const pu_record *e = &c->recs[k];
        if (e->attempt == r->attempt && e->seq == r->seq && !strcmp(e->topic, r->topic) &&
            !strcmp(e->key, r->key) && !strcmp(e->value, r->value))
            return true;
    }
    return false;
}

int pu_check_stream_at(const pu_client *c, const char *id, bool lossy)
{
    return pu_check_stream_on(c, PU_REPLIES, id, lossy);
}

/* Every record of id on topic, one line each: what a failed stream check
 * needs to tell a second execution from a repeated delivery. */
static void dump_stream(const pu_client *c, const char *topic, const char *id)
{
    enum { VALUE_SHOWN = 60 };
    fprintf(stderr, "%s: its records on %s (partition, offset, attempt, seq, final, value):\n",
            id, topic);
    for (size_t i = 0; i < c->n; i++) {
        const pu_record *r = &c->recs[i];
        if (!strcmp(r->topic, topic) && !strcmp(r->key, id))
            fprintf(stderr, "  [%d] @%lld a%lld s%d%s %.*s\n", (int)r->partition,
                    (long long)r->offset, (long long)r->attempt, r->seq, r->final ? " final" : "",
                    VALUE_SHOWN, r->value);
    }
}

int pu_check_stream_on(const pu_client *c, const char *topic, const char *id, bool lossy)
{
    enum { MAX_ATTEMPTS = 16 };
    int failures_before = ml_test_failures;
    pu_attempt_state at[MAX_ATTEMPTS];
    int n = 0, finals = 0;
    /* Attempts in the order they began; all but the last are superseded. */
    for (size_t i = 0; i < c->n; i++) {
        const pu_record *r = &c->recs[i];
        if (strcmp(r->topic, topic) || strcmp(r->key, id))
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
        if (strcmp(r->topic, topic) || strcmp(r->key, id))
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
    if (ml_test_failures > failures_before)
        dump_stream(c, topic, id);
    return n;
}

int pu_check_stream(const pu_client *c, const char *id)
{
    return pu_check_stream_at(c, id, false);
}

cJSON *pu_json(const pu_record *r)
{
    cJSON *j = r ? cJSON_Parse(r->value) : NULL;
    check(j != NULL, "record value is not JSON: %.200s", r ? r->value : "(no record)");
    return j;
}

const cJSON *pu_json_at(const cJSON *j, const char *const *path)
{
    for (; j && *path; path++)
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(*path))
                             : cJSON_GetObjectItemCaseSensitive(j, *path);
    return j;
}

const char *pu_json_str(const cJSON *j, const char *const *path)
{
    j = pu_json_at(j, path);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

double pu_json_num(const cJSON *j, const char *const *path)
{
    j = pu_json_at(j, path);
    return cJSON_IsNumber(j) ? j->valuedouble : NAN;
}

const char *pu_finish_reason(const cJSON *j)
{
    return pu_json_str(j, PU_PATH("choices", "0", "finish_reason"));
}

char *pu_run_text(const char *cmd)
{
    int code = -1;
    char *out = pu_shell(cmd, &code);
    cJSON *j = out && code == 0 ? cJSON_Parse(out) : NULL;
    const char *text = pu_json_str(j, PU_PATH("text"));
    char *s = text ? strdup(text) : NULL;
    check(s != NULL, "%s: exit %d: %s", cmd, code, out ? out : "");
    cJSON_Delete(j);
    free(out);
    return s;
}

const char *pu_error_code(const cJSON *j)
{
    return pu_json_str(j, PU_PATH("error", "code"));
}
