/* The runtime: continuous batching over one model (engine/model/README.md §12).
 *
 * Requests join a FCFS queue; every ml_runtime_step admits what memory
 * allows, runs one forward pass that mixes decode tokens of running
 * sequences with prefill chunks of new ones, samples, streams text through
 * the callbacks and retires finished sequences at once. Self-attention K/V
 * live in a paged cache; images' cross-attention K/V in the resident image
 * cache, shared across requests. Out of KV blocks, the newest running
 * sequence is preempted and later recomputed (its output is unchanged).
 * Requests may name a LoRA adapter: adapters live in a fixed number of
 * slots (runtime/adapters.h), a step batches sequences of any mix of
 * adapters and the base model, ordered so each adapter's rows are one
 * segment, and an image's resident state is shared between requests of one
 * cache partition (ml_request.cache_salt) unless their adapter changes it
 * (its key then includes the adapter's name: ml_image_state_key).
 * With prefix_cache, full K/V blocks are content-addressed (runtime/prefix.c):
 * a request whose prompt starts like one seen before (a system prompt, the
 * earlier turns of a chat) takes those blocks by reference and prefills
 * only the rest, with the same output as without the cache on a
 * batch-invariant backend. Both caches are partitioned by the request's
 * cache salt: requests of two salts never share a block or an image state,
 * so neither their usage nor their timings tell one what the other sent.
 *
 * Memory: the KV pool, the image-state budget and the adapter slots are
 * fixed at create, so the model workspace, the KV pool, resident images and
 * adapters never exceed what was configured; a request that could never fit
 * is refused at submit. The budgets are per device: on a tensor-parallel
 * model (ml_model_load_tp) every device holds its shard's 1/world of each
 * K/V block and image state, so the same kv_bytes and image_bytes hold
 * world times the tokens and images of one device serving the whole model,
 * and each device holds its shard's share of every adapter slot.
 *
 * @locality: every function runs on the step loop thread, and callbacks are
 * invoked on it from inside ml_runtime_step (or ml_runtime_cancel). */
#ifndef ML_RUNTIME_RUNTIME_H
#define ML_RUNTIME_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "model/mllama.h"
#include "runtime/adapters.h"
#include "runtime/image_cache.h"
#include "runtime/sampler.h"
#include "status.h"
#include "tokenizer/tokenizer.h"

typedef struct ml_runtime ml_runtime;

/* Largest max_num_tiles of a model the runtime serves (published: 4). */
#define ML_RUNTIME_MAX_TILES 16

typedef struct ml_runtime_config {
    size_t kv_bytes;        /* self-attention K/V pool, per device */
    size_t image_bytes;     /* resident cross-attention states, per device */
    int max_running;        /* sequences in the batch (<= model limits' max_step_seqs) */
    int max_step_tokens;    /* tokens in one step (<= model limits' max_step_tokens) */
    ml_image_event_fn on_image_event; /* optional; see image_cache.h */
    void *image_event_ctx;
    /* LoRA: max_adapters slots of rank max_adapter_rank (0 = the model
     * limits' max_lora_rank), filled through resolve_adapter (required when
     * max_adapters > 0). With 0 slots a request naming an adapter fails. */
    int max_adapters;
    int max_adapter_rank;
    ml_adapter_resolve_fn resolve_adapter;
    void *resolve_adapter_ctx;
    /* The prefix cache (runtime/prefix.c): full K/V blocks shared by
     * content. 0 = every request prefills its whole prompt. */
    int prefix_cache;
    /* The model's identity (the service's model fingerprint), the root of
     * every block key; all zero when the caller has none (the cache lives
     * and dies with this runtime's model, so it is then still exact). */
    uint8_t model_fingerprint[ML_KV_BLOCK_HASH_BYTES];
} ml_runtime_config;

/* Why a request ended. */
typedef enum ml_finish_reason {
    ML_FINISH_REASON_STOP,      /* a stop token or stop string */
    ML_FINISH_REASON_LENGTH,    /* max_tokens or the context length */
    ML_FINISH_REASON_CANCELLED, /* ml_runtime_cancel */
    ML_FINISH_REASON_DEADLINE,  /* the deadline passed */
    ML_FINISH_REASON_ERROR,     /* see the error code and message */
} ml_finish_reason;

/* Request-level error codes, the stable protocol codes of service/protocol/README.md
 * ("Replies and errors") that the runtime can detect itself. */
typedef enum ml_request_error {
    ML_REQERR_NONE,
    ML_REQERR_INVALID_REQUEST,  /* inconsistent images / image tokens */
    ML_REQERR_INVALID_IMAGE,    /* an image neither resident nor given */
    ML_REQERR_IMAGE_EVICTED,    /* an image the caller can give was not resident after all
                                   (ml_request_image.at_caller): nothing was generated */
    ML_REQERR_CONTEXT_LENGTH,   /* prompt over the context or the KV pool */
    ML_REQERR_TOO_LARGE,        /* its images can never fit the image budget */
    ML_REQERR_UNKNOWN_ADAPTER,  /* the adapter is unknown or cannot be served */
    ML_REQERR_INTERNAL,         /* the model failed */
} ml_request_error;

typedef struct ml_usage {
    int prompt_tokens, completion_tokens;
    /* Prompt tokens whose K/V came from the prefix cache at admission (a
     * multiple of the block size; 0 without the cache): prefill computed
     * prompt_tokens - prompt_tokens_cached of them. */
    int prompt_tokens_cached;
    int images, images_cached;      /* images, and how many were resident already */
    int preemptions;
    double queue_ms, vision_ms, prefill_ms, decode_ms, ttft_ms;
} ml_usage;

typedef struct ml_request_callbacks {
    /* Optional: the raw logits (vocab floats, borrowed for the call) of each
     * step, before sampling, e.g. for `mllama run --logits-out`. */
    void (*on_logits)(void *ctx, const float *logits, int vocab);
    /* A sampled token and the text it completes (possibly empty: a partial
     * UTF-8 character, or text held back because it may start a stop
     * string). lp is NULL unless logprobs were requested. Never called for
     * a stop token. */
    void (*on_token)(void *ctx, int32_t id, const char *text, size_t len,
                     const ml_sample_out *lp);
    /* The end: text still held back (emitted before the finish), reason,
     * error (ML_REQERR_NONE unless reason is ML_FINISH_REASON_ERROR) and message,
     * usage. Exactly once per submitted request; the request's memory is
     * already released. */
    void (*on_finish)(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *usage);
    void *ctx;
} ml_request_callbacks;

/* One image of a request, in the order of its <|image|> tokens. */
typedef struct ml_request_image ml_request_image;
struct ml_request_image {
    /* The image's content digest (sha256 of its bytes, or what the client
     * named): the runtime keys its state by ml_image_state_key of it, the
     * request's cache salt and, when it changes images, its adapter. */
    uint8_t key[ML_IMAGE_KEY_BYTES];
    /* Transferred: (max_tiles, 3, S, S) f32 packed by ml_image_pack_slot, or
     * NULL to require a resident state. The runtime frees it (free()). */
    float *pixels;
    int aspect_ratio_id;
    int n_tiles;                     /* real tiles: tiles_h · tiles_w (a resident
                                        state's own count wins) */
    /* With pixels: flags exactly the first n_tiles tiles, as the image
     * processor makes it (ml_engine_prepare_image); submit refuses another
     * with ML_REQERR_INVALID_IMAGE. */
    uint8_t aspect_ratio_mask[ML_RUNTIME_MAX_TILES];
    /* With pixels NULL: the caller can make the pixels (it holds the image)
     * and names the image by key because it saw the state resident. Should
     * the state be gone at admission (evicted since the caller looked; it
     * is not checked at submit), the request ends with
     * ML_REQERR_IMAGE_EVICTED before anything is generated, so that the
     * caller decodes the image on a thread of its own and submits the
     * request again with its pixels: the thread stepping the runtime never
     * decodes. Without at_caller a missing state is ML_REQERR_INVALID_IMAGE. */
    int at_caller;
};

typedef struct ml_request {
    const int32_t *prompt;           /* borrowed for the call (copied) */
    int n_prompt;
    ml_request_image *images;        /* borrowed array; each pixels transferred */
    int n_images;
    ml_sampling_params sampling;     /* copied, stop strings and logit_bias entries included */
    int64_t deadline_ms;             /* CLOCK_REALTIME ms; 0 = none */
    /* LoRA adapter name, borrowed for the call (copied); NULL or "" = the
     * base model. A name the resolver does not know ends the request at
     * submit (ML_REQERR_UNKNOWN_ADAPTER); one whose files cannot be served
     * ends it when it is admitted, with the same code. */
    const char *adapter;
    /* The cache partition (the service: its tenant's cache group, hashed):
     * the root of every prefix-cache key and part of every image-state key,
     * so requests share cached blocks and image states only with requests
     * of an equal salt. All zero is a partition like any other. */
    uint8_t cache_salt[ML_CACHE_SALT_BYTES];
    ml_request_callbacks cb;
    /* Choices (OpenAI's n): 0 or 1 is one choice, reported through cb.
     * With n > 1, choice i is reported through choices[i] (n entries,
     * borrowed for the call, copied) and cb is unused. The prompt is
     * prefilled once, by choice 0, its images encoded once; when its
     * prefill ends, choices 1 .. n-1 are forked off it: each takes the
     * prompt's K/V blocks and the image states by reference (a partly
     * filled last block is copied by whichever choice writes into it
     * first) and draws its first token from the same logits row, then
     * samples on its own: choice i exactly as a request with n = 1 and
     * seed sampling.seed + i (bit for bit on a batch-invariant backend),
     * with its own penalties, stop strings and constraint. Each choice ends on its own, with its
     * own on_finish; ml_runtime_cancel and a failure before the fork end
     * every choice. n choices count as n sequences against max_running
     * (the request is admitted when all n fit the batch) and n above
     * max_running is refused (ML_REQERR_INVALID_REQUEST). */
    int n;
    const ml_request_callbacks *choices;
} ml_request;

/* Create a runtime over model (borrowed) and tokenizer (borrowed). Errors:
 * ML_ERR_INVALID_ARG (config inconsistent with the model's limits),
 * ML_ERR_UNSUPPORTED (more tiles than ML_RUNTIME_MAX_TILES, adapter slots
 * on a backend without LoRA), ML_ERR_NOMEM (the KV pool, tables or
 * adapter slots). */
ml_status ml_runtime_create(ml_runtime **out, ml_model *model, const ml_tokenizer *tok,
                            const ml_runtime_config *cfg, char *err, size_t errlen);

/* Finishes every request as cancelled (callbacks run), then frees. NULL is a
 * no-op. */
void ml_runtime_destroy(ml_runtime *rt);

/* Queue a request. On ML_OK *handle identifies it and its callbacks will
 * run to completion, on_finish exactly once per choice. A request that is invalid or could never
 * fit is not queued: the return is ML_OK as well and on_finish has already
 * run with ML_FINISH_REASON_ERROR (so every request ends through one path). Other
 * errors (ML_ERR_NOMEM) mean nothing was queued and no callback ran; the
 * images' pixels are freed in every case. */
ml_status ml_runtime_submit(ml_runtime *rt, const ml_request *req, uint64_t *handle, char *err,
                            size_t errlen);

/* Cancel a queued or running request, every choice of it:
 * on_finish(ML_FINISH_REASON_CANCELLED) runs for each unfinished choice
 * before this returns. Unknown or finished handles are ignored. */
void ml_runtime_cancel(ml_runtime *rt, uint64_t handle);

/* One scheduling step. Returns ML_OK (also when idle) or a process-level
 * error from the backend, after which the runtime must be destroyed. */
ml_status ml_runtime_step(ml_runtime *rt, char *err, size_t errlen);

/* Sequences queued or running, each choice of a request one (those not
 * yet forked included). */
int ml_runtime_active(const ml_runtime *rt);

/* The resident image cache (for lookups by the service). Borrowed. */
ml_image_cache *ml_runtime_image_cache(ml_runtime *rt);

/* Gauges for metrics. */
typedef struct ml_runtime_stats {
    int waiting, running;
    int kv_blocks_total, kv_blocks_free;
    size_t image_bytes_used, image_bytes_budget;
    uint64_t steps, tokens_generated, preemptions, images_encoded, image_cache_hits;
    uint64_t images_evicted;      /* requests ended with ML_REQERR_IMAGE_EVICTED */
    /* Prompt tokens computed by prefill chunks (recomputes after a
     * preemption included, prefix-cache hits not), and choices forked off
     * a prefilled prompt (ml_request.n): n choices add n - 1 forks and
     * prefill their prompt once. */
    uint64_t prefill_tokens, choices_forked;
    /* Prefix cache: full blocks looked up at admission (readmission after a
     * preemption included) and found or not, idle cached blocks evicted for
     * room, and blocks published now (in use or idle; idle ones are also
     * counted in kv_blocks_free). */
    uint64_t prefix_block_hits, prefix_block_misses, kv_blocks_evicted;
    int kv_blocks_cached;
    ml_adapters_stats adapters;   /* all zero without adapter slots */
} ml_runtime_stats;
void ml_runtime_get_stats(const ml_runtime *rt, ml_runtime_stats *st);

#endif
