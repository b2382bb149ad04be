/* A JSON Schema validator for tests, written from the specification and
 * independently of the grammar compiler (engine/grammar/schema*.c, regex.c,
 * lexemes.c): the oracle that the documents the engine generates under a
 * schema are checked against (issue 22: a grammar is not its own proof).
 *
 * What it implements: draft 2020-12 with the draft-4/7 forms real schemas
 * use, judged as Python's `jsonschema` (with its FormatChecker) judges them:
 * - type (a type or an array of types; "integer" is a number with a zero
 *   fractional part, 1.0 included), enum and const (JSON equality: 1 == 1.0,
 *   true != 1, objects member by member);
 * - properties, patternProperties, additionalProperties, required,
 *   propertyNames, minProperties, maxProperties, dependentRequired,
 *   dependentSchemas, dependencies;
 * - items (a schema, or the draft-4 array form with additionalItems),
 *   prefixItems, contains / minContains / maxContains, minItems, maxItems,
 *   uniqueItems;
 * - allOf, anyOf, oneOf, not, if / then / else;
 * - $ref to the document ("#", "#/json/pointer", percent-decoded), $defs and
 *   definitions, recursive; siblings of $ref apply (2020-12);
 * - minLength / maxLength (code points), pattern (an ECMA-262 search, the
 *   subset below), format (date, time, date-time, duration, email, hostname,
 *   ipv4, ipv6, uri, uuid; others are annotations, as for jsonschema);
 * - minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or the
 *   draft-4 booleans that make minimum / maximum exclusive), multipleOf
 *   (instance / divisor has no fractional part, in doubles as Python's);
 * - boolean schemas; annotations and unknown keywords are ignored.
 * Objects with a duplicate key count the last member, as json.loads does.
 * Refused with a message (never silently passed): unevaluatedProperties,
 * unevaluatedItems, $dynamicRef, $recursiveRef, a $ref that is not a local
 * JSON Pointer, and a pattern outside the regex subset.
 *
 * Regex subset: literals, `.`, classes ([a-z], [^...], escapes inside),
 * \d \w \s \D \W \S \b \B, \t \n \r \f \v \0 \xHH \uHHHH \cX and identity
 * escapes, groups ((...), (?:...), (?<name>...)), lookahead ((?=...),
 * (?!...)), alternation, quantifiers (* + ? {n} {n,} {n,m}, each optionally
 * lazy), anchors ^ $ (no multiline). A backtracking matcher over code points
 * with a step budget; no back-references, no lookbehind, no flags.
 *
 * Thread: the functions hold no state between calls. Test code only. */
#ifndef ML_TEST_SCHEMA_ORACLE_H
#define ML_TEST_SCHEMA_ORACLE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

/* true when instance validates against schema (both borrowed; schema is also
 * the root that "#..." references resolve against). On false, why (n bytes,
 * may be NULL when n is 0) says the first keyword that failed and the
 * instance's JSON Pointer, or what the oracle cannot judge ("oracle: ..."):
 * a schema the oracle refuses is never reported valid. */
bool schema_oracle_valid(const cJSON *schema, const cJSON *instance, char *why, size_t n);

/* true when the UTF-8 string s matches the ECMA-262 pattern anywhere (a
 * search, as the `pattern` keyword). On false, why says "no match" or why the
 * pattern cannot be judged (outside the subset, over the step budget). */
bool schema_oracle_pattern(const char *pattern, const char *s, char *why, size_t n);

/* true when the string s is valid for format as jsonschema's FormatChecker
 * judges it; unknown formats are true. */
bool schema_oracle_format(const char *format, const char *s);

#endif
