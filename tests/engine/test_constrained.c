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
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
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

/* Bitwise the same tokens and logprobs. */
static int same_result(const ml_rt_result *a, const ml_rt_result *b)
{
    return ml_rt_same_output(a, b) && !memcmp(a->lp, b->lp, (size_t)a->n_out * sizeof a->lp[0]);
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

enum { N_CON = 4, N_FREE = 3 };

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
    ml_json_vocab_destroy(g_vocab);
    ml_rt_fixture_close(&f);
    return check_done();
}
