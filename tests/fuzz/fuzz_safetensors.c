/* Fuzz target: bytes -> ml_safetensors_parse (header length, JSON header,
 * every entry and layout check), then a read of every tensor the parser
 * accepted, byte by byte and through ml_tensor_view_read_f32 for the float
 * dtypes (F8_E4M3 included), so a range it should have rejected shows up
 * under ASan. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "checkpoint/safetensors.h"

/* Keeps the reads of tensor bytes from being optimised away. */
static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_safetensors *st = NULL;
    char err[256];
    if (ml_safetensors_parse(&st, data, size, "fuzz", err, sizeof err) != ML_OK)
        return 0;
    unsigned sum = 0;
    for (size_t i = 0; i < ml_safetensors_count(st); i++) {
        const ml_tensor_view *t = ml_safetensors_tensor(st, i);
        const unsigned char *p = t->data;
        for (size_t b = 0; b < t->nbytes; b++)
            sum += p[b];
        if (ml_safetensors_find(st, t->name) != t)
            abort();
        if (!t->nbytes) /* an empty tensor's numel may be a product past int64 */
            continue;
        /* numel x element size == nbytes <= size: bounded by the input */
        float *f = malloc((size_t)ml_tensor_view_numel(t) * sizeof *f);
        if (f && ml_tensor_view_read_f32(t, f, err, sizeof err) == ML_OK)
            sum += f[0] == f[0];
        free(f);
    }
    ml_safetensors_destroy(st);
    sink = sum;
    return 0;
}
