/* The compiled kernel's body, included by _tiles.c once per instruction set. Each inclusion
 * defines, for its own vector width, the functions pack_SFX, item_SFX and run_SFX:
 *
 *   TARGET the function attribute that compiles them for the instruction set,
 *          __attribute__((target("avx2,fma"))) or empty (GCC and clang both honour the attribute;
 *          clang ignores `#pragma GCC target`, so the variants must not rely on it)
 *   VW     floats per vector register (16 AVX-512, 8 AVX2, 4 SSE2/NEON)
 *   RQ     query rows per register tile of scores (RQ x 2 vectors of accumulators)
 *   RP     query rows per register tile of output (RP x up to NVMAX vectors of accumulators)
 *   NVMAX  output vectors per register tile
 *   ROWS   a multiple of RQ and RP: query blocks are padded to it
 *   VPW    0 or 2 VW: the forward's v packed in column panels of 2 VW floats (the last one VW where
 *          Dv ends there), each panel's rows contiguous; 0: v as it is (packed rows where Dv is ragged)
 *   STRIP  query rows that go through scores, softmax and P v together before the next rows start,
 *          a multiple of RQ and RP dividing ROWS (their scores stay in L1); 0: the whole query block
 *   SFX    the suffix of every name defined here
 *
 * Per work item (one query block of one head) the scores of a key block live in a scratch tile
 * small enough for the core's L2 cache, so the softmax's passes over it cost little next to the
 * two GEMMs, which run from registers (the FlashAttention-2 loop on a CPU). */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define F(name) CAT(name, SFX)

/* may_alias: the vectors are loaded from and stored to float arrays through pointer casts */
typedef float F(vf) __attribute__((vector_size(VW * 4), aligned(VW * 4), may_alias));
typedef float F(vfu) __attribute__((vector_size(VW * 4), aligned(4), may_alias)); /* rows that may sit anywhere */
typedef int32_t F(vi) __attribute__((vector_size(VW * 4), aligned(VW * 4), may_alias));
typedef uint32_t F(vu) __attribute__((vector_size(VW * 4), aligned(VW * 4), may_alias));
#define VF F(vf)
#define VFU F(vfu)
#define VI F(vi)
#define VU F(vu)

static inline TARGET VF F(select)(VI mask, VF a, VF b) { /* mask ? a : b, lane by lane */
    VI ai, bi;
    __builtin_memcpy(&ai, &a, sizeof ai);
    __builtin_memcpy(&bi, &b, sizeof bi);
    ai = (ai & mask) | (bi & ~mask);
    __builtin_memcpy(&a, &ai, sizeof a);
    return a;
}

#if defined(X86_VARIANTS) && VW == 16
static inline TARGET int F(any)(VI mask) { /* some lane of mask set */
    return _mm512_test_epi32_mask((__m512i)mask, (__m512i)mask) != 0;
}
#endif

/* 2^f for f in [-1/2, 1/2]: the degree-6 polynomial both exps below share (relative error about 1e-7). */
static inline TARGET __attribute__((always_inline)) VF F(exp2frac)(VF f) {
    VF p = (VF){} + 1.5353362e-4f;
    p = p * f + 1.3398874e-3f;
    p = p * f + 9.6180149e-3f;
    p = p * f + 5.5503406e-2f;
    p = p * f + 2.4022652e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    return p;
}

/* 2^x, for x <= 0 (a score minus its row's maximum): exactly 0 below -126, for -inf and NaN
 * (an overflowed score); x above 64 is taken as 64 (it cannot occur; the cap keeps n's
 * conversion to int32 defined). x = n + f, n = round(x), f in [-1/2, 1/2]; 2^f from a degree-6
 * polynomial (relative error about 1e-7, float32's own rounding), times 2^n by adding n to the
 * exponent bits, on unsigned lanes (a left shift of a negative int32 is undefined in C). */
static inline TARGET __attribute__((always_inline)) VF F(exp2v)(VF x) {
    const VI dead = ~(x >= -126.0f); /* NaN compares false: dead too */
    x = F(select)(dead, (VF){} - 126.0f, x);
    x = F(select)(x > 64.0f, (VF){} + 64.0f, x);
    const VF n = (x + 12582912.0f) - 12582912.0f; /* round to nearest: adding 1.5 * 2^23 drops the fraction */
    const VF f = x - n;
    VF p = F(exp2frac)(f);
    VU bits;
    __builtin_memcpy(&bits, &p, sizeof bits);
    bits += (VU)__builtin_convertvector(n, VI) << 23;
    bits &= ~(VU)dead;
    __builtin_memcpy(&p, &bits, sizeof p);
    return p;
}

/* exp2v(x) bit for bit where x <= 0 or NaN (a score less its row's maximum), in fewer operations: no cap
 * above, the floor one blend, and 2^n's exponent bits shifted out of the rounding's sum (its low bits
 * hold n: the sum is 1.5 * 2^23 + n, an integer). */
static inline TARGET VF F(exp2n)(VF x) {
    const VI live = (VI)(x >= -126.0f); /* NaN compares false: dead */
    x = F(select)(live, x, (VF){} - 126.0f);
    const VF t = x + 12582912.0f, n = t - 12582912.0f, f = x - n;
    VF p = F(exp2frac)(f);
    VU bits, tb;
    __builtin_memcpy(&bits, &p, sizeof bits);
    __builtin_memcpy(&tb, &t, sizeof tb);
    bits = (bits + (tb << 23)) & (VU)live;
    __builtin_memcpy(&p, &bits, sizeof p);
    return p;
}

/* mx[r] = lane-wise max(mx[r], c[r]): RQ rows' running maxima (the forward's softmax then needs no pass for them) */
static inline TARGET void F(rowmax)(VF *restrict mx, int r, VF c) {
    mx[r] = F(select)(c > mx[r], c, mx[r]);
}

/* s[RQ][2 VW] = q[RQ][d] . (two panels of keys, each [d][VW]); q's rows lda floats apart; mx (or NULL): the
 * rows' running maxima, lane-wise (rowmax) */
static inline TARGET void F(qk2)(const float *restrict q, int64_t lda, int64_t d, const float *restrict k0,
                                 const float *restrict k1, float *restrict s, int64_t lds, VF *restrict mx) {
    VF c[RQ][2];
    for (int r = 0; r < RQ; r++) c[r][0] = c[r][1] = (VF){};
    for (int64_t t = 0; t < d; t++) {
        const VF b0 = *(const VF *)(k0 + t * VW), b1 = *(const VF *)(k1 + t * VW);
        for (int r = 0; r < RQ; r++) {
            const float a = q[r * lda + t];
            c[r][0] += a * b0;
            c[r][1] += a * b1;
        }
    }
    for (int r = 0; r < RQ; r++) {
        *(VF *)(s + r * lds) = c[r][0];
        *(VF *)(s + r * lds + VW) = c[r][1];
        if (mx) F(rowmax)(mx, r, c[r][0]), F(rowmax)(mx, r, c[r][1]);
    }
}

/* the same for one panel (a key block's last, odd one) */
static inline TARGET void F(qk1)(const float *restrict q, int64_t lda, int64_t d, const float *restrict k0,
                                 float *restrict s, int64_t lds, VF *restrict mx) {
    VF c[RQ];
    for (int r = 0; r < RQ; r++) c[r] = (VF){};
    for (int64_t t = 0; t < d; t++) {
        const VF b0 = *(const VF *)(k0 + t * VW);
        for (int r = 0; r < RQ; r++) c[r] += q[r * lda + t] * b0;
    }
    for (int r = 0; r < RQ; r++) {
        *(VF *)(s + r * lds) = c[r];
        if (mx) F(rowmax)(mx, r, c[r]);
    }
}

/* acc[RP][NV VW] += p[RP][nc] . v[nc][NV VW]; FRESH: the tile's sum formed from zero, then added (the backward's dQ) */
#define PV(NAME, NV, FRESH)                                                                                    \
    static inline TARGET void F(NAME)(const float *restrict p, int64_t ldp, const float *restrict v, int64_t ldv, \
                                      int64_t nc, float *restrict acc, int64_t lda) {                          \
        VF c[RP][NV];                                                                                          \
        for (int r = 0; r < RP; r++)                                                                           \
            for (int u = 0; u < NV; u++) c[r][u] = FRESH ? (VF){} : *(const VF *)(acc + r * lda + u * VW);     \
        for (int64_t j = 0; j < nc; j++) {                                                                     \
            VF b[NV];                                                                                          \
            for (int u = 0; u < NV; u++) b[u] = *(const VFU *)(v + j * ldv + u * VW);                          \
            for (int r = 0; r < RP; r++) {                                                                     \
                const float a = p[r * ldp + j];                                                                \
                for (int u = 0; u < NV; u++) c[r][u] += a * b[u];                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int r = 0; r < RP; r++)                                                                           \
            for (int u = 0; u < NV; u++) {                                                                     \
                if (FRESH) c[r][u] += *(const VF *)(acc + r * lda + u * VW);                                   \
                *(VF *)(acc + r * lda + u * VW) = c[r][u];                                                     \
            }                                                                                                  \
    }
PV(pv_1, 1, 0)
PV(pv_2, 2, 0)
PV(pvf_1, 1, 1)
PV(pvf_2, 2, 1)
#if NVMAX >= 3
PV(pv_3, 3, 0)
PV(pv_4, 4, 0)
PV(pvf_3, 3, 1)
PV(pvf_4, 4, 1)
#endif

/* acc[RP][dvp] += p[RP][nc] . v[nc][dvp], NVMAX vectors of columns at a time (pv: the forward's running
 * sums; pvf: a tile's sum formed from zero, then added) */
#define PVALL(NAME, KERNEL)                                                                                    \
    static inline TARGET void F(NAME)(const float *restrict p, int64_t ldp, const float *restrict v, int64_t ldv, \
                                      int64_t nc, float *restrict acc, int64_t dvp) {                          \
        int64_t t = 0;                                                                                         \
        PVALL_WIDE(KERNEL)                                                                                     \
        for (; t + 2 * VW <= dvp; t += 2 * VW) F(CAT(KERNEL, 2))(p, ldp, v + t, ldv, nc, acc + t, dvp);       \
        if (t < dvp) F(CAT(KERNEL, 1))(p, ldp, v + t, ldv, nc, acc + t, dvp);                                  \
    }
#if NVMAX >= 3
#define PVALL_WIDE(KERNEL)                                                                                     \
    for (; t + 4 * VW <= dvp; t += 4 * VW) F(CAT(KERNEL, 4))(p, ldp, v + t, ldv, nc, acc + t, dvp);           \
    if (dvp - t == 3 * VW) F(CAT(KERNEL, 3))(p, ldp, v + t, ldv, nc, acc + t, dvp), t = dvp;
#else
#define PVALL_WIDE(KERNEL)
#endif
PVALL(pv, pv)
PVALL(pvf, pvf)
#undef PVALL_WIDE
#undef PVALL

/* Keys of batch b into panels of VW keys, kp[Tkp / VW][d][VW] (zero past Tk), and, when v's rows
 * are not a whole number of vectors or VPW asks for it, v into vp (zero padded): column panels of
 * VPW floats (the last one what is left), each [Tkp][its width], one after the other; VPW 0: one
 * panel of every column, vp[Tkp][dvp]. */
static TARGET void F(pack)(const struct problem *pr, int64_t b, float *kp, float *vp) {
    const int64_t d = pr->d, dv = pr->dv, tk = pr->tk;
    const float *k = pr->k + b * tk * d, *v = pr->v + b * tk * dv;
    for (int64_t j = 0; j < pr->tkp; j++) {
        float *panel = kp + (j / VW) * d * VW + j % VW;
        for (int64_t t = 0; t < d; t++) panel[t * VW] = j < tk ? k[j * d + t] : 0.0f;
    }
    for (int64_t t0 = 0; vp && t0 < pr->dvp; t0 += VPW ? VPW : pr->dvp) {
        const int64_t w = VPW && t0 + VPW < pr->dvp ? VPW : pr->dvp - t0;
        float *panel = vp + t0 * pr->tkp;
        for (int64_t j = 0; j < pr->tkp; j++)
            for (int64_t u = 0; u < w; u++) panel[j * w + u] = j < tk && t0 + u < dv ? v[j * dv + t0 + u] : 0.0f;
    }
}

/* tanh of VW lanes, 1 - 2 / (e^2x + 1) from exp2v: exact to float32's absolute rounding, +-1 at the ends. */
static inline TARGET VF F(tanhv)(VF x) {
    return 1.0f - 2.0f / (F(exp2v)(x * 2.8853900817779268f) + 1.0f); /* e^2x = 2^(2 x log2 e) */
}

/* Softcapping of base-2 scores, columns [0, n) (n a multiple of VW): s = cap tanh(s / cap); with `t`, each
 * lane's tanh is kept there too (the backward's derivative 1 - t^2). */
static inline TARGET void F(softcap)(float *restrict row, int64_t n, float cap, float *restrict t) {
    const float inv = 1.0f / cap;
    for (int64_t c = 0; c < n; c += VW) {
        const VF th = F(tanhv)(*(const VF *)(row + c) * inv);
        *(VF *)(row + c) = th * cap;
        if (t) *(VF *)(t + c) = th;
    }
}

/* ALiBi on a row of base-2 scores: columns a..z-1 less slope |pos - c|, pos the query's position less the
 * tile's first key. Whole vectors from the one holding column a (the row is whole vectors long; columns
 * outside a..z-1 are hidden after this), distances as floats (exact below 2^24 keys). */
static inline TARGET void F(alibi)(float *restrict row, int64_t a, int64_t z, float slope, int64_t pos) {
    VF lane;
    for (int u = 0; u < VW; u++) lane[u] = (float)u;
    const float p = (float)pos;
    for (int64_t c = a - a % VW; c < z; c += VW) {
        const VF dist = p - ((float)c + lane);
        *(VF *)(row + c) -= slope * F(select)((VI)(dist < 0.0f), -dist, dist);
    }
}

/* One work item: query rows i0..i1-1 of query head g of batch b, against every key they may see.
 * Not inlined: the work of the variant sits in a function named for it (the tests disassemble it). */
static TARGET __attribute__((noinline)) void F(item)(const struct problem *pr, const struct scratch *sc, int64_t b, int64_t g, int64_t i0, int64_t i1) {
    const int64_t d = pr->d, dv = pr->dv, dvp = pr->dvp, bqp = pr->bqp, bk = pr->bk, tk = pr->tk;
    const int64_t bg = b * pr->g + g, nr = i1 - i0;
    const struct vis *vis = pr->vis;
    float *restrict q = sc->q, *restrict s = sc->s, *restrict acc = sc->acc, *restrict m = sc->m, *restrict l = sc->l;
    const float *src = pr->q + (bg * pr->tq + i0) * d;
    const float mul = pr->scale * 1.4426950408889634f; /* scores in base 2: exp2 instead of exp */
    const float sink = vis_sink(vis, bg), slope = vis_slope(vis, bg);
    for (int64_t r = 0; r < bqp; r++)
        for (int64_t t = 0; t < d; t++) q[r * d + t] = r < nr ? src[r * d + t] * mul : 0.0f;
    for (int64_t r = 0; r < bqp; r++) /* a learned sink: a first "key" of score sink and no value */
        m[r] = sink, l[r] = sink == -INFINITY ? 0.0f : 1.0f;
    memset(acc, 0, sizeof(float) * bqp * dvp);

    int64_t lo, hi; /* the keys that some row of the block may see */
    vis_range(vis, bg, i0, i1, &lo, &hi);
    lo -= lo % VW; /* panels start at multiples of VW */
    const float *kp = pr->kp + b * pr->tkp * d;
    const float *v = pr->vp ? pr->vp + b * pr->tkp * dvp : pr->v + b * tk * dv;
#if !VPW
    const int64_t ldv = pr->vp ? dvp : dv; /* with VPW the panels' own stride is used */
#endif

    for (int64_t j0 = lo; j0 < hi; j0 += bk) {
        const int64_t nc = (j0 + bk < hi ? j0 + bk : hi) - j0, ncp = (nc + VW - 1) / VW * VW;
        if (!vis_meets(vis, bg, i0, i1, j0, j0 + nc)) continue; /* no row sees it: not read */
        const int64_t strip = STRIP ? STRIP : bqp;
        for (int64_t r0 = 0; r0 < bqp; r0 += strip) { /* a strip of rows: scores, softmax, P v */
            VF smax[STRIP ? STRIP : 1]; /* with strips, the strip's rows' maxima, lane-wise, from the score tiles */
            for (int u = 0; STRIP && u < strip; u++) smax[u] = (VF){} - INFINITY;
            for (int64_t r = r0; r < r0 + strip; r += RQ) { /* scores (base 2) */
                VF *mx = STRIP ? smax + (r - r0) : NULL;
                int64_t c = 0;
                for (; c + 2 * VW <= ncp; c += 2 * VW)
                    F(qk2)(q + r * d, d, d, kp + (j0 + c) * d, kp + (j0 + c + VW) * d, s + r * bk + c, bk, mx);
                if (c < ncp) F(qk1)(q + r * d, d, d, kp + (j0 + c) * d, s + r * bk + c, bk, mx);
            }
            for (int64_t r = r0; r < r0 + strip; r++) { /* hide what the row may not see; ALiBi; the online softmax */
                float *restrict row = s + r * bk;
                int64_t iv[4], c4[4] = {0, 0, 0, 0};
                if (r < nr) vis_row(vis, bg, i0 + r, iv), vis_cols(iv, j0, nc, c4);
                if (r >= nr || c4[1] <= c4[0]) { /* nothing: a zero row adds nothing to acc */
                    memset(row, 0, sizeof(float) * ncp);
                    continue;
                }
                if (vis->cap > 0.0f) F(softcap)(row, ncp, vis->cap, NULL);
                if (slope != 0.0f) F(alibi)(row, c4[0], c4[3], slope, vis_pos(vis, bg, i0 + r) - j0);
                for (int64_t c = 0; c < c4[0]; c++) row[c] = -INFINITY;
                for (int64_t c = c4[1]; c < c4[2]; c++) row[c] = -INFINITY;
                for (int64_t c = c4[3]; c < ncp; c++) row[c] = -INFINITY;
                VF mx = (VF){} - INFINITY;
                if (STRIP && c4[0] == 0 && c4[1] == c4[2] && c4[3] == ncp && vis->cap == 0.0f && slope == 0.0f)
                    mx = smax[r - r0]; /* every score of the row as the tiles left it: their maxima hold */
                else
                    for (int64_t c = 0; c < ncp; c += VW) {
                        const VF x = *(const VF *)(row + c);
                        mx = F(select)(x > mx, x, mx);
                    }
                float top = m[r];
                for (int u = 0; u < VW; u++) top = mx[u] > top ? mx[u] : top;
                if (top > m[r]) { /* a new maximum: rescale what the row has summed so far */
                    const float alpha = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - top);
                    l[r] *= alpha;
                    for (int64_t t = 0; t < dvp; t++) acc[r * dvp + t] *= alpha;
                    m[r] = top;
                }
                VF sum = (VF){};
                for (int64_t c = 0; c < ncp; c += VW) {
                    const VF e = F(exp2n)(*(const VF *)(row + c) - top);
                    *(VF *)(row + c) = e;
                    sum += e;
                }
                for (int u = 0; u < VW; u++) l[r] += sum[u];
            }
#if VPW
            for (int64_t t0 = 0; t0 < dvp; t0 += VPW) { /* a panel of VPW columns of v: its rows contiguous */
                const int64_t w = t0 + VPW < dvp ? VPW : dvp - t0;
                const float *vt = v + t0 * pr->tkp + j0 * w;
                for (int64_t r = r0; r < r0 + strip; r += RP)
                    if (w == 2 * VW)
                        F(pv_2)(s + r * bk, bk, vt, w, nc, acc + r * dvp + t0, dvp);
                    else /* the last panel, one vector wide */
                        F(pv_1)(s + r * bk, bk, vt, w, nc, acc + r * dvp + t0, dvp);
            }
#else
            for (int64_t r = r0; r < r0 + strip; r += RP) F(pv)(s + r * bk, bk, v + j0 * ldv, ldv, nc, acc + r * dvp, dvp);
#endif
        }
    }

    float *out = pr->out + (bg * pr->tq + i0) * dv, *lse = pr->lse + bg * pr->tq + i0;
    for (int64_t r = 0; r < nr; r++) { /* o = acc / l; LSE = ln 2 (m + log2 l); nothing seen: 0 and -inf */
        const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int64_t t = 0; t < dv; t++) out[r * dv + t] = acc[r * dvp + t] * inv;
        /* in double, rounded once: the backward's P = exp(S - LSE) is only as exact as LSE */
        lse[r] = l[r] > 0 ? (float)(((double)m[r] + log2((double)l[r])) * 0.69314718055994531) : -INFINITY;
    }
}

#include "_tiles_run.h"
#include "_tiles_backward.h"
#include "_tiles_stats.h"
#include "_tiles_pool.h"
#include "_tiles_decode.h"

#undef VF
#undef VFU
#undef VI
#undef VU
#undef TARGET
#undef VW /* the parameters: the next inclusion defines its own */
#undef RQ
#undef RP
#undef NVMAX
#undef ROWS
#undef STRIP
#undef VPW
#undef SFX
