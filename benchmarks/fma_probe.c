/* The FMA pipes' peak on one core, and what the decode pass's conversions take from it (x86-64 with AVX-512).
 *
 *     gcc -O2 -mavx512f benchmarks/fma_probe.c -o /tmp/fma_probe && /tmp/fma_probe
 *
 * Each line times 50 million iterations of a block of independent instructions written in assembly (8 FMA
 * chains, 4 cycles of latency each: enough to fill two pipes), so the compiler cannot fold or reorder them:
 * vector FMAs alone (zmm, then ymm), then zmm FMAs mixed with what int4's decoding adds per 8 FMAs (vpermps
 * look-ups, shifts, widening loads). Printed: ns per iteration and G FMAs a second. On Zen 4 a 512-bit FMA runs
 * on both 256-bit pipes: zmm and ymm give the same flops. Used by benchmarks/README.md (stop 47) for the floor of
 * a decoding step's multiply-adds; bench_kvcache.py sets the steps beside sgemm's rate, which any machine has. */
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define N 50000000L
#define FMA8(R) "vfmadd231ps %%" R "30,%%" R "31,%%" R "0\n vfmadd231ps %%" R "30,%%" R "31,%%" R "1\n" \
    "vfmadd231ps %%" R "30,%%" R "31,%%" R "2\n vfmadd231ps %%" R "30,%%" R "31,%%" R "3\n"            \
    "vfmadd231ps %%" R "30,%%" R "31,%%" R "4\n vfmadd231ps %%" R "30,%%" R "31,%%" R "5\n"            \
    "vfmadd231ps %%" R "30,%%" R "31,%%" R "6\n vfmadd231ps %%" R "30,%%" R "31,%%" R "7\n"
#define PERM4 "vpermps %%zmm29,%%zmm28,%%zmm10\n vpermps %%zmm29,%%zmm27,%%zmm11\n" \
    "vpermps %%zmm29,%%zmm26,%%zmm12\n vpermps %%zmm29,%%zmm25,%%zmm13\n"
#define SRL2 "vpsrld $4,%%zmm28,%%zmm14\n vpsrld $4,%%zmm27,%%zmm15\n"
#define ZX2 "vpmovzxbd (%1),%%zmm18\n vpmovzxbd 16(%1),%%zmm19\n"
/* every vector register the blocks write (xmm names cover their ymm and zmm widths) */
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm10", "xmm11", "xmm12", "xmm13", \
    "xmm14", "xmm15", "xmm18", "xmm19"
#define RUN(name, body, fmas)                                                                         \
    {                                                                                                 \
        double t = now();                                                                             \
        for (long n = 0; n < N; n++) __asm__ volatile(body ::"r"(n), "r"(buf) : "memory", CLOBBERS);  \
        double d = now() - t;                                                                         \
        printf("%-44s %.2f ns an iteration, %.2f G FMAs a second\n", name, d / N * 1e9, fmas * N / d / 1e9); \
    }

int main(void) {
    static float buf[64] __attribute__((aligned(64)));
    RUN("8 zmm FMAs", FMA8("zmm"), 8.0)
    RUN("8 ymm FMAs", FMA8("ymm"), 8.0)
    RUN("8 zmm FMAs + 4 vpermps", FMA8("zmm") PERM4, 8.0)
    RUN("8 zmm FMAs + 4 vpermps + 2 shifts + 2 widening loads", FMA8("zmm") PERM4 SRL2 ZX2, 8.0)
    return 0;
}
