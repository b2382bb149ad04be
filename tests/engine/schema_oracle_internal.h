/* What the schema oracle's files share (schema_oracle.c, _regex.c,
 * _format.c). Test code only. */
#ifndef ML_TEST_SCHEMA_ORACLE_INTERNAL_H
#define ML_TEST_SCHEMA_ORACLE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* The code point at *s, advancing *s past it; an invalid byte decodes as
 * itself. */
uint32_t oracle_utf8_next(const char **s);

/* Code points of the NUL-terminated s. */
size_t oracle_utf8_count(const char *s);

/* The value of a hex digit, -1 for any other code point. */
int oracle_hex_value(uint32_t c);

/* Searches subject for pattern: 1 a match, 0 none ("no match ..." in why),
 * -1 the pattern cannot be judged (why starts with "oracle: "). */
int oracle_pattern_search(const char *pattern, const char *subject, char *why, size_t n);

#endif
