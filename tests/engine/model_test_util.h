/* Helpers shared by the engine/model tests: a scratch directory removed at
 * exit, raw file writing, and hand-built safetensors images for the
 * corrupt-input cases. Header-only, test code only. */
#ifndef ML_TEST_MODEL_UTIL_H
#define ML_TEST_MODEL_UTIL_H

/* nftw's FTW_DEPTH/FTW_PHYS; include this header first. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char ml_scratch_root[256];

static inline int ml_scratch_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void ml_scratch_cleanup(void)
{
    if (ml_scratch_root[0])
        nftw(ml_scratch_root, ml_scratch_rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under $TMPDIR (or /tmp), removed with its contents at
 * exit. Exits the test on failure. */
static inline const char *ml_scratch_dir(void)
{
    if (!ml_scratch_root[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(ml_scratch_root, sizeof ml_scratch_root, "%s/ml_model_test_XXXXXX",
                 base && base[0] ? base : "/tmp");
        if (!mkdtemp(ml_scratch_root)) {
            perror("mkdtemp");
            exit(2);
        }
        atexit(ml_scratch_cleanup);
    }
    return ml_scratch_root;
}

/* A new empty subdirectory of the scratch directory; path in buf. */
static inline const char *ml_scratch_subdir(const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", ml_scratch_dir(), name);
    if (mkdir(buf, 0755) != 0) {
        perror(buf);
        exit(2);
    }
    return buf;
}

static inline void ml_write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static inline void ml_write_text(const char *path, const char *text)
{
    ml_write_bytes(path, text, strlen(text));
}

/* A safetensors image: the 8-byte length (header_len, or the real length of
 * json when header_len is UINT64_MAX), json, then data_len zero bytes.
 * malloc'd; size in *size. */
static inline unsigned char *ml_st_image(const char *json, uint64_t header_len,
                                         size_t data_len, size_t *size)
{
    size_t j = strlen(json);
    uint64_t h = header_len == UINT64_MAX ? j : header_len;
    *size = 8 + j + data_len;
    unsigned char *buf = calloc(1, *size);
    if (!buf)
        exit(2);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(h >> (8 * i));
    memcpy(buf + 8, json, j);
    return buf;
}

#endif
