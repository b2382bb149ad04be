/* Crash-transparent streaming through `mllama gateway`: two workers in the
 * group, the one computing a stream is SIGKILLed mid-stream, and the
 * client's stream (one HTTP response, never reset) completes with text
 * identical, byte for byte, to an uninterrupted run of the same request
 * (same seed): the new attempt on the other worker reproduces the records
 * already sent (the CPU backend is batch-invariant, its records say
 * reproducible), the gateway checks and skips them and continues. The
 * gateway counts one continuation and no divergence; the SSE framing stays
 * exact across the crash.
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

static pu_stack st;
static gwt_gateway gw;

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

/* The index of the worker running a request, or -1. */
static int running_worker(void)
{
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < FIND_MS; pu_sleep_ms(PU_POLL_MS))
        for (int i = 0; i < 2; i++)
            if (pu_metric(pu_worker_http_port(&st.workers[i]), "mllama_requests_running") > 0)
                return i;
    return -1;
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
    const char *names[] = {"w1", "w2"};
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

    drain_test(body);
    pu_check_log_clean(gw.proc.log);
    pu_worker_drain(&st.workers[1 - (victim >= 0 ? victim : 0)]);
    free(got);
    free(want);
    free(body);
    gwt_response_free(&r);
    gwt_response_free(&ref);
    return check_done();
}
