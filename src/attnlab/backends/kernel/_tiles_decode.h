/* The decode pass, included by _tiles_body.h once per instruction set (struct dproblem is in _tiles.c).
 *
 * A few query rows (Tq of them, for the G query heads of a key/value head: G Tq rows) against a long
 * cache: the work is reading the keys and values, so each is read once. A work item is one chunk of
 * one (sequence, k/v head)'s keys: every row of the group meets each key block (VW keys) while it is
 * in L1, so grouped-query attention reads each k/v head once, not G times. Keys and values are used
 * as stored: float32 keys straight from the cache, bfloat16 and float16 keys converted a block at a
 * time into L1 (a shift; F16C's or AVX-512's vcvtph2ps; bit arithmetic on the baseline), values
 * converted as each row is loaded for up to PV_ROWS rows at once. Scores: for each row,
 * VW dot products over D folded into one vector of VW scores by a tree of shuffles. Each item keeps
 * its rows' running maxima, sums and unnormalised outputs (FlashDecoding's partial results); after
 * every item is done each row merges its chunks by their log-sum-exp, in chunk order. Chunks come
 * from the shapes and the visibility (decode_chunk), never from the thread count: the same bits for
 * any number of threads. */

#ifndef DECODE_AHEAD
#define DECODE_AHEAD 4
#endif
#ifndef DECODE_PV4
#define DECODE_PV4 1
#endif
#ifndef DECODE_PF16
#define DECODE_PF16 0
#endif
#ifndef DECODE_KDIRECT
#define DECODE_KDIRECT 1
#endif
#ifndef DECODE_LOC
#define DECODE_LOC 3
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
static TARGET void F(stage)(const void *src, int type, int64_t n, int64_t len, float *restrict dst, int64_t ldd) {
    for (int64_t r = 0; r < VW; r++) {
        float *restrict row = dst + r * ldd;
        int64_t t = 0;
        if (r < n && type == DT_F32) {
            memcpy(row, (const float *)src + r * len, sizeof(float) * len);
            t = len;
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
#define LO2 0, 1, 4, 5, 8, 9, 12, 13
#define HI2 2, 3, 6, 7, 10, 11, 14, 15
#define LO1 0, 2, 4, 6, 8, 10, 12, 14
#define HI1 1, 3, 5, 7, 9, 11, 13, 15
#else
#define LO2 0, 1, 4, 5
#define HI2 2, 3, 6, 7
#define LO1 0, 2, 4, 6
#define HI1 1, 3, 5, 7
#endif

static inline TARGET VF F(fold)(VF *c) {
#if VW == 16
    for (int m = 0; m < 8; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], LO8, HI8);
#endif
#if VW >= 8
    for (int m = 0; m < 4; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], LO4, HI4);
#endif
    for (int m = 0; m < 2; m++) c[m] = COMB(c[2 * m], c[2 * m + 1], LO2, HI2);
    return COMB(c[0], c[1], LO1, HI1);
}

/* Where a block is prefetched: lines [0, k_lines) of k at pk, then v's at pv. */
struct F(ahead) { const char *pk, *pv; int64_t k_lines; };

static inline TARGET void F(prefetch)(const struct F(ahead) *a, int64_t x) {
    __builtin_prefetch(x < a->k_lines ? a->pk + 64 * x : a->pv + 64 * (x - a->k_lines), 0, DECODE_LOC);
}

/* The scores of two query rows q0, q1 (dp floats, aligned) against VW keys k[u] (rows ldk apart, dp floats
 * read), VW / 2 keys at a time: each vector of keys loaded once for both rows. Lines [x, x1) of `pf` are
 * prefetched along the way, a few per step. */
static inline TARGET void F(dots2)(const float *restrict q0, const float *restrict q1, const float *restrict k,
                                   int64_t ldk, int64_t dp, const struct F(ahead) *pf, int64_t x, int64_t x1,
                                   VF *s0, VF *s1) {
    enum { HALF = VW / 2 };
    VF c0[VW], c1[VW];
    const int64_t each = ((x1 - x) * HALF + dp - 1) / dp; /* lines per step (2 dp / VW steps) */
    for (int h = 0; h < VW; h += HALF) {
        VF a0[HALF], a1[HALF];
        for (int u = 0; u < HALF; u++) a0[u] = a1[u] = (VF){};
        for (int64_t t = 0; t < dp; t += VW) {
            for (int64_t y = 0; y < each && x < x1; y++, x++) F(prefetch)(pf, x);
            const VF b0 = *(const VF *)(q0 + t), b1 = *(const VF *)(q1 + t);
            for (int u = 0; u < HALF; u++) {
                const VF kk = *(const VFU *)(k + (h + u) * ldk + t);
                a0[u] += b0 * kk, a1[u] += b1 * kk;
            }
        }
        for (int u = 0; u < HALF; u++) c0[h + u] = a0[u], c1[h + u] = a1[u];
    }
    for (; x < x1; x++) F(prefetch)(pf, x);
    *s0 = F(fold)(c0);
    *s1 = F(fold)(c1);
}

/* acc[r][dvp] += sum over keys u in [a, z) of p[r][u] v[u] for NR rows (p's rows VW apart, acc's dvp,
 * v's ldv items of type ELEM, LOAD(x) the VW values at x as floats): each row of v loaded (and converted)
 * once for the NR rows, NC vectors of columns at a time (NR NC accumulators in registers). */
#define PVG(NAME, NR, NC, ELEM, LOAD)                                                                          \
    static inline TARGET void F(NAME)(const float *restrict p, int64_t a, int64_t z, const ELEM *restrict v,   \
                                      int64_t ldv, int64_t dvp, float *restrict acc) {                         \
        int64_t t = 0;                                                                                         \
        for (; t + NC * VW <= dvp; t += NC * VW) {                                                             \
            VF c[NR][NC];                                                                                      \
            for (int r = 0; r < NR; r++)                                                                       \
                for (int i = 0; i < NC; i++) c[r][i] = *(const VF *)(acc + r * dvp + t + i * VW);              \
            for (int64_t u = a; u < z; u++) {                                                                  \
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
    }
#define LOAD_F32(x) (*(const VFU *)(x))
#define LOAD_BF16(x) F(bf16v)(x)
#define LOAD_F16(x) CVTPH(x)
#define PVGS(T, ELEM, LOAD) PVG(CAT(pv1, T), 1, 4, ELEM, LOAD) PVG(CAT(pv2, T), 2, 4, ELEM, LOAD) PVG4(CAT(pv4, T), ELEM, LOAD)
#if VW == 16 /* 16 accumulators: AVX-512 has the registers */
#define PVG4(NAME, ELEM, LOAD) PVG(NAME, 4, 4, ELEM, LOAD)
#define PV_ROWS 4
#elif DECODE_PV4 /* AVX2 and the baseline: 4 rows of 2 vectors of columns (each v vector converted once for 4) */
#define PVG4(NAME, ELEM, LOAD) PVG(NAME, 4, 2, ELEM, LOAD)
#define PV_ROWS 4
#else
#define PVG4(NAME, ELEM, LOAD)
#define PV_ROWS 2
#endif
PVGS(f32, float, LOAD_F32)
PVGS(bf16, uint16_t, LOAD_BF16)
PVGS(f16, uint16_t, LOAD_F16)

/* pv for nr (1, 2 or PV_ROWS) rows of v stored as `type` */
static inline TARGET void F(pv_rows)(int type, int64_t nr, const float *p, int64_t a, int64_t z, const void *v,
                                     int64_t ldv, int64_t dvp, float *acc) {
#define PV_CASE(T, ELEM)                                                                                       \
    if (nr == 1) F(CAT(pv1, T))(p, a, z, (const ELEM *)v, ldv, dvp, acc);                                      \
    else if (nr == 2) F(CAT(pv2, T))(p, a, z, (const ELEM *)v, ldv, dvp, acc);                                 \
    else PV4_CALL(T, ELEM)
#if PV_ROWS == 4
#define PV4_CALL(T, ELEM) F(CAT(pv4, T))(p, a, z, (const ELEM *)v, ldv, dvp, acc);
#else
#define PV4_CALL(T, ELEM) {}
#endif
    if (type == DT_F32) {
        PV_CASE(f32, float)
    } else if (type == DT_BF16) {
        PV_CASE(bf16, uint16_t)
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

/* Keys j + [c[0], c[1]) and j + [c[2], c[3]) of a block of nk are those a query with keys iv sees. */
static inline TARGET void F(seen_in)(const int64_t *iv, int64_t j, int64_t nk, int64_t c[4]) {
    vis_cols(iv, j, nk, c);
}

/* One work item: chunk it % chunks of (sequence b, k/v head hk), it / chunks = b Hkv + hk, for the group's
 * rows r = gi Tq + i (query head hk G + gi, query i). Writes the item's partial result: acc (rows, dvp)
 * unnormalised, then each row's maximum and sum (base 2; -inf and 0 where it saw nothing here).
 * Not inlined: the variant's work sits in a function named for it (the tests disassemble it). */
static TARGET __attribute__((noinline)) void F(ditem)(const struct dproblem *pr, float *scr, int64_t it) {
    const int64_t rows = pr->rows, d = pr->d, dv = pr->dv, dp = pr->dp, dvp = pr->dvp, tq = pr->tq;
    const int64_t bh = it / pr->chunks, b = bh / pr->hkv, hk = bh % pr->hkv;
    float *restrict acc = pr->parts + it * pr->part, *restrict m = acc + rows * dvp, *restrict l = m + rows;
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    pr->checks[2 * it] = pr->checks[2 * it + 1] = 0.0f;
    int64_t j0, j1;
    decode_chunk(pr, b, hk, it % pr->chunks, &j0, &j1);
    if (j1 <= j0) return;
    float *restrict q = scr, *restrict kf = q + rows * dp, *restrict vf = kf + VW * dp, *restrict lv = vf + VW * dvp;
    float *restrict p = lv + rows * VW; /* (rows, VW) weights of the block */
    int64_t *bound = (int64_t *)(p + rows * VW); /* each row's keys: two intervals [lo, hi) */
    const int64_t flat0 = b * pr->h + hk * pr->g; /* the group's first query head */
    int gaps = 0; /* some row sees two runs of keys (sink tokens and a window): blocks between may be unseen */
    for (int64_t r = 0; r < rows; r++) {
        vis_row(pr->vis, flat0 + r / tq, r % tq, bound + 4 * r);
        gaps |= bound[4 * r + 3] > bound[4 * r + 2];
    }
    const float mul = pr->scale * 1.4426950408889634f; /* scores in base 2: exp2 instead of exp */
    const float *src = (const float *)pr->q + (b * pr->h + hk * pr->g) * tq * d; /* the group's rows, contiguous */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < dp; t++) q[r * dp + t] = t < d ? src[r * d + t] * mul : 0.0f;
    memset(acc, 0, sizeof(float) * rows * dvp);
    memset(lv, 0, sizeof(float) * rows * VW);
    const size_t item = pr->kvtype == DT_F32 ? 4 : 2;
    const char *kh = (const char *)pr->k + (b * pr->kb + hk * pr->kh) * item;
    const char *vh = (const char *)pr->v + (b * pr->vb + hk * pr->vh) * item;
    /* read in place: whole blocks of float32 keys; values of any dtype, converted as loaded, where their
     * rows are whole vectors (else staged in L1, padded) */
    const int k_direct = DECODE_KDIRECT && pr->kvtype == DT_F32 && dp == d, v_direct = dvp == dv;
    VI lane;
    for (int u = 0; u < VW; u++) lane[u] = u;
    VF bad = {}, big = {}; /* the check of what is read: the scores' NaN/Inf, their largest |value| */
    for (int64_t j = j0; j < j1; j += VW) {
        const int64_t nk = j1 - j < VW ? j1 - j : VW;
        int any = !gaps; /* some row sees a key of the block: else it is not read (the chunk is inside one run) */
        for (int64_t r = 0; r < rows && !any; r++) {
            int64_t c[4];
            F(seen_in)(bound + 4 * r, j, nk, c);
            any = c[1] > c[0];
        }
        if (!any) continue;
        const float *kb = kf;
        int64_t ldk = dp;
        if (k_direct && nk == VW)
            kb = (const float *)kh + j * d, ldk = d;
        else
            F(stage)(kh + j * d * item, pr->kvtype, nk, d, kf, dp);
        const void *vb = vf; /* the block's values: rows u in [0, nk) */
        int64_t ldv = dvp;
        int vtype = DT_F32;
        if (v_direct)
            vb = vh + j * dv * item, ldv = dv, vtype = pr->kvtype;
        else
            F(stage)(vh + j * dv * item, pr->kvtype, nk, dv, vf, dvp);
        /* the block DECODE_AHEAD ahead, prefetched a few lines at a time as the rows' scores are computed (one
         * stream per core is latency-bound without it; all at once, the prefetches queue behind each other) */
        const int ahead = DECODE_AHEAD > 0 && j + (DECODE_AHEAD + 1) * VW <= j1 && (DECODE_PF16 || pr->kvtype == DT_F32);
        const struct F(ahead) pf = {kh + (j + DECODE_AHEAD * VW) * d * item, vh + (j + DECODE_AHEAD * VW) * dv * item,
                                    ahead ? VW * d * (int64_t)item / 64 : 0};
        const int64_t lines = ahead ? pf.k_lines + VW * dv * (int64_t)item / 64 : 0, pairs = (rows + 1) / 2;
        for (int64_t r = 0; r < rows; r += 2) { /* every row's scores into p[r], two rows at a time */
            const int64_t x0 = lines * (r / 2) / pairs, x1 = lines * (r / 2 + 1) / pairs, r1 = r + 1 < rows ? r + 1 : r;
            F(dots2)(q + r * dp, q + r1 * dp, kb, ldk, dp, &pf, x0, x1, (VF *)(p + r * VW), (VF *)(p + r1 * VW));
        }
        for (int64_t r = 0; r < rows; r++) { /* each row's weights of the block: p[r] (0 where unseen) */
            int64_t c[4]; /* the row sees keys j + [c0, c1) and j + [c2, c3) */
            F(seen_in)(bound + 4 * r, j, nk, c);
            if (c[1] <= c[0]) {
                *(VF *)(p + r * VW) = (VF){};
                continue;
            }
            const VI seen = ((lane >= (int32_t)c[0]) & (lane < (int32_t)c[1])) | ((lane >= (int32_t)c[2]) & (lane < (int32_t)c[3]));
            VF s = *(const VF *)(p + r * VW);
            bad += s * 0.0f; /* NaN from here on where a score is not finite: a key that is not (q is) */
            big = F(select)(s > big, s, F(select)(-s > big, -s, big));
            if (pr->vis->cap > 0.0f) s = F(tanhv)(s * (1.0f / pr->vis->cap)) * pr->vis->cap;
            s = F(select)(seen, s, (VF){} - INFINITY);
            const float slope = vis_slope(pr->vis, flat0 + r / tq);
            if (slope != 0.0f) {
                const VF dist = __builtin_convertvector((VI){} + (int32_t)(vis_pos(pr->vis, flat0 + r / tq, r % tq) - j) - lane, VF);
                s -= slope * F(select)(dist < 0.0f, -dist, dist);
            }
            float top = m[r];
            for (int u = 0; u < VW; u++) top = s[u] > top ? s[u] : top;
            if (top > m[r]) { /* a new maximum: rescale what the row has summed so far */
                const float alpha = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - top);
                *(VF *)(lv + r * VW) *= alpha;
                for (int64_t t = 0; t < dvp; t++) acc[r * dvp + t] *= alpha;
                m[r] = top;
            }
            const VF e = F(exp2v)(s - m[r]);
            *(VF *)(lv + r * VW) += e;
            *(VF *)(p + r * VW) = e;
        }
        for (int64_t r = 0; r < rows; r += PV_ROWS) { /* acc += p v, PV_ROWS rows sharing each row of v */
            const int64_t nr = rows - r < PV_ROWS ? rows - r : PV_ROWS;
            int64_t a = nk, z = 0; /* the keys some row of them sees */
            for (int64_t x = r; x < r + nr; x++) {
                int64_t c[4];
                F(seen_in)(bound + 4 * x, j, nk, c);
                if (c[1] > c[0]) a = c[0] < a ? c[0] : a, z = c[3] > z ? c[3] : z;
            }
            if (z <= a) continue;
            if (nr == PV_ROWS) {
                F(pv_rows)(vtype, nr, p + r * VW, a, z, vb, ldv, dvp, acc + r * dvp);
                continue;
            }
            for (int64_t x = r; x < r + nr; x += 2)
                F(pv_rows)(vtype, r + nr - x >= 2 ? 2 : 1, p + x * VW, a, z, vb, ldv, dvp, acc + x * dvp);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int u = 0; u < VW; u++) l[r] += lv[r * VW + u];
    float top = 0.0f, nan = 0.0f;
    for (int u = 0; u < VW; u++) top = big[u] > top ? big[u] : top, nan += bad[u];
    pr->checks[2 * it] = top, pr->checks[2 * it + 1] = nan;
}

/* Output row `row` of the B Hkv groups' rows: its chunks merged by their log-sum-exp, in chunk order. */
static TARGET void F(dmerge)(const struct dproblem *pr, int64_t row) {
    const int64_t rows = pr->rows, dv = pr->dv, dvp = pr->dvp, r = row % rows;
    const float *first = pr->parts + (row / rows) * pr->chunks * pr->part;
    float *restrict out = pr->out + row * dv; /* group bh's rows start at (b H + hk G) Tq = bh rows */
    const float sink = vis_sink(pr->vis, (row / rows) * pr->g + r / pr->tq); /* query head (b H + hk G + gi) */
    float top = sink; /* a learned sink: one more part, of score sink, sum 1 and no value */
    for (int64_t c = 0; c < pr->chunks; c++) {
        const float mc = first[c * pr->part + rows * dvp + r];
        top = mc > top ? mc : top;
    }
    for (int64_t t = 0; t < dv; t++) out[t] = 0.0f;
    if (top == -INFINITY) { /* nothing seen: zeros, LSE -inf */
        pr->lse[row] = -INFINITY;
        return;
    }
    float sum = sink == -INFINITY ? 0.0f : exp2f(sink - top);
    for (int64_t c = 0; c < pr->chunks; c++) {
        const float *part = first + c * pr->part, mc = part[rows * dvp + r];
        if (mc == -INFINITY) continue;
        const float w = exp2f(mc - top);
        sum += w * part[rows * dvp + rows + r];
        for (int64_t t = 0; t < dv; t++) out[t] += w * part[r * dvp + t];
    }
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < dv; t++) out[t] *= inv;
    pr->lse[row] = (float)(((double)top + log2((double)sum)) * 0.69314718055994531);
}

/* The whole call: every chunk of every (sequence, k/v head) on the threads, then every row's merge. */
static TARGET int F(drun)(struct dproblem *pr) {
    pr->g = pr->h / pr->hkv;
    pr->rows = pr->g * pr->tq;
    pr->dp = (pr->d + VW - 1) / VW * VW;
    pr->dvp = (pr->dv + VW - 1) / VW * VW;
    pr->part = (pr->rows * (pr->dvp + 2) + 15) / 16 * 16; /* every item's partial starts on a 64-byte line */
    const int64_t heads = pr->b * pr->hkv;
    int64_t chunks = (pr->tk + DECODE_MIN_CHUNK - 1) / DECODE_MIN_CHUNK;
    if (chunks > DECODE_MAX_ITEMS / heads) chunks = DECODE_MAX_ITEMS / heads;
    if (chunks > DECODE_MAX_PART / (heads * pr->part)) chunks = DECODE_MAX_PART / (heads * pr->part);
    pr->chunks = chunks < 1 ? 1 : chunks;
    const int64_t items = heads * pr->chunks;
    float *parts = aligned_alloc(64, round64(sizeof(float) * (size_t)(items * (pr->part + 2))));
    if (!parts) return -1;
    pr->parts = parts, pr->checks = parts + items * pr->part;
    const size_t per_thread = sizeof(float) * (pr->rows * (pr->dp + 2 * VW) + VW * (pr->dp + pr->dvp) + 8 * pr->rows);
    int64_t next = 0;
    int failed = 0;
#pragma omp parallel num_threads(pr->threads)
    {
        float *mem = aligned_alloc(64, round64(per_thread));
        if (!mem) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        } else {
            for (;;) {
                const int64_t it = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
                if (it >= items) break;
                F(ditem)(pr, mem, it);
            }
            free(mem);
        }
#pragma omp barrier
        if (!__atomic_load_n(&failed, __ATOMIC_RELAXED)) {
#pragma omp for schedule(static)
            for (int64_t row = 0; row < heads * pr->rows; row++) F(dmerge)(pr, row);
        }
    }
    float top = 0.0f, nan = 0.0f; /* in item order: the same for any thread count */
    for (int64_t it = 0; it < items; it++) top = pr->checks[2 * it] > top ? pr->checks[2 * it] : top, nan += pr->checks[2 * it + 1];
    pr->largest = nan == 0.0f ? top / 1.4426950408889634f : NAN; /* back from base 2 */
    free(parts);
    return failed ? -1 : 0;
}

#undef COMB
#undef LO8
#undef HI8
#undef LO4
#undef HI4
#undef LO2
#undef HI2
#undef LO1
#undef HI1
#undef VH
#undef PV_ROWS
#undef CVTPH
#undef WIDEN16
