/* The HOST build's one-collective butterfly (mlk_host_warp_xor_reduce,
 * behind mlk_warp_xor_reduce) against the shuffles it stands for, run as
 * written on the host execution model: every lane's result bit for bit,
 * for float sums (inputs over 60 binades, so that any other pairing or
 * order of the additions shows), float max with NaN-free and -inf lanes,
 * the quad butterflies of attn_mma.cu (offsets 1 then 2, ascending), u64
 * max and double sums, under every schedule order. */
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {
#include "harness.h"
#include "test_rand.h"
}

#include "mlk_host.h"
#include "mlk_internal.cuh"

namespace {

constexpr int WARP = 32;
constexpr int TRIALS = 64;
/* Magnitudes 2^-30 .. 2^30. */
constexpr int SPREAD_BINADES = 60;

struct op_max_u64 {
    uint64_t operator()(uint64_t a, uint64_t b) const { return b > a ? b : a; }
};

/* What mlk_warp_xor_reduce<Offsets...> computes on a device. */
template <int... Offsets, class T, class Op>
T shuffled(T v, Op op)
{
    ((v = op(v, __shfl_xor_sync(0xffffffffu, v, Offsets))), ...);
    return v;
}

template <int... Offsets>
struct offsets {};

template <class T, class Op, int... Offsets>
void butterflies(offsets<Offsets...>, const T *in, T *collective, T *shuffles, Op op)
{
    const T v = in[threadIdx.x];
    collective[threadIdx.x] = mlk_warp_xor_reduce<Offsets...>(v, op);
    shuffles[threadIdx.x] = shuffled<Offsets...>(v, op);
}

template <int... Offsets, class T, class Op>
void check_same(const char *what, const T (&in)[WARP], Op op)
{
    T collective[WARP], shuffles[WARP];
    memset(collective, 0xa5, sizeof collective);
    memset(shuffles, 0x5a, sizeof shuffles);
    mlk_host::launch(butterflies<T, Op, Offsets...>, dim3(1), dim3(WARP), 0, nullptr,
                     offsets<Offsets...>(), (const T *)in, collective, shuffles, op);
    check(memcmp(collective, shuffles, sizeof collective) == 0,
          "%s: the one-collective butterfly differs from the shuffles", what);
}

float spread_float()
{
    const float mag = ldexpf(frand(1.0f, 2.0f), irand(SPREAD_BINADES) - SPREAD_BINADES / 2);
    return irand(2) ? -mag : mag;
}

void trial()
{
    float f[WARP], g[WARP];
    uint64_t u[WARP];
    double d[WARP];
    for (int i = 0; i < WARP; i++) {
        f[i] = spread_float();
        g[i] = irand(4) ? f[i] : -INFINITY;
        u[i] = (uint64_t)irand(1 << 30) << 32 | (uint64_t)irand(1 << 30);
        d[i] = (double)spread_float() * spread_float();
    }
    check_same<16, 8, 4, 2, 1>("float sum", f, mlk_op_add());
    check_same<16, 8, 4, 2, 1>("float max", g, mlk_op_fmax());
    check_same<1, 2>("quad float sum", f, mlk_op_add());
    check_same<1, 2>("quad float max", g, mlk_op_fmax());
    check_same<16, 8, 4, 2, 1>("u64 max", u, op_max_u64());
    check_same<16, 8, 4, 2, 1>("double sum", d, mlk_op_add());
}

} /* namespace */

int main()
{
    const int orders[] = {MLK_HOST_SCHEDULE_FORWARD, MLK_HOST_SCHEDULE_REVERSE,
                          MLK_HOST_SCHEDULE_SHUFFLE};
    rand_seed(7);
    for (int order : orders) {
        mlk_host_schedule_set(order, 11);
        for (int t = 0; t < TRIALS; t++)
            trial();
    }
    return check_done();
}
