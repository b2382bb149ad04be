/* The runtime's side of sampling: a request's sampling controls, checked
 * once, and each sequence's state across steps (its random stream, the ids
 * its penalties act on, its stop conditions), turned into one ml_sample_row
 * per step for the pipeline of sample.h, which runs where the logits are
 * (the backend's sample op) or here on the host (ml_sampler_sample).
 *
 * Reproducibility: the random stream belongs to the sequence (xoshiro256**
 * seeded from the request's seed through splitmix64), and each non-greedy
 * step draws exactly one number. The same seed, prompt and logits give the
 * same tokens whatever the batch, the thread or the other requests.
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
#include "sample.h"
#include "status.h"

/* Stop token ids per request (Llama 3 Instruct uses 3). */
#define ML_SAMPLER_MAX_STOP_IDS 16
/* Range of presence_penalty and frequency_penalty (OpenAI, vLLM). */
#define ML_SAMPLER_MAX_ABS_PENALTY 2.0f
/* vLLM's default max_tokens; the runtime caps it by the context left. */
#define ML_SAMPLER_DEFAULT_MAX_TOKENS 16

/* The sampling controls of one request. Plain data; the stop strings are
 * borrowed (the runtime copies them into an ml_stop). */
typedef struct ml_sampling_params {
    float temperature;        /* >= 0; < ML_SAMPLE_GREEDY_TEMPERATURE: greedy */
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
    /* JSON mode (OpenAI response_format json_object): the runtime keeps the
     * output a prefix of one JSON object (grammar/json_mode.h) and ends the
     * sequence when the object is complete. */
    bool json_object;
    /* JSON Schema (response_format json_schema): borrowed, NULL when none;
     * the runtime takes its own reference for the sequence's life and keeps
     * the output a prefix of a document valid under it (grammar/grammar.h),
     * ending the sequence when the document is complete. Excludes
     * json_object. */
    struct ml_grammar *grammar;
    /* With grammar: it binds only an answer whose first byte that is not
     * JSON whitespace is '{' (OpenAI's tool_choice "auto": a tool call, or
     * prose); an answer that begins otherwise is free text from its first
     * token on (runtime/constraint.h). */
    bool grammar_on_brace;
    uint32_t top_logprobs; /* 0..ML_SAMPLE_MAX_TOP alternatives; needs logprobs */
    /* OpenAI's logit_bias (sample.h step 0): borrowed, n_logit_bias
     * (<= ML_SAMPLE_MAX_BIAS) entries with distinct ids; the sequence keeps
     * its own copy. */
    const ml_logit_bias *logit_bias;
    size_t n_logit_bias;
} ml_sampling_params;

/* OpenAI's defaults: temperature 1, every filter, penalty and bias off,
 * seed 0, max_tokens ML_SAMPLER_DEFAULT_MAX_TOKENS, no stop ids or strings,
 * no logprobs. */
void ml_sampling_params_default(ml_sampling_params *p);

/* Check every field against its range and the ids (stop ids, logit_bias
 * ids) against n_vocab (the number of logits: <|image|>, past the lm_head,
 * has none). Errors: ML_ERR_INVALID_ARG, err naming the field
 * ("top_p: 1.5 is outside (0, 1]"); NaN is out of every range. */
ml_status ml_sampling_params_validate(const ml_sampling_params *p, size_t n_vocab, char *err,
                                      size_t errlen);

/* ---- per-sequence state ---------------------------------------------------- */

typedef struct ml_sampler_seq ml_sampler_seq;

/* Why a sequence ends after a token. */
typedef enum ml_finish {
    ML_FINISH_NONE = 0,
    ML_FINISH_STOP,   /* the token is a stop id */
    ML_FINISH_LENGTH, /* max_tokens tokens generated */
} ml_finish;

/* State of one sequence: a copy of params (stop strings dropped, the bias
 * entries copied into the sequence), the random
 * stream, and its penalty entries (sample.h step 1), sized once from
 * max_tokens and the prompt: the distinct ids of the prompt (when the
 * repetition penalty is on) and of the output, each with its count in the
 * output, found through an open-addressing table. Every penalty off costs no
 * memory. prompt: n_prompt ids (borrowed, read once); ids >= n_vocab have no
 * logit (<|image|> is 128256 for a 128256-logit head) and are ignored.
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

/* The controls of this step (*row), the sequence's penalty entries
 * (*pen_id, *pen_count: row->n_pen each, borrowed until the next accept;
 * row->pen_start is 0) and its bias entries (*bias: row->n_bias, borrowed
 * for the sequence's life, NULL when none; row->bias_start is 0). A
 * non-greedy row draws its u from the stream: call once per sampled step. */
void ml_sampler_seq_row(ml_sampler_seq *seq, ml_sample_row *row, const int32_t **pen_id,
                        const uint32_t **pen_count, const ml_logit_bias **bias);

/* ---- sampling on the host -------------------------------------------------- */

typedef struct ml_sampler ml_sampler;

/* Scratch for sampling over n_vocab logits (ml_sample_scratch_bytes: 3.9 MB
 * for Llama 3's 128256), allocated once. On success *out is owned by the
 * caller (ml_sampler_destroy). Errors: ML_ERR_INVALID_ARG (n_vocab 0 or over
 * INT32_MAX), ML_ERR_NOMEM. */
ml_status ml_sampler_create(size_t n_vocab, ml_sampler **out, char *err, size_t errlen);

/* No-op on NULL. */
void ml_sampler_destroy(ml_sampler *s);

/* Choose the next token of seq from logits (n_vocab floats, borrowed, not
 * modified) with the step's row (ml_sampler_seq_row), among the tokens
 * `allowed` sets (NULL: all; else ml_sample_one's constraint): the token in
 * out->chosen.id and, when the request asked for logprobs, the raw
 * logprobs. Records nothing: call ml_sampler_seq_accept with the token.
 * Errors: ML_ERR_INVALID_ARG (seq made for another n_vocab, a finished
 * sequence; nothing drawn), ML_ERR_FORMAT (no finite maximum: every logit
 * NaN or -inf, or one is +inf). */
ml_status ml_sampler_sample(ml_sampler *s, ml_sampler_seq *seq, const float *logits,
                            const uint64_t *allowed, ml_sample_out *out, char *err, size_t errlen);

/* The distribution ml_sampler_sample would draw from for these logits
 * (ml_sample_distribution with the sequence's controls, penalties and
 * bias); draws
 * nothing and records nothing. Errors: as ml_sampler_sample. */
ml_status ml_sampler_distribution(ml_sampler *s, const ml_sampler_seq *seq, const float *logits,
                                  ml_token_logprob *out, size_t cap, size_t *n_kept, char *err,
                                  size_t errlen);

#endif
