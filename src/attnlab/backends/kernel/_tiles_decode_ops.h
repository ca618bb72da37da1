/* The decode pass's vector pieces (_tiles_decode.h includes this, once per instruction set): 16-bit values
 * widened to floats, the fold of VW keys' lane sums into one vector of scores, 1, 2 or 4 rows' scores against a
 * block of keys (prefetching the block ahead as it goes), and acc += p v for up to PV_ROWS rows. */

#ifndef DECODE_AHEAD /* blocks ahead prefetched (measured on an AVX2 EPYC: 4 and 8 alike, none 1.33x slower; with other
                      * programs on both cores, one thread at 32,768 keys: 1 and 2 blocks 5-7 % faster than 4, 8 and 16
                      * slower: data fetched far ahead is evicted before it is read) */
#define DECODE_AHEAD 2
/* __builtin_prefetch's locality: 2 (prefetcht1: into L2, whose queue is deeper than L1's line-fill buffers; the
 * load that follows hits L2) where a cache line holds at most two vectors of keys as stored (AVX-512: float32 and
 * 16-bit; AVX2: float32), 3 (into L1) where more (a pass busy widening 8-bit codes, or 16-bit ones on AVX2, wants
 * them in L1). Measured on the AVX-512 Xeon, values prefetched during p v, T1 against T0 at 8,192 and 32,768 keys:
 * float32 13 % faster (AVX2 forced: 8 %), 16-bit 2-9 % faster (AVX2: 3-6 % slower), int8 and float8 3-5 % slower.
 * AMD documents T1 as T0 before Zen 4 and as into L2 from Zen 4; not measured there. */
#define DECODE_LOC 3
#define DECODE_LOC_WIDE 2
#endif
/* Whether a block of items of ITEM bytes has its values prefetched during p v, not with its keys during the scores (which then leave the line-fill buffers idle through p v), per instruction set. With the
 * localities above, against prefetching everything into L1 during the scores (bench_decode_builds.py, the Xeon,
 * 8,192 and 32,768 keys): AVX-512 float32 16-17 % faster, 16-bit 10-16 %, int8 and float8 4-8 %, int4 (its own
 * loops, unchanged) 0-3 %; AVX2 forced: float32 16-18 % faster, 16-bit and int8 3-6 % slower split, so not split. */
#define SPLITS(ITEM) ((ITEM) * VW >= (VW == 16 ? 16 : 32)) /* vectors of at least 16 (AVX2: 32) bytes */
#ifndef DECODE_BURST /* a block's lines per group of keys issued together before the group where at most this many, per
                      * instruction set and item size (bench_decode_builds.py). AVX2: 16 (AVX2 EPYC, one thread, 2,048
                      * keys: int8 7 %, fp8 4 %, bfloat16 5 % faster than a few per step, float32's 32 lines per group at
                      * once 7 % slower; AVX2 forced on the AVX-512 Xeon, 8,192 and 32,768 keys: 16-bit and int8 3-7 %
                      * faster). AVX-512: 16 for 8-bit codes, none for 16-bit values, always a few per step (the Xeon,
                      * 8,192-131,072 keys, none against 16: bfloat16 8-12 % faster, float16 4-12 %, int8 3-5 % slower
                      * in two runs of three, fp8 within 2 %; float32's groups are 32 lines). Measured, not explained. */
#define DECODE_BURST(ITEM) (VW == 16 && (ITEM) == 2 ? 0 : 16)
#endif
typedef uint16_t F(vh) __attribute__((vector_size(VW * 2), aligned(2), may_alias));
#define VH F(vh)

static inline TARGET VF F(bf16v)(const uint16_t *p) { /* VW bfloat16 values as floats: the top 16 bits */
#ifdef WIDEN16 /* one widening load (GCC splits __builtin_convertvector's into halves) */
    const VU bits = (VU)WIDEN16(p) << 16;
#else
    const VU bits = __builtin_convertvector(*(const VH *)p, VU) << 16;
#endif
    VF f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}

/* VW float16 values as floats without F16C (the baseline): as f16_float, lane by lane. */
static inline TARGET VF F(f16_soft)(const uint16_t *p) {
    const VU x = __builtin_convertvector(*(const VH *)p, VU);
    const VU em = x & 0x7fffu, sign = (x & 0x8000u) << 16, special = (VU)(em >= 0x7c00u);
    VU bits = em << 13;
    VF f;
    __builtin_memcpy(&f, &bits, sizeof f);
    f *= 0x1p112f;
    __builtin_memcpy(&bits, &f, sizeof bits);
    bits = (bits & ~special) | (((em << 13) | 0x7f800000u) & special);
    bits |= sign;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}

/* n rows of len items stored as `type` (rows len apart) into dst[VW][ldd] floats, zero past them. */
typedef int8_t F(vb) __attribute__((vector_size(VW), aligned(1), may_alias));

static inline TARGET VF F(i8v)(const int8_t *p) { /* VW int8 codes as floats */
#ifdef WIDEN8
    return (VF)WIDEN8(p);
#else
    return __builtin_convertvector(*(const F(vb) *)p, VF);
#endif
}

typedef uint8_t F(vb8) __attribute__((vector_size(VW), aligned(1), may_alias));

/* VW float8_e4m3fn codes as floats: sign, exponent and mantissa moved to float32's places (a subnormal code
 * becomes a subnormal float32), times 2^(127 - 7); NaN codes are never written (the cache's format). */
static inline TARGET VF F(f8v)(const uint8_t *p) {
#ifdef WIDEN8U
    const VU x = (VU)WIDEN8U(p);
#else
    const VU x = __builtin_convertvector(*(const F(vb8) *)p, VU);
#endif
    const VU bits = (VU)((VI)(x << 24) >> 4) & 0x87f00000u; /* sign to bit 31 (its copies in 27..30 cleared), exponent and mantissa to 20..26 */
    VF f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f * 0x1p120f;
}

static TARGET void F(stage)(const void *src, int type, int64_t n, int64_t len, float *restrict dst, int64_t ldd) {
    for (int64_t r = 0; r < VW; r++) {
        float *restrict row = dst + r * ldd;
        int64_t t = 0;
        if (r < n && type == DT_F32) {
            memcpy(row, (const float *)src + r * len, sizeof(float) * len);
            t = len;
        } else if (r < n && type == DT_I8) {
            for (; t < len; t++) row[t] = (float)((const int8_t *)src)[r * len + t];
        } else if (r < n && type == DT_F8) {
            for (; t < len; t++) row[t] = f8_float(((const uint8_t *)src)[r * len + t]);
        } else if (r < n) {
            const uint16_t *s = (const uint16_t *)src + r * len;
            for (; t + VW <= len; t += VW) *(VF *)(row + t) = type == DT_BF16 ? F(bf16v)(s + t) : CVTPH(s + t);
            for (; t < len; t++) row[t] = type == DT_BF16 ? bf16_float(s[t]) : f16_float(s[t]);
        }
        for (; t < ldd; t++) row[t] = 0.0f;
    }
}

/* The fold of VW vectors c[u] (lane sums of key u's products) into one vector of the VW sums: at each
 * level a pair (a, b) becomes lo + hi, lo the first w lanes of every 2w of a then of b, hi the second
 * w; the keys stay in order. */
#define COMB(a, b, LO, HI) (__builtin_shufflevector(a, b, LO) + __builtin_shufflevector(a, b, HI))
#if VW == 16
#define LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LO4 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define HI4 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define LO2 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define HI2 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define LO1 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define HI1 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#elif VW == 8
#define LO4 0, 1, 2, 3, 8, 9, 10, 11
#define HI4 4, 5, 6, 7, 12, 13, 14, 15
#else
#define LO2 0, 1, 4, 5
#define HI2 2, 3, 6, 7
#define LO1 0, 2, 4, 6
#define HI1 1, 3, 5, 7
#endif

static inline TARGET __attribute__((always_inline)) VF F(fold)(VF *c) {
#if VW == 8
    /* AVX2: the same sums with shuffles that stay within 128-bit lanes (unpck, shufps; one 1-cycle instruction each)
     * until the last level, where the order-keeping patterns above took lane-crossing permutes and blends
     * (vpermd: two or three instructions per shuffle): pairs of lanes (0, 2) (1, 3), then (0, 1), then the halves. */
#define UL 0, 8, 1, 9, 4, 12, 5, 13
#define UH 2, 10, 3, 11, 6, 14, 7, 15
#define S44 0, 1, 8, 9, 4, 5, 12, 13
#define SEE 2, 3, 10, 11, 6, 7, 14, 15
    for (int m = 0; m < 4; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], UL, UH);
    for (int m = 0; m < 2; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], S44, SEE);
#undef UL
#undef UH
#undef S44
#undef SEE
    return COMB(c[0], c[1], LO4, HI4);
#else
#if VW == 16
    for (int m = 0; m < 8; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], LO8, HI8);
    for (int m = 0; m < 4; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], LO4, HI4);
#endif
    for (int m = 0; m < 2; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], LO2, HI2);
    return COMB(c[0], c[1], LO1, HI1);
#endif
}

/* The largest lane of x (no NaN in it), by halving. */
static inline TARGET float F(hmax)(VF x) {
#define HALVE(...) x = F(select)(__builtin_shufflevector(x, x, __VA_ARGS__) > x, __builtin_shufflevector(x, x, __VA_ARGS__), x)
#if VW == 16
    HALVE(8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    HALVE(4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    HALVE(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    HALVE(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#elif VW == 8
    HALVE(4, 5, 6, 7, 0, 1, 2, 3);
    HALVE(2, 3, 0, 1, 6, 7, 4, 5);
    HALVE(1, 0, 3, 2, 5, 4, 7, 6);
#else
    HALVE(2, 3, 0, 1);
    HALVE(1, 0, 3, 2);
#endif
#undef HALVE
    return x[0];
}

/* Where a block is prefetched: lines [0, k_lines) of k at pk, then v's at pv. */
struct F(ahead) { const char *pk, *pv; int64_t k_lines; };

static inline TARGET const char *F(ahead_at)(const struct F(ahead) *a, int64_t x) {
    return x < a->k_lines ? a->pk + 64 * x : a->pv + 64 * (x - a->k_lines);
}

/* Line x of a block of items of ITEM bytes (DECODE_LOC_WIDE where a line holds at most two vectors of them). */
#define PREFETCH(a, x, ITEM) __builtin_prefetch(F(ahead_at)(a, x), 0, (ITEM) * VW >= 32 ? DECODE_LOC_WIDE : DECODE_LOC)

/* The scores of NR (1, 2 or 4) query rows q[i] (dp floats, aligned) against VW keys k[u] (rows ldk apart, dp items
 * of type ELEM read, LOAD(x) the VW at x as floats), DK keys at a time: each vector of keys loaded (and converted)
 * once for the NR rows (NR DK accumulators, NR query vectors and a key vector in registers). Lines [x, x1) of `pf`
 * are prefetched along the way: up to DECODE_BURST(item) lines per group of DK keys together before the group (the loop
 * over D then has no prefetch branches), more a few per step. */
#define DKS (VW == 16 ? 16 : 8) /* accumulators: NR DK of them */
/* x stays in a register: without it GCC folds each query load into every FMA that uses it (NR + DK loads per
 * step become NR DK + DK: the load ports, not the FMAs, then bound the step) */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define KEEP(x) __asm__("" : "+v"(x)) /* any vector register (AVX-512: 32 of them) */
#else
#define KEEP(x) (void)0
#endif
#define DOTSN(NAME, NR, ELEM, LOAD)                                                                            \
    static inline TARGET void F(NAME)(const float *const *qs, const ELEM *restrict k, int64_t ldk, int64_t dp, \
                                      const struct F(ahead) *pf, int64_t x, int64_t x1, VF *const *out) {      \
        enum { DK = DKS / NR < VW ? DKS / NR : VW };                                                           \
        VF c[NR][VW];                                                                                          \
        const int64_t each = ((x1 - x) * DK + dp - 1) / dp; /* lines per step (dp / DK steps) */               \
        const int64_t group = ((x1 - x) * DK + VW - 1) / VW; /* lines per group of DK keys (VW / DK groups) */ \
        const int burst = group <= DECODE_BURST(sizeof(ELEM)); /* few: before each group, not a few per step */ \
        for (int h = 0; h < VW; h += DK) {                                                                     \
            for (int64_t y = 0; y < group && x < x1 && burst; y++, x++) PREFETCH(pf, x, sizeof(ELEM));         \
            VF a[NR][DK];                                                                                      \
            for (int i = 0; i < NR; i++)                                                                       \
                for (int u = 0; u < DK; u++) a[i][u] = (VF){};                                                 \
            for (int64_t t = 0; t < dp; t += VW) {                                                             \
                for (int64_t y = 0; y < each && x < x1 && !burst; y++, x++) PREFETCH(pf, x, sizeof(ELEM));     \
                VF b[NR];                                                                                      \
                for (int i = 0; i < NR; i++) {                                                                 \
                    b[i] = *(const VF *)(qs[i] + t);                                                           \
                    KEEP(b[i]);                                                                                \
                }                                                                                              \
                for (int u = 0; u < DK; u++) {                                                                 \
                    const VF kk = LOAD(k + (h + u) * ldk + t);                                                 \
                    for (int i = 0; i < NR; i++) a[i][u] += b[i] * kk;                                         \
                }                                                                                              \
            }                                                                                                  \
            for (int i = 0; i < NR; i++)                                                                       \
                for (int u = 0; u < DK; u++) c[i][h + u] = a[i][u];                                            \
        }                                                                                                      \
        for (; x < x1; x++) PREFETCH(pf, x, sizeof(ELEM));                                                     \
        for (int i = 0; i < NR; i++) *out[i] = F(fold)(c[i]);                                                  \
    }
#define DOTS(T, ELEM, LOAD) DOTSN(CAT(dots1, T), 1, ELEM, LOAD) DOTSN(CAT(dots2, T), 2, ELEM, LOAD) DOTSN(CAT(dots4, T), 4, ELEM, LOAD)
#define LOAD_F32(x) (*(const VFU *)(x))
#define LOAD_BF16(x) F(bf16v)(x)
#define LOAD_F16(x) CVTPH(x)
#define LOAD_I8(x) F(i8v)(x)
#define LOAD_F8(x) F(f8v)(x)
DOTS(f32, float, LOAD_F32)
DOTS(i8, int8_t, LOAD_I8)
DOTS(f8, uint8_t, LOAD_F8)
DOTS(bf16, uint16_t, LOAD_BF16)
DOTS(f16, uint16_t, LOAD_F16)
#undef DOTS
#undef DOTSN
#undef DKS
#undef KEEP

/* The scores of nr (1, 2 or 4) rows against a block of keys stored as `type` */
static inline TARGET void F(dots_rows)(int type, int64_t nr, const float *const *qs, const void *k, int64_t ldk, int64_t dp,
                                       const struct F(ahead) *pf, int64_t x, int64_t x1, VF *const *out) {
#define DOTS_CASE(T, ELEM)                                                                                     \
    if (nr == 4) F(CAT(dots4, T))(qs, (const ELEM *)k, ldk, dp, pf, x, x1, out);                               \
    else if (nr == 2) F(CAT(dots2, T))(qs, (const ELEM *)k, ldk, dp, pf, x, x1, out);                          \
    else F(CAT(dots1, T))(qs, (const ELEM *)k, ldk, dp, pf, x, x1, out);
    if (type == DT_F32) {
        DOTS_CASE(f32, float)
    } else if (type == DT_BF16) {
        DOTS_CASE(bf16, uint16_t)
    } else if (type == DT_I8) {
        DOTS_CASE(i8, int8_t)
    } else if (type == DT_F8) {
        DOTS_CASE(f8, uint8_t)
    } else {
        DOTS_CASE(f16, uint16_t)
    }
#undef DOTS_CASE
}

/* acc[r][dvp] += sum over keys u in [a, z) of p[r][u] v[u] for NR rows (p's rows VW apart, acc's dvp,
 * v's ldv items of type ELEM, LOAD(x) the VW values at x as floats): each row of v loaded (and converted)
 * once for the NR rows, NC vectors of columns at a time (NR NC accumulators in registers). Lines [x, x1) of
 * `pf` are prefetched along the way, a few per key. */
#define PVG(NAME, NR, NC, ELEM, LOAD)                                                                          \
    static inline TARGET void F(NAME)(const float *restrict p, int64_t a, int64_t z, const ELEM *restrict v,   \
                                      int64_t ldv, int64_t dvp, float *restrict acc,                           \
                                      const struct F(ahead) *pf, int64_t x, int64_t x1) {                      \
        int64_t t = 0;                                                                                         \
        enum { PF = SPLITS(sizeof(ELEM)) }; /* values prefetched here (else with the keys) */                  \
        const int64_t each = /* lines per key and chunk of columns */                                          \
            PF && z > a ? ((x1 - x) * NC * VW + (z - a) * dvp - 1) / ((z - a) * dvp) : 0;                      \
        for (; t + NC * VW <= dvp; t += NC * VW) {                                                             \
            VF c[NR][NC];                                                                                      \
            for (int r = 0; r < NR; r++)                                                                       \
                for (int i = 0; i < NC; i++) c[r][i] = *(const VF *)(acc + r * dvp + t + i * VW);              \
            for (int64_t u = a; u < z; u++) {                                                                  \
                for (int64_t y = 0; y < each && x < x1; y++, x++) PREFETCH(pf, x, sizeof(ELEM));               \
                const ELEM *row = v + u * ldv + t;                                                             \
                VF b[NC];                                                                                      \
                for (int i = 0; i < NC; i++) b[i] = LOAD(row + i * VW);                                        \
                for (int r = 0; r < NR; r++) {                                                                 \
                    const float w = p[r * VW + u];                                                             \
                    for (int i = 0; i < NC; i++) c[r][i] += w * b[i];                                          \
                }                                                                                              \
            }                                                                                                  \
            for (int r = 0; r < NR; r++)                                                                       \
                for (int i = 0; i < NC; i++) *(VF *)(acc + r * dvp + t + i * VW) = c[r][i];                    \
        }                                                                                                      \
        for (; t < dvp; t += VW) {                                                                             \
            VF c[NR];                                                                                          \
            for (int r = 0; r < NR; r++) c[r] = *(const VF *)(acc + r * dvp + t);                              \
            for (int64_t u = a; u < z; u++) {                                                                  \
                const VF b0 = LOAD(v + u * ldv + t);                                                           \
                for (int r = 0; r < NR; r++) c[r] += p[r * VW + u] * b0;                                       \
            }                                                                                                  \
            for (int r = 0; r < NR; r++) *(VF *)(acc + r * dvp + t) = c[r];                                    \
        }                                                                                                      \
        for (; x < x1; x++) PREFETCH(pf, x, sizeof(ELEM));                                                     \
    }
#define PVGS(T, ELEM, LOAD) PVG(CAT(pv1, T), 1, 4, ELEM, LOAD) PVG(CAT(pv2, T), 2, 4, ELEM, LOAD) PVG4(CAT(pv4, T), ELEM, LOAD)
#if VW == 16 /* 16 accumulators: AVX-512 has the registers */
#define PVG4(NAME, ELEM, LOAD) PVG(NAME, 4, 4, ELEM, LOAD)
#define PV_ROWS 4
#else /* AVX2 and the baseline: 4 rows of 2 vectors of columns (each v vector converted once for 4) */
#define PVG4(NAME, ELEM, LOAD) PVG(NAME, 4, 2, ELEM, LOAD)
#define PV_ROWS 4
#endif
PVGS(f32, float, LOAD_F32)
PVGS(bf16, uint16_t, LOAD_BF16)
PVGS(f16, uint16_t, LOAD_F16)
PVGS(i8, int8_t, LOAD_I8)
PVGS(f8, uint8_t, LOAD_F8)

/* pv for nr (1, 2 or PV_ROWS) rows of v stored as `type` */
static inline TARGET void F(pv_rows)(int type, int64_t nr, const float *p, int64_t a, int64_t z, const void *v,
                                     int64_t ldv, int64_t dvp, float *acc, const struct F(ahead) *pf, int64_t x, int64_t x1) {
#define PV_CASE(T, ELEM)                                                                                       \
    if (nr == 1) F(CAT(pv1, T))(p, a, z, (const ELEM *)v, ldv, dvp, acc, pf, x, x1);                           \
    else if (nr == 2) F(CAT(pv2, T))(p, a, z, (const ELEM *)v, ldv, dvp, acc, pf, x, x1);                      \
    else PV4_CALL(T, ELEM)
#if PV_ROWS == 4
#define PV4_CALL(T, ELEM) F(CAT(pv4, T))(p, a, z, (const ELEM *)v, ldv, dvp, acc, pf, x, x1);
#else
#define PV4_CALL(T, ELEM) {}
#endif
    if (type == DT_F32) {
        PV_CASE(f32, float)
    } else if (type == DT_BF16) {
        PV_CASE(bf16, uint16_t)
    } else if (type == DT_I8) {
        PV_CASE(i8, int8_t)
    } else if (type == DT_F8) {
        PV_CASE(f8, uint8_t)
    } else {
        PV_CASE(f16, uint16_t)
    }
#undef PV_CASE
#undef PV4_CALL
}
#undef PVGS
#undef PVG4
#undef PVG
#undef LOAD_F32
#undef LOAD_BF16
#undef LOAD_F16
#undef LOAD_I8
#undef LOAD_F8
#undef PREFETCH

