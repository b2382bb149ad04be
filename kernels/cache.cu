/* The K/V caches in bf16 (kv_elem_size 2): kv_write scatters new tokens'
 * K and V rows into paged cache slots, kv_store and kv_store_keys convert a
 * resident cross-attention plane (K keeps its (keys, n_kv_heads, head_dim)
 * layout here: the attention kernels read a key's row). Conversion rounds to nearest even, as
 * ml_f32_to_bf16 does, so a cache written here holds exactly the bf16
 * rounding of the CPU's f32 cache. */
#include "mlk_internal.cuh"

#define CACHE_THREADS 256

/* One thread per (token, element of the n_kv_heads·head_dim row). A
 * negative slot is skipped: padding rows of a fixed-shape (graph) batch. */
__global__ void kv_write_kernel(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                const int32_t *slot, int n_tokens, size_t row)
{
    const size_t n = (size_t)n_tokens * row;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / row, i = e % row;
        const int32_t s = slot[t];
        if (s < 0)
            continue;
        kc[(size_t)s * row + i] = mlk_to_bf16(k[e]);
        vc[(size_t)s * row + i] = mlk_to_bf16(v[e]);
    }
}

void mlk_kv_write(ml_backend *be, void *k_cache, void *v_cache, const float *k, const float *v,
                  const int32_t *slot, int n_tokens, int n_kv_heads, int head_dim)
{
    mlk_backend *b = mlk_of(be);
    if (n_tokens <= 0 || mlk_enter(b))
        return;
    const size_t row = (size_t)n_kv_heads * head_dim;
    const size_t n = (size_t)n_tokens * row;
    mlk_launch(kv_write_kernel, mlk_blocks(n, CACHE_THREADS), CACHE_THREADS, 0,
               b->stream, (uint16_t *)k_cache, (uint16_t *)v_cache, k, v, slot, n_tokens, row);
    mlk_launched(b, "kv_write");
}

__global__ void kv_store_kernel(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = mlk_to_bf16(src[i]);
}

void mlk_kv_store(ml_backend *be, void *dst, const float *src, size_t n)
{
    mlk_backend *b = mlk_of(be);
    if (!n || mlk_enter(b))
        return;
    mlk_launch(kv_store_kernel, mlk_blocks(n, CACHE_THREADS), CACHE_THREADS, 0,
               b->stream, (uint16_t *)dst, src, n);
    mlk_launched(b, "kv_store");
}

void mlk_kv_store_keys(ml_backend *be, void *dst, const float *src, int n_keys, int n_kv_heads,
                       int head_dim)
{
    mlk_kv_store(be, dst, src, (size_t)n_keys * n_kv_heads * head_dim);
}
