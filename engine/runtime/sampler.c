/* The sampler (sampler.h): request controls, per-sequence state, and the
 * host path over sample.h's pipeline. */
#include "runtime/sampler.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameters ------------------------------------------------------------ */

void ml_sampling_params_default(ml_sampling_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->max_tokens = ML_SAMPLER_DEFAULT_MAX_TOKENS;
}

/* The bias entries: at most ML_SAMPLE_MAX_BIAS, values in range, ids with
 * a logit and distinct (the sample op adds each entry once, in parallel on
 * a device: a repeated id would be a race there). Quadratic in the entries,
 * which are few. */
static ml_status validate_logit_bias(const ml_sampling_params *p, size_t n_vocab, char *err,
                                     size_t errlen)
{
    if (p->n_logit_bias > ML_SAMPLE_MAX_BIAS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "logit_bias: %zu entries, at most %d",
                       p->n_logit_bias, ML_SAMPLE_MAX_BIAS);
    if (p->n_logit_bias > 0 && !p->logit_bias)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "logit_bias: NULL entries");
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const ml_logit_bias *b = &p->logit_bias[i];
        if (b->id < 0 || (size_t)b->id >= n_vocab)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "logit_bias: token id %d is outside the output vocabulary [0, %zu)",
                           (int)b->id, n_vocab);
        if (!(fabsf(b->value) <= ML_SAMPLE_MAX_ABS_BIAS))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "logit_bias: %g for token id %d is outside [-%g, %g]",
                           (double)b->value, (int)b->id, (double)ML_SAMPLE_MAX_ABS_BIAS,
                           (double)ML_SAMPLE_MAX_ABS_BIAS);
        for (size_t j = 0; j < i; j++)
            if (p->logit_bias[j].id == b->id)
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "logit_bias: token id %d is listed twice", (int)b->id);
    }
    return ML_OK;
}

ml_status ml_sampling_params_validate(const ml_sampling_params *p, size_t n_vocab, char *err,
                                      size_t errlen)
{
    /* Written as "!(in range)" so that NaN fails every check. */
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "temperature: %g must be finite and >= 0", (double)p->temperature);
    if (p->top_k > n_vocab)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "top_k: %u exceeds the vocabulary (%zu)",
                       (unsigned)p->top_k, n_vocab);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "top_p: %g is outside (0, 1]",
                       (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "min_p: %g is outside [0, 1]",
                       (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "repetition_penalty: %g must be finite and > 0",
                       (double)p->repetition_penalty);
    if (!(fabsf(p->presence_penalty) <= ML_SAMPLER_MAX_ABS_PENALTY))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "presence_penalty: %g is outside [-%g, %g]",
                       (double)p->presence_penalty, (double)ML_SAMPLER_MAX_ABS_PENALTY,
                       (double)ML_SAMPLER_MAX_ABS_PENALTY);
    if (!(fabsf(p->frequency_penalty) <= ML_SAMPLER_MAX_ABS_PENALTY))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "frequency_penalty: %g is outside [-%g, %g]", (double)p->frequency_penalty,
                       (double)ML_SAMPLER_MAX_ABS_PENALTY, (double)ML_SAMPLER_MAX_ABS_PENALTY);
    if (p->max_tokens == 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "max_tokens: must be >= 1");
    if (p->n_stop_ids > ML_SAMPLER_MAX_STOP_IDS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop_ids: %zu ids, at most %d",
                       p->n_stop_ids, ML_SAMPLER_MAX_STOP_IDS);
    for (size_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || (size_t)p->stop_ids[i] >= n_vocab)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "stop_ids[%zu]: %d is outside [0, %zu)", i, (int)p->stop_ids[i],
                           n_vocab);
    ml_status st = ml_stop_validate(p->stop, p->stop_len, p->n_stop, err, errlen);
    if (st != ML_OK)
        return st;
    if (p->top_logprobs > ML_SAMPLE_MAX_TOP)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "top_logprobs: %u, at most %d",
                       (unsigned)p->top_logprobs, ML_SAMPLE_MAX_TOP);
    if (p->top_logprobs > 0 && !p->logprobs)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "top_logprobs: requires logprobs");
    if (p->grammar_on_brace && !p->grammar)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "grammar_on_brace: requires a grammar");
    return validate_logit_bias(p, n_vocab, err, errlen);
}

/* ---- random stream --------------------------------------------------------- */

/* splitmix64 (Steele, Lea, Flood 2014): expands the 64-bit seed into the
 * xoshiro state, so nearby seeds give unrelated streams. */
static uint64_t splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman, Vigna 2018). */
static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double xoshiro_uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53;
}

/* ---- per-sequence state ---------------------------------------------------- */

struct ml_sampler_seq {
    ml_sampling_params p; /* stop strings dropped: n_stop 0 */
    size_t n_vocab;
    uint64_t rng[4];
    uint32_t n_generated;
    bool finished;

    /* The bias entries, p.n_logit_bias of them (p.logit_bias points here;
     * NULL when there are none). */
    ml_logit_bias *bias; /* owned */

    /* Penalty entries (NULL when every penalty is off). */
    int32_t *pen_id;     /* owned; n_pen distinct ids of cap_pen, first-seen order */
    uint32_t *pen_count; /* owned; parallel to pen_id: occurrences in the output */
    int32_t *slot;       /* owned; 2^slot_bits entries: index into pen_id, or -1 */
    size_t n_pen, cap_pen;
    unsigned slot_bits;
};

#define SEQ_SLOT_EMPTY (-1)
/* 2^32 / golden ratio: Fibonacci hashing spreads consecutive ids. */
#define SEQ_HASH_MULT 2654435769u

/* The entry of id, added with count 0 when it is new. */
static size_t seq_entry(ml_sampler_seq *seq, int32_t id)
{
    size_t mask = ((size_t)1 << seq->slot_bits) - 1;
    size_t h = (size_t)((uint32_t)id * SEQ_HASH_MULT >> (32 - seq->slot_bits));
    for (;; h = (h + 1) & mask) {
        int32_t at = seq->slot[h];
        if (at == SEQ_SLOT_EMPTY)
            break;
        if (seq->pen_id[at] == id)
            return (size_t)at;
    }
    /* Distinct ids never exceed cap_pen, the table's sizing. */
    assert(seq->n_pen < seq->cap_pen);
    seq->slot[h] = (int32_t)seq->n_pen;
    seq->pen_id[seq->n_pen] = id;
    seq->pen_count[seq->n_pen] = 0;
    return seq->n_pen++;
}

ml_status ml_sampler_seq_create(const ml_sampling_params *p, size_t n_vocab,
                                const int32_t *prompt, size_t n_prompt, ml_sampler_seq **out,
                                char *err, size_t errlen)
{
    if (!p || !out || (n_prompt > 0 && !prompt))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "sampler: NULL argument");
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "sampler: n_vocab %zu out of range",
                       n_vocab);
    ml_status st = ml_sampling_params_validate(p, n_vocab, err, errlen);
    if (st != ML_OK)
        return st;
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "prompt[%zu]: negative id %d", i,
                           (int)prompt[i]);

    ml_sampler_seq *seq = calloc(1, sizeof *seq);
    if (!seq)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "sampler: out of memory");
    seq->p = *p;
    memset(seq->p.stop, 0, sizeof seq->p.stop);
    memset(seq->p.stop_len, 0, sizeof seq->p.stop_len);
    seq->p.n_stop = 0;
    seq->p.logit_bias = NULL;
    seq->p.n_logit_bias = 0;
    seq->n_vocab = n_vocab;
    if (p->n_logit_bias > 0) {
        seq->bias = malloc(p->n_logit_bias * sizeof *seq->bias);
        if (!seq->bias) {
            ml_sampler_seq_destroy(seq);
            return ml_fail(err, errlen, ML_ERR_NOMEM, "sampler: out of memory for logit_bias");
        }
        memcpy(seq->bias, p->logit_bias, p->n_logit_bias * sizeof *seq->bias);
        seq->p.logit_bias = seq->bias;
        seq->p.n_logit_bias = p->n_logit_bias;
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        seq->rng[i] = splitmix64_next(&x);

    bool rep = p->repetition_penalty != 1.0f;
    if (rep || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        size_t ids = (rep ? n_prompt : 0) + p->max_tokens;
        seq->cap_pen = ids < n_vocab ? ids : n_vocab;
        /* Load factor <= 1/2 keeps linear probing short. */
        seq->slot_bits = 1;
        while (((size_t)1 << seq->slot_bits) < 2 * seq->cap_pen)
            seq->slot_bits++;
        size_t n_slots = (size_t)1 << seq->slot_bits;
        seq->pen_id = malloc(seq->cap_pen * sizeof *seq->pen_id);
        seq->pen_count = malloc(seq->cap_pen * sizeof *seq->pen_count);
        seq->slot = malloc(n_slots * sizeof *seq->slot);
        if (!seq->pen_id || !seq->pen_count || !seq->slot) {
            ml_sampler_seq_destroy(seq);
            return ml_fail(err, errlen, ML_ERR_NOMEM, "sampler: out of memory for penalty state");
        }
        for (size_t i = 0; i < n_slots; i++)
            seq->slot[i] = SEQ_SLOT_EMPTY;
        if (rep)
            for (size_t i = 0; i < n_prompt; i++)
                if ((size_t)prompt[i] < n_vocab)
                    seq_entry(seq, prompt[i]);
    }
    *out = seq;
    return ML_OK;
}

void ml_sampler_seq_destroy(ml_sampler_seq *seq)
{
    if (!seq)
        return;
    free(seq->bias);
    free(seq->pen_id);
    free(seq->pen_count);
    free(seq->slot);
    free(seq);
}

ml_status ml_sampler_seq_accept(ml_sampler_seq *seq, int32_t token, ml_finish *finish, char *err,
                                size_t errlen)
{
    if (token < 0 || (size_t)token >= seq->n_vocab)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "sampler: token %d outside [0, %zu)",
                       (int)token, seq->n_vocab);
    if (seq->finished)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "sampler: token after the sequence finished");
    if (seq->pen_id)
        seq->pen_count[seq_entry(seq, token)]++;
    seq->n_generated++;

    ml_finish f = ML_FINISH_NONE;
    for (size_t i = 0; i < seq->p.n_stop_ids; i++)
        if (seq->p.stop_ids[i] == token)
            f = ML_FINISH_STOP;
    if (f == ML_FINISH_NONE && seq->n_generated >= seq->p.max_tokens)
        f = ML_FINISH_LENGTH;
    seq->finished = f != ML_FINISH_NONE;
    *finish = f;
    return ML_OK;
}

uint32_t ml_sampler_seq_n_generated(const ml_sampler_seq *seq)
{
    return seq->n_generated;
}

static bool params_greedy(const ml_sampling_params *p)
{
    return p->temperature < ML_SAMPLE_GREEDY_TEMPERATURE;
}

/* The step's controls without the draw. */
static void seq_row(const ml_sampler_seq *seq, ml_sample_row *row)
{
    const ml_sampling_params *p = &seq->p;
    *row = (ml_sample_row){
        .temperature = p->temperature,
        .top_p = p->top_p,
        .min_p = p->min_p,
        .repetition_penalty = p->repetition_penalty,
        .presence_penalty = p->presence_penalty,
        .frequency_penalty = p->frequency_penalty,
        .top_k = p->top_k,
        .logprobs = p->logprobs,
        .n_top = p->top_logprobs,
        .n_pen = (int32_t)seq->n_pen,
        .n_bias = (int32_t)p->n_logit_bias,
    };
}

void ml_sampler_seq_row(ml_sampler_seq *seq, ml_sample_row *row, const int32_t **pen_id,
                        const uint32_t **pen_count, const ml_logit_bias **bias)
{
    seq_row(seq, row);
    if (!params_greedy(&seq->p))
        row->u = xoshiro_uniform(seq->rng);
    *pen_id = seq->pen_id;
    *pen_count = seq->pen_count;
    *bias = seq->bias;
}

/* ---- sampling on the host -------------------------------------------------- */

struct ml_sampler {
    size_t n_vocab;
    ml_sample_scratch *scratch; /* inside mem */
    void *mem;                  /* owned */
};

/* ml_sample_scratch_init's alignment. */
#define SAMPLER_ALIGN 64

ml_status ml_sampler_create(size_t n_vocab, ml_sampler **out, char *err, size_t errlen)
{
    if (!out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "sampler: NULL out");
    size_t bytes = ml_sample_scratch_bytes(n_vocab);
    if (bytes == 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "sampler: n_vocab %zu out of range",
                       n_vocab);
    ml_sampler *s = calloc(1, sizeof *s);
    if (s)
        s->mem = aligned_alloc(SAMPLER_ALIGN, bytes);
    if (!s || !s->mem) {
        free(s);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "sampler: out of memory for %zu logits",
                       n_vocab);
    }
    s->n_vocab = n_vocab;
    s->scratch = ml_sample_scratch_init(s->mem, n_vocab);
    *out = s;
    return ML_OK;
}

void ml_sampler_destroy(ml_sampler *s)
{
    if (!s)
        return;
    free(s->mem);
    free(s);
}

static ml_status sampler_check(const ml_sampler *s, const ml_sampler_seq *seq, char *err,
                               size_t errlen)
{
    if (seq->n_vocab != s->n_vocab)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "sampler: sequence made for %zu logits, sampler for %zu", seq->n_vocab,
                       s->n_vocab);
    if (seq->finished)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "sampler: the sequence has finished");
    return ML_OK;
}

ml_status ml_sampler_sample(ml_sampler *s, ml_sampler_seq *seq, const float *logits,
                            const uint64_t *allowed, ml_sample_out *out, char *err, size_t errlen)
{
    ml_status st = sampler_check(s, seq, err, errlen);
    if (st != ML_OK)
        return st;
    ml_sample_row row;
    const int32_t *pen_id;
    const uint32_t *pen_count;
    const ml_logit_bias *bias;
    ml_sampler_seq_row(seq, &row, &pen_id, &pen_count, &bias);
    ml_sample_one(s->scratch, logits, &row, pen_id, pen_count, bias, allowed, out);
    if (out->chosen.id == ML_SAMPLE_NO_TOKEN)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "sampler: logits have no finite maximum");
    return ML_OK;
}

ml_status ml_sampler_distribution(ml_sampler *s, const ml_sampler_seq *seq, const float *logits,
                                  ml_token_logprob *out, size_t cap, size_t *n_kept, char *err,
                                  size_t errlen)
{
    ml_status st = sampler_check(s, seq, err, errlen);
    if (st != ML_OK)
        return st;
    ml_sample_row row;
    seq_row(seq, &row);
    return ml_sample_distribution(s->scratch, logits, &row, seq->pen_id, seq->pen_count,
                                  seq->bias, out, cap, n_kept, err, errlen);
}
