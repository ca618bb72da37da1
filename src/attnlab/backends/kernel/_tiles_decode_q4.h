/* The decode pass's int4 pieces (KIVI's groups, attnlab.reference.quantized), included by _tiles_decode.h once
 * per instruction set. Codes are never turned into a float copy of the cache: each vector of VW bytes (2 VW
 * channels, channel 2u in byte u's low nibble, 2u + 1 in its high one) is widened, split into its low and high
 * nibbles and converted in registers, so a chunk of 2 VW channels is read in the order [even channels, odd
 * channels]. Rather than moving the codes into channel order, the query (keys) and the accumulator (values)
 * live in that order:
 * - keys, grouped per channel over 32 tokens: for group g, q.k_j = sum_d (q_d s_gd) code_jd + sum_d q_d z_gd,
 *   so each row's query is scaled once per group (into that order) and one constant is added per row;
 * - values, grouped per token over 32 channels: acc_c += sum_j (p_j s_j,c/32) code_jc, and the zero points'
 *   share sum_j p_j z_j,c/32 is summed apart (one vector per row and group), both put back in channel order
 *   once per work item (q4_finish). */

#if VW == 16
#define EV 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define OD 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define QK 4 /* keys at a time in 4 rows' scores (4 QK / NR for NR rows): 4 x QK accumulators (32 registers) */
#define QC 2 /* chunks of 2 VW channels at a time in p v: 4 rows x 2 QC accumulators */
#elif VW == 8
#define EV 0, 2, 4, 6, 8, 10, 12, 14
#define OD 1, 3, 5, 7, 9, 11, 13, 15
#define QK 2 /* 16 registers: 8 accumulators, the two halves of a key's codes, a query vector (4 rows) */
#define QC 1
#else
#define EV 0, 2, 4, 6
#define OD 1, 3, 5, 7
#define QK 2
#define QC 1
#endif

static inline TARGET VU F(u8v)(const uint8_t *p) { /* VW bytes as uint32 lanes */
#ifdef WIDEN8U
    return (VU)WIDEN8U(p);
#else
    return __builtin_convertvector(*(const F(vb8) *)p, VU);
#endif
}

static inline TARGET void F(nibbles)(const uint8_t *p, VF *lo, VF *hi) { /* 2 VW codes: even, odd channels */
    const VU x = F(u8v)(p);
#if VW == 16
    /* AVX-512: each code's float looked up in a register of 0..15 (vpermps takes an index's low 4 bits: no mask),
     * the same values as the conversion, off the port that the multiply-adds use */
    const VF codes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    *lo = (VF)_mm512_permutexvar_ps((__m512i)x, (__m512)codes);
    *hi = (VF)_mm512_permutexvar_ps((__m512i)(x >> 4), (__m512)codes);
#else
    *lo = __builtin_convertvector((VI)(x & 15u), VF);
    *hi = __builtin_convertvector((VI)(x >> 4), VF);
#endif
}

/* A key group's scaled queries qs (rows, dp) in nibble order and constants cz (rows): qs = q * s, cz = q . z, from
 * q in channel order (scaled to base 2) and qp, the same in nibble order; s and z the group's d scales and zero
 * points (s turned into nibble order once for every row: the only shuffles). */
static TARGET void F(q4_group)(const float *restrict q, const float *restrict qp, int64_t rows, int64_t dp, int64_t d,
                               const float *restrict s, const float *restrict z, float *restrict qs, float *restrict cz) {
    for (int64_t t = 0; t < d; t += 2 * VW) {
        const VF a = *(const VFU *)(s + t), b = *(const VFU *)(s + t + VW);
        const VF lo = __builtin_shufflevector(a, b, EV), hi = __builtin_shufflevector(a, b, OD);
        for (int64_t r = 0; r < rows; r++) {
            *(VF *)(qs + r * dp + t) = *(const VF *)(qp + r * dp + t) * lo;
            *(VF *)(qs + r * dp + t + VW) = *(const VF *)(qp + r * dp + t + VW) * hi;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        VF c = {};
        for (int64_t t = 0; t < d; t += VW) c += *(const VF *)(q + r * dp + t) * *(const VFU *)(z + t);
        float sum = 0.0f;
        for (int u = 0; u < VW; u++) sum += c[u];
        cz[r] = sum;
    }
}

/* q (rows, dp) in channel order into qp in nibble order: each chunk of 2 VW channels as [even, odd]. */
static TARGET void F(q4_order)(const float *restrict q, int64_t rows, int64_t dp, int64_t d, float *restrict qp) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < d; t += 2 * VW) {
            const VF a = *(const VF *)(q + r * dp + t), b = *(const VF *)(q + r * dp + t + VW);
            *(VF *)(qp + r * dp + t) = __builtin_shufflevector(a, b, EV);
            *(VF *)(qp + r * dp + t + VW) = __builtin_shufflevector(a, b, OD);
        }
}

/* The scores of NR (1, 2 or 4) rows (qs[i]: dp floats in nibble order) against the nk <= VW keys of a block of int4
 * codes k (rows ldk bytes apart, d channels), folded into one vector per row (0 past nk); NR QK accumulators. */
#define DOTSQ(NAME, NR)                                                                                        \
    static inline TARGET void F(NAME)(const float *const *qs, const uint8_t *restrict k, int64_t ldk, int64_t d, \
                                      int64_t nk, VF *const *out) {                                            \
        enum { KQ = 4 * QK / NR < VW ? 4 * QK / NR : VW };                                                     \
        VF c[NR][VW];                                                                                          \
        for (int u0 = 0; u0 < VW; u0 += KQ) {                                                                  \
            VF a[NR][KQ];                                                                                      \
            for (int r = 0; r < NR; r++)                                                                       \
                for (int u = 0; u < KQ; u++) a[r][u] = (VF){};                                                 \
            if (u0 < nk) {                                                                                     \
                const uint8_t *row[KQ];                                                                        \
                for (int u = 0; u < KQ; u++) row[u] = k + (u0 + u < nk ? u0 + u : nk - 1) * ldk; /* past nk: unused */ \
                for (int64_t t = 0; t < d; t += 2 * VW)                                                        \
                    for (int u = 0; u < KQ; u++) {                                                             \
                        VF lo, hi;                                                                             \
                        F(nibbles)(row[u] + t / 2, &lo, &hi);                                                  \
                        for (int r = 0; r < NR; r++) /* two FMAs (one expression: a product, an FMA and a sum) */ \
                            a[r][u] += *(const VF *)(qs[r] + t) * lo, a[r][u] += *(const VF *)(qs[r] + t + VW) * hi; \
                    }                                                                                          \
            }                                                                                                  \
            for (int r = 0; r < NR; r++)                                                                       \
                for (int u = 0; u < KQ; u++) c[r][u0 + u] = u0 + u < nk ? a[r][u] : (VF){};                    \
        }                                                                                                      \
        for (int r = 0; r < NR; r++) *out[r] = F(fold)(c[r]);                                                  \
    }
DOTSQ(dotsq4, 4)
DOTSQ(dotsq2, 2)
DOTSQ(dotsq1, 1)
#undef DOTSQ

/* acc[r] (dvp floats in nibble order) += sum over keys u in [a, z) of w[r][c / 32][u] code[u][c], NR rows (w's
 * rows ng VW apart, a group's VW weights together), NC chunks of 2 VW channels at a time in registers. */
#define PVQ(NAME, NR, NC)                                                                                      \
    static inline TARGET int64_t F(NAME)(int64_t t, const float *restrict w, int64_t ng, int64_t a, int64_t z, \
                                         const uint8_t *restrict v, int64_t ldv, int64_t dv, float *restrict acc, \
                                         int64_t dvp) {                                                        \
        for (; t + 2 * VW * NC <= dv; t += 2 * VW * NC) {                                                      \
            VF c[NR][2 * NC];                                                                                  \
            for (int r = 0; r < NR; r++)                                                                       \
                for (int i = 0; i < 2 * NC; i++) c[r][i] = *(const VF *)(acc + r * dvp + t + i * VW);          \
            const float *wg[NC];                                                                               \
            for (int i = 0; i < NC; i++) wg[i] = w + (t + 2 * VW * i) / 32 * VW;                               \
            for (int64_t u = a; u < z; u++) {                                                                  \
                VF lo[NC], hi[NC];                                                                             \
                for (int i = 0; i < NC; i++) F(nibbles)(v + u * ldv + t / 2 + i * VW, &lo[i], &hi[i]);         \
                for (int r = 0; r < NR; r++)                                                                   \
                    for (int i = 0; i < NC; i++) {                                                             \
                        const float x = wg[i][r * ng * VW + u];                                                \
                        c[r][2 * i] += x * lo[i], c[r][2 * i + 1] += x * hi[i];                                \
                    }                                                                                          \
            }                                                                                                  \
            for (int r = 0; r < NR; r++)                                                                       \
                for (int i = 0; i < 2 * NC; i++) *(VF *)(acc + r * dvp + t + i * VW) = c[r][i];                \
        }                                                                                                      \
        return t;                                                                                              \
    }
PVQ(pvq4, 4, QC)
PVQ(pvq2, 2, QC)
PVQ(pvq1, 1, QC)
#if QC > 1
PVQ(pvq4t, 4, 1)
PVQ(pvq2t, 2, 1)
PVQ(pvq1t, 1, 1)
#endif
#undef PVQ

/* p v for nr (1, 2 or 4) rows of int4 values: every chunk of channels, then (AVX-512) the last 32 alone. */
static inline TARGET void F(pvq_rows)(int64_t nr, const float *w, int64_t ng, int64_t a, int64_t z, const uint8_t *v,
                                      int64_t ldv, int64_t dv, float *acc, int64_t dvp) {
    int64_t t = nr == 4 ? F(pvq4)(0, w, ng, a, z, v, ldv, dv, acc, dvp) : nr == 2 ? F(pvq2)(0, w, ng, a, z, v, ldv, dv, acc, dvp)
                                                                                  : F(pvq1)(0, w, ng, a, z, v, ldv, dv, acc, dvp);
#if QC > 1
    if (nr == 4) F(pvq4t)(t, w, ng, a, z, v, ldv, dv, acc, dvp);
    else if (nr == 2) F(pvq2t)(t, w, ng, a, z, v, ldv, dv, acc, dvp);
    else F(pvq1t)(t, w, ng, a, z, v, ldv, dv, acc, dvp);
#else
    (void)t;
#endif
}

/* A block of int4 values' weights: w[r][g] = p[r] * the nk keys' scales of group g (0 past nk), and each row's
 * zero-point share zs[r][g] += p[r] * their zero points (lanes summed in q4_finish). s and z: the block's first
 * value row's scales and zero points (ng groups each), rows ls and lz floats apart. */
#if VW == 8
/* The 8 x 4 floats at x (token u's 4 groups at x + 4u) as 4 vectors, group g's 8 tokens in out[g]: 8 shuffles in
 * registers (the lane-by-lane gather is 32 scalar loads and inserts, about 6 % of an int4 pass). */
static inline TARGET void F(t8x4)(const float *restrict x, VF out[4]) {
    const VF a0 = *(const VFU *)x, a1 = *(const VFU *)(x + 8), a2 = *(const VFU *)(x + 16), a3 = *(const VFU *)(x + 24);
    const VF b0 = __builtin_shufflevector(a0, a1, 0, 4, 8, 12, 1, 5, 9, 13); /* tokens 0-3: groups 0, 1 */
    const VF b1 = __builtin_shufflevector(a0, a1, 2, 6, 10, 14, 3, 7, 11, 15); /* groups 2, 3 */
    const VF c0 = __builtin_shufflevector(a2, a3, 0, 4, 8, 12, 1, 5, 9, 13); /* tokens 4-7 */
    const VF c1 = __builtin_shufflevector(a2, a3, 2, 6, 10, 14, 3, 7, 11, 15);
    out[0] = __builtin_shufflevector(b0, c0, 0, 1, 2, 3, 8, 9, 10, 11);
    out[1] = __builtin_shufflevector(b0, c0, 4, 5, 6, 7, 12, 13, 14, 15);
    out[2] = __builtin_shufflevector(b1, c1, 0, 1, 2, 3, 8, 9, 10, 11);
    out[3] = __builtin_shufflevector(b1, c1, 4, 5, 6, 7, 12, 13, 14, 15);
}
#elif VW == 16
/* The 16 x 4 floats at x (token u's 4 groups at x + 4u) as 4 vectors, group g's 16 tokens in out[g]: 8 two-source
 * shuffles in registers instead of 64 scalar loads and inserts. */
static inline TARGET void F(t16x4)(const float *restrict x, VF out[4]) {
    const VF a0 = *(const VFU *)x, a1 = *(const VFU *)(x + 16), a2 = *(const VFU *)(x + 32), a3 = *(const VFU *)(x + 48);
#define G01 0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29 /* 8 tokens' groups 0, then 1 */
#define G23 2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31
    const VF b0 = __builtin_shufflevector(a0, a1, G01), b1 = __builtin_shufflevector(a0, a1, G23); /* tokens 0-7 */
    const VF c0 = __builtin_shufflevector(a2, a3, G01), c1 = __builtin_shufflevector(a2, a3, G23); /* tokens 8-15 */
#undef G01
#undef G23
#define FIRST 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define SECOND 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
    out[0] = __builtin_shufflevector(b0, c0, FIRST), out[1] = __builtin_shufflevector(b0, c0, SECOND);
    out[2] = __builtin_shufflevector(b1, c1, FIRST), out[3] = __builtin_shufflevector(b1, c1, SECOND);
#undef FIRST
#undef SECOND
}
#define T4 F(t16x4)
#endif
#if VW == 8
#define T4 F(t8x4)
#endif

static TARGET void F(q4_weights)(const float *restrict p, int64_t rows, int64_t nk, const float *restrict s, int64_t ls,
                                 const float *restrict z, int64_t lz, int64_t ng, float *restrict w, float *restrict zs) {
#ifdef T4
    if (ng == 4 && ls == 4 && lz == 4 && nk == VW) { /* D = 128, a whole block: its scales and zero points transposed */
        VF sv[4], zv[4];
        T4(s, sv), T4(z, zv);
        for (int64_t r = 0; r < rows; r++) {
            const VF pr = *(const VF *)(p + r * VW);
            for (int g = 0; g < 4; g++) {
                *(VF *)(w + (r * 4 + g) * VW) = pr * sv[g];
                *(VF *)(zs + (r * 4 + g) * VW) += pr * zv[g];
            }
        }
        return;
    }
#endif
    for (int64_t g = 0; g < ng; g++) {
        VF sv = {}, zv = {};
        for (int64_t u = 0; u < nk; u++) sv[u] = s[u * ls + g], zv[u] = z[u * lz + g];
        for (int64_t r = 0; r < rows; r++) {
            const VF pr = *(const VF *)(p + r * VW);
            *(VF *)(w + (r * ng + g) * VW) = pr * sv;
            *(VF *)(zs + (r * ng + g) * VW) += pr * zv;
        }
    }
}

/* A work item's int4 values into its accumulator: acc[r][c] += acc4[r] back in channel order + zs[r][c / 32]. */
static TARGET void F(q4_finish)(float *restrict acc, const float *restrict acc4, const float *restrict zs, int64_t rows,
                                int64_t dv, int64_t dvp, int64_t ng) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            float zero = 0.0f;
            for (int u = 0; u < VW; u++) zero += zs[(r * ng + g) * VW + u];
            for (int64_t c = 32 * g; c < 32 * g + 32 && c < dv; c++) {
                const int64_t t = c / (2 * VW) * (2 * VW), i = c - t;
                acc[r * dvp + c] += acc4[r * dvp + t + (i & 1) * VW + i / 2] + zero;
            }
        }
}

#undef T4
#undef EV
#undef OD
#undef QK
#undef QC
