/* `mllama worker` end to end, as separate processes: `mllama mock-kafka`, a
 * real redis-server, workers on the micro model, and kcat as a client that
 * shares no code with the worker.
 *
 * - A request produced by kcat, with an inline JPEG, is answered on the
 *   reply topic, read back by kcat: seq 0..n contiguous, attempt 1, one
 *   final record (length or stop) with usage.images 1.
 * - The same image again, inline and by {"type":"image","sha256"}, is served
 *   from the resident cache (usage.images_cached 1), and Redis indexes it
 *   under its key in the default tenant's cache partition
 *   (<prefix>:img:<key>), never under the bare content digest.
 * - stream: false gives a single chat.completion record.
 * - n = 3 streamed with a seed: records carry index 0..2, each choice its
 *   role and finish_reason, the final record no choice and the usage with
 *   the prompt once; choice i is the answer of n = 1 with seed + i;
 *   stream: false with n = 2 is one completion of both, in JSON mode each
 *   choice a JSON object; n 9 is refused; a cancel ends every choice of a
 *   running n = 3 request.
 * - logit_bias: +100 on one token makes a sampled answer that token only;
 *   an id without a logit (<|image|>) is invalid_request, naming it.
 * - Tools: tool_choice "required" gives a well-formed call whose arguments
 *   validate against the function's schema for every seed (checked here
 *   with cJSON, not by the grammar), the streamed delta.tool_calls put
 *   together equal the stream: false message's call, finish_reason
 *   tool_calls; a named function is the one called; "auto" gives prose or
 *   a valid call; tools with an image are invalid_request.
 * - A two-turn chat (an image and instructions, then the answer and another
 *   question) keyed by its conversation id: both
 *   records land on one partition, and the second turn's usage says the
 *   first turn's full K/V blocks came from the prefix cache (metrics too).
 * - A cancel record (key = id) on mllama.cancel stops a long request
 *   (finish_reason cancelled), also for an id of the longest length the
 *   parser accepts; and stops requests it reaches before they reach the
 *   runtime (Redis paused: one waits in prep, one queued behind it), which
 *   end cancelled with nothing but their final record.
 * - The same id sent again while it runs: the retry is a higher attempt,
 *   the first ends cancelled before the retry's first record.
 * - A request naming an adapter this worker does not serve: unknown_adapter.
 * - Consumer-lag series: one per assigned partition; the partitions a
 *   rebalance takes away lose theirs.
 * - Two workers in one group share 20 requests (both answer some); a third
 *   joining mid-burst rebalances without losing any of 30. Every request is
 *   answered exactly once per attempt, seqs contiguous.
 * - Every worker drains on SIGTERM with exit code 0 and, in a sanitizer
 *   build, without a sanitizer report.
 * Skipped (77) without redis-server or kcat. */
#include "proc_util.h"

#include "engine.h"
#include "util.h"

#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define TOPICS PU_REQUESTS ":4," PU_REPLIES ":4," PU_DLT ":1," PU_CANCEL ":1"
#define ANSWER_MS 30000      /* one request answered, from produce to final record */
#define BURST_MS 90000       /* a burst of requests answered */
#define JOIN_MS 30000        /* a worker taking part in the group */
#define SHARE_REQUESTS 20
#define BURST_REQUESTS 30
#define BURST_GAP_MS 250     /* the burst outlasts the join (about 4 s) */
#define BURST_JOIN_AT 5      /* the third worker starts after this many requests */
#define LONG_TOKENS 4096
#define CANCEL_AFTER_CHUNKS 3
#define CANCEL_TRIES 3
#define ID_MAX 32
#define LONG_ID_BYTES 256    /* the parser's longest id (protocol.h SVC_ID_MAX_BYTES) */
#define PAUSE_MS 3000        /* Redis paused: requests wait in prep meanwhile */
#define REDIS_TIMEOUT "10000" /* redis.timeout_ms: outlasts the pause */
#define REDIS_CALL_MS 1000   /* redis.call_timeout_ms (the default): a call's deadline */
#define STATS_MS "500"       /* statistics.interval.ms: the lag series */
#define LAG_MS 10000         /* lag series following a rebalance */
#define PARTITIONS 4
#define RETRY_TOKENS 8
#define HEARTBEAT_WAIT_MS 15000 /* three heartbeats (redis.heartbeat_s 5) */
#define QUEUED_TOKENS 64     /* what a request cancelled before running would stream */

static pu_stack st;
static const char *const worker_names[] = {"w1", "w2", "w3"};
static pu_client client;
static uint8_t *image;
static size_t image_len;
static char image_sha[ML_SHA256_HEX_SIZE];

static bool start_worker(int i)
{
    static const char *const extra[] = {"redis.timeout_ms=" REDIS_TIMEOUT,
                                        "kafka.statistics.interval.ms=" STATS_MS, NULL};
    return pu_worker_start(&st.workers[i], &st.env, worker_names[i], extra);
}

/* Requests finished by a worker, from its /metrics. */
static double finished(int i)
{
    return pu_metric(pu_worker_http_port(&st.workers[i]), "mllama_requests_total");
}

/* ---- kcat ----------------------------------------------------------------------- */

/* Produce `body` keyed `key` to topic with kcat (from a file: an inline image
 * is too long for a command line). */
static bool kcat_produce(const char *topic, const char *key, const char *body)
{
    char file[PU_PATH_MAX + 32], cmd[2 * PU_PATH_MAX + 256];
    snprintf(file, sizeof file, "%s/%s.json", st.dir, key);
    if (!pu_write_file(file, body, strlen(body)))
        return false;
    snprintf(cmd, sizeof cmd, "kcat -b %s -P -t %s -k %s -l %s 2>&1", st.brokers, topic, key, file);
    int code = -1;
    char *out = pu_shell(cmd, &code);
    if (code != 0)
        fprintf(stderr, "kcat produce: exit %d: %s\n", code, out ? out : "");
    free(out);
    return code == 0;
}

/* kcat's view of one request's stream: it reads the reply topic from the
 * beginning to its end and prints key, headers and value per record. */
static void check_kcat_stream(const char *id)
{
    char cmd[PU_PATH_MAX + 256];
    snprintf(cmd, sizeof cmd,
             "kcat -b %s -C -t " PU_REPLIES " -f '%%k\\t%%h\\t%%s\\n' -e -o beginning -q",
             st.brokers);
    int code = -1;
    char *out = pu_shell(cmd, &code);
    check(out && code == 0, "kcat consume: exit %d", code);
    int next_seq = 0, finals = 0, records = 0;
    const char *reason = NULL;
    double images = -1;
    cJSON *last = NULL;
    for (char *line = out, *end; line && *line; line = end ? end + 1 : NULL) {
        end = strchr(line, '\n');
        if (end)
            *end = '\0';
        char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
        if (!tab2 || (size_t)(tab1 - line) != strlen(id) || strncmp(line, id, strlen(id)))
            continue;
        *tab1 = *tab2 = '\0';
        const char *headers = tab1 + 1, *value = tab2 + 1;
        records++;
        char want[64];
        snprintf(want, sizeof want, "seq=%d", next_seq);
        check(strstr(headers, want) != NULL, "kcat: %s: headers '%s' lack %s", id, headers, want);
        check(strstr(headers, "attempt=1") != NULL, "kcat: %s: headers '%s'", id, headers);
        check(finals == 0, "kcat: %s: a record after the final one", id);
        cJSON *j = cJSON_Parse(value);
        check(j && pu_json_num(j, PU_PATH("seq")) == next_seq, "kcat: %s: value seq", id);
        check(j && pu_json_num(j, PU_PATH("attempt")) == 1, "kcat: %s: value attempt", id);
        if (strstr(headers, "final=true")) {
            finals++;
            cJSON_Delete(last);
            last = j;
            j = NULL;
            reason = pu_finish_reason(last);
            images = pu_json_num(last, PU_PATH("usage", "images"));
        }
        cJSON_Delete(j);
        next_seq++;
    }
    check(records >= 2, "kcat: %s: %d records", id, records);
    check(finals == 1, "kcat: %s: %d final records", id, finals);
    check(reason && (!strcmp(reason, "length") || !strcmp(reason, "stop")),
          "kcat: %s: finish_reason %s", id, reason ? reason : "(none)");
    check(images == 1, "kcat: %s: usage.images %g", id, images);
    fprintf(stderr, "kcat: %s: %d records, finish_reason %s\n", id, records,
            reason ? reason : "(none)");
    cJSON_Delete(last);
    free(out);
}

/* ---- one worker ----------------------------------------------------------------- */

/* Send a request through the client and return its final record, parsed
 * (NULL after a check failure). */
static cJSON *ask(const char *id, const char *body)
{
    check(pu_client_send(&client, id, body), "%s: produce", id);
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    check(f != NULL, "%s: no final record within %d ms", id, ANSWER_MS);
    pu_check_stream(&client, id);
    return f ? pu_json(f) : NULL;
}

static void test_kcat_request(void)
{
    char *part = pu_image_part(image, image_len);
    char *body = pu_chat_request("e2e-kcat", "Describe this image.", part, "\"max_tokens\":12");
    check(kcat_produce(PU_REQUESTS, "e2e-kcat", body), "kcat produce");
    const pu_record *f = pu_client_wait(&client, "e2e-kcat", ANSWER_MS);
    check(f != NULL, "e2e-kcat: no final record");
    check_kcat_stream("e2e-kcat");
    free(body);
    free(part);
}

static void test_resident_image(void)
{
    /* The first request made the image resident; the index thread publishes
     * it to Redis. */
    char key[128], partitioned[ML_SHA256_HEX_SIZE];
    pu_image_key("default", image_sha, partitioned);
    snprintf(key, sizeof key, "mllama:img:%s", partitioned);
    check(pu_redis_wait_exists(&st.redis, key, ANSWER_MS), "Redis lacks %s", key);
    snprintf(key, sizeof key, "mllama:img:%s", image_sha);
    check(pu_redis_exists(&st.redis, key) == 0, "Redis indexes the bare content digest %s", key);

    char *part = pu_image_part(image, image_len);
    char *body = pu_chat_request("e2e-inline-again", "And now?", part, "\"max_tokens\":4");
    cJSON *j = ask("e2e-inline-again", body);
    check(pu_json_num(j, PU_PATH("usage", "images")) == 1, "inline again: images");
    check(pu_json_num(j, PU_PATH("usage", "images_cached")) == 1, "inline again: not cached");
    check(pu_metric(pu_worker_http_port(&st.workers[0]), "mllama_image_decodes_skipped_total") == 1,
          "inline again: the worker decoded an image it held");
    cJSON_Delete(j);
    free(body);
    free(part);

    char ref[160];
    snprintf(ref, sizeof ref, "{\"type\":\"image\",\"sha256\":\"%s\"}", image_sha);
    body = pu_chat_request("e2e-by-sha", "And by reference?", ref, "\"max_tokens\":4");
    j = ask("e2e-by-sha", body);
    const char *reason = pu_finish_reason(j);
    check(reason && strcmp(reason, "error"), "by sha256: finish_reason %s, error %s",
          reason ? reason : "(none)", pu_error_code(j) ? pu_error_code(j) : "-");
    check(pu_json_num(j, PU_PATH("usage", "images_cached")) == 1, "by sha256: not cached");
    cJSON_Delete(j);
    free(body);
}

static void test_not_streamed(void)
{
    char *body = pu_chat_request("e2e-batch", "Say something.", NULL,
                                 "\"max_tokens\":6,\"stream\":false");
    cJSON *j = ask("e2e-batch", body);
    const pu_record *recs[4];
    size_t n = pu_client_replies(&client, "e2e-batch", recs, 4);
    check(n == 1, "stream false: %zu records", n);
    check(n >= 1 && recs[0]->final && recs[0]->seq == 0, "stream false: not one final seq 0");
    const char *object = pu_json_str(j, PU_PATH("object"));
    check(object && !strcmp(object, "chat.completion"), "stream false: object %s",
          object ? object : "(none)");
    check(pu_json_str(j, PU_PATH("choices", "0", "message", "content")) != NULL,
          "stream false: no message.content");
    check(pu_json_num(j, PU_PATH("usage", "completion_tokens")) >= 1, "stream false: usage");
    cJSON_Delete(j);
    free(body);

    /* Logprobs: one entry per token streamed (a stop token is not), each
     * with its alternatives. */
    body = pu_chat_request("e2e-batch-lp", "Say something.", NULL,
                           "\"max_tokens\":6,\"stream\":false,\"temperature\":0.8,\"seed\":7,"
                           "\"logprobs\":true,\"top_logprobs\":2");
    j = ask("e2e-batch-lp", body);
    const char *reason = pu_finish_reason(j);
    double tokens = pu_json_num(j, PU_PATH("usage", "completion_tokens"));
    const cJSON *content = pu_json_at(j, PU_PATH("choices", "0", "logprobs", "content"));
    int n_lp = cJSON_IsArray(content) ? cJSON_GetArraySize(content) : -1;
    check(reason && n_lp == (int)tokens - !strcmp(reason, "stop"),
          "stream false: %d logprobs entries for %g tokens (finish %s)", n_lp, tokens,
          reason ? reason : "(none)");
    for (int i = 0; i < n_lp; i++) {
        const cJSON *e = cJSON_GetArrayItem(content, i);
        const cJSON *lp = cJSON_GetObjectItem(e, "logprob");
        const cJSON *top = cJSON_GetObjectItem(e, "top_logprobs");
        check(cJSON_IsNumber(lp) && lp->valuedouble <= 0 && cJSON_IsString(
                  cJSON_GetObjectItem(e, "token")) && cJSON_GetArraySize(top) == 2,
              "stream false: logprobs entry %d", i);
    }
    cJSON_Delete(j);
    free(body);

    /* JSON mode: the answer is (a prefix of, when cut by max_tokens) one
     * JSON object, and stop means it is complete. */
    body = pu_chat_request("e2e-json", "Give me a JSON object.", NULL,
                           "\"max_tokens\":48,\"stream\":false,\"seed\":3,"
                           "\"response_format\":{\"type\":\"json_object\"}");
    j = ask("e2e-json", body);
    reason = pu_finish_reason(j);
    const char *text = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
    const char *start = text ? text + strspn(text, " \t\r\n") : NULL;
    check(start && *start == '{' && reason && (!strcmp(reason, "stop") || !strcmp(reason, "length")),
          "json mode: finish %s, content '%.80s'", reason ? reason : "(none)", text ? text : "");
    if (reason && !strcmp(reason, "stop")) {
        cJSON *doc = cJSON_Parse(text);
        check(cJSON_IsObject(doc), "json mode: stopped on '%s', not one JSON object", text);
        cJSON_Delete(doc);
    }
    cJSON_Delete(j);
    free(body);
}

/* ---- n choices ------------------------------------------------------------------ */

#define CHOICES 3
#define CHOICE_SEED 11
#define CHOICE_TEXT_MAX 4096
#define FINISH_MAX 16

typedef struct streamed_choice {
    char text[CHOICE_TEXT_MAX];
    char finish[FINISH_MAX];    /* "" until its last record */
    int records;
} streamed_choice;

/* The streamed records of `id` (n choices): every record but the final one
 * carries one choice (index < n), the first of each choice its role, its
 * last (only) its finish_reason; the final record carries no choice.
 * Each choice's text put together into c[i]; returns the final record
 * (parsed, the caller's), NULL after a check failure. */
static cJSON *collect_choices(const char *id, int n, streamed_choice *c)
{
    size_t n_recs = pu_client_replies(&client, id, NULL, 0);
    const pu_record **recs = malloc((n_recs + 1) * sizeof *recs);
    if (!recs)
        pu_die("out of memory");
    n_recs = pu_client_replies(&client, id, recs, n_recs);
    memset(c, 0, (size_t)n * sizeof *c);
    cJSON *final = NULL;
    for (size_t r = 0; r < n_recs; r++) {
        cJSON *j = pu_json(recs[r]);
        const cJSON *choices = pu_json_at(j, PU_PATH("choices"));
        if (recs[r]->final) {
            check(cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 0,
                  "%s: the final record carries no choice: %s", id, recs[r]->value);
            cJSON_Delete(final);
            final = j;
            continue;
        }
        double index = pu_json_num(j, PU_PATH("choices", "0", "index"));
        int i = (int)index;
        bool valid = cJSON_GetArraySize(choices) == 1 && index >= 0 && index < n && i == index;
        check(valid, "%s: one choice of index < %d per chunk: %s", id, n, recs[r]->value);
        if (valid) {
            const char *role = pu_json_str(j, PU_PATH("choices", "0", "delta", "role"));
            const char *content = pu_json_str(j, PU_PATH("choices", "0", "delta", "content"));
            const char *finish = pu_finish_reason(j);
            check((c[i].records == 0) == (role != NULL), "%s: choice %d, record %d: role %s",
                  id, i, c[i].records, role ? role : "(none)");
            check(!c[i].finish[0], "%s: choice %d: a record after its finish_reason", id, i);
            if (content)
                strncat(c[i].text, content, CHOICE_TEXT_MAX - strlen(c[i].text) - 1);
            if (finish)
                snprintf(c[i].finish, FINISH_MAX, "%s", finish);
            c[i].records++;
        }
        cJSON_Delete(j);
    }
    free(recs);
    for (int i = 0; i < n; i++)
        check(c[i].finish[0], "%s: choice %d: %d records, no finish_reason", id, i,
              c[i].records);
    check(final != NULL, "%s: no final record", id);
    return final;
}

/* A stream: false request with n = 1 and the seed (the choice it stands
 * for): its answer, owned, and its finish in finish (FINISH_MAX). */
static char *answer_alone(const char *id, int64_t seed, char *finish)
{
    char opts[160];
    snprintf(opts, sizeof opts,
             "\"max_tokens\":8,\"stream\":false,\"temperature\":1,\"seed\":%lld",
             (long long)seed);
    char *body = pu_chat_request(id, "Say something.", NULL, opts);
    cJSON *j = ask(id, body);
    const char *text = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
    const char *reason = pu_finish_reason(j);
    snprintf(finish, FINISH_MAX, "%s", reason ? reason : "");
    char *out = strdup(text ? text : "");
    cJSON_Delete(j);
    free(body);
    return out;
}

/* n = 3 streamed with a seed: records carry index 0..2, each choice its
 * role, text and finish_reason, the final the usage with the prompt once;
 * choice i is the answer of n = 1 with seed + i. stream: false with n = 2:
 * one completion of both choices. n over limits.max_n: invalid_request. */
static void test_choices(void)
{
    int port = pu_worker_http_port(&st.workers[0]);
    double forked = pu_metric(port, "mllama_choices_forked_total");
    char opts[160];
    snprintf(opts, sizeof opts,
             "\"max_tokens\":8,\"temperature\":1,\"seed\":%d,\"n\":%d", CHOICE_SEED,
             CHOICES);
    char *body = pu_chat_request("e2e-n3", "Say something.", NULL, opts);
    check(pu_client_send(&client, "e2e-n3", body), "n 3: produce");
    check(pu_client_wait(&client, "e2e-n3", ANSWER_MS) != NULL, "n 3: no final record");
    pu_check_stream(&client, "e2e-n3");
    streamed_choice c[CHOICES];
    cJSON *final = collect_choices("e2e-n3", CHOICES, c);
    double completion = 0;
    double prompt = pu_json_num(final, PU_PATH("usage", "prompt_tokens"));
    for (int i = 0; i < CHOICES; i++) {
        char id[ID_MAX], finish[FINISH_MAX];
        snprintf(id, sizeof id, "e2e-n1-seed%d", CHOICE_SEED + i);
        char *want = answer_alone(id, CHOICE_SEED + i, finish);
        check(!strcmp(c[i].text, want) && !strcmp(c[i].finish, finish),
              "n 3: choice %d ('%s', %s) is n = 1 with seed %d ('%s', %s)", i, c[i].text,
              c[i].finish, CHOICE_SEED + i, want, finish);
        const pu_record *f = pu_client_final(&client, id);
        cJSON *alone = f ? pu_json(f) : NULL;
        completion += pu_json_num(alone, PU_PATH("usage", "completion_tokens"));
        check(pu_json_num(alone, PU_PATH("usage", "prompt_tokens")) == prompt,
              "n 3: the prompt counted once (%g tokens)", prompt);
        cJSON_Delete(alone);
        free(want);
    }
    check(pu_json_num(final, PU_PATH("usage", "completion_tokens")) == completion,
          "n 3: completion tokens %g, the sum over the choices %g",
          pu_json_num(final, PU_PATH("usage", "completion_tokens")), completion);
    check(pu_json_num(final, PU_PATH("timings", "queue_ms")) >= 0, "n 3: timings");
    check(pu_metric(port, "mllama_choices_forked_total") == forked + CHOICES - 1,
          "n 3: %g choices forked, want %d more than %g",
          pu_metric(port, "mllama_choices_forked_total"), CHOICES - 1, forked);
    cJSON_Delete(final);
    free(body);

    /* stream: false: one record, both choices. */
    snprintf(opts, sizeof opts,
             "\"max_tokens\":8,\"stream\":false,\"temperature\":1,\"seed\":%d,\"n\":2",
             CHOICE_SEED);
    body = pu_chat_request("e2e-n2-batch", "Say something.", NULL, opts);
    cJSON *j = ask("e2e-n2-batch", body);
    const pu_record *recs[4];
    check(pu_client_replies(&client, "e2e-n2-batch", recs, 4) == 1, "n 2, stream false: one record");
    check(cJSON_GetArraySize(pu_json_at(j, PU_PATH("choices"))) == 2, "n 2, stream false: 2 choices");
    for (int i = 0; i < 2; i++) {
        char index[4], id[ID_MAX];
        snprintf(index, sizeof index, "%d", i);
        snprintf(id, sizeof id, "e2e-n1-seed%d", CHOICE_SEED + i);
        const char *text = pu_json_str(j, PU_PATH("choices", index, "message", "content"));
        const pu_record *af = pu_client_final(&client, id);
        cJSON *alone = af ? pu_json(af) : NULL;
        const char *want = pu_json_str(alone, PU_PATH("choices", "0", "message", "content"));
        check(text && want && !strcmp(text, want) &&
                  pu_json_num(j, PU_PATH("choices", index, "index")) == i,
              "n 2, stream false: choice %d '%s' is n = 1 with seed %d '%s'", i,
              text ? text : "(none)", CHOICE_SEED + i, want ? want : "(none)");
        cJSON_Delete(alone);
    }
    cJSON_Delete(j);
    free(body);

    /* JSON mode: each choice its own document, a JSON object when it stopped. */
    body = pu_chat_request("e2e-n2-json", "Give me a JSON object.", NULL,
                           "\"max_tokens\":48,\"stream\":false,\"seed\":3,\"n\":2,"
                           "\"response_format\":{\"type\":\"json_object\"}");
    j = ask("e2e-n2-json", body);
    for (int i = 0; i < 2; i++) {
        char index[4];
        snprintf(index, sizeof index, "%d", i);
        const char *text = pu_json_str(j, PU_PATH("choices", index, "message", "content"));
        const char *reason = pu_json_str(j, PU_PATH("choices", index, "finish_reason"));
        const char *start = text ? text + strspn(text, " \t\r\n") : NULL;
        check(start && *start == '{' && reason &&
                  (!strcmp(reason, "stop") || !strcmp(reason, "length")),
              "n 2, json mode: choice %d: finish %s, content '%.80s'", i,
              reason ? reason : "(none)", text ? text : "");
        cJSON *doc = reason && !strcmp(reason, "stop") ? cJSON_Parse(text) : NULL;
        check(!reason || strcmp(reason, "stop") || cJSON_IsObject(doc),
              "n 2, json mode: choice %d stopped on '%s', not one JSON object", i,
              text ? text : "");
        cJSON_Delete(doc);
    }
    cJSON_Delete(j);
    free(body);

    body = pu_chat_request("e2e-n9", "Say something.", NULL, "\"n\":9");
    j = ask("e2e-n9", body);
    const char *code = pu_error_code(j);
    const char *msg = pu_json_str(j, PU_PATH("error", "message"));
    check(code && !strcmp(code, "invalid_request") && msg && strstr(msg, "n: 9"),
          "n 9: %s (%s)", code ? code : "(none)", msg ? msg : "");
    cJSON_Delete(j);
    free(body);
}

/* The request's logit_bias reaches the sample op: +100 on "!" (Llama 3's
 * id 0) outweighs the micro model's logits at every step of a sampled
 * answer, and the parser refuses <|image|> with the worker's vocabulary. */
static void test_logit_bias(void)
{
    char *body = pu_chat_request("e2e-bias", "Say something.", NULL,
                                 "\"max_tokens\":5,\"stream\":false,\"temperature\":1,"
                                 "\"seed\":11,\"logit_bias\":{\"0\":100}");
    cJSON *j = ask("e2e-bias", body);
    const char *reason = pu_finish_reason(j);
    const char *text = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
    check(text && !strcmp(text, "!!!!!") && reason && !strcmp(reason, "length"),
          "logit_bias +100: content '%s', finish %s", text ? text : "(none)",
          reason ? reason : "(none)");
    cJSON_Delete(j);
    free(body);

    body = pu_chat_request("e2e-bias-image", "Say something.", NULL,
                           "\"max_tokens\":5,\"logit_bias\":{\"128256\":-100}");
    j = ask("e2e-bias-image", body);
    const char *code = pu_error_code(j);
    const char *message = pu_json_str(j, PU_PATH("error", "message"));
    check(code && !strcmp(code, "invalid_request") && message &&
              strstr(message, "logit_bias: token id 128256 is outside"),
          "logit_bias on <|image|>: error %s, '%s'", code ? code : "(none)",
          message ? message : "(none)");
    cJSON_Delete(j);
    free(body);
}

/* ---- tools ------------------------------------------------------------------- */

#define TOOL_SEEDS 8
#define TOOL_TOKENS 96      /* a call of WEATHER_TOOL is under 40 tokens */
#define DAYS_MAX 7
#define WEATHER_TOOL                                                                             \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"             \
    "\"The forecast\",\"parameters\":{\"type\":\"object\",\"properties\":{\"place\":"          \
    "{\"type\":\"string\",\"enum\":[\"Paris\",\"Oslo\"]},\"days\":{\"type\":\"integer\","       \
    "\"minimum\":1,\"maximum\":7}},\"required\":[\"place\",\"days\"],"                           \
    "\"additionalProperties\":false}}}"
#define CLOCK_TOOL "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}"

/* arguments: a JSON object valid under `name`'s parameters schema (above),
 * checked by hand. */
static bool valid_arguments(const char *name, const char *arguments)
{
    cJSON *doc = arguments ? cJSON_Parse(arguments) : NULL;
    bool ok = cJSON_IsObject(doc);
    if (ok && !strcmp(name, "now")) {
        ok = doc->child == NULL;
    } else if (ok) {
        const cJSON *place = cJSON_GetObjectItemCaseSensitive(doc, "place");
        const cJSON *days = cJSON_GetObjectItemCaseSensitive(doc, "days");
        ok = cJSON_GetArraySize(doc) == 2 && cJSON_IsString(place) &&
             (!strcmp(place->valuestring, "Paris") || !strcmp(place->valuestring, "Oslo")) &&
             cJSON_IsNumber(days) && days->valuedouble == (int)days->valuedouble &&
             days->valuedouble >= 1 && days->valuedouble <= DAYS_MAX;
    }
    cJSON_Delete(doc);
    return ok;
}

/* The call streamed for request `id`: its delta.tool_calls put together
 * (name into name, arguments into args), and the text content. */
static void streamed_call(const char *id, char *name, size_t name_cap, svc_buf *args,
                          svc_buf *content)
{
    const pu_record *recs[TOOL_TOKENS + 2];
    size_t n = pu_client_replies(&client, id, recs, TOOL_TOKENS + 2);
    name[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        cJSON *j = pu_json(recs[i]);
        const char *fn = pu_json_str(j, PU_PATH("choices", "0", "delta", "tool_calls", "0",
                                                "function", "name"));
        const char *a = pu_json_str(j, PU_PATH("choices", "0", "delta", "tool_calls", "0",
                                               "function", "arguments"));
        const char *c = pu_json_str(j, PU_PATH("choices", "0", "delta", "content"));
        if (fn)
            snprintf(name, name_cap, "%s", fn);
        if (a)
            svc_buf_printf(args, "%s", a);
        if (c)
            svc_buf_printf(content, "%s", c);
        cJSON_Delete(j);
    }
}

/* Llama 3's id of "{": biased up, an "auto" answer begins a call (random
 * weights alone almost always begin prose). */
#define BRACE_BIAS ",\"logit_bias\":{\"90\":100}"

static char *tool_request(const char *id, const char *tools, const char *choice, int seed,
                          bool stream, const char *more)
{
    char extra[2048];
    snprintf(extra, sizeof extra,
             "\"max_tokens\":%d,\"temperature\":1,\"seed\":%d,\"stream\":%s,\"tools\":[%s]%s%s%s",
             TOOL_TOKENS, seed, stream ? "true" : "false", tools, choice ? ",\"tool_choice\":" : "",
             choice ? choice : "", more);
    return pu_chat_request(id, "What is the weather in Oslo this week?", NULL, extra);
}

static void test_tools(void)
{
    for (int seed = 0; seed < TOOL_SEEDS; seed++) {
        char id[ID_MAX], batch_id[ID_MAX];
        snprintf(id, sizeof id, "e2e-tool-%d", seed);
        snprintf(batch_id, sizeof batch_id, "e2e-tool-b%d", seed);
        const char *choice = seed % 2 ? "{\"type\":\"function\",\"function\":{\"name\":"
                                        "\"get_weather\"}}"
                                      : "\"required\"";
        char *body = tool_request(id, WEATHER_TOOL "," CLOCK_TOOL, choice, seed, true, "");
        cJSON *j = ask(id, body);
        free(body);
        char name[80];
        svc_buf args = {0}, content = {0};
        streamed_call(id, name, sizeof name, &args, &content);
        const char *reason = pu_finish_reason(j);
        bool named = !strcmp(name, "get_weather") || (!(seed % 2) && !strcmp(name, "now"));
        check(reason && !strcmp(reason, "tool_calls") && named &&
                  valid_arguments(name, args.data) && !content.len,
              "%s (%s): finish %s, call %s(%s), content '%s'", id, choice,
              reason ? reason : "(none)", name, args.data ? args.data : "",
              content.data ? content.data : "");
        cJSON_Delete(j);

        /* The same request, not streamed: the same call in the message. */
        body = tool_request(batch_id, WEATHER_TOOL "," CLOCK_TOOL, choice, seed, false, "");
        j = ask(batch_id, body);
        free(body);
        const char *fn = pu_json_str(j, PU_PATH("choices", "0", "message", "tool_calls", "0",
                                                "function", "name"));
        const char *a = pu_json_str(j, PU_PATH("choices", "0", "message", "tool_calls", "0",
                                               "function", "arguments"));
        const char *call_id = pu_json_str(j, PU_PATH("choices", "0", "message", "tool_calls",
                                                     "0", "id"));
        const cJSON *msg_content = pu_json_at(j, PU_PATH("choices", "0", "message", "content"));
        check(fn && !strcmp(fn, name) && a && args.data && !strcmp(a, args.data) &&
                  cJSON_IsNull(msg_content) && call_id && !strncmp(call_id, "call_", 5),
              "%s: the message's call %s(%s) is the streamed %s(%s)", batch_id, fn ? fn : "-",
              a ? a : "-", name, args.data ? args.data : "");
        cJSON_Delete(j);
        svc_buf_deinit(&args);
        svc_buf_deinit(&content);
    }

    /* auto: prose, or a call that validates; with "{" biased up, a call. */
    int calls = 0;
    for (int seed = 0; seed < TOOL_SEEDS; seed++) {
        char id[ID_MAX];
        snprintf(id, sizeof id, "e2e-tool-auto-%d", seed);
        char *body = tool_request(id, WEATHER_TOOL, NULL, seed, true, seed % 2 ? BRACE_BIAS : "");
        cJSON *j = ask(id, body);
        free(body);
        char name[80];
        svc_buf args = {0}, content = {0};
        streamed_call(id, name, sizeof name, &args, &content);
        const char *reason = pu_finish_reason(j);
        bool call = name[0] != '\0';
        calls += call;
        check(reason && (call || seed % 2 == 0) &&
                  (call ? !strcmp(reason, "tool_calls") && valid_arguments(name, args.data)
                        : content.len > 0 && strcmp(reason, "error") != 0),
              "%s: finish %s, call '%s'(%s), content '%.40s'", id, reason ? reason : "(none)",
              name, args.data ? args.data : "", content.data ? content.data : "");
        cJSON_Delete(j);
        svc_buf_deinit(&args);
        svc_buf_deinit(&content);
    }
    fprintf(stderr, "tool_choice auto: %d of %d answers were calls\n", calls, TOOL_SEEDS);

    /* n choices with tools: each its own valid call and id; choice i is the
     * call of n = 1 with seed + i. */
    char *nbody = tool_request("e2e-tool-n", WEATHER_TOOL, "\"required\"", 20, false, ",\"n\":2");
    cJSON *nj = ask("e2e-tool-n", nbody);
    free(nbody);
    const char *ids[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        char idx[4], one_id[ID_MAX];
        snprintf(idx, sizeof idx, "%d", i);
        snprintf(one_id, sizeof one_id, "e2e-tool-n1-%d", i);
        const char *a = pu_json_str(nj, PU_PATH("choices", idx, "message", "tool_calls", "0",
                                                "function", "arguments"));
        const char *reason = pu_json_str(nj, PU_PATH("choices", idx, "finish_reason"));
        ids[i] = pu_json_str(nj, PU_PATH("choices", idx, "message", "tool_calls", "0", "id"));
        char *one_body = tool_request(one_id, WEATHER_TOOL, "\"required\"", 20 + i, false, "");
        cJSON *one = ask(one_id, one_body);
        free(one_body);
        const char *one_a = pu_json_str(one, PU_PATH("choices", "0", "message", "tool_calls", "0",
                                                     "function", "arguments"));
        check(reason && !strcmp(reason, "tool_calls") && valid_arguments("get_weather", a) &&
                  one_a && !strcmp(a, one_a),
              "n 2, choice %d: finish %s, call (%s), n 1 with seed + %d: (%s)", i,
              reason ? reason : "(none)", a ? a : "", i, one_a ? one_a : "");
        cJSON_Delete(one);
    }
    check(ids[0] && ids[1] && strcmp(ids[0], ids[1]) != 0, "n 2: each choice's call its own id");
    cJSON_Delete(nj);

    /* The tools are in the prompt unless tool_choice is "none". */
    char *body = tool_request("e2e-tool-none", WEATHER_TOOL, "\"none\"", 0, false, "");
    cJSON *none = ask("e2e-tool-none", body);
    free(body);
    body = tool_request("e2e-tool-prompt", WEATHER_TOOL, "\"required\"", 0, false, "");
    cJSON *with = ask("e2e-tool-prompt", body);
    free(body);
    double without_tools = pu_json_num(none, PU_PATH("usage", "prompt_tokens"));
    double with_tools = pu_json_num(with, PU_PATH("usage", "prompt_tokens"));
    const char *none_content = pu_json_str(none, PU_PATH("choices", "0", "message", "content"));
    check(with_tools > without_tools + 40 && none_content &&
              !pu_json_at(none, PU_PATH("choices", "0", "message", "tool_calls")),
          "prompt tokens: %g with the tool rendered, %g with tool_choice none (a text answer)",
          with_tools, without_tools);
    cJSON_Delete(none);
    cJSON_Delete(with);

    char *part = pu_image_part(image, image_len);
    char extra[1024];
    snprintf(extra, sizeof extra, "\"max_tokens\":4,\"tools\":[%s]", WEATHER_TOOL);
    body = pu_chat_request("e2e-tool-image", "Weather here?", part, extra);
    cJSON *j = ask("e2e-tool-image", body);
    const char *code = pu_error_code(j);
    const char *message = pu_json_str(j, PU_PATH("error", "message"));
    check(code && !strcmp(code, "invalid_request") && message &&
              strstr(message, "tool calling does not work with images"),
          "tools and an image: error %s, '%s'", code ? code : "(none)", message ? message : "");
    cJSON_Delete(j);
    free(body);
    free(part);
}

/* One turn of the conversation: the user's image and instructions, then
 * for turn 2 the first answer and a second question. The body as JSON text
 * (owned). */
static char *conversation_turn(const char *id, const char *answer)
{
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "id", id);
    cJSON_AddStringToObject(req, "reply_topic", PU_REPLIES);
    cJSON_AddNumberToObject(req, "max_tokens", 8);
    cJSON_AddNumberToObject(req, "temperature", 0);
    cJSON_AddBoolToObject(req, "stream", 0);
    cJSON *msgs = cJSON_AddArrayToObject(req, "messages");
    cJSON *user = cJSON_CreateObject();
    cJSON_AddStringToObject(user, "role", "user");
    cJSON *content = cJSON_AddArrayToObject(user, "content");
    char *part = pu_image_part(image, image_len);
    cJSON_AddItemToArray(content, cJSON_Parse(part));
    free(part);
    cJSON *text = cJSON_CreateObject();
    cJSON_AddStringToObject(text, "type", "text");
    /* Long enough for a few full blocks (the template refuses a system
     * message beside an image). */
    cJSON_AddStringToObject(text, "text",
                            "You describe photographs for people who cannot see them: name the "
                            "objects, their colours and where they are, and say nothing you "
                            "cannot see. What is in this picture?");
    cJSON_AddItemToArray(content, text);
    cJSON_AddItemToArray(msgs, user);
    if (answer) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", answer);
        cJSON_AddItemToArray(msgs, a);
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "role", "user");
        cJSON_AddStringToObject(q, "content", "And which colours stand out?");
        cJSON_AddItemToArray(msgs, q);
    }
    char *s = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    if (!s)
        pu_die("out of memory");
    return s;
}

/* Send one turn keyed by the conversation and return its final record
 * (NULL after a check failure). */
static cJSON *ask_in_conversation(const char *conversation, const char *id, const char *body)
{
    check(pu_client_send_to(&client, PU_REQUESTS, -1, conversation, body, strlen(body), NULL, 0),
          "%s: produce", id);
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    check(f != NULL, "%s: no final record within %d ms", id, ANSWER_MS);
    return f ? pu_json(f) : NULL;
}

/* The request partition of each record keyed `key`, as kcat reads them; -1
 * when they are not all on one. Returns how many there are in *n. */
static int request_partition(const char *key, int *n)
{
    char cmd[PU_PATH_MAX + 256];
    snprintf(cmd, sizeof cmd,
             "kcat -b %s -C -t " PU_REQUESTS " -f '%%k\t%%p\n' -e -o beginning -q", st.brokers);
    int code = -1, partition = -2;
    char *out = pu_shell(cmd, &code);
    *n = 0;
    for (char *line = out, *end; code == 0 && line && *line; line = end ? end + 1 : NULL) {
        end = strchr(line, '\n');
        if (end)
            *end = '\0';
        char *tab = strchr(line, '\t');
        if (!tab || (size_t)(tab - line) != strlen(key) || strncmp(line, key, strlen(key)))
            continue;
        int p = atoi(tab + 1);
        partition = partition == -2 || partition == p ? p : -1;
        (*n)++;
    }
    free(out);
    return partition < 0 ? -1 : partition;
}

static void test_conversation(void)
{
    const char *conv = "e2e-conversation";
    const int block = ml_model_limits_default().kv_block_size;
    char *body = conversation_turn("e2e-turn-1", NULL);
    cJSON *t1 = ask_in_conversation(conv, "e2e-turn-1", body);
    free(body);
    const char *answer = pu_json_str(t1, PU_PATH("choices", "0", "message", "content"));
    double p1 = pu_json_num(t1, PU_PATH("usage", "prompt_tokens"));
    const char *why = pu_json_str(t1, PU_PATH("error", "message"));
    check(answer && p1 > block, "turn 1: answered (%g prompt tokens, error %s)", p1,
          why ? why : "-");
    body = conversation_turn("e2e-turn-2", answer ? answer : "");
    cJSON *t2 = ask_in_conversation(conv, "e2e-turn-2", body);
    free(body);
    /* Turn 2's prompt starts with all of turn 1's: at least its full blocks
     * were computed by turn 1 and are found. */
    double cached = pu_json_num(t2, PU_PATH("usage", "prompt_tokens_cached"));
    double want = (double)((int)p1 / block * block);
    check(cached >= want && cached < pu_json_num(t2, PU_PATH("usage", "prompt_tokens")),
          "turn 2: %g prompt tokens cached, want at least turn 1's %g full-block tokens",
          cached, want);
    fprintf(stderr, "conversation: turn 1 %g prompt tokens, ttft %.1f ms; turn 2 %g, %g cached, "
            "ttft %.1f ms\n", p1, pu_json_num(t1, PU_PATH("timings", "ttft_ms")),
            pu_json_num(t2, PU_PATH("usage", "prompt_tokens")), cached,
            pu_json_num(t2, PU_PATH("timings", "ttft_ms")));
    int port = pu_worker_http_port(&st.workers[0]);
    check(pu_metric(port, "mllama_prompt_tokens_cached_total") >= cached &&
              pu_metric(port, "mllama_prefix_cache_block_hits_total") >= cached / block,
          "conversation: the prefix-cache metrics count the hit");
    int n = 0;
    check(request_partition(conv, &n) >= 0 && n == 2,
          "conversation: its %d records on one partition", n);
    cJSON_Delete(t1);
    cJSON_Delete(t2);
}

/* Cancel a long request with `id` once it streams, the cancel produced by
 * kcat or by the client; expect finish_reason cancelled. */
/* A long request of n choices, cancelled once it streams: it ends
 * cancelled, every choice of it (n > 1: each choice's last chunk, then the
 * final record). */
static void cancel_running(const char *id, bool by_kcat, int n)
{
    char extra[192];
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"temperature\":0,\"n\":%d," PU_NO_STOP,
             LONG_TOKENS, n);
    char *body = pu_chat_request(id, "Count to a million.", NULL, extra);
    check(pu_client_send(&client, id, body), "cancel: produce");
    free(body);
    const pu_record *recs[CANCEL_AFTER_CHUNKS];
    int64_t deadline = pu_now_ms() + ANSWER_MS;
    while (pu_client_replies(&client, id, recs, 0) < CANCEL_AFTER_CHUNKS &&
           pu_now_ms() < deadline)
        pu_client_poll(&client, 20);
    check(pu_client_replies(&client, id, recs, 0) >= CANCEL_AFTER_CHUNKS, "cancel: no stream");
    /* A cancel consumer reads from the latest offset once it joined its own
     * group: a cancel sent before that is not seen, so a client repeats it. */
    const pu_record *f = NULL;
    for (int tries = 0; tries < CANCEL_TRIES && !f; tries++) {
        check(by_kcat ? kcat_produce(PU_CANCEL, id, "cancel")
                      : pu_client_send_to(&client, PU_CANCEL, -1, id, "cancel", 6, NULL, 0),
              "cancel: produce the cancel");
        f = pu_client_wait(&client, id, ANSWER_MS / CANCEL_TRIES);
    }
    cJSON *j = f ? pu_json(f) : NULL;
    if (n > 1) {
        streamed_choice c[CHOICES];
        cJSON_Delete(collect_choices(id, n, c));
        for (int i = 0; i < n; i++)
            check(!strcmp(c[i].finish, "cancelled"), "cancel %.40s: choice %d: finish_reason %s",
                  id, i, c[i].finish);
    } else {
        const char *reason = pu_finish_reason(j);
        check(reason && !strcmp(reason, "cancelled"), "cancel %.40s: finish_reason %s", id,
              reason ? reason : "(none)");
    }
    check(pu_json_num(j, PU_PATH("usage", "completion_tokens")) < n * LONG_TOKENS,
          "cancel: ran to the end");
    pu_check_stream(&client, id);
    cJSON_Delete(j);
}

static void test_cancel(void)
{
    cancel_running("e2e-cancel", true, 1);
    char id[LONG_ID_BYTES + 1];
    memset(id, 'L', LONG_ID_BYTES);
    memcpy(id, "e2e-long-id-", 12);
    id[LONG_ID_BYTES] = '\0';
    /* Too long for kcat's file name. */
    cancel_running(id, false, 1);
    cancel_running("e2e-cancel-n3", false, CHOICES);
}

/* When the worker's Redis calls made during test_cancel_before_running's
 * pause have ended (0 before it): their failures may have opened the
 * worker's Redis breaker, which a lookup that needs Redis then meets. */
static int64_t redis_calm_at;

/* Wait until the pause's calls are over and the worker's breaker is closed. */
static void await_redis(void)
{
    int64_t now = pu_now_ms();
    if (redis_calm_at > now)
        pu_sleep_ms((int)(redis_calm_at - now));
    int port = pu_worker_http_port(&st.workers[0]);
    double open = 1;
    for (int64_t deadline = pu_now_ms() + ANSWER_MS;
         (open = pu_metric(port, "mllama_redis_breaker_open")) != 0 && pu_now_ms() < deadline;)
        pu_sleep_ms(PU_POLL_MS);
    check(open == 0, "the worker's Redis breaker stays open after the pause");
}

/* Cancels sent right after their requests, while Redis is paused: the prep
 * thread waits on the first request's attempt counter and the second queues
 * behind it, so neither has reached the runtime when its cancel arrives.
 * Both end cancelled, with their final record only. (The cancel consumer
 * has joined: test_cancel saw its cancels.) An id sent again after its
 * cancel runs. */
static void test_cancel_before_running(void)
{
    static const char *const ids[] = {"e2e-cancel-in-prep", "e2e-cancel-queued"};
    enum { N = sizeof ids / sizeof ids[0] };
    int received = pu_file_count(st.workers[0].log, "\"cancel_received\"");
    char pause[16];
    snprintf(pause, sizeof pause, "%d", PAUSE_MS);
    redisReply *rep = pu_redis_cmd(&st.redis, "CLIENT PAUSE %s", pause);
    check(rep && rep->type == REDIS_REPLY_STATUS, "CLIENT PAUSE refused");
    freeReplyObject(rep);
    int64_t paused_at = pu_now_ms();
    redis_calm_at = paused_at + PAUSE_MS + REDIS_CALL_MS;
    char extra[64];
    snprintf(extra, sizeof extra, "\"max_tokens\":%d", QUEUED_TOKENS);
    for (int i = 0; i < N; i++) {
        char *body = pu_chat_request(ids[i], "Count to a million.", NULL, extra);
        check(pu_client_send(&client, ids[i], body), "%s: produce", ids[i]);
        free(body);
    }
    for (int i = 0; i < N; i++)
        check(pu_client_send_to(&client, PU_CANCEL, -1, ids[i], "cancel", 6, NULL, 0),
              "%s: produce the cancel", ids[i]);
    /* Only meaningful when the cancels arrived while Redis held the requests. */
    bool in_time = pu_wait_log(&st.workers[0], "\"cancel_received\"", received + N,
                               PAUSE_MS - (int)(pu_now_ms() - paused_at));
    check(in_time && pu_now_ms() - paused_at < PAUSE_MS,
          "the cancels arrived after the pause (%lld ms)", (long long)(pu_now_ms() - paused_at));
    for (int i = 0; i < N; i++) {
        const pu_record *f = pu_client_wait(&client, ids[i], ANSWER_MS);
        cJSON *j = f ? pu_json(f) : NULL;
        const char *reason = pu_finish_reason(j);
        check(reason && !strcmp(reason, "cancelled"), "%s: finish_reason %s", ids[i],
              reason ? reason : "(none)");
        size_t n = pu_client_replies(&client, ids[i], NULL, 0);
        check(n == 1, "%s: %zu records, want the final one only", ids[i], n);
        pu_check_stream(&client, ids[i]);
        cJSON_Delete(j);
    }
    /* The id sent again after its cancel is a new request: it runs. */
    const pu_record *f = pu_client_final(&client, ids[1]);
    int64_t cancelled_attempt = f ? f->attempt : -1;
    char *body = pu_chat_request(ids[1], "Hi", NULL, "\"max_tokens\":2");
    check(pu_client_send(&client, ids[1], body), "%s: produce it again", ids[1]);
    free(body);
    for (int64_t deadline = pu_now_ms() + ANSWER_MS;
         (f = pu_client_final(&client, ids[1])) && f->attempt == cancelled_attempt &&
         pu_now_ms() < deadline;)
        pu_client_poll(&client, 50);
    cJSON *j = f && f->attempt != cancelled_attempt ? pu_json(f) : NULL;
    const char *reason = pu_finish_reason(j);
    check(reason && (!strcmp(reason, "length") || !strcmp(reason, "stop")),
          "%s sent again after its cancel: finish_reason %s", ids[1], reason ? reason : "(none)");
    pu_check_stream(&client, ids[1]);
    cJSON_Delete(j);
}

/* A client's retry under the same id while the first execution runs: the
 * retry carries a higher attempt, the first ends cancelled, and every record
 * of the first comes before the retry's first record. */
static void test_same_id_twice(void)
{
    static const char id[] = "e2e-twice";
    char extra[192];
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"temperature\":0," PU_NO_STOP,
             LONG_TOKENS);
    char *body = pu_chat_request(id, "Count to a million.", NULL, extra);
    check(pu_client_send(&client, id, body), "twice: produce");
    free(body);
    int64_t deadline = pu_now_ms() + ANSWER_MS;
    while (pu_client_replies(&client, id, NULL, 0) < CANCEL_AFTER_CHUNKS && pu_now_ms() < deadline)
        pu_client_poll(&client, 20);
    check(pu_client_replies(&client, id, NULL, 0) >= CANCEL_AFTER_CHUNKS, "twice: no stream");
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"temperature\":0", RETRY_TOKENS);
    body = pu_chat_request(id, "Count to a million.", NULL, extra);
    check(pu_client_send(&client, id, body), "twice: produce the retry");
    free(body);
    /* Until a final record of an attempt other than the first one's. */
    const pu_record *first, *last;
    for (deadline = pu_now_ms() + ANSWER_MS;; pu_client_poll(&client, 50)) {
        first = pu_client_find(&client, PU_REPLIES, id);
        last = pu_client_final(&client, id);
        if ((first && last && last->attempt != first->attempt) || pu_now_ms() >= deadline)
            break;
    }
    int attempts = pu_check_stream(&client, id);
    check(attempts == 2, "twice: %d attempts", attempts);
    check(first && last && last->attempt > first->attempt, "twice: attempts %lld then %lld",
          first ? (long long)first->attempt : -1LL, last ? (long long)last->attempt : -1LL);
    /* In arrival order: the first attempt, ending cancelled, then the retry. */
    bool in_retry = false, first_cancelled = false;
    for (size_t i = 0; first && last && i < client.n; i++) {
        const pu_record *r = &client.recs[i];
        if (strcmp(r->topic, PU_REPLIES) || strcmp(r->key, id))
            continue;
        in_retry |= r->attempt == last->attempt;
        check(!in_retry || r->attempt == last->attempt,
              "twice: a record of attempt %lld after the retry began", (long long)r->attempt);
        if (r->attempt == first->attempt && r->final) {
            cJSON *j = pu_json(r);
            const char *reason = pu_finish_reason(j);
            first_cancelled = reason && !strcmp(reason, "cancelled");
            cJSON_Delete(j);
        }
    }
    check(first_cancelled, "twice: the first attempt did not end cancelled");
    cJSON *j = last ? pu_json(last) : NULL;
    const char *reason = pu_finish_reason(j);
    check(reason && (!strcmp(reason, "length") || !strcmp(reason, "stop")),
          "twice: the retry ended %s", reason ? reason : "(none)");
    cJSON_Delete(j);
}

/* The heartbeat's worker hash carries the free pool: the step thread's last
 * view of free K/V blocks and image-state budget, never 0 on an idle worker. */
static void test_heartbeat(void)
{
    long long free_bytes = 0;
    int64_t deadline = pu_now_ms() + HEARTBEAT_WAIT_MS;
    for (; free_bytes <= 0 && pu_now_ms() < deadline; pu_sleep_ms(200)) {
        redisReply *rep = pu_redis_cmd(&st.redis, "HGET mllama:worker:w1 free_pool_bytes");
        if (rep && rep->type == REDIS_REPLY_STRING)
            free_bytes = atoll(rep->str);
        freeReplyObject(rep);
    }
    check(free_bytes > 0, "heartbeat: free_pool_bytes %lld", free_bytes);
}

/* An adapter neither on the worker nor in Redis, asked with Redis up. */
static void test_unknown_adapter(void)
{
    await_redis();
    char *body = pu_chat_request("e2e-adapter", "Hello", NULL,
                                 "\"max_tokens\":4,\"adapter\":\"no-such-adapter\"");
    cJSON *j = ask("e2e-adapter", body);
    const char *code = pu_error_code(j);
    check(code && !strcmp(code, "unknown_adapter"), "adapter: error code %s",
          code ? code : "(none)");
    cJSON_Delete(j);
    free(body);
}

/* ---- several workers ------------------------------------------------------------ */

/* Every id answered, each stream well-formed; returns the number of
 * requests that needed more than one attempt. */
static int check_all(char (*ids)[ID_MAX], int n, int timeout_ms)
{
    int done = pu_client_wait_finals(&client, ids[0], ID_MAX, n, timeout_ms);
    check(done == n, "%d of %d requests answered", done, n);
    int retried = 0;
    for (int i = 0; i < n; i++) {
        int attempts = pu_check_stream(&client, ids[i]);
        retried += attempts > 1;
        const pu_record *f = pu_client_final(&client, ids[i]);
        cJSON *j = f ? pu_json(f) : NULL;
        const char *reason = pu_finish_reason(j);
        check(reason && (!strcmp(reason, "length") || !strcmp(reason, "stop")),
              "%s: finish_reason %s", ids[i], reason ? reason : "(none)");
        cJSON_Delete(j);
    }
    return retried;
}

/* Series of mllama_kafka_consumer_lag on worker i's /metrics; -1 when the
 * page could not be read. */
static int lag_series(int i)
{
    static const char name[] = "mllama_kafka_consumer_lag{";
    char *page = pu_http_get(pu_worker_http_port(&st.workers[i]), "/metrics");
    int n = page ? 0 : -1;
    for (const char *p = page; p && (p = strstr(p, name)); p += sizeof name - 1)
        n += p == page || p[-1] == '\n';
    free(page);
    return n;
}

/* Wait until worker i holds at most max_assigned partitions and has one lag
 * series per assigned partition. */
static bool lag_follows_assignment(int i, int max_assigned, int *series, double *assigned)
{
    for (int64_t deadline = pu_now_ms() + LAG_MS;; pu_sleep_ms(100)) {
        *assigned = pu_metric(pu_worker_http_port(&st.workers[i]),
                              "mllama_kafka_assigned_partitions");
        *series = lag_series(i);
        bool ok = *assigned <= max_assigned && *series == (int)*assigned;
        if (ok || pu_now_ms() >= deadline)
            return ok;
    }
}

static void test_two_workers_share(void)
{
    /* A request on every partition: w1 then knows the lag of each. */
    char lag_ids[PARTITIONS][ID_MAX];
    for (int p = 0; p < PARTITIONS; p++) {
        snprintf(lag_ids[p], ID_MAX, "e2e-lag-%d", p);
        char *body = pu_chat_request(lag_ids[p], "Hi", NULL, "\"max_tokens\":2");
        check(pu_client_send_to(&client, PU_REQUESTS, p, lag_ids[p], body, strlen(body), NULL, 0),
              "%s: produce", lag_ids[p]);
        free(body);
    }
    check(pu_client_wait_finals(&client, lag_ids[0], ID_MAX, PARTITIONS, BURST_MS) == PARTITIONS,
          "lag: requests unanswered");
    int series;
    double assigned;
    bool ok = lag_follows_assignment(0, PARTITIONS, &series, &assigned);
    check(ok && series == PARTITIONS, "lag: w1 has %d series for %g partitions", series,
          assigned);

    check(start_worker(1), "w2 start");
    /* w2 takes part once the cooperative rebalance hands it partitions. */
    check(pu_wait_assigned(&st.workers[1], JOIN_MS), "w2 never joined");
    /* The partitions w1 gave away lose their series there. */
    ok = lag_follows_assignment(0, PARTITIONS - 1, &series, &assigned);
    check(ok, "lag: after w2 joined, w1 has %d series for %g partitions", series, assigned);
    double before[2] = {finished(0), finished(1)};
    char ids[SHARE_REQUESTS][ID_MAX];
    for (int i = 0; i < SHARE_REQUESTS; i++) {
        snprintf(ids[i], ID_MAX, "e2e-share-%d", i);
        char *body = pu_chat_request(ids[i], "Hi", NULL, "\"max_tokens\":6");
        check(pu_client_send(&client, ids[i], body), "%s: produce", ids[i]);
        free(body);
    }
    int retried = check_all(ids, SHARE_REQUESTS, BURST_MS);
    double by[2] = {finished(0) - before[0], finished(1) - before[1]};
    fprintf(stderr, "share: w1 answered %g, w2 %g, %d retried\n", by[0], by[1], retried);
    check(by[0] > 0 && by[1] > 0, "load not shared: w1 %g, w2 %g", by[0], by[1]);
    check(by[0] + by[1] >= SHARE_REQUESTS, "answers %g < %d", by[0] + by[1], SHARE_REQUESTS);
}

static void test_third_worker_joins(void)
{
    char ids[BURST_REQUESTS][ID_MAX];
    int sent_after_join = 0;
    for (int i = 0; i < BURST_REQUESTS; i++) {
        if (i == BURST_JOIN_AT)
            check(start_worker(2), "w3 start");
        snprintf(ids[i], ID_MAX, "e2e-burst-%d", i);
        char *body = pu_chat_request(ids[i], "Tell me a story.", NULL, "\"max_tokens\":48");
        check(pu_client_send(&client, ids[i], body), "%s: produce", ids[i]);
        free(body);
        pu_client_poll(&client, BURST_GAP_MS);
        sent_after_join += i > BURST_JOIN_AT && pu_metric(pu_worker_http_port(&st.workers[2]),
                                                          "mllama_kafka_assigned_partitions") > 0;
    }
    int retried = check_all(ids, BURST_REQUESTS, BURST_MS);
    check(pu_wait_assigned(&st.workers[2], JOIN_MS), "w3 never joined");
    fprintf(stderr,
            "burst: %d of %d requests needed a second attempt; %d were sent after w3 had "
            "partitions; w3 answered %g\n",
            retried, BURST_REQUESTS, sent_after_join, finished(2));
}

int main(void)
{
    if (!pu_which("kcat"))
        ml_test_skip("needs kcat on PATH");
    pu_stack_start(&st, "e2e", TOPICS);
    image = pu_slurp_image(IMAGE, &image_len, image_sha);
    const char *topics[] = {PU_REPLIES};
    pu_client_init(&client, st.brokers, topics, 1);

    int64_t t0 = pu_now_ms();
    if (!start_worker(0))
        pu_die("w1 start");
    test_kcat_request();
    test_resident_image();
    test_not_streamed();
    test_logit_bias();
    test_tools();
    test_choices();
    test_conversation();
    test_cancel();
    test_cancel_before_running();
    test_same_id_twice();
    test_unknown_adapter();
    test_heartbeat();
    fprintf(stderr, "one worker: %.1f s\n", (pu_now_ms() - t0) / 1000.0);
    test_two_workers_share();
    test_third_worker_joins();
    fprintf(stderr, "all: %.1f s\n", (pu_now_ms() - t0) / 1000.0);

    for (int i = 0; i < 3; i++) {
        int code = pu_stop(&st.workers[i], PU_STOP_MS);
        check(code == 0, "%s: exit code %d after SIGTERM", worker_names[i], code);
        if (code != 0)
            pu_show_log(st.workers[i].log, 3000);
        pu_check_log_clean(st.workers[i].log);
    }
    pu_client_deinit(&client);
    free(image);
    return check_done();
}
