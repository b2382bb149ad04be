/* Strings under a length at most, for the mask (grammar.c): per vocabulary,
 * which tokens stay inside a string and how many characters they begin
 * (ml_grammar_vocab_mark_strings); per grammar state, whether it behaves as
 * the point between two characters of such a string and how many it may
 * still take (ml_grammar_string_budget). */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "grammar/json_mode_internal.h"

/* Most strings of a schema are plain (a name, an address, a description),
 * or plain with a maxLength: between their characters every token that
 * stays inside the string is allowed if it begins no more characters than
 * are left, so a walk would visit most of the trie for a verdict known in
 * advance. These verdicts, from between two characters of a string written
 * in lexemes.h's one form per character, are decided once per vocabulary by
 * the number of characters a token begins (canon_upto), and a state that
 * behaves exactly like that point with a budget of characters (ml_grammar_string_budget)
 * walks only the subtrees where a token leaves the string. The reference is
 * this automaton: */
enum {
    CANON_CHAR,  /* between characters */
    CANON_ESC,   /* after \ */
    CANON_U,     /* after \u: 0 */
    CANON_U0,    /* after \u0: 0 */
    CANON_U00,   /* after \u00: 0 or 1 */
    CANON_U000,  /* after \u000: a control without a short escape */
    CANON_U001,  /* after \u001: any lower-case hex digit */
    CANON_CONT1, /* UTF-8: one continuation byte to come */
    CANON_CONT2,
    CANON_CONT3,
    CANON_E0,    /* after E0: A0-BF (no overlong form) */
    CANON_ED,    /* after ED: 80-9F (no surrogate) */
    CANON_F0,    /* after F0: 90-BF (no overlong form) */
    CANON_F4,    /* after F4: 80-8F (nothing past U+10FFFF) */
    CANON_N,
    CANON_DEAD = CANON_N,
    CANON_EXIT, /* the closing quote */
};

static bool canon_cont(uint8_t b)
{
    return b >= 0x80 && b <= 0xbf;
}

static uint8_t canon_step(uint8_t c, uint8_t b)
{
    switch (c) {
    case CANON_CHAR:
        if (b == '"')
            return CANON_EXIT;
        if (b == '\\')
            return CANON_ESC;
        if (b >= 0x20 && b < 0x80)
            return CANON_CHAR;
        if (b >= 0xc2 && b <= 0xdf)
            return CANON_CONT1;
        if (b == 0xe0)
            return CANON_E0;
        if (b == 0xed)
            return CANON_ED;
        if (b >= 0xe1 && b <= 0xef)
            return CANON_CONT2;
        if (b == 0xf0)
            return CANON_F0;
        if (b == 0xf4)
            return CANON_F4;
        if (b >= 0xf1 && b <= 0xf3)
            return CANON_CONT3;
        return CANON_DEAD;
    case CANON_ESC:
        if (b == 'u')
            return CANON_U;
        return strchr("\"\\bfnrt", b) && b ? CANON_CHAR : CANON_DEAD;
    case CANON_U:
        return b == '0' ? CANON_U0 : CANON_DEAD;
    case CANON_U0:
        return b == '0' ? CANON_U00 : CANON_DEAD;
    case CANON_U00:
        return b == '0' ? CANON_U000 : b == '1' ? CANON_U001 : CANON_DEAD;
    case CANON_U000: /* \b \t \n \f \r (08, 09, 0a, 0c, 0d) have their short forms */
        return (b >= '0' && b <= '7') || b == 'b' || b == 'e' || b == 'f' ? CANON_CHAR
                                                                           : CANON_DEAD;
    case CANON_U001:
        return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') ? CANON_CHAR : CANON_DEAD;
    case CANON_CONT1:
        return canon_cont(b) ? CANON_CHAR : CANON_DEAD;
    case CANON_CONT2:
        return canon_cont(b) ? CANON_CONT1 : CANON_DEAD;
    case CANON_CONT3:
        return canon_cont(b) ? CANON_CONT2 : CANON_DEAD;
    case CANON_E0:
        return b >= 0xa0 && b <= 0xbf ? CANON_CONT1 : CANON_DEAD;
    case CANON_ED:
        return b >= 0x80 && b <= 0x9f ? CANON_CONT1 : CANON_DEAD;
    case CANON_F0:
        return b >= 0x90 && b <= 0xbf ? CANON_CONT2 : CANON_DEAD;
    case CANON_F4:
        return b >= 0x80 && b <= 0x8f ? CANON_CONT2 : CANON_DEAD;
    default:
        return CANON_DEAD;
    }
}

/* canon_step as a table, for the explorations below. */
static uint8_t canon_next[CANON_N][256];
static pthread_once_t canon_once = PTHREAD_ONCE_INIT;

static void canon_table_init(void)
{
    for (int c = 0; c < CANON_N; c++)
        for (int b = 0; b < 256; b++)
            canon_next[c][b] = canon_step((uint8_t)c, (uint8_t)b);
}

/* Per vocabulary: each token's characters begun inside a string when it
 * stays there (the cumulative masks canon_upto), and the nodes whose
 * subtree has a token leaving it. */
ml_status ml_grammar_vocab_mark_strings(ml_json_vocab *v, char *err, size_t errlen)
{
    v->pre_closes = calloc(v->pre_n ? v->pre_n : 1, 1);
    /* at[d] and begun[d]: the reference state after the path's first d
     * bytes and the characters they begin; path[d]: the node at depth d;
     * chars[id]: what the token begins (UINT16_MAX: does not stay inside). */
    uint8_t *at = malloc(v->max_len + 1);
    uint16_t *begun = malloc((v->max_len + 1) * sizeof *begun);
    uint32_t *path = malloc((v->max_len + 1) * sizeof *path);
    uint16_t *chars = malloc(v->n_vocab * sizeof *chars);
    bool ok = v->pre_closes && at && begun && path && chars;
    if (ok) {
        memset(chars, 0xff, v->n_vocab * sizeof *chars);
        at[0] = CANON_CHAR;
        begun[0] = 0;
        v->canon_max_chars = 0;
        for (uint32_t i = 0; i < v->pre_n;) {
            uint32_t d = v->pre_depth[i];
            uint8_t c = canon_step(at[d - 1], v->pre_byte[i]);
            path[d] = i;
            if (c == CANON_EXIT)
                for (uint32_t a = d; a > 0 && !v->pre_closes[path[a]]; a--)
                    v->pre_closes[path[a]] = 1;
            if (c >= CANON_N) {
                i = v->pre_skip[i];
                continue;
            }
            at[d] = c;
            begun[d] = (uint16_t)(begun[d - 1] + (at[d - 1] == CANON_CHAR));
            if (begun[d] > v->canon_max_chars && v->pre_tok[i] < v->pre_tok[i + 1])
                v->canon_max_chars = begun[d];
            for (uint32_t t = v->pre_tok[i]; t < v->pre_tok[i + 1]; t++)
                chars[v->pre_ids[t]] = begun[d];
            i++;
        }
        v->canon_upto = calloc(((size_t)v->canon_max_chars + 1) * v->n_words,
                               sizeof *v->canon_upto);
        ok = v->canon_upto != NULL;
    }
    if (ok) {
        for (size_t id = 0; id < v->n_vocab; id++)
            if (chars[id] != UINT16_MAX)
                v->canon_upto[chars[id] * v->n_words + (id >> 6)] |= 1ull << (id & 63u);
        for (size_t c = 1; c <= v->canon_max_chars; c++)
            for (size_t w = 0; w < v->n_words; w++)
                v->canon_upto[c * v->n_words + w] |= v->canon_upto[(c - 1) * v->n_words + w];
    }
    free(at);
    free(begun);
    free(path);
    free(chars);
    return ok ? ML_OK : ml_fail(err, errlen, ML_ERR_NOMEM, "grammar: out of memory for the trie");
}

/* Pairs one exploration may visit: a string with a maxLength of 1024 (the
 * most schema.c enforces) pairs each of its 1025 positions with the
 * reference's 14 states; a key among a few hundred names pairs each prefix
 * of theirs likewise. Past it, the string's states are walked in full. */
#define BUDGET_MAX_PAIRS 32768u
#define BUDGET_SLOTS (2u * BUDGET_MAX_PAIRS)

typedef struct budget_pair {
    uint32_t q;     /* grammar state */
    uint8_t c;      /* reference state */
    uint16_t layer; /* characters begun since the start */
} budget_pair;

typedef struct budget_scan {
    const ml_grammar *g;
    uint16_t need; /* the largest need met */
    uint64_t *seen;       /* (BUDGET_SLOTS): q * CANON_N + c + 1, 0 for an empty slot */
    uint16_t *seen_layer; /* (BUDGET_SLOTS) */
    budget_pair *queue;   /* (BUDGET_MAX_PAIRS) */
    uint32_t n;
    bool merged; /* a pair was reached at two layers: a cycle or paths of different lengths */
    bool closed; /* some state between characters takes no character */
    uint16_t closed_layer;
} budget_scan;

static bool budget_push(budget_scan *b, uint32_t q, uint8_t c, uint16_t layer)
{
    uint64_t key = (uint64_t)q * CANON_N + c + 1;
    uint32_t i = ml_grammar_hash(key) % BUDGET_SLOTS;
    while (b->seen[i] && b->seen[i] != key)
        i = (i + 1) % BUDGET_SLOTS;
    if (b->seen[i]) {
        b->merged |= b->seen_layer[i] != layer;
        return true;
    }
    if (b->n == BUDGET_MAX_PAIRS || layer == UINT16_MAX)
        return false;
    b->seen[i] = key;
    b->seen_layer[i] = layer;
    b->queue[b->n++] = (budget_pair){.q = q, .c = c, .layer = layer};
    return true;
}

/* Explore one pair: every byte the reference takes inside the string must
 * take the grammar to a state inside it, every byte it
 * refuses must be refused; between characters, a state may instead take no
 * character at all (closed: the budget is spent). Closing quotes are left
 * to the walk. */
static bool budget_visit(budget_scan *b, budget_pair p)
{
    const ml_grammar *g = b->g;
    if (!(g->flags[p.q] & ML_GRAMMAR_IN_STRING) || (g->flags[p.q] & ML_GRAMMAR_ACCEPT))
        return false;
    if (g->need[p.q] > b->need)
        b->need = g->need[p.q];
    const uint32_t *row = g->next + (size_t)p.q * g->n_classes;
    bool takes = false, refuses = false;
    const uint8_t *canon = canon_next[p.c];
    for (int byte = 0; byte < 256; byte++) {
        uint32_t e = row[g->byte_class[byte]];
        uint8_t to = canon[byte];
        if (to == CANON_EXIT) {
            if (e != ML_GRAMMAR_DEAD && (e & ML_GRAMMAR_CALL))
                return false;
            continue;
        }
        if (to == CANON_DEAD || e == ML_GRAMMAR_DEAD) {
            refuses |= to != CANON_DEAD;
            if (e != ML_GRAMMAR_DEAD)
                return false;
            continue;
        }
        if (e & ML_GRAMMAR_CALL)
            return false;
        takes = true;
    }
    if (refuses) {
        if (takes || p.c != CANON_CHAR)
            return false;
        if (b->closed && b->closed_layer != p.layer)
            b->merged = true;
        b->closed = true;
        b->closed_layer = p.layer;
        return true;
    }
    uint16_t layer = (uint16_t)(p.layer + (p.c == CANON_CHAR));
    uint32_t last_e = ML_GRAMMAR_DEAD;
    uint8_t last_to = CANON_DEAD;
    for (int byte = 0; byte < 256; byte++) {
        uint8_t to = canon[byte];
        uint32_t e = row[g->byte_class[byte]];
        if (to >= CANON_N || (e == last_e && to == last_to)) /* runs of bytes share a pair */
            continue;
        if (!budget_push(b, e, to, layer))
            return false;
        last_e = e;
        last_to = to;
    }
    return true;
}

uint32_t ml_grammar_string_budget(const ml_grammar *g, uint32_t s, uint32_t *memo)
{
    pthread_once(&canon_once, canon_table_init);
    budget_scan b = {.g = g};
    b.seen = calloc(BUDGET_SLOTS, sizeof *b.seen);
    b.seen_layer = malloc(BUDGET_SLOTS * sizeof *b.seen_layer);
    b.queue = malloc(BUDGET_MAX_PAIRS * sizeof *b.queue);
    bool ok = b.seen && b.seen_layer && b.queue && budget_push(&b, s, CANON_CHAR, 0);
    for (uint32_t head = 0; ok && head < b.n; head++)
        ok = budget_visit(&b, b.queue[head]);
    /* Bounded only when every path spends the budget at the same count. */
    ok = ok && !(b.closed && b.merged);
    uint32_t need = (uint32_t)b.need << GRAMMAR_BUDGET_NEED_SHIFT;
    uint32_t budget = !ok       ? GRAMMAR_BUDGET_NONE
                      : b.closed ? need | (GRAMMAR_BUDGET_0 + b.closed_layer)
                                 : need | GRAMMAR_BUDGET_UNBOUNDED;
    for (uint32_t i = 0; ok && i < b.n; i++) {
        budget_pair p = b.queue[i];
        if (p.c == CANON_CHAR && memo[p.q] == GRAMMAR_BUDGET_UNKNOWN)
            memo[p.q] = b.closed ? need | (GRAMMAR_BUDGET_0 + b.closed_layer - p.layer)
                                 : need | GRAMMAR_BUDGET_UNBOUNDED;
    }
    free(b.seen);
    free(b.seen_layer);
    free(b.queue);
    return budget;
}
