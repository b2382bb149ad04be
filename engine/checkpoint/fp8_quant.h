/* FP8 weight quantization as compressed-tensors performs it for the
 * published "FP8" and "FP8_DYNAMIC" schemes (float8 E4M3, symmetric, one
 * scale per output channel; compressed-tensors 0.8 calculate_qparams and
 * _quantize, the MinMax observer), in the bf16 arithmetic of a bf16 model:
 *   scale[r] = bf16(max(absmax(w[r]), 0) / 448), at least FLT_EPSILON;
 *   q[r][c]  = e4m3(clamp(bf16(w[r][c] / scale[r]) + 0, -448, 448)).
 * Its decompression q · scale is what matmul_f8 computes with (backend.h). Used to quantize a bf16 checkpoint at load
 * (model.weights = "fp8") and by `mllama mkmodel --fp8`.
 * @locality: any thread; no state. */
#ifndef ML_CHECKPOINT_FP8_QUANT_H
#define ML_CHECKPOINT_FP8_QUANT_H

#include <stdint.h>

/* q (rows, cols) F8_E4M3 and scale (rows) bf16 of the bf16 weight w (rows,
 * cols); all caller-owned, any alignment of q. */
void ml_fp8_quantize_rows(const uint16_t *w, int64_t rows, int64_t cols, uint8_t *q,
                          uint16_t *scale);

#endif
