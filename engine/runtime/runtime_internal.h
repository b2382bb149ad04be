/* What the runtime's files share; not an API. runtime.c holds the object
 * (create, destroy, the queries), sequence.c a sequence's life (submit, its
 * cross-attention rows, each sampled token streamed, cancel and the end),
 * scheduler.c the step (deadlines, admission, K/V blocks and preemption,
 * the batch and the forward pass).
 *
 * @locality: the step loop thread, as everything in runtime.h. */
#ifndef ML_RUNTIME_RUNTIME_INTERNAL_H
#define ML_RUNTIME_RUNTIME_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "clock.h"
#include "list.h"
#include "grammar/json_mode.h"
#include "runtime/constraint.h"
#include "runtime/runtime.h"
#include "runtime/stop.h"

typedef enum seq_state {
    SEQ_WAITING,
    SEQ_RUNNING,
    SEQ_UNFORKED, /* a choice waiting for its request's prompt: in no list, held by
                     choice 0's forks */
} seq_state;

typedef struct rt_seq {
    uint64_t handle;
    seq_state state;
    ml_list_node link;          /* in the waiting or running list, as state says */

    int32_t *tokens;            /* owned (cap): prompt then generated tokens */
    int n_tokens, n_prompt, cap;
    int n_cached;               /* tokens whose K/V are in the cache */
    int32_t *blocks;            /* owned (max_blocks): the block table */
    int n_blocks;
    /* Prefix cache (prefix.c): the digests of the sequence's full blocks,
     * (cap / block_size, ML_KV_BLOCK_HASH_BYTES), computed as far as
     * n_chain (they follow from the tokens, so they survive preemption),
     * and of the block table, the first n_published blocks were found in
     * the cache or published. */
    uint8_t *chain;             /* owned */
    uint8_t root[ML_KV_BLOCK_HASH_BYTES];
    int rooted, n_chain, chain_images, n_published;

    int n_images;
    /* owned (n_images): pixels owned until encoded; each key is its state's
     * (ml_image_state_key), the content digests the request gave are kept
     * in content to derive an adapter's keys at admission. */
    ml_request_image *images;
    uint8_t (*content)[ML_IMAGE_KEY_BYTES]; /* owned (n_images) */
    uint8_t salt[ML_CACHE_SALT_BYTES]; /* the request's cache partition */
    ml_image_entry **entries;   /* owned (n_images): acquired cache entries, NULL until admitted */
    const void **states;        /* owned (n_images): their backend states, for the model */
    int *range_start, *range_end; /* owned (n_images): token ranges of the cross mask */

    char *adapter_name;         /* owned: the request's adapter, NULL for the base model */
    ml_adapter *adapter;        /* referenced from admission to the end; NULL until then */

    /* Stop strings borrowed from stop_text; no logit_bias entries (the
     * sampler holds them). */
    ml_sampling_params sampling;
    ml_sample_row row;          /* the step's sampling controls (ML_LOGITS_SAMPLE) */
    ml_sample_out sampled;      /* the step's token and logprobs */
    char *stop_text;            /* owned: the request's stop strings, back to back */
    ml_sampler_seq *sampler;    /* owned */
    ml_constraint *con;         /* owned; structured outputs only (constraint.h) */
    ml_token_stream *detok;     /* owned */
    ml_stop *stop;              /* owned */
    ml_request_callbacks cb;
    /* Choice 0 of a request of n choices, until its prompt is prefilled:
     * the other choices (SEQ_UNFORKED), forked off it then (ml_rt_seq_fork). */
    struct rt_seq **forks;      /* owned (n_forks), and each of them */
    int n_forks;
    int64_t deadline_ms;
    ml_usage usage;
    double t_submit, t_admit, t_first;
} rt_seq;

struct ml_runtime {
    ml_model *model;            /* borrowed */
    const ml_tokenizer *tok;    /* borrowed */
    ml_runtime_config cfg;
    ml_kv_cache *kv;            /* owned */
    ml_sampler *sampler;        /* owned: sampling scratch shared by all sequences */
    ml_image_cache *images;     /* owned */
    ml_adapters *adapters;      /* owned; NULL without adapter slots */
    int block_size, max_blocks, vocab, max_tiles, context;
    uint64_t next_handle;
    /* Of rt_seq.link. waiting is the FCFS queue, preempted sequences at its
     * front; running is in admission order, the newest at the tail. */
    ml_list waiting, running;
    int n_unforked;             /* SEQ_UNFORKED sequences, held by the forks of others */
    /* Per-step scratch, sized at create. */
    ml_step_seq *step;          /* (max_running) */
    rt_seq **step_owner;        /* (max_running) */
    uint8_t *allowed;           /* (max_step_tokens, max_seq_images · T) */
    float *logits;              /* (max_running, vocab) */
    /* Structured outputs, made at the first request that asks for them: */
    ml_json_vocab *json_vocab;  /* owned: the token trie the grammars walk */
    ml_masker *masker;          /* owned: the mask thread (constraint.h) */
    ml_runtime_stats stats;
};

/* The sequence linked by n; NULL for NULL (the end of a list). */
static inline rt_seq *seq_of(ml_list_node *n) { return ml_list_entry(n, rt_seq, link); }

/* ---- sequence.c ------------------------------------------------------------ */

/* Release the K/V blocks of s; its cached prefix is forgotten. */
void ml_rt_seq_release_blocks(ml_runtime *rt, rt_seq *s);

/* The cross-attention mask rows of s's tokens [pos, pos + n) into out:
 * (n, n_images · T), 1 where the token attends a real tile of the image. */
void ml_rt_seq_fill_allowed(const ml_runtime *rt, const rt_seq *s, int pos, int n, uint8_t *out);

/* Append the step's token to s and stream it: drawn here from `logits`, or
 * with logits NULL the model's s->sampled. A constrained s's mask for the
 * step is ready (the step drained the mask thread). */
void ml_rt_seq_advance(ml_runtime *rt, rt_seq *s, const float *logits);

/* The batch slots s takes once admitted: itself and its choices still to
 * fork. */
static inline int ml_rt_seq_slots(const rt_seq *s) { return 1 + s->n_forks; }

/* s's prompt is prefilled: its blocks hold every prompt token and
 * `logits` (vocab floats, on the host) are its first draw's. Fork its
 * other choices off it into the running batch (admission kept their
 * slots), sharing its blocks, image states and adapter by reference, then
 * have s and each fork draw their first token from those logits (their
 * constraints' masks ready: the step queued them). */
void ml_rt_seq_fork(ml_runtime *rt, rt_seq *s, const float *logits);

/* ---- prefix.c -------------------------------------------------------------- */

/* With the prefix cache, give s (no blocks yet: admission) the cached
 * blocks of its longest cached prefix of full blocks, by reference, and
 * count them as computed. At least one token is left to compute (its
 * logits are the next draw), so a prompt never hits its last block.
 * Returns the tokens found. s's image keys must be final (its adapter
 * acquired). */
int ml_rt_prefix_match(ml_runtime *rt, rt_seq *s);

/* With the prefix cache, publish the blocks of s that the last step
 * filled (every token's K/V written). */
void ml_rt_prefix_publish(ml_runtime *rt, rt_seq *s);

/* Remove s from its list, release everything and report the end. With
 * emit_tail, text held back by the detokenizer and the stop matcher goes
 * out with the finish; after a stop string or an error it is dropped. */
void ml_rt_seq_finish(ml_runtime *rt, rt_seq *s, ml_finish_reason reason, ml_request_error error,
                      const char *message, int emit_tail);

#endif
