/* `mllama run --batch`'s decode_steps (service/cli/cmd_run_batch.c), which
 * tests/bench/roofline.sh reads: on the micro model,
 * - requests submitted at once whose prompts prefill in one step: every
 *   token after each request's first comes from a decode-only step, so the
 *   groups' sequences x steps add up to the completion tokens less one a
 *   request, and a group of all of them exists;
 * - requests one after the other ("after"): every decode-only step decoded
 *   one sequence;
 * and each group's times are ordered (0 < min <= median <= max). */
#include <cjson/cJSON.h>
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

/* The aggregate object (owned by *doc) of `mllama run --batch` over lines,
 * or NULL with the failure checked. */
static const cJSON *run_aggregate(const char *name, const char *lines, cJSON **doc)
{
    char batch[PU_PATH_MAX + 32], cmd[4 * PU_PATH_MAX];
    snprintf(batch, sizeof batch, "%s/%s.jsonl", dir, name);
    if (!pu_write_file(batch, lines, strlen(lines)))
        pu_die("batch file");
    snprintf(cmd, sizeof cmd, PU_MLLAMA " run --threads 1 --model %s --batch %s 2>&1", model,
             batch);
    int code = -1;
    char *out = pu_shell(cmd, &code);
    check(code == 0 && out, "%s: exit %d: %s", name, code, out ? out : "");
    /* The aggregate is the last line. */
    char *last = out ? strstr(out, "{\"aggregate\"") : NULL;
    *doc = last ? cJSON_Parse(last) : NULL;
    free(out);
    const cJSON *agg = cJSON_GetObjectItemCaseSensitive(*doc, "aggregate");
    check(agg != NULL, "%s: no aggregate line", name);
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
    return check_done();
}
