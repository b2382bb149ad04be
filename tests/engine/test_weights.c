/* engine/checkpoint/weights.h: binding the Mllama tensor set.
 *
 * - A header-only fake of the real Llama-3.2-11B-Vision checkpoint: the
 *   5-shard layout of the hub repository, every tensor with its real name
 *   and shape, data regions left as holes of sparse files (ftruncate), so
 *   21 GB of declared weights cost no disk and are never touched. Bound with
 *   the published 11B config, in both key layouts of engine/model/README.md §6.
 * - A tiny model with real data: F32/F16 -> bf16 conversion, gates,
 *   misaligned BF16 copied, unused tensors counted.
 * - Errors: a missing tensor, a wrong shape, an integer dtype. */
#include "model_test_util.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"
#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"

#define ERRLEN 512
#define CONFIGS ML_SOURCE_DIR "/tests/golden/fixtures/configs/"
#define MAX_TENSORS 1200
#define NAME_LEN 128
/* save_pretrained's default max_shard_size "5GB". */
#define HUB_SHARD_BYTES 5000000000ull

/* ---- the tensor list of a config, in hub names ------------------------- */

typedef struct tensor_list {
    ml_tensor_view t[MAX_TENSORS];
    char names[MAX_TENSORS][NAME_LEN];
    size_t n;
    ml_dtype dtype; /* of every tensor added */
} tensor_list;

static void add(tensor_list *l, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add(tensor_list *l, int ndim, const int64_t *shape, const char *fmt, ...)
{
    if (l->n == MAX_TENSORS) {
        fprintf(stderr, "tensor list full\n");
        exit(2);
    }
    ml_tensor_view *t = &l->t[l->n];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->names[l->n], NAME_LEN, fmt, ap);
    va_end(ap);
    *t = (ml_tensor_view){.name = l->names[l->n], .dtype = l->dtype, .ndim = ndim};
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nbytes = (size_t)ml_tensor_view_numel(t) * ml_dtype_size(l->dtype);
    l->n++;
}
#define ADD1(l, a, ...) add((l), 1, (const int64_t[]){(a)}, __VA_ARGS__)
#define ADD2(l, a, b, ...) add((l), 2, (const int64_t[]){(a), (b)}, __VA_ARGS__)

static void add_vision_layer(tensor_list *l, const ml_vision_config *v, const char *stack, int i,
                             int gated)
{
    const int64_t D = v->hidden_size, I = v->intermediate_size;
    const char *p = "vision_model";
    static const char *const proj[] = {"q", "k", "v", "o"};
    for (int j = 0; j < 4; j++)
        ADD2(l, D, D, "%s.%s.layers.%d.self_attn.%s_proj.weight", p, stack, i, proj[j]);
    ADD2(l, I, D, "%s.%s.layers.%d.mlp.fc1.weight", p, stack, i);
    ADD1(l, I, "%s.%s.layers.%d.mlp.fc1.bias", p, stack, i);
    ADD2(l, D, I, "%s.%s.layers.%d.mlp.fc2.weight", p, stack, i);
    ADD1(l, D, "%s.%s.layers.%d.mlp.fc2.bias", p, stack, i);
    ADD1(l, D, "%s.%s.layers.%d.input_layernorm.weight", p, stack, i);
    ADD1(l, D, "%s.%s.layers.%d.input_layernorm.bias", p, stack, i);
    ADD1(l, D, "%s.%s.layers.%d.post_attention_layernorm.weight", p, stack, i);
    ADD1(l, D, "%s.%s.layers.%d.post_attention_layernorm.bias", p, stack, i);
    if (gated) {
        ADD1(l, 1, "%s.%s.layers.%d.gate_attn", p, stack, i);
        ADD1(l, 1, "%s.%s.layers.%d.gate_ffn", p, stack, i);
    }
}

/* Every tensor of MllamaForConditionalGeneration for cfg (engine/model/README.md §6),
 * text first as in the hub files, so greedy sharding puts the vision tower
 * and the projector in the last shard. */
static void model_tensors(tensor_list *l, const ml_config *cfg, ml_dtype dtype)
{
    l->n = 0;
    l->dtype = dtype;
    const ml_text_config *t = &cfg->text;
    const int64_t D = t->hidden_size, I = t->intermediate_size;
    const int64_t Q = (int64_t)t->num_attention_heads * t->head_dim;
    const int64_t KV = (int64_t)t->num_key_value_heads * t->head_dim;
    const char *m = "language_model.model";
    ADD2(l, t->vocab_size + 8, D, "%s.embed_tokens.weight", m);
    for (int i = 0; i < t->num_hidden_layers; i++) {
        int cross = ml_config_cross_index(cfg, i) >= 0;
        const char *a = cross ? "cross_attn" : "self_attn";
        ADD2(l, Q, D, "%s.layers.%d.%s.q_proj.weight", m, i, a);
        ADD2(l, KV, D, "%s.layers.%d.%s.k_proj.weight", m, i, a);
        ADD2(l, KV, D, "%s.layers.%d.%s.v_proj.weight", m, i, a);
        ADD2(l, D, Q, "%s.layers.%d.%s.o_proj.weight", m, i, a);
        if (cross) {
            ADD1(l, t->head_dim, "%s.layers.%d.cross_attn.q_norm.weight", m, i);
            ADD1(l, t->head_dim, "%s.layers.%d.cross_attn.k_norm.weight", m, i);
            ADD1(l, 1, "%s.layers.%d.cross_attn_attn_gate", m, i);
            ADD1(l, 1, "%s.layers.%d.cross_attn_mlp_gate", m, i);
        }
        ADD2(l, I, D, "%s.layers.%d.mlp.gate_proj.weight", m, i);
        ADD2(l, I, D, "%s.layers.%d.mlp.up_proj.weight", m, i);
        ADD2(l, D, I, "%s.layers.%d.mlp.down_proj.weight", m, i);
        ADD1(l, D, "%s.layers.%d.input_layernorm.weight", m, i);
        ADD1(l, D, "%s.layers.%d.post_attention_layernorm.weight", m, i);
    }
    ADD1(l, D, "%s.norm.weight", m);
    ADD2(l, t->vocab_size, D, "language_model.lm_head.weight");
    ADD2(l, D, cfg->vision.vision_output_dim, "multi_modal_projector.weight");
    ADD1(l, D, "multi_modal_projector.bias");

    const ml_vision_config *v = &cfg->vision;
    const int64_t Dv = v->hidden_size, P = ml_config_num_patches(cfg);
    const int64_t A = ml_config_n_aspect_ratio_ids(cfg), T = v->max_num_tiles;
    add(l, 4, (const int64_t[]){Dv, v->num_channels, v->patch_size, v->patch_size},
        "vision_model.patch_embedding.weight");
    ADD1(l, Dv, "vision_model.class_embedding");
    ADD2(l, P, Dv, "vision_model.gated_positional_embedding.embedding");
    ADD1(l, 1, "vision_model.gated_positional_embedding.gate");
    ADD2(l, A, T * P * Dv, "vision_model.gated_positional_embedding.tile_embedding.weight");
    ADD2(l, A, T * Dv, "vision_model.pre_tile_positional_embedding.embedding.weight");
    ADD1(l, 1, "vision_model.pre_tile_positional_embedding.gate");
    ADD2(l, A, T * Dv, "vision_model.post_tile_positional_embedding.embedding.weight");
    ADD1(l, 1, "vision_model.post_tile_positional_embedding.gate");
    ADD1(l, Dv, "vision_model.layernorm_pre.weight");
    ADD1(l, Dv, "vision_model.layernorm_pre.bias");
    ADD1(l, Dv, "vision_model.layernorm_post.weight");
    ADD1(l, Dv, "vision_model.layernorm_post.bias");
    for (int i = 0; i < v->num_hidden_layers; i++)
        add_vision_layer(l, v, "transformer", i, 0);
    for (int i = 0; i < v->num_global_layers; i++)
        add_vision_layer(l, v, "global_transformer", i, 1);
}

/* Rename every tensor to the transformers >= 4.52 layout. */
static void to_new_layout(tensor_list *l)
{
    static const char *const map[][2] = {
        {"language_model.model.", "model.language_model."},
        {"language_model.lm_head.", "lm_head."},
        {"vision_model.", "model.vision_model."},
        {"multi_modal_projector.", "model.multi_modal_projector."},
    };
    for (size_t i = 0; i < l->n; i++) {
        for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
            size_t len = strlen(map[k][0]);
            if (!strncmp(l->names[i], map[k][0], len)) {
                char tmp[NAME_LEN];
                snprintf(tmp, sizeof tmp, "%s%s", map[k][1], l->names[i] + len);
                memcpy(l->names[i], tmp, NAME_LEN);
                break;
            }
        }
    }
}

static size_t find_index(const tensor_list *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->names[i], name))
            return i;
    fprintf(stderr, "no tensor %s in the list\n", name);
    exit(2);
}

/* ---- the fake 11B ------------------------------------------------------ */

static tensor_list big;

/* Check every shape the model code will read, against engine/model/README.md §6. */
static void check_11b_shapes(const ml_weights *w)
{
    const ml_vision_weights *v = &w->vision;
    check(v->patch_embedding.rows == 1280 && v->patch_embedding.cols == 588,
          "patch conv (1280, 588)");
    check(v->class_embedding.rows == 1 && v->class_embedding.cols == 1280, "class embedding");
    check(v->position_embedding.rows == 1601 && v->position_embedding.cols == 1280, "positions");
    check(v->tile_position_embedding.rows == 9 && v->tile_position_embedding.cols == 8197120,
          "tile embedding (9, 8197120)");
    check(v->pre_tile_embedding.rows == 9 && v->pre_tile_embedding.cols == 5120, "pre tile");
    check(v->post_tile_embedding.rows == 9 && v->post_tile_embedding.cols == 5120, "post tile");
    check(v->layernorm_post_bias.cols == 1280, "layernorm_post bias");
    check(v->n_layers == 32 && v->n_global_layers == 8, "vision layer counts");
    for (int i = 0; i < v->n_layers; i++) {
        const ml_vision_layer *L = &v->layers[i];
        check(!L->is_gated && L->q_proj.rows == 1280 && L->o_proj.cols == 1280 &&
                  L->fc1_weight.rows == 5120 && L->fc1_weight.cols == 1280 &&
                  L->fc2_weight.rows == 1280 && L->fc2_weight.cols == 5120 &&
                  L->fc1_bias.cols == 5120 && L->post_attention_layernorm_bias.cols == 1280 &&
                  L->q_proj.data && L->post_attention_layernorm_bias.data,
              "vision layer %d", i);
    }
    for (int i = 0; i < v->n_global_layers; i++)
        check(v->global_layers[i].is_gated && v->global_layers[i].gate_attn == 0.0f &&
                  v->global_layers[i].k_proj.rows == 1280,
              "global layer %d gated (holes read as 0)", i);
    check(w->projector_weight.rows == 4096 && w->projector_weight.cols == 7680 &&
              w->projector_bias.cols == 4096,
          "projector (4096, 7680)");
    const ml_text_weights *t = &w->text;
    check(t->embed_tokens.rows == 128264 && t->embed_tokens.cols == 4096, "embed (128264, 4096)");
    check(t->lm_head.rows == 128256 && t->lm_head.cols == 4096, "lm_head (128256, 4096)");
    check(t->norm.rows == 1 && t->norm.cols == 4096, "final norm");
    check(t->n_layers == 40, "40 text layers");
    int n_cross = 0;
    for (int i = 0; i < t->n_layers; i++) {
        const ml_text_layer *L = &t->layers[i];
        int want_cross = i % 5 == 3;
        n_cross += L->is_cross;
        check(L->is_cross == want_cross, "layer %d is_cross", i);
        check(L->gate_proj.rows == 14336 && L->gate_proj.cols == 4096 &&
                  L->down_proj.rows == 4096 && L->down_proj.cols == 14336 && L->up_proj.data &&
                  L->input_layernorm.cols == 4096,
              "layer %d mlp", i);
        if (L->is_cross)
            check(L->cross.q_proj.rows == 4096 && L->cross.k_proj.rows == 1024 &&
                      L->cross.v_proj.cols == 4096 && L->cross.o_proj.cols == 4096 &&
                      L->cross.q_norm.cols == 128 && L->cross.k_norm.cols == 128 &&
                      L->self.q_proj.data == NULL,
                  "cross layer %d", i);
        else
            check(L->self.q_proj.rows == 4096 && L->self.k_proj.rows == 1024 &&
                      L->self.v_proj.rows == 1024 && L->self.o_proj.rows == 4096 &&
                      L->self.o_proj.cols == 4096 && L->cross.q_proj.data == NULL,
                  "self layer %d", i);
    }
    check(n_cross == 8, "8 cross layers");
    check(w->n_unused == 0 && w->bytes_converted == 0, "nothing unused, nothing converted");
}

static void test_fake_11b(const char *layout)
{
    char dir[512], path[600], err[ERRLEN];
    ml_config cfg;
    if (ml_config_load(&cfg, CONFIGS "11b.json", &err[0], ERRLEN) != ML_OK) {
        check(0, "11b config: %s", err);
        return;
    }
    model_tensors(&big, &cfg, ML_DTYPE_BF16);
    check(big.n == 906, "the 11B checkpoint has 906 tensors, listed %zu", big.n);
    uint64_t total = 0, gates = 0;
    for (size_t i = 0; i < big.n; i++) {
        total += big.t[i].nbytes;
        gates += ml_tensor_view_numel(&big.t[i]) == 1 ? big.t[i].nbytes : 0;
    }
    fprintf(stderr, "  fake 11B (%s): %zu tensors, %.2f GB declared\n", layout, big.n, total / 1e9);
    check(total > 21.0e9 && total < 21.5e9, "11B is about 21.3 GB of bf16");
    if (!strcmp(layout, "new"))
        to_new_layout(&big);

    ml_scratch_subdir(layout, dir, sizeof dir);
    int n_shards = 0;
    ml_status rc =
        ml_safetensors_write_sharded(dir, big.t, big.n, HUB_SHARD_BYTES, &n_shards, err, ERRLEN);
    check(rc == ML_OK, "write header-only shards: %s", err);
    check(n_shards == 5, "5 shards like the hub repo, got %d", n_shards);
    long long blocks = 0;
    for (int s = 1; s <= n_shards; s++) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, s, n_shards);
        if (stat(path, &sb) == 0)
            blocks += sb.st_blocks;
        else
            check(0, "shard %s exists", path);
    }
    check(blocks * 512 < (4 << 20), "sparse: %lld bytes on disk for 21 GB declared", blocks * 512);

    ml_checkpoint *ck = NULL;
    rc = ml_checkpoint_open(&ck, dir, err, ERRLEN);
    check(rc == ML_OK, "open fake 11B: %s", err);
    if (!ck)
        return;
    check(ml_checkpoint_n_shards(ck) == 5 && ml_checkpoint_count(ck) == big.n, "shards/count");
    ml_weights *w = NULL;
    rc = ml_weights_create(&w, ck, &cfg, err, ERRLEN);
    check(rc == ML_OK, "bind fake 11B: %s", err);
    if (w) {
        check_11b_shapes(w);
        check(w->text.lm_head.data == ml_checkpoint_find(ck, "language_model.lm_head.weight")->data,
              "bf16 weights are borrowed from the mapping");
        check(w->n_bound == big.n && w->bytes_borrowed == total - gates,
              "all %zu tensors bound in place (gates read as floats)", big.n);
        char line[256];
        fprintf(stderr, "  %s\n", ml_weights_summary(w, line, sizeof line));
    }
    ml_weights_destroy(w);
    ml_weights_destroy(NULL);
    ml_checkpoint_destroy(ck);
}

/* ---- a tiny model with data -------------------------------------------- */

static const char tiny_config[] =
    "{\"vision_config\": {\"hidden_size\": 8, \"attention_heads\": 2, \"intermediate_size\": 16,"
    " \"num_hidden_layers\": 2, \"num_global_layers\": 1, \"image_size\": 28, \"patch_size\": 14,"
    " \"max_num_tiles\": 2, \"supported_aspect_ratios\": [[1, 1], [1, 2], [2, 1]],"
    " \"intermediate_layers_indices\": [1], \"vision_output_dim\": 16},"
    " \"text_config\": {\"vocab_size\": 32, \"hidden_size\": 8, \"intermediate_size\": 16,"
    " \"num_hidden_layers\": 3, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"cross_attention_layers\": [1]}}";

static tensor_list tiny;
static unsigned char *tiny_data[MAX_TENSORS]; /* owned per tensor */

/* Element j of tiny tensor i is k/256 with k = tiny_k(i, j) in [-127, 127]:
 * exact in bf16, f16 and f32, so every dtype must bind to the same bf16. */
static int tiny_k(size_t i, size_t j)
{
    return (int)((i * 7 + j * 3) % 255) - 127;
}

static double tiny_value(size_t i, size_t j)
{
    return tiny_k(i, j) / 256.0;
}

/* IEEE half bits of k/256, |k| < 256 (always a normal number or zero). */
static uint16_t f16_of_k(int k)
{
    if (k == 0)
        return 0;
    unsigned a = (unsigned)(k < 0 ? -k : k), p = 0;
    while (a >> (p + 1))
        p++;
    /* a = 2^p · 1.f, value = a · 2^-8: biased exponent p - 8 + 15. */
    uint16_t mant = (uint16_t)((a << (10 - p)) & 0x3ffu);
    return (uint16_t)((k < 0 ? 0x8000u : 0) | ((p + 7u) << 10) | mant);
}

static void tiny_model(ml_config *cfg, ml_dtype dtype)
{
    char err[ERRLEN];
    if (ml_config_parse(cfg, tiny_config, strlen(tiny_config), err, ERRLEN) != ML_OK) {
        fprintf(stderr, "tiny config: %s\n", err);
        exit(2);
    }
    model_tensors(&tiny, cfg, dtype);
    for (size_t i = 0; i < tiny.n; i++) {
        free(tiny_data[i]);
        size_t n = (size_t)ml_tensor_view_numel(&tiny.t[i]);
        tiny_data[i] = malloc(tiny.t[i].nbytes);
        if (!tiny_data[i])
            exit(2);
        for (size_t j = 0; j < n; j++) {
            float f = (float)tiny_value(i, j);
            uint16_t h = dtype == ML_DTYPE_F16 ? f16_of_k(tiny_k(i, j)) : ml_f32_to_bf16(f);
            if (dtype == ML_DTYPE_F32)
                memcpy(tiny_data[i] + 4 * j, &f, sizeof f);
            else
                memcpy(tiny_data[i] + 2 * j, &h, sizeof h);
        }
        tiny.t[i].data = tiny_data[i];
    }
}

static void free_tiny(void)
{
    for (size_t i = 0; i < MAX_TENSORS; i++) {
        free(tiny_data[i]);
        tiny_data[i] = NULL;
    }
}

/* Write the tiny list as model.safetensors in a new scratch dir, bind it. */
static ml_status bind_tiny(const char *sub, const ml_config *cfg, ml_checkpoint **ck,
                           ml_weights **w, char *err)
{
    char dir[512], path[600];
    ml_scratch_subdir(sub, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_SINGLE_FILE);
    *ck = NULL;
    *w = NULL;
    ml_status rc = ml_safetensors_write(path, tiny.t, tiny.n, err, ERRLEN);
    if (rc == ML_OK)
        rc = ml_checkpoint_open(ck, dir, err, ERRLEN);
    if (rc == ML_OK)
        rc = ml_weights_create(w, *ck, cfg, err, ERRLEN);
    return rc;
}

/* Every bound weight of the tiny model holds tiny_value as bf16. */
static void check_tiny_values(const ml_weights *w, const char *what)
{
    const struct {
        const ml_weight *w;
        const char *name;
    } probes[] = {
        {&w->text.embed_tokens, "language_model.model.embed_tokens.weight"},
        {&w->text.layers[1].cross.k_norm, "language_model.model.layers.1.cross_attn.k_norm.weight"},
        {&w->text.layers[2].self.o_proj, "language_model.model.layers.2.self_attn.o_proj.weight"},
        {&w->vision.patch_embedding, "vision_model.patch_embedding.weight"},
        {&w->vision.global_layers[0].fc2_bias,
         "vision_model.global_transformer.layers.0.mlp.fc2.bias"},
        {&w->projector_weight, "multi_modal_projector.weight"},
    };
    for (size_t p = 0; p < sizeof probes / sizeof probes[0]; p++) {
        size_t i = find_index(&tiny, probes[p].name);
        size_t n = (size_t)(probes[p].w->rows * probes[p].w->cols);
        int bad = 0;
        for (size_t j = 0; j < n; j++)
            bad += probes[p].w->data[j] != ml_f32_to_bf16((float)tiny_value(i, j));
        check(n == (size_t)ml_tensor_view_numel(&tiny.t[i]) && bad == 0, "%s: %s values (%d bad)",
              what, probes[p].name, bad);
    }
    size_t g = find_index(&tiny, "language_model.model.layers.1.cross_attn_mlp_gate");
    check(w->text.layers[1].cross.mlp_gate == ml_round_bf16((float)tiny_value(g, 0)),
          "%s: gate read as its bf16 value", what);
    g = find_index(&tiny, "vision_model.global_transformer.layers.0.gate_ffn");
    check(w->vision.global_layers[0].gate_ffn == ml_round_bf16((float)tiny_value(g, 0)),
          "%s: vision gate", what);
}

static void test_tiny_dtypes(void)
{
    static const struct {
        ml_dtype dtype;
        const char *sub;
    } cases[] = {
        {ML_DTYPE_BF16, "tiny_bf16"}, {ML_DTYPE_F32, "tiny_f32"}, {ML_DTYPE_F16, "tiny_f16"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ml_config cfg;
        ml_checkpoint *ck;
        ml_weights *w;
        char err[ERRLEN];
        tiny_model(&cfg, cases[c].dtype);
        /* Round to nearest even on the halfway cases: 1 + 2^-8 -> 1.0,
         * 1 + 3·2^-8 -> 1 + 2^-6. */
        static const float ties[2] = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f};
        size_t norm = find_index(&tiny, "language_model.model.norm.weight");
        if (cases[c].dtype == ML_DTYPE_F32)
            memcpy(tiny_data[norm], ties, sizeof ties);
        ml_status rc = bind_tiny(cases[c].sub, &cfg, &ck, &w, err);
        check(rc == ML_OK, "%s: %s", cases[c].sub, err);
        if (w) {
            check_tiny_values(w, cases[c].sub);
            if (cases[c].dtype == ML_DTYPE_F32)
                check(w->text.norm.data[0] == 0x3f80 && w->text.norm.data[1] == 0x3f82,
                      "f32 -> bf16 rounds half to even: %04x %04x", w->text.norm.data[0],
                      w->text.norm.data[1]);
            int converted = cases[c].dtype != ML_DTYPE_BF16;
            check(converted ? w->bytes_borrowed == 0 && w->bytes_converted > 0
                            : w->bytes_converted == 0 && w->bytes_borrowed > 0,
                  "%s: borrowed %zu converted %zu", cases[c].sub, w->bytes_borrowed,
                  w->bytes_converted);
        }
        ml_weights_destroy(w);
        ml_checkpoint_destroy(ck);
    }
}

/* BF16 data at odd offsets (a hostile but valid file): copied, not borrowed. */
static void test_misaligned(void)
{
    ml_config cfg;
    tiny_model(&cfg, ML_DTYPE_BF16);
    char dir[512], path[600], err[ERRLEN];
    ml_scratch_subdir("misaligned", dir, sizeof dir);
    /* Header by hand: a 1-byte "pad" tensor first shifts every tensor. */
    size_t cap = 1 << 20, len = 0;
    char *json = malloc(cap);
    uint64_t off = 1;
    len += (size_t)snprintf(json + len, cap - len,
                            "{\"pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}");
    for (size_t i = 0; i < tiny.n; i++) {
        const ml_tensor_view *t = &tiny.t[i];
        len += (size_t)snprintf(json + len, cap - len, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[",
                                t->name);
        for (int d = 0; d < t->ndim; d++)
            len += (size_t)snprintf(json + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)t->shape[d]);
        len += (size_t)snprintf(json + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)off, (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    len += (size_t)snprintf(json + len, cap - len, "}");
    while (len % 8) /* keep the data region 8-aligned, so only "pad" shifts it */
        json[len++] = ' ';
    json[len] = '\0';
    size_t size;
    unsigned char *img = ml_st_image(json, UINT64_MAX, off, &size);
    unsigned char *data = img + size - off;
    for (size_t i = 0, o = 1; i < tiny.n; o += tiny.t[i].nbytes, i++)
        memcpy(data + o, tiny.t[i].data, tiny.t[i].nbytes);
    snprintf(path, sizeof path, "%s/%s", dir, ML_CHECKPOINT_SINGLE_FILE);
    ml_write_bytes(path, img, size);
    free(img);
    free(json);

    ml_checkpoint *ck = NULL;
    ml_weights *w = NULL;
    ml_status rc = ml_checkpoint_open(&ck, dir, err, ERRLEN);
    if (rc == ML_OK)
        rc = ml_weights_create(&w, ck, &cfg, err, ERRLEN);
    check(rc == ML_OK, "misaligned: %s", err);
    if (w) {
        check((size_t)((uintptr_t)ml_checkpoint_find(ck, "language_model.model.norm.weight")->data %
                       2) == 1,
              "the file really is misaligned");
        check(w->bytes_borrowed == 0 && w->bytes_converted > 0, "misaligned bf16 copied");
        check(((uintptr_t)w->text.norm.data % 2) == 0, "copies are aligned");
        check_tiny_values(w, "misaligned");
        check(w->n_unused == 1, "the pad tensor counted as unused, got %zu", w->n_unused);
    }
    ml_weights_destroy(w);
    ml_checkpoint_destroy(ck);
}

/* ---- errors ------------------------------------------------------------ */

static void expect_bind_error(const char *sub, ml_status want, const char *needle)
{
    ml_config cfg;
    ml_checkpoint *ck;
    ml_weights *w = (ml_weights *)&cfg;
    char err[ERRLEN] = "";
    if (ml_config_parse(&cfg, tiny_config, strlen(tiny_config), err, ERRLEN) != ML_OK)
        exit(2);
    ml_status rc = bind_tiny(sub, &cfg, &ck, &w, err);
    check(rc == want && w == NULL && strstr(err, needle), "%s: got %s '%s', want %s '%s'", sub,
          ml_status_name(rc), err, ml_status_name(want), needle);
    ml_weights_destroy(w);
    ml_checkpoint_destroy(ck);
}

static void test_errors(void)
{
    ml_config cfg;

    tiny_model(&cfg, ML_DTYPE_BF16);
    size_t k = find_index(&tiny, "language_model.model.layers.1.cross_attn.k_norm.weight");
    tiny.t[k] = tiny.t[--tiny.n];
    expect_bind_error(
        "missing", ML_ERR_NOT_FOUND,
        "checkpoint has no tensor 'language_model.model.layers.1.cross_attn.k_norm.weight'");

    tiny_model(&cfg, ML_DTYPE_BF16);
    size_t q = find_index(&tiny, "language_model.model.layers.0.self_attn.q_proj.weight");
    tiny.t[q].shape[1] = 4;
    tiny.t[q].nbytes /= 2;
    expect_bind_error("wrong_shape", ML_ERR_FORMAT,
                      "tensor language_model.model.layers.0.self_attn.q_proj.weight: shape (8, 4), "
                      "expected (8, 8)");

    tiny_model(&cfg, ML_DTYPE_BF16);
    size_t e = find_index(&tiny, "language_model.model.embed_tokens.weight");
    tiny.t[e].shape[0] = 32; /* vocab rows only: the 8 extra rows are missing */
    tiny.t[e].nbytes = 32 * 8 * 2;
    expect_bind_error(
        "embed_rows", ML_ERR_FORMAT,
        "tensor language_model.model.embed_tokens.weight: shape (32, 8), expected (40, 8)");

    tiny_model(&cfg, ML_DTYPE_BF16);
    size_t c = find_index(&tiny, "vision_model.patch_embedding.weight");
    tiny.t[c].ndim = 2;
    tiny.t[c].shape[1] = 3 * 14 * 14;
    expect_bind_error(
        "flat_conv", ML_ERR_FORMAT,
        "tensor vision_model.patch_embedding.weight: shape (8, 588), expected (8, 3, 14, 14)");

    tiny_model(&cfg, ML_DTYPE_BF16);
    size_t n = find_index(&tiny, "language_model.model.norm.weight");
    tiny.t[n].dtype = ML_DTYPE_I32; /* 8 x 4 bytes: the bf16 bytes of (16) read as (8) int32 */
    tiny.t[n].nbytes = 32;
    tiny_data[n] = realloc(tiny_data[n], 32);
    tiny.t[n].data = tiny_data[n];
    expect_bind_error(
        "int_dtype", ML_ERR_FORMAT,
        "tensor language_model.model.norm.weight has dtype I32; weights must be BF16, F16 or F32");

    tiny_model(&cfg, ML_DTYPE_BF16);
    size_t g = find_index(&tiny, "vision_model.global_transformer.layers.0.gate_attn");
    tiny.t[g].shape[0] = 2;
    tiny.t[g].nbytes = 4;
    tiny_data[g] = realloc(tiny_data[g], 4);
    tiny.t[g].data = tiny_data[g];
    expect_bind_error(
        "gate_shape", ML_ERR_FORMAT,
        "tensor vision_model.global_transformer.layers.0.gate_attn: shape (2), expected (1)");
}

int main(void)
{
    test_fake_11b("legacy");
    test_fake_11b("new");
    test_tiny_dtypes();
    test_misaligned();
    test_errors();
    free_tiny();
    return check_done();
}
