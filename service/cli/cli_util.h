/* Small helpers shared by the CLI subcommands: whole-file reads, .npy output,
 * strict number parsing, JSON string output and spans. Errors are printed to stderr prefixed with the
 * command name. @locality: the main thread. */
#ifndef SVC_CLI_UTIL_H
#define SVC_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The whole file at path, NUL-terminated (the NUL is not counted in *len),
 * at most max_bytes. Owned by the caller (free). NULL on error, printed. */
char *svc_read_file(const char *cmd, const char *path, size_t max_bytes, size_t *len);

/* Write a C-order little-endian float32 .npy (format 1.0) of ndim <= 4 dims.
 * Returns 0, or -1 with the error printed. */
int svc_write_npy_f32(const char *cmd, const char *path, const float *data, int ndim,
                      const size_t *shape);

/* Strict decimal parsing of a whole option value within [lo, hi]. Returns 0,
 * or -1 with "<cmd>: <opt>: ..." printed. */
int svc_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
int svc_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
                     double *out);

/* Write s[0..n) to out as a JSON string, quotes included: quote, backslash
 * and control bytes escaped, every other byte (UTF-8) as is. */
void svc_put_json_string(FILE *out, const char *s, size_t n);

/* The text of member key's value in the JSON object text[0..len) as it is
 * written there (*start into text, *n bytes), e.g. to hand a JSON Schema to
 * its compiler with its numbers as written rather than as cJSON's doubles.
 * cJSON parses each member name and value; this only steps over the
 * whitespace and punctuation between them, up to the member found. Returns
 * false (*start and *n unchanged) when text does not begin as such an
 * object or has no such member; any bytes are safe. */
bool svc_json_member_span(const char *text, size_t len, const char *key, const char **start,
                          size_t *n);

#endif
