/* Fair share across tenants (service/README.md §1 "Admission"): which
 * tenant's prepared request enters the batch next, and which tenants'
 * request topics the Kafka thread keeps fetching.
 *
 * Admission is start-time fair queueing over per-tenant FIFOs: every tenant
 * has a virtual time that advances by SVC_FAIR_VT_UNIT / weight for each
 * request it gets admitted, and the backlogged tenant with the smallest
 * virtual time goes next (ties: the lowest index). A tenant that was idle
 * joins at the virtual time of the request admitted last, so idleness banks
 * no credit: nothing is reserved for a tenant that sends nothing (work
 * conserving), and one that starts sending gets its share from then on, not
 * a burst. A request counts the batch sequences it takes (its cost: n
 * choices are n sequences, service/protocol/README.md), whatever its
 * length. Within a tenant the order is arrival order.
 *
 * Fetching (svc_fair_fetch_plan) keeps, per tenant, the in-flight cap and
 * the global backpressure mark apart: a tenant at its max_in_flight pauses
 * alone; when the worker as a whole reaches the high mark, only the tenants
 * holding at least their weighted share of it pause, so a quiet tenant's
 * next record is still fetched while another one floods.
 *
 * Pure: no Kafka, no threads, no clock. Tenants are indices 0..n-1.
 * @locality: the caller's; an svc_fair is not locked (the step thread owns
 * the worker's). */
#ifndef SVC_WORKER_FAIR_H
#define SVC_WORKER_FAIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h" /* ml_list: a tenant's queue */

/* A tenant of weight w advances by this much per admitted request. */
#define SVC_FAIR_VT_UNIT (1u << 20)

/* Embedded in whatever is queued; the queue links it while it waits. */
typedef struct svc_fair_item {
    ml_list_node node;
    uint32_t cost;     /* the batch sequences it takes; 0 counts as 1 */
} svc_fair_item;

typedef struct svc_fair svc_fair;

/* A queue over n_tenants tenants, weights[i] >= 1 (copied). Returns NULL
 * when n_tenants is 0, a weight is below 1, or out of memory. */
svc_fair *svc_fair_create(const int *weights, size_t n_tenants);
/* Items still queued are forgotten, not freed (they are the caller's).
 * NULL is a no-op. */
void svc_fair_destroy(svc_fair *f);

/* Queue `it` (borrowed until popped or taken) at the tail of `tenant`'s
 * FIFO. tenant < n_tenants. */
void svc_fair_push(svc_fair *f, size_t tenant, svc_fair_item *it);

/* The next item by weight and its tenant (*tenant may be NULL), or NULL
 * when nothing waits. Advances that tenant's virtual time by the item's
 * cost. */
svc_fair_item *svc_fair_pop(svc_fair *f, size_t *tenant);

/* Remove and return the first queued item (tenant order, then arrival
 * order) for which match(it, ctx) is true, or NULL. No virtual time moves:
 * a taken item was not admitted. */
svc_fair_item *svc_fair_take(svc_fair *f, bool (*match)(const svc_fair_item *it, void *ctx),
                             void *ctx);

/* Items queued for `tenant`, and for all tenants. */
size_t svc_fair_waiting(const svc_fair *f, size_t tenant);
size_t svc_fair_total(const svc_fair *f);

/* ---- fetching ------------------------------------------------------------------ */

/* One tenant's fetch state for svc_fair_fetch_plan. */
typedef struct svc_fair_fetch {
    int weight;        /* >= 1 */
    int max_in_flight; /* >= 1: its cap */
    int in_flight;     /* its requests consumed and not finished */
    bool paused;       /* in: whether it is paused now; out: whether it should be */
} svc_fair_fetch;

/* Decide which of the n tenants fetch, given every tenant's in-flight count
 * and the global marks (high > low >= 0, counted over all tenants).
 * A fetching tenant pauses when it reaches its cap, or when the total
 * reaches `high` and the tenant holds at least its share of it,
 * max(1, high * weight / sum of weights). A paused tenant resumes when it
 * is at or below its cap's low mark (cap * low / high) and either the total
 * is at or below `low` or it holds less than its share. Draining pauses
 * every tenant. With one tenant whose cap is `high` this is the plain
 * high/low hysteresis. The total never exceeds high plus the sum of the
 * shares (at most 2 * high + n), since a tenant below its share adds at
 * most up to it. */
void svc_fair_fetch_plan(svc_fair_fetch *t, size_t n, int high, int low, bool draining);

#endif
