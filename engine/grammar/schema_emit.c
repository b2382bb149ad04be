/* The compiler's machines turned into the grammar tables of
 * grammar_internal.h: all machines' states in one table, calls resolved to
 * "call on first byte" entries, need[] (guarantee 3), the states that cannot
 * complete within ML_GRAMMAR_MAX_DEPTH dropped, the rest renumbered, bytes
 * grouped into classes. Guarantees 1 and 3 are made here (a conflict is
 * refused); 2, 4 and 5 hold by the structure of JSON texts (a value ends
 * where its container says, whitespace only in gaps, none around the
 * document). Every grammar emitted is checked (ml_grammar_check, need[]
 * locally; the tests and the fuzz target check it fully). */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "grammar/schema_internal.h"

#define NEED_NONE UINT16_MAX
/* Bit of a predecessor entry saying "through call i" rather than a state. */
#define PRED_CALL 0x80000000u

typedef struct emitter {
    schema_compiler *sc;
    uint32_t n_machines;
    uint32_t *offset;  /* owned (n_machines + 1): machine k's states start here */
    uint32_t *machine; /* owned (n): the machine of each state */
    uint32_t n;        /* states, all machines */
    /* Calls: one per call symbol on an edge, in state and edge order;
     * state s's are [call_first[s], call_first[s + 1]). */
    uint32_t *call_first; /* owned (n + 1) */
    uint32_t *call_k, *call_ret, *call_from; /* owned (n_calls) */
    uint32_t n_calls;
    uint16_t *need;       /* owned (n) */
    uint8_t *alive;       /* owned (n): kept, completing and reachable */
    uint8_t *call_alive;  /* owned (n_calls) */
    uint32_t *new_id;     /* owned (n): index among the kept states */
    uint32_t *new_call;   /* owned (n_calls) */
    uint8_t (*first)[32]; /* owned (n_machines): first bytes of each machine */
    uint8_t *first_state; /* owned (n_machines): 0 not done, 1 in progress, 2 done */
} emitter;

static const ml_fsm *state_fsm(const emitter *e, uint32_t s, uint32_t *local)
{
    uint32_t k = e->machine[s];
    *local = s - e->offset[k];
    return e->sc->machines[k].fsm;
}

static bool emit_fail(emitter *e, ml_status st, const char *msg)
{
    ml_fsm_ctx_fail(e->sc->fc, st, "%s", msg);
    return false;
}

/* Number the states and the calls. */
static bool emit_layout(emitter *e)
{
    e->n_machines = e->sc->n_machines;
    e->offset = calloc(e->n_machines + 1, sizeof *e->offset);
    if (!e->offset)
        return emit_fail(e, ML_ERR_NOMEM, "schema: out of memory");
    uint64_t n = 0;
    for (uint32_t k = 0; k < e->n_machines; k++) {
        e->offset[k] = (uint32_t)n;
        n += ml_fsm_n_states(e->sc->machines[k].fsm);
        if (n > e->sc->max_states) {
            ml_fsm_ctx_fail(e->sc->fc, ML_ERR_TOO_LARGE,
                            "schema: the grammar has over %u states (max_states)",
                            e->sc->max_states);
            return false;
        }
    }
    e->offset[e->n_machines] = (uint32_t)n;
    e->n = (uint32_t)n;
    e->machine = malloc((n + 1) * sizeof *e->machine);
    e->call_first = calloc(n + 1, sizeof *e->call_first);
    if (!e->machine || !e->call_first)
        return emit_fail(e, ML_ERR_NOMEM, "schema: out of memory");
    uint32_t calls = 0;
    for (uint32_t k = 0; k < e->n_machines; k++)
        for (uint32_t s = e->offset[k]; s < e->offset[k + 1]; s++) {
            e->machine[s] = k;
            e->call_first[s] = calls;
            const ml_fsm_edge *ed;
            size_t ne = ml_fsm_edges(e->sc->machines[k].fsm, s - e->offset[k], &ed);
            for (size_t i = 0; i < ne; i++)
                if (ed[i].hi >= ML_FSM_N_BYTES) {
                    uint32_t lo = ed[i].lo > ML_FSM_N_BYTES ? ed[i].lo : ML_FSM_N_BYTES;
                    calls += ed[i].hi - lo + 1;
                }
        }
    e->call_first[n] = calls;
    e->n_calls = calls;
    e->call_k = malloc((calls + 1) * sizeof *e->call_k);
    e->call_ret = malloc((calls + 1) * sizeof *e->call_ret);
    e->call_from = malloc((calls + 1) * sizeof *e->call_from);
    if (!e->call_k || !e->call_ret || !e->call_from)
        return emit_fail(e, ML_ERR_NOMEM, "schema: out of memory");
    for (uint32_t s = 0; s < n; s++) {
        uint32_t local, c = e->call_first[s];
        const ml_fsm *a = state_fsm(e, s, &local);
        const ml_fsm_edge *ed;
        size_t ne = ml_fsm_edges(a, local, &ed);
        for (size_t i = 0; i < ne; i++)
            for (uint32_t sym = ed[i].lo > ML_FSM_N_BYTES ? ed[i].lo : ML_FSM_N_BYTES;
                 sym <= ed[i].hi; sym++, c++) {
                e->call_k[c] = sym - ML_FSM_N_BYTES;
                e->call_ret[c] = e->offset[e->machine[s]] + ed[i].to;
                e->call_from[c] = s;
            }
    }
    return true;
}

/* need[s] (grammar_internal.h, guarantee 3), level by level: the states
 * that complete their machine entering at most d nested calls are those
 * accepting, or with a byte edge into one of level d, or a call whose callee
 * completes within d - 1 and whose return state within d. */
static bool emit_need(emitter *e)
{
    uint32_t n = e->n;
    e->need = malloc((n + 1) * sizeof *e->need);
    uint32_t *cnt = calloc(n + 2, sizeof *cnt);
    uint32_t *queue = malloc((n + 1) * sizeof *queue);
    uint32_t *pred = NULL;
    bool ok = false;
    if (!e->need || !cnt || !queue)
        goto out;
    /* Predecessors (CSR): byte edges s -> t, and call i into its return state. */
    for (uint32_t s = 0; s < n; s++) {
        e->need[s] = NEED_NONE;
        uint32_t local;
        const ml_fsm *a = state_fsm(e, s, &local);
        const ml_fsm_edge *ed;
        size_t ne = ml_fsm_edges(a, local, &ed);
        for (size_t i = 0; i < ne; i++)
            if (ed[i].lo < ML_FSM_N_BYTES)
                cnt[e->offset[e->machine[s]] + ed[i].to + 1]++;
    }
    for (uint32_t c = 0; c < e->n_calls; c++)
        cnt[e->call_ret[c] + 1]++;
    for (uint32_t s = 0; s < n; s++)
        cnt[s + 1] += cnt[s];
    pred = malloc(((size_t)cnt[n] + 1) * sizeof *pred);
    if (!pred)
        goto out;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t local;
        const ml_fsm *a = state_fsm(e, s, &local);
        const ml_fsm_edge *ed;
        size_t ne = ml_fsm_edges(a, local, &ed);
        for (size_t i = 0; i < ne; i++)
            if (ed[i].lo < ML_FSM_N_BYTES)
                pred[cnt[e->offset[e->machine[s]] + ed[i].to]++] = s;
    }
    for (uint32_t c = 0; c < e->n_calls; c++)
        pred[cnt[e->call_ret[c]]++] = c | PRED_CALL;
    /* cnt[t] is now the end of t's predecessors; t's start is cnt[t - 1]. */
    for (uint32_t d = 0; d <= ML_GRAMMAR_MAX_DEPTH; d++) {
        uint32_t head = 0, tail = 0;
        if (d == 0) {
            for (uint32_t s = 0; s < n; s++) {
                uint32_t local;
                const ml_fsm *a = state_fsm(e, s, &local);
                if (ml_fsm_accepting(a, local)) {
                    e->need[s] = 0;
                    queue[tail++] = s;
                }
            }
        } else {
            for (uint32_t c = 0; c < e->n_calls; c++) {
                uint32_t s = e->call_from[c], enter = e->offset[e->call_k[c]];
                if (e->need[s] == NEED_NONE && e->need[enter] < d && e->need[e->call_ret[c]] <= d) {
                    e->need[s] = (uint16_t)d;
                    queue[tail++] = s;
                }
            }
        }
        while (head < tail) {
            uint32_t t = queue[head++];
            for (uint32_t p = t ? cnt[t - 1] : 0; p < cnt[t]; p++) {
                uint32_t s = pred[p];
                if (s & PRED_CALL) {
                    uint32_t c = s & ~PRED_CALL;
                    if (d == 0 || e->need[e->offset[e->call_k[c]]] >= d)
                        continue;
                    s = e->call_from[c];
                }
                if (e->need[s] == NEED_NONE) {
                    e->need[s] = (uint16_t)d;
                    queue[tail++] = s;
                }
            }
        }
    }
    ok = true;
out:
    free(cnt);
    free(queue);
    free(pred);
    return ok || emit_fail(e, ML_ERR_NOMEM, "schema: out of memory");
}

/* The states kept: completing (need within the depth bound) and reachable
 * from the document's start through kept edges and calls. */
static bool emit_keep(emitter *e)
{
    uint32_t n = e->n;
    e->alive = calloc(n + 1, 1);
    e->call_alive = calloc(e->n_calls + 1, 1);
    e->new_id = malloc((n + 1) * sizeof *e->new_id);
    e->new_call = malloc((e->n_calls + 1) * sizeof *e->new_call);
    uint32_t *stack = malloc((n + 1) * sizeof *stack);
    if (!e->alive || !e->call_alive || !e->new_id || !e->new_call || !stack) {
        free(stack);
        return emit_fail(e, ML_ERR_NOMEM, "schema: out of memory");
    }
    if (e->need[0] == NEED_NONE) {
        free(stack);
        ml_fsm_ctx_fail(e->sc->fc, ML_ERR_INVALID_ARG,
                        "schema: no document is valid under it within %d nested references",
                        ML_GRAMMAR_MAX_DEPTH);
        return false;
    }
    for (uint32_t c = 0; c < e->n_calls; c++) {
        uint16_t ne = e->need[e->offset[e->call_k[c]]];
        e->call_alive[c] = ne != NEED_NONE && ne + 1u <= ML_GRAMMAR_MAX_DEPTH &&
                           e->need[e->call_ret[c]] != NEED_NONE;
    }
    uint32_t top = 0;
    stack[top++] = 0;
    e->alive[0] = 1;
    while (top) {
        uint32_t s = stack[--top], local;
        const ml_fsm *a = state_fsm(e, s, &local);
        const ml_fsm_edge *ed;
        size_t ne = ml_fsm_edges(a, local, &ed);
        for (size_t i = 0; i < ne; i++) {
            uint32_t t = e->offset[e->machine[s]] + ed[i].to;
            if (ed[i].lo < ML_FSM_N_BYTES && e->need[t] != NEED_NONE && !e->alive[t]) {
                e->alive[t] = 1;
                stack[top++] = t;
            }
        }
        for (uint32_t c = e->call_first[s]; c < e->call_first[s + 1]; c++) {
            if (!e->call_alive[c])
                continue;
            uint32_t to[2] = {e->offset[e->call_k[c]], e->call_ret[c]};
            for (int j = 0; j < 2; j++)
                if (!e->alive[to[j]]) {
                    e->alive[to[j]] = 1;
                    stack[top++] = to[j];
                }
        }
    }
    free(stack);
    uint32_t k = 0;
    for (uint32_t s = 0; s < n; s++)
        e->new_id[s] = e->alive[s] ? k++ : ML_GRAMMAR_DEAD;
    k = 0;
    for (uint32_t c = 0; c < e->n_calls; c++) {
        e->call_alive[c] &= e->alive[e->call_from[c]];
        e->new_call[c] = e->call_alive[c] ? k++ : ML_GRAMMAR_DEAD;
    }
    return true;
}

/* The bytes machine k's values begin with (kept edges only); a machine that
 * calls back into itself before reading a byte is a $ref cycle that
 * consumes nothing, refused. */
static bool emit_first(emitter *e, uint32_t k)
{
    if (e->first_state[k] == 2)
        return true;
    if (e->first_state[k] == 1) {
        ml_fsm_ctx_fail(e->sc->fc, ML_ERR_UNSUPPORTED,
                        "schema: the $ref cycle through %s consumes nothing (left recursion)",
                        e->sc->machines[k].pointer);
        return false;
    }
    e->first_state[k] = 1;
    uint32_t s = e->offset[k];
    const ml_fsm_edge *ed;
    size_t ne = ml_fsm_edges(e->sc->machines[k].fsm, 0, &ed);
    for (size_t i = 0; i < ne; i++)
        for (uint32_t b = ed[i].lo; b <= ed[i].hi && b < ML_FSM_N_BYTES; b++)
            if (e->alive[e->offset[k] + ed[i].to])
                e->first[k][b >> 3] |= (uint8_t)(1u << (b & 7));
    for (uint32_t c = e->call_first[s]; c < e->call_first[s + 1]; c++) {
        if (!e->call_alive[c])
            continue;
        if (!emit_first(e, e->call_k[c]))
            return false;
        for (int w = 0; w < 32; w++)
            e->first[k][w] |= e->first[e->call_k[c]][w];
    }
    e->first_state[k] = 2;
    return true;
}

/* Refuse a machine that calls back into itself before reading a byte (a
 * $ref cycle that consumes nothing), whether or not the calls could
 * complete: its first bytes would be undefined. */
static bool emit_left_recursion(emitter *e, uint32_t k, uint8_t *state)
{
    if (state[k] == 2)
        return true;
    if (state[k] == 1) {
        ml_fsm_ctx_fail(e->sc->fc, ML_ERR_UNSUPPORTED,
                        "schema: the $ref cycle through %s consumes nothing (left recursion)",
                        e->sc->machines[k].pointer);
        return false;
    }
    state[k] = 1;
    uint32_t s = e->offset[k];
    for (uint32_t c = e->call_first[s]; c < e->call_first[s + 1]; c++)
        if (!emit_left_recursion(e, e->call_k[c], state))
            return false;
    state[k] = 2;
    return true;
}

/* The row of kept state s over the 256 bytes (grammar_internal.h's
 * entries, in new numbering); false (latched) when a call's first byte is
 * taken already (guarantee 1). */
static bool emit_row(emitter *e, uint32_t s, uint32_t row[256])
{
    for (int b = 0; b < 256; b++)
        row[b] = ML_GRAMMAR_DEAD;
    uint32_t local;
    const ml_fsm *a = state_fsm(e, s, &local);
    const ml_fsm_edge *ed;
    size_t ne = ml_fsm_edges(a, local, &ed);
    for (size_t i = 0; i < ne; i++) {
        uint32_t t = e->offset[e->machine[s]] + ed[i].to;
        for (uint32_t b = ed[i].lo; b <= ed[i].hi && b < ML_FSM_N_BYTES; b++)
            row[b] = e->new_id[t];
    }
    for (uint32_t c = e->call_first[s]; c < e->call_first[s + 1]; c++) {
        if (!e->call_alive[c])
            continue;
        uint32_t k = e->call_k[c];
        if (!emit_first(e, k))
            return false;
        for (int b = 0; b < 256; b++) {
            if (!((e->first[k][b >> 3] >> (b & 7)) & 1))
                continue;
            if (row[b] != ML_GRAMMAR_DEAD) {
                ml_fsm_ctx_fail(e->sc->fc, ML_ERR_UNSUPPORTED,
                                "schema: a value of %s (a recursive reference) and another "
                                "alternative at the same place both begin with byte 0x%02x; "
                                "recursive alternatives must differ in their first byte",
                                e->sc->machines[k].pointer, b);
                return false;
            }
            row[b] = ML_GRAMMAR_CALL | e->new_call[c];
        }
    }
    return true;
}

/* Bytes with the same entry in every kept state share a class: grouped by a
 * hash of their columns, then verified entry by entry. */
static bool emit_classes(emitter *e, uint8_t byte_class[256], uint32_t *n_classes,
                         uint8_t rep[256])
{
    uint64_t sig[256];
    uint32_t row[256];
    for (int b = 0; b < 256; b++)
        sig[b] = 0xcbf29ce484222325ull;
    for (uint32_t s = 0; s < e->n; s++) {
        if (!e->alive[s])
            continue;
        if (!emit_row(e, s, row))
            return false;
        for (int b = 0; b < 256; b++)
            sig[b] = (sig[b] ^ row[b]) * 0x100000001b3ull + (sig[b] >> 29);
    }
    uint32_t nc = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t c = 0;
        while (c < nc && sig[rep[c]] != sig[b])
            c++;
        if (c == nc)
            rep[nc++] = (uint8_t)b;
        byte_class[b] = (uint8_t)c;
    }
    for (uint32_t s = 0; s < e->n; s++) {
        if (!e->alive[s])
            continue;
        emit_row(e, s, row);
        for (int b = 0; b < 256; b++)
            if (row[b] != row[rep[byte_class[b]]])
                return emit_fail(e, ML_ERR_UNSUPPORTED,
                                 "schema: byte classes collided (a hash collision; retry "
                                 "with a different schema text)");
    }
    *n_classes = nc;
    return true;
}

static void emitter_deinit(emitter *e)
{
    free(e->offset);
    free(e->machine);
    free(e->call_first);
    free(e->call_k);
    free(e->call_ret);
    free(e->call_from);
    free(e->need);
    free(e->alive);
    free(e->call_alive);
    free(e->new_id);
    free(e->new_call);
    free(e->first);
    free(e->first_state);
}

ml_grammar *schema_emit(schema_compiler *sc)
{
    emitter e = {.sc = sc};
    ml_grammar *g = NULL;
    uint8_t rep[256];
    uint8_t byte_class[256];
    uint32_t n_classes = 0, row[256];
    if (!emit_layout(&e))
        goto out;
    e.first = calloc(e.n_machines, sizeof *e.first);
    e.first_state = calloc(e.n_machines, 1);
    if (!e.first || !e.first_state) {
        emit_fail(&e, ML_ERR_NOMEM, "schema: out of memory");
        goto out;
    }
    for (uint32_t k = 0; k < e.n_machines; k++)
        if (!emit_left_recursion(&e, k, e.first_state))
            goto out;
    memset(e.first_state, 0, e.n_machines);
    if (!emit_need(&e) || !emit_keep(&e))
        goto out;
    if (!emit_classes(&e, byte_class, &n_classes, rep))
        goto out;
    uint32_t n_kept = 0, n_calls = 0;
    for (uint32_t s = 0; s < e.n; s++)
        n_kept += e.alive[s];
    for (uint32_t c = 0; c < e.n_calls; c++)
        n_calls += e.call_alive[c];
    g = ml_grammar_alloc(n_kept, n_classes, n_calls);
    if (!g) {
        emit_fail(&e, ML_ERR_NOMEM, "schema: out of memory");
        goto out;
    }
    memcpy(g->byte_class, byte_class, sizeof byte_class);
    g->start = e.new_id[0];
    for (uint32_t s = 0; s < e.n; s++) {
        if (!e.alive[s])
            continue;
        uint32_t t = e.new_id[s], local = 0;
        const ml_fsm *a = state_fsm(&e, s, &local);
        emit_row(&e, s, row);
        for (uint32_t c = 0; c < n_classes; c++)
            g->next[(size_t)t * n_classes + c] = row[rep[c]];
        g->flags[t] = (uint8_t)((ml_fsm_accepting(a, local) ? ML_GRAMMAR_ACCEPT : 0) |
                                (ml_fsm_tags(a, local) & ML_FSM_TAG_IN_STRING ? ML_GRAMMAR_IN_STRING
                                                                              : 0));
        g->need[t] = e.need[s];
    }
    for (uint32_t c = 0; c < e.n_calls; c++)
        if (e.call_alive[c])
            g->calls[e.new_call[c]] = (ml_grammar_call){.enter = e.new_id[e.offset[e.call_k[c]]],
                                                        .ret = e.new_id[e.call_ret[c]]};
    char err[256];
    if (ml_grammar_check(g, false, err, sizeof err) != ML_OK) {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_UNSUPPORTED, "schema: the grammar breaks %s", err);
        ml_grammar_unref(g);
        g = NULL;
    }
out:
    emitter_deinit(&e);
    return g;
}
