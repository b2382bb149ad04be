/* ECMA-262 regular expressions, as JSON Schema's `pattern` and
 * `patternProperties` use them, compiled to byte automata over the content
 * of a JSON string (fsm.h, lexemes.h's one form per character).
 *
 * Semantics: JSON Schema patterns are not anchored: a string matches when the
 * expression matches some substring of its value (a search), unless `^` and
 * `$` anchor it. The automaton accepts exactly the contents whose decoded
 * value the search would match, each character in lexemes.h's one form.
 *
 * The subset: literals and escapes (\t \n \r \f \v \0 \xHH \uHHHH \u{...}
 * \cX, escaped syntax characters), `.` (any character but line terminators),
 * classes [...] with ranges and negation, \d \D \w \W \s \S (ECMA's
 * definitions: \s includes the Unicode spaces), groups (...), (?:...) and
 * named groups, alternation, the quantifiers * + ? {n} {n,} {n,m} and their
 * lazy forms (the same language), `^` and `$` at the start and end of the
 * expression or of a top-level alternative. Refused with ML_ERR_UNSUPPORTED
 * and the construct's offset in the message: backreferences, lookahead and
 * lookbehind, \b and \B, anchors elsewhere, Unicode property escapes
 * (\p{...}), flags. A repeat bound over ML_REGEX_MAX_REPEAT is refused
 * (ML_ERR_TOO_LARGE).
 *
 * @locality: as fsm.h. */
#ifndef ML_GRAMMAR_REGEX_H
#define ML_GRAMMAR_REGEX_H

#include <stddef.h>

#include "grammar/fsm.h"

/* Largest {n,m} bound. */
#define ML_REGEX_MAX_REPEAT 1000u

/* The string contents (no quotes; states tagged ML_FSM_TAG_IN_STRING) whose
 * value pattern (len bytes of UTF-8) matches as a search. NULL on error,
 * latched in the context with a message naming the construct and its byte
 * offset in the pattern. */
ml_fsm *ml_regex_compile(ml_fsm_ctx *c, const char *pattern, size_t len);

#endif
