/* engine/checkpoint/fp8_quant.c and the FP8 binding of engine/checkpoint/weights.c:
 * the quantizer reproduces compressed-tensors bit for bit (its codes and
 * bf16 scales for rows of four decades, zeros, subnormal codes and -0,
 * fixtures/fp8_quant.safetensors from gen_fixtures.py --only fp8); a
 * compressed-tensors checkpoint binds its text-decoder Linears as FP8 with
 * their scales and the ignored ones as bf16; a bf16 checkpoint quantized at
 * load holds exactly the quantizer's codes, and so does lm_head with
 * quant.lm_head_fp8 on either; and an FP8 tensor without a
 * quantization_config is refused by name. */
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "harness.h"
#include "checkpoint/config.h"
#include "checkpoint/fp8_quant.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"

#define ERRLEN 512
#define FIXTURES ML_SOURCE_DIR "/tests/golden/fixtures"
#define FP8_MODEL FIXTURES "/models/m8_fp8_sharded"
#define BF16_MODEL FIXTURES "/models/m7_sharded"

static void test_matches_compressed_tensors(void)
{
    char err[ERRLEN];
    ml_safetensors *st = NULL;
    if (ml_safetensors_open(&st, FIXTURES "/fp8_quant.safetensors", err, ERRLEN) != ML_OK) {
        check(0, "open: %s", err);
        return;
    }
    const ml_tensor_view *w = ml_safetensors_find(st, "weight");
    const ml_tensor_view *q = ml_safetensors_find(st, "quantized");
    const ml_tensor_view *s = ml_safetensors_find(st, "scale");
    check(w && q && s && w->dtype == ML_DTYPE_BF16 && q->dtype == ML_DTYPE_F8_E4M3 &&
              s->dtype == ML_DTYPE_BF16,
          "fixture tensors");
    if (w && q && s) {
        const int64_t rows = w->shape[0], cols = w->shape[1];
        uint16_t *wb = malloc((size_t)(rows * cols) * sizeof *wb), *sb = malloc(rows * 2);
        uint8_t *qb = malloc((size_t)(rows * cols));
        memcpy(wb, w->data, w->nbytes);
        ml_fp8_quantize_rows(wb, rows, cols, qb, sb);
        int bad_q = 0, bad_s = 0;
        for (int64_t i = 0; i < rows * cols; i++)
            bad_q += qb[i] != ((const uint8_t *)q->data)[i];
        for (int64_t r = 0; r < rows; r++) {
            uint16_t want;
            memcpy(&want, (const char *)s->data + 2 * r, sizeof want);
            bad_s += sb[r] != want;
        }
        check(bad_q == 0, "%d of %lld codes differ from compressed-tensors'", bad_q,
              (long long)(rows * cols));
        check(bad_s == 0, "%d of %lld scales differ from compressed-tensors'", bad_s,
              (long long)rows);
        free(wb);
        free(sb);
        free(qb);
    }
    ml_safetensors_destroy(st);
}

/* The checkpoint under dir with its config (quant replaced when at_load). */
static ml_weights *bind(const char *dir, int at_load, ml_checkpoint **ck, ml_config *cfg,
                        ml_status want, const char *needle)
{
    char path[600], err[ERRLEN] = "";
    snprintf(path, sizeof path, "%s/config.json", dir);
    ml_weights *w = NULL;
    if (ml_config_load(cfg, path, err, ERRLEN) != ML_OK ||
        ml_checkpoint_open(ck, dir, err, ERRLEN) != ML_OK) {
        check(0, "%s: %s", dir, err);
        return NULL;
    }
    if (at_load == 1)
        ml_quant_config_fp8_at_load(&cfg->quant);
    if (at_load == -1)
        memset(&cfg->quant, 0, sizeof cfg->quant);
    ml_status rc = ml_weights_create(&w, *ck, cfg, err, ERRLEN);
    check(rc == want && (!needle || strstr(err, needle)), "%s: got %s '%s', want %s '%s'", dir,
          ml_status_name(rc), err, ml_status_name(want), needle ? needle : "");
    return w;
}

static ml_config cfg; /* large: the ignore list */

static void test_bind_compressed(void)
{
    ml_checkpoint *ck = NULL;
    ml_weights *w = bind(FP8_MODEL, 0, &ck, &cfg, ML_OK, NULL);
    if (w) {
        int fp8 = 0, bf16 = 0;
        for (int i = 0; i < w->text.n_layers; i++) {
            const ml_text_layer *L = &w->text.layers[i];
            const ml_weight *ws[] = {L->is_cross ? &L->cross.q_proj : &L->self.q_proj,
                                     L->is_cross ? &L->cross.k_proj : &L->self.k_proj,
                                     L->is_cross ? &L->cross.v_proj : &L->self.v_proj,
                                     L->is_cross ? &L->cross.o_proj : &L->self.o_proj,
                                     &L->gate_proj, &L->up_proj, &L->down_proj};
            for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++)
                fp8 += ws[k]->f8 && ws[k]->scale && !ws[k]->data && ws[k]->scale[0] > 0;
        }
        bf16 += w->text.lm_head.data && !w->text.lm_head.f8;
        bf16 += w->projector_weight.data && !w->projector_weight.f8;
        bf16 += w->vision.layers[0].q_proj.data && !w->vision.layers[0].q_proj.f8;
        check(fp8 == 7 * w->text.n_layers, "%d text Linears FP8 with scales", fp8);
        check(bf16 == 3, "lm_head, projector and vision Linears bf16 (ignored)");
        check(w->bytes_f8 > 0 && w->bytes_scales > 0 && w->bytes_quantized == 0 &&
                  w->n_unused == 0,
              "fp8 %zu bytes, scales %zu, unused %zu", w->bytes_f8, w->bytes_scales,
              w->n_unused);
    }
    ml_weights_destroy(w);
    ml_checkpoint_destroy(ck);

    ck = NULL;
    bind(FP8_MODEL, -1, &ck, &cfg, ML_ERR_FORMAT,
         "has dtype F8_E4M3; weights must be BF16, F16 or F32 (F8_E4M3 needs a "
         "compressed-tensors quantization_config)");
    ml_checkpoint_destroy(ck);
    ck = NULL;
    ml_weights_destroy(bind(BF16_MODEL, 0, &ck, &cfg, ML_OK, NULL));
    ml_checkpoint_destroy(ck);
}

/* Whether x, bound from the bf16 checkpoint tensor `name`, holds exactly
 * the quantizer's codes and scales. */
static int quantized_as_quantizer(const ml_checkpoint *ck, const char *name, const ml_weight *x)
{
    const ml_tensor_view *t = ml_checkpoint_find(ck, name);
    const size_t numel = (size_t)(x->rows * x->cols);
    uint8_t *q = malloc(numel);
    uint16_t *s = malloc((size_t)x->rows * sizeof *s), *wb = malloc(numel * 2);
    memcpy(wb, t->data, numel * 2);
    ml_fp8_quantize_rows(wb, x->rows, x->cols, q, s);
    int same = x->f8 && !x->data && !memcmp(q, x->f8, numel);
    for (int64_t r = 0; x->f8 && r < x->rows; r++)
        same &= x->scale[r] == ml_bf16_to_f32(s[r]);
    free(q);
    free(s);
    free(wb);
    return same;
}

static void test_quantize_at_load(void)
{
    ml_checkpoint *ck = NULL;
    ml_weights *w = bind(BF16_MODEL, 1, &ck, &cfg, ML_OK, NULL);
    if (w) {
        int same = 1, n = 0;
        size_t bytes = 0;
        for (int i = 0; i < w->text.n_layers; i++) {
            const ml_text_layer *L = &w->text.layers[i];
            const ml_weight *ws[] = {&L->gate_proj, &L->up_proj, &L->down_proj};
            for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) {
                char name[128];
                static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
                snprintf(name, sizeof name, "language_model.model.layers.%d.mlp.%s.weight", i,
                         mlp[k]);
                same &= quantized_as_quantizer(ck, name, ws[k]);
                bytes += (size_t)(ws[k]->rows * ws[k]->cols);
                n++;
            }
        }
        check(same && n == 3 * w->text.n_layers, "MLP weights quantized at load as the "
                                                 "quantizer does (%d)", n);
        check(w->bytes_quantized > bytes && w->bytes_f8 == 0, "quantized %zu bytes (MLP %zu)",
              w->bytes_quantized, bytes);
        check(w->text.lm_head.data && !w->text.lm_head.f8 && w->vision.layers[0].fc1_weight.data,
              "lm_head and vision stay bf16");
    }
    ml_weights_destroy(w);
    ml_checkpoint_destroy(ck);
}

/* quant.lm_head_fp8 (model.fp8_lm_head): the FP8 checkpoint's bf16
 * lm_head, which its ignore list names, and the bf16 checkpoint's
 * quantized at load are quantized at bind, codes and scales the
 * quantizer's; the other Linears bind as without it. */
static void test_lm_head_fp8(void)
{
    static const char *const dirs[] = {FP8_MODEL, BF16_MODEL};
    for (int at_load = 0; at_load < 2; at_load++) {
        ml_checkpoint *ck = NULL;
        char path[600], err[ERRLEN] = "";
        snprintf(path, sizeof path, "%s/config.json", dirs[at_load]);
        ml_weights *w = NULL;
        check(ml_config_load(&cfg, path, err, ERRLEN) == ML_OK &&
                  ml_checkpoint_open(&ck, dirs[at_load], err, ERRLEN) == ML_OK,
              "%s: %s", dirs[at_load], err);
        if (at_load)
            ml_quant_config_fp8_at_load(&cfg.quant);
        cfg.quant.lm_head_fp8 = 1;
        check(ml_weights_create(&w, ck, &cfg, err, ERRLEN) == ML_OK, "%s: %s", dirs[at_load],
              err);
        if (w) {
            const ml_weight *h = &w->text.lm_head;
            check(quantized_as_quantizer(ck, "language_model.lm_head.weight", h),
                  "%s: lm_head quantized at load as the quantizer does", dirs[at_load]);
            check(w->bytes_quantized >= (size_t)(h->rows * h->cols) &&
                      (at_load || w->bytes_quantized == (size_t)(h->rows * h->cols)),
                  "%s: %zu bytes quantized at load", dirs[at_load], w->bytes_quantized);
            check(w->projector_weight.data && !w->projector_weight.f8 &&
                      w->vision.layers[0].q_proj.data && w->text.layers[0].gate_proj.f8,
                  "%s: projector and vision bf16, the decoder FP8", dirs[at_load]);
        }
        ml_weights_destroy(w);
        ml_checkpoint_destroy(ck);
    }
}

int main(void)
{
    test_matches_compressed_tensors();
    test_bind_compressed();
    test_quantize_at_load();
    test_lm_head_fp8();
    return check_done();
}
