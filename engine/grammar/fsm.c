/* Byte automata (fsm.h): the context and its bounds, the representation,
 * the atoms, inspection, and the trimming and quotient every operation ends
 * with. The compositions are in fsm_ops.c, the equivalence classes of
 * minimisation in fsm_min.c. */
#include "grammar/fsm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "grammar/fsm_internal.h"

/* The clock is read once per this many units of work (a unit is a state
 * or a set handled), so the deadline costs nothing measurable. */
#define FSM_TICKS_PER_CLOCK 256u
#define FSM_SEQSET_MIN_SLOTS 64u
#define FSM_MIN_EDGES 4u

/* ---- context --------------------------------------------------------------- */

ml_fsm_ctx *ml_fsm_ctx_create(uint32_t max_states, double deadline_ms)
{
    ml_fsm_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->max_states = max_states;
    c->deadline_ms = deadline_ms;
    c->status = ML_OK;
    return c;
}

void ml_fsm_ctx_destroy(ml_fsm_ctx *c)
{
    free(c);
}

ml_status ml_fsm_ctx_status(const ml_fsm_ctx *c)
{
    return c->status;
}

const char *ml_fsm_ctx_error(const ml_fsm_ctx *c)
{
    return c->error;
}

ml_status ml_fsm_ctx_fail(ml_fsm_ctx *c, ml_status st, const char *fmt, ...)
{
    if (c->status != ML_OK)
        return st;
    c->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    return st;
}

void *fsm_nomem(ml_fsm_ctx *c)
{
    ml_fsm_ctx_fail(c, ML_ERR_NOMEM, "out of memory building an automaton");
    return NULL;
}

bool fsm_tick(ml_fsm_ctx *c)
{
    if (c->status != ML_OK)
        return false;
    if (++c->ticks < FSM_TICKS_PER_CLOCK)
        return true;
    c->ticks = 0;
    if (c->deadline_ms > 0 && ml_clock_ms() > c->deadline_ms) {
        ml_fsm_ctx_fail(c, ML_ERR_TOO_LARGE, "automaton construction passed its deadline");
        return false;
    }
    return true;
}

/* ---- representation ---------------------------------------------------------- */

void ml_fsm_free(ml_fsm *a)
{
    if (!a)
        return;
    free(a->accept);
    free(a->tags);
    free(a->first);
    free(a->edges);
    free(a);
}

ml_fsm *fsm_alloc(ml_fsm_ctx *c)
{
    ml_fsm *a = calloc(1, sizeof *a);
    if (!a)
        return fsm_nomem(c);
    /* Edges are never NULL, so ml_fsm_edges always points into an array. */
    a->cap_edges = FSM_MIN_EDGES;
    a->first = calloc(1, sizeof *a->first);
    a->edges = malloc(a->cap_edges * sizeof *a->edges);
    if (!a->first || !a->edges) {
        ml_fsm_free(a);
        return fsm_nomem(c);
    }
    return a;
}

uint32_t fsm_add_state(ml_fsm_ctx *c, ml_fsm *a, bool accept, uint8_t tags)
{
    if (a->n_states >= c->max_states) {
        ml_fsm_ctx_fail(c, ML_ERR_TOO_LARGE, "automaton over the bound of %u states",
                        c->max_states);
        return FSM_NONE;
    }
    if (a->n_states == a->cap_states) {
        uint32_t cap = a->cap_states ? a->cap_states * 2 : 16;
        uint8_t *acc = realloc(a->accept, cap);
        if (acc)
            a->accept = acc;
        uint8_t *tg = realloc(a->tags, cap);
        if (tg)
            a->tags = tg;
        uint32_t *first = realloc(a->first, ((size_t)cap + 1) * sizeof *first);
        if (first)
            a->first = first;
        if (!acc || !tg || !first) {
            fsm_nomem(c);
            return FSM_NONE;
        }
        a->cap_states = cap;
    }
    uint32_t s = a->n_states++;
    a->accept[s] = accept;
    a->tags[s] = tags;
    return s;
}

void fsm_open(ml_fsm *a, uint32_t s)
{
    for (uint32_t t = a->n_open; t <= s; t++)
        a->first[t] = (uint32_t)a->n_edges;
    a->n_open = s + 1;
}

bool fsm_add_edge(ml_fsm_ctx *c, ml_fsm *a, uint32_t lo, uint32_t hi, uint32_t to)
{
    if (a->n_edges > 0) {
        ml_fsm_edge *last = &a->edges[a->n_edges - 1];
        if (last->to == to && last->hi + 1 == lo && a->n_edges > a->first[a->n_open - 1]) {
            last->hi = hi;
            return true;
        }
    }
    if (a->n_edges == a->cap_edges) {
        size_t cap = a->cap_edges ? a->cap_edges * 2 : 16;
        ml_fsm_edge *e = realloc(a->edges, cap * sizeof *e);
        if (!e) {
            fsm_nomem(c);
            return false;
        }
        a->edges = e;
        a->cap_edges = cap;
    }
    a->edges[a->n_edges++] = (ml_fsm_edge){lo, hi, to};
    return true;
}

void fsm_seal(ml_fsm *a)
{
    for (uint32_t t = a->n_open; t <= a->n_states; t++)
        a->first[t] = (uint32_t)a->n_edges;
    a->n_open = a->n_states;
}

/* ---- sets of sequences ----------------------------------------------------------- */

static uint32_t seq_hash(const uint32_t *seq, uint32_t len)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ len;
    for (uint32_t i = 0; i < len; i++) {
        h ^= seq[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return (uint32_t)h;
}

void fsm_seqset_deinit(fsm_seqset *s)
{
    free(s->pool);
    free(s->offs);
    free(s->slots);
    memset(s, 0, sizeof *s);
}

void fsm_seqset_clear(fsm_seqset *s)
{
    s->pool_len = 0;
    s->n = 0;
    if (s->slots)
        memset(s->slots, 0, (size_t)s->n_slots * sizeof *s->slots);
}

const uint32_t *fsm_seqset_get(const fsm_seqset *s, uint32_t id, uint32_t *len)
{
    *len = (uint32_t)(s->offs[id + 1] - s->offs[id]);
    return s->pool + s->offs[id];
}

static bool seqset_grow_slots(ml_fsm_ctx *c, fsm_seqset *s)
{
    uint32_t n_slots = s->n_slots ? s->n_slots * 2 : FSM_SEQSET_MIN_SLOTS;
    uint32_t *slots = calloc(n_slots, sizeof *slots);
    if (!slots) {
        fsm_nomem(c);
        return false;
    }
    for (uint32_t id = 0; id < s->n; id++) {
        uint32_t len;
        const uint32_t *seq = fsm_seqset_get(s, id, &len);
        uint32_t i = seq_hash(seq, len) & (n_slots - 1);
        while (slots[i])
            i = (i + 1) & (n_slots - 1);
        slots[i] = id + 1;
    }
    free(s->slots);
    s->slots = slots;
    s->n_slots = n_slots;
    return true;
}

uint32_t fsm_seqset_put(ml_fsm_ctx *c, fsm_seqset *s, const uint32_t *seq, uint32_t len,
                        bool *added)
{
    *added = false;
    /* Load at most one half. */
    if ((s->n + 1) * 2 > s->n_slots && !seqset_grow_slots(c, s))
        return FSM_NONE;
    uint32_t mask = s->n_slots - 1, i = seq_hash(seq, len) & mask;
    for (; s->slots[i]; i = (i + 1) & mask) {
        uint32_t id = s->slots[i] - 1, l;
        const uint32_t *have = fsm_seqset_get(s, id, &l);
        if (l == len && memcmp(have, seq, (size_t)len * sizeof *seq) == 0)
            return id;
    }
    if (s->n + 1 >= s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 64;
        size_t *offs = realloc(s->offs, ((size_t)cap + 1) * sizeof *offs);
        if (!offs) {
            fsm_nomem(c);
            return FSM_NONE;
        }
        s->offs = offs;
        s->cap = cap;
    }
    if (s->pool_len + len > s->pool_cap) {
        size_t cap = s->pool_cap ? s->pool_cap * 2 : 256;
        while (cap < s->pool_len + len)
            cap *= 2;
        uint32_t *pool = realloc(s->pool, cap * sizeof *pool);
        if (!pool) {
            fsm_nomem(c);
            return FSM_NONE;
        }
        s->pool = pool;
        s->pool_cap = cap;
    }
    if (s->n == 0)
        s->offs[0] = 0;
    memcpy(s->pool + s->pool_len, seq, (size_t)len * sizeof *seq);
    s->pool_len += len;
    uint32_t id = s->n++;
    s->offs[id + 1] = s->pool_len;
    s->slots[i] = id + 1;
    *added = true;
    return id;
}

/* ---- trimming and minimisation ------------------------------------------------------ */

/* Marks live[s] for the states reachable from the start that reach an
 * accepting state. False (latched) on memory or deadline. */
static bool mark_live(ml_fsm_ctx *c, const ml_fsm *a, uint8_t *live)
{
    uint32_t n = a->n_states;
    uint8_t *reach = calloc(n, 1);
    uint32_t *stack = malloc((size_t)n * sizeof *stack);
    uint32_t *rfirst = calloc((size_t)n + 1, sizeof *rfirst);
    uint32_t *rsrc = malloc((a->n_edges + 1) * sizeof *rsrc);
    bool ok = reach && stack && rfirst && rsrc;
    if (!ok) {
        fsm_nomem(c);
        goto out;
    }
    uint32_t top = 0;
    reach[0] = 1;
    stack[top++] = 0;
    while (top > 0) {
        uint32_t s = stack[--top];
        for (uint32_t e = a->first[s]; e < a->first[s + 1]; e++) {
            uint32_t t = a->edges[e].to;
            if (!reach[t]) {
                reach[t] = 1;
                stack[top++] = t;
            }
        }
    }
    /* The reverse graph, to walk back from the accepting states. */
    for (size_t e = 0; e < a->n_edges; e++)
        rfirst[a->edges[e].to + 1]++;
    for (uint32_t s = 0; s < n; s++)
        rfirst[s + 1] += rfirst[s];
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t e = a->first[s]; e < a->first[s + 1]; e++)
            rsrc[rfirst[a->edges[e].to]++] = s;
    for (uint32_t s = n; s > 0; s--)
        rfirst[s] = rfirst[s - 1];
    rfirst[0] = 0;
    memset(live, 0, n);
    for (uint32_t s = 0; s < n; s++)
        if (reach[s] && a->accept[s]) {
            live[s] = 1;
            stack[top++] = s;
        }
    while (top > 0) {
        if (!fsm_tick(c)) {
            ok = false;
            goto out;
        }
        uint32_t s = stack[--top];
        for (uint32_t i = rfirst[s]; i < rfirst[s + 1]; i++) {
            uint32_t p = rsrc[i];
            if (reach[p] && !live[p]) {
                live[p] = 1;
                stack[top++] = p;
            }
        }
    }
out:
    free(reach);
    free(stack);
    free(rfirst);
    free(rsrc);
    return ok;
}

/* The empty language: one start state with these tags, no edges. */
static ml_fsm *empty_language(ml_fsm_ctx *c, uint8_t tags)
{
    ml_fsm *r = fsm_alloc(c);
    if (r && fsm_add_state(c, r, false, tags) == FSM_NONE) {
        ml_fsm_free(r);
        return NULL;
    }
    if (r)
        fsm_seal(r);
    return r;
}

/* The quotient of a by cls over its live states, numbered breadth first. */
static ml_fsm *quotient(ml_fsm_ctx *c, const ml_fsm *a, const uint8_t *live, const uint32_t *cls)
{
    uint32_t n = a->n_states;
    uint32_t *rep = malloc((size_t)n * sizeof *rep); /* new state -> an old state */
    uint32_t *num = malloc((size_t)n * sizeof *num); /* class -> new state */
    ml_fsm *r = fsm_alloc(c);
    if (!rep || !num || !r) {
        free(rep);
        free(num);
        ml_fsm_free(r);
        return fsm_nomem(c);
    }
    for (uint32_t s = 0; s < n; s++)
        num[s] = FSM_NONE;
    num[cls[0]] = fsm_add_state(c, r, a->accept[0], a->tags[0]);
    rep[0] = 0;
    bool ok = num[cls[0]] != FSM_NONE;
    for (uint32_t q = 0; ok && q < r->n_states; q++) {
        uint32_t s = rep[q];
        fsm_open(r, q);
        for (uint32_t e = a->first[s]; ok && e < a->first[s + 1]; e++) {
            const ml_fsm_edge *ed = &a->edges[e];
            if (!live[ed->to])
                continue;
            uint32_t k = cls[ed->to];
            if (num[k] == FSM_NONE) {
                num[k] = fsm_add_state(c, r, a->accept[ed->to], a->tags[ed->to]);
                if (num[k] == FSM_NONE)
                    break;
                rep[num[k]] = ed->to;
            }
            ok = fsm_add_edge(c, r, ed->lo, ed->hi, num[k]);
        }
        ok = ok && c->status == ML_OK;
    }
    free(rep);
    free(num);
    if (!ok) {
        ml_fsm_free(r);
        return NULL;
    }
    fsm_seal(r);
    return r;
}

ml_fsm *fsm_finish(ml_fsm_ctx *c, ml_fsm *a)
{
    if (!a)
        return NULL;
    if (c->status != ML_OK) {
        ml_fsm_free(a);
        return NULL;
    }
    ml_fsm *r = NULL;
    uint8_t *live = malloc(a->n_states ? a->n_states : 1);
    uint32_t *cls = malloc(((size_t)a->n_states + 1) * sizeof *cls);
    if (!live || !cls)
        fsm_nomem(c);
    else if (a->n_states == 0)
        r = empty_language(c, 0);
    else if (mark_live(c, a, live)) {
        if (!live[0]) /* keeps the start's tags: an empty string content stays in-string */
            r = empty_language(c, a->tags[0]);
        else if (fsm_classes(c, a, live, cls))
            r = quotient(c, a, live, cls);
    }
    free(live);
    free(cls);
    ml_fsm_free(a);
    return r;
}

/* ---- atoms ------------------------------------------------------------------- */

/* A two-state automaton: start -(edges)-> accepting end; the n ranges are
 * sorted and disjoint. */
static ml_fsm *one_step(ml_fsm_ctx *c, const uint32_t (*ranges)[2], size_t n)
{
    if (c->status != ML_OK)
        return NULL;
    ml_fsm *a = fsm_alloc(c);
    if (!a || fsm_add_state(c, a, false, 0) == FSM_NONE ||
        fsm_add_state(c, a, true, 0) == FSM_NONE) {
        ml_fsm_free(a);
        return NULL;
    }
    fsm_open(a, 0);
    for (size_t i = 0; i < n; i++)
        if (!fsm_add_edge(c, a, ranges[i][0], ranges[i][1], 1)) {
            ml_fsm_free(a);
            return NULL;
        }
    fsm_open(a, 1);
    fsm_seal(a);
    return fsm_finish(c, a);
}

ml_fsm *ml_fsm_nothing(ml_fsm_ctx *c)
{
    return c->status == ML_OK ? empty_language(c, 0) : NULL;
}

ml_fsm *ml_fsm_epsilon(ml_fsm_ctx *c)
{
    if (c->status != ML_OK)
        return NULL;
    ml_fsm *a = fsm_alloc(c);
    if (a && fsm_add_state(c, a, true, 0) == FSM_NONE) {
        ml_fsm_free(a);
        return NULL;
    }
    if (a)
        fsm_seal(a);
    return a;
}

ml_fsm *ml_fsm_byte_set(ml_fsm_ctx *c, const uint8_t set[32])
{
    uint32_t ranges[ML_FSM_N_BYTES / 2][2];
    size_t n = 0;
    for (uint32_t b = 0; b < ML_FSM_N_BYTES; b++) {
        if (!(set[b >> 3] & (1u << (b & 7))))
            continue;
        if (n > 0 && ranges[n - 1][1] + 1 == b)
            ranges[n - 1][1] = b;
        else {
            ranges[n][0] = b;
            ranges[n][1] = b;
            n++;
        }
    }
    return one_step(c, ranges, n);
}

ml_fsm *ml_fsm_byte_range(ml_fsm_ctx *c, uint8_t lo, uint8_t hi)
{
    const uint32_t range[1][2] = {{lo, hi}};
    return one_step(c, range, lo <= hi ? 1 : 0);
}

ml_fsm *ml_fsm_call(ml_fsm_ctx *c, uint32_t k)
{
    if (k >= ML_FSM_MAX_CALLS) {
        ml_fsm_ctx_fail(c, ML_ERR_INVALID_ARG, "call symbol %u over the limit of %u machines", k,
                        ML_FSM_MAX_CALLS);
        return NULL;
    }
    const uint32_t range[1][2] = {{ML_FSM_CALL(k), ML_FSM_CALL(k)}};
    return one_step(c, range, 1);
}

ml_fsm *ml_fsm_literal(ml_fsm_ctx *c, const void *bytes, size_t n)
{
    if (c->status != ML_OK)
        return NULL;
    const uint8_t *p = bytes;
    ml_fsm *a = fsm_alloc(c);
    bool ok = a != NULL;
    for (size_t i = 0; ok && i <= n; i++)
        ok = fsm_add_state(c, a, i == n, 0) != FSM_NONE;
    for (size_t i = 0; ok && i < n; i++) {
        fsm_open(a, (uint32_t)i);
        ok = fsm_add_edge(c, a, p[i], p[i], (uint32_t)i + 1);
    }
    if (!ok) {
        ml_fsm_free(a);
        return NULL;
    }
    fsm_open(a, (uint32_t)n);
    fsm_seal(a);
    return a; /* a chain is trimmed and minimal already */
}

/* ---- copies and tags --------------------------------------------------------------- */

ml_fsm *ml_fsm_copy(ml_fsm_ctx *c, const ml_fsm *a)
{
    if (!a || c->status != ML_OK)
        return NULL;
    ml_fsm *r = calloc(1, sizeof *r);
    if (!r)
        return fsm_nomem(c);
    uint32_t n = a->n_states;
    r->accept = malloc(n);
    r->tags = malloc(n);
    r->first = malloc(((size_t)n + 1) * sizeof *r->first);
    r->edges = malloc((a->n_edges ? a->n_edges : 1) * sizeof *r->edges);
    if (!r->accept || !r->tags || !r->first || !r->edges) {
        ml_fsm_free(r);
        return fsm_nomem(c);
    }
    memcpy(r->accept, a->accept, n);
    memcpy(r->tags, a->tags, n);
    memcpy(r->first, a->first, ((size_t)n + 1) * sizeof *r->first);
    if (a->n_edges > 0)
        memcpy(r->edges, a->edges, a->n_edges * sizeof *r->edges);
    r->n_states = r->cap_states = r->n_open = n;
    r->n_edges = a->n_edges;
    r->cap_edges = a->n_edges ? a->n_edges : 1;
    return r;
}

ml_fsm *ml_fsm_tag(ml_fsm_ctx *c, ml_fsm *a, uint8_t tags)
{
    if (!a || c->status != ML_OK) {
        ml_fsm_free(a);
        return NULL;
    }
    for (uint32_t s = 0; s < a->n_states; s++)
        a->tags[s] |= tags;
    /* States that differed only in tags may now merge. */
    return fsm_finish(c, a);
}

/* ---- inspection ----------------------------------------------------------------- */

uint32_t ml_fsm_n_states(const ml_fsm *a)
{
    return a->n_states;
}

bool ml_fsm_accepting(const ml_fsm *a, uint32_t state)
{
    return a->accept[state] != 0;
}

uint8_t ml_fsm_tags(const ml_fsm *a, uint32_t state)
{
    return a->tags[state];
}

size_t ml_fsm_edges(const ml_fsm *a, uint32_t state, const ml_fsm_edge **out)
{
    *out = a->edges + a->first[state];
    return a->first[state + 1] - a->first[state];
}

bool ml_fsm_is_empty(const ml_fsm *a)
{
    /* Trimmed: nonempty exactly when the start state can reach acceptance,
     * and then the start accepts or has an edge. */
    return !a->accept[0] && a->first[1] == a->first[0];
}

bool ml_fsm_has_calls(const ml_fsm *a)
{
    for (size_t e = 0; e < a->n_edges; e++)
        if (a->edges[e].hi >= ML_FSM_N_BYTES)
            return true;
    return false;
}

bool ml_fsm_matches(const ml_fsm *a, const void *bytes, size_t n)
{
    const uint8_t *p = bytes;
    uint32_t s = 0;
    for (size_t i = 0; i < n; i++) {
        const ml_fsm_edge *e;
        size_t ne = ml_fsm_edges(a, s, &e), lo = 0, hi = ne;
        while (lo < hi) { /* the first edge with hi >= p[i] */
            size_t mid = (lo + hi) / 2;
            if (e[mid].hi < p[i])
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == ne || e[lo].lo > p[i])
            return false;
        s = e[lo].to;
    }
    return a->accept[s] != 0;
}
