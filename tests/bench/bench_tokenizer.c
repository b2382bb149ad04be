/* Tokenizer throughput: load time, then encode of a ~1 MiB mixed-language
 * text as one call and line by line, single thread.
 *
 *     ML_BENCH=1 bench_tokenizer [--text FILE] [--write-text FILE] [--tokenizer FILE]
 *
 * Without ML_BENCH=1 it exits 77 (skipped) at once, so ctest's bench label
 * costs nothing unless asked for. Without --text the text is built from
 * tests/golden/tokenizer_corpus.jsonl: corpus lines in a fixed pseudo-random
 * order, joined by "\n", up to BENCH_TEXT_BYTES; --write-text saves it so
 * tests/bench/tokenizer.sh can give HF `tokenizers` the very same input.
 * Output lines are "key value" pairs the driver script parses. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_util.h"

#define CORPUS_PATH ML_SOURCE_DIR "/tests/golden/tokenizer_corpus.jsonl"
#define BENCH_TEXT_BYTES (1u << 20)
#define MIN_REPEATS 3
#define MIN_SECONDS 1.0
/* Numerical Recipes LCG: a fixed, portable shuffle. */
#define LCG_MUL 1664525u
#define LCG_ADD 1013904223u
#define LCG_SEED 20240726u

/* The corpus texts, shuffled and concatenated with "\n" up to the target
 * size. NULL when the corpus cannot be read or memory runs out. */
static char *build_text(size_t *len)
{
    size_t clen;
    char *corpus = ml_tok_read_file(CORPUS_PATH, &clen);
    char **lines = calloc(clen / 2 + 1, sizeof *lines); /* a line takes >= 2 bytes */
    char *text = malloc(BENCH_TEXT_BYTES);
    size_t n = 0, used = 0;
    bool ok = corpus && lines && text;
    for (char *p = ok ? strtok(corpus, "\n") : NULL; p && ok; p = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(p);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (cJSON_IsString(t) && t->valuestring[0])
            ok = (lines[n++] = strdup(t->valuestring)) != NULL;
        cJSON_Delete(j);
    }
    uint32_t state = LCG_SEED;
    while (ok && n) {
        state = state * LCG_MUL + LCG_ADD;
        const char *line = lines[(state >> 8) % n];
        size_t l = strlen(line);
        if (used + l + 1 > BENCH_TEXT_BYTES)
            break;
        memcpy(text + used, line, l);
        used += l;
        text[used++] = '\n';
    }
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
    free(corpus);
    if (!ok) {
        free(text);
        return NULL;
    }
    *len = used;
    return text;
}

/* Best time of at least MIN_REPEATS runs and MIN_SECONDS; returns tokens of one run. */
static size_t time_whole(const ml_tokenizer *tok, const char *text, size_t len, double *best)
{
    ml_token_buf buf;
    ml_token_buf_init(&buf);
    *best = 1e30;
    double start = ml_tok_now();
    for (int r = 0; r < MIN_REPEATS || ml_tok_now() - start < MIN_SECONDS; r++) {
        buf.n = 0;
        double t0 = ml_tok_now();
        ml_tokenizer_encode(tok, text, len, ML_ENCODE_PARSE_SPECIAL, &buf, NULL, 0);
        double dt = ml_tok_now() - t0;
        *best = dt < *best ? dt : *best;
    }
    size_t n = buf.n;
    ml_token_buf_deinit(&buf);
    return n;
}

static size_t time_lines(const ml_tokenizer *tok, const char *text, size_t len, double *best)
{
    ml_token_buf buf;
    ml_token_buf_init(&buf);
    *best = 1e30;
    size_t total = 0;
    double start = ml_tok_now();
    for (int r = 0; r < MIN_REPEATS || ml_tok_now() - start < MIN_SECONDS; r++) {
        total = 0;
        double t0 = ml_tok_now();
        for (size_t i = 0; i < len;) {
            const char *nl = memchr(text + i, '\n', len - i);
            size_t l = nl ? (size_t)(nl - (text + i)) : len - i;
            buf.n = 0;
            ml_tokenizer_encode(tok, text + i, l, ML_ENCODE_PARSE_SPECIAL, &buf, NULL, 0);
            total += buf.n;
            i += l + 1;
        }
        double dt = ml_tok_now() - t0;
        *best = dt < *best ? dt : *best;
    }
    ml_token_buf_deinit(&buf);
    return total;
}

int main(int argc, char **argv)
{
    ml_bench_require();
    const char *text_path = NULL, *write_path = NULL, *tok_path = ML_TOK_REAL_PATH;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--text"))
            text_path = argv[i + 1];
        else if (!strcmp(argv[i], "--write-text"))
            write_path = argv[i + 1];
        else if (!strcmp(argv[i], "--tokenizer"))
            tok_path = argv[i + 1];
        else {
            fprintf(stderr, "bench_tokenizer: unknown option %s\n", argv[i]);
            return 2;
        }
    }

    size_t len;
    char *text = text_path ? ml_tok_read_file(text_path, &len) : build_text(&len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: cannot read the benchmark text\n");
        return 1;
    }
    if (write_path) {
        FILE *f = fopen(write_path, "wb");
        if (!f || fwrite(text, 1, len, f) != len || fclose(f)) {
            fprintf(stderr, "bench_tokenizer: cannot write %s\n", write_path);
            return 1;
        }
    }

    double load_s;
    ml_tokenizer *tok = ml_tok_load(tok_path, &load_s);

    double whole_s, lines_s;
    size_t whole_n = time_whole(tok, text, len, &whole_s);
    size_t lines_n = time_lines(tok, text, len, &lines_s);
    printf("text_bytes %zu\n", len);
    printf("load_seconds %.4f\n", load_s);
    printf("whole_tokens %zu\n", whole_n);
    printf("whole_seconds %.5f\n", whole_s);
    printf("whole_tokens_per_s %.0f\n", (double)whole_n / whole_s);
    printf("whole_mb_per_s %.2f\n", (double)len / whole_s / 1e6);
    printf("lines_tokens %zu\n", lines_n);
    printf("lines_seconds %.5f\n", lines_s);
    printf("lines_tokens_per_s %.0f\n", (double)lines_n / lines_s);
    ml_tokenizer_destroy(tok);
    free(text);
    return 0;
}
