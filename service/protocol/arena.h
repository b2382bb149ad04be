/* A request's arena: what a parsed request keeps (strings, image bytes,
 * message parts) is carved from chunks it owns and freed in one call, so
 * the record and its cJSON tree can go as soon as parsing returns.
 * @locality the thread that owns the request. */
#ifndef SVC_ARENA_H
#define SVC_ARENA_H

#include <stddef.h>

typedef struct svc_arena_chunk svc_arena_chunk;

/* Zero-initialised is empty. */
typedef struct svc_arena {
    svc_arena_chunk *chunks; /* owned; the head is the one being filled */
} svc_arena;

/* n bytes aligned for any type, owned by the arena; NULL when memory runs
 * out. Large blocks (images) get a chunk of their own behind the head, so
 * the head's free space keeps serving small allocations. */
void *svc_arena_alloc(svc_arena *a, size_t n);
/* A NUL-terminated copy of s[0..len), or NULL when memory runs out. */
char *svc_arena_strndup(svc_arena *a, const char *s, size_t len);
/* Free every chunk; the arena is empty again. */
void svc_arena_deinit(svc_arena *a);

#endif
