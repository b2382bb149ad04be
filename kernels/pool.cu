/* The device pool: one cudaMalloc at create, carved by a first-fit free list
 * with coalescing. The list is an array of segments sorted by offset that
 * covers the whole pool; a model holds a few hundred to a few thousand
 * blocks (weights, K/V pools, image states), so linear scans and memmove
 * on insert are cheap next to the device work they serve.
 * @locality: the backend's driving thread. */
#include <cstdlib>
#include <cstring>

#include "mlk_internal.cuh"

#define POOL_INITIAL_SEGS 64

int mlk_pool_init(mlk_pool *p, void *base, size_t capacity)
{
    memset(p, 0, sizeof *p);
    p->segs = (mlk_pool_seg *)malloc(POOL_INITIAL_SEGS * sizeof *p->segs);
    if (!p->segs)
        return -1;
    p->base = (char *)base;
    p->capacity = capacity;
    p->cap_segs = POOL_INITIAL_SEGS;
    p->n_segs = 1;
    p->segs[0] = mlk_pool_seg{0, capacity, 0};
    return 0;
}

void mlk_pool_deinit(mlk_pool *p)
{
    if (p->base)
        cudaFree(p->base);
    free(p->segs);
    memset(p, 0, sizeof *p);
}

/* Make room for one more segment; returns 0 or -1 (out of host memory). */
static int reserve_one(mlk_pool *p)
{
    if (p->n_segs < p->cap_segs)
        return 0;
    int cap = p->cap_segs * 2;
    mlk_pool_seg *s = (mlk_pool_seg *)realloc(p->segs, (size_t)cap * sizeof *s);
    if (!s)
        return -1;
    p->segs = s;
    p->cap_segs = cap;
    return 0;
}

void *mlk_pool_alloc(mlk_pool *p, size_t bytes)
{
    size_t need = (bytes ? bytes : 1) + MLK_POOL_ALIGN - 1;
    if (need < bytes)
        return NULL;
    need -= need % MLK_POOL_ALIGN;
    for (int i = 0; i < p->n_segs; i++) {
        mlk_pool_seg *s = &p->segs[i];
        if (s->used || s->size < need)
            continue;
        if (s->size > need) {
            /* Split: the tail stays free, right after this segment. */
            if (reserve_one(p) != 0)
                return NULL;
            s = &p->segs[i];
            memmove(&p->segs[i + 2], &p->segs[i + 1],
                    (size_t)(p->n_segs - i - 1) * sizeof *p->segs);
            p->segs[i + 1] = mlk_pool_seg{s->off + need, s->size - need, 0};
            s->size = need;
            p->n_segs++;
        }
        s->used = 1;
        p->used_bytes += s->size;
        return p->base + s->off;
    }
    return NULL;
}

/* Remove segment i + 1 after merging it into segment i. */
static void merge_next(mlk_pool *p, int i)
{
    p->segs[i].size += p->segs[i + 1].size;
    memmove(&p->segs[i + 1], &p->segs[i + 2], (size_t)(p->n_segs - i - 2) * sizeof *p->segs);
    p->n_segs--;
}

int mlk_pool_free(mlk_pool *p, void *ptr)
{
    if (!ptr || (char *)ptr < p->base || (char *)ptr >= p->base + p->capacity)
        return -1;
    size_t off = (size_t)((char *)ptr - p->base);
    int lo = 0, hi = p->n_segs - 1;
    while (lo < hi) { /* the last segment starting at or before off */
        int mid = (lo + hi + 1) / 2;
        if (p->segs[mid].off <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (p->segs[lo].off != off || !p->segs[lo].used)
        return -1;
    p->segs[lo].used = 0;
    p->used_bytes -= p->segs[lo].size;
    if (lo + 1 < p->n_segs && !p->segs[lo + 1].used)
        merge_next(p, lo);
    if (lo > 0 && !p->segs[lo - 1].used)
        merge_next(p, lo - 1);
    return 0;
}
