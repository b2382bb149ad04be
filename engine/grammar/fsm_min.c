/* Byte automata (fsm.h): the equivalence classes of minimisation, by
 * Valmari's partition refinement of states and transitions ("Fast brief
 * practical DFA minimization", Information Processing Letters 112, 2012),
 * O(m log n) on partial automata: no sink state is needed. Transitions are
 * labelled by the elementary intervals of the automaton's edge boundaries,
 * so a range edge is as many transitions as the intervals it covers. */
#include <stdlib.h>
#include <string.h>

#include "grammar/fsm_internal.h"

/* Distinct (accept, tags) keys of the initial partition. */
#define MIN_N_KEYS 512u

/* A refinable partition of 0..n-1: elements E ordered by set, each set s
 * the slice E[F[s], P[s]); L[e] the position of e, S[e] its set. The
 * marked elements of s are the first M[s] of its slice. */
typedef struct rpart {
    uint32_t z; /* number of sets */
    uint32_t *E, *L, *S, *F, *P;
} rpart;

/* The marks shared by both partitions (one is split at a time). */
typedef struct rmarks {
    uint32_t *M; /* marked count per set */
    uint32_t *W; /* touched sets */
    uint32_t w;
} rmarks;

static bool rpart_init(rpart *p, uint32_t n)
{
    size_t sz = (n ? n : 1) * sizeof(uint32_t);
    p->E = malloc(sz);
    p->L = malloc(sz);
    p->S = malloc(sz);
    p->F = malloc(sz);
    p->P = malloc(sz);
    if (!p->E || !p->L || !p->S || !p->F || !p->P)
        return false;
    for (uint32_t i = 0; i < n; i++) {
        p->E[i] = p->L[i] = i;
        p->S[i] = 0;
    }
    p->z = n > 0;
    p->F[0] = 0;
    p->P[0] = n;
    return true;
}

static void rpart_deinit(rpart *p)
{
    free(p->E);
    free(p->L);
    free(p->S);
    free(p->F);
    free(p->P);
}

static void rpart_mark(rpart *p, rmarks *k, uint32_t e)
{
    uint32_t s = p->S[e], i = p->L[e], j = p->F[s] + k->M[s];
    p->E[i] = p->E[j];
    p->L[p->E[i]] = i;
    p->E[j] = e;
    p->L[e] = j;
    if (!k->M[s]++)
        k->W[k->w++] = s;
}

/* Split every touched set into its marked and unmarked parts; the smaller
 * part becomes the new set. */
static void rpart_split(rpart *p, rmarks *k)
{
    while (k->w) {
        uint32_t s = k->W[--k->w], j = p->F[s] + k->M[s], z = p->z;
        if (j == p->P[s]) {
            k->M[s] = 0;
            continue;
        }
        if (k->M[s] <= p->P[s] - j) {
            p->F[z] = p->F[s];
            p->P[z] = p->F[s] = j;
        } else {
            p->P[z] = p->P[s];
            p->F[z] = p->P[s] = j;
        }
        for (uint32_t i = p->F[z]; i < p->P[z]; i++)
            p->S[p->E[i]] = z;
        k->M[s] = k->M[z] = 0;
        p->z++;
    }
}

/* The transitions (tail, label, head) between live states, numbered
 * compactly (idx), labelled by elementary intervals; NULL arrays on
 * memory failure. */
typedef struct transitions {
    uint32_t *T, *Lb, *H;
    uint32_t m, n_labels;
} transitions;

static bool make_transitions(const ml_fsm *a, const uint8_t *live, const uint32_t *idx,
                             transitions *tr)
{
    /* label[sym]: the elementary interval holding sym, from a mark at each
     * edge boundary (symbols are few: no sort needed). */
    uint32_t *label = calloc(ML_FSM_N_SYMBOLS + 1, sizeof *label);
    if (!label)
        return false;
    for (uint32_t s = 0; s < a->n_states; s++)
        for (uint32_t e = a->first[s]; live[s] && e < a->first[s + 1]; e++)
            if (live[a->edges[e].to]) {
                label[a->edges[e].lo] = 1;
                label[a->edges[e].hi + 1] = 1;
            }
    uint32_t n_labels = 0;
    for (uint32_t sym = 0; sym <= ML_FSM_N_SYMBOLS; sym++) {
        n_labels += label[sym];
        label[sym] = n_labels;
    }
    tr->n_labels = n_labels + 1;
    size_t m = 0;
    for (int pass = 0; pass < 2; pass++) {
        m = 0;
        for (uint32_t s = 0; s < a->n_states; s++)
            for (uint32_t e = a->first[s]; live[s] && e < a->first[s + 1]; e++) {
                const ml_fsm_edge *ed = &a->edges[e];
                if (!live[ed->to])
                    continue;
                uint32_t k0 = label[ed->lo], k1 = label[ed->hi];
                for (uint32_t k = k0; k <= k1; k++, m++)
                    if (pass == 1) {
                        tr->T[m] = idx[s];
                        tr->Lb[m] = k;
                        tr->H[m] = idx[ed->to];
                    }
            }
        if (pass == 0) {
            size_t sz = (m ? m : 1) * sizeof(uint32_t);
            tr->T = malloc(sz);
            tr->Lb = malloc(sz);
            tr->H = malloc(sz);
            if (!tr->T || !tr->Lb || !tr->H || m >= UINT32_MAX) {
                free(label);
                return false;
            }
        }
    }
    tr->m = (uint32_t)m;
    free(label);
    return true;
}

/* Sort the transitions into cords by label (counting sort). */
static void init_cords(rpart *C, rmarks *k, const transitions *tr)
{
    uint32_t *count = k->W; /* scratch until the refinement: n_labels + 1 <= 2m + 1 */
    memset(count, 0, ((size_t)tr->n_labels + 1) * sizeof *count);
    for (uint32_t t = 0; t < tr->m; t++)
        count[tr->Lb[t] + 1]++;
    for (uint32_t l = 0; l < tr->n_labels; l++)
        count[l + 1] += count[l];
    for (uint32_t t = 0; t < tr->m; t++) {
        uint32_t pos = count[tr->Lb[t]]++;
        C->E[pos] = t;
        C->L[t] = pos;
    }
    C->z = 0;
    for (uint32_t i = 0; i < tr->m; i++) {
        uint32_t t = C->E[i];
        if (i == 0 || tr->Lb[t] != tr->Lb[C->E[i - 1]]) {
            if (i > 0)
                C->P[C->z - 1] = i;
            C->F[C->z++] = i;
        }
        C->S[t] = C->z - 1;
    }
    if (tr->m > 0)
        C->P[C->z - 1] = tr->m;
    memset(k->W, 0, ((size_t)tr->n_labels + 1) * sizeof *k->W);
}

bool fsm_classes(ml_fsm_ctx *c, const ml_fsm *a, const uint8_t *live, uint32_t *cls)
{
    uint32_t n = a->n_states, nl = 0;
    uint32_t *idx = malloc((size_t)n * sizeof *idx);
    transitions tr = {0};
    rpart B = {0}, C = {0};
    rmarks k = {0};
    uint32_t *adj = NULL, *adj_first = NULL;
    bool ok = false;
    if (!idx)
        goto out;
    for (uint32_t s = 0; s < n; s++)
        idx[s] = live[s] ? nl++ : FSM_NONE;
    if (!make_transitions(a, live, idx, &tr))
        goto out;
    if (tr.m > (uint64_t)(c->max_states + 1) * FSM_WORDS_PER_STATE) {
        ml_fsm_ctx_fail(c, ML_ERR_TOO_LARGE,
                        "minimisation over %u transitions per state of the bound of %u",
                        FSM_WORDS_PER_STATE, c->max_states);
        goto out;
    }
    size_t marks = (size_t)(nl > tr.m ? nl : tr.m) + 2 * (size_t)tr.m + 2;
    k.M = calloc(marks, sizeof *k.M);
    k.W = calloc(marks, sizeof *k.W);
    adj = malloc(((size_t)tr.m + 1) * sizeof *adj);
    adj_first = calloc((size_t)nl + 1, sizeof *adj_first);
    if (!k.M || !k.W || !adj || !adj_first || !rpart_init(&B, nl) || !rpart_init(&C, tr.m))
        goto out;

    /* The initial partition: one block per (accept, tags). */
    uint8_t present[MIN_N_KEYS / 8] = {0};
    for (uint32_t s = 0; s < n; s++)
        if (live[s]) {
            uint32_t key = (uint32_t)a->tags[s] << 1 | a->accept[s];
            present[key >> 3] |= (uint8_t)(1u << (key & 7));
        }
    for (uint32_t key = 0; key < MIN_N_KEYS; key++) {
        if (!(present[key >> 3] & (1u << (key & 7))))
            continue;
        for (uint32_t s = 0; s < n; s++)
            if (live[s] && ((uint32_t)a->tags[s] << 1 | a->accept[s]) == key)
                rpart_mark(&B, &k, idx[s]);
        rpart_split(&B, &k);
    }

    init_cords(&C, &k, &tr);
    /* Incoming transitions of each state. */
    for (uint32_t t = 0; t < tr.m; t++)
        adj_first[tr.H[t] + 1]++;
    for (uint32_t q = 0; q < nl; q++)
        adj_first[q + 1] += adj_first[q];
    uint32_t *fill = k.W; /* scratch until the refinement: zeroed after use */
    memcpy(fill, adj_first, ((size_t)nl + 1) * sizeof *fill);
    for (uint32_t t = 0; t < tr.m; t++)
        adj[fill[tr.H[t]]++] = t;
    memset(fill, 0, ((size_t)nl + 1) * sizeof *fill);

    /* Blocks split cords, cords split blocks; block 0 is never a splitter
     * (Hopcroft's "all but one"). */
    uint32_t b = 1;
    for (uint32_t cd = 0; cd < C.z; cd++) {
        if (!fsm_tick(c))
            goto out;
        for (uint32_t i = C.F[cd]; i < C.P[cd]; i++)
            rpart_mark(&B, &k, tr.T[C.E[i]]);
        rpart_split(&B, &k);
        for (; b < B.z; b++) {
            for (uint32_t i = B.F[b]; i < B.P[b]; i++) {
                uint32_t q = B.E[i];
                for (uint32_t j = adj_first[q]; j < adj_first[q + 1]; j++)
                    rpart_mark(&C, &k, adj[j]);
            }
            rpart_split(&C, &k);
        }
    }
    for (uint32_t s = 0; s < n; s++)
        if (live[s])
            cls[s] = B.S[idx[s]];
    ok = true;
out:
    if (!ok && c->status == ML_OK)
        fsm_nomem(c);
    free(idx);
    free(tr.T);
    free(tr.Lb);
    free(tr.H);
    free(k.M);
    free(k.W);
    free(adj);
    free(adj_first);
    rpart_deinit(&B);
    rpart_deinit(&C);
    return ok;
}
