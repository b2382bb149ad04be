/* LoRA adapter slots (engine/model/README.md §12): a fixed number of slots in backend
 * memory, allocated at create for adapters up to one rank, so adapters never
 * compete with the K/V pool or resident images for memory. Adapters are
 * found by name, loaded on demand from the directory a resolver names,
 * referenced by the sequences that use them, and replaced
 * least-recently-used among the slots no sequence references.
 *
 * An adapter name stands for immutable content, like a model revision: a
 * resident adapter is reused by name without looking at its files again, and
 * image states computed with it are keyed by its name. Publish a changed
 * adapter under a new name.
 *
 * @locality: the step loop thread; the resolver is called on it and must
 * not block on the network (resolve to a directory that is already local). */
#ifndef ML_RUNTIME_ADAPTERS_H
#define ML_RUNTIME_ADAPTERS_H

#include <stddef.h>
#include <stdint.h>

#include "model/lora.h"
#include "model/mllama.h"
#include "status.h"

/* Longest adapter name, NUL included. */
#define ML_ADAPTER_NAME_MAX 256

/* Write into dir (n bytes, NUL-terminated) the directory holding adapter
 * `name` (adapter_config.json + adapter_model.safetensors). Returns 1 when
 * the name is known, 0 when it is not. */
typedef int (*ml_adapter_resolve_fn)(void *ctx, const char *name, char *dir, size_t n);

typedef struct ml_adapters ml_adapters;
/* A slot holding a named adapter. */
typedef struct ml_adapter ml_adapter;

/* n_slots empty slots of model m (borrowed) for adapters of rank <=
 * max_rank. Errors: ML_ERR_INVALID_ARG (n_slots < 1, no resolver, or a rank
 * ml_lora_create refuses), ML_ERR_UNSUPPORTED (backend without LoRA),
 * ML_ERR_NOMEM (the slots' backend memory). */
ml_status ml_adapters_create(ml_adapters **out, ml_model *m, int n_slots, int max_rank,
                             ml_adapter_resolve_fn resolve, void *resolve_ctx, char *err,
                             size_t errlen);

/* Free every slot; references still held are a caller bug (asserted). NULL
 * is a no-op. */
void ml_adapters_destroy(ml_adapters *a);

typedef enum ml_adapter_result {
    ML_ADAPTER_READY,   /* *out holds one reference */
    ML_ADAPTER_BUSY,    /* not resident and every slot is referenced: retry later */
    ML_ADAPTER_UNKNOWN, /* the resolver does not know the name */
    ML_ADAPTER_INVALID, /* its files cannot be served (err says why) */
} ml_adapter_result;

/* The adapter `name` with one more reference, loaded into a free or the
 * least recently used idle slot when not resident. A failed load leaves
 * the slot it would have replaced intact. */
ml_adapter_result ml_adapters_acquire(ml_adapters *a, const char *name, ml_adapter **out,
                                      char *err, size_t errlen);

/* Drop one reference taken by ml_adapters_acquire. */
void ml_adapters_release(ml_adapters *a, ml_adapter *s);

/* 1 when `name` is resident or the resolver knows it. */
int ml_adapters_known(ml_adapters *a, const char *name);

/* The slot's adapter for ml_step_seq.lora and ml_model_encode_image.
 * Borrowed; valid while the reference is held. */
const ml_lora *ml_adapter_lora(const ml_adapter *s);
const char *ml_adapter_name(const ml_adapter *s);
/* The slot's position, 0 .. n_slots-1: a stable order for batching. */
int ml_adapter_index(const ml_adapter *s);

typedef struct ml_adapters_stats {
    int slots, resident, in_use; /* slots holding an adapter / referenced */
    size_t bytes;                /* backend memory of all slots (per device on a split model) */
    uint64_t loads, evictions, load_failures;
    double load_ms;              /* total time spent loading */
} ml_adapters_stats;

void ml_adapters_get_stats(const ml_adapters *a, ml_adapters_stats *st);

#endif
