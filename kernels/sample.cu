/* The sample op (backend.h): sample.h's pipeline for each row of a step's
 * logits, one block of SAMPLE_THREADS threads per row, without sorting the
 * vocabulary, with results bit-identical from run to run.
 *
 * Every filter of the pipeline keeps a prefix of the tokens in rank order
 * (top-k, top-p, min-p and the negligible-mass floor), and the draw looks for
 * one token of that prefix. So each step is one question: which token is the
 * first, in rank order, at which a running count or probability mass passes
 * a target? A token's place in rank order is a 64-bit integer, its "rank
 * code": the order-preserving bits of its logit above the complement of its
 * id (higher logit first, lower id on ties; NaN lowest). The question is
 * answered by radix selection over rank codes (select_crossing):
 *   1. one pass histograms the tokens of the current code range into
 *      SAMPLE_BINS equal slices of it, counting tokens and summing their
 *      masses (exp((z - max) / temperature));
 *   2. a block scan over the bins finds the slice where the running total
 *      passes the target; it becomes the new range (11 bits narrower, and
 *      clamped to the lowest and highest code the pass saw, so that a
 *      class of tied logits goes straight to the bits of its ids);
 *   3. once the tokens ranked at or before the slice (or the slice alone)
 *      fit in shared memory, one pass gathers them and each thread finds
 *      its own token's running total by summing the gathered tokens ranked
 *      before it: the token where the total passes the target is the
 *      answer, ties at the exact logit resolved by id through the code.
 * A gathered prefix stays resident, so the selections after it (top-p and
 * the draw after a small top-k; the logprobs' top ids) run in shared
 * memory without another pass.
 *
 * Masses are integers: the best token weighs 2^mass_bits, the most that
 * keeps a row's total under 2^63 (46 bits for Llama 3's vocabulary).
 * Integer sums do not depend on the order of the atomics, so the op is
 * deterministic, and the rounding (half a unit a token, under 2^-30 of a
 * row's total) is far below the float resolution the CPU reference works
 * at. The raw log-softmax sum is a double sum per thread
 * in a fixed order followed by a fixed reduction tree. Where sample.c
 * rounds (bias, penalties, the floor and min-p thresholds, 1/temperature), this
 * file rounds the same way, with explicit _rn intrinsics so that nvcc does
 * not fuse them into FMAs: the candidate sets and the greedy token are the
 * CPU's exactly. The exps differ by an ulp or two (CUDA's expf against
 * sample.c's polynomial), so a draw can differ from the CPU's only when u
 * lies within rounding of a boundary of the cumulative distribution.
 *
 * Cost of a row of 128256 logits, in passes over the row (501 KB, from L2
 * after the first), as counted in a host emulation of this file (the
 * kernel body on 1024 host threads): greedy 1 (2 with a bias or penalties:
 * the copy); a draw with temperature only 3-4; with top-p and/or min-p 6; with
 * top-k 50 and top-p 3, everything after the top-k in shared memory;
 * greedy with 20 top logprobs 4; a constrained row (a mask) adds the copy
 * it is applied on, as penalties do. Rows where thousands of logits tie at the
 * crossing also walk the ids: up to 9. The bound is 7 passes a selection
 * (64 bits at 11 a level, then a gather), about 30 in all. Each pass is a
 * coalesced read by the 1024 threads of one SM, plus shared-memory atomics
 * for the tokens in range; rows run on separate SMs. One SM reading a row
 * from L2 at 100-200 GB/s puts a pass at 3-5 us: a guess, not a
 * measurement. */
#include <cfloat>
#include <climits>
#include <cmath>

#include "mlk_internal.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
/* Slices per histogram level: 11 bits of the 64-bit rank code per pass. */
#define SAMPLE_BIN_BITS 11
#define SAMPLE_BINS (1 << SAMPLE_BIN_BITS)
#define SAMPLE_BINS_PER_THREAD (SAMPLE_BINS / SAMPLE_THREADS)
/* Tokens gathered into shared memory: one per thread. */
#define SAMPLE_GATHER_CAP SAMPLE_THREADS
/* resident_lo when nothing is resident (above every rank code). */
#define SAMPLE_NONE_RESIDENT ULLONG_MAX

typedef unsigned long long u64;

static_assert(SAMPLE_BINS % SAMPLE_THREADS == 0, "bins split evenly over the threads");

typedef struct sample_smem {
    unsigned int count[SAMPLE_BINS]; /* tokens per slice */
    u64 mass[SAMPLE_BINS];           /* fixed-point mass per slice */
    u64 gather_code[SAMPLE_GATHER_CAP];
    u64 gather_mass[SAMPLE_GATHER_CAP];
    unsigned int n_gather;
    u64 reduce[SAMPLE_WARPS]; /* one partial per warp */
    double reduce_f64[SAMPLE_WARPS];
    /* The slice or token a selection found, broadcast to the block. */
    unsigned int found_bin;
    u64 found_mass_before, found_count_before, found_code;
    ml_sample_row row;
} sample_smem;

/* ---- rank codes ------------------------------------------------------------------- */

/* Order-preserving bits of a logit: a larger key is a larger float; -0 is
 * +0 (they compare equal, so the id decides), NaN is 0, below -inf. */
__device__ __forceinline__ uint32_t rank_key(float z)
{
    if (isnan(z))
        return 0;
    const uint32_t b = __float_as_uint(z == 0.0f ? 0.0f : z);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float key_value(uint32_t key)
{
    return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

/* sample.h's strict rank order as one integer: higher logit first, then the
 * lower id. */
__device__ __forceinline__ u64 rank_code(float z, int id)
{
    return (u64)rank_key(z) << 32 | (uint32_t)~(uint32_t)id;
}

__device__ __forceinline__ int code_id(u64 code)
{
    return (int)~(uint32_t)code;
}

/* The lowest code of a token with logit z: "logit >= z" is "code >= this". */
__device__ __forceinline__ u64 code_floor(float z)
{
    return (u64)rank_key(z) << 32;
}

/* ---- block reductions (every thread gets the result; fixed order) ------------------- */

/* op over v of every thread: a butterfly within each warp, then the warps'
 * partials in warp order; slots are SAMPLE_WARPS entries of shared memory.
 * The order is fixed, so a float sum is the same on every run. */
template <typename T, typename Op> __device__ T block_reduce(T *slots, T v, Op op)
{
    v = mlk_warp_xor_reduce<16, 8, 4, 2, 1>(v, op);
    if (threadIdx.x % 32 == 0)
        slots[threadIdx.x / 32] = v;
    __syncthreads();
    T r = slots[0];
    for (int w = 1; w < SAMPLE_WARPS; w++)
        r = op(r, slots[w]);
    __syncthreads();
    return r;
}

struct op_max_u64 {
    __device__ u64 operator()(u64 a, u64 b) const { return b > a ? b : a; }
};

__device__ u64 block_max_u64(sample_smem &sm, u64 v)
{
    return block_reduce(sm.reduce, v, op_max_u64());
}

__device__ u64 block_sum_u64(sample_smem &sm, u64 v)
{
    return block_reduce(sm.reduce, v, mlk_op_add());
}

__device__ double block_sum_f64(sample_smem &sm, double v)
{
    return block_reduce(sm.reduce_f64, v, mlk_op_add());
}

/* Exclusive prefix sum of v over the threads in order; the sum of all in
 * *total. */
__device__ u64 block_scan_u64(sample_smem &sm, u64 v, u64 *total)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    u64 x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    if (lane == 31)
        sm.reduce[warp] = x;
    __syncthreads();
    u64 base = 0, all = 0;
    for (int w = 0; w < SAMPLE_WARPS; w++) {
        base += w < warp ? sm.reduce[w] : 0;
        all += sm.reduce[w];
    }
    __syncthreads();
    *total = all;
    return base + x - v;
}

/* ---- the token set a selection runs over ---------------------------------------------- */

/* Logits z (vocab) and how a token weighs in mass mode: exp((z - zmax) *
 * inv_t) in units of 2^-mass_bits (scale = 2^mass_bits; 0: no masses, the
 * raw set of the logprobs, which is only counted). */
typedef struct sample_set {
    const float *z; /* (vocab) penalised or raw; plain loads: the copy is written in-kernel */
    int vocab;
    float zmax, inv_t;
    double scale;
} sample_set;

/* sample.c's exp_scaled argument, rounded as it rounds (no FMA). z <= zmax,
 * so the exp is at most the best token's 1; the clamp only tames invalid
 * controls (a NaN temperature). */
__device__ __forceinline__ u64 token_mass(const sample_set &s, float z)
{
    if (s.scale == 0.0)
        return 1;
    const float e = expf(__fmul_rn(__fsub_rn(z, s.zmax), s.inv_t));
    return __double2ull_rn((double)fminf(fmaxf(e, 0.0f), 1.0f) * s.scale);
}

/* What a selection looks for: the first token in rank order at which the
 * running total passes a target computed from the set's total. */
typedef enum sample_goal_kind {
    GOAL_COUNT, /* the param-th token (top-k, top ids); by count */
    GOAL_REACH, /* top-p: the first whose running mass is >= param * total */
    GOAL_EXCEED /* the draw: the first whose running mass is > param * total */
} sample_goal_kind;

typedef struct sample_goal {
    sample_goal_kind kind;
    double param; /* k, top_p or u */
} sample_goal;

/* The goal as "the first token whose running total exceeds t", t in
 * [0, total - 1] for a set of total >= 1: with integer totals, cum >= x is
 * cum > ceil(x) - 1 and cum > x is cum > floor(x). The rounding to an
 * integer is done in double, the - 1 in integers: a total is up to 2^63,
 * where a double cannot hold ceil(x) - 1 (a uniform row's top-p target
 * falls exactly on a token's running total). Out-of-range params clamp to
 * the first or last token. */
__device__ u64 goal_threshold(const sample_goal &g, u64 total)
{
    const double x = g.kind == GOAL_COUNT ? g.param
                     : g.kind == GOAL_REACH ? ceil(g.param * (double)total)
                                            : floor(g.param * (double)total);
    const u64 minus = g.kind == GOAL_EXCEED ? 0 : 1;
    if (!(x > 0.0))
        return 0;
    if (!(x < (double)total))
        return total - 1;
    const u64 t = (u64)x - minus; /* x is a whole number >= 1 */
    return t < total ? t : total - 1;
}

/* The weight a goal counts a gathered token with. */
__device__ __forceinline__ u64 goal_weight(const sample_goal &g, u64 mass)
{
    return g.kind == GOAL_COUNT ? 1 : mass;
}

/* ---- passes ----------------------------------------------------------------------------- */

/* Histogram the tokens with code in [lo, hi] into slices of 2^shift codes
 * counted from hi (slice 0 ranks first); the lowest and highest code among
 * them into *seen_lo, *seen_hi. Out of line, as select_crossing. */
__device__ __noinline__ void histogram_pass(sample_smem &sm, const sample_set &s, u64 lo, u64 hi,
                                            int shift, bool masses, u64 *seen_lo, u64 *seen_hi)
{
    u64 low = ULLONG_MAX, high = 0;
    for (int b = threadIdx.x; b < SAMPLE_BINS; b += SAMPLE_THREADS) {
        sm.count[b] = 0;
        sm.mass[b] = 0;
    }
    __syncthreads();
#pragma unroll 4
    for (int i = threadIdx.x; i < s.vocab; i += SAMPLE_THREADS) {
        const float z = s.z[i];
        const u64 code = rank_code(z, i);
        if (code < lo || code > hi)
            continue;
        low = code < low ? code : low;
        high = code > high ? code : high;
        const unsigned int bin = (unsigned int)((hi - code) >> shift);
        atomicAdd(&sm.count[bin], 1u);
        if (masses)
            atomicAdd(&sm.mass[bin], token_mass(s, z));
    }
    *seen_hi = block_max_u64(sm, high); /* its barriers also complete the histogram */
    *seen_lo = ~block_max_u64(sm, ~low);
}

/* Copy the tokens with code in [lo, hi] (at most SAMPLE_GATHER_CAP of them:
 * the caller has counted) into gather_code / gather_mass, in no particular
 * order: everything computed from them is order-independent. */
__device__ void gather_pass(sample_smem &sm, const sample_set &s, u64 lo, u64 hi)
{
    if (threadIdx.x == 0)
        sm.n_gather = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < s.vocab; i += SAMPLE_THREADS) {
        const float z = s.z[i];
        const u64 code = rank_code(z, i);
        if (code < lo || code > hi)
            continue;
        const unsigned int at = atomicAdd(&sm.n_gather, 1u);
        if (at < SAMPLE_GATHER_CAP) {
            sm.gather_code[at] = code;
            sm.gather_mass[at] = token_mass(s, z);
        }
    }
    __syncthreads();
}

__device__ __forceinline__ unsigned int gathered(const sample_smem &sm)
{
    return sm.n_gather < SAMPLE_GATHER_CAP ? sm.n_gather : SAMPLE_GATHER_CAP;
}

/* Total weight (or count) of the gathered tokens with code >= lo. */
__device__ u64 gathered_total(sample_smem &sm, u64 lo, const sample_goal &g)
{
    const unsigned int t = threadIdx.x;
    const u64 w = t < gathered(sm) && sm.gather_code[t] >= lo
                      ? goal_weight(g, sm.gather_mass[t])
                      : 0;
    return block_sum_u64(sm, w);
}

/* Among the gathered tokens with code >= lo, the one at which `before` plus
 * the running weight in rank order first exceeds t; its code. Each thread
 * sums the weights ranked before its own token: O(n^2) over at most
 * SAMPLE_GATHER_CAP tokens, with no sort and no order dependence. */
__device__ u64 gathered_crossing(sample_smem &sm, u64 lo, const sample_goal &g, u64 before, u64 t)
{
    const unsigned int n = gathered(sm), me = threadIdx.x;
    if (me == 0)
        sm.found_code = lo; /* replaced below: exactly one token crosses */
    __syncthreads();
    if (me < n && sm.gather_code[me] >= lo) {
        const u64 code = sm.gather_code[me];
        u64 run = before;
        for (unsigned int j = 0; j < n; j++)
            if (sm.gather_code[j] > code)
                run += goal_weight(g, sm.gather_mass[j]);
        const u64 w = goal_weight(g, sm.gather_mass[me]);
        if (run <= t && t < run + w)
            sm.found_code = code;
    }
    __syncthreads();
    return sm.found_code;
}

/* A selection over tokens already gathered (codes >= lo of a resident
 * prefix). */
__device__ u64 resident_select(sample_smem &sm, u64 lo, const sample_goal &g)
{
    const u64 total = gathered_total(sm, lo, g);
    if (total == 0 || (g.kind == GOAL_COUNT && total <= (u64)g.param))
        return lo; /* no cut */
    return gathered_crossing(sm, lo, g, 0, goal_threshold(g, total));
}

/* The token of the set's codes [lo, hi] (hi: its best token's code) at
 * which the goal is met; its code. For GOAL_COUNT when the set has no more
 * than k tokens: lo (nothing is cut). *resident_lo: the tokens with codes
 * in [*resident_lo, hi] are gathered (SAMPLE_NONE_RESIDENT: none); updated.
 * hint: an upper bound on the set's size when known (else UINT_MAX).
 * Out of line, as histogram_pass: inlined, they push the kernel past the 64
 * registers a 1024-thread block allows and it spills (ptxas -v: none
 * this way). */
__device__ __noinline__ u64 select_crossing(sample_smem &sm, const sample_set &s, u64 lo, u64 hi,
                                           const sample_goal &g, unsigned int hint,
                                           u64 *resident_lo)
{
    if (lo > hi)
        lo = hi; /* invalid controls (min_p > 1): keep the best token */
    if (lo >= *resident_lo)
        return resident_select(sm, lo, g);
    if (hint <= SAMPLE_GATHER_CAP) {
        gather_pass(sm, s, lo, hi);
        *resident_lo = lo;
        return resident_select(sm, lo, g);
    }
    const bool masses = g.kind != GOAL_COUNT && s.scale != 0.0;
    const u64 top = hi;
    u64 mass_before = 0, count_before = 0, t = 0;
    for (int level = 0;; level++) {
        const u64 width = hi - lo;
        const int bits = width ? 64 - __clzll((long long)width) : 0;
        const int shift = bits > SAMPLE_BIN_BITS ? bits - SAMPLE_BIN_BITS : 0;
        u64 seen_lo, seen_hi;
        histogram_pass(sm, s, lo, hi, shift, masses, &seen_lo, &seen_hi);

        /* Thread i owns slices [i * PER, (i + 1) * PER). */
        const int first_bin = threadIdx.x * SAMPLE_BINS_PER_THREAD;
        u64 my_count = 0, my_mass = 0;
        for (int k = 0; k < SAMPLE_BINS_PER_THREAD; k++) {
            my_count += sm.count[first_bin + k];
            my_mass += masses ? sm.mass[first_bin + k] : sm.count[first_bin + k];
        }
        u64 count_total, mass_total;
        u64 count_excl = block_scan_u64(sm, my_count, &count_total);
        u64 mass_excl = block_scan_u64(sm, my_mass, &mass_total);
        if (level == 0) {
            if (count_total <= SAMPLE_GATHER_CAP) {
                gather_pass(sm, s, lo, hi);
                *resident_lo = lo;
                return resident_select(sm, lo, g);
            }
            if (mass_total == 0 || (g.kind == GOAL_COUNT && mass_total <= (u64)g.param))
                return lo;
            t = goal_threshold(g, mass_total);
        }
        /* The slice where mass_before + the running mass first exceeds t:
         * exactly one (the crossing lies in [lo, hi]). */
        if (threadIdx.x == 0) {
            sm.found_bin = 0;
            sm.found_mass_before = 0;
            sm.found_count_before = 0;
        }
        __syncthreads();
        for (int k = 0; k < SAMPLE_BINS_PER_THREAD; k++) {
            const int b = first_bin + k;
            const u64 c = sm.count[b], m = masses ? sm.mass[b] : c;
            if (mass_before + mass_excl <= t && t < mass_before + mass_excl + m) {
                sm.found_bin = b;
                sm.found_mass_before = mass_excl;
                sm.found_count_before = count_excl;
            }
            mass_excl += m;
            count_excl += c;
        }
        __syncthreads();
        const unsigned int bin = sm.found_bin;
        const unsigned int bin_count = sm.count[bin];
        mass_before += sm.found_mass_before;
        count_before += sm.found_count_before;
        __syncthreads(); /* everyone has read the histogram */

        hi -= (u64)bin << shift;
        const u64 span = (1ull << shift) - 1;
        if (hi - lo > span)
            lo = hi - span;
        /* No token of the range lies outside [seen_lo, seen_hi]: a slice at
         * an edge of them shrinks to what is there, which takes a class of
         * tied logits alone in its slice straight to the bits of its ids. */
        hi = hi < seen_hi ? hi : seen_hi;
        lo = lo > seen_lo ? lo : seen_lo;
        if (lo == hi)
            return hi; /* one code: one token */
        if (count_before + bin_count <= SAMPLE_GATHER_CAP) {
            /* Everything ranked at or before the slice fits: gather it as
             * a resident prefix for the selections that follow. */
            gather_pass(sm, s, lo, top);
            *resident_lo = lo;
            return gathered_crossing(sm, lo, g, 0, t);
        }
        if (bin_count <= SAMPLE_GATHER_CAP) {
            gather_pass(sm, s, lo, hi);
            *resident_lo = SAMPLE_NONE_RESIDENT;
            return gathered_crossing(sm, lo, g, mass_before, t);
        }
    }
}

/* ---- the pipeline ------------------------------------------------------------------------ */

/* Code of the best token of z (vocab): the maximum's first index, NaN
 * ignored (a row of NaN and -inf gives a key with no finite value). With
 * copy_to, z is also copied there. */
__device__ u64 row_best(sample_smem &sm, const float *z, int vocab, float *copy_to)
{
    u64 best = 0;
#pragma unroll 4
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        const float v = z[i];
        if (copy_to)
            copy_to[i] = v;
        const u64 code = rank_code(v, i);
        best = code > best ? code : best;
    }
    return block_max_u64(sm, best); /* its barrier also publishes the copy */
}

/* sample.h step 0 on the copy z, as sample.c rounds it. The ids of a row
 * are distinct, so no two threads write the same logit. */
__device__ void apply_bias(float *z, int vocab, const ml_sample_row &row, const ml_logit_bias *bias)
{
    for (int j = threadIdx.x; j < row.n_bias; j += SAMPLE_THREADS) {
        const ml_logit_bias b = bias[row.bias_start + j];
        if (b.id < 0 || b.id >= vocab)
            continue; /* outside the contract; never write outside the row */
        z[b.id] = __fadd_rn(z[b.id], b.value);
    }
    __syncthreads();
}

/* sample.h step 1 on the biased copy z, as sample.c rounds it: no FMA. */
__device__ void apply_penalties(float *z, int vocab, const ml_sample_row &row,
                                const int32_t *pen_id, const uint32_t *pen_count)
{
    for (int j = threadIdx.x; j < row.n_pen; j += SAMPLE_THREADS) {
        const int32_t id = pen_id[row.pen_start + j];
        const uint32_t count = pen_count[row.pen_start + j];
        if (id < 0 || id >= vocab)
            continue; /* outside the contract; never write outside the row */
        float v = z[id];
        v = v > 0.0f ? __fdiv_rn(v, row.repetition_penalty) : __fmul_rn(v, row.repetition_penalty);
        if (count > 0) {
            v = __fsub_rn(v, __fmul_rn(row.frequency_penalty, (float)count));
            v = __fsub_rn(v, row.presence_penalty);
        }
        z[id] = v;
    }
    __syncthreads();
}

/* The row's constraint on the penalised copy z, as sample.c applies it:
 * a token whose bit is clear gets -inf, so no selection ever reaches it. */
__device__ void apply_mask(float *z, int vocab, const uint64_t *allowed)
{
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS)
        if (!(allowed[i >> 6] >> (i & 63) & 1))
            z[i] = -INFINITY;
    __syncthreads();
}

/* Steps 3-6 of sample.h over the biased, penalised logits z with best token `best`
 * (finite maximum zmax): the drawn token's id. */
__device__ int draw_token(sample_smem &sm, const float *z, int vocab, u64 best, float log_gap,
                          double mass_scale)
{
    const ml_sample_row &row = sm.row;
    const float zmax = key_value((uint32_t)(best >> 32)), t = row.temperature;
    float floor_z = __fsub_rn(zmax, __fmul_rn(log_gap, t));
    if (!(floor_z > -FLT_MAX))
        floor_z = -FLT_MAX; /* a huge temperature: still never draw -inf */
    /* min-p's logit threshold; glibc's logf is within an ulp of the
     * correctly rounded log, which the double log rounded once gives. */
    const float min_p_z = row.min_p > 0.0f
                              ? __fadd_rn(zmax, __fmul_rn(t, (float)log((double)row.min_p)))
                              : -INFINITY;
    const bool top_p = row.top_p < 1.0f;
    if (!top_p && min_p_z > floor_z)
        floor_z = min_p_z;

    const sample_set s = {z, vocab, zmax, __fdiv_rn(1.0f, t), mass_scale};
    u64 lo = code_floor(floor_z), resident_lo = SAMPLE_NONE_RESIDENT;
    unsigned int hint = UINT_MAX;
    if (row.top_k > 0 && row.top_k < (uint32_t)vocab) {
        const sample_goal k = {GOAL_COUNT, (double)row.top_k};
        lo = select_crossing(sm, s, lo, best, k, hint, &resident_lo);
        hint = row.top_k;
    }
    if (top_p) {
        const sample_goal p = {GOAL_REACH, (double)row.top_p};
        lo = select_crossing(sm, s, lo, best, p, hint, &resident_lo);
        if (row.min_p > 0.0f) {
            const u64 min_p_lo = code_floor(min_p_z);
            lo = min_p_lo > lo ? min_p_lo : lo;
        }
    }
    const sample_goal u = {GOAL_EXCEED, row.u};
    return code_id(select_crossing(sm, s, lo, best, u, hint, &resident_lo));
}

/* log_softmax of the raw row: the log of its normaliser, the sum of
 * exp(z - zmax) over the logits within log_gap of the maximum (the rest are
 * below the resolution of the float results, as in sample.c). */
__device__ double raw_log_normaliser(sample_smem &sm, const float *raw, int vocab, float zmax,
                                     float log_gap)
{
    const float floor_z = __fsub_rn(zmax, log_gap);
    double sum = 0.0;
#pragma unroll 4
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        const float v = raw[i];
        if (v >= floor_z)
            sum += (double)expf(__fsub_rn(v, zmax));
    }
    return (double)zmax + log(block_sum_f64(sm, sum));
}

__device__ __forceinline__ float raw_logprob(const float *raw, int id, double lse)
{
    return (float)((double)raw[id] - lse);
}

/* out->top[from, ML_SAMPLE_MAX_TOP) = 0, as sample.c leaves them. */
__device__ void clear_top(ml_sample_out *out, uint32_t from)
{
    for (uint32_t j = threadIdx.x + from; j < ML_SAMPLE_MAX_TOP; j += SAMPLE_THREADS)
        out->top[j] = ml_token_logprob{0, 0.0f};
}

/* out->top: the n_top best ranked raw ids (NaN excluded, -inf included) with
 * their logprobs, best first; the unused entries zeroed. Returns how many. */
__device__ uint32_t write_top(sample_smem &sm, const float *raw, int vocab, u64 raw_best,
                              uint32_t n_top, double lse, ml_sample_out *out)
{
    uint32_t n = 0;
    if (n_top > 0) {
        const sample_set s = {raw, vocab, 0.0f, 0.0f, 0.0};
        const sample_goal g = {GOAL_COUNT, (double)n_top};
        u64 resident_lo = SAMPLE_NONE_RESIDENT;
        const u64 lo = select_crossing(sm, s, code_floor(-INFINITY), raw_best, g, UINT_MAX,
                                       &resident_lo);
        if (lo < resident_lo)
            gather_pass(sm, s, lo, raw_best);
        const unsigned int me = threadIdx.x, m = gathered(sm);
        u64 mine = me < m ? sm.gather_code[me] : 0;
        n = (uint32_t)block_sum_u64(sm, mine >= lo ? 1 : 0);
        if (mine >= lo) {
            uint32_t rank = 0;
            for (unsigned int j = 0; j < m; j++)
                rank += sm.gather_code[j] > mine;
            const int id = code_id(mine);
            out->top[rank] = ml_token_logprob{id, raw_logprob(raw, id, lse)};
        }
    }
    clear_top(out, n);
    return n;
}

__device__ void write_no_token(ml_sample_out *out)
{
    clear_top(out, 0);
    if (threadIdx.x == 0) {
        out->chosen = ml_token_logprob{ML_SAMPLE_NO_TOKEN, 0.0f};
        out->n_top = 0;
    }
}

/* One block per row. log_gap: sample.c's negligible_log_gap(vocab);
 * mass_scale: 2^mass_bits, the fixed point of the masses. */
__global__ void __launch_bounds__(SAMPLE_THREADS, 1)
    sample_kernel(ml_sample_params p, float log_gap, double mass_scale)
{
    __shared__ sample_smem sm;
    const int r = blockIdx.x, vocab = p.vocab;
    if (threadIdx.x == 0)
        sm.row = p.row[r];
    __syncthreads();
    const ml_sample_row &row = sm.row;
    const float *raw = p.logits + (size_t)r * vocab;
    ml_sample_out *out = p.out + r;

    const bool biased = row.n_bias > 0 && row.bias_start >= 0;
    const bool penalised = row.n_pen > 0 && row.pen_start >= 0 &&
                           (row.repetition_penalty != 1.0f || row.presence_penalty != 0.0f ||
                            row.frequency_penalty != 0.0f);
    /* A constraint or a bias never turns into a free draw. */
    if ((row.mask && !p.mask) || (biased && !p.bias)) {
        write_no_token(out);
        return;
    }
    const bool copied = biased || penalised || row.mask;
    const float *z = raw;
    u64 raw_best;
    if (copied) { /* raw stays the logprobs' row */
        float *work = (float *)p.scratch + (size_t)r * vocab;
        raw_best = row_best(sm, raw, vocab, work);
        if (biased)
            apply_bias(work, vocab, row, p.bias);
        if (penalised)
            apply_penalties(work, vocab, row, p.pen_id, p.pen_count);
        if (row.mask)
            apply_mask(work, vocab, p.mask + (size_t)(row.mask - 1) * (((size_t)vocab + 63) / 64));
        z = work;
    }
    const u64 best = row_best(sm, z, vocab, NULL);
    if (!copied)
        raw_best = best;
    if (!isfinite(key_value((uint32_t)(best >> 32)))) {
        write_no_token(out);
        return;
    }
    int chosen = code_id(best);
    if (!(row.temperature < ML_SAMPLE_GREEDY_TEMPERATURE)) {
        chosen = draw_token(sm, z, vocab, best, log_gap, mass_scale);
        if (chosen < 0 || chosen >= vocab)
            chosen = code_id(best); /* unreachable: a crossing is always a token */
    }
    if (!row.logprobs) {
        clear_top(out, 0);
        if (threadIdx.x == 0) {
            out->chosen = ml_token_logprob{chosen, 0.0f};
            out->n_top = 0;
        }
        return;
    }
    /* As sample.c: logprobs it cannot give (n_top over its limits, raw
     * logits with no finite maximum) leave no token. */
    const float raw_max = key_value((uint32_t)(raw_best >> 32));
    if (row.n_top > ML_SAMPLE_MAX_TOP || row.n_top > (uint32_t)vocab || !isfinite(raw_max)) {
        write_no_token(out);
        return;
    }
    const double lse = raw_log_normaliser(sm, raw, vocab, raw_max, log_gap);
    const uint32_t n = write_top(sm, raw, vocab, raw_best, row.n_top, lse, out);
    if (threadIdx.x == 0) {
        out->chosen = ml_token_logprob{chosen, raw_logprob(raw, chosen, lse)};
        out->n_top = n;
    }
}

/* ---- host ---------------------------------------------------------------------------------- */

/* Fraction bits of the fixed-point masses: a row's total, at most vocab
 * times the best token's 1, stays below 2^63. */
static double mass_scale_for(int vocab)
{
    int bits = 0;
    while (bits < 31 && (vocab >> bits) != 0)
        bits++;
    return ldexp(1.0, 63 - bits);
}

size_t mlk_sample_scratch_bytes(ml_backend *be, int rows, int vocab)
{
    (void)be;
    /* One biased, penalised, masked copy per row. */
    return rows > 0 && vocab > 0 ? (size_t)rows * (size_t)vocab * sizeof(float) : 0;
}

void mlk_sample(ml_backend *be, const ml_sample_params *p)
{
    mlk_backend *b = mlk_of(be);
    if (mlk_enter(b))
        return;
    if (p->rows < 0 || p->vocab < 1) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "sample", "rows %d, vocab %d", p->rows, p->vocab);
        return;
    }
    if (p->rows == 0)
        return;
    if (!p->out || !p->logits || !p->row || !p->scratch) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "sample", "NULL out, logits, row or scratch");
        return;
    }
    /* sample.c's negligible_log_gap, with the same host logf, so that both
     * backends cut the candidates at the same logit. */
    const float log_gap = logf((float)p->vocab) + (float)FLT_MANT_DIG * (float)M_LN2;
    mlk_launch(sample_kernel,
               p->rows, SAMPLE_THREADS, 0, b->stream, *p, log_gap, mass_scale_for(p->vocab));
    mlk_launched(b, "sample");
}
