/* Part of test_lora (one executable, test_lora.h): adapter_config.json,
 * PEFT's target matching (suffixes, regular expressions, all-linear,
 * exclude_modules), scales and the features refused. */
#include <string.h>

#include "harness.h"
#include "model/lora.h"
#include "test_lora.h"

static ml_lora_config *parse(const char *json, ml_status want, const char *needle)
{
    char err[512] = "";
    ml_lora_config *c = NULL;
    ml_status st = ml_lora_config_parse(&c, json, strlen(json), err, sizeof err);
    check(st == want, "config %s: status %s, want %s (%s)", json, ml_status_name(st),
          ml_status_name(want), err);
    if (needle)
        check(strstr(err, needle) != NULL, "config %s: message '%s' lacks '%s'", json, err,
              needle);
    return c;
}

void test_config(void)
{
    const char *q = "language_model.model.layers.0.self_attn.q_proj";
    const char *vq = "vision_model.transformer.layers.3.self_attn.q_proj";
    const char *xk = "language_model.model.layers.1.cross_attn.k_proj";
    const char *head = "language_model.lm_head";

    /* Lists: suffix matching at dot boundaries, as PEFT. */
    ml_lora_config *c = parse("{\"r\": 16, \"lora_alpha\": 32, \"target_modules\": "
                              "[\"q_proj\", \"layers.1.cross_attn.k_proj\"]}",
                              ML_OK, NULL);
    if (c) {
        check(ml_lora_config_rank(c) == 16 && ml_lora_config_scale(c) == 2.0f, "r and scale");
        check(ml_lora_config_targets(c, q) && ml_lora_config_targets(c, vq), "suffix q_proj");
        check(ml_lora_config_targets(c, xk), "dotted suffix");
        check(!ml_lora_config_targets(c, "language_model.model.layers.0.self_attn.xq_proj"),
              "a suffix must start at a dot");
        check(!ml_lora_config_targets(c, head), "lm_head not targeted");
    }
    ml_lora_config_destroy(c);

    /* rsLoRA and defaults (r 8, alpha 8). */
    c = parse("{\"r\": 4, \"lora_alpha\": 12, \"use_rslora\": true, \"target_modules\": "
              "[\"v_proj\"]}",
              ML_OK, NULL);
    check(c && ml_lora_config_scale(c) == 6.0f, "rslora scale 12/sqrt(4)");
    ml_lora_config_destroy(c);
    c = parse("{\"target_modules\": [\"v_proj\"]}", ML_OK, NULL);
    check(c && ml_lora_config_rank(c) == 8 && ml_lora_config_scale(c) == 1.0f, "defaults");
    ml_lora_config_destroy(c);

    /* Regular expressions: full match, the translated subset. */
    c = parse("{\"target_modules\": \".*language_model.*\\\\.(?:q_proj|k_proj)\"}", ML_OK, NULL);
    check(c && ml_lora_config_targets(c, q) && ml_lora_config_targets(c, xk) &&
              !ml_lora_config_targets(c, vq),
          "regex restricted to the language model");
    ml_lora_config_destroy(c);
    c = parse("{\"target_modules\": \"q_proj\"}", ML_OK, NULL);
    check(c && !ml_lora_config_targets(c, q), "a regex must match the whole name");
    ml_lora_config_destroy(c);
    c = parse("{\"target_modules\": \".*layers\\\\.\\\\d\\\\.self_attn\\\\.q_proj\"}", ML_OK, NULL);
    check(c && ml_lora_config_targets(c, q) &&
              !ml_lora_config_targets(c, "language_model.model.layers.10.self_attn.q_proj"),
          "\\d is one digit");
    ml_lora_config_destroy(c);
    c = parse("{\"target_modules\": \".*?lm_hea[a-z]\"}", ML_OK, NULL);
    check(c && ml_lora_config_targets(c, head), "lazy quantifier and a set");
    ml_lora_config_destroy(c);

    /* all-linear: everything but the output layer; exclude_modules. */
    c = parse("{\"target_modules\": \"ALL-LINEAR\", \"exclude_modules\": [\"k_proj\"]}", ML_OK,
              NULL);
    check(c && ml_lora_config_targets(c, q) && ml_lora_config_targets(c, vq) &&
              !ml_lora_config_targets(c, head) && !ml_lora_config_targets(c, xk),
          "all-linear minus lm_head minus excluded");
    ml_lora_config_destroy(c);

    /* Refused. */
    parse("{\"target_modules\": [\"q_proj\"], \"rank_pattern\": {\"q_proj\": 4}}",
          ML_ERR_UNSUPPORTED, "rank_pattern");
    parse("{\"target_modules\": [\"q_proj\"], \"alpha_pattern\": {\"q_proj\": 4}}",
          ML_ERR_UNSUPPORTED, "alpha_pattern");
    parse("{\"target_modules\": [\"q_proj\"], \"modules_to_save\": [\"lm_head\"]}",
          ML_ERR_UNSUPPORTED, "modules_to_save");
    parse("{\"target_modules\": [\"q_proj\"], \"use_dora\": true}", ML_ERR_UNSUPPORTED,
          "use_dora");
    parse("{\"target_modules\": [\"q_proj\"], \"bias\": \"all\"}", ML_ERR_UNSUPPORTED, "bias");
    parse("{\"target_modules\": [\"q_proj\"], \"layers_to_transform\": 0}", ML_ERR_UNSUPPORTED,
          "layers_to_transform");
    parse("{\"target_modules\": [\"q_proj\"], \"peft_type\": \"LOHA\"}", ML_ERR_UNSUPPORTED,
          "peft_type");
    parse("{\"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"pissa_niter_4\"}",
          ML_ERR_UNSUPPORTED, "init_lora_weights");
    parse("{\"target_modules\": \"(?=q)q_proj\"}", ML_ERR_UNSUPPORTED, "(?");
    parse("{\"target_modules\": \"q_proj{2}\"}", ML_ERR_UNSUPPORTED, "repetition");
    parse("{\"target_modules\": \"\\\\bq\"}", ML_ERR_UNSUPPORTED, "escape");
    /* Malformed. */
    parse("{\"r\": 8}", ML_ERR_FORMAT, "target_modules: required");
    parse("{\"target_modules\": []}", ML_ERR_FORMAT, "empty");
    parse("{\"target_modules\": [\"q_proj\", 3]}", ML_ERR_FORMAT, "target_modules[1]");
    parse("{\"target_modules\": [\"q\"], \"r\": 0}", ML_ERR_FORMAT, "r:");
    parse("{\"target_modules\": [\"q\"], \"r\": 2.5}", ML_ERR_FORMAT, "r:");
    parse("{\"target_modules\": [\"q\"], \"lora_alpha\": \"16\"}", ML_ERR_FORMAT, "lora_alpha");
    parse("{\"target_modules\": \"(q_proj\"}", ML_ERR_FORMAT, "unbalanced");
    parse("{\"target_modules\": \"*q\"}", ML_ERR_FORMAT, "nothing to repeat");
    parse("[1, 2]", ML_ERR_FORMAT, "JSON object");
    /* Features that are off are fine, as PEFT writes them. */
    c = parse("{\"target_modules\": [\"q_proj\"], \"rank_pattern\": {}, \"use_dora\": false, "
              "\"modules_to_save\": null, \"layers_to_transform\": null, \"loftq_config\": {}, "
              "\"megatron_core\": \"megatron.core\", \"init_lora_weights\": \"gaussian\", "
              "\"some_future_field\": 3}",
              ML_OK, NULL);
    ml_lora_config_destroy(c);
}
