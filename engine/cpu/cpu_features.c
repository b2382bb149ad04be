#include "cpu/cpu_features.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if ML_CPU_X86 && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

#if ML_CPU_X86 && defined(__linux__)
/* arch_prctl's request for an XSAVE feature's state, and AMX's tile data
 * (linux/arch/x86/include/uapi/asm/prctl.h, asm/fpu/types.h). */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
/* CPUID leaf 7's EDX bits: AMX-BF16 and AMX-TILE. */
#define CPUID_AMX_BF16 (1u << 22)
#define CPUID_AMX_TILE (1u << 24)
#endif

static int amx_bf16;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

/* CPUID says what the CPU has (clang 14's __builtin_cpu_supports does not
 * know AMX); Linux (5.16 on) hands a process the tile state only on
 * request, and refuses where the OS does not enable it in XCR0 or predates
 * it. */
static void amx_probe(void)
{
#if ML_CPU_X86 && defined(__linux__)
    unsigned eax, ebx, ecx, edx;
    const unsigned want = CPUID_AMX_BF16 | CPUID_AMX_TILE;
    amx_bf16 = ml_cpu_has_avx512_bf16() && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
               (edx & want) == want &&
               syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

int ml_cpu_has_amx_bf16(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_bf16;
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

ml_status ml_cpu_amx_select(int *out, char *err, size_t errlen)
{
    const char *want = getenv("ML_CPU_AMX");
    if (!want || !*want) {
        *out = ml_cpu_has_amx_bf16();
        return ML_OK;
    }
    if (strcmp(want, "0") == 0) {
        *out = 0;
        return ML_OK;
    }
    if (strcmp(want, "1") != 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "ML_CPU_AMX=%s: expected 0 or 1", want);
    if (!ml_cpu_has_amx_bf16())
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "ML_CPU_AMX=1: this CPU or OS does not run AMX-BF16");
    *out = 1;
    return ML_OK;
}
