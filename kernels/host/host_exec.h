/* The CUDA execution model on the host (the MLLAMA_CUDA=HOST build): the
 * kernels of kernels/ compiled by g++ as C++ and executed by the thread that
 * launches them, so that their logic runs in CI without a GPU.
 *
 * A grid runs block by block; a block's threads are cooperative fibers on
 * the launching thread, each with its own stack, switched only at the
 * collectives: __syncthreads() (every thread of the block that has not
 * exited), the warp collectives (every lane of the mask) and thread exit.
 * Between two such points a fiber runs alone, so a block's threads never
 * race on the host; what the schedule order changes is which thread's
 * stretch runs first within each barrier phase (forward, reverse or a
 * seeded shuffle, the same order for the blocks of a grid): a missing
 * barrier then shows as a result that depends on the order.
 *
 * A collective that can never complete (a __syncthreads() some threads skip,
 * a warp collective whose mask names an exited lane, different masks at once
 * in one warp) aborts with the block and the waiting threads: on a GPU it
 * would hang or be undefined.
 *
 * __shared__ variables are thread_local statics: one copy per host thread,
 * which is one per block because a host thread runs one block at a time.
 * Dynamic shared memory is a per-launch buffer of the launch's size
 * (MLK_DYNAMIC_SHARED), malloc'd so that AddressSanitizer sees overruns.
 *
 * @locality: kernels launch from any thread; a grid runs on the thread
 * whose stream operation runs it (the enqueuing thread: streams execute at
 * enqueue, or at graph launch). */
#ifndef MLK_HOST_EXEC_H
#define MLK_HOST_EXEC_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "host_stream.h"

#define MLK_HOST_WARP 32

namespace mlk_host {

/* The running fiber's coordinates. */
struct coords {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
    unsigned lane;       /* thread_idx's linear index % 32 */
    unsigned warp_lanes; /* lanes of this warp that the block has (the last warp may be partial) */
};
/* GNU __thread rather than thread_local: a pointer needs no dynamic
 * initialisation, and a thread_local read from another translation unit
 * goes through C++'s TLS wrapper, whose -fsanitize=null check GCC 12
 * miscompiles (it tests a stale flag: a "null" cur in a fiber that has
 * one). */
extern __thread const coords *cur;

/* Block barrier. */
void syncthreads();
/* Warp barrier over `mask` (which must contain the caller's lane): every
 * lane of the mask contributes `size` bytes at `mine` (size <= 64); returns
 * 32 slots of `size` bytes, slot i holding lane i's contribution (slots of
 * lanes outside the mask are zero). Valid until the caller's next warp
 * collective. */
const unsigned char *warp_gather(unsigned mask, const void *mine, size_t size);
/* As warp_gather, and finish(ctx, slots) runs once when the last lane has
 * arrived, before any lane returns: it may rewrite the slots (a result per
 * lane computed once for the warp). */
const unsigned char *warp_gather_finish(unsigned mask, const void *mine, size_t size,
                                        void (*finish)(void *ctx, unsigned char *slots),
                                        void *ctx);
/* Lanes of the caller's warp that have not exited. */
unsigned active_mask();
/* The launch's dynamic shared memory (16-byte aligned), NULL when it asked
 * for none. */
void *dynamic_smem();

/* One launch as the grid runner sees it; func identifies the kernel (its
 * function attributes, the graph node kind). */
struct launch_config {
    dim3 grid, block;
    size_t smem;
    const void *func;
};
/* cudaSuccess, or the error a device would give this configuration
 * (cudaErrorInvalidConfiguration, cudaErrorInvalidValue for more dynamic
 * shared memory than the kernel's attribute allows). */
cudaError_t launch_check(const launch_config &cfg);
/* Run every thread of every block: `thread` is called once in each fiber. */
void run_grid(const launch_config &cfg, const std::function<void()> &thread);
/* Record an error for cudaGetLastError (host_runtime.cpp). */
void set_last_error(cudaError_t rc);
/* The kernel's cudaFuncAttributeMaxDynamicSharedMemorySize (host_runtime.cpp). */
size_t max_dynamic_smem(const void *func);

/* kernel<<<grid, block, smem, stream>>>(args...): the arguments are
 * converted to the kernel's parameter types and copied now (a captured
 * graph replays these copies), the grid runs through the stream. */
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
    const launch_config cfg{grid, block, smem, (const void *)kernel};
    const cudaError_t rc = launch_check(cfg);
    if (rc != cudaSuccess) {
        set_last_error(rc);
        return;
    }
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    mlk_host_stream_enqueue(
        stream, [cfg, kernel, params]() { run_grid(cfg, [&] { std::apply(kernel, params); }); },
        cfg.func);
}

} /* namespace mlk_host */

/* Every active lane of the caller's warp contributes `mine`; returns when all
 * of their values are in all[] (a warp barrier). */
template <class T>
void mlk_host_warp_exchange(const T &mine, T all[MLK_HOST_WARP])
{
    static_assert(std::is_trivially_copyable<T>::value, "warp exchange of a non-trivial type");
    const unsigned char *slots = mlk_host::warp_gather(mlk_host::active_mask(), &mine, sizeof(T));
    memcpy((void *)all, slots, MLK_HOST_WARP * sizeof(T));
}

/* Every lane of `mask` contributes `mine`; finish(all) runs once for the
 * warp when all have (and may rewrite all[]); each lane returns its own
 * all[lane]. For warp-wide instructions that would be wasteful to compute
 * in every lane (mma). */
template <class T, class F>
T mlk_host_warp_compute(unsigned mask, const T &mine, F &&finish)
{
    static_assert(std::is_trivially_copyable<T>::value, "warp compute of a non-trivial type");
    auto run = [](void *ctx, unsigned char *slots) { (*(F *)ctx)((T *)slots); };
    const unsigned char *slots =
        mlk_host::warp_gather_finish(mask, &mine, sizeof(T), run, (void *)&finish);
    T out;
    memcpy((void *)&out, slots + mlk_host::cur->lane * sizeof(T), sizeof(T));
    return out;
}

/* mlk_warp_xor_reduce (mlk_internal.cuh) over the full warp: for each
 * offset in turn, lane i's value becomes op(its value, lane i ^ o's), as
 * the shuffles compute it, in one collective rather than one per offset. */
template <int... Offsets, class T, class Op>
T mlk_host_warp_xor_reduce(T v, Op op)
{
    return mlk_host_warp_compute(0xffffffffu, v, [&op](T *all) {
        T next[MLK_HOST_WARP];
        for (unsigned o : {(unsigned)Offsets...}) {
            for (unsigned i = 0; i < MLK_HOST_WARP; i++)
                next[i] = op(all[i], all[i ^ o]);
            memcpy((void *)all, next, sizeof next);
        }
    });
}

/* ---- the built-in variables and qualifiers ------------------------------------------ */

#define threadIdx (mlk_host::cur->thread_idx)
#define blockIdx (mlk_host::cur->block_idx)
#define blockDim (mlk_host::cur->block_dim)
#define gridDim (mlk_host::cur->grid_dim)

#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
/* Empty rather than noinline: headers spell the GNU attribute __noinline__. */
#ifndef __noinline__
#define __noinline__
#endif

/* ---- block and warp collectives -------------------------------------------------- */

inline void __syncthreads()
{
    mlk_host::syncthreads();
}

inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    mlk_host::warp_gather(mask, nullptr, 0);
}

inline unsigned __activemask()
{
    return mlk_host::active_mask();
}

inline unsigned __ballot_sync(unsigned mask, int pred)
{
    const int mine = pred != 0;
    const int *all = (const int *)mlk_host::warp_gather(mask, &mine, sizeof mine);
    unsigned bits = 0;
    for (unsigned i = 0; i < MLK_HOST_WARP; i++)
        if ((mask >> i & 1u) && all[i])
            bits |= 1u << i;
    return bits;
}

inline int __any_sync(unsigned mask, int pred)
{
    return __ballot_sync(mask, pred) != 0;
}

inline int __all_sync(unsigned mask, int pred)
{
    return __ballot_sync(mask, pred) == mask;
}

namespace mlk_host {
/* The shuffles: lane `src` of the caller's width-wide segment, or the
 * caller's own value when src falls outside the segment (as on a device). */
template <class T>
T shfl_from(unsigned mask, T v, int src_in_segment, int width, bool in_range)
{
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of this type");
    const T *all = (const T *)warp_gather(mask, &v, sizeof v);
    if (!in_range)
        return v;
    const unsigned base = cur->lane & ~(unsigned)(width - 1);
    return all[base + ((unsigned)src_in_segment & (unsigned)(width - 1))];
}
} /* namespace mlk_host */

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = MLK_HOST_WARP)
{
    return mlk_host::shfl_from(mask, v, src, width, true);
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = MLK_HOST_WARP)
{
    const int in_seg = (int)(mlk_host::cur->lane & (unsigned)(width - 1));
    const int src = in_seg ^ lane_mask;
    return mlk_host::shfl_from(mask, v, src, width, src < width);
}

template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = MLK_HOST_WARP)
{
    const int in_seg = (int)(mlk_host::cur->lane & (unsigned)(width - 1));
    return mlk_host::shfl_from(mask, v, in_seg - (int)delta, width, in_seg >= (int)delta);
}

template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = MLK_HOST_WARP)
{
    const int in_seg = (int)(mlk_host::cur->lane & (unsigned)(width - 1));
    return mlk_host::shfl_from(mask, v, in_seg + (int)delta, width, in_seg + (int)delta < width);
}

/* ---- atomics (host atomics: blocks of other launches may run on other threads) ---- */

template <class T>
T atomicAdd(T *addr, T v)
{
    static_assert(std::is_integral<T>::value, "atomicAdd of this type");
    return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED);
}

inline float atomicAdd(float *addr, float v)
{
    uint32_t *bits = (uint32_t *)addr;
    uint32_t old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    for (;;) {
        float f;
        memcpy(&f, &old, sizeof f);
        f += v;
        uint32_t next;
        memcpy(&next, &f, sizeof next);
        if (__atomic_compare_exchange_n(bits, &old, next, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            memcpy(&f, &old, sizeof f);
            return f;
        }
    }
}

/* ---- intrinsics, with the device's rounding ------------------------------------------ */
/* The _rn forms are one IEEE operation rounded to nearest even: the HOST
 * build compiles kernels with -ffp-contract=off, so nothing fuses them (on
 * the device they exist to forbid that fusion). */

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

/* The device's __expf is ex2.approx(x · log2 e) with the product rounded to
 * f32: that rounding, amplified by |x|, is its dominant error, reproduced
 * here; the 2^y itself is exact to the last bit on the host, ~2 ulp on the
 * device. */
inline float __expf(float x)
{
    return exp2f(__fmul_rn(x, (float)M_LOG2E));
}

inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* cvt.rni.u64.f64: nearest even, NaN to 0, saturated to [0, 2^64 - 1]. */
inline unsigned long long __double2ull_rn(double x)
{
    if (std::isnan(x) || x <= 0.0)
        return 0;
    if (x >= 18446744073709551616.0)
        return ~0ull;
    return (unsigned long long)nearbyint(x);
}

inline int __clzll(long long x)
{
    return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}

/* The device's integer min and max (float ones are fminf and fmaxf). */
#define MLK_HOST_MINMAX(T)                  \
    inline T min(T a, T b) { return a < b ? a : b; } \
    inline T max(T a, T b) { return a > b ? a : b; }
MLK_HOST_MINMAX(int)
MLK_HOST_MINMAX(unsigned)
MLK_HOST_MINMAX(long)
MLK_HOST_MINMAX(unsigned long)
MLK_HOST_MINMAX(long long)
MLK_HOST_MINMAX(unsigned long long)
#undef MLK_HOST_MINMAX

template <class T>
T __ldg(const T *p)
{
    return *p;
}

/* extern __shared__ T name[]: this launch's dynamic shared memory. */
#define MLK_DYNAMIC_SHARED(type, name) type *const name = (type *)mlk_host::dynamic_smem()

#endif
