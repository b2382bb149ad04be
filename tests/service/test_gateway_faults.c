/* Crash-transparent streaming through `mllama gateway`: two workers in the
 * group, the one computing a stream is SIGKILLed mid-stream, and the
 * client's stream (one HTTP response, never reset) completes with text
 * identical, byte for byte, to an uninterrupted run of the same request
 * (same seed): the new attempt on the other worker reproduces the records
 * already sent (the CPU backend is batch-invariant, its records say
 * reproducible), the gateway checks and skips them and continues. The
 * gateway counts one continuation and no divergence; the SSE framing stays
 * exact across the crash. The same with n = 2 choices, whose records the
 * killed attempt and the new one interleave differently: each choice's
 * text is byte-identical to an uninterrupted run's.
 *
 * Then the drain: SIGTERM while a stream is open. /readyz answers 503 at
 * once, a new chat request gets 503 not_ready with Retry-After, the open
 * stream runs to its [DONE] with no error event, and the gateway exits 0.
 * Skipped (77) without redis-server. */
#include "gw_client.h"

#define TOKENS (2048 / PU_SLOWDOWN) /* long enough to be killed mid-stream */
#define KILL_AT_EVENT 16            /* events the client has before the kill */
#define CALL_MS 60000               /* a stream, including the group's rebalance */
#define FIND_MS 5000                /* finding the worker that runs the stream */
#define DRAIN_AT_EVENT 4            /* events the client has before the SIGTERM */

#define WORKERS 3                   /* two at a time: the third replaces the first killed */
#define CHOICES 2
#define CHOICE_TOKENS (TOKENS / CHOICES) /* each choice's share of the stream */

static pu_stack st;
static gwt_gateway gw;
static const char *const names[WORKERS] = {"w1", "w2", "w3"};

static char *request_body(void)
{
    char extra[128];
    snprintf(extra, sizeof extra, "\"stream\":true,\"max_tokens\":%d,\"seed\":424242", TOKENS);
    return gwt_chat_body("Write a long story about a lighthouse.", NULL, extra);
}

/* The streamed text of a complete SSE body (framing checked), or NULL. */
static char *text_of(const gwt_response *r)
{
    char **ev;
    int n = r->body ? gwt_events(r->body, 0, &ev) : -1;
    if (n < 2)
        return NULL;
    check(!strcmp(ev[n - 1], "[DONE]"), "ends with [DONE]: %s", ev[n - 1]);
    for (int i = 0; i + 1 < n; i++)
        check(!strstr(ev[i], "\"error\""), "no error event: %.200s", ev[i]);
    char *text = gwt_stream_text(ev, n - 1);
    gwt_events_free(ev, n);
    return text;
}

/* The index of the worker running a request, or -1 (a killed one answers
 * no metric). */
static int running_worker(void)
{
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < FIND_MS; pu_sleep_ms(PU_POLL_MS))
        for (int i = 0; i < WORKERS; i++)
            if (pu_metric(pu_worker_http_port(&st.workers[i]), "mllama_requests_running") > 0)
                return i;
    return -1;
}

/* Each choice's text of a complete SSE body (framing checked) into
 * texts[i], owned; false when the body is not one. */
static bool choice_texts_of(const gwt_response *r, char **texts)
{
    char **ev;
    int n = r->body ? gwt_events(r->body, 0, &ev) : -1;
    for (int c = 0; c < CHOICES; c++)
        texts[c] = NULL;
    if (n < 2)
        return false;
    check(!strcmp(ev[n - 1], "[DONE]"), "ends with [DONE]: %s", ev[n - 1]);
    char **mine = malloc((size_t)n * sizeof *mine);
    if (!mine)
        pu_die("out of memory");
    for (int c = 0; c < CHOICES; c++) {
        int k = 0;
        for (int i = 0; i + 1 < n; i++) {
            check(!strstr(ev[i], "\"error\""), "no error event: %.200s", ev[i]);
            cJSON *j = cJSON_Parse(ev[i]);
            if (pu_json_num(j, PU_PATH("choices", "0", "index")) == c)
                mine[k++] = ev[i];
            cJSON_Delete(j);
        }
        texts[c] = gwt_stream_text(mine, k);
    }
    free(mine);
    gwt_events_free(ev, n);
    return true;
}

/* n = 2 across a crash: the killed worker's attempt interleaved the two
 * choices as it sampled them, the new attempt on another worker compares
 * and continues each choice, and both texts equal an uninterrupted run's.
 * *victim: the worker killed before (replaced here by w3). */
static void choices_crash_test(int victim)
{
    if (victim >= 0 && (!pu_worker_start(&st.workers[2], &st.env, names[2], NULL) ||
                        !pu_wait_assigned(&st.workers[2], PU_START_MS)))
        pu_die("w3 start");
    char extra[160];
    snprintf(extra, sizeof extra, "\"stream\":true,\"max_tokens\":%d,\"seed\":434343,\"n\":%d",
             CHOICE_TOKENS, CHOICES);
    char *body = gwt_chat_body("Write two long stories about a lighthouse.", NULL, extra);
    gwt_response ref = {0}, r = {0};
    char *want[CHOICES], *got[CHOICES];
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &ref, CALL_MS) &&
              choice_texts_of(&ref, want),
          "n 2: the uninterrupted run completes");
    double continued = pu_metric(gw.ops_port, "mllama_gateway_continuations_total");
    int fd = gwt_send_request(gw.port, "POST", "/v1/chat/completions", NULL, body, CALL_MS);
    char until[32];
    snprintf(until, sizeof until, "id: %d\n", KILL_AT_EVENT);
    check(fd >= 0 && gwt_read(fd, &r, until, CALL_MS), "n 2: the stream is under way");
    int killed = running_worker();
    check(killed >= 0 && !r.complete, "n 2: a worker runs the stream when it is killed");
    if (killed >= 0)
        pu_kill(&st.workers[killed]);
    check(gwt_read(fd, &r, NULL, CALL_MS), "n 2: the stream completes after the crash");
    close(fd);
    check(r.status == 200 && choice_texts_of(&r, got), "n 2: one 200 response throughout: %d",
          r.status);
    for (int c = 0; c < CHOICES; c++)
        check(got[c] && want[c] && !strcmp(got[c], want[c]),
              "n 2: choice %d byte-identical across the crash (%zu vs %zu bytes)", c,
              got[c] ? strlen(got[c]) : 0, want[c] ? strlen(want[c]) : 0);
    check(pu_metric(gw.ops_port, "mllama_gateway_continuations_total") == continued + 1,
          "n 2: one more continuation counted");
    check(pu_metric(gw.ops_port, "mllama_gateway_divergences_total") == 0, "n 2: no divergence");
    for (int c = 0; c < CHOICES; c++) {
        free(want[c]);
        free(got[c]);
    }
    gwt_response_free(&ref);
    gwt_response_free(&r);
    free(body);
}

/* SIGTERM with a stream open: it completes, nothing new is taken, exit 0. */
static void drain_test(const char *body)
{
    int64_t t0 = pu_now_ms();
    gwt_response r = {0}, ready = {0}, refused = {0};
    int fd = gwt_send_request(gw.port, "POST", "/v1/chat/completions", NULL, body, CALL_MS);
    char until[32];
    snprintf(until, sizeof until, "id: %d\n", DRAIN_AT_EVENT);
    check(fd >= 0 && gwt_read(fd, &r, until, CALL_MS), "the stream to drain is under way");
    pu_signal(&gw.proc, SIGTERM);
    check(pu_wait_log(&gw.proc, "drain_started", 1, CALL_MS), "the drain starts");
    check(gwt_call(gw.ops_port, "GET", "/readyz", NULL, NULL, &ready, CALL_MS) &&
              ready.status == 503,
          "/readyz is 503 while draining: %d", ready.status);
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &refused, CALL_MS) &&
              refused.status == 503 && refused.body && strstr(refused.body, "\"not_ready\""),
          "a new request is 503 not_ready while draining: %d %.200s", refused.status,
          refused.body ? refused.body : "");
    char retry[16];
    check(gwt_header(&refused, "Retry-After", retry, sizeof retry), "with Retry-After");
    check(!r.complete && pu_running(&gw.proc), "the stream is still open during the drain");
    check(gwt_read(fd, &r, NULL, CALL_MS), "the open stream completes after SIGTERM");
    close(fd);
    char *text = text_of(&r);
    check(text && strlen(text) > 0, "the drained stream has its text and no error event");
    check(pu_wait_exit(&gw.proc, PU_STOP_MS), "the gateway exits once the stream ended");
    int code = pu_exit_code(&gw.proc);
    check(code == 0, "gateway exit code %d after the drain", code);
    fprintf(stderr, "drain test: %.1f s\n", (pu_now_ms() - t0) / 1000.0);
    free(text);
    gwt_response_free(&r);
    gwt_response_free(&ready);
    gwt_response_free(&refused);
}

int main(void)
{
    pu_stack_start(&st, "gwfault", GWT_TOPICS);
    for (int i = 0; i < 2; i++)
        if (!pu_worker_start(&st.workers[i], &st.env, names[i], NULL))
            pu_die("worker start");
    for (int i = 0; i < 2; i++)
        if (!pu_wait_assigned(&st.workers[i], PU_START_MS))
            pu_die("both workers assigned");
    if (!gwt_start(&gw, &st.env, "gateway", NULL))
        pu_die("gateway start");
    int64_t t0 = pu_now_ms();

    char *body = request_body();
    gwt_response ref;
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &ref, CALL_MS),
          "the uninterrupted run completes");
    char *want = text_of(&ref);
    check(want && strlen(want) > 0, "the uninterrupted run has text");
    fprintf(stderr, "uninterrupted: %zu bytes of text in %.1f s\n", want ? strlen(want) : 0,
            (pu_now_ms() - t0) / 1000.0);

    gwt_response r = {0};
    int fd = gwt_send_request(gw.port, "POST", "/v1/chat/completions", NULL, body, CALL_MS);
    char until[32];
    snprintf(until, sizeof until, "id: %d\n", KILL_AT_EVENT);
    check(fd >= 0 && gwt_read(fd, &r, until, CALL_MS), "the stream is under way");
    int victim = running_worker();
    check(victim >= 0 && !r.complete, "a worker runs the stream when it is killed");
    if (victim >= 0) {
        pu_kill(&st.workers[victim]);
        fprintf(stderr, "killed %s at event %d\n", names[victim], KILL_AT_EVENT);
    }
    check(gwt_read(fd, &r, NULL, CALL_MS), "the stream completes after the crash");
    close(fd);
    check(r.status == 200, "one 200 response throughout: %d", r.status);
    char *got = text_of(&r);
    check(got && want && !strcmp(got, want),
          "byte-identical text across the crash (%zu vs %zu bytes)", got ? strlen(got) : 0,
          want ? strlen(want) : 0);
    check(pu_metric(gw.ops_port, "mllama_gateway_continuations_total") == 1,
          "one continuation counted");
    check(pu_metric(gw.ops_port, "mllama_gateway_divergences_total") == 0, "no divergence");
    fprintf(stderr, "crash test: %.1f s\n", (pu_now_ms() - t0) / 1000.0);

    choices_crash_test(victim);
    drain_test(body);
    pu_check_log_clean(gw.proc.log);
    for (int i = 0; i < WORKERS; i++)
        if (st.workers[i].pid > 0 && pu_running(&st.workers[i]))
            pu_worker_drain(&st.workers[i]);
    free(got);
    free(want);
    free(body);
    gwt_response_free(&r);
    gwt_response_free(&ref);
    return check_done();
}
