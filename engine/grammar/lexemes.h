/* The scalar lexemes of a JSON Schema grammar as byte automata (fsm.h):
 * strings under length, pattern and format constraints, integers and numbers
 * under bounds and multipleOf. Each function returns the automaton of the
 * whole JSON text of one value (a string with its quotes, a number), every
 * state between the quotes tagged ML_FSM_TAG_IN_STRING, or NULL with the
 * error latched in the context (ml_fsm_ctx_fail): ML_ERR_UNSUPPORTED for a
 * constraint that cannot be enforced exactly (the message names it),
 * ML_ERR_INVALID_ARG for a malformed one, ML_ERR_TOO_LARGE past a bound.
 *
 * The contract: an accepted text is always valid under the constraint as a
 * validator that decodes the JSON and checks the value (Python's jsonschema,
 * with Python's floats for non-integers) would judge it. Where exactness
 * would cost too much, the automaton may refuse some valid texts (it is
 * narrower, never wider), and the header of lexemes.c lists each such place.
 *
 * Strings. A string value is written with one form per character: the
 * character's UTF-8 bytes, except `"` and `\` (written \" and \\) and the
 * controls below U+0020 (\b \f \n \r \t, else \u00XX with lower-case hex):
 * what json.dumps(ensure_ascii=False) writes. Lengths count code points, as
 * JSON Schema does.
 *
 * @locality: as fsm.h (the context's thread). */
#ifndef ML_GRAMMAR_LEXEMES_H
#define ML_GRAMMAR_LEXEMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/fsm.h"

/* Constraints of a string value. pattern (ECMA-262, regex.h) and format are
 * borrowed, NULL when absent; max_length ML_FSM_UNBOUNDED when absent. */
typedef struct ml_lex_string {
    uint32_t min_length, max_length;
    const char *pattern;
    size_t pattern_len;
    const char *format; /* NUL-terminated */
} ml_lex_string;

/* The formats ml_lex_json_string knows, NULL-terminated, for documentation
 * and error messages. */
extern const char *const ml_lex_formats[];

/* True when validators ignore the format: it is none of those JSON Schema
 * defines (a vendor's "byte", "url", "path"...), so it constrains nothing. */
bool ml_lex_format_ignored(const char *name);

/* True when ml_lex_json_string takes the format (built or ignored); else
 * latches its error (ML_ERR_UNSUPPORTED, naming it) in c, for a caller
 * that refuses before building anything. */
bool ml_lex_format_check(ml_fsm_ctx *c, const char *name);

/* `"` content `"` under s. Errors: a format JSON Schema defines that
 * lexemes.c does not build (ML_ERR_UNSUPPORTED, naming it; an ignored one,
 * ml_lex_format_ignored, constrains nothing), a pattern regex.h refuses (its
 * message), min over max (the empty language, not an error: the caller
 * decides). */
ml_fsm *ml_lex_json_string(ml_fsm_ctx *c, const ml_lex_string *s);

/* The content of a string (no quotes, tagged) whose value equals the given
 * UTF-8 text (n bytes), in the one form above; for const, enum and property
 * names. ML_ERR_INVALID_ARG for invalid UTF-8. */
ml_fsm *ml_lex_json_string_content_of(ml_fsm_ctx *c, const char *utf8, size_t n);

/* One character among the n code point ranges (any order, may overlap;
 * the surrogates never match) in the one form above: the content of a
 * string, untagged (the caller tags the content it builds). For regex.c
 * and the string lexemes. */
ml_fsm *ml_lex_json_char(ml_fsm_ctx *c, const uint32_t (*ranges)[2], size_t n);

/* A bound of a number: absent, inclusive or exclusive, at value (a JSON
 * number as the schema's parser read it: a double). */
typedef struct ml_lex_bound {
    bool present, exclusive;
    double value;
} ml_lex_bound;

/* An integer literal -?(0|[1-9][0-9]*) within the bounds and, when
 * multiple_of is nonzero, a multiple of it (an integer > 0; a non-integer
 * multipleOf on an integer is the caller's to refuse). Bounds beyond +-2^63
 * are refused (ML_ERR_UNSUPPORTED). */
ml_fsm *ml_lex_json_integer(ml_fsm_ctx *c, ml_lex_bound lo, ml_lex_bound hi,
                            uint64_t multiple_of);

/* A number literal -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? within the
 * bounds (Python float comparison). */
ml_fsm *ml_lex_json_number(ml_fsm_ctx *c, ml_lex_bound lo, ml_lex_bound hi);

#endif
