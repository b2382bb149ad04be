/* engine/checkpoint/config.h: the published 11B and 90B configs parse to the
 * values of engine/model/README.md §1, the newer rope_parameters/dtype spelling gives
 * the same config, class defaults apply where keys are absent, every
 * validation error names its field, and the llama3 RoPE frequencies match
 * transformers. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "checkpoint/config.h"

#define ERRLEN 512
#define CONFIGS ML_SOURCE_DIR "/tests/golden/fixtures/configs/"

/* transformers 4.47.1 _compute_llama3_parameters(MllamaConfig(11b.json).text_config),
 * float32, printed with float.hex. */
static const float llama3_inv_freq_11b[64] = {
    0x1p+0f,         0x1.a11582p-1f,  0x1.53c38cp-1f,  0x1.14c708p-1f,  0x1.c2ef78p-2f,
    0x1.6f56fap-2f,  0x1.2b3dc6p-2f,  0x1.e788c2p-3f,  0x1.8d276p-3f,   0x1.43874p-3f,
    0x1.078d4p-3f,   0x1.ad6338p-4f,  0x1.5dc95ap-4f,  0x1.1cf13p-4f,   0x1.d03ccep-5f,
    0x1.7a2d08p-5f,  0x1.34119p-5f,   0x1.f5ea7ep-6f,  0x1.98de92p-6f,  0x1.4d1272p-6f,
    0x1.0f5386p-6f,  0x1.ba0dd8p-7f,  0x1.681adap-7f,  0x1.2558fep-7f,  0x1.ddee9ep-8f,
    0x1.8554ecp-8f,  0x1.3d2804p-8f,  0x1.025c6ap-8f,  0x1.a4ee4p-9f,   0x1.1bfa0cp-9f,
    0x1.67a23ap-10f, 0x1.c12f3cp-11f, 0x1.132ba4p-11f, 0x1.47e21p-12f,  0x1.765ba4p-13f,
    0x1.90d10cp-14f, 0x1.46831ap-14f, 0x1.09fb7ep-14f, 0x1.b15902p-15f, 0x1.610332p-15f,
    0x1.1f91fp-15f,  0x1.d484dep-16f, 0x1.7da9e8p-16f, 0x1.36e8eap-16f, 0x1.fa8b86p-17f,
    0x1.9ca3eap-17f, 0x1.5024d6p-17f, 0x1.11d41ep-17f, 0x1.be2188p-18f, 0x1.6b6d0ep-18f,
    0x1.280d96p-18f, 0x1.e257p-19f,   0x1.88ec2p-19f,  0x1.4014d2p-19f, 0x1.04be68p-19f,
    0x1.a8d01p-20f,  0x1.5a0f4ep-20f, 0x1.19e8p-20f,   0x1.cb4a9ap-21f, 0x1.76258ep-21f,
    0x1.30c94ep-21f, 0x1.f09184p-22f, 0x1.94836p-22f,  0x1.4985fep-22f,
};

static int contains(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

static int load(ml_config *cfg, const char *name)
{
    char err[ERRLEN];
    ml_status rc = ml_config_load(cfg, name, err, ERRLEN);
    check(rc == ML_OK, "load %s: %s", name, err);
    return rc == ML_OK;
}

/* The vision config of §1.1, shared by 11B and 90B. */
static void check_vision_published(const ml_config *c)
{
    static const int ratios[8][2] = {{1, 1}, {1, 2}, {1, 3}, {1, 4},
                                     {2, 1}, {2, 2}, {3, 1}, {4, 1}};
    static const int inter[5] = {3, 7, 15, 23, 30};
    const ml_vision_config *v = &c->vision;
    check(v->hidden_size == 1280 && v->attention_heads == 16 && v->head_dim == 80,
          "vision hidden/heads/head_dim");
    check(v->intermediate_size == 5120 && v->num_hidden_layers == 32 && v->num_global_layers == 8,
          "vision sizes");
    check(v->image_size == 560 && v->patch_size == 14 && v->num_channels == 3, "vision geometry");
    check(v->norm_eps == 1e-5f && v->max_num_tiles == 4, "vision eps/tiles");
    check(v->n_aspect_ratios == 8 && !memcmp(v->supported_aspect_ratios, ratios, sizeof ratios),
          "aspect ratios");
    check(v->n_intermediate_layers == 5 &&
              !memcmp(v->intermediate_layers_indices, inter, sizeof inter),
          "intermediate layers");
    check(v->vision_output_dim == 7680, "vision_output_dim");
    check(ml_config_num_patches(c) == 1601 && ml_config_num_patches_padded(c) == 1608,
          "patches 1601 padded 1608");
    check(ml_config_n_aspect_ratio_ids(c) == 9, "9 aspect ratio ids");
    check(c->image_token_index == 128256 && c->dtype == ML_DTYPE_BF16, "image token, dtype");
}

static void check_text_common(const ml_text_config *t)
{
    check(t->vocab_size == 128256 && t->num_key_value_heads == 8 && t->head_dim == 128,
          "vocab/kv heads/head_dim");
    check(t->rms_norm_eps == 1e-5f && t->rope_theta == 500000.0, "eps/theta");
    check(t->rope_scaling.type == ML_ROPE_LLAMA3 && t->rope_scaling.factor == 8.0f &&
              t->rope_scaling.low_freq_factor == 1.0f && t->rope_scaling.high_freq_factor == 4.0f &&
              t->rope_scaling.original_max_position_embeddings == 8192,
          "llama3 rope scaling");
    check(t->max_position_embeddings == 131072, "max positions");
    check(t->bos_token_id == 128000 && t->pad_token_id == 128004, "bos/pad");
    check(t->n_eos == 3 && t->eos_token_ids[0] == 128001 && t->eos_token_ids[1] == 128008 &&
              t->eos_token_ids[2] == 128009,
          "Instruct eos list");
}

static void test_11b(void)
{
    ml_config c;
    if (!load(&c, CONFIGS "11b.json"))
        return;
    check_vision_published(&c);
    const ml_text_config *t = &c.text;
    check_text_common(t);
    check(t->hidden_size == 4096 && t->intermediate_size == 14336 && t->num_hidden_layers == 40 &&
              t->num_attention_heads == 32,
          "11B text sizes");
    static const int cross[8] = {3, 8, 13, 18, 23, 28, 33, 38};
    check(t->n_cross_layers == 8 && !memcmp(t->cross_attention_layers, cross, sizeof cross),
          "11B cross layers");
    check(ml_config_n_self_layers(&c) == 32, "32 self layers");
    check(ml_config_cross_index(&c, 3) == 0 && ml_config_cross_index(&c, 38) == 7 &&
              ml_config_cross_index(&c, 4) == -1 && ml_config_cross_index(&c, 40) == -1,
          "cross_index");

    float inv[64];
    ml_config_rope_inv_freq(&c, inv);
    int exact = 0;
    float worst = 0;
    for (int i = 0; i < 64; i++) {
        exact += inv[i] == llama3_inv_freq_11b[i];
        float rel = fabsf(inv[i] - llama3_inv_freq_11b[i]) / llama3_inv_freq_11b[i];
        worst = rel > worst ? rel : worst;
    }
    fprintf(stderr, "  llama3 inv_freq: %d/64 bit-exact, max rel diff %.3g\n", exact, worst);
    /* powf and torch's pow may differ in the last bit. */
    check(worst <= 2.5e-7f, "llama3 inv_freq within 2 ulp of transformers (max rel %.3g)", worst);
    check(inv[0] == 1.0f, "inv_freq[0] exact");
}

static void test_90b(void)
{
    ml_config c;
    if (!load(&c, CONFIGS "90b.json"))
        return;
    check_vision_published(&c);
    const ml_text_config *t = &c.text;
    check_text_common(t); /* num_key_value_heads is absent: class default 8 */
    check(t->hidden_size == 8192 && t->intermediate_size == 28672 && t->num_hidden_layers == 100 &&
              t->num_attention_heads == 64,
          "90B text sizes");
    check(t->n_cross_layers == 20, "20 cross layers");
    for (int i = 0; i < t->n_cross_layers; i++)
        check(t->cross_attention_layers[i] == 3 + 5 * i, "cross layer %d", i);
    check(ml_config_n_self_layers(&c) == 80, "80 self layers");
}

static void test_rope_parameters_variant(void)
{
    ml_config a, b;
    if (!load(&a, CONFIGS "11b.json") || !load(&b, CONFIGS "11b_rope_parameters.json"))
        return;
    check(b.dtype == ML_DTYPE_BF16, "dtype key");
    check(b.text.rope_theta == a.text.rope_theta && b.text.rope_scaling.type == ML_ROPE_LLAMA3 &&
              b.text.rope_scaling.factor == a.text.rope_scaling.factor &&
              b.text.rope_scaling.low_freq_factor == a.text.rope_scaling.low_freq_factor &&
              b.text.rope_scaling.high_freq_factor == a.text.rope_scaling.high_freq_factor &&
              b.text.rope_scaling.original_max_position_embeddings ==
                  a.text.rope_scaling.original_max_position_embeddings,
          "rope_parameters gives the same RoPE");
    float ia[64], ib[64];
    ml_config_rope_inv_freq(&a, ia);
    ml_config_rope_inv_freq(&b, ib);
    check(!memcmp(ia, ib, sizeof ia), "same inv_freq");
    check(b.text.hidden_size == a.text.hidden_size &&
              b.text.n_cross_layers == a.text.n_cross_layers,
          "rest unchanged");
}

static ml_status parse(ml_config *c, const char *json, char *err)
{
    return ml_config_parse(c, json, strlen(json), err, ERRLEN);
}

/* Only vision_config.image_size given: everything else is a class default. */
static void test_defaults(void)
{
    char err[ERRLEN];
    ml_config c;
    ml_status rc = parse(&c, "{\"vision_config\": {\"image_size\": 560}}", err);
    check(rc == ML_OK, "minimal config: %s", err);
    if (rc != ML_OK)
        return;
    check_vision_published(&c);
    const ml_text_config *t = &c.text;
    check(t->vocab_size == 128256 && t->hidden_size == 4096 && t->num_hidden_layers == 40 &&
              t->num_attention_heads == 32 && t->num_key_value_heads == 8 &&
              t->intermediate_size == 14336 && t->n_cross_layers == 8 && t->rope_theta == 500000.0,
          "text class defaults");
    check(t->rope_scaling.type == ML_ROPE_DEFAULT, "no rope_scaling: default RoPE");
    check(t->n_eos == 1 && t->eos_token_ids[0] == 128001, "default eos");
    float inv[64];
    ml_config_rope_inv_freq(&c, inv);
    /* transformers _compute_default_rope_parameters, float32. */
    check(inv[0] == 1.0f, "default inv_freq[0]");
    check_close(inv[1], 0.8146172165870667, 0, 2.5e-7, "default inv_freq[1]");
    check_close(inv[63], 2.4551407022954663e-06, 0, 2.5e-7, "default inv_freq[63]");

    /* Alternative spellings and nulls. */
    rc = parse(&c,
               "{\"vision_config\": {\"image_size\": 448, \"num_attention_heads\": 20},"
               " \"text_config\": {\"eos_token_id\": 7, \"pad_token_id\": null,"
               " \"rope_scaling\": {\"type\": \"default\"}, \"head_dim\": 128},"
               " \"torch_dtype\": \"float32\"}",
               err);
    check(rc == ML_OK, "alternative spellings: %s", err);
    check(c.vision.attention_heads == 20 && c.vision.head_dim == 64,
          "num_attention_heads accepted");
    check(c.text.n_eos == 1 && c.text.eos_token_ids[0] == 7, "eos as a bare int");
    check(c.text.pad_token_id == -1 && c.text.rope_scaling.type == ML_ROPE_DEFAULT, "null pad");
    check(c.dtype == ML_DTYPE_F32, "torch_dtype float32");
    rc = parse(&c,
               "{\"vision_config\": {\"image_size\": 448, \"attention_heads\": 10,"
               " \"num_attention_heads\": 20}, \"text_config\": {\"eos_token_id\": null},"
               " \"dtype\": \"float16\", \"torch_dtype\": \"float32\"}",
               err);
    check(rc == ML_OK && c.vision.attention_heads == 10, "attention_heads wins: %s", err);
    check(c.text.n_eos == 0, "null eos: no eos ids");
    check(c.dtype == ML_DTYPE_F16, "dtype wins over torch_dtype");
    rc = parse(&c,
               "{\"vision_config\": {\"image_size\": 448, \"max_num_tiles\": 2,"
               " \"supported_aspect_ratios\": [[1, 1], [1, 2], [2, 1]],"
               " \"intermediate_layers_indices\": [0, 32], \"vision_output_dim\": 3840},"
               " \"text_config\": {\"cross_attention_layers\": [], \"num_hidden_layers\": 2}}",
               err);
    check(rc == ML_OK && c.vision.n_aspect_ratios == 3 && ml_config_n_aspect_ratio_ids(&c) == 4,
          "custom aspect ratios: %s", err);
    check(c.text.n_cross_layers == 0 && ml_config_n_self_layers(&c) == 2, "no cross layers");
    /* Python's json keeps the last of duplicate keys. */
    rc = parse(&c, "{\"vision_config\": {\"image_size\": 448, \"image_size\": 560}}", err);
    check(rc == ML_OK && c.vision.image_size == 560, "last duplicate key wins");

    /* The buffer is not NUL-terminated: bytes past len are never read. */
    const char buf[] = "{\"vision_config\": {\"image_size\": 560}}GARBAGE";
    rc = ml_config_parse(&c, buf, strlen(buf) - strlen("GARBAGE"), err, ERRLEN);
    check(rc == ML_OK, "parse respects len: %s", err);
}

/* A config with extra members spliced into vision_config and text_config:
 * expect status want, an error containing needle, and *cfg untouched. */
static void expect_error(const char *vision_extra, const char *text_extra, ml_status want,
                         const char *needle)
{
    char json[2048], err[ERRLEN] = "";
    snprintf(json, sizeof json,
             "{\"vision_config\": {\"image_size\": 560%s%s}, \"text_config\": {%s}}",
             vision_extra[0] ? ", " : "", vision_extra, text_extra);
    ml_config c;
    memset(&c, 0x5a, sizeof c);
    ml_config before;
    memcpy(&before, &c, sizeof c);
    ml_status rc = parse(&c, json, err);
    check(rc == want, "%s: status %s, want %s (%s)", json, ml_status_name(rc), ml_status_name(want),
          err);
    check(contains(err, needle), "error names the field: want '%s', got '%s'", needle, err);
    check(!memcmp(&c, &before, sizeof c), "%s: cfg unchanged on error", needle);
}

static void test_errors(void)
{
    const ml_status F = ML_ERR_FORMAT, U = ML_ERR_UNSUPPORTED;
    /* vision_config */
    expect_error("\"hidden_size\": \"big\"", "", F,
                 "vision_config.hidden_size: expected an integer, got a string");
    expect_error("\"hidden_size\": 0", "", F, "vision_config.hidden_size: 0 out of range");
    expect_error("\"hidden_size\": 12.5", "", F, "vision_config.hidden_size: expected an integer");
    expect_error("\"hidden_size\": null", "", F,
                 "vision_config.hidden_size: expected an integer, got null");
    expect_error("\"hidden_size\": true", "", F,
                 "vision_config.hidden_size: expected an integer, got a boolean");
    expect_error("\"attention_heads\": 17", "", F,
                 "vision_config.attention_heads: 17 does not divide hidden_size 1280");
    expect_error("\"hidden_act\": \"gelu_new\"", "", U,
                 "vision_config.hidden_act: \"gelu_new\" is not supported");
    expect_error("\"hidden_act\": 3", "", F, "vision_config.hidden_act: expected a string");
    expect_error("\"patch_size\": 15", "", F,
                 "vision_config.image_size: 560 is not a multiple of patch_size 15");
    expect_error("\"norm_eps\": -1", "", F, "vision_config.norm_eps: -1 must be a positive number");
    expect_error("\"norm_eps\": 0", "", F, "vision_config.norm_eps");
    expect_error("\"intermediate_layers_indices\": [3, 40]", "", F,
                 "vision_config.intermediate_layers_indices[1]: 40 out of range [0, 32]");
    expect_error("\"intermediate_layers_indices\": 3", "", F,
                 "vision_config.intermediate_layers_indices: expected a list");
    expect_error("\"vision_output_dim\": 7000", "", F, "vision_config.vision_output_dim: 7000");
    expect_error("\"supported_aspect_ratios\": [[1, 1], [2, 3]]", "", F,
                 "vision_config.supported_aspect_ratios[1]: [2, 3] needs 6 tiles");
    expect_error("\"supported_aspect_ratios\": [[1, 1], [1]]", "", F,
                 "vision_config.supported_aspect_ratios[1]: expected a pair");
    expect_error("\"supported_aspect_ratios\": [[0, 1]]", "", F,
                 "vision_config.supported_aspect_ratios[0]: 0 out of range [1, 4]");
    expect_error("\"supported_aspect_ratios\": []", "", F,
                 "vision_config.supported_aspect_ratios: empty");
    expect_error("\"max_num_tiles\": 2", "", F,
                 "vision_config.supported_aspect_ratios: required when max_num_tiles is 2");
    expect_error("\"max_num_tiles\": 0", "", F, "vision_config.max_num_tiles: 0 out of range");
    expect_error("\"num_hidden_layers\": 100000", "", F,
                 "vision_config.num_hidden_layers: 100000 out of range");
    expect_error("\"num_global_layers\": -1", "", F,
                 "vision_config.num_global_layers: -1 out of range");

    /* text_config */
    expect_error("", "\"cross_attention_layers\": [3, 8, 13, 41]", F,
                 "text_config.cross_attention_layers[3]: 41 out of range [0, 40)");
    expect_error("", "\"cross_attention_layers\": [3, 8, 8]", F,
                 "text_config.cross_attention_layers[2]: 8 after 8");
    expect_error("", "\"cross_attention_layers\": [8, 3]", F,
                 "text_config.cross_attention_layers[1]: 3 after 8");
    expect_error("", "\"cross_attention_layers\": [-1]", F,
                 "text_config.cross_attention_layers[0]: -1 out of range");
    expect_error("", "\"cross_attention_layers\": [3, \"x\"]", F,
                 "text_config.cross_attention_layers[1]: expected an integer, got a string");
    expect_error("", "\"hidden_size\": 4100", F,
                 "text_config.num_attention_heads: 32 does not divide hidden_size 4100");
    expect_error("", "\"num_key_value_heads\": 7", F,
                 "text_config.num_key_value_heads: 7 does not divide num_attention_heads 32");
    expect_error("", "\"num_key_value_heads\": 0", F,
                 "text_config.num_key_value_heads: 0 out of range");
    expect_error("", "\"head_dim\": 64", U, "text_config.head_dim: 64 differs");
    expect_error("", "\"hidden_size\": 96, \"num_attention_heads\": 32, \"num_key_value_heads\": 8",
                 F, "head_dim 3 is odd");
    expect_error("", "\"rms_norm_eps\": 0", F, "text_config.rms_norm_eps");
    expect_error("", "\"rope_theta\": \"big\"", F, "text_config.rope_theta: expected a number");
    expect_error("", "\"rope_scaling\": 3", F, "text_config.rope_scaling: expected an object");
    expect_error("", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0}", U,
                 "text_config.rope_scaling.rope_type: \"yarn\" is not supported");
    expect_error("", "\"rope_scaling\": {\"rope_type\": 1}", F,
                 "text_config.rope_scaling.rope_type: expected a string");
    expect_error("",
                 "\"rope_scaling\": {\"rope_type\": \"llama3\", \"low_freq_factor\": 1.0,"
                 " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
                 F, "text_config.rope_scaling.factor: required");
    expect_error(
        "",
        "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\":"
        " 4.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
        F, "text_config.rope_scaling.high_freq_factor: 4 must be greater than low_freq_factor 4");
    expect_error(
        "",
        "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": -8.0, \"low_freq_factor\":"
        " 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
        F, "text_config.rope_scaling.factor: -8 must be a positive number");
    expect_error(
        "",
        "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\":"
        " 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 0}",
        F, "text_config.rope_scaling.original_max_position_embeddings: 0 out of range");
    expect_error("",
                 "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0,"
                 " \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}",
                 F, "text_config.rope_parameters.original_max_position_embeddings: required");
    expect_error("", "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": -1}", F,
                 "text_config.rope_parameters.rope_theta");
    expect_error("", "\"rope_parameters\": []", F,
                 "text_config.rope_parameters: expected an object");
    expect_error("", "\"tie_word_embeddings\": true", U, "text_config.tie_word_embeddings");
    expect_error("", "\"tie_word_embeddings\": \"no\"", F,
                 "text_config.tie_word_embeddings: expected a boolean");
    expect_error("", "\"hidden_act\": \"gelu\"", U,
                 "text_config.hidden_act: \"gelu\" is not supported (only \"silu\")");
    expect_error("", "\"eos_token_id\": \"x\"", F,
                 "text_config.eos_token_id: expected an integer or a list");
    expect_error("", "\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]",
                 ML_ERR_TOO_LARGE, "text_config.eos_token_id: 17 entries exceed the limit 16");
    expect_error("", "\"bos_token_id\": -5", F, "text_config.bos_token_id: -5 out of range");
    expect_error("", "\"num_hidden_layers\": 1000", F,
                 "text_config.num_hidden_layers: 1000 out of range");
    expect_error("", "\"vocab_size\": 0", F, "text_config.vocab_size: 0 out of range");
    expect_error("", "\"max_position_embeddings\": 1e10", F,
                 "text_config.max_position_embeddings: 10000000000 out of range");
}

static void expect_top_error(const char *json, ml_status want, const char *needle)
{
    char err[ERRLEN] = "";
    ml_config c;
    ml_status rc = parse(&c, json, err);
    check(rc == want && contains(err, needle), "%s: got %s '%s', want %s '%s'", json,
          ml_status_name(rc), err, ml_status_name(want), needle);
}

static void test_top_level_errors(void)
{
    const ml_status F = ML_ERR_FORMAT;
    expect_top_error("", F, "invalid JSON near byte 0");
    expect_top_error("{\"vision_config\": {\"image_size\": 560", F, "invalid JSON near byte");
    expect_top_error("[1, 2]", F, "expected a JSON object, got an array");
    expect_top_error("{\"vision_config\": {\"image_size\": 560}} {}", F, "trailing bytes");
    expect_top_error("{}", F, "vision_config.image_size: required");
    expect_top_error("{\"vision_config\": {}}", F, "vision_config.image_size: required");
    expect_top_error("{\"vision_config\": [560]}", F, "vision_config: expected an object");
    expect_top_error("{\"vision_config\": {\"image_size\": 560}, \"text_config\": 1}", F,
                     "text_config: expected an object, got a number");
    expect_top_error("{\"model_type\": \"llava\", \"vision_config\": {\"image_size\": 560}}",
                     ML_ERR_UNSUPPORTED,
                     "model_type: \"llava\" is not supported (only \"mllama\")");
    expect_top_error("{\"torch_dtype\": \"float64\", \"vision_config\": {\"image_size\": 560}}",
                     ML_ERR_UNSUPPORTED, "torch_dtype: \"float64\" is not supported");
    expect_top_error("{\"dtype\": 16, \"vision_config\": {\"image_size\": 560}}", F,
                     "dtype: expected a string");
    expect_top_error("{\"image_token_index\": -1, \"vision_config\": {\"image_size\": 560}}", F,
                     "image_token_index: -1 out of range");

    char err[ERRLEN];
    ml_config c;
    const char *absent = CONFIGS "absent.json";
    check(ml_config_load(&c, absent, err, ERRLEN) == ML_ERR_NOT_FOUND && contains(err, absent),
          "absent file: %s", err);
    check(ml_config_load(&c, CONFIGS "make_configs.py", err, ERRLEN) == F &&
              contains(err, "make_configs.py: config: "),
          "load error prefixed with the path: %s", err);
}

int main(void)
{
    test_11b();
    test_90b();
    test_rope_parameters_variant();
    test_defaults();
    test_errors();
    test_top_level_errors();
    return check_done();
}
