/* `mllama tokenize`: encode or decode JSON lines with a tokenizer.json, for
 * scripts and for checking the tokenizer against HF by hand.
 * @locality: the main thread. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "engine.h"

#define DEFAULT_TOKENIZER "config/tokenizer/tokenizer.json"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mllama tokenize [--tokenizer FILE] [--decode [--skip-special]]\n"
            "\n"
            "Reads JSON lines on stdin and writes one JSON line per input line.\n"
            "  encode (default): {\"text\": \"...\"} -> {\"ids\": [...]}\n"
            "      no BOS is added; special-token text such as <|image|> becomes its id\n"
            "      (as HF encode(text, add_special_tokens=False)). The text cannot\n"
            "      contain U+0000.\n"
            "  --decode:         {\"ids\": [...]} -> {\"text\": \"...\"}\n"
            "      ill-formed UTF-8 becomes U+FFFD, as HF decode does\n"
            "  --skip-special    with --decode, drop special tokens\n"
            "  --tokenizer FILE  default %s\n"
            "A bad line is reported on stderr with its number and skipped; the exit\n"
            "status is then 1.\n",
            DEFAULT_TOKENIZER);
}

/* One line; returns false (message printed) when it is bad. */
static bool encode_line(const ml_tokenizer *tok, const cJSON *doc, size_t lineno,
                        ml_token_buf *ids)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(doc, "text");
    if (!cJSON_IsString(text)) {
        fprintf(stderr, "mllama tokenize: line %zu: expected {\"text\": string}\n", lineno);
        return false;
    }
    char err[256];
    ids->n = 0;
    if (ml_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring),
                            ML_ENCODE_PARSE_SPECIAL, ids, err, sizeof err) != ML_OK) {
        fprintf(stderr, "mllama tokenize: line %zu: %s\n", lineno, err);
        return false;
    }
    fputs("{\"ids\":[", stdout);
    for (size_t i = 0; i < ids->n; i++)
        printf(i ? ",%d" : "%d", (int)ids->ids[i]);
    fputs("]}\n", stdout);
    return true;
}

static bool decode_line(const ml_tokenizer *tok, const cJSON *doc, size_t lineno,
                        unsigned flags, ml_token_buf *ids)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, "ids");
    if (!cJSON_IsArray(arr)) {
        fprintf(stderr, "mllama tokenize: line %zu: expected {\"ids\": [integers]}\n", lineno);
        return false;
    }
    ids->n = 0;
    size_t k = 0;
    for (const cJSON *v = arr->child; v; v = v->next, k++) {
        double d = v->valuedouble;
        if (!cJSON_IsNumber(v) || d != floor(d) || d < INT32_MIN || d > INT32_MAX) {
            fprintf(stderr, "mllama tokenize: line %zu: ids[%zu] is not an integer\n", lineno, k);
            return false;
        }
        if (ml_token_buf_push(ids, (int32_t)d) != ML_OK) {
            fprintf(stderr, "mllama tokenize: line %zu: out of memory\n", lineno);
            return false;
        }
    }
    char err[256], *text;
    size_t len;
    if (ml_tokenizer_decode(tok, ids->ids, ids->n, flags | ML_DECODE_REPLACE_INVALID, &text,
                            &len, err, sizeof err) != ML_OK) {
        fprintf(stderr, "mllama tokenize: line %zu: %s\n", lineno, err);
        return false;
    }
    fputs("{\"text\":", stdout);
    svc_put_json_string(stdout, text, len);
    fputs("}\n", stdout);
    free(text);
    return true;
}

int cmd_tokenize(int argc, char **argv)
{
    static const struct option options[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"decode", no_argument, NULL, 'd'},
        {"skip-special", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *path = DEFAULT_TOKENIZER;
    bool decode = false;
    unsigned flags = 0;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 't': path = optarg; break;
        case 'd': decode = true; break;
        case 's': flags |= ML_DECODE_SKIP_SPECIAL; break;
        case 'h': usage(stdout); return SVC_EXIT_OK;
        default: usage(stderr); return SVC_EXIT_USAGE;
        }
    }
    if (optind != argc || (flags && !decode)) {
        usage(stderr);
        return SVC_EXIT_USAGE;
    }

    char err[512];
    ml_tokenizer *tok;
    if (ml_tokenizer_load(path, &tok, err, sizeof err) != ML_OK) {
        fprintf(stderr, "mllama tokenize: %s\n", err);
        return SVC_EXIT_FAILURE;
    }
    ml_token_buf ids;
    ml_token_buf_init(&ids);
    char *line = NULL;
    size_t cap = 0, lineno = 0, failed = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        cJSON *doc = cJSON_ParseWithLength(line, (size_t)n);
        bool ok;
        if (!doc) {
            fprintf(stderr, "mllama tokenize: line %zu: not valid JSON\n", lineno);
            ok = false;
        } else {
            ok = decode ? decode_line(tok, doc, lineno, flags, &ids)
                        : encode_line(tok, doc, lineno, &ids);
        }
        cJSON_Delete(doc);
        failed += !ok;
        fflush(stdout); /* one reply per request line, for use as a coprocess */
    }
    free(line);
    ml_token_buf_deinit(&ids);
    ml_tokenizer_destroy(tok);
    if (failed)
        fprintf(stderr, "mllama tokenize: %zu of %zu lines failed\n", failed, lineno);
    return failed ? SVC_EXIT_FAILURE : SVC_EXIT_OK;
}
