/* The model-level proof of structured outputs (issue 22): documents sampled
 * through the runtime under a compiled JSON Schema, judged by the
 * independent oracle (schema_oracle.h), never by the grammar itself.
 *
 * The m3 golden fixture model has random weights, so at temperature 1 its
 * constrained draws are random documents of the schema: wide coverage of
 * what the grammar allows. For every schema of fixtures/schemas/ (typical
 * extraction shapes), SEEDS seeded requests run batched with sampling.grammar
 * set; for each:
 * - the streamed text is the decoded tokens, and every token is one a fresh
 *   grammar state accepts (the runtime enforced the grammar it was given);
 * - wherever that state calls the text complete, the text is strict JSON
 *   that the oracle validates (the grammar claims nothing the oracle denies);
 * - a request that ended with `stop` spelled a complete, valid document; one
 *   cut by `length` used its whole budget.
 * Then the other direction, fixtures/schemas_refused/refused.json: schemas
 * with a keyword the compiler may not enforce exactly. Each is either
 * refused with the keyword and its JSON Pointer in the message, or compiled
 * and then proven like the corpus.
 * Last, the oracle's fixture (fixtures/schema_oracle/cases.json, validity
 * computed by Python's jsonschema): each instance is fed byte by byte to
 * the grammar of its schema (when it compiles); one the grammar takes as a
 * complete document must be one jsonschema judged valid. The grammar may
 * refuse valid ones (property order, its refusals), never accept invalid
 * ones.
 * Exit 1 when a fixture file cannot be read; the oracle's own refusal to
 * judge ("oracle: ...") is a failure, never a pass. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_mode.h"
#include "harness.h"
#include "runtime_test_util.h"
#include "schema_oracle.h"
#include "tokenizer_util.h"

#define MODEL ML_SOURCE_DIR "/tests/golden/fixtures/models/m3_two_images_interleaved"
#define SCHEMA_DIR ML_SOURCE_DIR "/tests/engine/fixtures/schemas"
#define REFUSED_PATH ML_SOURCE_DIR "/tests/engine/fixtures/schemas_refused/refused.json"
#define CASES_PATH ML_SOURCE_DIR "/tests/engine/fixtures/schema_oracle/cases.json"
#define GREEDY_STEPS 4
/* Requests per schema (seeds SEED_BASE...), and each one's token budget. */
#define SEEDS 16
#define SEED_BASE 22000
#define MAX_TOKENS 512
/* The text a document may take: the longest tokens of the fixture's
 * 700-logit vocabulary are a few bytes. */
#define TEXT_CAP (MAX_TOKENS * 16)
/* KV blocks: every request of a schema resident at once, prompt and budget. */
#define KV_BLOCKS 512
#define IMAGE_SLOTS 1
/* The requests' stop id, standing for the end of turn in the fixture's
 * vocabulary (no special token there): the token of byte 0x01, which no
 * JSON text contains, so no grammar allows it itself. */
#define STOP_ID 189

/* The extraction corpus, fixtures/schemas/<name>.json. */
static const char *const corpus[] = {
    "invoice",        "receipt",       "contact_form",   "product",        "person_address",
    "status_enum",    "nested_arrays", "optional_fields", "anyof_contact", "oneof_shape",
    "patterns",       "formats_time",  "formats_net",    "recursive_tree", "integer_bounds",
    "number_bounds",  "nullable",      "tuple_point",    "table_rows",     "map_totals",
    "additional_schema", "allof_compose", "string_lengths",
};

static ml_json_vocab *g_vocab; /* the fixture's token trie, for the replays */
static int32_t g_byte_id[256];  /* the single-byte token of each byte */

/* What one request reported. */
typedef struct doc {
    int32_t tokens[MAX_TOKENS];
    int n_tokens;
    char text[TEXT_CAP]; /* on_token's pieces and on_finish's tail */
    size_t len;
    bool overflow;       /* more text than TEXT_CAP */
    int done;
    ml_finish_reason reason;
    ml_request_error error;
    char message[256];
} doc;

static void doc_append(doc *d, const char *text, size_t len)
{
    if (d->len + len > sizeof d->text) {
        d->overflow = true;
        return;
    }
    memcpy(d->text + d->len, text, len);
    d->len += len;
}

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_sample_out *lp)
{
    doc *d = ctx;
    if (d->n_tokens < MAX_TOKENS)
        d->tokens[d->n_tokens] = id;
    d->n_tokens++;
    doc_append(d, text, len);
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *usage)
{
    doc *d = ctx;
    doc_append(d, tail, tail_len);
    d->done++;
    d->reason = reason;
    d->error = error;
    snprintf(d->message, sizeof d->message, "%s", message ? message : "");
}

/* ---- files ------------------------------------------------------------------ */

static char *read_text(const char *path, size_t *len)
{
    char *text = ml_tok_read_file(path, len);
    if (!text) {
        fprintf(stderr, "%s: cannot be read\n", path);
        exit(1);
    }
    return text;
}

/* ---- one document's checks ---------------------------------------------------- */

/* The text of tokens[0..n), decoded (malloc'd, length in *len). */
static char *decode(const ml_rt_fixture *f, const int32_t *tokens, int n, size_t *len)
{
    char *text = NULL, err[256] = "";
    if (ml_tokenizer_decode(f->tok, tokens, (size_t)n, 0, &text, len, err, sizeof err) != ML_OK) {
        fprintf(stderr, "decode: %s\n", err);
        exit(1);
    }
    return text;
}

/* text (len bytes) is strict JSON and the oracle validates it against
 * schema; what is wrong in why otherwise. */
static bool oracle_accepts(const cJSON *schema, const char *text, size_t len, char *why, size_t n)
{
    if (!schema_oracle_json_text(text, len, why, n))
        return false;
    cJSON *inst = cJSON_ParseWithLength(text, len);
    if (!inst) {
        snprintf(why, n, "cJSON cannot read it");
        return false;
    }
    bool ok = schema_oracle_valid(schema, inst, why, n);
    cJSON_Delete(inst);
    return ok;
}

typedef struct tally {
    int stopped, cut, complete_points;
} tally;

static void check_doc(const ml_rt_fixture *f, ml_grammar *g, const cJSON *schema, const doc *d,
                      const char *what, tally *t)
{
    char err[256] = "", why[512] = "";
    check(d->done == 1 && d->error == ML_REQERR_NONE, "%s: ended once without error (%s)", what,
          d->message);
    check(!d->overflow && d->n_tokens <= MAX_TOKENS, "%s: %d tokens within the budget", what,
          d->n_tokens);
    if (d->overflow || d->n_tokens > MAX_TOKENS)
        return;
    size_t len = 0;
    char *text = decode(f, d->tokens, d->n_tokens, &len);
    check(len == d->len && !memcmp(text, d->text, len),
          "%s: the streamed text is the decoded tokens", what);
    free(text);

    ml_grammar_state *s = NULL;
    check(ml_grammar_state_create(g, g_vocab, &s, err, sizeof err) == ML_OK, "%s: state: %s", what,
          err);
    if (!s)
        return;
    bool accepted = true, complete = false;
    for (int i = 0; i < d->n_tokens && accepted; i++) {
        accepted = ml_grammar_state_accept(s, d->tokens[i], err, sizeof err) == ML_OK;
        check(accepted, "%s: token %d (id %d) refused by a fresh state: %s", what, i,
              d->tokens[i], err);
        complete = accepted && ml_grammar_state_complete(s);
        if (!complete)
            continue;
        t->complete_points++;
        char *prefix = decode(f, d->tokens, i + 1, &len);
        bool ok = oracle_accepts(schema, prefix, len, why, sizeof why);
        check(ok, "%s: complete after token %d per the grammar, but the oracle says %s: %.*s",
              what, i, why, (int)len, prefix);
        free(prefix);
    }
    if (d->reason == ML_FINISH_REASON_STOP) {
        t->stopped++;
        check(accepted && complete, "%s: stopped on a complete document", what);
        bool ok = oracle_accepts(schema, d->text, d->len, why, sizeof why);
        check(ok, "%s: the document validates (%s): %.*s", what, why, (int)d->len, d->text);
    } else {
        t->cut++;
        check(d->reason == ML_FINISH_REASON_LENGTH && d->n_tokens == MAX_TOKENS,
              "%s: finish %d after %d of %d tokens", what, (int)d->reason, d->n_tokens,
              MAX_TOKENS);
    }
    ml_grammar_state_destroy(s);
}

/* ---- sampling ------------------------------------------------------------------- */

/* SEEDS requests under g batched in one runtime, each checked. */
static void prove(ml_rt_fixture *f, ml_grammar *g, const cJSON *schema, const char *name)
{
    static doc docs[SEEDS];
    memset(docs, 0, sizeof docs);
    ml_runtime *rt = ml_rt_runtime_sized(f, KV_BLOCKS, IMAGE_SLOTS);
    for (int i = 0; i < SEEDS; i++) {
        ml_sampling_params p;
        ml_sampling_params_default(&p);
        p.grammar = g;
        p.seed = SEED_BASE + (uint64_t)i;
        p.temperature = 1.0f;
        p.stop_ids[0] = STOP_ID;
        p.n_stop_ids = 1;
        ml_request_callbacks cb = {.on_token = on_token, .on_finish = on_finish, .ctx = &docs[i]};
        ml_rt_submit(f, rt,
                     &(ml_rt_request){.kind = ML_RT_TEXT_ONLY, .max_tokens = MAX_TOKENS,
                                      .sampling = &p, .cb = &cb},
                     NULL);
    }
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
    tally t = {0};
    for (int i = 0; i < SEEDS; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s seed %d", name, SEED_BASE + i);
        check_doc(f, g, schema, &docs[i], what, &t);
    }
    fprintf(stderr, "  %-18s %2d stopped, %2d cut by length, %3d complete points checked\n", name,
            t.stopped, t.cut, t.complete_points);
    if (t.stopped > 0)
        for (int i = 0; i < SEEDS; i++)
            if (docs[i].reason == ML_FINISH_REASON_STOP) {
                fprintf(stderr, "    e.g. %.*s\n", (int)docs[i].len, docs[i].text);
                break;
            }
}

static ml_status compile(const char *text, size_t len, ml_grammar **g, char *err, size_t n)
{
    ml_schema_limits lim;
    ml_schema_limits_default(&lim);
    return ml_grammar_compile_schema(text, len, &lim, g, err, n);
}

static void test_corpus(ml_rt_fixture *f)
{
    for (size_t k = 0; k < sizeof corpus / sizeof *corpus; k++) {
        char path[512], err[512] = "";
        snprintf(path, sizeof path, "%s/%s.json", SCHEMA_DIR, corpus[k]);
        size_t len;
        char *text = read_text(path, &len);
        cJSON *schema = cJSON_ParseWithLength(text, len);
        ml_grammar *g = NULL;
        ml_status st = compile(text, len, &g, err, sizeof err);
        check(st == ML_OK && schema, "%s compiles: %s", corpus[k], err);
        if (st == ML_OK && schema)
            prove(f, g, schema, corpus[k]);
        ml_grammar_unref(g);
        cJSON_Delete(schema);
        free(text);
    }
}

static void test_refused(ml_rt_fixture *f)
{
    size_t len;
    char *text = read_text(REFUSED_PATH, &len);
    cJSON *list = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsArray(list)) {
        fprintf(stderr, "%s: not a JSON array\n", REFUSED_PATH);
        exit(1);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(e, "schema");
        const char *kw = cJSON_GetObjectItemCaseSensitive(e, "keyword")->valuestring;
        const char *ptr = cJSON_GetObjectItemCaseSensitive(e, "pointer")->valuestring;
        char *schema_text = cJSON_PrintUnformatted(schema);
        char err[512] = "", name[96];
        ml_grammar *g = NULL;
        ml_status st = compile(schema_text, strlen(schema_text), &g, err, sizeof err);
        snprintf(name, sizeof name, "with %s", kw);
        if (st == ML_OK) {
            fprintf(stderr, "  schema %s compiled: proven by sampling\n", name);
            prove(f, g, schema, name);
        } else {
            check(st == ML_ERR_UNSUPPORTED || st == ML_ERR_INVALID_ARG,
                  "schema %s: refused as unsupported or invalid (status %d)", name, (int)st);
            check(strstr(err, kw) != NULL, "schema %s: the message names '%s': %s", name, kw,
                  err);
            check(ptr[0] == '\0' || strstr(err, ptr) != NULL,
                  "schema %s: the message names the pointer '%s': %s", name, ptr, err);
            fprintf(stderr, "  schema %s refused: %s\n", name, err);
        }
        ml_grammar_unref(g);
        free(schema_text);
    }
    cJSON_Delete(list);
}

/* ---- jsonschema's verdicts ---------------------------------------------------- */

/* g_byte_id from the fixture's vocabulary (Llama 3's first 256 ids are the
 * 256 bytes). */
static void find_byte_tokens(const ml_rt_fixture *f, int n_vocab)
{
    int found = 0;
    for (int b = 0; b < 256; b++)
        g_byte_id[b] = -1;
    for (int32_t id = 0; id < n_vocab; id++) {
        size_t len;
        char *text = decode(f, &id, 1, &len);
        if (len == 1 && g_byte_id[(unsigned char)text[0]] < 0) {
            g_byte_id[(unsigned char)text[0]] = id;
            found++;
        }
        free(text);
    }
    if (found != 256) {
        fprintf(stderr, "only %d of the 256 bytes have a token of their own\n", found);
        exit(1);
    }
}

/* 1 when the grammar takes text, fed byte by byte, as a complete document. */
static int grammar_takes(ml_grammar *g, const char *text)
{
    ml_grammar_state *s = NULL;
    char err[256] = "";
    if (ml_grammar_state_create(g, g_vocab, &s, err, sizeof err) != ML_OK) {
        fprintf(stderr, "state: %s\n", err);
        exit(1);
    }
    int ok = 1;
    for (const char *c = text; *c && ok; c++)
        ok = ml_grammar_state_accept(s, g_byte_id[(unsigned char)*c], err, sizeof err) == ML_OK;
    ok = ok && ml_grammar_state_complete(s);
    ml_grammar_state_destroy(s);
    return ok;
}

static void test_jsonschema_cases(void)
{
    size_t len;
    char *text = read_text(CASES_PATH, &len);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) {
        fprintf(stderr, "%s: not JSON\n", CASES_PATH);
        exit(1);
    }
    int compiled = 0, refused = 0, taken_valid = 0, taken_invalid = 0, left_valid = 0,
        left_invalid = 0;
    const cJSON *group;
    cJSON_ArrayForEach(group, cJSON_GetObjectItemCaseSensitive(root, "groups")) {
        char *schema = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(group, "schema"));
        char err[512] = "";
        ml_grammar *g = NULL;
        if (compile(schema, strlen(schema), &g, err, sizeof err) != ML_OK) {
            refused++;
            free(schema);
            continue;
        }
        compiled++;
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(group, "tests")) {
            const char *inst = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
            bool valid = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "valid"));
            int taken = grammar_takes(g, inst);
            check(!taken || valid, "schema %s: the grammar takes %s, which jsonschema judged invalid",
                  schema, inst);
            taken_valid += taken && valid;
            taken_invalid += taken && !valid;
            left_valid += !taken && valid;
            left_invalid += !taken && !valid;
        }
        ml_grammar_unref(g);
        free(schema);
    }
    fprintf(stderr,
            "  jsonschema's cases: %d schemas compiled, %d refused; taken: %d valid, %d invalid; "
            "left: %d valid, %d invalid\n",
            compiled, refused, taken_valid, taken_invalid, left_valid, left_invalid);
    cJSON_Delete(root);
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
    find_byte_tokens(&f, ml_model_config(f.model)->text.vocab_size);
    test_corpus(&f);
    test_refused(&f);
    test_jsonschema_cases();
    ml_json_vocab_destroy(g_vocab);
    ml_rt_fixture_close(&f);
    return check_done();
}
