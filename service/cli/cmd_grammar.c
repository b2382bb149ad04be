/* `mllama grammar`: the offline contract of structured outputs, for the
 * benchmark (tests/bench/grammar/) and for anyone debugging a schema. Each
 * input line is a schema and documents; each output line says whether the
 * schema compiles and whether the engine's token masks let each document
 * through, token by token, as generation would.
 * @locality: the main thread. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "engine.h"
#include "protocol/json_span.h"

#define CMD "mllama grammar"
/* Llama 3.2 Vision's logit count: the grammar's vocabulary is the output
 * vocabulary, without <|image|> (128256, no logit row). */
#define GRAMMAR_N_VOCAB 128256
#define ERR_BYTES 512

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mllama grammar [--tokenizer DIR]\n"
            "\n"
            "Reads JSON lines on stdin and writes one JSON line per input line:\n"
            "  {\"schema\": <JSON Schema>, \"tests\": [{\"text\": \"<a document>\"}, ...]}\n"
            "  -> {\"compiled\": true|false, \"error\": \"<why, when not compiled>\",\n"
            "      \"compile_us\": N, \"tests\": [{\"accepted\": true|false, \"tokens\": N,\n"
            "      \"mask_us\": [...], \"refused_at\": K}, ...]}\n"
            "Each text is tokenized without BOS (special-token text becomes its id, as\n"
            "HF encode(text, add_special_tokens=False)) and walked token by token: the\n"
            "mask is computed, the token checked against it and accepted. accepted:\n"
            "every token was allowed and the document is complete after the last one.\n"
            "tokens: the text's token count; mask_us: per token walked, microseconds\n"
            "(0.1 resolution) of mask, check and accept; refused_at: the index of the\n"
            "refused token, when one was (the walk stops there). compile_us: the\n"
            "compilation (or refusal) time. The schema is compiled with the default\n"
            "limits, from its text exactly as it appears in the line. A line that is\n"
            "not such an object gets {\"compiled\": false, \"error\": ...} and the exit\n"
            "status is then 1.\n"
            "  --tokenizer DIR  a folder with tokenizer.json, or the file itself\n"
            "                   (default %s)\n",
            ML_DEFAULT_TOKENIZER_DIR);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* What every line needs, made once. */
typedef struct grammar_ctx {
    ml_tokenizer *tok;       /* owned */
    ml_json_vocab *vocab;    /* owned: the token trie of the output vocabulary */
    uint64_t *mask;          /* owned: ml_json_vocab_mask_words words */
    ml_schema_limits limits;
    ml_token_buf ids;
} grammar_ctx;

static void put_refusal(const char *error, double compile_us)
{
    fputs("{\"compiled\":false,\"error\":", stdout);
    svc_put_json_string(stdout, error, strlen(error));
    if (compile_us >= 0)
        printf(",\"compile_us\":%.0f", compile_us);
    fputs(",\"tests\":[]}\n", stdout);
}

/* Walk one document through state s (at its start) and print its result. */
static void run_test(grammar_ctx *c, ml_grammar_state *s, const char *text, size_t len)
{
    char err[ERR_BYTES];
    c->ids.n = 0;
    if (ml_tokenizer_encode(c->tok, text, len, ML_ENCODE_PARSE_SPECIAL, &c->ids, err,
                            sizeof err) != ML_OK) {
        fputs("{\"accepted\":false,\"tokens\":0,\"mask_us\":[],\"error\":", stdout);
        svc_put_json_string(stdout, err, strlen(err));
        fputc('}', stdout);
        return;
    }
    printf("{\"tokens\":%zu,\"mask_us\":[", c->ids.n);
    size_t refused_at = SIZE_MAX;
    for (size_t i = 0; i < c->ids.n; i++) {
        int32_t t = c->ids.ids[i];
        double t0 = now_us();
        ml_grammar_state_allowed(s, c->mask);
        bool ok = t >= 0 && t < GRAMMAR_N_VOCAB && (c->mask[t >> 6] >> (t & 63) & 1) &&
                  ml_grammar_state_accept(s, t, err, sizeof err) == ML_OK;
        printf(i ? ",%.1f" : "%.1f", now_us() - t0);
        if (!ok) {
            refused_at = i;
            break;
        }
    }
    fputc(']', stdout);
    if (refused_at != SIZE_MAX)
        printf(",\"refused_at\":%zu,\"accepted\":false}", refused_at);
    else
        printf(",\"accepted\":%s}", ml_grammar_state_complete(s) ? "true" : "false");
}

/* One input line; prints its output line. Returns false when the line is
 * not a well-formed request (a schema the compiler refuses is a result). */
static bool run_line(grammar_ctx *c, const char *line, size_t len)
{
    cJSON *doc = cJSON_ParseWithLength(line, len);
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(doc, "tests");
    /* The schema's text as written: its numbers as written, not as cJSON's
     * doubles. */
    svc_span root = svc_json_value(line, len);
    svc_span schema = svc_json_is(root, '{') ? svc_json_member(root, "schema") : root;
    bool ok = cJSON_IsObject(doc) && cJSON_IsArray(tests) && svc_json_is(root, '{') && schema.p;
    for (const cJSON *t = ok ? tests->child : NULL; ok && t; t = t->next)
        ok = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(t, "text"));
    if (!ok) {
        put_refusal("bad input line: expected {\"schema\": <JSON Schema>, "
                    "\"tests\": [{\"text\": string}, ...]}",
                    -1);
        cJSON_Delete(doc);
        return false;
    }

    char err[ERR_BYTES];
    ml_grammar *g = NULL;
    ml_grammar_state *s = NULL;
    double t0 = now_us();
    ml_status st = ml_grammar_compile_schema(schema.p, schema.n, &c->limits, &g, err, sizeof err);
    double compile_us = now_us() - t0;
    if (st == ML_OK)
        st = ml_grammar_state_create(g, c->vocab, &s, err, sizeof err);
    if (st != ML_OK) {
        put_refusal(err, compile_us);
    } else {
        printf("{\"compiled\":true,\"compile_us\":%.0f,\"tests\":[", compile_us);
        for (const cJSON *t = tests->child; t; t = t->next) {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(t, "text");
            ml_grammar_state_reset(s);
            run_test(c, s, text->valuestring, strlen(text->valuestring));
            if (t->next)
                fputc(',', stdout);
        }
        fputs("]}\n", stdout);
    }
    ml_grammar_state_destroy(s);
    ml_grammar_unref(g);
    cJSON_Delete(doc);
    return true;
}

/* The tokenizer.json of --tokenizer: DIR/tokenizer.json, or the path itself
 * when it is a file. Owned by the caller (free). */
static char *tokenizer_path(const char *arg)
{
    struct stat st;
    bool dir = stat(arg, &st) == 0 && S_ISDIR(st.st_mode);
    size_t n = strlen(arg) + sizeof "/tokenizer.json";
    char *path = malloc(n);
    if (path)
        snprintf(path, n, dir ? "%s/tokenizer.json" : "%s", arg);
    return path;
}

static int grammar_main(const char *tok_arg)
{
    char err[ERR_BYTES];
    grammar_ctx c = {0};
    int status = SVC_EXIT_FAILURE;
    char *path = tokenizer_path(tok_arg);
    if (!path) {
        fprintf(stderr, CMD ": out of memory\n");
        return SVC_EXIT_FAILURE;
    }
    ml_schema_limits_default(&c.limits);
    ml_token_buf_init(&c.ids);
    if (ml_tokenizer_load(path, &c.tok, err, sizeof err) != ML_OK ||
        ml_json_vocab_create(c.tok, GRAMMAR_N_VOCAB, &c.vocab, err, sizeof err) != ML_OK) {
        fprintf(stderr, CMD ": %s\n", err);
        goto out;
    }
    c.mask = malloc(ml_json_vocab_mask_words(c.vocab) * sizeof *c.mask);
    if (!c.mask) {
        fprintf(stderr, CMD ": out of memory\n");
        goto out;
    }

    char *line = NULL;
    size_t cap = 0, lineno = 0, bad = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        bad += !run_line(&c, line, (size_t)n);
        fflush(stdout); /* one reply per request line, for use as a coprocess */
    }
    free(line);
    if (bad)
        fprintf(stderr, CMD ": %zu of %zu lines were not {\"schema\", \"tests\"} objects\n",
                bad, lineno);
    status = bad ? SVC_EXIT_FAILURE : SVC_EXIT_OK;
out:
    free(c.mask);
    ml_json_vocab_destroy(c.vocab);
    ml_tokenizer_destroy(c.tok);
    ml_token_buf_deinit(&c.ids);
    free(path);
    return status;
}

int cmd_grammar(int argc, char **argv)
{
    static const struct option options[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tok_arg = ML_DEFAULT_TOKENIZER_DIR;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 't': tok_arg = optarg; break;
        case 'h': usage(stdout); return SVC_EXIT_OK;
        default: usage(stderr); return SVC_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return SVC_EXIT_USAGE;
    }
    return grammar_main(tok_arg);
}
