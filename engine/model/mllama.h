/* The Mllama model (MllamaForConditionalGeneration) written once against the
 * backend op table: load a Hugging Face checkpoint directory, encode images
 * into resident cross-attention states, and run the text decoder over a
 * batch of sequences that share a paged self-attention K/V cache.
 *
 * The graph follows transformers v4.47 modeling_mllama.py as described in
 * engine/model/README.md; every block names the function it reproduces. Activations
 * are f32, weights bf16 (backend.h).
 *
 * @locality: a model is driven by one thread at a time (the step loop), the
 * same one that drives its backend. A tensor-parallel model (ml_model_load_tp)
 * also runs on threads of its own, inside its calls only. */
#ifndef ML_MODEL_MLLAMA_H
#define ML_MODEL_MLLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "checkpoint/config.h"
#include "model/kv_cache.h"
#include "model/memory_plan.h"
#include "status.h"

typedef struct ml_model ml_model;
/* A LoRA adapter slot in backend memory (model/lora.h). */
typedef struct ml_lora ml_lora;

/* embed_tokens has vocab_size + 8 rows (<|image|> and spares, engine/model/README.md §4.1):
 * valid input ids are [0, vocab_size + 8), logits cover [0, vocab_size). */
#define ML_MODEL_EMBED_EXTRA_ROWS 8

/* What a cross-attention layer adds for a text row that may see no image
 * tile (the full-text-row mask is 0: engine/model/README.md §4.6). */
typedef enum ml_row_mask_mode {
    /* Meta's reference CrossAttentionTransformerBlock, which vLLM and SGLang
     * follow: the row's attention output and its MLP output are both
     * zeroed, so the row leaves the layer unchanged. */
    ML_ROW_MASK_REFERENCE = 0,
    /* transformers 4.47: only the MLP output is zeroed; the attention
     * output (uniform over every key of the sequence's images) is added. */
    ML_ROW_MASK_TRANSFORMERS,
} ml_row_mask_mode;

/* "reference" or "transformers" (static). */
const char *ml_row_mask_mode_name(ml_row_mask_mode mode);
/* The mode named s; 0, or -1 for a name that is neither. */
int ml_row_mask_mode_parse(const char *s, ml_row_mask_mode *out);

/* Sizes that bound the workspace allocated at load (nothing is allocated
 * while the model runs), and the two choices made with them. */
typedef struct ml_model_limits {
    int max_step_tokens;  /* text tokens in one forward step, all sequences together */
    int max_step_seqs;    /* sequences in one forward step */
    int max_logit_rows;   /* rows of logits one step may return (>= max_step_seqs) */
    int max_seq_images;   /* images one sequence may attend to */
    int kv_block_size;    /* tokens per K/V cache block; the cache must use the same */
    int max_lora_rank;    /* largest rank of an adapter slot (model/lora.h); 0 = no LoRA */
    /* 1: replay pure decode steps from backend graphs (ml_model_forward);
     * 0: run every step op by op. Results agree to rounding (a graph runs
     * the batch padded to its bucket). */
    int decode_graphs;
    ml_row_mask_mode row_mask;
    /* 1: quantize a float checkpoint's text-decoder Linears to FP8 at load
     * (model.weights = "fp8"; ml_quant_config_fp8_at_load); a checkpoint
     * that is already quantized loads as stored. 0: every weight as stored. */
    int quantize_fp8;
    /* 1: W8A8, the FP8 Linears quantize their activations per token at run
     * time (model.fp8_activations = "fp8": vLLM's numerics; backend.h
     * matmul_f8 quant_x); the load fails with ML_ERR_INVALID_ARG unless the
     * weights are FP8 (an FP8 checkpoint, whatever its input_activations,
     * or quantize_fp8). 0: W8A16, activations kept in f32 (transformers'
     * decompressed reference). */
    int fp8_activations;
    /* 1: lm_head FP8 too, per output channel (model.fp8_lm_head): an FP8
     * checkpoint's bf16 lm_head (the published ones ignore it) or a float
     * one with quantize_fp8 is quantized at load, one stored F8_E4M3 binds
     * as stored; the load fails with ML_ERR_INVALID_ARG unless the weights
     * are FP8. 0: lm_head as the checkpoint's quantization says (bf16 in
     * the published FP8 checkpoints and with quantize_fp8). */
    int fp8_lm_head;
} ml_model_limits;

/* Defaults: 512-token steps, 32 sequences, 8 images per sequence, 16-token
 * blocks, LoRA ranks up to 64, decode graphs on, the reference row mask. */
ml_model_limits ml_model_limits_default(void);

/* Load config.json and the safetensors checkpoint under dir, bind the weights
 * to `be` (borrowed; it must outlive the model) and size the workspace.
 * Returns ML_OK and *out (owned by the caller, ml_model_destroy), or an error
 * from the config parser, the checkpoint loader or ML_ERR_NOMEM. */
ml_status ml_model_load(ml_model **out, const char *dir, ml_backend *be,
                        const ml_model_limits *limits, char *err, size_t errlen);

/* As ml_model_load, for shard `rank` of a tensor-parallel group of `world`
 * (engine/model/README.md §11; ml_model_load is shard 0 of 1). Each shard keeps 1/world
 * of the attention heads, K/V heads and MLP channels of every layer, text
 * and vision, and all-reduces its partial outputs over `be`'s group
 * (backend.h all_reduce_sum): the world shards' backends are members of one
 * group, each shard is driven by its own thread, and every shard is given
 * the same calls (encode, forward) in the same order; each returns the
 * whole model's result (the logits are bit-identical on every shard). A
 * shard uses its rank's pools of the group's K/V cache
 * (ml_kv_cache_create_group, ml_model_kv_heads heads per rank) and image
 * states of its own (ml_model_image_state_bytes). ml_model_load_tp drives
 * the shards for the caller. Errors: as ml_model_load, and
 * ML_ERR_INVALID_ARG (rank outside [0, world)), ML_ERR_UNSUPPORTED (a head
 * count or MLP width that world does not divide, or world > 1 on a backend
 * without all_reduce_sum). A shard of world > 1 driven by hand takes no
 * LoRA slot (ml_lora_create refuses it): ml_model_load_tp's slots hold the
 * shards' parts. */
ml_status ml_model_load_shard(ml_model **out, const char *dir, ml_backend *be,
                              const ml_model_limits *limits, int rank, int world, char *err,
                              size_t errlen);

/* A tensor-parallel model (engine/model/README.md §11) that is driven as one model:
 * shard r is ml_model_load_shard(rank r, world) on bes[r] (borrowed, each
 * outliving the model), the members of one backend group
 * (ml_backend_cpu_create_group, ml_backend_cuda_create_group). Every call
 * on the result (ml_model_encode_image, ml_model_forward) runs the same
 * call on every shard at once and returns rank 0's results (the shards'
 * logits are bit-identical); rank 0 runs on the caller's thread, ranks 1..
 * each on a thread the model owns, woken per call (the shards are loaded
 * in parallel on them too; ml_model_destroy joins them). A shard's error
 * comes back from the call: the lowest failing rank's, with its rank
 * named when it is not 0. Its K/V cache and image states hold one part
 * per rank behind one handle: make them with ml_model_kv_cache_create and
 * ml_model_image_state_alloc; so do its LoRA slots (ml_lora_create on the
 * model), each rank holding its shard's share of every A and B. world 1 is
 * exactly ml_model_load on bes[0], with no
 * thread. Errors: ML_ERR_INVALID_ARG (world < 1), those of
 * ml_model_load_shard (e.g. ML_ERR_UNSUPPORTED for a world that does not
 * divide the heads, or backends that are not one group), ML_ERR_NOMEM (a
 * thread that would not start); on error nothing is left allocated. */
ml_status ml_model_load_tp(ml_model **out, const char *dir, ml_backend *const *bes, int world,
                           const ml_model_limits *limits, char *err, size_t errlen);

/* NULL is a no-op. A tensor-parallel model's threads are joined. */
void ml_model_destroy(ml_model *m);

const ml_config *ml_model_config(const ml_model *m);
const ml_model_limits *ml_model_limits_of(const ml_model *m);
/* The model's backend; rank 0's for a tensor-parallel model. */
ml_backend *ml_model_backend(const ml_model *m);
/* The tensor-parallel world: ml_model_load_tp's or a shard's world, 1 for
 * ml_model_load. */
int ml_model_world(const ml_model *m);
/* K/V heads this model caches per token on each device: the n_kv_heads of
 * its ml_kv_cache (text_config.num_key_value_heads / world). */
int ml_model_kv_heads(const ml_model *m);

/* ---- memory behind one handle per object ------------------------------ */

/* Bytes one K/V cache block (every self-attention layer, K and V) takes on
 * each device of the model: a shard holds 1/world of the K/V heads, so a
 * budget of B bytes per device holds B / this blocks, world times the
 * tokens of one device serving the whole model. */
size_t ml_model_kv_block_bytes(const ml_model *m);

/* The memory plan of m on each of its devices (memory_plan.h): its
 * weights as loaded (FP8 at load included), its workspace, block size and
 * backend's kv_elem_size and world, which this fills into *spec; the
 * caller sets spec's device_bytes, backend_bytes, kv_bytes, image_bytes
 * and adapter_bytes. Errors: those of ml_memory_plan_compute. */
ml_status ml_model_memory_plan(const ml_model *m, ml_memory_plan_spec *spec, ml_memory_plan *out,
                               char *err, size_t errlen);

/* A K/V cache of n_blocks blocks of the limits' kv_block_size for m: pools
 * for each of its ranks in that rank's backend, one block allocator (a
 * block id names the same slots on every rank). Owned by the caller
 * (ml_kv_cache_destroy, before the model). Errors: as
 * ml_kv_cache_create_group. */
ml_status ml_model_kv_cache_create(ml_kv_cache **out, const ml_model *m, int n_blocks,
                                   char *err, size_t errlen);

/* A resident image state for m (ml_model_encode_image writes it,
 * ml_step_seq.image_states reads it): ml_model_image_state_bytes of
 * backend memory on each device. For a model that is not tensor parallel
 * (ml_model_load, or one shard driven by hand) it is the backend buffer
 * itself; for ml_model_load_tp with world > 1 an opaque handle to one
 * buffer per rank. NULL when out of memory. Owned by the caller
 * (ml_model_image_state_free). */
void *ml_model_image_state_alloc(ml_model *m);

/* Free a state of ml_model_image_state_alloc. NULL is a no-op. */
void ml_model_image_state_free(ml_model *m, void *state);

/* ---- images ----------------------------------------------------------- */

/* Bytes of one image's resident cross-attention state on each device: for
 * every cross layer, K and V of (max_tiles · num_patches, ml_model_kv_heads,
 * head_dim) in the backend's kv type. 11B: 200 MiB at bf16 (under tensor
 * parallelism 1/world of it on each of the world devices). */
size_t ml_model_image_state_bytes(const ml_model *m);

/* Optional host copies of intermediate vision results, for golden tests. */
typedef struct ml_vision_taps {
    float *vision_output;    /* (max_tiles, num_patches, vision_output_dim) or NULL */
    float *projector_output; /* (max_tiles, num_patches, text hidden) or NULL */
} ml_vision_taps;

/* Run the vision tower, the projector and every cross layer's k/v projection
 * (+ k_norm) for one image, writing its resident state into `state`
 * (borrowed: from ml_model_image_state_alloc, or for a model that is not
 * tensor parallel any backend memory of ml_model_image_state_bytes). With an
 * adapter (borrowed; NULL = the base model), its LoRA of the vision tower,
 * the projector and the cross k/v projections applies to this image, so the
 * state belongs to (image, adapter) when ml_lora_touches_images says so.
 * pixels: host (max_tiles, 3, S, S) f32 with exact zeros in unused tile
 * slots (engine/image packing); aspect_ratio_id in 1..n_ids-1, or 0 for
 * the zero padding slot transformers' pack_images adds to a batch row with
 * fewer images (its state is needed only to reproduce such batches);
 * aspect_ratio_mask: max_tiles flags. In the reference row-mask mode the
 * projector and the k/v projections skip the tiles after the last flagged
 * one, which no text row attends to there (engine/model/README.md §8), and
 * their slots of the state are zeros; a projector tap gets every tile.
 * Errors: ML_ERR_INVALID_ARG for an out-of-range id, or the backend's
 * latched error. */
ml_status ml_model_encode_image(ml_model *m, const float *pixels, int aspect_ratio_id,
                                const uint8_t *aspect_ratio_mask, const ml_lora *lora,
                                void *state, const ml_vision_taps *taps, char *err,
                                size_t errlen);

/* ---- text ------------------------------------------------------------- */

/* What a sequence wants of its step's logits (ml_step_seq.logits). */
typedef enum ml_step_logits {
    ML_LOGITS_NONE = 0,   /* nothing (a prefill chunk that does not end the prompt) */
    ML_LOGITS_LAST = 1,   /* the last token's row */
    ML_LOGITS_ALL = 2,    /* every token's row */
    /* The last token's row sampled where the logits are (the backend's
     * sample op, sample.h): a GPU then sends the host the token and its
     * logprobs instead of a vocab-sized row. */
    ML_LOGITS_SAMPLE = 3,
} ml_step_logits;

/* One sequence's share of a forward step. Tokens are appended at positions
 * pos0 .. pos0 + n_tokens - 1; their cache slots come from the block table,
 * which must already cover them. */
typedef struct ml_step_seq {
    const int32_t *tokens;        /* (n_tokens) */
    int n_tokens;
    int pos0;                     /* tokens already in the cache */
    const int32_t *block_table;   /* (ceil((pos0+n_tokens)/block_size)) physical blocks */
    int n_images;                 /* resident image states this sequence attends to; 0 = text only */
    const void *const *image_states; /* (n_images) states written by ml_model_encode_image */
    /* (n_tokens, n_images * max_tiles): may token t see tile c
     * (cross_attention_mask rows, engine/model/README.md §5); NULL when n_images == 0. */
    const uint8_t *cross_allowed;
    int logits;                   /* an ml_step_logits */
    /* ML_LOGITS_SAMPLE: the step's controls and the sequence's penalty and
     * bias entries (host, borrowed for the call; ml_sampler_seq_row gives
     * them; sample->pen_start and sample->bias_start are ignored), and
     * where the result goes (host). */
    const ml_sample_row *sample;
    const int32_t *pen_id;        /* (sample->n_pen) distinct ids in [0, vocab) */
    const uint32_t *pen_count;    /* (sample->n_pen) */
    const ml_logit_bias *bias;    /* (sample->n_bias <= ML_SAMPLE_MAX_BIAS) distinct ids in
                                     [0, vocab); NULL when n_bias is 0 */
    ml_sample_out *sampled;
    /* ML_LOGITS_SAMPLE with a constraint (structured outputs): the tokens
     * the sample op may draw, (vocab + 63) / 64 words (sample.h's bitmask;
     * host, borrowed for the call; sample->mask is ignored), NULL for none.
     * It is read only after mask_wait(mask_ctx) returns (when not NULL),
     * which the model calls once the forward pass is queued and before the
     * sample op, so that the caller can compute the mask while the pass
     * runs; mask_wait may be called from any thread of the model. */
    const uint64_t *mask;
    void (*mask_wait)(void *mask_ctx);
    void *mask_ctx;
    /* The sequence's adapter (borrowed), NULL for the base model. Its LoRA
     * of the text decoder and lm_head applies to this sequence's rows only;
     * consecutive sequences with the same adapter share one segment of
     * every LoRA op, so callers order a step by adapter. */
    const ml_lora *lora;
} ml_step_seq;

/* Optional host copy of the decoder's hidden states, as transformers'
 * output_hidden_states: (num_hidden_layers + 1, n_step_tokens, D): entry i
 * is the input of layer i, the last is the output after the final norm. */
typedef struct ml_text_taps {
    float *hidden_states;
} ml_text_taps;

/* Run one decoder step over n_seqs sequences, writing K/V of the new tokens
 * into kv (ml_model_kv_cache_create; a shard driven by hand uses the pools
 * of its own rank), logits (rows in sequence order, for the
 * ML_LOGITS_LAST and ML_LOGITS_ALL sequences) into the host buffer `logits`
 * ((rows, vocab) f32) and the sampled token of each ML_LOGITS_SAMPLE
 * sequence into its *sampled (chosen.id ML_SAMPLE_NO_TOKEN when its logits
 * have no finite maximum). Errors: ML_ERR_INVALID_ARG when the step exceeds
 * the load limits, a logits mode is unknown, a sampled sequence lacks its
 * controls or output or lists a penalty id outside the vocabulary, a token
 * id is outside the embedding or an adapter belongs to another model, the
 * backend's latched error. */
ml_status ml_model_forward(ml_model *m, ml_kv_cache *kv, const ml_step_seq *seqs, int n_seqs,
                           float *logits, const ml_text_taps *taps, char *err, size_t errlen);

#endif
