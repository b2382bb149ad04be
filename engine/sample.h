/* Token selection from one row of logits: the sampling pipeline every
 * backend's `sample` op computes (backend.h), written here once as the CPU
 * reference, and the data the op exchanges with its caller. The per-sequence
 * state (random stream, the ids a sequence has seen) lives in the runtime
 * (runtime/sampler.h), which turns it into one ml_sample_row per step.
 *
 * Pipeline of one row, in this order (HF generate's processor order where HF
 * has the control; presence/frequency are vLLM's and sit where vLLM applies
 * them, right after the repetition penalty):
 *   0. logit bias (OpenAI's logit_bias), on the row's bias entries only
 *      (distinct ids, each with a value in [-ML_SAMPLE_MAX_ABS_BIAS,
 *      ML_SAMPLE_MAX_ABS_BIAS]): logit += bias, in float, on the raw
 *      logits, before everything else: OpenAI adds the bias to the logits
 *      "prior to sampling" and vLLM applies it before the penalties, so
 *      every later step (penalties, greedy, the filters, a constraint) sees
 *      the biased logit. +100 forces a token and -100 bans it "in
 *      practice": when the row's logits lie less than 100 apart, as a
 *      trained model's likely tokens do;
 *   1. penalties, on the row's penalty entries only (distinct ids, each with
 *      the number of times it occurs in the output so far):
 *      repetition (HF RepetitionPenaltyLogitsProcessor) on every entry, once
 *      however often the id occurs: logit > 0 ? logit / p : logit * p;
 *      then frequency and presence (OpenAI / vLLM) on entries with a count,
 *      in float, in this order: logit -= frequency * count; logit -= presence;
 *   2. temperature below ML_SAMPLE_GREEDY_TEMPERATURE: greedy, the argmax of
 *      the biased, penalised logits, the lowest id on ties; steps 3-6 are
 *      skipped and u is not used. Otherwise logits / temperature;
 *   3. top-k (HF TopKLogitsWarper): keep the k best ranked;
 *   4. top-p (HF TopPLogitsWarper): of what is left, keep the smallest prefix
 *      in rank order whose probability, renormalised over what is left,
 *      reaches p: a token is kept while the mass ranked before it is < p; the
 *      best token is always kept;
 *   5. min-p (HF MinPLogitsWarper, also after top-k/top-p in vLLM): keep
 *      tokens whose probability is >= min_p times the best token's, tested
 *      as the equivalent logit threshold logit >= max + temperature ln(min_p);
 *   6. walk the kept tokens in rank order, probabilities renormalised over
 *      them: the first token whose cumulative probability exceeds u.
 * Rank order is descending logit, the lower id first on ties. It is a strict
 * order, so top-k keeps exactly k tokens even when logits tie at the k-th
 * (HF and vLLM keep every tie, possibly more than k).
 *
 * Probabilities are exp((logit - max) / temperature) normalised over the set
 * in question; tokens more than ln(vocab) + 24 ln 2 below the best (after
 * temperature) are dropped before anything else: all of them together hold
 * less than 2^-24 of the mass, below the resolution of a float sum. Masked
 * logits (-inf) and NaN are never drawn.
 *
 * Logprobs are those of the raw model output, log_softmax of the logits
 * before bias, penalties, temperature and filters: what vLLM reports by
 * default (logprobs_mode "raw_logprobs") and what makes them comparable
 * across requests with different sampling settings. A bias, like a
 * constraint (ml_sample_one's `allowed`), changes which token is chosen,
 * never the logprobs reported for it.
 *
 * Backends: the CPU op runs ml_sample_one per row. A device computes the
 * same pipeline with its own summation order, so it picks the same token
 * except when u lies within float rounding of a boundary of the cumulative
 * distribution, and the same greedy token and logprobs within rounding. */
#ifndef ML_SAMPLE_H
#define ML_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Temperatures below this are greedy, as in vLLM (_SAMPLING_EPS): dividing by
 * them would overflow and the distribution is a point mass anyway. */
#define ML_SAMPLE_GREEDY_TEMPERATURE 1e-5f
/* The OpenAI API's limit on top_logprobs. */
#define ML_SAMPLE_MAX_TOP 20
/* The OpenAI API's limits on logit_bias: entries per request, and the
 * range of a value. */
#define ML_SAMPLE_MAX_BIAS 300
#define ML_SAMPLE_MAX_ABS_BIAS 100.0f

/* One logit bias entry (step 0 of the pipeline). */
typedef struct ml_logit_bias {
    int32_t id;  /* in [0, vocab) */
    float value; /* [-ML_SAMPLE_MAX_ABS_BIAS, ML_SAMPLE_MAX_ABS_BIAS], added to the logit */
} ml_logit_bias;

/* One step's controls of one row. Plain data, the same bytes in host and
 * backend memory. The caller has checked the ranges
 * (ml_sampling_params_validate). */
typedef struct ml_sample_row {
    double u;                 /* the draw, in [0, 1); unused when greedy */
    float temperature;        /* >= 0 */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint32_t top_k;           /* 0 = off, else <= vocab */
    uint32_t logprobs;        /* 1: report the chosen token's raw logprob */
    uint32_t n_top;           /* <= ML_SAMPLE_MAX_TOP best raw logprobs; needs logprobs */
    int32_t pen_start;        /* the row's penalty entries: [pen_start, pen_start + n_pen) */
    int32_t n_pen;            /*   of the op's pen_id / pen_count arrays */
    int32_t bias_start;       /* the row's bias entries: [bias_start, bias_start + n_bias) */
    int32_t n_bias;           /*   of the op's bias array; 0 = no bias */
    /* A constraint (structured outputs): 0 = none; k >= 1: slice k - 1 of
     * the op's mask array, (vocab + 63) / 64 words, bit id & 63 of word
     * id >> 6 set when id may be drawn (ml_sample_one's `allowed`). Zero,
     * so that a zeroed row is unconstrained. */
    uint32_t mask;
} ml_sample_row;

typedef struct ml_token_logprob {
    int32_t id;
    float logprob;
} ml_token_logprob;

/* What the pipeline chose for a row. */
typedef struct ml_sample_out {
    /* The token, with its raw logprob when the row asked for logprobs (else
     * 0). id ML_SAMPLE_NO_TOKEN: the logits have no finite maximum (every
     * one NaN or -inf, or one +inf), nothing was chosen. */
    ml_token_logprob chosen;
    /* With logprobs: the n_top best ranked raw logprobs, best first (the
     * chosen id appears here only if it ranks there). */
    ml_token_logprob top[ML_SAMPLE_MAX_TOP];
    uint32_t n_top;
} ml_sample_out;

#define ML_SAMPLE_NO_TOKEN (-1)

/* ---- the CPU reference ------------------------------------------------------- */

typedef struct ml_sample_scratch ml_sample_scratch;

/* Bytes of scratch ml_sample_one needs for rows of `vocab` logits (about 30
 * per id: 3.9 MB for Llama 3's 128256), 0 when vocab is 0 or over INT32_MAX. */
size_t ml_sample_scratch_bytes(size_t vocab);

/* Lay out a scratch for `vocab` logits in `mem` (ml_sample_scratch_bytes
 * bytes, 64-byte aligned, owned by the caller and outliving the result).
 * Returns the scratch (inside mem), or NULL when vocab is out of range. */
ml_sample_scratch *ml_sample_scratch_init(void *mem, size_t vocab);

/* Run the pipeline on one row: logits (vocab floats, not modified),
 * row's controls, its penalty entries pen_id/pen_count (row->n_pen each,
 * ids distinct and within [0, vocab)) and its bias entries (row->n_bias,
 * ids distinct and within [0, vocab); NULL when n_bias is 0) into *out.
 * allowed is NULL, or a
 * constraint ((vocab + 63) / 64 words, bit id & 63 of word id >> 6): a
 * token whose bit is clear is never drawn, as if its logit were -inf after
 * the penalties (structured outputs); the logprobs stay the raw ones, those
 * of the unconstrained model. row->mask is not read here: the backend op
 * turns it into `allowed`. Nothing allowed gives ML_SAMPLE_NO_TOKEN.
 * Uses the scratch (made for this vocab) and nothing else. */
void ml_sample_one(ml_sample_scratch *s, const float *logits, const ml_sample_row *row,
                   const int32_t *pen_id, const uint32_t *pen_count, const ml_logit_bias *bias,
                   const uint64_t *allowed, ml_sample_out *out);

/* The distribution ml_sample_one draws from for this row (without a
 * constraint): the kept tokens, best ranked first, each with its
 * log-probability renormalised over the kept set (after bias, penalties,
 * temperature and filters); greedy gives the
 * argmax with logprob 0. Writes the first min(*n_kept, cap) entries to out
 * (caller-owned) and the number kept to *n_kept. It sorts the kept set,
 * O(n log n): for tests and debugging, not for every step.
 * Errors: ML_ERR_FORMAT when the logits have no finite maximum. */
ml_status ml_sample_distribution(ml_sample_scratch *s, const float *logits,
                                 const ml_sample_row *row, const int32_t *pen_id,
                                 const uint32_t *pen_count, const ml_logit_bias *bias,
                                 ml_token_logprob *out, size_t cap, size_t *n_kept, char *err,
                                 size_t errlen);

/* log_softmax of the raw logits (vocab floats) for `chosen` and the top_n
 * best ranked ids (descending, lower id first on ties) into out (out->chosen,
 * out->top, out->n_top). Masked (-inf) logits give -inf. Accumulated in
 * double; terms more than ln(vocab) + 24 ln 2 below the maximum are skipped
 * (together under 2^-24 of the sum, below the resolution of the float
 * results). Errors: ML_ERR_INVALID_ARG (chosen outside [0, vocab), top_n over
 * ML_SAMPLE_MAX_TOP or vocab), ML_ERR_FORMAT (no finite maximum); *out
 * untouched on error. */
ml_status ml_sample_logprobs(const float *logits, size_t vocab, int32_t chosen, uint32_t top_n,
                             ml_sample_out *out, char *err, size_t errlen);

#endif
