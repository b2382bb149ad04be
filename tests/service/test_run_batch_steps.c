/* `mllama run --batch`'s decode_steps (service/cli/cmd_run_batch.c), which
 * tests/bench/roofline.sh reads: on the micro model,
 * - requests submitted at once whose prompts prefill in one step: every
 *   token after each request's first comes from a decode-only step, so the
 *   groups' sequences x steps add up to the completion tokens less one a
 *   request, and a group of all of them exists;
 * - requests one after the other ("after"): every decode-only step decoded
 *   one sequence;
 * and each group's times are ordered (0 < min <= median <= max);
 * - "logit_bias" and "ignore_eos": an end token forced by its bias ends a
 *   request at once, and its twin with ignore_eos goes on to max_tokens;
 *   a malformed bias is refused;
 * - "warm_up": the aggregate counts the other requests, and only steps run
 *   once every warm-up request has finished: two warm-up requests, then one
 *   after them, give a group of one sequence and no group of two, and the
 *   one request's tokens; the warm-up results are marked;
 * - --logits-out: one row of the vocabulary's logits per token, the greedy
 *   token each row's first maximum, and the tokens those of the same run
 *   without it (which samples where the logits are, as the batches above
 *   and the worker do, rather than from a downloaded row);
 * - --weights-read: the aggregate's read of the packed weights. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc_util.h"

#define MAX_TOKENS 6

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16];

static void cleanup(void)
{
    pu_tmpdir_done(dir);
}

/* The output of `mllama run --batch` over lines with flags (malloc'd,
 * stderr included) and its exit code in *code. */
static char *run_lines(const char *name, const char *lines, const char *flags, int *code)
{
    char batch[PU_PATH_MAX + 32], cmd[4 * PU_PATH_MAX];
    snprintf(batch, sizeof batch, "%s/%s.jsonl", dir, name);
    if (!pu_write_file(batch, lines, strlen(lines)))
        pu_die("batch file");
    snprintf(cmd, sizeof cmd, PU_MLLAMA " run --threads 1 --model %s --batch %s %s 2>&1", model,
             batch, flags);
    *code = -1;
    return pu_shell(cmd, code);
}

/* The same without flags, its success checked. */
static char *run_batch(const char *name, const char *lines)
{
    int code;
    char *out = run_lines(name, lines, "", &code);
    check(code == 0 && out, "%s: exit %d: %s", name, code, out ? out : "");
    return out;
}

/* The aggregate object (owned by *doc) of the output of run `name`, or
 * NULL with the failure checked. */
static const cJSON *aggregate_of(const char *name, const char *out, cJSON **doc)
{
    /* The aggregate is the last line. */
    const char *last = out ? strstr(out, "{\"aggregate\"") : NULL;
    *doc = last ? cJSON_Parse(last) : NULL;
    const cJSON *agg = cJSON_GetObjectItemCaseSensitive(*doc, "aggregate");
    check(agg != NULL, "%s: no aggregate line", name);
    return agg;
}

/* The aggregate object (owned by *doc) of `mllama run --batch` over lines,
 * or NULL with the failure checked. */
static const cJSON *run_aggregate(const char *name, const char *lines, cJSON **doc)
{
    char *out = run_batch(name, lines);
    const cJSON *agg = aggregate_of(name, out, doc);
    free(out);
    return agg;
}

/* Checks the groups of agg's decode_steps; returns the decoded tokens they
 * account for (sequences x steps) and the largest group's sequences. */
static int check_groups(const char *name, const cJSON *agg, int *max_seqs)
{
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(agg, "decode_steps"), *g;
    check(cJSON_IsArray(groups), "%s: no decode_steps array", name);
    int tokens = 0;
    *max_seqs = 0;
    cJSON_ArrayForEach(g, groups)
    {
        const int seqs = cJSON_GetObjectItemCaseSensitive(g, "seqs")->valueint;
        const int steps = cJSON_GetObjectItemCaseSensitive(g, "steps")->valueint;
        const double lo = cJSON_GetObjectItemCaseSensitive(g, "min_ms")->valuedouble,
                     mid = cJSON_GetObjectItemCaseSensitive(g, "median_ms")->valuedouble,
                     hi = cJSON_GetObjectItemCaseSensitive(g, "max_ms")->valuedouble;
        check(seqs > *max_seqs, "%s: groups by increasing seqs (%d after %d)", name, seqs,
              *max_seqs);
        check(steps > 0 && lo > 0 && lo <= mid && mid <= hi,
              "%s: seqs %d: steps %d, min %g, median %g, max %g", name, seqs, steps, lo, mid,
              hi);
        tokens += seqs * steps;
        *max_seqs = seqs;
    }
    return tokens;
}

static int completion_tokens(const cJSON *agg)
{
    return cJSON_GetObjectItemCaseSensitive(agg, "completion_tokens")->valueint;
}

/* Result `index` of a batch's output (owned by the caller), or NULL. */
static cJSON *result(const char *out, int index)
{
    for (const char *line = out; line && *line;) {
        const char *next = strchr(line, '\n');
        cJSON *r = cJSON_ParseWithOpts(line, NULL, false);
        line = next ? next + 1 : NULL;
        const cJSON *i = cJSON_GetObjectItemCaseSensitive(r, "index");
        if (cJSON_IsNumber(i) && i->valueint == index)
            return r;
        cJSON_Delete(r);
    }
    return NULL;
}

static bool finished(const cJSON *r, const char *why)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(r, "finish_reason");
    return cJSON_IsString(f) && !strcmp(f->valuestring, why);
}

/* "logit_bias" +100 on an end token makes it every token drawn: the plain
 * request ends at once, its twin with "ignore_eos" draws it max_tokens
 * times; -100 on another token, and a malformed bias refused. */
static void test_bias_and_ignore_eos(void)
{
    char lines[512];
    const char *req = "\"ids\":\"128000,1,2,3\",\"max_tokens\":" PU_XSTR(MAX_TOKENS)
                      ",\"logit_bias\":{\"" PU_XSTR(PU_EOT) "\":100,\"5\":-100}";
    snprintf(lines, sizeof lines, "{%s}\n{%s,\"ignore_eos\":true}\n", req, req);
    char *out = run_batch("ignore_eos", lines);
    cJSON *plain = out ? result(out, 0) : NULL, *twin = out ? result(out, 1) : NULL;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(plain, "output_ids");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(twin, "output_ids");
    check(finished(plain, "stop") && cJSON_GetArraySize(a) == 0,
          "logit_bias: an end token forced ends the request at once (%d tokens)",
          cJSON_GetArraySize(a));
    int all_end = cJSON_GetArraySize(b) == MAX_TOKENS;
    for (int t = 0; all_end && t < MAX_TOKENS; t++)
        all_end = cJSON_GetArrayItem(b, t)->valueint == PU_EOT;
    check(finished(twin, "length") && all_end,
          "ignore_eos: the forced end token, max_tokens times, finish length");
    cJSON_Delete(plain);
    cJSON_Delete(twin);
    free(out);

    int code;
    char *err = run_lines("bad_bias", "{\"ids\":\"1,2\",\"logit_bias\":{\"x1\":5}}\n", "", &code);
    check(code != 0 && err && strstr(err, "\"logit_bias\" must map token ids to numbers"),
          "a malformed logit_bias is refused: exit %d: %s", code, err ? err : "");
    free(err);
}

static void test_warm_up(void)
{
    char lines[512];
    snprintf(lines, sizeof lines,
             "{\"ids\":\"1,2,3,4\",\"max_tokens\":%d,\"warm_up\":true}\n"
             "{\"ids\":\"5,6,7,8\",\"max_tokens\":%d,\"warm_up\":true}\n"
             "{\"ids\":\"9,10,11,12\",\"max_tokens\":%d,\"after\":1}\n",
             MAX_TOKENS, MAX_TOKENS, MAX_TOKENS);
    char *out = run_batch("warm_up", lines);
    cJSON *first = out ? result(out, 0) : NULL, *last = out ? result(out, 2) : NULL;
    check(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(first, "warm_up")) &&
              !cJSON_GetObjectItemCaseSensitive(last, "warm_up"),
          "warm_up: the warm-up results are marked, the others not");
    cJSON *doc;
    const cJSON *agg = aggregate_of("warm_up", out, &doc);
    const cJSON *requests = cJSON_GetObjectItemCaseSensitive(agg, "requests");
    const cJSON *warm = cJSON_GetObjectItemCaseSensitive(agg, "warm_up_requests");
    check(cJSON_IsNumber(requests) && requests->valueint == 1 && cJSON_IsNumber(warm) &&
              warm->valueint == 2,
          "warm_up: the aggregate counts 1 request and 2 warm-up ones");
    const cJSON *last_ids = cJSON_GetObjectItemCaseSensitive(last, "output_ids");
    check(agg && completion_tokens(agg) == cJSON_GetArraySize(last_ids),
          "warm_up: the aggregate's tokens are the measured request's (%d)",
          cJSON_GetArraySize(last_ids));
    if (agg) {
        int max_seqs;
        const int tokens = check_groups("warm_up", agg, &max_seqs);
        check(max_seqs == 1 && tokens == completion_tokens(agg) - 1,
              "warm_up: only the measured request's steps (%d tokens, up to %d sequences)",
              tokens, max_seqs);
    }
    cJSON_Delete(doc);
    cJSON_Delete(first);
    cJSON_Delete(last);
    free(out);
}

/* --weights-read: the aggregate gets the read of the packed weights, whose
 * rate is its bytes over its time; without the flag it has none; and the
 * flag without --batch, which has no aggregate, is refused. */
static void test_weights_read(void)
{
    const char *line = "{\"ids\":\"1,2,3,4\",\"max_tokens\":2}\n";
    int code;
    char *out = run_lines("weights_read", line, "--weights-read", &code);
    check(code == 0, "--weights-read: exit %d: %s", code, out ? out : "");
    cJSON *doc;
    const cJSON *agg = aggregate_of("weights_read", out, &doc);
    const cJSON *wr = cJSON_GetObjectItemCaseSensitive(agg, "weights_read");
    const double bytes = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(wr, "bytes"));
    const double ms = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(wr, "ms"));
    const double gbs = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(wr, "gb_per_s"));
    check(bytes > 0 && ms > 0 && gbs > 0 && fabs(gbs - bytes / ms / 1e6) <= 1e-9 * gbs,
          "--weights-read: %g bytes in %g ms at %g GB/s", bytes, ms, gbs);
    cJSON_Delete(doc);
    free(out);

    out = run_batch("no_weights_read", line);
    agg = aggregate_of("no_weights_read", out, &doc);
    check(agg && !cJSON_GetObjectItemCaseSensitive(agg, "weights_read"),
          "without --weights-read the aggregate has no weights_read");
    cJSON_Delete(doc);
    free(out);

    char cmd[4 * PU_PATH_MAX];
    snprintf(cmd, sizeof cmd, PU_MLLAMA " run --threads 1 --model %s --ids 1,2 --weights-read 2>&1",
             model);
    out = pu_shell(cmd, &code);
    check(code != 0 && out && strstr(out, "--weights-read reports in a --batch run's aggregate"),
          "--weights-read without --batch is refused: exit %d: %s", code, out ? out : "");
    free(out);
}

/* The output ids of `mllama run --json` on the ids 1,2,3,4, and with
 * --logits-out to npy when it is not NULL; NULL when the run failed. */
static cJSON *run_single(const char *npy)
{
    char cmd[4 * PU_PATH_MAX], out_arg[PU_PATH_MAX + 16] = "";
    if (npy)
        snprintf(out_arg, sizeof out_arg, "--logits-out %s", npy);
    snprintf(cmd, sizeof cmd,
             PU_MLLAMA " run --threads 1 --model %s --ids 1,2,3,4 --max-tokens %d --json %s"
                       " 2>/dev/null",
             model, MAX_TOKENS, out_arg);
    int code = -1;
    char *out = pu_shell(cmd, &code);
    cJSON *doc = code == 0 && out ? cJSON_Parse(out) : NULL;
    free(out);
    check(doc != NULL, "run --json%s: exit %d", npy ? " --logits-out" : "", code);
    cJSON *ids = cJSON_DetachItemFromObjectCaseSensitive(doc, "output_ids");
    cJSON_Delete(doc);
    return ids;
}

/* A row's first maximum. */
static int row_argmax(const float *row, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return (int)best;
}

static void test_logits_out(void)
{
    char npy[PU_PATH_MAX + 16];
    snprintf(npy, sizeof npy, "%s/logits.npy", dir);
    cJSON *with = run_single(npy), *without = run_single(NULL);
    check(with && without && cJSON_Compare(with, without, true),
          "--logits-out: the same tokens as without it");
    size_t len = 0;
    char *bytes = pu_slurp(npy, &len);
    /* An .npy v1 file: magic and version (8 bytes), the header's length
     * (2, little-endian), the header, then the rows. */
    const size_t preamble = 10;
    size_t rows = 0, vocab = 0;
    const char *shape = bytes && len > preamble ? strstr(bytes + preamble, "'shape': (") : NULL;
    const size_t data = bytes && len > preamble
                            ? preamble + ((size_t)(uint8_t)bytes[8] | (size_t)(uint8_t)bytes[9] << 8)
                            : 0;
    check(shape && sscanf(shape, "'shape': (%zu, %zu)", &rows, &vocab) == 2 &&
              rows == (size_t)cJSON_GetArraySize(with) && vocab > 0 &&
              len == data + rows * vocab * sizeof(float),
          "--logits-out: %zu rows of %zu logits for %d tokens (%zu bytes)", rows, vocab,
          cJSON_GetArraySize(with), len);
    /* Each row copied out of the char buffer before it is read as floats. */
    float *row = vocab ? malloc(vocab * sizeof *row) : NULL;
    for (size_t r = 0; row && r < rows && len == data + rows * vocab * sizeof *row; r++) {
        memcpy(row, bytes + data + r * vocab * sizeof *row, vocab * sizeof *row);
        const int token = cJSON_GetArrayItem(with, (int)r)->valueint;
        check(row_argmax(row, vocab) == token, "--logits-out: row %zu's maximum is token %d",
              r, token);
    }
    free(row);
    free(bytes);
    cJSON_Delete(with);
    cJSON_Delete(without);
}

int main(void)
{
    atexit(cleanup);
    pu_tmpdir("run-batch-steps", dir);
    snprintf(model, sizeof model, "%s/micro", dir);
    char log[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    if (!pu_make_model(model, log))
        pu_die("mkmodel");

    char lines[512];
    cJSON *doc;
    int max_seqs;
    snprintf(lines, sizeof lines,
             "{\"ids\":\"1,2,3,4\",\"max_tokens\":%d}\n"
             "{\"ids\":\"5,6,7,8\",\"max_tokens\":%d}\n"
             "{\"ids\":\"9,10,11,12\",\"max_tokens\":%d}\n",
             MAX_TOKENS, MAX_TOKENS, MAX_TOKENS);
    const cJSON *agg = run_aggregate("together", lines, &doc);
    if (agg) {
        const int tokens = check_groups("together", agg, &max_seqs);
        check(tokens == completion_tokens(agg) - 3,
              "together: decode steps account for %d tokens of %d (3 first tokens)", tokens,
              completion_tokens(agg));
        check(max_seqs == 3 || completion_tokens(agg) < 3 * MAX_TOKENS,
              "together: no step decoded all 3, yet none ended early");
    }
    cJSON_Delete(doc);

    snprintf(lines, sizeof lines,
             "{\"ids\":\"1,2,3,4\",\"max_tokens\":%d}\n"
             "{\"ids\":\"5,6,7,8\",\"max_tokens\":%d,\"after\":0}\n",
             MAX_TOKENS, MAX_TOKENS);
    agg = run_aggregate("after", lines, &doc);
    if (agg) {
        const int tokens = check_groups("after", agg, &max_seqs);
        check(tokens == completion_tokens(agg) - 2 && max_seqs <= 1,
              "after: %d tokens in decode steps of up to %d sequences, %d generated", tokens,
              max_seqs, completion_tokens(agg));
    }
    cJSON_Delete(doc);

    test_bias_and_ignore_eos();
    test_warm_up();
    test_logits_out();
    test_weights_read();
    return check_done();
}
