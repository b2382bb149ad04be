/* Resident cross-attention states (engine/model/README.md §12): for every image, the K/V
 * of every cross-attention layer, computed once and kept in backend memory
 * within a byte budget. Entries are keyed by a 32-byte digest
 * (ml_image_state_key: the image's content digest, the request's cache
 * partition and any adapter that touches vision or cross K/V; the cache
 * lives and dies with one model), refcounted while sequences use them and
 * evicted least-recently-used otherwise.
 *
 * @locality: the step loop thread. */
#ifndef ML_RUNTIME_IMAGE_CACHE_H
#define ML_RUNTIME_IMAGE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/mllama.h"
#include "status.h"

#define ML_IMAGE_KEY_BYTES 32

/* The cache partition a request belongs to (ml_request.cache_salt): the
 * service's tenant cache group, hashed. */
#define ML_CACHE_SALT_BYTES 32

/* The key of an image's resident state: content is the digest the caller
 * has for the image (sha256 of its bytes), salt the request's cache
 * partition. With adapter NULL (the base model, or an adapter that leaves
 * image states alone: ml_lora_touches_images) it is
 *   sha256(BASE_TAG ‖ salt ‖ content),
 * else, for the states an adapter that changes images makes of its own,
 *   sha256(ADAPTER_TAG ‖ salt ‖ content ‖ len(adapter) ‖ adapter).
 * Distinct tags and the salt make the two derivations and the partitions
 * disjoint: a digest a client names is always taken as content and goes
 * through the base derivation, so it can never name an adapter's state or
 * another partition's, whatever 32 bytes it chooses. The runtime keys
 * states this way; a caller mirroring the resident set (image events), an
 * index or a router computes the same keys with it. out may alias content.
 * @locality any thread. */
void ml_image_state_key(const uint8_t *salt, const uint8_t *content, const char *adapter,
                        uint8_t *out);

typedef struct ml_image_cache ml_image_cache;
typedef struct ml_image_entry ml_image_entry;

typedef enum ml_image_event {
    ML_IMAGE_INSERTED,
    ML_IMAGE_EVICTED,
} ml_image_event;

/* Called for every insertion and eviction, so the service can mirror the
 * resident set into Redis. key is borrowed for the call. */
typedef void (*ml_image_event_fn)(void *ctx, ml_image_event ev, const uint8_t *key,
                                  size_t bytes, int n_tiles);

/* A cache of at most budget_bytes of states of model (borrowed), each
 * ml_model_image_state_bytes large (every image of a model has the same
 * state size: every tile slot, padded ones included, which the reference
 * row-mask mode leaves zero: ml_model_encode_image). Every state the budget
 * holds (budget_bytes / state bytes of them, ml_model_image_state_alloc's)
 * is allocated here and kept until destroy, so admitting an image allocates
 * nothing. Sizes and budget are per device under tensor parallelism.
 * Errors: ML_ERR_INVALID_ARG, ML_ERR_NOMEM (the budget does not fit in the
 * backend's memory). */
ml_status ml_image_cache_create(ml_image_cache **out, ml_model *model, size_t budget_bytes,
                                ml_image_event_fn on_event, void *event_ctx, char *err,
                                size_t errlen);

/* Frees every state; entries still referenced are a caller bug (asserted).
 * NULL is a no-op. */
void ml_image_cache_destroy(ml_image_cache *c);

/* The resident entry for key with one more reference, marked most recently
 * used; NULL when absent. */
ml_image_entry *ml_image_cache_acquire(ml_image_cache *c, const uint8_t *key);

/* 1 when key is resident (no reference taken, LRU order unchanged). */
int ml_image_cache_contains(const ml_image_cache *c, const uint8_t *key);

/* A new entry for key with one reference and a free state (contents
 * undefined until the caller writes them), evicting idle entries as needed.
 * NULL when the budget cannot make room now (every resident entry is in
 * use). The entry counts as inserted only after ml_image_cache_publish:
 * until then a failed encode can ml_image_cache_release it and it
 * disappears without an event. */
ml_image_entry *ml_image_cache_reserve(ml_image_cache *c, const uint8_t *key, int n_tiles);

/* Mark a reserved entry's state as complete and emit ML_IMAGE_INSERTED. */
void ml_image_cache_publish(ml_image_cache *c, ml_image_entry *e);

/* Drop one reference. An unpublished entry leaves the cache at once. */
void ml_image_cache_release(ml_image_cache *c, ml_image_entry *e);

/* Real tiles of the entry's image (as given to reserve). */
int ml_image_entry_n_tiles(const ml_image_entry *e);

/* The entry's state (ml_model_image_state_alloc's handle). Borrowed. */
void *ml_image_entry_state(const ml_image_entry *e);

/* Bytes held by resident entries, and the budget. */
size_t ml_image_cache_used(const ml_image_cache *c);
size_t ml_image_cache_budget(const ml_image_cache *c);
int ml_image_cache_count(const ml_image_cache *c);

#endif
