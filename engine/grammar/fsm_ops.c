/* Byte automata (fsm.h): composition. Concatenation, union, repetition and
 * the UTF-8 atom go through an epsilon-NFA and the subset construction;
 * intersection and difference are products of the two automata (the
 * difference with b completed by a sink). Every result goes through
 * fsm_finish (fsm.c): trimmed, minimal, canonically numbered. */
#include <stdlib.h>
#include <string.h>

#include "grammar/fsm.h"
#include "grammar/fsm_internal.h"
#include "grammar/utf8.h"

/* An epsilon-NFA grows a few states past the automata it is built from
 * (joints between copies); it may hold this many times the context's
 * state bound before the construction is refused. */
#define NFA_STATES_PER_BOUND 4u

/* ---- epsilon-NFA ------------------------------------------------------------------ */

typedef struct nfa_edge {
    uint32_t from, lo, hi, to; /* lo > hi: an epsilon edge */
} nfa_edge;

#define NFA_EPSILON_LO 1u
#define NFA_EPSILON_HI 0u

typedef struct nfa {
    uint32_t n, cap;
    uint8_t *accept, *tags;
    nfa_edge *edges;
    size_t n_edges, cap_edges;
    uint32_t *first; /* (n + 1) after nfa_index: edges sorted by from */
} nfa;

static void nfa_deinit(nfa *m)
{
    free(m->accept);
    free(m->tags);
    free(m->edges);
    free(m->first);
    memset(m, 0, sizeof *m);
}

static uint32_t nfa_add_state(ml_fsm_ctx *c, nfa *m, bool accept, uint8_t tags)
{
    if ((uint64_t)m->n >= (uint64_t)c->max_states * NFA_STATES_PER_BOUND) {
        ml_fsm_ctx_fail(c, ML_ERR_TOO_LARGE, "automaton over the bound of %u states",
                        c->max_states);
        return FSM_NONE;
    }
    if (m->n == m->cap) {
        uint32_t cap = m->cap ? m->cap * 2 : 16;
        uint8_t *acc = realloc(m->accept, cap);
        if (acc)
            m->accept = acc;
        uint8_t *tg = realloc(m->tags, cap);
        if (tg)
            m->tags = tg;
        if (!acc || !tg) {
            fsm_nomem(c);
            return FSM_NONE;
        }
        m->cap = cap;
    }
    m->accept[m->n] = accept;
    m->tags[m->n] = tags;
    return m->n++;
}

static bool nfa_add_edge(ml_fsm_ctx *c, nfa *m, uint32_t from, uint32_t lo, uint32_t hi,
                         uint32_t to)
{
    if (m->n_edges == m->cap_edges) {
        size_t cap = m->cap_edges ? m->cap_edges * 2 : 32;
        nfa_edge *e = realloc(m->edges, cap * sizeof *e);
        if (!e) {
            fsm_nomem(c);
            return false;
        }
        m->edges = e;
        m->cap_edges = cap;
    }
    m->edges[m->n_edges++] = (nfa_edge){from, lo, hi, to};
    return true;
}

static bool nfa_add_epsilon(ml_fsm_ctx *c, nfa *m, uint32_t from, uint32_t to)
{
    return nfa_add_edge(c, m, from, NFA_EPSILON_LO, NFA_EPSILON_HI, to);
}

/* Copy a's states and edges into m; returns the index of a's start there,
 * FSM_NONE (latched) on failure. Acceptance is kept when keep_accept;
 * either way, the accepting states of a are then [base, base + n) with
 * a->accept set, for the caller to wire. */
static uint32_t nfa_embed(ml_fsm_ctx *c, nfa *m, const ml_fsm *a, bool keep_accept)
{
    uint32_t base = m->n;
    for (uint32_t s = 0; s < a->n_states; s++)
        if (nfa_add_state(c, m, keep_accept && a->accept[s], a->tags[s]) == FSM_NONE)
            return FSM_NONE;
    for (uint32_t s = 0; s < a->n_states; s++)
        for (uint32_t e = a->first[s]; e < a->first[s + 1]; e++) {
            const ml_fsm_edge *ed = &a->edges[e];
            if (!nfa_add_edge(c, m, base + s, ed->lo, ed->hi, base + ed->to))
                return FSM_NONE;
        }
    return base;
}

/* An epsilon edge from every accepting state of a (embedded at base) to `to`. */
static bool nfa_wire_accepts(ml_fsm_ctx *c, nfa *m, const ml_fsm *a, uint32_t base, uint32_t to)
{
    for (uint32_t s = 0; s < a->n_states; s++)
        if (a->accept[s] && !nfa_add_epsilon(c, m, base + s, to))
            return false;
    return true;
}

/* Sort the edges by source (counting sort) and index them. */
static bool nfa_index(ml_fsm_ctx *c, nfa *m)
{
    uint32_t *first = calloc((size_t)m->n + 1, sizeof *first);
    nfa_edge *sorted = malloc((m->n_edges ? m->n_edges : 1) * sizeof *sorted);
    if (!first || !sorted) {
        free(first);
        free(sorted);
        fsm_nomem(c);
        return false;
    }
    for (size_t e = 0; e < m->n_edges; e++)
        first[m->edges[e].from + 1]++;
    for (uint32_t s = 0; s < m->n; s++)
        first[s + 1] += first[s];
    for (size_t e = 0; e < m->n_edges; e++)
        sorted[first[m->edges[e].from]++] = m->edges[e];
    for (uint32_t s = m->n; s > 0; s--)
        first[s] = first[s - 1];
    first[0] = 0;
    free(m->edges);
    m->edges = sorted;
    m->cap_edges = m->n_edges ? m->n_edges : 1;
    m->first = first;
    return true;
}

/* ---- subset construction ---------------------------------------------------------- */

typedef struct subset_work {
    uint32_t *stamp, gen; /* (n) closure marks */
    uint32_t *stack;      /* (n) */
    uint32_t *set;        /* (n + edges) the closure being built */
    uint32_t *members;    /* (n) the subset being expanded */
    const nfa_edge **out; /* (cap_out) its symbol edges */
    uint64_t *events; /* (2 cap_out) where each starts and ends: pos << 32 | edge << 1 | start */
    uint32_t *active; /* (cap_out) the edges covering the sweep's position */
    uint32_t *slot;   /* (cap_out) each edge's index in active */
    size_t cap_out;
} subset_work;

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* The epsilon closure of w->set[0, n) in place, sorted; its size. */
static uint32_t closure(const nfa *m, subset_work *w, uint32_t n)
{
    w->gen++;
    uint32_t top = 0, len = 0;
    for (uint32_t i = 0; i < n; i++)
        if (w->stamp[w->set[i]] != w->gen) {
            w->stamp[w->set[i]] = w->gen;
            w->stack[top++] = w->set[i];
        }
    while (top > 0) {
        uint32_t s = w->stack[--top];
        w->set[len++] = s;
        for (uint32_t e = m->first[s]; e < m->first[s + 1]; e++) {
            const nfa_edge *ed = &m->edges[e];
            if (ed->lo > ed->hi && w->stamp[ed->to] != w->gen) {
                w->stamp[ed->to] = w->gen;
                w->stack[top++] = ed->to;
            }
        }
    }
    qsort(w->set, len, sizeof *w->set, cmp_u32);
    return len;
}

/* The subset w->set[0, len) as a state of r: its index (added when new,
 * with acceptance and tags ORed over the members). FSM_NONE when failed. */
static uint32_t subset_state(ml_fsm_ctx *c, const nfa *m, fsm_seqset *sets, ml_fsm *r,
                             const uint32_t *set, uint32_t len)
{
    bool added;
    uint32_t id = fsm_seqset_put(c, sets, set, len, &added);
    if (id == FSM_NONE || !added)
        return id;
    bool accept = false;
    uint8_t tags = 0;
    for (uint32_t i = 0; i < len; i++) {
        accept |= m->accept[set[i]] != 0;
        tags |= m->tags[set[i]];
    }
    return fsm_add_state(c, r, accept, tags);
}

/* Expand subset q of r: one edge per interval between the boundaries of
 * its members' edges that some edge covers. */
static bool subset_grow(ml_fsm_ctx *c, subset_work *w)
{
    size_t cap = w->cap_out ? w->cap_out * 2 : 64;
    const nfa_edge **out = realloc(w->out, cap * sizeof *out);
    if (out)
        w->out = out;
    uint64_t *events = realloc(w->events, 2 * cap * sizeof *events);
    if (events)
        w->events = events;
    uint32_t *active = realloc(w->active, cap * sizeof *active);
    if (active)
        w->active = active;
    uint32_t *slot = realloc(w->slot, cap * sizeof *slot);
    if (slot)
        w->slot = slot;
    if (!out || !events || !active || !slot) {
        fsm_nomem(c);
        return false;
    }
    w->cap_out = cap;
    return true;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* Expand subset q of r: a sweep over the starts and ends of its members'
 * edges, one edge of r per interval between them that some edge covers. */
static bool subset_expand(ml_fsm_ctx *c, const nfa *m, fsm_seqset *sets, ml_fsm *r, subset_work *w,
                          uint32_t q)
{
    uint32_t n_members;
    const uint32_t *mem = fsm_seqset_get(sets, q, &n_members);
    memcpy(w->members, mem, (size_t)n_members * sizeof *mem); /* the pool may move */
    size_t n_out = 0;
    for (uint32_t i = 0; i < n_members; i++) {
        uint32_t s = w->members[i];
        for (uint32_t e = m->first[s]; e < m->first[s + 1]; e++) {
            if (m->edges[e].lo > m->edges[e].hi)
                continue;
            if (n_out == w->cap_out && !subset_grow(c, w))
                return false;
            w->out[n_out++] = &m->edges[e];
        }
    }
    size_t n_events = 0;
    for (size_t i = 0; i < n_out; i++) {
        w->events[n_events++] = (uint64_t)w->out[i]->lo << 32 | (uint64_t)i << 1 | 1u;
        w->events[n_events++] = (uint64_t)(w->out[i]->hi + 1) << 32 | (uint64_t)i << 1;
    }
    if (n_events > 0)
        qsort(w->events, n_events, sizeof *w->events, cmp_u64);
    fsm_open(r, q);
    uint32_t n_active = 0;
    for (size_t k = 0; k < n_events;) {
        uint32_t pos = (uint32_t)(w->events[k] >> 32);
        for (; k < n_events && (uint32_t)(w->events[k] >> 32) == pos; k++) {
            uint32_t i = (uint32_t)(w->events[k] & UINT32_MAX) >> 1;
            if (w->events[k] & 1u) {
                w->slot[i] = n_active;
                w->active[n_active++] = i;
            } else {
                uint32_t last = w->active[--n_active];
                w->active[w->slot[i]] = last;
                w->slot[last] = w->slot[i];
            }
        }
        if (n_active == 0 || k == n_events)
            continue;
        uint32_t hi = (uint32_t)(w->events[k] >> 32) - 1;
        for (uint32_t j = 0; j < n_active; j++)
            w->set[j] = w->out[w->active[j]]->to;
        uint32_t n = closure(m, w, n_active);
        uint32_t to = subset_state(c, m, sets, r, w->set, n);
        if (to == FSM_NONE || !fsm_add_edge(c, r, pos, hi, to))
            return false;
    }
    return true;
}

/* The minimal DFA of m's language from state start. Consumes m. */
static ml_fsm *determinize(ml_fsm_ctx *c, nfa *m, uint32_t start)
{
    ml_fsm *r = NULL;
    fsm_seqset sets = {0};
    subset_work w = {0};
    if (c->status != ML_OK || !nfa_index(c, m))
        goto out;
    w.stamp = calloc(m->n, sizeof *w.stamp);
    w.stack = malloc((size_t)m->n * sizeof *w.stack);
    /* A closure starts from the targets of the edges covering a symbol:
     * overlapping edges of one state (UTF-8 paths) may outnumber the states. */
    w.set = malloc(((size_t)m->n + m->n_edges) * sizeof *w.set);
    w.members = malloc((size_t)m->n * sizeof *w.members);
    r = fsm_alloc(c);
    if (!w.stamp || !w.stack || !w.set || !w.members || !r) {
        fsm_nomem(c);
        goto out;
    }
    w.set[0] = start;
    uint32_t n = closure(m, &w, 1);
    bool ok = subset_state(c, m, &sets, r, w.set, n) != FSM_NONE;
    for (uint32_t q = 0; ok && q < sets.n; q++) {
        ok = fsm_tick(c) && subset_expand(c, m, &sets, r, &w, q);
        if (ok && sets.pool_len > (size_t)c->max_states * FSM_WORDS_PER_STATE) {
            ml_fsm_ctx_fail(c, ML_ERR_TOO_LARGE,
                            "subset construction over %u words per state of the bound of %u",
                            FSM_WORDS_PER_STATE, c->max_states);
            ok = false;
        }
    }
    if (ok)
        fsm_seal(r);
out:
    free(w.stamp);
    free(w.stack);
    free(w.set);
    free(w.members);
    free(w.out);
    free(w.events);
    free(w.active);
    free(w.slot);
    fsm_seqset_deinit(&sets);
    nfa_deinit(m);
    if (c->status != ML_OK) {
        ml_fsm_free(r);
        return NULL;
    }
    return fsm_finish(c, r);
}

/* ---- concatenation, union, repetition ----------------------------------------------------- */

/* Frees a and b and returns false when either is missing or the context
 * has failed: the common entry of the two-argument operations. */
static bool take_two(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b)
{
    if (a && b && c->status == ML_OK)
        return true;
    ml_fsm_free(a);
    ml_fsm_free(b);
    return false;
}

ml_fsm *ml_fsm_concat(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b)
{
    if (!take_two(c, a, b))
        return NULL;
    nfa m = {0};
    uint32_t ia = nfa_embed(c, &m, a, false);
    uint32_t ib = ia == FSM_NONE ? FSM_NONE : nfa_embed(c, &m, b, true);
    if (ib != FSM_NONE)
        nfa_wire_accepts(c, &m, a, ia, ib);
    ml_fsm_free(a);
    ml_fsm_free(b);
    return determinize(c, &m, ia);
}

ml_fsm *ml_fsm_union(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b)
{
    if (!take_two(c, a, b))
        return NULL;
    nfa m = {0};
    uint32_t start = nfa_add_state(c, &m, false, 0);
    uint32_t ia = start == FSM_NONE ? FSM_NONE : nfa_embed(c, &m, a, true);
    uint32_t ib = ia == FSM_NONE ? FSM_NONE : nfa_embed(c, &m, b, true);
    if (ib != FSM_NONE && nfa_add_epsilon(c, &m, start, ia))
        nfa_add_epsilon(c, &m, start, ib);
    ml_fsm_free(a);
    ml_fsm_free(b);
    return determinize(c, &m, start);
}

/* Append one copy of a after joint `from`: returns the joint after it
 * (a fresh state), or, when loop, wires the copy back to `from`. */
static uint32_t repeat_step(ml_fsm_ctx *c, nfa *m, const ml_fsm *a, uint32_t from, bool loop)
{
    uint32_t base = nfa_embed(c, m, a, false);
    if (base == FSM_NONE || !nfa_add_epsilon(c, m, from, base))
        return FSM_NONE;
    uint32_t to = loop ? from : nfa_add_state(c, m, false, 0);
    if (to == FSM_NONE || !nfa_wire_accepts(c, m, a, base, to))
        return FSM_NONE;
    return to;
}

ml_fsm *ml_fsm_repeat(ml_fsm_ctx *c, ml_fsm *a, uint32_t min, uint32_t max)
{
    if (!a || c->status != ML_OK) {
        ml_fsm_free(a);
        return NULL;
    }
    if (min > max) {
        ml_fsm_free(a);
        ml_fsm_ctx_fail(c, ML_ERR_INVALID_ARG, "repeat {%u,%u}: min over max", min, max);
        return NULL;
    }
    uint64_t copies = max == ML_FSM_UNBOUNDED ? (uint64_t)min + 1 : max;
    if (copies * (a->n_states + 1) > (uint64_t)c->max_states * NFA_STATES_PER_BOUND) {
        ml_fsm_ctx_fail(c, ML_ERR_TOO_LARGE,
                        "repeat of %u states up to %llu times: over the bound of %u states",
                        a->n_states, (unsigned long long)copies, c->max_states);
        ml_fsm_free(a);
        return NULL;
    }
    /* Joints: start -a- j1 -a- j2 ... jmin, then optional copies each
     * ending at an accepting joint, or one loop on jmin. */
    nfa m = {0};
    uint32_t start = nfa_add_state(c, &m, false, 0), j = start;
    for (uint32_t i = 0; i < min && j != FSM_NONE; i++)
        j = repeat_step(c, &m, a, j, false);
    if (max == ML_FSM_UNBOUNDED) {
        if (j != FSM_NONE && repeat_step(c, &m, a, j, true) != FSM_NONE)
            m.accept[j] = 1;
    } else {
        for (uint32_t i = min; i < max && j != FSM_NONE; i++) {
            m.accept[j] = 1;
            j = repeat_step(c, &m, a, j, false);
        }
        if (j != FSM_NONE)
            m.accept[j] = 1;
    }
    ml_fsm_free(a);
    return determinize(c, &m, start);
}

/* Frees a[0..n) and returns false when one is missing or the context has
 * failed. */
static bool take_n(ml_fsm_ctx *c, ml_fsm *const *a, size_t n)
{
    bool ok = c->status == ML_OK;
    for (size_t i = 0; i < n; i++)
        ok &= a[i] != NULL;
    for (size_t i = 0; !ok && i < n; i++)
        ml_fsm_free(a[i]);
    return ok;
}

ml_fsm *ml_fsm_union_n(ml_fsm_ctx *c, ml_fsm *const *a, size_t n)
{
    if (!take_n(c, a, n))
        return NULL;
    nfa m = {0};
    uint32_t start = nfa_add_state(c, &m, false, 0);
    for (size_t i = 0; i < n && c->status == ML_OK; i++) {
        uint32_t base = nfa_embed(c, &m, a[i], true);
        if (base != FSM_NONE)
            nfa_add_epsilon(c, &m, start, base);
    }
    for (size_t i = 0; i < n; i++)
        ml_fsm_free(a[i]);
    return determinize(c, &m, start);
}

ml_fsm *ml_fsm_concat_n(ml_fsm_ctx *c, ml_fsm *const *a, size_t n)
{
    if (!take_n(c, a, n))
        return NULL;
    nfa m = {0};
    uint32_t start = nfa_add_state(c, &m, false, 0), joint = start;
    for (size_t i = 0; i < n && joint != FSM_NONE; i++)
        joint = repeat_step(c, &m, a[i], joint, false);
    if (joint != FSM_NONE)
        m.accept[joint] = 1;
    for (size_t i = 0; i < n; i++)
        ml_fsm_free(a[i]);
    return determinize(c, &m, start);
}

/* ---- products ------------------------------------------------------------------- */

/* State (i, j) of the product of a and b; j == b->n_states is b's sink
 * (b has refused the input). */
static uint32_t product_state(ml_fsm_ctx *c, fsm_seqset *pairs, ml_fsm *r, const ml_fsm *a,
                              const ml_fsm *b, bool minus, uint32_t i, uint32_t j)
{
    bool added;
    const uint32_t pair[2] = {i, j};
    uint32_t id = fsm_seqset_put(c, pairs, pair, 2, &added);
    if (id == FSM_NONE || !added)
        return id;
    bool in_b = j < b->n_states && b->accept[j];
    bool accept = a->accept[i] && (minus ? !in_b : in_b);
    uint8_t tags = a->tags[i] | (j < b->n_states ? b->tags[j] : 0);
    return fsm_add_state(c, r, accept, tags);
}

/* The edges of product state q = (i, j): over each edge of a, the parts b
 * covers go to (a's target, b's target); the parts it does not go to b's
 * sink when minus, nowhere otherwise. */
static bool product_expand(ml_fsm_ctx *c, fsm_seqset *pairs, ml_fsm *r, const ml_fsm *a,
                           const ml_fsm *b, bool minus, uint32_t q)
{
    uint32_t len;
    const uint32_t *pair = fsm_seqset_get(pairs, q, &len);
    uint32_t i = pair[0], j = pair[1], sink = b->n_states;
    const ml_fsm_edge *eb = NULL;
    size_t nb = j < sink ? ml_fsm_edges(b, j, &eb) : 0, k = 0;
    fsm_open(r, q);
    for (uint32_t e = a->first[i]; e < a->first[i + 1]; e++) {
        const ml_fsm_edge *ea = &a->edges[e];
        uint32_t pos = ea->lo;
        for (;;) {
            while (k < nb && eb[k].hi < pos)
                k++;
            uint32_t end, tj;
            if (k < nb && eb[k].lo <= pos) {
                end = eb[k].hi < ea->hi ? eb[k].hi : ea->hi;
                tj = eb[k].to;
            } else {
                end = k < nb && eb[k].lo - 1 < ea->hi ? eb[k].lo - 1 : ea->hi;
                tj = minus ? sink : FSM_NONE;
            }
            if (tj != FSM_NONE) {
                uint32_t to = product_state(c, pairs, r, a, b, minus, ea->to, tj);
                if (to == FSM_NONE || !fsm_add_edge(c, r, pos, end, to))
                    return false;
            }
            if (end == ea->hi)
                break;
            pos = end + 1;
        }
    }
    return true;
}

static ml_fsm *product(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b, bool minus)
{
    if (!take_two(c, a, b))
        return NULL;
    ml_fsm *r = NULL;
    fsm_seqset pairs = {0};
    if (ml_fsm_has_calls(a) || ml_fsm_has_calls(b)) {
        ml_fsm_ctx_fail(c, ML_ERR_UNSUPPORTED, "%s of automata holding calls (a recursive $ref)",
                        minus ? "difference" : "intersection");
        goto out;
    }
    r = fsm_alloc(c);
    bool ok = r && product_state(c, &pairs, r, a, b, minus, 0, 0) != FSM_NONE;
    for (uint32_t q = 0; ok && q < pairs.n; q++)
        ok = fsm_tick(c) && product_expand(c, &pairs, r, a, b, minus, q);
    if (ok)
        fsm_seal(r);
out:
    fsm_seqset_deinit(&pairs);
    ml_fsm_free(a);
    ml_fsm_free(b);
    if (c->status != ML_OK) {
        ml_fsm_free(r);
        return NULL;
    }
    return fsm_finish(c, r);
}

ml_fsm *ml_fsm_intersect(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b)
{
    return product(c, a, b, false);
}

ml_fsm *ml_fsm_minus(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b)
{
    return product(c, a, b, true);
}

/* ---- UTF-8 ------------------------------------------------------------------------ */

#define UTF8_CONT_BITS 6

static const uint32_t utf8_len_max[ML_UTF8_MAX_BYTES] = {0x7F, 0x7FF, 0xFFFF, ML_UTF8_MAX_CP};

/* Paths start -> end in m for the code points [lo, hi] (one encoded
 * length, no surrogates): split until every byte position is one range,
 * as RE2 and Rust's regex-syntax do. */
static bool utf8_paths(ml_fsm_ctx *c, nfa *m, uint32_t lo, uint32_t hi)
{
    for (int i = 1; i < ML_UTF8_MAX_BYTES; i++) {
        uint32_t mask = (1u << (UTF8_CONT_BITS * i)) - 1;
        if ((lo & ~mask) == (hi & ~mask))
            continue;
        if ((lo & mask) != 0)
            return utf8_paths(c, m, lo, lo | mask) && utf8_paths(c, m, (lo | mask) + 1, hi);
        if ((hi & mask) != mask)
            return utf8_paths(c, m, lo, (hi & ~mask) - 1) && utf8_paths(c, m, hi & ~mask, hi);
    }
    uint8_t elo[ML_UTF8_MAX_BYTES], ehi[ML_UTF8_MAX_BYTES];
    int n = (int)ml_utf8_encode(lo, elo);
    ml_utf8_encode(hi, ehi);
    uint32_t from = 0; /* the start; 1 is the accepting end */
    for (int k = 0; k < n; k++) {
        uint32_t to = k + 1 == n ? 1 : nfa_add_state(c, m, false, 0);
        if (to == FSM_NONE || !nfa_add_edge(c, m, from, elo[k], ehi[k], to))
            return false;
        from = to;
    }
    return true;
}

ml_fsm *ml_fsm_utf8(ml_fsm_ctx *c, const uint32_t (*ranges)[2], size_t n)
{
    if (c->status != ML_OK)
        return NULL;
    nfa m = {0};
    bool ok =
        nfa_add_state(c, &m, false, 0) != FSM_NONE && nfa_add_state(c, &m, true, 0) != FSM_NONE;
    for (size_t r = 0; ok && r < n; r++) {
        uint32_t lo = ranges[r][0],
                 hi = ranges[r][1] > ML_UTF8_MAX_CP ? ML_UTF8_MAX_CP : ranges[r][1];
        /* Split at the surrogates and at each encoded length's end. */
        const uint32_t cuts[][2] = {{lo, ML_UTF8_SURROGATE_LO - 1}, {ML_UTF8_SURROGATE_HI + 1, hi}};
        for (int part = 0; ok && part < 2; part++) {
            uint32_t plo = cuts[part][0] > lo ? cuts[part][0] : lo;
            uint32_t phi = cuts[part][1] < hi ? cuts[part][1] : hi;
            for (int len = 0; ok && len < ML_UTF8_MAX_BYTES && plo <= phi; len++) {
                uint32_t end = utf8_len_max[len] < phi ? utf8_len_max[len] : phi;
                if (plo <= end) {
                    ok = utf8_paths(c, &m, plo, end) && fsm_tick(c);
                    plo = end + 1;
                }
            }
        }
    }
    return determinize(c, &m, 0);
}
