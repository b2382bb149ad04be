#include "cli/cli_util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"

/* .npy 1.0: 6-byte magic, 2 version bytes, 2-byte header length, then the
 * header dict padded with spaces and '\n' to a multiple of 64 bytes. */
#define NPY_PREAMBLE 10
#define NPY_ALIGN 64
#define NPY_MAX_DIMS 4

char *svc_read_file(const char *cmd, const char *path, size_t max_bytes, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max_bytes) {
        fprintf(stderr, "%s: %s: not a regular file of at most %zu bytes\n", cmd, path,
                max_bytes);
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "%s: %s: read failed\n", cmd, path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

int svc_write_npy_f32(const char *cmd, const char *path, const float *data, int ndim,
                      const size_t *shape)
{
    if (ndim < 1 || ndim > NPY_MAX_DIMS) {
        fprintf(stderr, "%s: %s: %d dimensions\n", cmd, path, ndim);
        return -1;
    }
    char dims[128] = "";
    size_t used = 0, count = 1;
    for (int i = 0; i < ndim; i++) {
        used += (size_t)snprintf(dims + used, sizeof dims - used, "%zu,%s", shape[i],
                                 i + 1 < ndim ? " " : "");
        count *= shape[i];
    }
    char dict[256];
    int dict_len = snprintf(dict, sizeof dict,
                            "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    size_t total = NPY_PREAMBLE + (size_t)dict_len + 1;
    size_t padded = (total + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    size_t header_len = padded - NPY_PREAMBLE;
    char header[NPY_PREAMBLE + sizeof dict + NPY_ALIGN];
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    header[8] = (char)(header_len & 0xff);
    header[9] = (char)(header_len >> 8);
    memcpy(header + NPY_PREAMBLE, dict, (size_t)dict_len);
    memset(header + NPY_PREAMBLE + dict_len, ' ', padded - total);
    header[padded - 1] = '\n';

    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", cmd, path, strerror(errno));
        return -1;
    }
    /* The host is little-endian (x86-64, aarch64), as '<f4' requires. */
    int ok = fwrite(header, 1, padded, f) == padded &&
             fwrite(data, sizeof(float), count, f) == count;
    ok &= fclose(f) == 0;
    if (!ok)
        fprintf(stderr, "%s: %s: write failed\n", cmd, path);
    return ok ? 0 : -1;
}

int svc_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s: expected an integer in [%ld, %ld], got '%s'\n", cmd, opt, lo, hi,
                s);
        return -1;
    }
    *out = v;
    return 0;
}

int svc_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
                     double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "%s: %s: expected a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

void svc_put_json_string(FILE *out, const char *s, size_t n)
{
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

bool svc_cli_config_option(svc_cli_config_args *a, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc)
        return false;
    if (!strcmp(argv[*i], "--config"))
        a->config = argv[++*i];
    else if (!strcmp(argv[*i], "--set") && a->n_overrides < SVC_CLI_MAX_OVERRIDES)
        a->overrides[a->n_overrides++] = argv[++*i];
    else
        return false;
    return true;
}

int svc_cli_load_config(const svc_cli_config_args *a, svc_config *cfg)
{
    signal(SIGPIPE, SIG_IGN);
    char err[1024];
    if (svc_config_load(cfg, a->config, a->overrides, a->n_overrides, err, sizeof err)) {
        svc_log(SVC_LOG_ERROR, "config", "%s", err);
        svc_config_deinit(cfg);
        return -1;
    }
    svc_log_set_level(cfg->log.threshold);
    return 0;
}
