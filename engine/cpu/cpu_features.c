#include "cpu/cpu_features.h"

#include <stdlib.h>
#include <string.h>

ml_cpu_isa ml_cpu_isa_detect(void)
{
#if ML_CPU_X86
    /* __builtin_cpu_supports reads cpuid and, for the AVX families, also
     * checks XCR0 (xgetbv), so a CPU whose OS does not save the wide
     * registers is reported as lacking them. */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return ML_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return ML_CPU_ISA_AVX2;
#endif
    return ML_CPU_ISA_PLAIN;
}

/* An AVX-512 extension, counted only where AVX-512 itself runs
 * (__builtin_cpu_supports takes a literal name, hence a macro). */
#if ML_CPU_X86
#define HAS_AVX512_EXTENSION(name)                                                                 \
    (ml_cpu_isa_detect() == ML_CPU_ISA_AVX512 && __builtin_cpu_supports(name))
#else
#define HAS_AVX512_EXTENSION(name) 0
#endif

int ml_cpu_has_avx512_bf16(void)
{
    return HAS_AVX512_EXTENSION("avx512bf16");
}

int ml_cpu_has_avx512_vbmi(void)
{
    return HAS_AVX512_EXTENSION("avx512vbmi");
}

const char *ml_cpu_isa_name(ml_cpu_isa isa)
{
    switch (isa) {
    case ML_CPU_ISA_PLAIN: return "plain";
    case ML_CPU_ISA_AVX2: return "avx2";
    case ML_CPU_ISA_AVX512: return "avx512";
    }
    return "?";
}

ml_status ml_cpu_isa_select(ml_cpu_isa *out, char *err, size_t errlen)
{
    const ml_cpu_isa best = ml_cpu_isa_detect();
    const char *want = getenv("ML_CPU_ISA");
    if (!want || !*want) {
        *out = best;
        return ML_OK;
    }
    static const ml_cpu_isa all[] = {ML_CPU_ISA_PLAIN, ML_CPU_ISA_AVX2, ML_CPU_ISA_AVX512};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(want, ml_cpu_isa_name(all[i])) != 0)
            continue;
        if (all[i] > best)
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "ML_CPU_ISA=%s: this CPU supports at most %s", want,
                           ml_cpu_isa_name(best));
        *out = all[i];
        return ML_OK;
    }
    return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                   "ML_CPU_ISA=%s: expected plain, avx2 or avx512", want);
}
