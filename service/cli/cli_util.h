/* Small helpers shared by the CLI subcommands: whole-file reads, .npy output,
 * strict number parsing, JSON string output and spans, the configuration
 * options of the service commands. Errors are printed to stderr prefixed
 * with the command name. @locality: the main thread. */
#ifndef SVC_CLI_UTIL_H
#define SVC_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

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

/* The options every service command (worker, gateway) takes: --config FILE
 * (NULL: the embedded defaults) and --set section.key=value, repeatable. */
#define SVC_CLI_MAX_OVERRIDES 64
typedef struct svc_cli_config_args {
    const char *config;                              /* borrowed from argv */
    const char *overrides[SVC_CLI_MAX_OVERRIDES];    /* borrowed from argv */
    size_t n_overrides;
} svc_cli_config_args;

/* When argv[*i] is --config or --set and argv[*i + 1] exists (and an
 * override fits), take both, advance *i past the value and return true;
 * otherwise false, nothing taken. */
bool svc_cli_config_option(svc_cli_config_args *a, int argc, char **argv, int *i);

/* Load the configuration a names into cfg, for a long-running service:
 * SIGPIPE is ignored from here on (librdkafka, hiredis and the gateway
 * write to sockets, and a closed peer must be an error return, not a
 * signal). Returns 0, or -1 with the error logged (event "config") and
 * cfg deinitialised. */
int svc_cli_load_config(const svc_cli_config_args *a, svc_config *cfg);

#endif
