/* The per-partition offset tracker (offsets.h). Pure logic.
 * @locality the one thread using the tracker (the consumer's Kafka thread). */
#include "kafka/offsets.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* In-flight entries a partition starts with; doubled as needed. */
#define PART_INITIAL_CAP 16

typedef struct entry {
    int64_t offset;
    bool done;
} entry;

/* One tracked partition. Entries q[head .. head+len) are begun offsets in
 * increasing order; q[head] is never done (the done prefix is dropped). */
typedef struct part {
    int32_t topic_id;
    int32_t partition;
    uint64_t epoch;
    int64_t last_begun; /* -1 before the first begin */
    entry *q;           /* owned */
    size_t head, len, cap;
} part;

struct svc_offsets {
    part *parts; /* owned; unordered, a worker holds tens of partitions */
    size_t n_parts, cap_parts;
    uint64_t next_epoch;
};

const char *svc_offsets_status_name(svc_offsets_status st)
{
    switch (st) {
    case SVC_OFFSETS_OK: return "ok";
    case SVC_OFFSETS_DUPLICATE: return "duplicate";
    case SVC_OFFSETS_NOT_ASSIGNED: return "not_assigned";
    case SVC_OFFSETS_UNKNOWN: return "unknown";
    case SVC_OFFSETS_INVALID: return "invalid";
    case SVC_OFFSETS_NOMEM: return "out_of_memory";
    }
    return "unknown_status";
}

svc_offsets *svc_offsets_create(void)
{
    svc_offsets *o = calloc(1, sizeof *o);
    if (o)
        o->next_epoch = 1;
    return o;
}

void svc_offsets_destroy(svc_offsets *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->n_parts; i++)
        free(o->parts[i].q);
    free(o->parts);
    free(o);
}

static part *find(const svc_offsets *o, int32_t topic_id, int32_t partition)
{
    for (size_t i = 0; i < o->n_parts; i++)
        if (o->parts[i].topic_id == topic_id && o->parts[i].partition == partition)
            return &o->parts[i];
    return NULL;
}

svc_offsets_status svc_offsets_assign(svc_offsets *o, int32_t topic_id, int32_t partition)
{
    if (find(o, topic_id, partition))
        return SVC_OFFSETS_OK;
    if (o->n_parts == o->cap_parts) {
        size_t cap = o->cap_parts ? o->cap_parts * 2 : PART_INITIAL_CAP;
        part *p = realloc(o->parts, cap * sizeof *p);
        if (!p)
            return SVC_OFFSETS_NOMEM;
        o->parts = p;
        o->cap_parts = cap;
    }
    o->parts[o->n_parts++] = (part){
        .topic_id = topic_id,
        .partition = partition,
        .epoch = o->next_epoch++,
        .last_begun = -1,
    };
    return SVC_OFFSETS_OK;
}

void svc_offsets_revoke(svc_offsets *o, int32_t topic_id, int32_t partition)
{
    part *p = find(o, topic_id, partition);
    if (!p)
        return;
    free(p->q);
    *p = o->parts[--o->n_parts];
}

size_t svc_offsets_pending(const svc_offsets *o, int32_t topic_id, int32_t partition,
                           svc_offset_ticket *out, size_t cap)
{
    const part *p = find(o, topic_id, partition);
    if (!p)
        return 0;
    size_t n = 0;
    for (size_t i = p->head; i < p->head + p->len; i++) {
        if (p->q[i].done)
            continue;
        if (n < cap)
            out[n] = (svc_offset_ticket){topic_id, partition, p->q[i].offset, p->epoch};
        n++;
    }
    return n;
}

/* Make room for one more entry at q[head+len]: slide the live window to the
 * front when the head has advanced, else grow. */
static bool reserve_one(part *p)
{
    if (p->head + p->len < p->cap)
        return true;
    if (p->head > 0) {
        memmove(p->q, p->q + p->head, p->len * sizeof *p->q);
        p->head = 0;
        return true;
    }
    size_t cap = p->cap ? p->cap * 2 : PART_INITIAL_CAP;
    entry *q = realloc(p->q, cap * sizeof *q);
    if (!q)
        return false;
    p->q = q;
    p->cap = cap;
    return true;
}

svc_offsets_status svc_offsets_begin(svc_offsets *o, int32_t topic_id, int32_t partition,
                                     int64_t offset, svc_offset_ticket *ticket)
{
    part *p = find(o, topic_id, partition);
    if (!p)
        return SVC_OFFSETS_NOT_ASSIGNED;
    if (offset < 0)
        return SVC_OFFSETS_INVALID;
    if (offset <= p->last_begun)
        return SVC_OFFSETS_DUPLICATE;
    if (!reserve_one(p))
        return SVC_OFFSETS_NOMEM;
    p->q[p->head + p->len++] = (entry){offset, false};
    p->last_begun = offset;
    *ticket = (svc_offset_ticket){topic_id, partition, offset, p->epoch};
    return SVC_OFFSETS_OK;
}

/* Index of `offset` in the live window, or SIZE_MAX. */
static size_t search(const part *p, int64_t offset)
{
    size_t lo = p->head, hi = p->head + p->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->q[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < p->head + p->len && p->q[lo].offset == offset ? lo : SIZE_MAX;
}

static int64_t committable(const part *p)
{
    if (p->len > 0)
        return p->q[p->head].offset;
    return p->last_begun >= 0 ? p->last_begun + 1 : -1;
}

svc_offsets_status svc_offsets_finish(svc_offsets *o, const svc_offset_ticket *ticket,
                                      int64_t *commit)
{
    *commit = -1;
    part *p = find(o, ticket->topic_id, ticket->partition);
    if (!p || p->epoch != ticket->epoch)
        return SVC_OFFSETS_NOT_ASSIGNED;
    size_t i = search(p, ticket->offset);
    if (i == SIZE_MAX || p->q[i].done)
        return SVC_OFFSETS_UNKNOWN;
    p->q[i].done = true;
    if (i != p->head)
        return SVC_OFFSETS_OK;
    while (p->len > 0 && p->q[p->head].done) {
        p->head++;
        p->len--;
    }
    if (p->len == 0)
        p->head = 0;
    *commit = committable(p);
    return SVC_OFFSETS_OK;
}

int64_t svc_offsets_committable(const svc_offsets *o, int32_t topic_id, int32_t partition)
{
    const part *p = find(o, topic_id, partition);
    return p ? committable(p) : -1;
}
