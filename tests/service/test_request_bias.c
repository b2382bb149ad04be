/* Part 3 of test_request (one executable, test_request.h): logit_bias as
 * the parser takes it: OpenAI's shape ({"<token id>": bias}), its fixed
 * bounds (300 entries, [-100, 100]), ids in decimal, each once, below the
 * model's output vocabulary (limits.logit_vocab), and a clear error for
 * each refusal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_request.h"

/* Llama 3.2 Vision: 128256 logits; <|image|> is 128256, past the last. */
#define VOCAB 128256

/* A request with "logit_bias": obj, parsed under limits with logit_vocab
 * VOCAB. */
static svc_error parse_bias(const char *obj, svc_request **req, char *err, size_t errlen)
{
    size_t n = strlen(",\"logit_bias\":") + strlen(obj) + 1;
    char *extra = malloc(n);
    char *json = NULL;
    if (extra) {
        snprintf(extra, n, ",\"logit_bias\":%s", obj);
        json = wrap("\"x\"", extra);
    }
    free(extra);
    svc_limits saved = limits;
    limits.logit_vocab = VOCAB;
    svc_error e = json ? parse(json, req, err, errlen) : SVC_ERROR_INTERNAL;
    limits = saved;
    free(json);
    return e;
}

/* The object of n entries "0": v, "1": v, ... (caller frees). */
static char *many_entries(int n, const char *v)
{
    size_t cap = (size_t)n * (16 + strlen(v)) + 3, at = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    at += (size_t)snprintf(s, cap, "{");
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(s + at, cap - at, "%s\"%d\":%s", i ? "," : "", i, v);
    snprintf(s + at, cap - at, "}");
    return s;
}

static void test_logit_bias_accepted(void)
{
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    /* Both ends of the range, a fraction, the first and the last id with a
     * logit, a leading zero (still the id 7). */
    svc_error e = parse_bias("{\"50256\":-100,\"0\":100,\"128255\":0.5,\"007\":-2.25}", &req, err,
                             sizeof err);
    check(e == SVC_ERROR_NONE, "logit_bias accepted: %s", err);
    if (!e) {
        const svc_sampling *s = &req->sampling;
        check(s->n_logit_bias == 4 && s->logit_bias[0].id == 50256 &&
                  s->logit_bias[0].bias == -100.0f && s->logit_bias[1].id == 0 &&
                  s->logit_bias[1].bias == 100.0f && s->logit_bias[2].id == 128255 &&
                  s->logit_bias[2].bias == 0.5f && s->logit_bias[3].id == 7 &&
                  s->logit_bias[3].bias == -2.25f,
              "logit_bias entries in the client's order");
    }
    svc_request_destroy(req);

    /* OpenAI's limit, exactly. */
    char *obj = many_entries(SVC_LOGIT_BIAS_MAX, "1");
    req = NULL;
    e = obj ? parse_bias(obj, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_NONE && req->sampling.n_logit_bias == SVC_LOGIT_BIAS_MAX,
          "logit_bias with %d entries: %s", SVC_LOGIT_BIAS_MAX, e ? err : "");
    svc_request_destroy(req);
    free(obj);

    /* Null and {} are no bias. */
    static const char *const none[] = {"null", "{}"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        req = NULL;
        e = parse_bias(none[i], &req, err, sizeof err);
        check(e == SVC_ERROR_NONE && req->sampling.n_logit_bias == 0 &&
                  req->sampling.logit_bias == NULL,
              "logit_bias %s: no entries (%s)", none[i], e ? err : "");
        svc_request_destroy(req);
    }
}

static void expect_bias_error(const char *obj, const char *msg_part)
{
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    svc_error e = parse_bias(obj, &req, err, sizeof err);
    /* A refusal the client hears about: the request comes back with its
     * addressing, answerable. */
    check(e == SVC_ERROR_INVALID_REQUEST && strstr(err, msg_part) && req &&
              svc_request_answerable(req),
          "logit_bias %.40s: %s, message '%s', expected '%s'", obj, svc_error_code(e), err,
          msg_part);
    svc_request_destroy(req);
}

static void test_logit_bias_errors(void)
{
    static const struct {
        const char *obj, *msg;
    } cases[] = {
        {"[1,2]", "logit_bias: expected an object mapping token ids to numbers in [-100, 100]"},
        {"5", "logit_bias: expected an object"},
        {"{\"50256\":100.5}", "logit_bias[\"50256\"]: expected a number in [-100, 100]"},
        {"{\"50256\":-101}", "logit_bias[\"50256\"]: expected a number in [-100, 100]"},
        {"{\"50256\":\"-100\"}", "logit_bias[\"50256\"]: expected a number"},
        {"{\"50256\":null}", "logit_bias[\"50256\"]: expected a number"},
        {"{\"the\":1}", "logit_bias: key \"the\" is not a token id"},
        {"{\"-1\":1}", "logit_bias: key \"-1\" is not a token id"},
        {"{\"1.5\":1}", "logit_bias: key \"1.5\" is not a token id"},
        {"{\" 12\":1}", "logit_bias: key \" 12\" is not a token id"},
        {"{\"\":1}", "logit_bias: key \"\" is not a token id"},
        {"{\"128256\":-100}",
         "logit_bias: token id 128256 is outside the model's output vocabulary [0, 128256) "
         "(<|image|> and ids past it have no logit)"},
        {"{\"4294967296\":1}", "logit_bias: token id 4294967296 is outside"},
        {"{\"99999999999999999999999\":1}", "is outside the model's output vocabulary"},
        {"{\"12\":1,\"12\":2}", "logit_bias: token id 12 is given twice"},
        {"{\"12\":1,\"012\":2}", "logit_bias: token id 12 is given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_bias_error(cases[i].obj, cases[i].msg);

    char *obj = many_entries(SVC_LOGIT_BIAS_MAX + 1, "1");
    if (obj)
        expect_bias_error(obj, "logit_bias: 301 entries, at most 300");
    free(obj);

    /* Without a vocabulary (logit_vocab 0) the parser still bounds the id
     * by int32; the engine checks the rest at submit. */
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    char *json = wrap("\"x\"", ",\"logit_bias\":{\"128256\":1}");
    svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_NONE, "logit_bias without a known vocabulary: %s", err);
    svc_request_destroy(req);
    free(json);
}

void test_logit_bias(void)
{
    test_logit_bias_accepted();
    test_logit_bias_errors();
}
