/* safetensors files and Hugging Face checkpoint directories.
 *
 * Three objects, one idea each:
 * - ml_safetensors: one .safetensors file (or buffer), header parsed and
 *   validated, tensor data left in place (safetensors.c);
 * - ml_checkpoint: a model directory, single-file or sharded through
 *   model.safetensors.index.json, looked up by canonical tensor name
 *   (checkpoint.c);
 * - the writers, for tests and `mllama mkmodel` (safetensors_write.c).
 *
 * Format (huggingface/safetensors): an 8-byte little-endian header length N,
 * N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]},
 * "__metadata__": {...}}, then the data region; offsets are relative to the
 * data region. Every file is treated as hostile: the header is bounded, every
 * tensor's byte range must lie in the data region, match dtype × shape
 * exactly and not overlap another tensor; gaps between tensors are allowed.
 *
 * Ownership: tensor data pointers and names are borrowed from the object
 * that returned them and stay valid until its _destroy.
 * @locality: any thread. Objects are immutable after open/parse, so
 * concurrent readers need no lock. */
#ifndef ML_CHECKPOINT_SAFETENSORS_H
#define ML_CHECKPOINT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#define ML_TENSOR_MAX_DIMS 8
/* The header length prefix: a little-endian u64. */
#define ML_SAFETENSORS_LEN_BYTES 8
/* Headers (and index.json files) larger than this are rejected; real
 * headers are about 100 KB. */
#define ML_SAFETENSORS_MAX_HEADER (100u << 20)
/* A sharded checkpoint may name at most this many shard files. */
#define ML_CHECKPOINT_MAX_SHARDS 4096

#define ML_CHECKPOINT_SINGLE_FILE "model.safetensors"
#define ML_CHECKPOINT_INDEX_FILE "model.safetensors.index.json"

/* One tensor of a safetensors file. As an input of the writers, data may be
 * NULL: the tensor is then left as zeros (a hole in a sparse file). */
typedef struct ml_tensor_view {
    const char *name; /* borrowed: the name as stored in the file */
    ml_dtype dtype;
    int ndim;                          /* 0 (a scalar) .. ML_TENSOR_MAX_DIMS */
    int64_t shape[ML_TENSOR_MAX_DIMS]; /* row-major, shape[ndim..] unused */
    /* borrowed from the mapping; alignment is whatever the file gives (the
     * reference writer keeps every tensor aligned to its element size, but
     * a hostile file need not), so read it through memcpy or check. */
    const void *data;
    size_t nbytes; /* numel × element size */
} ml_tensor_view;

/* Number of elements (1 for a scalar). */
int64_t ml_tensor_view_numel(const ml_tensor_view *t);

/* Convert a BF16/F16/F32/F8_E4M3 tensor to numel f32 values in out (any
 * alignment of t->data); exact, each type being a subset of f32.
 * ML_ERR_INVALID_ARG for integer dtypes, with t's name in err. */
ml_status ml_tensor_view_read_f32(const ml_tensor_view *t, float *out, char *err, size_t errlen);

/* Convert an I64/I32/U8 tensor to numel int64 values in out.
 * ML_ERR_INVALID_ARG for floating dtypes. */
ml_status ml_tensor_view_read_i64(const ml_tensor_view *t, int64_t *out, char *err, size_t errlen);

/* ---- ml_safetensors: one file ------------------------------------------ */

typedef struct ml_safetensors ml_safetensors;

/* Map the file at path (read-only, MAP_PRIVATE) and parse its header.
 * Returns ML_OK and a new object in *out (owned by the caller; free with
 * ml_safetensors_destroy), or an error with *out = NULL: ML_ERR_NOT_FOUND /
 * ML_ERR_IO (cannot open or map), ML_ERR_FORMAT (truncated file, header
 * length beyond the file, invalid JSON, bad entry, offsets outside the data
 * region or overlapping, size not matching dtype × shape, duplicate name),
 * ML_ERR_UNSUPPORTED (a valid safetensors dtype this build does not handle,
 * e.g. F64), ML_ERR_NOMEM. err names the file and the tensor. */
ml_status ml_safetensors_open(ml_safetensors **out, const char *path, char *err, size_t errlen);

/* As ml_safetensors_open over a file image already in memory: buf[0..size)
 * is borrowed and must outlive the object (tensor data points into it).
 * label names the buffer in error messages ("<buffer>" when NULL). */
ml_status ml_safetensors_parse(ml_safetensors **out, const void *buf, size_t size,
                               const char *label, char *err, size_t errlen);

/* Unmap and free. NULL is a no-op. */
void ml_safetensors_destroy(ml_safetensors *st);

/* The path (or label) the object was opened with. */
const char *ml_safetensors_label(const ml_safetensors *st);

/* Number of tensors (the __metadata__ entry is not one). */
size_t ml_safetensors_count(const ml_safetensors *st);

/* Tensor i, 0 <= i < count, in name order. */
const ml_tensor_view *ml_safetensors_tensor(const ml_safetensors *st, size_t i);

/* The tensor with exactly this name, or NULL. */
const ml_tensor_view *ml_safetensors_find(const ml_safetensors *st, const char *name);

/* ---- ml_checkpoint: a model directory ---------------------------------- */

typedef struct ml_checkpoint ml_checkpoint;

/* Open the checkpoint in directory dir: model.safetensors if present (as
 * transformers prefers it), else model.safetensors.index.json, whose
 * "weight_map" maps each tensor name to a shard file in dir. Each shard is
 * opened once; every tensor the map names must be in its shard; shard names
 * must be plain file names (no '/', not "." or ".."); no tensor may appear
 * twice under the same canonical name (ml_checkpoint_canonical_name).
 * Returns ML_OK and a new object (owned by the caller), or *out = NULL and:
 * ML_ERR_NOT_FOUND (neither file, or a missing shard), ML_ERR_FORMAT (bad
 * index, bad shard, inconsistent map), ML_ERR_IO, ML_ERR_NOMEM, or the errors
 * of ml_safetensors_open. */
ml_status ml_checkpoint_open(ml_checkpoint **out, const char *dir, char *err, size_t errlen);

/* Unmap every shard and free. NULL is a no-op. Invalidates every view and
 * name obtained from ck. */
void ml_checkpoint_destroy(ml_checkpoint *ck);

/* Number of tensors over all shards. */
size_t ml_checkpoint_count(const ml_checkpoint *ck);

/* Tensor i, 0 <= i < count, in canonical-name order; its canonical name
 * (borrowed) in *canonical when non-NULL. */
const ml_tensor_view *ml_checkpoint_tensor(const ml_checkpoint *ck, size_t i,
                                           const char **canonical);

/* The tensor whose canonical name equals that of `name`, or NULL: either key
 * layout of engine/model/README.md §6 finds it, whichever the files use. */
const ml_tensor_view *ml_checkpoint_find(const ml_checkpoint *ck, const char *name);

/* Number of shard files (1 for a single-file checkpoint). */
int ml_checkpoint_n_shards(const ml_checkpoint *ck);

/* The canonical (hub, "legacy") spelling of a tensor name: the transformers
 * >= 4.52 prefixes of MllamaForConditionalGeneration are mapped back,
 *   model.language_model.X      -> language_model.model.X
 *   model.vision_model.X        -> vision_model.X
 *   model.multi_modal_projector.X -> multi_modal_projector.X
 *   lm_head.X                   -> language_model.lm_head.X
 * and every other name is itself. Writes the NUL-terminated result to
 * out[0..n) and returns its length; truncated (like snprintf) when the
 * return value is >= n. */
size_t ml_checkpoint_canonical_name(const char *name, char *out, size_t n);

/* ---- writers ----------------------------------------------------------- */

/* Write tensors[0..n) as one safetensors file at path, as the reference
 * writer does: header {"__metadata__": {"format": "pt"}, ...} padded with
 * spaces to a multiple of 8, data ordered by decreasing element size (so
 * every tensor stays aligned to its element size), then by input order.
 * Tensors with data == NULL are left as a hole: the file is extended with
 * ftruncate, so a header-only file of any declared size costs no disk.
 * Written to "<path>.tmp" then renamed, so path is never half-written.
 * Errors: ML_ERR_INVALID_ARG (duplicate or empty name, "__metadata__",
 * ndim/shape out of range, nbytes not matching dtype × shape when data is
 * given), ML_ERR_IO, ML_ERR_NOMEM. */
ml_status ml_safetensors_write(const char *path, const ml_tensor_view *tensors, size_t n, char *err,
                               size_t errlen);

/* Write tensors[0..n) into directory dir (which must exist) the way
 * save_pretrained shards: in input order, a new shard starts when the next
 * tensor would push the current one past max_shard_bytes of data. One shard
 * is written as model.safetensors; several as
 * model-00001-of-0000K.safetensors ... plus model.safetensors.index.json
 * {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}.
 * *n_shards (when non-NULL) receives the shard count. Errors as
 * ml_safetensors_write. */
ml_status ml_safetensors_write_sharded(const char *dir, const ml_tensor_view *tensors, size_t n,
                                       uint64_t max_shard_bytes, int *n_shards, char *err,
                                       size_t errlen);

#endif
