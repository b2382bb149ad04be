/* PEFT LoRA adapters for the Mllama graph (engine/model/README.md §12).
 *
 * Three objects, one idea each:
 * - ml_lora_config: adapter_config.json parsed and checked (which modules an
 *   adapter targets, its rank and scale);
 * - ml_lora_adapter: an adapter directory (PEFT save_pretrained:
 *   adapter_config.json + adapter_model.safetensors) read into host memory
 *   and checked against a model config, every A and B in bf16;
 * - ml_lora: an adapter slot in backend memory, sized once for a maximum
 *   rank, that adapters are uploaded into. ml_step_seq.lora and
 *   ml_model_encode_image take it. On a tensor-parallel model
 *   (ml_model_load_tp) one slot holds a part on every rank's device, each
 *   the share of A and B its shard's Linears use: B's rows of the shard's
 *   output range for a column-parallel Linear, A's columns of its input
 *   range for a row-parallel one (whose partial LoRA output joins the
 *   all-reduce), both whole for a replicated one (projector, lm_head).
 *
 * What an adapter may adapt: every Linear of MllamaForConditionalGeneration
 * (transformers v4.47 module names):
 *   vision_model.{transformer,global_transformer}.layers.i.self_attn.{q,k,v,o}_proj
 *   vision_model.{transformer,global_transformer}.layers.i.mlp.{fc1,fc2}
 *   multi_modal_projector
 *   language_model.model.layers.i.{self_attn,cross_attn}.{q,k,v,o}_proj
 *   language_model.model.layers.i.mlp.{gate,up,down}_proj
 *   language_model.lm_head
 * Tensor keys are PEFT's: base_model.model.<module>.lora_A.weight (r, in)
 * and .lora_B.weight (out, r), in either checkpoint layout (engine/model/README.md §6,
 * ml_checkpoint_canonical_name); BF16, F16 or F32, converted to bf16 as
 * torch's .to(torch.bfloat16) does. The frozen lm_head copy PEFT saves next
 * to an lm_head LoRA (<module>.base_layer.weight) is checked and ignored.
 *
 * The forward is PEFT's LoraLayer.forward without dropout:
 * y = base(x) + (lora_B(lora_A(x))) · scale, scale = lora_alpha / r, or
 * lora_alpha / sqrt(r) with use_rslora.
 *
 * Which modules: target_modules as PEFT's check_target_module_exists reads
 * it: a list matches a module whose name equals an entry or ends with
 * "." + entry; a string is a regular expression that must match the whole
 * name (re.fullmatch), supported in the subset that means the same in
 * Python and POSIX ERE (literals, ., [...], groups, (?:...), |, * + ?,
 * lazy quantifiers, anchors, \d \w and escaped punctuation; no intervals,
 * back references or look-arounds); "all-linear" is every Linear but
 * lm_head. exclude_modules (newer PEFT) is read the same way. Names are
 * matched in the layout the adapter's keys use. Every targeted module must
 * have both tensors and every tensor must belong to a targeted module.
 *
 * Refused with ML_ERR_UNSUPPORTED, naming the field: another peft_type,
 * bias other than "none", use_dora, lora_bias, fan_in_fan_out,
 * modules_to_save, rank_pattern, alpha_pattern, layers_to_transform,
 * layer_replication, megatron_config, target_parameters,
 * trainable_token_indices, use_qalora, alora_invocation_tokens,
 * arrow_config (unless unset), and init_lora_weights "pissa", "olora",
 * "loftq" or "corda" (such adapters expect modified base weights). Other
 * fields are informational and ignored.
 * @locality: any thread for the config and the adapter; an ml_lora is
 * driven by the thread that drives its model's backend. */
#ifndef ML_MODEL_LORA_H
#define ML_MODEL_LORA_H

#include <stddef.h>

#include "checkpoint/config.h"
#include "model/mllama.h"
#include "status.h"

/* Largest rank accepted in adapter_config.json. */
#define ML_LORA_MAX_RANK 1024
/* adapter_config.json larger than this is rejected (PEFT writes ~1 KB). */
#define ML_LORA_CONFIG_MAX_BYTES (1u << 20)
/* Longest target_modules / exclude_modules entry or expression. */
#define ML_LORA_PATTERN_MAX 1024
/* Most entries in a target_modules / exclude_modules list. */
#define ML_LORA_MAX_PATTERNS 4096

#define ML_LORA_CONFIG_FILE "adapter_config.json"
#define ML_LORA_WEIGHTS_FILE "adapter_model.safetensors"

/* ---- ml_lora_config: adapter_config.json ------------------------------- */

typedef struct ml_lora_config ml_lora_config;

/* Parse and check adapter_config.json held in json[0..len) (not
 * NUL-terminated). Returns ML_OK and a new object in *out (owned by the
 * caller, ml_lora_config_destroy), or *out = NULL and ML_ERR_FORMAT (bad
 * JSON, a wrong type or value; err names the field), ML_ERR_UNSUPPORTED (a
 * valid feature this engine does not serve), ML_ERR_TOO_LARGE (a list or
 * pattern over its limit), ML_ERR_NOMEM. */
ml_status ml_lora_config_parse(ml_lora_config **out, const char *json, size_t len, char *err,
                               size_t errlen);

/* NULL is a no-op. */
void ml_lora_config_destroy(ml_lora_config *c);

int ml_lora_config_rank(const ml_lora_config *c);
/* lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, in f32. */
float ml_lora_config_scale(const ml_lora_config *c);

/* 1 when the module named `name` (as PEFT sees it) is targeted and not
 * excluded. */
int ml_lora_config_targets(const ml_lora_config *c, const char *name);

/* ---- ml_lora_adapter: an adapter directory in host memory -------------- */

typedef struct ml_lora_adapter ml_lora_adapter;

/* Read the adapter in directory dir for a model of config cfg (validated).
 * Returns ML_OK and a new object (owned by the caller,
 * ml_lora_adapter_destroy), or *out = NULL and: ML_ERR_NOT_FOUND (a file,
 * or a tensor a targeted module needs; err names it), ML_ERR_FORMAT (a
 * malformed file, a tensor of the wrong shape or dtype, a tensor of a module
 * target_modules does not name), ML_ERR_UNSUPPORTED (a config feature as
 * above, or a tensor of a module that is not an adaptable Linear, e.g. an
 * embedding or the patch conv), ML_ERR_IO, ML_ERR_NOMEM. Every message
 * starts with dir. */
ml_status ml_lora_adapter_load(ml_lora_adapter **out, const char *dir, const ml_config *cfg,
                               char *err, size_t errlen);

/* NULL is a no-op. */
void ml_lora_adapter_destroy(ml_lora_adapter *a);

int ml_lora_adapter_rank(const ml_lora_adapter *a);
float ml_lora_adapter_scale(const ml_lora_adapter *a);
/* Linears the adapter adapts. */
int ml_lora_adapter_n_modules(const ml_lora_adapter *a);
/* 1 when it adapts the vision tower, the projector or a cross-attention
 * k/v projection: then an image's resident state depends on the adapter. */
int ml_lora_adapter_touches_images(const ml_lora_adapter *a);

/* ---- ml_lora: an adapter slot in backend memory ------------------------ */

/* Backend bytes of one slot of model m for adapters of rank <= max_rank:
 * (in + out) · max_rank bf16 elements for every adaptable Linear, on each
 * device: under tensor parallelism in and out are the shard's (1/world of
 * the split dimension), per rank. */
size_t ml_lora_slot_bytes(const ml_model *m, int max_rank);

/* An empty slot of m (borrowed; it must outlive the slot) holding adapters
 * of rank <= max_rank; for a tensor-parallel model, one part in every
 * rank's backend behind the one handle. Errors: ML_ERR_INVALID_ARG
 * (max_rank outside [1, the model limits' max_lora_rank]),
 * ML_ERR_UNSUPPORTED (the backend has no lora op, or m is one shard of a
 * group of world > 1 driven by hand: make the slot on the ml_model_load_tp
 * model), ML_ERR_NOMEM (naming the rank whose device is full). */
ml_status ml_lora_create(ml_lora **out, ml_model *m, int max_rank, char *err, size_t errlen);

/* Free the slot's backend memory (every rank's part). NULL is a no-op. The
 * caller guarantees no queued work still reads it (synchronize on devices). */
void ml_lora_destroy(ml_lora *l);

/* Upload adapter a (borrowed for the call; it may be freed after) into the
 * slot, replacing what it held (on a tensor-parallel model, each rank's
 * share into its part, from the caller's thread). The caller guarantees no
 * step or encode in flight uses the slot. Errors: ML_ERR_INVALID_ARG (a was
 * loaded for another model shape, or its rank exceeds the slot's); the slot
 * is then empty (adapts nothing). */
ml_status ml_lora_set(ml_lora *l, const ml_lora_adapter *a, char *err, size_t errlen);

/* As ml_lora_adapter_touches_images for the adapter the slot holds (0 when
 * empty). */
int ml_lora_touches_images(const ml_lora *l);

#endif
