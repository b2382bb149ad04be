/* Tenants and the (tenant, id) keying of requests, against real worker
 * processes (`mllama mock-kafka`, redis-server, the micro model).
 *
 * One worker with no tenants configured (the implicit tenant "default" on
 * mllama.requests, mllama.cancel and mllama.replies*):
 * - A retry whose older execution has not started (its large image is
 *   still being decoded when the retry is prepared) ends that execution
 *   with a cancelled final, its only record, before the retry's seq 0.
 * - A request record stamped a day ahead by its producer is cancelled by a
 *   cancel consumed after it (CreateTime orders nothing: the worker's
 *   consume order does).
 * - A cancel stamped a day ahead does not stop the same id sent after it.
 * - The same id on another reply topic is another request: the first keeps
 *   streaming after the second is answered.
 *
 * Two workers with tenants acme and beta (their topics derived from the
 * kafka section: mllama.requests.<name>, mllama.cancel.<name>,
 * mllama.replies.<name>[.*]):
 * - beta sends acme's running id on its own request topic (a forged retry)
 *   and on its own cancel topic (a forged cancel): acme's stream goes on,
 *   one attempt, attempt 1; beta's request is answered on beta's reply
 *   topic, attempt 1 (per-tenant attempt counters); acme's own cancel then
 *   stops it.
 * - A retry within acme replaces the running execution, which ends
 *   cancelled before the retry's seq 0.
 * - acme naming beta's reply topic is dead-lettered reply_topic_not_allowed
 *   and nothing reaches beta's topic.
 * - `mllama submit --tenant acme` is answered on acme's topics, under an id
 *   of 128 random bits.
 * Skipped (77) without redis-server. */
#include "proc_util.h"

#include "jpeg_craft.h"

#define REQ_ACME "mllama.requests.acme"
#define REQ_BETA "mllama.requests.beta"
#define CANCEL_ACME "mllama.cancel.acme"
#define CANCEL_BETA "mllama.cancel.beta"
#define REPLIES_ACME "mllama.replies.acme"
#define REPLIES_BETA "mllama.replies.beta"
#define REPLIES_UI PU_REPLIES ".ui"
#define TOPICS                                                                                   \
    PU_REQUESTS ":2," PU_CANCEL ":1," PU_REPLIES ":2," REPLIES_UI ":2," PU_DLT ":1," REQ_ACME   \
                ":2," CANCEL_ACME ":1," REPLIES_ACME ":2," REQ_BETA ":2," CANCEL_BETA           \
                ":1," REPLIES_BETA ":2"
#define TENANTS "tenants=[{\"name\":\"acme\"},{\"name\":\"beta\"}]"
#define ANSWER_MS 30000
#define JOIN_MS 30000
#define LONG_TOKENS 32768  /* streams for many seconds: still running when the test acts */
#define LONG_LIMIT "limits.max_tokens=32768"
#define SHORT_TOKENS 8
#define STREAMING_CHUNKS 3 /* a request is running once this many chunks came */
#define STILL_CHUNKS 3     /* chunks after an event that prove the stream went on */
#define CANCEL_TRIES 5     /* a cancel consumer joins its own group a little late */
#define CANCEL_WAIT_MS 2000
#define DAY_MS (24LL * 3600 * 1000)
/* The not-started retry's older execution: an image this large takes its
 * prep thread far longer to decode than the retry takes to be prepared. */
#define SLOW_IMAGE_SIDE 6000
#define SLOW_IMAGE_PIXELS "limits.max_image_pixels=40000000"

static pu_stack st;
static pu_client client;

/* ---- requests ---------------------------------------------------------------------- */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A chat request body answered on reply_topic, with an optional image part. */
static char *request(const char *id, const char *reply_topic, int max_tokens,
                     const char *image_part)
{
    size_t cap = strlen(id) + strlen(reply_topic) + (image_part ? strlen(image_part) : 0) + 256;
    char *s = malloc(cap);
    if (!s)
        pu_die("out of memory");
    snprintf(s, cap,
             "{\"id\":\"%s\",\"reply_topic\":\"%s\",\"max_tokens\":%d,\"temperature\":0,"
             PU_NO_STOP ",\"messages\":[{\"role\":\"user\",\"content\":[%s%s{\"type\":\"text\","
             "\"text\":\"Count to a million.\"}]}]}",
             id, reply_topic, max_tokens, image_part ? image_part : "", image_part ? "," : "");
    return s;
}

/* Produce value keyed by key to topic with CreateTime ts_ms (0: now), and
 * wait for its delivery. */
static bool send_at(const char *topic, const char *key, const char *value, int64_t ts_ms)
{
    int errors = client.delivery_errors;
    rd_kafka_resp_err_t e = rd_kafka_producev(
        client.producer, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
        RD_KAFKA_V_VALUE((void *)value, strlen(value)), RD_KAFKA_V_TIMESTAMP(ts_ms),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    return !e && rd_kafka_flush(client.producer, 30000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
           client.delivery_errors == errors;
}

static bool send_request(const char *topic, const char *id, const char *reply_topic, int max_tokens)
{
    char *body = request(id, reply_topic, max_tokens, NULL);
    bool ok = send_at(topic, id, body, 0);
    free(body);
    return ok;
}

/* Poll until `id` has n records on topic. */
static bool wait_records(const char *topic, const char *id, size_t n, int timeout_ms)
{
    for (int64_t deadline = pu_now_ms() + timeout_ms;
         pu_client_replies_on(&client, topic, id, NULL, 0) < n; pu_client_poll(&client, 20))
        if (pu_now_ms() >= deadline)
            return false;
    return true;
}

static const pu_record *wait_final(const char *topic, const char *id, int timeout_ms)
{
    const pu_record *f;
    for (int64_t deadline = pu_now_ms() + timeout_ms;
         !(f = pu_client_final_on(&client, topic, id)) && pu_now_ms() < deadline;)
        pu_client_poll(&client, 20);
    return f;
}

/* finish_reason of a record, copied (static buffer), "(none)" when absent. */
static const char *reason_of(const pu_record *r)
{
    static char buf[32];
    cJSON *j = r ? pu_json(r) : NULL;
    const char *reason = pu_finish_reason(j);
    snprintf(buf, sizeof buf, "%s", reason ? reason : "(none)");
    cJSON_Delete(j);
    return buf;
}

static bool ended_normally(const pu_record *r)
{
    const char *reason = reason_of(r);
    return !strcmp(reason, "length") || !strcmp(reason, "stop");
}

/* Records of id on topic that arrived after t_us. */
static int records_after(const char *topic, const char *id, int64_t t_us)
{
    int n = 0;
    for (size_t i = 0; i < client.n; i++)
        n += !strcmp(client.recs[i].topic, topic) && !strcmp(client.recs[i].key, id) &&
             client.recs[i].t_us > t_us;
    return n;
}

/* Cancel id through cancel_topic until its final record comes (the cancel
 * consumer may not have joined for the first one). */
static const pu_record *cancel(const char *cancel_topic, const char *reply_topic, const char *id)
{
    const pu_record *f = NULL;
    for (int i = 0; i < CANCEL_TRIES && !f; i++) {
        check(send_at(cancel_topic, id, "cancel", 0), "%s: produce the cancel", id);
        f = wait_final(reply_topic, id, CANCEL_WAIT_MS);
    }
    return f;
}

/* The records of id on topic after a retry replaced its first execution:
 * two attempts, the first ending with a cancelled final that comes before
 * any record of the second, which ends normally. Returns the first
 * attempt's record count. */
static int check_replaced(const char *topic, const char *id)
{
    int attempts = pu_check_stream_on(&client, topic, id, false);
    check(attempts == 2, "%s: %d attempts", id, attempts);
    const pu_record *first = pu_client_find(&client, topic, id);
    const pu_record *last = pu_client_final_on(&client, topic, id);
    bool in_retry = false, first_cancelled = false;
    int n_first = 0;
    for (size_t i = 0; first && last && i < client.n; i++) {
        const pu_record *r = &client.recs[i];
        if (strcmp(r->topic, topic) || strcmp(r->key, id))
            continue;
        in_retry |= r->attempt != first->attempt;
        check(!in_retry || r->attempt != first->attempt,
              "%s: a record of attempt %lld after the retry began", id, (long long)r->attempt);
        if (r->attempt == first->attempt) {
            n_first++;
            if (r->final)
                first_cancelled = !strcmp(reason_of(r), "cancelled");
        }
    }
    check(first_cancelled, "%s: the replaced execution has no cancelled final", id);
    check(last && last->attempt != first->attempt && ended_normally(last),
          "%s: the retry ended %s", id, reason_of(last));
    return n_first;
}

/* ---- the implicit tenant ------------------------------------------------------------ */

/* The older execution is still in prep (decoding its image) when the retry
 * reaches the step thread: it ends cancelled, its final its only record,
 * before the retry's seq 0. */
static void test_retry_not_started(void)
{
    static const char id[] = "tn-not-started";
    uint8_t *jpeg;
    size_t len = jpeg_craft_progressive(SLOW_IMAGE_SIDE, SLOW_IMAGE_SIDE, 1, 1, &jpeg);
    char *part = pu_image_part(jpeg, len);
    char *slow = request(id, PU_REPLIES, SHORT_TOKENS, part);
    free(part);
    free(jpeg);
    check(send_at(PU_REQUESTS, id, slow, 0), "not started: produce");
    free(slow);
    check(send_request(PU_REQUESTS, id, PU_REPLIES, SHORT_TOKENS), "not started: produce the retry");
    wait_records(PU_REPLIES, id, 2, ANSWER_MS);
    for (int64_t deadline = pu_now_ms() + ANSWER_MS; pu_now_ms() < deadline;) {
        const pu_record *f = pu_client_final_on(&client, PU_REPLIES, id);
        const pu_record *first = pu_client_find(&client, PU_REPLIES, id);
        if (f && first && f->attempt != first->attempt)
            break;
        pu_client_poll(&client, 20);
    }
    int n_first = check_replaced(PU_REPLIES, id);
    check(n_first == 1, "not started: the replaced execution sent %d records", n_first);
    check(pu_file_count(st.workers[0].log, "replaced by a newer execution before it") == 1,
          "not started: the older execution had started (the image decoded too fast)");
}

/* A request stamped a day ahead by its producer is cancelled by a cancel
 * consumed after it. */
static void test_request_stamped_ahead(void)
{
    static const char id[] = "tn-stamped-ahead";
    char *body = request(id, PU_REPLIES, LONG_TOKENS, NULL);
    check(send_at(PU_REQUESTS, id, body, wall_ms() + DAY_MS), "ahead: produce");
    free(body);
    check(wait_records(PU_REPLIES, id, STREAMING_CHUNKS, ANSWER_MS), "ahead: no stream");
    const pu_record *f = cancel(PU_CANCEL, PU_REPLIES, id);
    check(f && !strcmp(reason_of(f), "cancelled"), "ahead: finish_reason %s", reason_of(f));
}

/* A cancel stamped a day ahead stops no request of its id consumed after it. */
static void test_cancel_stamped_ahead(void)
{
    static const char id[] = "tn-cancel-ahead";
    int seen = pu_file_count(st.workers[0].log, "request tn-cancel-ahead\"");
    check(send_at(PU_CANCEL, id, "cancel", wall_ms() + DAY_MS), "cancel ahead: produce");
    check(pu_wait_log(&st.workers[0], "request tn-cancel-ahead\"", seen + 1, ANSWER_MS),
          "cancel ahead: the cancel was not received");
    check(send_request(PU_REQUESTS, id, PU_REPLIES, SHORT_TOKENS), "cancel ahead: produce the request");
    const pu_record *f = wait_final(PU_REPLIES, id, ANSWER_MS);
    check(f && ended_normally(f), "cancel ahead: the request sent after it ended %s",
          reason_of(f));
}

/* The same id with another reply topic is another request, not a retry. */
static void test_other_reply_topic(void)
{
    static const char id[] = "tn-two-topics";
    check(send_request(PU_REQUESTS, id, PU_REPLIES, LONG_TOKENS), "two topics: produce");
    check(wait_records(PU_REPLIES, id, STREAMING_CHUNKS, ANSWER_MS), "two topics: no stream");
    check(send_request(PU_REQUESTS, id, REPLIES_UI, SHORT_TOKENS), "two topics: produce the second");
    const pu_record *f = wait_final(REPLIES_UI, id, ANSWER_MS);
    check(f && ended_normally(f), "two topics: the second ended %s", reason_of(f));
    int64_t answered = f ? f->t_us : 0;
    size_t want = pu_client_replies_on(&client, PU_REPLIES, id, NULL, 0) + STILL_CHUNKS;
    wait_records(PU_REPLIES, id, want, ANSWER_MS);
    check(records_after(PU_REPLIES, id, answered) >= STILL_CHUNKS,
          "two topics: the first stopped streaming when the second came");
    check(!pu_client_final_on(&client, PU_REPLIES, id) ||
              strcmp(reason_of(pu_client_final_on(&client, PU_REPLIES, id)), "cancelled"),
          "two topics: the second cancelled the first");
    const pu_record *first = cancel(PU_CANCEL, PU_REPLIES, id);
    check(first && pu_check_stream_on(&client, PU_REPLIES, id, false) == 1,
          "two topics: the first is one attempt");
}

/* ---- two tenants ------------------------------------------------------------------- */

/* Wait until both workers logged beta's cancel of id, sending it again
 * while they have not (a cancel consumer joins a little late). */
static bool forged_cancel_received(const char *id)
{
    char needle[128];
    snprintf(needle, sizeof needle, "tenant beta request %s\"", id);
    for (int i = 0; i < CANCEL_TRIES; i++) {
        check(send_at(CANCEL_BETA, id, "cancel", 0), "forged cancel: produce");
        if (pu_wait_log(&st.workers[1], needle, 1, CANCEL_WAIT_MS) &&
            pu_wait_log(&st.workers[2], needle, 1, CANCEL_WAIT_MS))
            return true;
    }
    return false;
}

/* beta writes acme's running id to its own request topic and its own
 * cancel topic: neither touches acme's request. */
static void test_forged_retry_and_cancel(void)
{
    static const char id[] = "tn-victim";
    check(send_request(REQ_ACME, id, REPLIES_ACME, LONG_TOKENS), "victim: produce");
    check(wait_records(REPLIES_ACME, id, STREAMING_CHUNKS, ANSWER_MS), "victim: no stream");

    check(send_request(REQ_BETA, id, REPLIES_BETA, SHORT_TOKENS), "forged retry: produce");
    const pu_record *forged = wait_final(REPLIES_BETA, id, ANSWER_MS);
    check(forged && ended_normally(forged) && forged->attempt == 1,
          "forged retry: ended %s, attempt %lld (its own tenant's first)", reason_of(forged),
          forged ? (long long)forged->attempt : -1LL);
    int64_t t_forged = forged ? forged->t_us : 0;
    check(forged_cancel_received(id), "forged cancel: not received by both workers");
    int64_t t_cancel = pu_now_us();
    size_t want = pu_client_replies_on(&client, REPLIES_ACME, id, NULL, 0) + STILL_CHUNKS;
    wait_records(REPLIES_ACME, id, want, ANSWER_MS);
    check(records_after(REPLIES_ACME, id, t_forged) >= STILL_CHUNKS &&
              records_after(REPLIES_ACME, id, t_cancel) >= STILL_CHUNKS,
          "victim: stopped streaming after the forged retry or cancel");

    /* Its own tenant's cancel stops it: one attempt, cancelled. */
    const pu_record *f = cancel(CANCEL_ACME, REPLIES_ACME, id);
    check(f && !strcmp(reason_of(f), "cancelled"), "victim: acme's cancel: %s", reason_of(f));
    check(pu_check_stream_on(&client, REPLIES_ACME, id, false) == 1 && f && f->attempt == 1,
          "victim: one attempt, attempt 1");
    check(pu_check_stream_on(&client, REPLIES_BETA, id, false) == 1,
          "forged retry: one attempt on beta's topic");
}

/* A retry within acme replaces its running execution. */
static void test_retry_within_tenant(void)
{
    static const char id[] = "tn-acme-retry";
    check(send_request(REQ_ACME, id, REPLIES_ACME, LONG_TOKENS), "retry: produce");
    check(wait_records(REPLIES_ACME, id, STREAMING_CHUNKS, ANSWER_MS), "retry: no stream");
    check(send_request(REQ_ACME, id, REPLIES_ACME, SHORT_TOKENS), "retry: produce the retry");
    for (int64_t deadline = pu_now_ms() + ANSWER_MS; pu_now_ms() < deadline;) {
        const pu_record *f = pu_client_final_on(&client, REPLIES_ACME, id);
        if (f && f->attempt != pu_client_find(&client, REPLIES_ACME, id)->attempt)
            break;
        pu_client_poll(&client, 20);
    }
    check_replaced(REPLIES_ACME, id);
}

/* acme names beta's reply topic: dead-lettered, nothing on beta's topic. */
static void test_reply_topic_of_another(void)
{
    static const char id[] = "tn-wrong-topic";
    check(send_request(REQ_ACME, id, REPLIES_BETA, SHORT_TOKENS), "wrong topic: produce");
    const pu_record *d = NULL;
    for (int64_t deadline = pu_now_ms() + ANSWER_MS;
         !(d = pu_client_find(&client, PU_DLT, id)) && pu_now_ms() < deadline;)
        pu_client_poll(&client, 20);
    check(d && strstr(d->headers, "x-error-code=reply_topic_not_allowed\n"),
          "wrong topic: dead letter %s", d ? d->headers : "(none)");
    pu_client_poll(&client, 200);
    check(pu_client_replies_on(&client, REPLIES_BETA, id, NULL, 0) == 0,
          "wrong topic: a record reached beta's topic");
}

/* `mllama submit --tenant acme` writes acme's request topic, reads acme's
 * reply topic, and names its request with 128 random bits. */
static void test_submit_tenant(void)
{
    char log[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/submit.log", st.dir);
    char *argv[] = {PU_MLLAMA, "submit", "--brokers", st.brokers, "--tenant", "acme",
                    "--max-tokens", "4", "--quiet", "Hello", NULL};
    int code = pu_run(argv, log, ANSWER_MS);
    char *out = pu_slurp(log, NULL);
    const char *sent = out ? strstr(out, "sent req-") : NULL;
    size_t hex = sent ? strspn(sent + strlen("sent req-"), "0123456789abcdef") : 0;
    check(code == 0 && hex == 32 && strstr(out, " to " REQ_ACME "\n"),
          "submit --tenant acme: exit %d, %s", code, out ? out : "(no output)");
    free(out);
}

int main(void)
{
    pu_stack_start(&st, "tenants", TOPICS);
    static const char *const topics[] = {PU_REPLIES, REPLIES_UI, PU_DLT, REPLIES_ACME,
                                         REPLIES_BETA};
    pu_client_init(&client, st.brokers, topics, (int)(sizeof topics / sizeof topics[0]));

    static const char *const implicit[] = {SLOW_IMAGE_PIXELS, LONG_LIMIT, NULL};
    if (!pu_worker_start(&st.workers[0], &st.env, "w0", implicit) ||
        !pu_wait_assigned(&st.workers[0], JOIN_MS)) {
        pu_stack_stop(&st);
        pu_die("worker w0");
    }
    test_retry_not_started();
    test_request_stamped_ahead();
    test_cancel_stamped_ahead();
    test_other_reply_topic();
    check(pu_stop(&st.workers[0], PU_STOP_MS) == 0, "w0: drained with exit code 0");

    static const char *const tenants[] = {TENANTS, LONG_LIMIT, NULL};
    for (int i = 1; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "w%d", i);
        if (!pu_worker_start(&st.workers[i], &st.env, name, tenants) ||
            !pu_wait_assigned(&st.workers[i], JOIN_MS)) {
            pu_stack_stop(&st);
            pu_die(name);
        }
    }
    test_forged_retry_and_cancel();
    test_retry_within_tenant();
    test_reply_topic_of_another();
    test_submit_tenant();

    for (int i = 1; i < 3; i++)
        check(pu_stop(&st.workers[i], PU_STOP_MS) == 0, "w%d: drained with exit code 0", i);
    for (int i = 0; i < 3; i++)
        pu_check_log_clean(st.workers[i].log);
    pu_client_deinit(&client);
    pu_stack_stop(&st);
    return check_done();
}
