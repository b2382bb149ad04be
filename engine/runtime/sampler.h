/* The sampler: from one step's logits of one sequence to the next token, on
 * the host, with the request's sampling controls; plus the logprobs a reply
 * reports.
 *
 * Pipeline of ml_sampler_sample, in this order (HF generate's processor order
 * where HF has the control; presence/frequency are vLLM's and sit where vLLM
 * applies them, right after the repetition penalty):
 *   1. repetition penalty (HF RepetitionPenaltyLogitsProcessor): each id seen
 *      in the prompt or the output so far, once however often it occurs:
 *      logit > 0 ? logit / p : logit * p;
 *   2. presence and frequency penalties (OpenAI / vLLM), output ids only:
 *      logit -= presence * (count > 0) + frequency * count;
 *   3. temperature below ML_SAMPLER_GREEDY_TEMPERATURE: greedy, the argmax of
 *      the penalised logits, the lowest id on ties; steps 4-7 are skipped and
 *      no random number is drawn. Otherwise logits / temperature;
 *   4. top-k (HF TopKLogitsWarper): keep the k best ranked;
 *   5. top-p (HF TopPLogitsWarper): of what is left, keep the smallest prefix
 *      in rank order whose probability, renormalised over what is left,
 *      reaches p: a token is kept while the mass ranked before it is < p; the
 *      best token is always kept;
 *   6. min-p (HF MinPLogitsWarper, also after top-k/top-p in vLLM): keep
 *      tokens whose probability is >= min_p times the best token's, tested
 *      as the equivalent logit threshold logit >= max + temperature ln(min_p);
 *   7. draw u in [0, 1) from the sequence's generator and walk the kept
 *      tokens in rank order, probabilities renormalised over them: the first
 *      token whose cumulative probability exceeds u.
 * Rank order is descending logit, the lower id first on ties. It is a strict
 * order, so top-k keeps exactly k tokens even when logits tie at the k-th
 * (HF and vLLM keep every tie, possibly more than k).
 *
 * Probabilities are exp((logit - max) / temperature) (a vectorised expf,
 * within about 1 ulp) normalised over the set in question; tokens more than ln(n_vocab) + 24 ln 2 below the best (after
 * temperature) are dropped before anything else: all of them together hold
 * less than 2^-24 of the mass, below the resolution of a float sum, and
 * skipping them is what makes the step cheap. Masked logits (-inf) and NaN
 * are never drawn.
 *
 * Reproducibility: the random stream belongs to the sequence (xoshiro256**
 * seeded from the request's seed through splitmix64), and each non-greedy
 * sample draws exactly one number. The same seed, prompt and logits give the
 * same tokens whatever the batch, the thread or the other requests.
 *
 * Logprobs (ml_sampler_logprobs) are those of the raw model output,
 * log_softmax of the logits before penalties, temperature and filters: what
 * vLLM reports by default (logprobs_mode "raw_logprobs") and what makes them
 * comparable across requests with different sampling settings.
 *
 * @locality: an ml_sampler is scratch for one thread; give each sampling
 * thread its own. An ml_sampler_seq belongs to one sequence and is used by one
 * thread at a time. Neither allocates after creation. */
#ifndef ML_RUNTIME_SAMPLER_H
#define ML_RUNTIME_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/stop.h"
#include "status.h"

/* Temperatures below this are greedy, as in vLLM (_SAMPLING_EPS): dividing by
 * them would overflow and the distribution is a point mass anyway. */
#define ML_SAMPLER_GREEDY_TEMPERATURE 1e-5f
/* The OpenAI API's limit on top_logprobs. */
#define ML_SAMPLER_MAX_TOP_LOGPROBS 20
/* Stop token ids per request (Llama 3 Instruct uses 3). */
#define ML_SAMPLER_MAX_STOP_IDS 16
/* Range of presence_penalty and frequency_penalty (OpenAI, vLLM). */
#define ML_SAMPLER_MAX_ABS_PENALTY 2.0f
/* vLLM's default max_tokens; the runtime caps it by the context left. */
#define ML_SAMPLER_DEFAULT_MAX_TOKENS 16

/* The sampling controls of one request. Plain data; the stop strings are
 * borrowed (the runtime copies them into an ml_stop). */
typedef struct ml_sampling_params {
    float temperature;        /* >= 0; < ML_SAMPLER_GREEDY_TEMPERATURE: greedy */
    uint32_t top_k;           /* 0 = off */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off */
    float presence_penalty;   /* [-2, 2]; 0 = off */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    uint64_t seed;            /* always used: the caller picks one when the request has none */
    uint32_t max_tokens;      /* >= 1: generated tokens, the stop token included */
    int32_t stop_ids[ML_SAMPLER_MAX_STOP_IDS]; /* e.g. 128001, 128008, 128009 for Instruct */
    size_t n_stop_ids;
    const char *stop[ML_STOP_MAX_STRINGS]; /* borrowed; stop_len[i] bytes each */
    size_t stop_len[ML_STOP_MAX_STRINGS];
    size_t n_stop;
    bool logprobs;         /* report the chosen token's logprob */
    uint32_t top_logprobs; /* 0..ML_SAMPLER_MAX_TOP_LOGPROBS alternatives; needs logprobs */
} ml_sampling_params;

/* OpenAI's defaults: temperature 1, every filter and penalty off, seed 0,
 * max_tokens ML_SAMPLER_DEFAULT_MAX_TOKENS, no stop ids or strings, no
 * logprobs. */
void ml_sampling_params_default(ml_sampling_params *p);

/* Check every field against its range and the ids against n_vocab (the
 * number of logits). Errors: ML_ERR_INVALID_ARG, err naming the field
 * ("top_p: 1.5 is outside (0, 1]"); NaN is out of every range. */
ml_status ml_sampling_params_validate(const ml_sampling_params *p, size_t n_vocab, char *err,
                                      size_t errlen);

/* True when the token ml_sampler_sample picks is the argmax of the raw
 * logits (the lowest id on ties) and nothing else needs the logits:
 * greedy, every penalty off, no logprobs. The runtime then asks the model
 * for that id alone (ML_LOGITS_ARGMAX), computed where the logits are. */
bool ml_sampling_params_argmax_only(const ml_sampling_params *p);

/* ---- per-sequence state ---------------------------------------------------- */

typedef struct ml_sampler_seq ml_sampler_seq;

/* Why a sequence ends after a token. */
typedef enum ml_finish {
    ML_FINISH_NONE = 0,
    ML_FINISH_STOP,   /* the token is a stop id */
    ML_FINISH_LENGTH, /* max_tokens tokens generated */
} ml_finish;

/* State of one sequence: a copy of params (stop strings dropped), the random
 * stream, and what the penalties need, sized once from max_tokens and the
 * prompt: a bitset of ids seen in the prompt or output and their list
 * (repetition penalty), and an open-addressing table of output id counts
 * (presence/frequency). A penalty that is off costs no memory.
 * prompt: n_prompt ids (borrowed, read once); ids >= n_vocab have no logit
 * (<|image|> is 128256 for a 128256-logit head) and are ignored.
 * On success *out is owned by the caller (ml_sampler_seq_destroy).
 * Errors: those of ml_sampling_params_validate, ML_ERR_INVALID_ARG for a
 * negative prompt id, ML_ERR_NOMEM; *out untouched on error. */
ml_status ml_sampler_seq_create(const ml_sampling_params *p, size_t n_vocab,
                                const int32_t *prompt, size_t n_prompt, ml_sampler_seq **out,
                                char *err, size_t errlen);

/* No-op on NULL. */
void ml_sampler_seq_destroy(ml_sampler_seq *seq);

/* Record the token chosen for this step (normally ml_sampler_sample's) and
 * say whether the sequence ends: ML_FINISH_STOP for a stop id (before length),
 * ML_FINISH_LENGTH at max_tokens. Errors: ML_ERR_INVALID_ARG for a token
 * outside [0, n_vocab) or a sequence that already finished; seq unchanged. */
ml_status ml_sampler_seq_accept(ml_sampler_seq *seq, int32_t token, ml_finish *finish, char *err,
                                size_t errlen);

/* Tokens accepted so far. */
uint32_t ml_sampler_seq_n_generated(const ml_sampler_seq *seq);

/* One token and its log-probability. */
typedef struct ml_token_logprob {
    int32_t id;
    float logprob;
} ml_token_logprob;

/* ---- sampling -------------------------------------------------------------- */

typedef struct ml_sampler ml_sampler;

/* Scratch for sampling over n_vocab logits (about 30 bytes per id: 3.9 MB
 * for Llama 3's 128256), allocated once. On success *out is owned by the caller (ml_sampler_destroy).
 * Errors: ML_ERR_INVALID_ARG (n_vocab 0 or over INT32_MAX), ML_ERR_NOMEM. */
ml_status ml_sampler_create(size_t n_vocab, ml_sampler **out, char *err, size_t errlen);

/* No-op on NULL. */
void ml_sampler_destroy(ml_sampler *s);

/* Choose the next token of seq from logits (n_vocab floats, borrowed, not
 * modified) by the pipeline above; advances seq's random stream (non-greedy
 * only) but records nothing: call ml_sampler_seq_accept with the token.
 * Errors: ML_ERR_INVALID_ARG (seq made for another n_vocab, a finished
 * sequence), ML_ERR_FORMAT (no finite maximum: every logit NaN or -inf, or
 * one is +inf); *token untouched and the stream not advanced. */
ml_status ml_sampler_sample(ml_sampler *s, ml_sampler_seq *seq, const float *logits,
                            int32_t *token, char *err, size_t errlen);

/* The distribution ml_sampler_sample would draw from for these logits: the
 * kept tokens, best ranked first, each with its log-probability renormalised
 * over the kept set (after penalties, temperature and filters); greedy gives
 * the argmax with logprob 0. Writes the first min(*n_kept, cap) entries to
 * out (caller-owned) and the number kept to *n_kept. Draws nothing and
 * records nothing. It sorts the kept set, O(n log n): for tests, debugging
 * and "processed" logprobs, not for every step. Errors: as ml_sampler_sample. */
ml_status ml_sampler_distribution(ml_sampler *s, const ml_sampler_seq *seq, const float *logits,
                                  ml_token_logprob *out, size_t cap, size_t *n_kept, char *err,
                                  size_t errlen);

/* ---- logprobs -------------------------------------------------------------- */

typedef struct ml_logprobs {
    ml_token_logprob chosen;
    ml_token_logprob top[ML_SAMPLER_MAX_TOP_LOGPROBS]; /* n_top entries, best first */
    uint32_t n_top;
} ml_logprobs;

/* log_softmax of the raw logits (n_vocab floats, borrowed) for the chosen id
 * and the top_n best ranked ids (descending, lower id first on ties; the
 * chosen id appears among them only if it ranks there). Masked (-inf) logits
 * give -inf. Accumulated in double; terms more than ln(n_vocab) + 24 ln 2
 * below the maximum are skipped (together under 2^-24 of the sum, below the
 * resolution of the float results).
 * Errors: ML_ERR_INVALID_ARG (chosen outside [0, n_vocab), top_n over
 * ML_SAMPLER_MAX_TOP_LOGPROBS or n_vocab), ML_ERR_FORMAT (no finite
 * maximum, as for sampling); *out untouched on error. */
ml_status ml_sampler_logprobs(const float *logits, size_t n_vocab, int32_t chosen,
                              uint32_t top_n, ml_logprobs *out, char *err, size_t errlen);

#endif
