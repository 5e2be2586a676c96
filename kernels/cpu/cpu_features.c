#include "cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static int detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx || !fma || !f16c) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6) return 0; /* XMM and YMM state saved by the OS */
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1; /* AVX2 */
}

/* AVX-512F on top of detect()'s set: cpuid 7 EBX bit 16, and XCR0 bits 5-7
 * (opmask, upper halves of ZMM0-15, ZMM16-31) saved by the OS. */
static int detect512(void) {
    if (!detect()) return 0;
    unsigned a, b, c, d, lo, hi;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((b >> 16) & 1)) return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6) == 0xe6;
}

/* AVX-512BW on top of detect512(): cpuid 7 EBX bit 30. */
static int detect512bw(void) {
    if (!detect512()) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 30) & 1;
}

/* AVX512-VNNI on top of detect512bw(): cpuid 7 ECX bit 11. */
static int detect512vnni(void) {
    if (!detect512bw()) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 11) & 1;
}
#else
static int detect(void) { return 0; }
static int detect512vnni(void) { return 0; }
static int detect512(void) { return 0; }
static int detect512bw(void) { return 0; }
#endif

int tsr_cpu_has_avx2_fma_f16c(void) {
    static int have = -1;
    if (have < 0) have = detect();
    return have;
}

int tsr_cpu_has_avx512f(void) {
    static int have = -1;
    if (have < 0) have = detect512();
    return have;
}

int tsr_cpu_has_avx512bw(void) {
    static int have = -1;
    if (have < 0) have = detect512bw();
    return have;
}

int tsr_cpu_has_avx512vnni(void) {
    static int have = -1;
    if (have < 0) have = detect512vnni();
    return have;
}
