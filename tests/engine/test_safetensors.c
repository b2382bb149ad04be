/* engine/checkpoint/safetensors.h: writer -> reader round trips, every
 * corrupt-file error path, checkpoint directories (single, sharded, both key
 * layouts) and their error paths. */
#include "model_test_util.h"

#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "checkpoint/safetensors.h"

#define ERRLEN 512

static int contains(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

/* ---- round trip -------------------------------------------------------- */

static const uint16_t bf16_vals[6] = {0x3f80, 0xbf80, 0x4000,
                                      0x0000, 0x7f80, 0x3f00};        /* 1 -1 2 0 inf .5 */
static const uint16_t f16_vals[4] = {0x3c00, 0xc000, 0x3800, 0x0001}; /* 1 -2 .5 2^-24 */
static const float f32_vals[4] = {1.5f, -2.25f, 3.0e-5f, 65504.0f};
static const int64_t i64_vals[3] = {128000, -1, INT64_MAX};
static const int32_t i32_vals[2] = {-7, 2147483647};
static const uint8_t u8_vals[5] = {0, 1, 127, 128, 255};
static const uint8_t f8_vals[4] = {0x38, 0xfe, 0x01, 0x7f}; /* 1 -448 2^-9 NaN */
static const float scalar_val = 42.0f;

static void fill_inputs(ml_tensor_view *t)
{
    t[0] = (ml_tensor_view){"u8", ML_DTYPE_U8, 1, {5}, u8_vals, sizeof u8_vals};
    t[1] = (ml_tensor_view){"a.bf16", ML_DTYPE_BF16, 2, {2, 3}, bf16_vals, sizeof bf16_vals};
    t[2] = (ml_tensor_view){"b.f16", ML_DTYPE_F16, 1, {4}, f16_vals, sizeof f16_vals};
    t[3] = (ml_tensor_view){"c.f32", ML_DTYPE_F32, 2, {2, 2}, f32_vals, sizeof f32_vals};
    t[4] = (ml_tensor_view){"d.i64", ML_DTYPE_I64, 1, {3}, i64_vals, sizeof i64_vals};
    t[5] = (ml_tensor_view){"e.i32", ML_DTYPE_I32, 1, {2}, i32_vals, sizeof i32_vals};
    t[6] = (ml_tensor_view){"scalar", ML_DTYPE_F32, 0, {0}, &scalar_val, sizeof scalar_val};
    t[7] = (ml_tensor_view){"empty", ML_DTYPE_F32, 2, {0, 4}, NULL, 0};
    t[8] = (ml_tensor_view){"g.f8", ML_DTYPE_F8_E4M3, 2, {2, 2}, f8_vals, sizeof f8_vals};
}
#define N_INPUTS 9

static void check_round_trip(const ml_safetensors *st, const ml_tensor_view *in, size_t n)
{
    char err[ERRLEN];
    check(ml_safetensors_count(st) == n, "count %zu", ml_safetensors_count(st));
    for (size_t i = 1; i < ml_safetensors_count(st); i++)
        check(strcmp(ml_safetensors_tensor(st, i - 1)->name, ml_safetensors_tensor(st, i)->name) <
                  0,
              "tensors sorted by name");
    for (size_t i = 0; i < n; i++) {
        const ml_tensor_view *t = ml_safetensors_find(st, in[i].name);
        check(t != NULL, "find %s", in[i].name);
        if (!t)
            continue;
        check(t->dtype == in[i].dtype && t->ndim == in[i].ndim, "%s: dtype/ndim", in[i].name);
        for (int d = 0; d < in[i].ndim; d++)
            check(t->shape[d] == in[i].shape[d], "%s: shape[%d]", in[i].name, d);
        size_t esize = ml_dtype_size(t->dtype);
        check(t->nbytes == (size_t)ml_tensor_view_numel(t) * esize, "%s: nbytes", in[i].name);
        check((uintptr_t)t->data % esize == 0, "%s: aligned to its element size", in[i].name);
        if (in[i].data)
            check(!memcmp(t->data, in[i].data, t->nbytes), "%s: bytes round-trip", in[i].name);
    }
    check(ml_safetensors_find(st, "missing") == NULL, "find of an absent name");

    float f[6];
    check(ml_tensor_view_read_f32(ml_safetensors_find(st, "a.bf16"), f, err, ERRLEN) == ML_OK,
          "read bf16");
    check(f[0] == 1.0f && f[1] == -1.0f && f[2] == 2.0f && f[5] == 0.5f, "bf16 values");
    check(ml_tensor_view_read_f32(ml_safetensors_find(st, "b.f16"), f, err, ERRLEN) == ML_OK,
          "read f16");
    check(f[0] == 1.0f && f[1] == -2.0f && f[2] == 0.5f && f[3] == 0x1p-24f, "f16 values");
    check(ml_tensor_view_read_f32(ml_safetensors_find(st, "g.f8"), f, err, ERRLEN) == ML_OK,
          "read f8_e4m3");
    check(f[0] == 1.0f && f[1] == -448.0f && f[2] == 0x1p-9f && f[3] != f[3], "f8_e4m3 values");
    int64_t v[5];
    check(ml_tensor_view_read_i64(ml_safetensors_find(st, "e.i32"), v, err, ERRLEN) == ML_OK &&
              v[0] == -7 && v[1] == 2147483647,
          "read i32 as i64");
    check(ml_tensor_view_read_i64(ml_safetensors_find(st, "u8"), v, err, ERRLEN) == ML_OK &&
              v[3] == 128 && v[4] == 255,
          "read u8 as i64");
    check(ml_tensor_view_read_i64(ml_safetensors_find(st, "c.f32"), v, err, ERRLEN) ==
                  ML_ERR_INVALID_ARG &&
              contains(err, "c.f32"),
          "read_i64 of a float tensor: %s", err);
    check(ml_tensor_view_read_f32(ml_safetensors_find(st, "d.i64"), f, err, ERRLEN) ==
              ML_ERR_INVALID_ARG,
          "read_f32 of an integer tensor");
}

static void test_round_trip(void)
{
    char path[512], err[ERRLEN];
    ml_tensor_view in[N_INPUTS];
    fill_inputs(in);
    snprintf(path, sizeof path, "%s/rt.safetensors", ml_scratch_dir());
    ml_status rc = ml_safetensors_write(path, in, N_INPUTS, err, ERRLEN);
    check(rc == ML_OK, "write: %s", err);

    ml_safetensors *st = NULL;
    rc = ml_safetensors_open(&st, path, err, ERRLEN);
    check(rc == ML_OK, "open: %s", err);
    if (st) {
        check(!strcmp(ml_safetensors_label(st), path), "label is the path");
        check_round_trip(st, in, N_INPUTS);
    }
    ml_safetensors_destroy(st);
    ml_safetensors_destroy(NULL);

    /* The same bytes through the in-memory parser; the header is padded to
     * 8 bytes with spaces, as the reference writer does. */
    FILE *f = fopen(path, "rb");
    static unsigned char buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    check(hlen % 8 == 0 && buf[8] == '{' && buf[8 + hlen - 1] != '\0', "header padded to 8");
    rc = ml_safetensors_parse(&st, buf, n, "mem", err, ERRLEN);
    check(rc == ML_OK, "parse: %s", err);
    if (st)
        check_round_trip(st, in, N_INPUTS);
    ml_safetensors_destroy(st);
}

static void test_writer_errors(void)
{
    char path[512], err[ERRLEN];
    snprintf(path, sizeof path, "%s/bad.safetensors", ml_scratch_dir());
    float x[2] = {1, 2};
    ml_tensor_view dup[2] = {{"w", ML_DTYPE_F32, 1, {2}, x, sizeof x},
                             {"w", ML_DTYPE_F32, 1, {2}, x, sizeof x}};
    check(ml_safetensors_write(path, dup, 2, err, ERRLEN) == ML_ERR_INVALID_ARG &&
              contains(err, "'w' given twice"),
          "duplicate name: %s", err);
    ml_tensor_view meta = {"__metadata__", ML_DTYPE_F32, 1, {2}, x, sizeof x};
    check(ml_safetensors_write(path, &meta, 1, err, ERRLEN) == ML_ERR_INVALID_ARG,
          "__metadata__ as a name");
    ml_tensor_view size = {"s", ML_DTYPE_F32, 1, {3}, x, sizeof x};
    check(ml_safetensors_write(path, &size, 1, err, ERRLEN) == ML_ERR_INVALID_ARG &&
              contains(err, "'s'"),
          "nbytes mismatch: %s", err);
    ml_tensor_view neg = {"n", ML_DTYPE_F32, 1, {-2}, NULL, 0};
    check(ml_safetensors_write(path, &neg, 1, err, ERRLEN) == ML_ERR_INVALID_ARG, "negative dim");
    check(access(path, F_OK) != 0, "nothing left behind by failed writes");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    check(access(tmp, F_OK) != 0, "no temporary left behind");
}

/* ---- corrupt files ----------------------------------------------------- */

/* Parse a hand-built image and expect status want with every needle in err. */
static void expect_parse(const char *what, const char *json, uint64_t header_len, size_t data_len,
                         ml_status want, const char *needle)
{
    size_t size;
    unsigned char *img = ml_st_image(json, header_len, data_len, &size);
    char err[ERRLEN] = "";
    ml_safetensors *st = (ml_safetensors *)&err; /* must be reset to NULL on error */
    ml_status rc = ml_safetensors_parse(&st, img, size, "corrupt.safetensors", err, ERRLEN);
    check(rc == want, "%s: status %s, want %s (%s)", what, ml_status_name(rc), ml_status_name(want),
          err);
    if (want != ML_OK) {
        check(st == NULL, "%s: *out is NULL on error", what);
        check(contains(err, "corrupt.safetensors"), "%s: error names the file: %s", what, err);
        check(!needle || contains(err, needle), "%s: error mentions '%s': %s", what, needle, err);
    }
    if (rc == ML_OK)
        ml_safetensors_destroy(st);
    free(img);
}

static void test_corrupt(void)
{
    const ml_status F = ML_ERR_FORMAT;
    const uint64_t REAL = UINT64_MAX;
    char err[ERRLEN];
    ml_safetensors *st;

    /* Sanity: a minimal valid image. */
    expect_parse("valid", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", REAL,
                 8, ML_OK, NULL);
    expect_parse("metadata ignored",
                 "{\"__metadata__\":{\"format\":\"pt\"},\"t\":{\"dtype\":\"U8\",\"shape\":[1],"
                 "\"data_offsets\":[0,1]}}",
                 REAL, 1, ML_OK, NULL);
    expect_parse("gaps allowed",
                 "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[4,5]}}",
                 REAL, 8, ML_OK, NULL);

    /* Truncated before the length prefix ends. */
    static const unsigned char four[4] = {1, 0, 0, 0};
    check(ml_safetensors_parse(&st, four, sizeof four, "corrupt.safetensors", err, ERRLEN) == F &&
              contains(err, "too short"),
          "truncated length: %s", err);
    check(ml_safetensors_parse(&st, four, 0, "corrupt.safetensors", err, ERRLEN) == F,
          "empty file");

    expect_parse("header length past the file", "{}", 1000, 0, F, "exceeds the");
    expect_parse("header length over the cap", "{}", (uint64_t)ML_SAFETENSORS_MAX_HEADER + 1, 0, F,
                 "limit");
    expect_parse("header length near 2^64", "{}", UINT64_MAX - 1, 0, F, "limit");
    expect_parse("invalid JSON", "{\"t\":{\"dtype\":", REAL, 0, F, "not a JSON object");
    expect_parse("not an object", "[1, 2, 3]", REAL, 0, F, "not a JSON object");
    expect_parse("trailing bytes", "{}  x", REAL, 0, F, "trailing");
    expect_parse("entry not an object", "{\"t\":[1]}", REAL, 0, F, "'t'");
    expect_parse("missing dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", REAL, 4, F,
                 "dtype");
    expect_parse("unknown dtype", "{\"t\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 REAL, 4, F, "unknown dtype");
    expect_parse("unsupported dtype",
                 "{\"t\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", REAL, 8,
                 ML_ERR_UNSUPPORTED, "F64");
    expect_parse("missing shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", REAL, 4, F,
                 "shape");
    expect_parse("negative dim",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", REAL, 4, F,
                 "shape[0]");
    expect_parse("fractional dim",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", REAL, 4, F,
                 "shape[0]");
    expect_parse("string dim",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", REAL, 4, F,
                 "shape[0]");
    expect_parse("huge dims overflow",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                 "\"data_offsets\":[0,4]}}",
                 REAL, 4, F, "'t'");
    expect_parse("dim beyond 2^53",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", REAL, 4, F,
                 "shape[0]");
    expect_parse("too many dims",
                 "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                 REAL, 1, F, "dimensions");
    expect_parse(
        "empty tensor with a huge dim",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[9007199254740992,0],\"data_offsets\":[0,0]}}", REAL,
        0, ML_OK, NULL);
    expect_parse("offsets past the end",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", REAL, 16, F,
                 "outside");
    expect_parse("shape larger than the data region",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", REAL, 8, F,
                 "data region");
    expect_parse("begin after end",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", REAL, 8, F,
                 "outside");
    expect_parse("offsets not a pair",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", REAL, 4, F,
                 "data_offsets");
    expect_parse("negative offset",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", REAL, 4, F,
                 "data_offsets");
    expect_parse("size mismatch",
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", REAL, 16, F,
                 "needs 12");
    expect_parse("overlap",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 REAL, 12, F, "overlap");
    expect_parse("identical ranges",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
                 REAL, 8, F, "overlap");
    expect_parse("duplicate name",
                 "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                 REAL, 2, F, "twice");
    expect_parse("empty name", "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                 REAL, 1, F, "empty name");
    expect_parse("metadata not an object", "{\"__metadata__\":3}", REAL, 0, F, "__metadata__");

    /* The same through a real, truncated file. */
    char path[512];
    snprintf(path, sizeof path, "%s/truncated.safetensors", ml_scratch_dir());
    size_t size;
    unsigned char *img = ml_st_image(
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", REAL, 16, &size);
    ml_write_bytes(path, img, size - 8);
    free(img);
    check(ml_safetensors_open(&st, path, err, ERRLEN) == F && contains(err, path) &&
              contains(err, "'t'"),
          "truncated data region: %s", err);
    snprintf(path, sizeof path, "%s/absent.safetensors", ml_scratch_dir());
    check(ml_safetensors_open(&st, path, err, ERRLEN) == ML_ERR_NOT_FOUND && st == NULL,
          "absent file: %s", err);
    check(ml_safetensors_open(&st, ml_scratch_dir(), err, ERRLEN) == ML_ERR_IO,
          "a directory is not a file: %s", err);
}

/* ---- checkpoints ------------------------------------------------------- */

static void test_canonical_names(void)
{
    static const char *const cases[][2] = {
        {"model.language_model.layers.0.mlp.up_proj.weight",
         "language_model.model.layers.0.mlp.up_proj.weight"},
        {"model.vision_model.class_embedding", "vision_model.class_embedding"},
        {"model.multi_modal_projector.bias", "multi_modal_projector.bias"},
        {"lm_head.weight", "language_model.lm_head.weight"},
        {"language_model.model.norm.weight", "language_model.model.norm.weight"},
        {"vision_model.layernorm_pre.weight", "vision_model.layernorm_pre.weight"},
        {"model.other", "model.other"},
        {"lm_head", "lm_head"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[128];
        size_t n = ml_checkpoint_canonical_name(cases[i][0], buf, sizeof buf);
        check(!strcmp(buf, cases[i][1]) && n == strlen(cases[i][1]), "canonical(%s) = %s",
              cases[i][0], buf);
    }
    char small[8];
    size_t n = ml_checkpoint_canonical_name("lm_head.weight", small, sizeof small);
    check(n == strlen("language_model.lm_head.weight") && strlen(small) == 7,
          "truncation reports the full length");
}

static void test_checkpoint_single_new_layout(void)
{
    char dir[512], path[600], err[ERRLEN];
    ml_scratch_subdir("single", dir, sizeof dir);
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    ml_tensor_view t[3] = {
        {"model.language_model.embed_tokens.weight", ML_DTYPE_F32, 2, {2, 2}, a, sizeof a},
        {"lm_head.weight", ML_DTYPE_F32, 1, {2}, b, sizeof b},
        {"model.vision_model.class_embedding", ML_DTYPE_F32, 1, {2}, b, sizeof b},
    };
    snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_SINGLE_FILE);
    check(ml_safetensors_write(path, t, 3, err, ERRLEN) == ML_OK, "write: %s", err);
    ml_checkpoint *ck = NULL;
    check(ml_checkpoint_open(&ck, dir, err, ERRLEN) == ML_OK, "open: %s", err);
    if (!ck)
        return;
    check(ml_checkpoint_count(ck) == 3 && ml_checkpoint_n_shards(ck) == 1, "count/shards");
    const ml_tensor_view *e1 = ml_checkpoint_find(ck, "language_model.model.embed_tokens.weight");
    const ml_tensor_view *e2 = ml_checkpoint_find(ck, "model.language_model.embed_tokens.weight");
    check(e1 && e1 == e2, "embed found under both layouts");
    check(e1 && !strcmp(e1->name, "model.language_model.embed_tokens.weight"),
          "view keeps the stored name");
    check(ml_checkpoint_find(ck, "language_model.lm_head.weight") ==
                  ml_checkpoint_find(ck, "lm_head.weight") &&
              ml_checkpoint_find(ck, "lm_head.weight"),
          "lm_head under both layouts");
    check(ml_checkpoint_find(ck, "vision_model.class_embedding") != NULL, "vision alias");
    check(ml_checkpoint_find(ck, "language_model.model.norm.weight") == NULL, "absent tensor");
    const char *canon = NULL;
    check(ml_checkpoint_tensor(ck, 0, &canon) && !strcmp(canon, "language_model.lm_head.weight"),
          "entries in canonical order: %s", canon ? canon : "(null)");
    check(ml_checkpoint_tensor(ck, 3, NULL) == NULL, "index past the end");
    ml_checkpoint_destroy(ck);
    ml_checkpoint_destroy(NULL);
}

static void test_checkpoint_sharded(void)
{
    char dir[512], path[600], err[ERRLEN];
    ml_scratch_subdir("sharded", dir, sizeof dir);
    static uint16_t w[64];
    for (int i = 0; i < 64; i++)
        w[i] = (uint16_t)(0x3f80 + i);
    ml_tensor_view t[5] = {
        {"language_model.model.embed_tokens.weight", ML_DTYPE_BF16, 2, {8, 4}, w, 64},
        {"language_model.model.norm.weight", ML_DTYPE_BF16, 1, {4}, w, 8},
        {"language_model.lm_head.weight", ML_DTYPE_BF16, 2, {8, 4}, w + 32, 64},
        {"vision_model.class_embedding", ML_DTYPE_BF16, 1, {16}, w, 32},
        {"multi_modal_projector.bias", ML_DTYPE_BF16, 1, {4}, NULL, 8},
    };
    int n_shards = 0;
    check(ml_safetensors_write_sharded(dir, t, 5, 72, &n_shards, err, ERRLEN) == ML_OK, "write: %s",
          err);
    check(n_shards == 3, "3 shards of <= 72 bytes, got %d", n_shards);
    snprintf(path, sizeof path, "%s/model-00002-of-00003.safetensors", dir);
    check(access(path, F_OK) == 0, "shard 2 named like save_pretrained");
    ml_checkpoint *ck = NULL;
    check(ml_checkpoint_open(&ck, dir, err, ERRLEN) == ML_OK, "open: %s", err);
    if (!ck)
        return;
    check(ml_checkpoint_n_shards(ck) == 3 && ml_checkpoint_count(ck) == 5, "shards %d count %zu",
          ml_checkpoint_n_shards(ck), ml_checkpoint_count(ck));
    for (int i = 0; i < 5; i++) {
        const ml_tensor_view *v = ml_checkpoint_find(ck, t[i].name);
        check(v && v->nbytes == (size_t)ml_tensor_view_numel(&t[i]) * 2, "find %s", t[i].name);
        if (v && t[i].data)
            check(!memcmp(v->data, t[i].data, v->nbytes), "%s bytes", t[i].name);
        if (v && !t[i].data)
            check(!memcmp(v->data, (uint16_t[4]){0}, 8), "%s left as zeros", t[i].name);
    }
    check(ml_checkpoint_find(ck, "model.language_model.norm.weight") != NULL, "new-layout lookup");
    ml_checkpoint_destroy(ck);

    /* One shard: a plain model.safetensors, no index. */
    ml_scratch_subdir("one_shard", dir, sizeof dir);
    check(ml_safetensors_write_sharded(dir, t, 5, 1u << 20, &n_shards, err, ERRLEN) == ML_OK &&
              n_shards == 1,
          "single shard: %s", err);
    snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_SINGLE_FILE);
    check(access(path, F_OK) == 0, "single shard written as model.safetensors");
    snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_INDEX_FILE);
    check(access(path, F_OK) != 0, "no index for one shard");
}

/* A directory with one shard "s.safetensors" holding tensor "a", and the
 * given index.json; expect status want and needle in the error. */
static void expect_index(const char *what, const char *index_json, ml_status want,
                         const char *needle)
{
    static int n;
    char dir[512], sub[32], path[600], err[ERRLEN] = "";
    snprintf(sub, sizeof sub, "index%d", n++);
    ml_scratch_subdir(sub, dir, sizeof dir);
    uint8_t x = 7;
    ml_tensor_view a = {"a", ML_DTYPE_U8, 1, {1}, &x, 1};
    snprintf(path, sizeof path, "%s/s.safetensors", dir);
    check(ml_safetensors_write(path, &a, 1, err, ERRLEN) == ML_OK, "%s: write shard", what);
    if (index_json) {
        snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_INDEX_FILE);
        ml_write_text(path, index_json);
    }
    ml_checkpoint *ck = (ml_checkpoint *)&n;
    ml_status rc = ml_checkpoint_open(&ck, dir, err, ERRLEN);
    check(rc == want, "%s: status %s, want %s (%s)", what, ml_status_name(rc), ml_status_name(want),
          err);
    if (rc == ML_OK)
        ml_checkpoint_destroy(ck);
    else
        check(ck == NULL && (!needle || contains(err, needle)), "%s: error mentions '%s': %s", what,
              needle, err);
}

static void test_checkpoint_errors(void)
{
    expect_index("valid index", "{\"metadata\":{},\"weight_map\":{\"a\":\"s.safetensors\"}}", ML_OK,
                 NULL);
    expect_index("no checkpoint files", NULL, ML_ERR_NOT_FOUND, ML_CHECKPOINT_INDEX_FILE);
    expect_index(
        "missing shard",
        "{\"weight_map\":{\"a\":\"s.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}",
        ML_ERR_NOT_FOUND, "model-00002-of-00002.safetensors");
    expect_index("tensor missing from its shard",
                 "{\"weight_map\":{\"a\":\"s.safetensors\",\"zz\":\"s.safetensors\"}}",
                 ML_ERR_FORMAT, "'zz'");
    expect_index("shard name escaping the directory",
                 "{\"weight_map\":{\"a\":\"../s.safetensors\"}}", ML_ERR_FORMAT, "plain file name");
    expect_index("shard name ..", "{\"weight_map\":{\"a\":\"..\"}}", ML_ERR_FORMAT,
                 "plain file name");
    expect_index("absolute shard path", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", ML_ERR_FORMAT,
                 "plain file name");
    expect_index("empty shard name", "{\"weight_map\":{\"a\":\"\"}}", ML_ERR_FORMAT,
                 "plain file name");
    expect_index("shard name not a string", "{\"weight_map\":{\"a\":3}}", ML_ERR_FORMAT, "'a'");
    expect_index("no weight_map", "{\"metadata\":{}}", ML_ERR_FORMAT, "weight_map");
    expect_index("empty weight_map", "{\"weight_map\":{}}", ML_ERR_FORMAT, "empty");
    expect_index("index not JSON", "{\"weight_map\":", ML_ERR_FORMAT, "not a JSON object");
    expect_index("empty index", "", ML_ERR_FORMAT, "not a JSON object");

    /* The same tensor under both key layouts is ambiguous. */
    char dir[512], path[600], err[ERRLEN];
    ml_scratch_subdir("both_layouts", dir, sizeof dir);
    uint8_t x = 1;
    ml_tensor_view t[2] = {{"lm_head.weight", ML_DTYPE_U8, 1, {1}, &x, 1},
                           {"language_model.lm_head.weight", ML_DTYPE_U8, 1, {1}, &x, 1}};
    snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_SINGLE_FILE);
    check(ml_safetensors_write(path, t, 2, err, ERRLEN) == ML_OK, "write: %s", err);
    ml_checkpoint *ck = NULL;
    check(ml_checkpoint_open(&ck, dir, err, ERRLEN) == ML_ERR_FORMAT && contains(err, "twice"),
          "both layouts of one tensor: %s", err);
    ml_checkpoint_destroy(ck);

    /* A broken model.safetensors is reported, not skipped for the index. */
    ml_scratch_subdir("broken_single", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_SINGLE_FILE);
    ml_write_text(path, "garbage!");
    check(ml_checkpoint_open(&ck, dir, err, ERRLEN) == ML_ERR_FORMAT && contains(err, path),
          "broken single file: %s", err);
}

int main(void)
{
    test_round_trip();
    test_writer_errors();
    test_corrupt();
    test_canonical_names();
    test_checkpoint_single_new_layout();
    test_checkpoint_sharded();
    test_checkpoint_errors();
    return check_done();
}
