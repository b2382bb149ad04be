/* compressed-tensors' FP8 channel quantization (fp8_quant.h). */
#include "checkpoint/fp8_quant.h"

#include <float.h>
#include <math.h>

#include "dtype.h"

void ml_fp8_quantize_rows(const uint16_t *w, int64_t rows, int64_t cols, uint8_t *q,
                          uint16_t *scale)
{
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = w + r * cols;
        float absmax = 0.0f; /* min and max are first clamped through 0 */
        for (int64_t c = 0; c < cols; c++)
            absmax = fmaxf(absmax, fabsf(ml_bf16_to_f32(row[c])));
        /* bf16 tensor / python float, then clamp(min=finfo(float32).eps) */
        const float s = fmaxf(ml_round_bf16(absmax / ML_F8E4M3_MAX), FLT_EPSILON);
        scale[r] = ml_f32_to_bf16(s);
        for (int64_t c = 0; c < cols; c++) {
            /* + 0 as the zero point's addition: -0 becomes +0 */
            const float scaled = ml_round_bf16(ml_bf16_to_f32(row[c]) / s) + 0.0f;
            q[r * cols + c] = ml_f32_to_f8e4m3(scaled);
        }
    }
}
