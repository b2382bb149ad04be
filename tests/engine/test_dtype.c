/* engine/dtype.h: the float8_e4m3fn conversions against a reference built
 * from the format's definition (value = (-1)^s · 2^(e-7) · (1 + m/8), or
 * 2^-6 · m/8 for e = 0), over all 256 codes, and f32 -> e4m3fn rounding:
 * round trips, ties to even at every midpoint, saturation, NaN. */
#include <math.h>
#include <stdint.h>

#include "dtype.h"
#include "harness.h"

/* The value of code c by the definition; NaN for S.1111.111. */
static double reference_value(unsigned c)
{
    const int s = c >> 7, e = (c >> 3) & 0xf, m = c & 7;
    if (e == 0xf && m == 7)
        return NAN;
    const double mag = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -mag : mag;
}

static void test_decode_all_codes(void)
{
    int bad = 0;
    for (unsigned c = 0; c < 256; c++) {
        const double want = reference_value(c);
        const float got = ml_f8e4m3_to_f32((uint8_t)c);
        const int neg = c >> 7; /* signbit() returns any non-zero value */
        if (isnan(want) ? !isnan(got) : got != want)
            bad++;
        if (!signbit(got) != !neg)
            bad++;
    }
    check(bad == 0, "decode: %d of 256 codes differ from the definition", bad);
    check(ml_f8e4m3_to_f32(0x7e) == ML_F8E4M3_MAX, "0x7e is the largest finite value");
    check(ml_dtype_size(ML_DTYPE_F8_E4M3) == 1, "one byte an element");
    ml_dtype t = ML_DTYPE_BF16;
    check(ml_dtype_from_name("F8_E4M3", &t) && t == ML_DTYPE_F8_E4M3, "safetensors spelling");
    check(!ml_dtype_from_name("F8_E5M2", &t), "e5m2 is not this type");
}

static void test_encode(void)
{
    int bad_trip = 0, bad_mid = 0;
    for (unsigned c = 0; c < 256; c++) {
        const float v = ml_f8e4m3_to_f32((uint8_t)c);
        if (isnan(v))
            continue;
        /* 0x80 (-0) round-trips to itself: the sign of zero is kept */
        if (ml_f32_to_f8e4m3(v) != c)
            bad_trip++;
        /* The midpoint to the next code up in magnitude rounds to the one
         * of even mantissa; just either side of it, to the nearer one. */
        const unsigned up = c + 1;
        if ((c & 0x7f) >= 0x7e)
            continue;
        const float w = ml_f8e4m3_to_f32((uint8_t)up);
        const float mid = (float)(((double)v + w) / 2);
        const unsigned even = (c & 1) ? up : c;
        if (ml_f32_to_f8e4m3(mid) != even || ml_f32_to_f8e4m3(nextafterf(mid, 0)) != c ||
            ml_f32_to_f8e4m3(nextafterf(mid, mid * 2)) != up)
            bad_mid++;
    }
    check(bad_trip == 0, "encode: %d codes do not round-trip", bad_trip);
    check(bad_mid == 0, "encode: %d midpoints round wrongly", bad_mid);
    check(ml_f32_to_f8e4m3(1000.0f) == 0x7e && ml_f32_to_f8e4m3(-INFINITY) == 0xfe,
          "saturates to +-448");
    check(ml_f32_to_f8e4m3(463.0f) == 0x7e, "below the 448/480 midpoint: 448");
    check((ml_f32_to_f8e4m3(NAN) & 0x7f) == 0x7f, "NaN stays NaN");
    check(ml_f32_to_f8e4m3(0x1p-11f) == 0x00 && ml_f32_to_f8e4m3(0x1.8p-10f) == 0x01,
          "a quarter of the smallest subnormal: 0; three quarters: 2^-9");
}

int main(void)
{
    test_decode_all_codes();
    test_encode();
    return check_done();
}
