/* Structured outputs through the runtime (runtime/constraint.h) on the m3
 * golden fixture model (random weights, so the constraint does all the
 * work) with the real tokenizer: constrained rows sampled by the model's
 * sample op with their masks, the masks computed on the mask thread while
 * the forward pass runs.
 * - constrained requests batched with unconstrained ones give tokens every
 *   one of which a fresh constraint state accepts, and a document that
 *   parses when the request stopped;
 * - seeded constrained requests are batch invariant (alone == batched,
 *   tokens and logprobs bitwise) and identical to the host path (a logits
 *   callback samples on the host, ml_sampler_sample with the same mask);
 * - logprobs stay the unconstrained model's (log_softmax of the raw row);
 * - stop strings, a max_tokens cut (length), cancel mid-document, and
 *   preemption (the state survives re-prefill: same output as without);
 * - grammars (grammar/grammar.h): two built by hand from tables,
 *   independent of the schema compiler, a list that admits nothing once
 *   closed (the sequence ends at once with stop) and a number that may
 *   always go on (the stop id is allowed exactly once it is complete), and
 *   one compiled from a JSON Schema (ml_grammar_compile_schema); many
 *   sequences sharing one grammar, its references all returned at the end;
 *   a finished document checked by a validator written here with cJSON,
 *   not by the grammar;
 * - grammar_on_brace (tool_choice "auto"): an answer is either prose,
 *   unconstrained from its first token, or, when it begins with '{', a
 *   document of the grammar; a bias towards '{' makes it one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "grammar/json_mode.h"
#include "harness.h"
#include "runtime_test_util.h"

#define MODEL ML_SOURCE_DIR "/tests/golden/fixtures/models/m3_two_images_interleaved"
#define GREEDY_STEPS 4
#define KV_AMPLE 64
#define KV_SMALL 6   /* blocks: several sequences cannot all fit, so some are preempted */
#define IMAGE_SLOTS 2
#define TOKENS ML_RT_MAX_OUT
/* The requests' stop id, standing for the end of turn in the fixture's
 * 700-logit vocabulary (which has no special token): the token of byte
 * 0x01, which no JSON text contains, so no grammar allows it itself. */
#define STOP_ID 189

static ml_json_vocab *g_vocab; /* the fixture's token trie, for the checks */

/* ---- checks ------------------------------------------------------------------ */

/* Request `what`'s tokens, each accepted by a fresh JSON mode state; a
 * request that stopped without a stop string spelled one whole object, and
 * one cut by length has every token of its budget. */
static void check_json_result(const ml_rt_fixture *f, const ml_rt_result *r, int max_tokens,
                              int stop_string, const char *what)
{
    char err[256] = "";
    ml_json_state *js = NULL;
    check(r->done == 1 && r->error == ML_REQERR_NONE &&
              ml_json_state_create(g_vocab, &js, err, sizeof err) == ML_OK,
          "%s: ended once without error ('%s')", what, r->message);
    int ok = js != NULL;
    for (int t = 0; ok && t < r->n_out; t++)
        ok = ml_json_state_accept(js, r->out[t], err, sizeof err) == ML_OK;
    check(ok, "%s: every token inside the grammar (%s)", what, err);
    if (r->reason == ML_FINISH_REASON_STOP && !stop_string) {
        char *text = NULL;
        size_t len = 0;
        check(js && ml_json_state_complete(js) &&
                  ml_tokenizer_decode(f->tok, r->out, (size_t)r->n_out, 0, &text, &len, err,
                                      sizeof err) == ML_OK,
              "%s: stopped on a complete object", what);
        cJSON *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
        check(cJSON_IsObject(doc), "%s: '%s' is one JSON object", what, text ? text : "");
        cJSON_Delete(doc);
        free(text);
    } else if (!stop_string) {
        check(r->reason == ML_FINISH_REASON_LENGTH && r->n_out == max_tokens,
              "%s: finish %d after %d of %d tokens", what, (int)r->reason, r->n_out, max_tokens);
    }
    ml_json_state_destroy(js);
}

/* The same tokens and logprobs (bitwise on the CPU; on CUDA the sample op
 * against the host sampler within rounding, ml_rt_same_logprobs). */
static int same_result(const ml_rt_result *a, const ml_rt_result *b)
{
    return ml_rt_same_output(a, b) && ml_rt_same_logprobs(a->lp, b->lp, a->n_out);
}

/* Sampling of constrained request i: seeded draws (one greedy), logprobs
 * with alternatives, STOP_ID as stop id. */
static void constrained_params(ml_sampling_params *p, int i, ml_grammar *g)
{
    ml_sampling_params_default(p);
    p->json_object = g == NULL;
    p->grammar = g;
    p->seed = 1000 + (uint64_t)i;
    p->temperature = i % 3 == 0 ? 0.0f : 1.2f;
    p->top_p = i % 3 == 2 ? 0.9f : 1.0f;
    p->logprobs = true;
    p->top_logprobs = 2;
    p->stop_ids[0] = STOP_ID;
    p->n_stop_ids = 1;
}

static ml_rt_kind kind_of(int i)
{
    return i % 2 ? ML_RT_TEXT_ONLY : ML_RT_TWO_IMAGES;
}

/* ---- JSON mode -------------------------------------------------------------- */

enum { N_CON = 8, N_FREE = 3 };

/* Constrained request i, alone in a fresh runtime (kv_blocks blocks);
 * keep_logits samples it on the host. */
static void run_alone(ml_rt_fixture *f, int i, ml_grammar *g, int keep_logits, ml_rt_result *r)
{
    ml_sampling_params p;
    constrained_params(&p, i, g);
    ml_runtime *rt = ml_rt_runtime_sized(f, KV_AMPLE, IMAGE_SLOTS);
    memset(r, 0, sizeof *r);
    ml_rt_submit(f, rt,
                 &(ml_rt_request){.kind = kind_of(i), .max_tokens = TOKENS, .sampling = &p,
                                  .keep_logits = keep_logits},
                 r);
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
}

/* N_CON constrained requests interleaved with N_FREE unconstrained drawn
 * ones in one runtime of kv_blocks blocks. */
static void run_batched(ml_rt_fixture *f, ml_grammar *g, size_t kv_blocks, ml_rt_result *con,
                        ml_rt_result *free_r)
{
    ml_runtime *rt = ml_rt_runtime_sized(f, kv_blocks, IMAGE_SLOTS);
    memset(con, 0, N_CON * sizeof *con);
    memset(free_r, 0, N_FREE * sizeof *free_r);
    for (int i = 0; i < N_CON; i++) {
        ml_sampling_params p, q;
        constrained_params(&p, i, g);
        ml_rt_submit(f, rt,
                     &(ml_rt_request){.kind = kind_of(i), .max_tokens = TOKENS, .sampling = &p},
                     &con[i]);
        if (i < N_FREE) {
            ml_sampling_params_default(&q);
            q.seed = 7 + (uint64_t)i;
            ml_rt_submit(f, rt,
                         &(ml_rt_request){.kind = kind_of(i + 1), .max_tokens = TOKENS / 2,
                                          .sampling = &q},
                         &free_r[i]);
        }
    }
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
}

static void test_json_batched(ml_rt_fixture *f)
{
    ml_rt_result alone[N_CON], host[N_CON], con[N_CON], free_r[N_FREE], small[N_CON],
        small_free[N_FREE];
    for (int i = 0; i < N_CON; i++) {
        run_alone(f, i, NULL, 0, &alone[i]);
        run_alone(f, i, NULL, 1, &host[i]);
    }
    run_batched(f, NULL, KV_AMPLE, con, free_r);
    run_batched(f, NULL, KV_SMALL, small, small_free);
    int stopped = 0, preempted = 0;
    for (int i = 0; i < N_CON; i++) {
        char what[64];
        snprintf(what, sizeof what, "json request %d batched", i);
        check_json_result(f, &con[i], TOKENS, 0, what);
        stopped += con[i].reason == ML_FINISH_REASON_STOP;
        preempted += small[i].usage.preemptions;
        check(same_result(&alone[i], &con[i]),
              "json request %d: alone and batched give the same tokens and logprobs", i);
        check(same_result(&host[i], &con[i]),
              "json request %d: the sample op with its mask gives the host sampler's tokens and "
              "logprobs",
              i);
        check(same_result(&small[i], &con[i]),
              "json request %d: preempted and re-prefilled, the same output", i);
        /* Logprobs are the raw model's: the first one is log_softmax of
         * the first step's raw logits, whatever the mask. */
        ml_sample_out raw;
        check(host[i].first_logits && host[i].n_out > 0 &&
                  ml_sample_logprobs(host[i].first_logits, (size_t)host[i].vocab, host[i].out[0],
                                     2, &raw, NULL, 0) == ML_OK &&
                  fabsf(raw.chosen.logprob - host[i].lp[0].chosen.logprob) < 1e-6f,
              "json request %d: the logprob is the unconstrained model's", i);
        ml_rt_result_deinit(&alone[i]);
        ml_rt_result_deinit(&host[i]);
    }
    for (int i = 0; i < N_FREE; i++)
        check(free_r[i].done == 1 && free_r[i].reason == ML_FINISH_REASON_LENGTH &&
                  ml_rt_same_output(&free_r[i], &small_free[i]),
              "unconstrained request %d beside them runs to its length", i);
    fprintf(stderr, "  json mode batched: %d of %d completed their object, %d preemptions\n",
            stopped, N_CON, preempted);
}

/* A stop string cuts the object (finish stop, the stop string not sent); a
 * small max_tokens cuts it with length; a cancel mid-document ends it at
 * once and frees its state (the sanitizer build sees a leak otherwise). */
static void test_json_endings(ml_rt_fixture *f)
{
    enum { CUT = 3 };
    ml_rt_result r[3];
    memset(r, 0, sizeof r);
    ml_runtime *rt = ml_rt_runtime_sized(f, KV_AMPLE, IMAGE_SLOTS);
    ml_sampling_params p;
    constrained_params(&p, 1, NULL);
    p.stop[0] = "\"";
    p.stop_len[0] = 1;
    p.n_stop = 1;
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TEXT_ONLY, .max_tokens = TOKENS, .sampling = &p},
                 &r[0]);
    constrained_params(&p, 2, NULL);
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TEXT_ONLY, .max_tokens = CUT, .sampling = &p},
                 &r[1]);
    uint64_t h = ml_rt_submit(
        f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = TOKENS, .sampling = &p},
        &r[2]);
    ml_rt_steps(rt, 3);
    ml_runtime_cancel(rt, h);
    check(r[2].done == 1 && r[2].reason == ML_FINISH_REASON_CANCELLED,
          "json request cancelled mid-document ends at once");
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
    check_json_result(f, &r[0], TOKENS, 1, "json request with a stop string");
    check(r[0].reason == ML_FINISH_REASON_STOP || r[0].reason == ML_FINISH_REASON_LENGTH,
          "json request with a stop string: finish %d", (int)r[0].reason);
    check_json_result(f, &r[1], CUT, 0, "json request cut by max_tokens");
}

/* ---- grammars -------------------------------------------------------------- */

enum { G_START, G_OPEN, G_NUM, G_COMMA, G_DONE, G_LIST_STATES };

static void edges(ml_grammar *g, uint32_t from, const char *bytes, uint32_t to)
{
    for (const char *b = bytes; *b; b++)
        g->next[(size_t)from * g->n_classes + (uint8_t)*b] = to;
}

/* A grammar over raw bytes (one class per byte), no calls, every state
 * dead but for what the caller adds. */
static ml_grammar *bare_grammar(uint32_t n_states)
{
    ml_grammar *g = ml_grammar_alloc(n_states, 256, 0);
    if (!g) {
        fprintf(stderr, "out of memory for a grammar\n");
        exit(1);
    }
    for (int b = 0; b < 256; b++)
        g->byte_class[b] = (uint8_t)b;
    memset(g->next, 0xff, (size_t)n_states * 256 * sizeof *g->next);
    g->start = 0;
    return g;
}

/* "[" (digits ("," digits)*)? "]": nothing may follow the "]". */
static ml_grammar *list_grammar(void)
{
    static const char digits[] = "0123456789";
    ml_grammar *g = bare_grammar(G_LIST_STATES);
    edges(g, G_START, "[", G_OPEN);
    edges(g, G_OPEN, digits, G_NUM);
    edges(g, G_OPEN, "]", G_DONE);
    edges(g, G_NUM, digits, G_NUM);
    edges(g, G_NUM, ",", G_COMMA);
    edges(g, G_NUM, "]", G_DONE);
    edges(g, G_COMMA, digits, G_NUM);
    g->flags[G_DONE] = ML_GRAMMAR_ACCEPT;
    return g;
}

/* digits+: complete after the first digit and never closed. */
static ml_grammar *number_grammar(void)
{
    ml_grammar *g = bare_grammar(2);
    edges(g, 0, "0123456789", 1);
    edges(g, 1, "0123456789", 1);
    g->flags[1] = ML_GRAMMAR_ACCEPT;
    return g;
}

/* Independent validators of a finished document: 1 when valid. */
typedef int (*validate_fn)(const cJSON *doc, const char *text, size_t len);

static int valid_list(const cJSON *doc, const char *text, size_t len)
{
    (void)text, (void)len;
    const cJSON *e;
    int ok = cJSON_IsArray(doc);
    cJSON_ArrayForEach(e, doc) ok &= cJSON_IsNumber(e) && e->valuedouble >= 0;
    return ok;
}

static int valid_number(const cJSON *doc, const char *text, size_t len)
{
    (void)doc;
    int ok = len > 0;
    for (size_t i = 0; i < len; i++)
        ok &= text[i] >= '0' && text[i] <= '9';
    return ok;
}

static const char schema_text[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

/* schema_text's rules, checked on the parsed document. */
static int valid_person(const cJSON *doc, const char *text, size_t len)
{
    (void)text, (void)len;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(doc, "name");
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(doc, "age");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(doc, "tags"), *e;
    int ok = cJSON_IsObject(doc) && cJSON_IsString(name) && cJSON_IsNumber(age) &&
             age->valuedouble == (double)(int)age->valuedouble && age->valuedouble >= 0 &&
             age->valuedouble <= 150 && (!tags || cJSON_IsArray(tags));
    if (ok) { /* maxLength counts characters: UTF-8 lead bytes */
        int chars = 0;
        for (const char *c = name->valuestring; *c; c++)
            chars += ((unsigned char)*c & 0xC0) != 0x80;
        ok = chars <= 12;
    }
    int n = 0;
    cJSON_ArrayForEach(e, tags) ok &= cJSON_IsString(e) && n++ < 3 &&
                                      (!strcmp(e->valuestring, "a") || !strcmp(e->valuestring, "b"));
    cJSON_ArrayForEach(e, doc) ok &= !strcmp(e->string, "name") || !strcmp(e->string, "age") ||
                                     !strcmp(e->string, "tags");
    return ok;
}

/* r's tokens, each accepted by a fresh state of g; a request that stopped
 * is complete and valid by `valid`; `closed`: it stopped at once on
 * completing (nothing may follow), else by the stop id, which is never
 * streamed. */
static void check_grammar_result(const ml_rt_fixture *f, ml_grammar *g, const ml_rt_result *r,
                                 int closed, validate_fn valid, const char *what)
{
    char err[256] = "";
    ml_grammar_state *gs = NULL;
    check(r->done == 1 && r->error == ML_REQERR_NONE &&
              ml_grammar_state_create(g, g_vocab, &gs, err, sizeof err) == ML_OK,
          "%s: ended once without error ('%s')", what, r->message);
    int ok = gs != NULL;
    for (int t = 0; ok && t < r->n_out; t++)
        ok = ml_grammar_state_accept(gs, r->out[t], err, sizeof err) == ML_OK;
    check(ok, "%s: every token inside the grammar (%s)", what, err);
    if (r->reason == ML_FINISH_REASON_STOP) {
        char *text = NULL;
        size_t len = 0;
        ml_tokenizer_decode(f->tok, r->out, (size_t)r->n_out, 0, &text, &len, err, sizeof err);
        cJSON *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
        check(gs && ml_grammar_state_complete(gs) && r->n_out > 0 &&
                  r->usage.completion_tokens == r->n_out + !closed,
              "%s: stopped on a complete document '%s' after %d tokens (%d counted)", what,
              text ? text : "", r->n_out, r->usage.completion_tokens);
        check(text && valid(doc, text, len), "%s: '%s' is valid", what, text ? text : "");
        cJSON_Delete(doc);
        free(text);
    } else {
        check(r->reason == ML_FINISH_REASON_LENGTH && r->n_out == TOKENS,
              "%s: finish %d after %d tokens", what, (int)r->reason, r->n_out);
    }
    ml_grammar_state_destroy(gs);
}

static void test_grammar(ml_rt_fixture *f, ml_grammar *g, int closed, validate_fn valid,
                         const char *name)
{
    ml_rt_result alone[N_CON], host[N_CON], con[N_CON], free_r[N_FREE];
    for (int i = 0; i < N_CON; i++) {
        run_alone(f, i, g, 0, &alone[i]);
        run_alone(f, i, g, 1, &host[i]);
    }
    /* Every batched request holds a reference to the one grammar. */
    run_batched(f, g, KV_AMPLE, con, free_r);
    int stopped = 0;
    for (int i = 0; i < N_CON; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s request %d batched", name, i);
        check_grammar_result(f, g, &con[i], closed, valid, what);
        stopped += con[i].reason == ML_FINISH_REASON_STOP;
        check(same_result(&alone[i], &con[i]) && same_result(&host[i], &con[i]),
              "%s request %d: alone, batched and on the host give the same tokens and logprobs",
              name, i);
        ml_rt_result_deinit(&alone[i]);
        ml_rt_result_deinit(&host[i]);
    }
    check(atomic_load(&g->refs) == 1, "%s: every sequence released its reference", name);
    fprintf(stderr, "  %s grammar batched: %d of %d completed their document\n", name, stopped,
            N_CON);
}

/* The first byte of r's text that is not JSON whitespace, or 0. */
static int first_byte(const ml_rt_fixture *f, const ml_rt_result *r)
{
    char err[256];
    char *text = NULL;
    size_t len = 0;
    int c = 0;
    if (ml_tokenizer_decode(f->tok, r->out, (size_t)r->n_out, 0, &text, &len, err,
                            sizeof err) == ML_OK)
        for (size_t i = 0; i < len && !c; i++)
            if (!strchr(" \t\n\r", text[i]))
                c = (unsigned char)text[i];
    free(text);
    return c;
}

/* grammar_on_brace: requests drawn freely begin with prose or a document,
 * each checked as what it began as; with '{' biased up every one is a
 * document of g. Alone == batched. */
static void test_on_brace(ml_rt_fixture *f, ml_grammar *g, validate_fn valid)
{
    char err[256] = "";
    ml_token_buf brace;
    ml_token_buf_init(&brace);
    check(ml_tokenizer_encode(f->tok, "{", 1, 0, &brace, err, sizeof err) == ML_OK &&
              brace.n == 1,
          "'{' is one token (%s)", err);
    ml_logit_bias up = {brace.n ? brace.ids[0] : 0, 100.0f};
    ml_token_buf_deinit(&brace);
    enum { N_BRACE = 8 };
    ml_rt_result alone[N_BRACE], batched[N_BRACE];
    ml_sampling_params p[N_BRACE];
    for (int i = 0; i < N_BRACE; i++) {
        constrained_params(&p[i], i, g);
        p[i].grammar_on_brace = true;
        p[i].temperature = 1.0f; /* random weights: draws begin with anything */
        if (i % 2) {
            p[i].logit_bias = &up;
            p[i].n_logit_bias = 1;
        }
        ml_runtime *rt = ml_rt_runtime_sized(f, KV_AMPLE, IMAGE_SLOTS);
        memset(&alone[i], 0, sizeof alone[i]);
        ml_rt_submit(f, rt,
                     &(ml_rt_request){.kind = kind_of(i), .max_tokens = TOKENS,
                                      .sampling = &p[i]},
                     &alone[i]);
        ml_rt_drain(rt, 0);
        ml_runtime_destroy(rt);
    }
    ml_runtime *rt = ml_rt_runtime_sized(f, KV_AMPLE, IMAGE_SLOTS);
    memset(batched, 0, sizeof batched);
    for (int i = 0; i < N_BRACE; i++)
        ml_rt_submit(f, rt,
                     &(ml_rt_request){.kind = kind_of(i), .max_tokens = TOKENS,
                                      .sampling = &p[i]},
                     &batched[i]);
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
    int prose = 0;
    for (int i = 0; i < N_BRACE; i++) {
        char what[64];
        snprintf(what, sizeof what, "on_brace request %d", i);
        int c = first_byte(f, &batched[i]);
        check(c == '{' || (i % 2 == 0 && c != 0), "%s: begins with '%c'%s", what, c ? c : '0',
              i % 2 ? " though '{' is biased up" : "");
        if (c == '{')
            check_grammar_result(f, g, &batched[i], 1, valid, what);
        else
            prose++;
        check(same_result(&alone[i], &batched[i]), "%s: alone and batched the same", what);
        ml_rt_result_deinit(&alone[i]);
    }
    fprintf(stderr, "  on_brace: %d of %d answers prose, the rest documents\n", prose, N_BRACE);
}

int main(void)
{
    ml_rt_fixture f;
    ml_model_limits lim = ml_rt_limits();
    int32_t greedy[GREEDY_STEPS];
    ml_rt_fixture_open_golden(&f, MODEL, &lim, greedy, GREEDY_STEPS);
    char err[256] = "";
    if (ml_json_vocab_create(f.tok, (size_t)ml_model_config(f.model)->text.vocab_size, &g_vocab,
                             err, sizeof err) != ML_OK) {
        fprintf(stderr, "json vocab: %s\n", err);
        return 1;
    }
    test_json_batched(&f);
    test_json_endings(&f);
    ml_grammar *list = list_grammar(), *number = number_grammar();
    test_grammar(&f, list, 1, valid_list, "list");
    test_grammar(&f, number, 0, valid_number, "number");
    ml_grammar_unref(list);
    ml_grammar_unref(number);
    ml_schema_limits slim;
    ml_schema_limits_default(&slim);
    ml_grammar *person = NULL;
    check(ml_grammar_compile_schema(schema_text, sizeof schema_text - 1, &slim, &person, err,
                                    sizeof err) == ML_OK,
          "the schema compiles: %s", err);
    if (person) {
        test_grammar(&f, person, 1, valid_person, "schema");
        test_on_brace(&f, person, valid_person);
        ml_grammar_unref(person);
    }
    ml_json_vocab_destroy(g_vocab);
    ml_rt_fixture_close(&f);
    return check_done();
}
