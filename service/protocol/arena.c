/* The request arena (arena.h). @locality the request's owner. */
#include "protocol/arena.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_CHUNK_BYTES 4096
#define ARENA_ALIGN alignof(max_align_t)

struct svc_arena_chunk {
    svc_arena_chunk *next;
    size_t cap;
    size_t used;
    alignas(max_align_t) unsigned char data[];
};

static svc_arena_chunk *chunk_new(size_t cap)
{
    if (cap > SIZE_MAX - sizeof(svc_arena_chunk))
        return NULL;
    svc_arena_chunk *c = malloc(sizeof(svc_arena_chunk) + cap);
    if (!c)
        return NULL;
    c->next = NULL;
    c->cap = cap;
    c->used = 0;
    return c;
}

void *svc_arena_alloc(svc_arena *a, size_t n)
{
    if (n > SIZE_MAX - ARENA_ALIGN)
        return NULL;
    n = (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    svc_arena_chunk *head = a->chunks;
    if (head && head->cap - head->used >= n) {
        void *p = head->data + head->used;
        head->used += n;
        return p;
    }
    if (n > ARENA_CHUNK_BYTES / 4) {
        svc_arena_chunk *c = chunk_new(n);
        if (!c)
            return NULL;
        c->used = n;
        if (head) {
            c->next = head->next;
            head->next = c;
        } else {
            a->chunks = c;
        }
        return c->data;
    }
    svc_arena_chunk *c = chunk_new(ARENA_CHUNK_BYTES);
    if (!c)
        return NULL;
    c->next = head;
    a->chunks = c;
    c->used = n;
    return c->data;
}

char *svc_arena_strndup(svc_arena *a, const char *s, size_t len)
{
    char *p = svc_arena_alloc(a, len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

void svc_arena_deinit(svc_arena *a)
{
    svc_arena_chunk *c = a->chunks;
    while (c) {
        svc_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->chunks = NULL;
}
