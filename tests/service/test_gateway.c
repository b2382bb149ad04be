/* `mllama gateway` end to end, as separate processes: `mllama mock-kafka`, a
 * real redis-server, a worker on the micro model and the gateway, with curl
 * (when on PATH) and a socket client of the test's own as HTTP clients.
 *
 * - stream: true with an inline image: curl -N sees 200, text/event-stream,
 *   no-cache, X-Accel-Buffering: no, X-Request-Id, and exactly
 *   "id: n\ndata: {chunk}\n\n" events n = 0, 1, ... ending "data: [DONE]";
 *   every chunk is a chat.completion.chunk of that id and the model asked
 *   for, with no seq, attempt or timings.
 * - stream: false with the same seed: one chat.completion whose content is
 *   the stream's text, with usage and its cached_tokens detail.
 * - stream_options.include_usage: a last chunk with "choices": [] and usage.
 * - n = 2, streamed and not: chunks of one choice each (index, role in each
 *   choice's first, one finish_reason each), the usage chunk; stream: false
 *   the same two texts as the completion's two choices.
 * - An image URL (http on loopback, as gateway_sets allow): fetched by the
 *   gateway, the same tokens as the same bytes inline; a 404 and a page
 *   that is not an image are 400 invalid_image_url naming the part; the
 *   fetches counted by result; a client that leaves while its image is
 *   still coming leaves nothing pending.
 * - A request the worker refuses (max_tokens 0) is that error's status and
 *   OpenAI error object, before any SSE byte.
 * - GET /v1/models: the base model, and the adapters stored in Redis
 *   (published before the gateway starts: its first listing has them);
 *   unknown routes 404, wrong methods 405, JSON errors. Redis killed: the
 *   failed listing is logged once, /v1/models still lists the adapter.
 * - Resume: a client that drops a long stream after event 2 and comes back
 *   with Last-Event-ID: 2 gets events 3, 4, ... to [DONE]; without the
 *   header, from 0; the two readings agree; an unknown id is 404.
 * - Explicit cancel: POST .../cancel ends a long stream (finish_reason
 *   cancelled) and counts in mllama_gateway_cancels_total.
 * - Disconnect and vanish: nobody resumes within gateway.abandon_ms, the
 *   gateway cancels, the worker's cancelled count rises.
 * - The drain's grace passing: SIGTERM with a long stream open and
 *   drain.grace_ms shorter than it; the stream ends with a not_ready error
 *   event then [DONE], its request is cancelled (the worker's cancelled
 *   count rises), and the gateway exits 0 (the stream that ends within the
 *   grace is test_gateway_faults.c's).
 * - The gateway and the worker stop on SIGTERM with exit code 0, and no
 *   sanitizer report in either log.
 * Skipped (77) without redis-server. */
#include "gw_client.h"
#include "img_server.h"

#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define CALL_MS 30000        /* one request through the gateway */
#define SHORT_TOKENS 8
#define LONG_TOKENS (4096 / PU_SLOWDOWN) /* streams long enough to interrupt */
/* The resume test reads its stream to the end, so it streams a quarter as
 * much, and waits for the end as long as two calls: the sanitizer build
 * streams the micro model at ~40 tokens/s, and beside two other
 * integration tests on a busy host it had 1,013 of LONG_TOKENS' 1,024
 * events when one call's wait ran out (2026-12-06). */
#define RESUME_TOKENS (LONG_TOKENS / 4)
#define RESUME_MS (2 * CALL_MS)
#define DROP_AFTER_ID 2      /* the resume test's client leaves after this event */
#define ABANDON_MS 300       /* gateway.abandon_ms of this test */
#define CANCEL_MS 20000      /* a cancel reaching the worker and its final back */
#define SEED "\"seed\":1234"
#define LEAVE_MS 5000        /* a client's close seen while its image is fetched */
#define ERR_BODY_MAX 4096
/* An adapter stored in Redis: /v1/models lists it by its key alone. */
#define REDIS_ADAPTER "redis-only-adapter"

static pu_stack st;
static gwt_gateway gw;
static img_server img; /* the image URLs' web server */
static char *image_part;

/* drain.grace_ms is as short as ABANDON_MS, for the same reason: a long
 * stream outlives it. */
/* The image URLs' server is on loopback, plain HTTP. */
static const char *const gateway_sets[] = {"gateway.abandon_ms=300", "gateway.keepalive_s=1",
                                           "drain.grace_ms=300", "gateway.adapters_refresh_s=1",
                                           "gateway.image_fetch_http=true",
                                           "gateway.image_fetch_private=true", NULL};
_Static_assert(ABANDON_MS == 300, "gateway_sets spells ABANDON_MS");
#define REFRESH_MS 1000 /* gateway.adapters_refresh_s of gateway_sets */
_Static_assert(REFRESH_MS == 1000, "gateway_sets spells REFRESH_MS");
#define STALE_LISTINGS 3 /* failed listings watched for a second log line */

/* ---- helpers ---------------------------------------------------------------------- */

/* A chunk event's checks: object, id, model, and the worker's own fields gone. */
static void check_chunk(const char *data, const char *id, const char *model)
{
    cJSON *j = cJSON_Parse(data);
    check(j != NULL, "chunk is JSON: %.120s", data);
    const char *obj = pu_json_str(j, PU_PATH("object"));
    check(obj && !strcmp(obj, "chat.completion.chunk"), "object: %s", obj ? obj : "(none)");
    const char *cid = pu_json_str(j, PU_PATH("id"));
    check(cid && !strcmp(cid, id), "chunk id %s, header %s", cid ? cid : "(none)", id);
    const char *m = pu_json_str(j, PU_PATH("model"));
    check(m && !strcmp(m, model), "model %s", m ? m : "(none)");
    check(!cJSON_GetObjectItem(j, "seq") && !cJSON_GetObjectItem(j, "attempt") &&
              !cJSON_GetObjectItem(j, "timings"),
          "worker fields removed: %.200s", data);
    cJSON_Delete(j);
}

/* The text of a complete SSE body, after the framing checks; NULL when bad. */
static char *sse_text(const char *body, const char *id, const char *model)
{
    char **ev;
    int n = gwt_events(body, 0, &ev);
    if (n < 2)
        return NULL;
    check(!strcmp(ev[n - 1], "[DONE]"), "last event is [DONE]: %s", ev[n - 1]);
    for (int i = 0; i + 1 < n; i++)
        check_chunk(ev[i], id, model);
    char *text = gwt_stream_text(ev, n - 1);
    gwt_events_free(ev, n);
    return text;
}

static double metric(int port, const char *name)
{
    return pu_metric(port, name);
}

/* ---- stream and non-stream --------------------------------------------------------- */

static char *stream_text; /* the streamed answer of the seeded request */

static void test_stream_curl(void)
{
    if (!pu_which("curl")) {
        fprintf(stderr, "no curl on PATH: the stream is read by the test's client only\n");
        return;
    }
    char *body = gwt_chat_body("Describe the image.", image_part,
                               "\"stream\":true,\"max_tokens\":8," SEED ",\"model\":\"micro\"");
    char file[PU_PATH_MAX + 32], hdr[PU_PATH_MAX + 32], cmd[4 * PU_PATH_MAX];
    snprintf(file, sizeof file, "%s/body.json", st.dir);
    snprintf(hdr, sizeof hdr, "%s/headers.txt", st.dir);
    pu_write_file(file, body, strlen(body));
    snprintf(cmd, sizeof cmd,
             "curl -sS -N -m 30 -D %s -H 'Content-Type: application/json' --data-binary @%s "
             "http://127.0.0.1:%d/v1/chat/completions",
             hdr, file, gw.port);
    int code;
    char *out = pu_shell(cmd, &code);
    char *headers = pu_slurp(hdr, NULL);
    check(code == 0 && out && headers, "curl exit %d", code);
    if (out && headers) {
        check(strstr(headers, "HTTP/1.1 200") != NULL, "status: %.60s", headers);
        check(strstr(headers, "Content-Type: text/event-stream") != NULL, "content type");
        check(strstr(headers, "Cache-Control: no-cache") != NULL, "no-cache");
        check(strstr(headers, "X-Accel-Buffering: no") != NULL, "X-Accel-Buffering");
        const char *rid = strstr(headers, "X-Request-Id: chatcmpl-");
        check(rid != NULL, "X-Request-Id");
        char id[64] = "";
        if (rid)
            sscanf(rid + 14, "%63[a-z0-9-]", id);
        check(strlen(id) == 41, "id chatcmpl-<32 hex>: %s", id);
        stream_text = sse_text(out, id, "micro");
        check(stream_text && stream_text[0], "the stream has text");
    }
    free(out);
    free(headers);
    free(body);
}

static void test_stream_socket_and_completion(void)
{
    char *body = gwt_chat_body("Describe the image.", image_part,
                               "\"stream\":true,\"max_tokens\":8," SEED);
    gwt_response r;
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &r, CALL_MS),
          "stream answered");
    char id[64] = "";
    check(r.status == 200 && gwt_header(&r, "X-Request-Id", id, sizeof id), "200 %d", r.status);
    char *text = r.body ? sse_text(r.body, id, "micro") : NULL;
    check(text != NULL, "socket stream parsed");
    if (stream_text && text)
        check(!strcmp(stream_text, text), "same seed, same text: '%s' vs '%s'", stream_text, text);
    if (!stream_text)
        stream_text = text;
    else
        free(text);
    gwt_response_free(&r);
    free(body);

    body = gwt_chat_body("Describe the image.", image_part, "\"max_tokens\":8," SEED);
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &r, CALL_MS),
          "completion answered");
    check(r.status == 200, "completion status %d: %.300s", r.status, r.body ? r.body : "");
    char rid[64];
    check(gwt_header(&r, "X-Request-Id", rid, sizeof rid) && !strncmp(rid, "chatcmpl-", 9),
          "the completion names its id");
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const char *obj = pu_json_str(j, PU_PATH("object"));
    check(obj && !strcmp(obj, "chat.completion"), "object %s", obj ? obj : "(none)");
    const char *content = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
    check(content && stream_text && !strcmp(content, stream_text),
          "completion text = stream text: '%s' vs '%s'", content ? content : "(none)",
          stream_text ? stream_text : "(none)");
    check(pu_json_num(j, PU_PATH("usage", "completion_tokens")) > 0, "usage");
    check(!isnan(pu_json_num(j, PU_PATH("usage", "prompt_tokens_details", "cached_tokens"))),
          "cached_tokens");
    check(!cJSON_GetObjectItem(j, "seq") && !cJSON_GetObjectItem(j, "timings"), "no worker fields");
    cJSON_Delete(j);
    gwt_response_free(&r);
    free(body);
}

static void test_include_usage(void)
{
    char *body = gwt_chat_body("Hello.", NULL,
                               "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                               "\"max_tokens\":4");
    gwt_response r;
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &r, CALL_MS), "answered");
    char **ev;
    int n = r.body ? gwt_events(r.body, 0, &ev) : -1;
    check(n >= 3, "events %d", n);
    if (n >= 3) {
        cJSON *j = cJSON_Parse(ev[n - 2]);
        const cJSON *choices = cJSON_GetObjectItem(j, "choices");
        check(cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 0, "usage chunk: %s",
              ev[n - 2]);
        check(pu_json_num(j, PU_PATH("usage", "total_tokens")) > 0, "usage: %s", ev[n - 2]);
        cJSON_Delete(j);
        gwt_events_free(ev, n);
    }
    gwt_response_free(&r);
    free(body);
}

/* ---- n choices ---------------------------------------------------------------------- */

#define CHOICES 2
#define CHOICE_TEXT_MAX 4096

/* n = 2 streamed with a seed and include_usage: every chunk one choice of
 * index 0 or 1, each choice's first with the role and its last (only) with
 * a finish_reason, then the usage chunk and [DONE]; stream: false with the
 * same seed: one completion whose two choices are the streamed texts. */
static void test_choices(void)
{
    const char *opts = "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"max_tokens\":6,\"n\":2," SEED;
    char *body = gwt_chat_body("Hello.", NULL, opts);
    gwt_response r;
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &r, CALL_MS),
          "n 2: answered");
    char id[64] = "";
    check(r.status == 200 && gwt_header(&r, "X-Request-Id", id, sizeof id), "n 2: 200 %d",
          r.status);
    char **ev;
    int n = r.body ? gwt_events(r.body, 0, &ev) : -1;
    char text[CHOICES][CHOICE_TEXT_MAX] = {"", ""};
    int records[CHOICES] = {0}, finished[CHOICES] = {0};
    check(n >= 2 * CHOICES + 2, "n 2: %d events", n);
    for (int i = 0; i + 2 < n; i++) {
        check_chunk(ev[i], id, "micro");
        cJSON *j = cJSON_Parse(ev[i]);
        double index = pu_json_num(j, PU_PATH("choices", "0", "index"));
        int c = index == 1 ? 1 : 0;
        check(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")) == 1 &&
                  (index == 0 || index == 1),
              "n 2: event %d is one choice of index 0 or 1: %s", i, ev[i]);
        const char *role = pu_json_str(j, PU_PATH("choices", "0", "delta", "role"));
        const char *content = pu_json_str(j, PU_PATH("choices", "0", "delta", "content"));
        check((records[c]++ == 0) == (role != NULL), "n 2: choice %d's role in its first only", c);
        check(!finished[c], "n 2: choice %d: a chunk after its finish_reason", c);
        finished[c] = pu_finish_reason(j) != NULL;
        if (content)
            strncat(text[c], content, CHOICE_TEXT_MAX - strlen(text[c]) - 1);
        cJSON_Delete(j);
    }
    check(finished[0] && finished[1], "n 2: both choices finished");
    if (n >= 2) {
        cJSON *u = cJSON_Parse(ev[n - 2]);
        check(cJSON_GetArraySize(cJSON_GetObjectItem(u, "choices")) == 0 &&
                  pu_json_num(u, PU_PATH("usage", "completion_tokens")) >= CHOICES,
              "n 2: the usage chunk: %s", ev[n - 2]);
        cJSON_Delete(u);
        check(!strcmp(ev[n - 1], "[DONE]"), "n 2: [DONE] last");
    }
    if (n > 0)
        gwt_events_free(ev, n);
    gwt_response_free(&r);
    free(body);

    body = gwt_chat_body("Hello.", NULL, "\"max_tokens\":6,\"n\":2," SEED);
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &r, CALL_MS),
          "n 2, stream false: answered");
    cJSON *j = r.status == 200 && r.body ? cJSON_Parse(r.body) : NULL;
    check(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")) == CHOICES,
          "n 2, stream false: two choices: %.300s", r.body ? r.body : "");
    for (int c = 0; c < CHOICES; c++) {
        char index[4];
        snprintf(index, sizeof index, "%d", c);
        const char *content = pu_json_str(j, PU_PATH("choices", index, "message", "content"));
        check(content && !strcmp(content, text[c]) &&
                  pu_json_num(j, PU_PATH("choices", index, "index")) == c &&
                  pu_json_str(j, PU_PATH("choices", index, "finish_reason")),
              "n 2, stream false: choice %d '%s' is the streamed '%s'", c,
              content ? content : "(none)", text[c]);
    }
    cJSON_Delete(j);
    gwt_response_free(&r);
    free(body);
}

/* ---- errors -------------------------------------------------------------------------- */

/* One call's status and error code. */
/* The request answers the OpenAI error object of status and code, whose
 * message contains says (unless NULL). */
static void check_error_says(const char *method, const char *path, const char *body, int status,
                             const char *code, const char *says)
{
    gwt_response r;
    check(gwt_call(gw.port, method, path, NULL, body, &r, CALL_MS), "%s %s answered", method, path);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const char *got = pu_json_str(j, PU_PATH("error", "code"));
    check(r.status == status && got && !strcmp(got, code), "%s %s: %d %s, want %d %s: %.200s",
          method, path, r.status, got ? got : "(none)", status, code, r.body ? r.body : "");
    check(pu_json_str(j, PU_PATH("error", "message")) && pu_json_str(j, PU_PATH("error", "type")) &&
              cJSON_IsNull(pu_json_at(j, PU_PATH("error", "param"))),
          "OpenAI error object: %.200s", r.body ? r.body : "");
    const char *msg = pu_json_str(j, PU_PATH("error", "message"));
    if (says)
        check(msg && strstr(msg, says), "the message says '%s': %s", says, msg ? msg : "(none)");
    cJSON_Delete(j);
    gwt_response_free(&r);
}

static void check_error(const char *method, const char *path, const char *body, int status,
                        const char *code)
{
    check_error_says(method, path, body, status, code, NULL);
}

static void test_errors(void)
{
    char *bad_tokens = gwt_chat_body("Hello.", NULL, "\"stream\":true,\"max_tokens\":0");
    check_error("POST", "/v1/chat/completions", bad_tokens, 400, "invalid_request");
    free(bad_tokens);
    check_error("POST", "/v1/chat/completions", "{\"messages\": [", 400, "invalid_json");
    check_error("POST", "/v1/chat/completions", "[1, 2]", 400, "invalid_json");
    check_error("POST", "/v1/chat/completions", "{\"stream\": \"yes\", \"messages\": []}", 400,
                "invalid_request");
    check_error("GET", "/v1/chat/completions", NULL, 405, "method_not_allowed");
    check_error("GET", "/v1/nothing", NULL, 404, "not_found");
    check_error("GET", "/v1/chat/completions/chatcmpl-00000000000000000000000000000000/stream",
                NULL, 404, "not_found");
    check_error("POST", "/v1/chat/completions/x/cancel", NULL, 404, "not_found");

    gwt_response r;
    check(gwt_call(gw.port, "GET", "/v1/models", NULL, NULL, &r, CALL_MS), "models");
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const char *first = pu_json_str(j, PU_PATH("data", "0", "id"));
    check(r.status == 200 && first && !strcmp(first, "micro"), "models: %.200s",
          r.body ? r.body : "");
    const char *adapter = pu_json_str(j, PU_PATH("data", "1", "id"));
    const char *parent = pu_json_str(j, PU_PATH("data", "1", "parent"));
    check(adapter && !strcmp(adapter, REDIS_ADAPTER) && parent && !strcmp(parent, "micro"),
          "models lists the adapter stored in Redis: %.300s", r.body ? r.body : "");
    check(!pu_json_str(j, PU_PATH("data", "2", "id")), "and nothing else: %.300s",
          r.body ? r.body : "");
    cJSON_Delete(j);
    gwt_response_free(&r);
}

/* ---- image URLs ---------------------------------------------------------------------- */

/* A chat body whose one image is http://127.0.0.1:<img.port><path>. */
static char *url_body(const char *path, const char *extra)
{
    char part[256];
    snprintf(part, sizeof part,
             "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://127.0.0.1:%d%s\"}}",
             img.port, path);
    return gwt_chat_body("Describe the image.", part, extra);
}

/* The gateway fetches the image a URL names and the worker answers the
 * same tokens as for the same bytes inline; what the URL does not give
 * (a 404, a page that is not an image) is a 400 invalid_image_url naming
 * the content part, and the fetches are counted by result. */
static void test_image_urls(void)
{
    char *body = url_body("/img", "\"stream\":true,\"max_tokens\":8," SEED);
    gwt_response r;
    check(gwt_call(gw.port, "POST", "/v1/chat/completions", NULL, body, &r, CALL_MS),
          "image URL stream answered");
    char id[64] = "";
    check(r.status == 200 && gwt_header(&r, "X-Request-Id", id, sizeof id), "200 %d: %.300s",
          r.status, r.body ? r.body : "");
    char *text = r.status == 200 && r.body ? sse_text(r.body, id, "micro") : NULL;
    check(text && stream_text && !strcmp(text, stream_text),
          "the URL's image answers as the same bytes inline: '%s' vs '%s'", text ? text : "",
          stream_text ? stream_text : "");
    free(text);
    gwt_response_free(&r);
    free(body);
    body = url_body("/missing", "\"max_tokens\":8");
    check_error_says("POST", "/v1/chat/completions", body, 400, "invalid_image_url",
                     "messages[0].content[0].image_url.url: the server answered HTTP 404");
    free(body);
    body = url_body("/text", "\"max_tokens\":8");
    check_error_says("POST", "/v1/chat/completions", body, 400, "invalid_image_url",
                     "not a JPEG, PNG, WebP, GIF or TIFF image");
    free(body);
    check(metric(gw.ops_port, "mllama_gateway_image_fetches_total{result=\"ok\"}") == 2,
          "two fetched (the image and the page)");
    check(metric(gw.ops_port, "mllama_gateway_image_fetches_total{result=\"failed\"}") == 1,
          "one failed (the 404)");
    check(metric(gw.ops_port, "mllama_gateway_image_fetches_pending") == 0, "none pending");

    /* A client that leaves while its image is still coming: the fetch is
     * stopped with its connection (no answer, no leak, nothing pending). */
    body = url_body("/slow", "\"max_tokens\":8");
    int fd = gwt_send_request(gw.port, "POST", "/v1/chat/completions", NULL, body, CALL_MS);
    check(fd >= 0, "slow image request sent");
    bool pending = false;
    for (int64_t end = pu_now_ms() + CALL_MS; !pending && pu_now_ms() < end; pu_sleep_ms(20))
        pending = metric(gw.ops_port, "mllama_gateway_image_fetches_pending") == 1;
    check(pending, "the request waits on its image");
    close(fd);
    /* Well within the fetch's own timeout (gateway.image_fetch_timeout_ms,
     * 10 s): the gateway sees the socket close. */
    for (int64_t end = pu_now_ms() + LEAVE_MS; pending && pu_now_ms() < end; pu_sleep_ms(20))
        pending = metric(gw.ops_port, "mllama_gateway_image_fetches_pending") != 0;
    check(!pending, "the client left: nothing pending within %d ms", LEAVE_MS);
    free(body);
}

/* ---- resume, cancel, abandon ------------------------------------------------------------ */

/* Start a stream of `tokens` tokens on a socket of its own; its id in id
 * (64 bytes). */
static int long_stream(gwt_response *r, char *id, int tokens)
{
    char extra[192];
    snprintf(extra, sizeof extra, "\"stream\":true,\"max_tokens\":%d," SEED "," PU_NO_STOP,
             tokens);
    char *body = gwt_chat_body("Tell a long story.", NULL, extra);
    memset(r, 0, sizeof *r);
    int fd = gwt_send_request(gw.port, "POST", "/v1/chat/completions", NULL, body, CALL_MS);
    free(body);
    check(fd >= 0 && gwt_read(fd, r, "id: 0\n", CALL_MS), "a long stream starts");
    id[0] = 0;
    gwt_header(r, "X-Request-Id", id, 64);
    return fd;
}

static void test_resume(void)
{
    gwt_response r;
    char id[64], path[128], until[32];
    int fd = long_stream(&r, id, RESUME_TOKENS);
    snprintf(until, sizeof until, "id: %d\n", DROP_AFTER_ID + 1);
    check(gwt_read(fd, &r, until, CALL_MS), "events before the drop");
    close(fd); /* the client goes away mid-stream */
    snprintf(path, sizeof path, "/v1/chat/completions/%s/stream", id);
    char hdr[64];
    snprintf(hdr, sizeof hdr, "Last-Event-ID: %d\r\n", DROP_AFTER_ID);
    gwt_response rest, all;
    check(gwt_call(gw.port, "GET", path, hdr, NULL, &rest, RESUME_MS), "resumed to the end");
    check(rest.status == 200, "resume status %d", rest.status);
    char **ev;
    int n = rest.body ? gwt_events(rest.body, DROP_AFTER_ID + 1, &ev) : -1;
    check(n >= 2 && !strcmp(ev[n - 1], "[DONE]"), "resumed events from %d: %d", DROP_AFTER_ID + 1,
          n);
    if (n > 0)
        gwt_events_free(ev, n);
    check(gwt_call(gw.port, "GET", path, NULL, NULL, &all, CALL_MS), "replayed from 0");
    char **ev_all;
    int n_all = all.body ? gwt_events(all.body, 0, &ev_all) : -1;
    check(n_all == n + DROP_AFTER_ID + 1, "replay has every event: %d = %d + %d", n_all, n,
          DROP_AFTER_ID + 1);
    if (n_all > 0)
        gwt_events_free(ev_all, n_all);
    check(!strcmp(all.body + strlen(all.body) - strlen(rest.body), rest.body),
          "the resumed events are the replay's tail");
    check(metric(gw.ops_port, "mllama_gateway_resumes_total") == 2, "resumes counted");
    gwt_response_free(&r);
    gwt_response_free(&rest);
    gwt_response_free(&all);
}

static void test_cancel(void)
{
    gwt_response r;
    char id[64], path[128];
    int fd = long_stream(&r, id, LONG_TOKENS);
    snprintf(path, sizeof path, "/v1/chat/completions/%s/cancel", id);
    gwt_response c;
    check(gwt_call(gw.port, "POST", path, NULL, NULL, &c, CALL_MS) && c.status == 200,
          "cancel answered %d", c.status);
    gwt_response_free(&c);
    check(gwt_read(fd, &r, NULL, CANCEL_MS), "the cancelled stream ends");
    check(r.body && strstr(r.body, "\"finish_reason\":\"cancelled\""), "finish_reason cancelled");
    check(r.body && strstr(r.body, "data: [DONE]\n\n"), "then [DONE]");
    close(fd);
    check(metric(gw.ops_port, "mllama_gateway_cancels_total") == 1, "cancel counted");
    gwt_response_free(&r);
}

/* The worker's count of cancelled requests, and whether it rises above
 * `before` within CANCEL_MS: the gateway told the worker to stop. */
#define WORKER_CANCELLED "mllama_requests_total{outcome=\"cancelled\"}"
static double worker_cancelled(void)
{
    return metric(pu_worker_http_port(&st.workers[0]), WORKER_CANCELLED);
}

static bool worker_cancelled_rises(double before)
{
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < CANCEL_MS; pu_sleep_ms(50))
        if (worker_cancelled() > before)
            return true;
    return false;
}

static void test_abandon(void)
{
    double before = worker_cancelled();
    gwt_response r;
    char id[64];
    int fd = long_stream(&r, id, LONG_TOKENS);
    close(fd);
    gwt_response_free(&r);
    check(worker_cancelled_rises(before),
          "the worker's cancelled count rises after the client vanished");
    check(metric(gw.ops_port, "mllama_gateway_abandoned_total") == 1, "abandon counted");
}

/* Redis gone: the gateway keeps its last list of Redis's adapters and says
 * so once, however many listings fail. */
static void test_models_redis_down(void)
{
    pu_kill(&st.redis.proc);
    check(pu_wait_log(&gw.proc, "gateway_adapters_stale", 1, CALL_MS),
          "a failed listing is logged");
    pu_sleep_ms(STALE_LISTINGS * REFRESH_MS);
    check(pu_file_count(gw.proc.log, "gateway_adapters_stale") == 1, "logged once: %d",
          pu_file_count(gw.proc.log, "gateway_adapters_stale"));
    gwt_response r;
    check(gwt_call(gw.port, "GET", "/v1/models", NULL, NULL, &r, CALL_MS) && r.status == 200 &&
              r.body && strstr(r.body, "\"" REDIS_ADAPTER "\""),
          "/v1/models keeps the last list: %d %.300s", r.status, r.body ? r.body : "");
    gwt_response_free(&r);
}

/* SIGTERM with a long stream open: the grace passes, the stream ends with
 * the gateway's error event, the worker is told to stop computing it. */
static void test_drain_grace(void)
{
    double before = worker_cancelled();
    gwt_response r;
    char id[64];
    int fd = long_stream(&r, id, LONG_TOKENS);
    pu_signal(&gw.proc, SIGTERM);
    check(gwt_read(fd, &r, NULL, CANCEL_MS), "the stream ends after the grace");
    close(fd);
    check(r.body && strstr(r.body, "\"code\":\"not_ready\"") &&
              strstr(r.body, "shutting down") && strstr(r.body, "data: [DONE]\n\n"),
          "an error event saying the gateway is shutting down, then [DONE]: %.300s",
          r.body ? r.body + (r.body_len > 300 ? r.body_len - 300 : 0) : "");
    check(pu_wait_exit(&gw.proc, PU_STOP_MS), "the gateway exits after the grace");
    check(pu_exit_code(&gw.proc) == 0, "gateway exit code %d after the drain",
          pu_exit_code(&gw.proc));
    check(worker_cancelled_rises(before),
          "the worker's cancelled count rises: the drained request was cancelled");
    gwt_response_free(&r);
}

int main(void)
{
    pu_stack_start(&st, "gw", GWT_TOPICS);
    size_t len;
    char sha[ML_SHA256_HEX_SIZE];
    uint8_t *bytes = pu_slurp_image(IMAGE, &len, sha);
    image_part = pu_image_part(bytes, len);
    if (!img_server_start(&img, bytes, len))
        pu_die("image server");
    if (!pu_worker_start(&st.workers[0], &st.env, "w1", NULL) ||
        !pu_wait_assigned(&st.workers[0], PU_START_MS))
        pu_die("worker start");
    redisReply *put = pu_redis_cmd(&st.redis, "HSET mllama:adapter:" REDIS_ADAPTER " sha256 x");
    check(put && put->type == REDIS_REPLY_INTEGER, "an adapter key in Redis");
    freeReplyObject(put);
    if (!gwt_start(&gw, &st.env, "gateway", gateway_sets))
        pu_die("gateway start");
    int64_t t0 = pu_now_ms();
    test_stream_curl();
    test_stream_socket_and_completion();
    test_image_urls();
    test_include_usage();
    test_choices();
    test_errors();
    test_resume();
    test_cancel();
    test_abandon();
    test_models_redis_down();
    test_drain_grace();
    fprintf(stderr, "gateway tests: %.1f s\n", (pu_now_ms() - t0) / 1000.0);
    pu_check_log_clean(gw.proc.log);
    pu_worker_drain(&st.workers[0]);
    img_server_stop(&img);
    free(bytes);
    free(stream_text);
    free(image_part);
    return check_done();
}
