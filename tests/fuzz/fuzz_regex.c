/* Fuzz target: ECMA-262 patterns (engine/grammar/regex.h) from hostile
 * bytes. The whole input is the pattern, compiled under a state bound of
 * FUZZ_MAX_STATES and a deadline. Properties, checked with abort():
 *   - a refusal latches a status and a message naming a byte offset (or a
 *     bound), and every later operation returns NULL;
 *   - an automaton has at most the bound's states, sorted disjoint byte
 *     edges to existing states, every state tagged in-string, a trimmed
 *     start (empty language: one state, no edges);
 *   - its intersection with string contents of at most 4 characters and
 *     its difference with itself behave (the latter is empty).
 * Leaks are the sanitizer's to find. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "grammar/lexemes.h"
#include "grammar/regex.h"

#define FUZZ_MAX_STATES 20000u
#define FUZZ_DEADLINE_MS 2000.0
#define FUZZ_SHORT_CHARS 4u

static void require(bool ok)
{
    if (!ok)
        abort();
}

static void check_automaton(const ml_fsm *a)
{
    uint32_t n = ml_fsm_n_states(a);
    require(n >= 1 && n <= FUZZ_MAX_STATES);
    for (uint32_t s = 0; s < n; s++) {
        const ml_fsm_edge *e;
        size_t ne = ml_fsm_edges(a, s, &e);
        require(ml_fsm_tags(a, s) == ML_FSM_TAG_IN_STRING);
        for (size_t i = 0; i < ne; i++) {
            require(e[i].lo <= e[i].hi && e[i].hi < ML_FSM_N_BYTES && e[i].to < n);
            require(i == 0 || e[i - 1].hi < e[i].lo);
        }
    }
    const ml_fsm_edge *e;
    if (ml_fsm_is_empty(a))
        require(n == 1 && ml_fsm_edges(a, 0, &e) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(FUZZ_MAX_STATES, ml_clock_ms() + FUZZ_DEADLINE_MS);
    require(c != NULL);
    ml_fsm *a = ml_regex_compile(c, (const char *)data, size);
    if (!a) {
        require(ml_fsm_ctx_status(c) != ML_OK && ml_fsm_ctx_error(c)[0] != 0);
        require(strstr(ml_fsm_ctx_error(c), "at byte") || strstr(ml_fsm_ctx_error(c), "bound") ||
                strstr(ml_fsm_ctx_error(c), "deadline") || strstr(ml_fsm_ctx_error(c), "memory"));
        require(ml_fsm_epsilon(c) == NULL);
        ml_fsm_ctx_destroy(c);
        return 0;
    }
    check_automaton(a);
    static const uint32_t all[][2] = {{0, 0x10FFFF}};
    ml_fsm *shorts =
        ml_fsm_tag(c, ml_fsm_repeat(c, ml_lex_json_char(c, all, 1), 0, FUZZ_SHORT_CHARS),
                   ML_FSM_TAG_IN_STRING);
    ml_fsm *both = ml_fsm_intersect(c, ml_fsm_copy(c, a), shorts);
    if (both)
        check_automaton(both);
    ml_fsm *b = ml_fsm_copy(c, a);
    ml_fsm *none = ml_fsm_minus(c, a, b);
    require(!none || ml_fsm_is_empty(none));
    ml_fsm_free(both);
    ml_fsm_free(none);
    ml_fsm_ctx_destroy(c);
    return 0;
}
