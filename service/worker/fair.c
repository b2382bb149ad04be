/* Fair share across tenants (fair.h). */
#include "worker/fair.h"

#include <assert.h>
#include <stdlib.h>

typedef struct fair_tenant {
    ml_list q;                  /* borrowed items, arrival order */
    uint64_t vt;                /* virtual time: the start tag of its next request */
    uint64_t step;              /* SVC_FAIR_VT_UNIT / weight */
} fair_tenant;

struct svc_fair {
    fair_tenant *t;             /* owned: n of them */
    size_t n, total;
    uint64_t vnow;              /* start tag of the request admitted last */
};

svc_fair *svc_fair_create(const int *weights, size_t n_tenants)
{
    if (!n_tenants)
        return NULL;
    for (size_t i = 0; i < n_tenants; i++)
        if (weights[i] < 1)
            return NULL;
    svc_fair *f = calloc(1, sizeof *f);
    if (!f || !(f->t = calloc(n_tenants, sizeof *f->t))) {
        free(f);
        return NULL;
    }
    f->n = n_tenants;
    for (size_t i = 0; i < n_tenants; i++) {
        uint64_t step = SVC_FAIR_VT_UNIT / (uint64_t)weights[i];
        f->t[i].step = step ? step : 1;
    }
    return f;
}

void svc_fair_destroy(svc_fair *f)
{
    if (!f)
        return;
    free(f->t);
    free(f);
}

void svc_fair_push(svc_fair *f, size_t tenant, svc_fair_item *it)
{
    assert(tenant < f->n);
    fair_tenant *t = &f->t[tenant];
    /* Back from idle: no credit for the time it sent nothing. */
    if (!t->q.n && t->vt < f->vnow)
        t->vt = f->vnow;
    ml_list_push_back(&t->q, &it->node);
    f->total++;
}

svc_fair_item *svc_fair_pop(svc_fair *f, size_t *tenant)
{
    fair_tenant *best = NULL;
    for (size_t i = 0; i < f->n; i++)
        if (f->t[i].q.n && (!best || f->t[i].vt < best->vt))
            best = &f->t[i];
    if (!best)
        return NULL;
    svc_fair_item *it = ml_list_entry(best->q.head, svc_fair_item, node);
    ml_list_remove(&best->q, &it->node);
    f->total--;
    f->vnow = best->vt;
    best->vt += best->step * (it->cost ? it->cost : 1);
    if (tenant)
        *tenant = (size_t)(best - f->t);
    return it;
}

svc_fair_item *svc_fair_take(svc_fair *f, bool (*match)(const svc_fair_item *it, void *ctx),
                             void *ctx)
{
    for (size_t i = 0; i < f->n; i++) {
        fair_tenant *t = &f->t[i];
        for (ml_list_node *n = t->q.head; n; n = n->next) {
            svc_fair_item *it = ml_list_entry(n, svc_fair_item, node);
            if (!match(it, ctx))
                continue;
            ml_list_remove(&t->q, n);
            f->total--;
            return it;
        }
    }
    return NULL;
}

size_t svc_fair_waiting(const svc_fair *f, size_t tenant)
{
    assert(tenant < f->n);
    return (size_t)f->t[tenant].q.n;
}

size_t svc_fair_total(const svc_fair *f) { return f->total; }

/* ---- fetching ------------------------------------------------------------------ */

void svc_fair_fetch_plan(svc_fair_fetch *t, size_t n, int high, int low, bool draining)
{
    long long total = 0, weights = 0;
    for (size_t i = 0; i < n; i++) {
        total += t[i].in_flight;
        weights += t[i].weight;
    }
    for (size_t i = 0; i < n; i++) {
        svc_fair_fetch *x = &t[i];
        if (draining) {
            x->paused = true;
            continue;
        }
        long long share = weights ? (long long)high * x->weight / weights : high;
        if (share < 1)
            share = 1;
        bool under_share = x->in_flight < share;
        if (!x->paused) {
            x->paused = x->in_flight >= x->max_in_flight || (total >= high && !under_share);
        } else {
            long long cap_low = (long long)x->max_in_flight * low / high;
            x->paused = !(x->in_flight <= cap_low && (total <= low || under_share));
        }
    }
}
