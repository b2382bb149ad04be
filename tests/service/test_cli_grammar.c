/* `mllama grammar` as a process, the way the benchmark drives it: JSON lines
 * in, one result line per input line out. Checks the contract's fields on a
 * schema with documents that are accepted, refused at a token and left
 * incomplete; a schema the compiler refuses (its message names the keyword);
 * the schema's text taken from the line as written (member order,
 * whitespace); and malformed lines, each answered {"compiled": false} while
 * the lines after them are still served, with exit status 1. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define TOKENIZER_DIR ML_SOURCE_DIR "/config/tokenizer"
#define LINE_BYTES 65536

/* The input lines; results[i] answers lines[i]. */
static const char *const lines[] = {
    /* 0: accepted, refused at a token, incomplete, empty, json.dumps style */
    "{\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}},"
    " \"required\": [\"a\"], \"additionalProperties\": false},"
    " \"tests\": [{\"text\": \"{\\\"a\\\":12}\"}, {\"text\": \"{\\\"a\\\": \\\"x\\\"}\"},"
    " {\"text\": \"{\\\"a\\\": 1\"}, {\"text\": \"\"}, {\"text\": \"{\\\"a\\\": 7}\"}]}",
    /* 1: refused at compile */
    "{\"schema\": {\"type\": \"array\", \"uniqueItems\": true}, \"tests\": [{\"text\": \"[]\"}]}",
    /* 2: not JSON */
    "{\"schema\": ",
    /* 3: members in another order, spaces around the punctuation */
    "  { \"tests\" : [ {\"text\": \"true\"}, {\"text\": \"1\"} ] ,"
    " \"schema\" : { \"type\" : \"boolean\" } }  ",
    /* 4-6: well-formed JSON, not the contract's shape */
    "[1, 2]",
    "{\"schema\": {}}",
    "{\"schema\": {}, \"tests\": [{\"text\": 1}]}",
    /* 7: still served after the bad lines */
    "{\"schema\": {\"enum\": [\"x\"]}, \"tests\": [{\"text\": \"\\\"x\\\"\"}]}",
};
#define N_LINES (sizeof lines / sizeof lines[0])

static cJSON *results[N_LINES];

/* Run the command on lines[], parse every output line; returns its exit
 * status (-1 when it did not exit normally). */
static int run_command(void)
{
    char in_path[] = "/tmp/mllama-grammar-XXXXXX";
    int fd = mkstemp(in_path);
    check(fd >= 0, "mkstemp");
    if (fd < 0)
        return -1;
    FILE *in = fdopen(fd, "w");
    for (size_t i = 0; i < N_LINES; i++)
        fprintf(in, "%s\n", lines[i]);
    fclose(in);

    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' grammar --tokenizer '%s' < '%s'", ML_MLLAMA_BIN,
             TOKENIZER_DIR, in_path);
    FILE *out = popen(cmd, "r");
    check(out != NULL, "popen %s", cmd);
    if (!out)
        return -1;
    static char line[LINE_BYTES];
    size_t n = 0;
    while (fgets(line, sizeof line, out)) {
        check(n < N_LINES, "more output lines than input lines: %s", line);
        if (n < N_LINES) {
            results[n] = cJSON_Parse(line);
            check(results[n] != NULL, "output line %zu is JSON: %s", n, line);
        }
        n++;
    }
    int st = pclose(out);
    unlink(in_path);
    check(n == N_LINES, "one output line per input line: %zu of %zu", n, N_LINES);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static bool compiled(size_t i)
{
    return cJSON_IsTrue(get(results[i], "compiled"));
}

static const cJSON *test_at(size_t line, int k)
{
    return cJSON_GetArrayItem(get(results[line], "tests"), k);
}

/* tokens, the walk's length and refused_at agree, whatever the verdict. */
static void check_walk(const cJSON *t, const char *what)
{
    const cJSON *tokens = get(t, "tokens"), *mask = get(t, "mask_us"),
                *refused = get(t, "refused_at");
    check(cJSON_IsNumber(tokens) && cJSON_IsArray(mask), "%s: tokens and mask_us", what);
    int walked = cJSON_GetArraySize(mask);
    if (refused)
        check(walked == refused->valueint + 1 && walked <= tokens->valueint,
              "%s: the walk stops at the refused token (%d masks, refused at %d)", what, walked,
              refused->valueint);
    else
        check(walked == tokens->valueint, "%s: one mask per token (%d of %d)", what, walked,
              tokens->valueint);
    for (const cJSON *m = mask ? mask->child : NULL; m; m = m->next)
        check(cJSON_IsNumber(m) && m->valuedouble >= 0, "%s: a mask time is a duration", what);
}

static void check_documents(void)
{
    check(compiled(0), "line 0 compiles");
    check(cJSON_IsNumber(get(results[0], "compile_us")), "compile_us");
    check(cJSON_GetArraySize(get(results[0], "tests")) == 5, "five results on line 0");
    const char *names[] = {"{\"a\":12}", "{\"a\": \"x\"}", "{\"a\": 1", "\"\"", "{\"a\": 7}"};
    const bool accepted[] = {true, false, false, false, true};
    const bool refused[] = {false, true, false, false, false};
    for (int k = 0; k < 5; k++) {
        const cJSON *t = test_at(0, k);
        check(cJSON_IsBool(get(t, "accepted")) && cJSON_IsTrue(get(t, "accepted")) == accepted[k],
              "%s: accepted %d", names[k], accepted[k]);
        check((get(t, "refused_at") != NULL) == refused[k], "%s: refused at a token: %d",
              names[k], refused[k]);
        check_walk(t, names[k]);
    }
    const cJSON *empty = test_at(0, 3);
    check(get(empty, "tokens") && get(empty, "tokens")->valueint == 0, "the empty text: no token");
}

static void check_refusals(void)
{
    check(!compiled(1), "uniqueItems is refused");
    const cJSON *err = get(results[1], "error");
    check(cJSON_IsString(err) && strstr(err->valuestring, "uniqueItems"),
          "the refusal names the keyword: %s", cJSON_IsString(err) ? err->valuestring : "(none)");
    check(cJSON_GetArraySize(get(results[1], "tests")) == 0, "no test results when refused");

    check(compiled(3), "the schema member found after tests, with spaces");
    check(cJSON_IsTrue(get(test_at(3, 0), "accepted")), "true is a boolean");
    check(cJSON_IsFalse(get(test_at(3, 1), "accepted")), "1 is not a boolean");

    for (size_t i = 2; i <= 6; i++) {
        if (i == 3)
            continue;
        check(results[i] && !compiled(i) && cJSON_IsString(get(results[i], "error")),
              "line %zu (malformed) answered compiled:false with an error", i);
    }
    check(compiled(7) && cJSON_IsTrue(get(test_at(7, 0), "accepted")),
          "a good line after the malformed ones is served");
}

int main(void)
{
    if (access(ML_MLLAMA_BIN, X_OK) != 0) {
        fprintf(stderr, "test_cli_grammar: %s not built\n", ML_MLLAMA_BIN);
        return 1;
    }
    int status = run_command();
    check(status == 1, "exit status 1 after malformed lines (got %d)", status);
    if (results[0])
        check_documents();
    check_refusals();
    for (size_t i = 0; i < N_LINES; i++)
        cJSON_Delete(results[i]);
    return check_done();
}
