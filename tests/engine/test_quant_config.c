/* engine/checkpoint/quant_config.c: the quantization_config that llm-compressor
 * writes for its FP8_DYNAMIC scheme (and the weight-only FP8 variant)
 * parses, every field that changes what a weight means is checked and an
 * error names it, and ignore entries match as compressed-tensors matches
 * them (exact names; "re:" with re.match, a prefix). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "checkpoint/config.h"

#define ERRLEN 512
#define BASE "{\"vision_config\": {\"image_size\": 560}, \"quantization_config\": "

/* The FP8_DYNAMIC group as compressed-tensors serialises QuantizationArgs;
 * %s slots: weights' strategy, input_activations, ignore. */
#define GROUP_FMT                                                                             \
    "{\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {"            \
    "\"num_bits\": 8, \"type\": \"float\", \"symmetric\": true, \"group_size\": null, "       \
    "\"strategy\": \"%s\", \"block_structure\": null, \"dynamic\": false, \"actorder\": "     \
    "null, \"observer\": \"minmax\", \"observer_kwargs\": {}}, \"input_activations\": %s, "   \
    "\"output_activations\": null}}, \"format\": \"float-quantized\", "                      \
    "\"global_compression_ratio\": 1.24, \"ignore\": %s, \"kv_cache_scheme\": null, "        \
    "\"quant_method\": \"compressed-tensors\", \"quantization_status\": \"compressed\", "    \
    "\"sparsity_config\": {}}"
#define DYNAMIC_TOKEN                                                                         \
    "{\"num_bits\": 8, \"type\": \"float\", \"symmetric\": true, \"group_size\": null, "      \
    "\"strategy\": \"token\", \"block_structure\": null, \"dynamic\": true, \"actorder\": "   \
    "null, \"observer\": null, \"observer_kwargs\": {}}"
#define PUBLISHED_IGNORE "[\"re:.*lm_head\", \"re:multi_modal_projector.*\", \"re:vision_model.*\"]"

static int contains(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

/* ml_config is large (the ignore list): one static instance. */
static ml_config cfg;

static ml_status parse_quant(const char *quant, char *err)
{
    static char json[8192];
    snprintf(json, sizeof json, BASE "%s}", quant);
    return ml_config_parse(&cfg, json, strlen(json), err, ERRLEN);
}

static ml_status parse_group(const char *strategy, const char *input, const char *ignore,
                             char *err)
{
    static char quant[4096];
    snprintf(quant, sizeof quant, GROUP_FMT, strategy, input, ignore);
    return parse_quant(quant, err);
}

static int ignores(const char *module)
{
    char err[ERRLEN];
    int ig = -1;
    check(ml_quant_config_ignores(&cfg.quant, module, &ig, err, ERRLEN) == ML_OK, "%s: %s",
          module, err);
    return ig;
}

static void test_published(void)
{
    char err[ERRLEN] = "";
    check(parse_group("channel", DYNAMIC_TOKEN, PUBLISHED_IGNORE, err) == ML_OK, "FP8 dynamic: %s",
          err);
    check(cfg.quant.scheme == ML_QUANT_FP8_CHANNEL && cfg.quant.act_dynamic_token == 1 &&
              cfg.quant.n_ignore == 3,
          "scheme %d, dynamic %d, %d ignore entries", cfg.quant.scheme,
          cfg.quant.act_dynamic_token, cfg.quant.n_ignore);
    check(ignores("language_model.lm_head") == 1, "re:.*lm_head matches language_model.lm_head");
    check(ignores("lm_head") == 1, "and the newer layout's lm_head");
    check(ignores("multi_modal_projector") == 1, "the projector");
    check(ignores("vision_model.transformer.layers.3.self_attn.q_proj") == 1, "vision Linears");
    check(ignores("model.vision_model.transformer.layers.3.mlp.fc1") == 0,
          "re.match anchors at the start: a newer-layout name needs its own entry");
    check(ignores("language_model.model.layers.0.self_attn.q_proj") == 0, "text Linears are FP8");
    check(ignores("language_model.model.layers.0.mlp.down_proj") == 0, "text MLP is FP8");

    check(parse_group("channel", "null",
                      "[\"language_model.lm_head\", \"re:vision_model\\\\.transformer\\\\.\"]",
                      err) == ML_OK,
          "FP8 weight-only, names and an escaped pattern: %s", err);
    check(cfg.quant.act_dynamic_token == 0, "no input quantization");
    check(ignores("language_model.lm_head") == 1 && ignores("lm_head") == 0,
          "a plain entry is an exact name");
    check(ignores("vision_model.transformer.layers.0.mlp.fc2") == 1 &&
              ignores("vision_model.global_transformer.layers.0.mlp.fc2") == 0,
          "a prefix pattern");

    const char *plain = BASE "null}";
    check(ml_config_parse(&cfg, plain, strlen(plain), err, ERRLEN) == ML_OK &&
              cfg.quant.scheme == ML_QUANT_NONE && cfg.quant.n_ignore == 0,
          "null quantization_config: none");
}

static void expect(ml_status got, ml_status want, const char *err, const char *needle,
                   const char *what)
{
    check(got == want && contains(err, needle), "%s: got %s '%s', want %s '%s'", what,
          ml_status_name(got), err, ml_status_name(want), needle);
}

/* The published group with the text `from` replaced by `to` once. */
static ml_status parse_edited(const char *from, const char *to, char *err)
{
    static char quant[4096], edited[4096];
    snprintf(quant, sizeof quant, GROUP_FMT, "channel", DYNAMIC_TOKEN, PUBLISHED_IGNORE);
    const char *at = strstr(quant, from);
    check(at != NULL, "edit: '%s' is in the published text", from);
    if (!at)
        return ML_OK;
    snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - quant), quant, to, at + strlen(from));
    return parse_quant(edited, err);
}

static void test_refusals(void)
{
    const ml_status U = ML_ERR_UNSUPPORTED, F = ML_ERR_FORMAT;
    char err[ERRLEN] = "";
    expect(parse_group("tensor", DYNAMIC_TOKEN, "[]", err), U, err,
           "group_0.weights.strategy: \"tensor\" is not supported (only \"channel\")",
           "per-tensor weight scales");
    expect(parse_group("group", DYNAMIC_TOKEN, "[]", err), U, err, "weights.strategy", "groups");
    expect(parse_edited("\"num_bits\": 8", "\"num_bits\": 4", err), U, err,
           "group_0.weights.num_bits: 4 is not supported", "int4");
    expect(parse_edited("\"type\": \"float\"", "\"type\": \"int\"", err), U, err,
           "weights.type: \"int\"", "int8 weights");
    expect(parse_edited("\"symmetric\": true", "\"symmetric\": false", err), U, err,
           "weights.symmetric: false", "asymmetric");
    expect(parse_edited("\"dynamic\": false", "\"dynamic\": true", err), U, err,
           "weights.dynamic: true", "dynamic weights");
    expect(parse_edited("\"group_size\": null", "\"group_size\": 128", err), U, err,
           "weights.group_size", "group size");
    expect(parse_edited("\"block_structure\": null", "\"block_structure\": [128, 128]", err), U,
           err, "weights.block_structure", "blocks");
    expect(parse_edited("\"actorder\": null", "\"actorder\": \"group\"", err), U, err,
           "weights.actorder", "activation order");
    expect(parse_edited("\"strategy\": \"token\"", "\"strategy\": \"tensor\"", err), U, err,
           "input_activations.strategy: \"tensor\"", "static per-tensor activations");
    expect(parse_edited("\"dynamic\": true", "\"dynamic\": false", err), U, err,
           "input_activations.dynamic: false", "static activation scales");
    expect(parse_edited("\"output_activations\": null", "\"output_activations\": {}", err), U,
           err, "group_0.output_activations", "output quantization");
    expect(parse_edited("[\"Linear\"]", "[\"Linear\", \"Embedding\"]", err), U, err,
           "group_0.targets", "other targets");
    expect(parse_edited("\"kv_cache_scheme\": null", "\"kv_cache_scheme\": {\"num_bits\": 8}",
                        err),
           U, err, "quantization_config.kv_cache_scheme", "FP8 K/V");
    expect(parse_edited("\"sparsity_config\": {}", "\"sparsity_config\": {\"format\": \"2:4\"}",
                        err),
           U, err, "quantization_config.sparsity_config", "sparsity");
    expect(parse_edited("\"float-quantized\"", "\"pack-quantized\"", err), U, err,
           "quantization_config.format: \"pack-quantized\"", "packed int");
    expect(parse_edited("\"compressed-tensors\"", "\"fp8\"", err), U, err,
           "quantization_config.quant_method: \"fp8\"", "other quant methods");
    expect(parse_edited("\"compressed\"", "\"frozen\"", err), U, err,
           "quantization_config.quantization_status: \"frozen\"", "uncompressed weights");
    expect(parse_edited("\"group_0\": {", "\"group_1\": {\"targets\": [\"Linear\"]}, \"group_0\": {",
                        err),
           U, err, "config_groups: 2 groups", "two schemes");
    expect(parse_edited("\"weights\": {", "\"weights\": null, \"w\": {", err), U, err,
           "group_0.weights: weights are not quantized", "activation-only");

    expect(parse_quant("[]", err), F, err, "quantization_config: expected an object", "a list");
    expect(parse_quant("{\"quant_method\": \"compressed-tensors\", \"format\": "
                       "\"float-quantized\"}",
                       err),
           F, err, "config_groups: expected a non-empty object", "no groups");
    expect(parse_quant("{\"format\": \"float-quantized\"}", err), F, err,
           "quant_method: required", "no method");
    expect(parse_edited("\"num_bits\": 8", "\"num_bits\": \"8\"", err), F, err,
           "weights.num_bits: expected an integer, got a string", "bits as a string");
    expect(parse_group("channel", DYNAMIC_TOKEN, "\"re:vision_model.*\"", err), F, err,
           "quantization_config.ignore: expected a list of strings", "ignore as a string");
    expect(parse_group("channel", DYNAMIC_TOKEN, "[1]", err), F, err, "ignore[0]: expected a string",
           "a number");
    expect(parse_group("channel", DYNAMIC_TOKEN, "[\"lm_head\", \"re:(vision\"]", err), F, err,
           "ignore[1]: unbalanced '('", "a broken pattern");
    expect(parse_group("channel", DYNAMIC_TOKEN, "[\"re:(?P<x>a)\"]", err), U, err,
           "ignore[0]: '(?' construct", "a pattern outside the translated subset");
}

static void test_ignore_capacity(void)
{
    /* ML_QUANT_MAX_IGNORE + 1 names: too large, with the field named. */
    const size_t cap = (ML_QUANT_MAX_IGNORE + 1) * 8 + 4096;
    char *list = malloc(cap), *quant = malloc(cap + 4096), *json = malloc(cap + 8192);
    size_t o = (size_t)snprintf(list, cap, "[");
    for (int i = 0; i <= ML_QUANT_MAX_IGNORE; i++)
        o += (size_t)snprintf(list + o, cap - o, "%s\"m%d\"", i ? "," : "", i);
    snprintf(list + o, cap - o, "]");
    snprintf(quant, cap + 4096, GROUP_FMT, "channel", DYNAMIC_TOKEN, list);
    snprintf(json, cap + 8192, BASE "%s}", quant);
    char err[ERRLEN] = "";
    expect(ml_config_parse(&cfg, json, strlen(json), err, ERRLEN), ML_ERR_TOO_LARGE, err,
           "quantization_config.ignore: more than", "ignore over capacity");
    free(list);
    free(quant);
    free(json);
}

int main(void)
{
    test_published();
    test_refusals();
    test_ignore_capacity();
    return check_done();
}
