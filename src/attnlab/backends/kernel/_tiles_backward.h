/* The compiled kernel's backward pass, included by _tiles_body.h (inside each instruction set's
 * inclusion, with its parameters VW, RQ, RP, NVMAX, ROWS, SFX and TARGET defined). */

/* ---- The backward pass (FlashAttention-2's), on the same register tiles. ----
 *
 * Per tile (a block of query rows of one head x a block of keys), recomputed from q, k, v and the
 * forward's LSE: S = (q scale log2 e) k^T in base 2 (the forward's very scores), P = exp2(S - LSE log2 e),
 * dP = dO v^T, dS = P (dP - D) with D = rowsum(dO o) - dLSE (once per row, before the tiles); then
 * dV_j += P^T dO, dK_j += dS^T (q scale log2 e), dQ_i += dS k (times ln 2 and scale at the end).
 * Causal and window tiles that the band empties are skipped, the last key block cut where the band
 * ends, as in the forward. Extra memory: D (one float a query row) and per thread a few tiles
 * (the heads schedule adds a copy of one head's dQ): O(n) beyond the inputs and gradients.
 * Three schedules (the first two bit for bit the same: the same tile function, each accumulator summed
 * in the same order: dQ_i over key blocks ascending, dK_j and dV_j over (query head, query block) ascending):
 *   heads  (B >= threads) a work item is one key/value head with its G query heads: key blocks in
 *          ascending order, each against the query blocks that see it, dK_j and dV_j in the thread's
 *          tile and dQ in the thread's copy of the head's (5 GEMMs a tile);
 *   split  (fewer heads than threads) items (head, key block) accumulate dK_j, dV_j (4 GEMMs a tile),
 *          then items (query head, query block) dQ_i (3 GEMMs: S, dP again and dS k);
 *   groups (B < KGROUP_HEADS, whatever the threads, where the buffers below take at most KGROUP_FLOATS)
 *          the heads schedule on groups of a head's key blocks, ceil(KGROUP_HEADS / B) groups (at most
 *          one a key block), each item's dQ in a buffer of its own, the groups' added in group order
 *          once every item is done (5 GEMMs a tile: one head feeds several threads without split's 7).
 * The groups depend on the shapes alone. No thread writes what another reads or writes: deterministic,
 * whatever the thread count. */

/* acc[R][NV VW] += x^T-weighted rows: acc[c][:] += sum_i p[i][c] x[i][:], for R consecutive columns c of p.
 * The tile's sum is formed from zero and then added: a gradient summed over thousands of rows is a
 * sum of per-tile sums, whose rounding grows with rows / tile + tile rather than with the rows. */
#define PVT(NAME, R, NV)                                                                                            \
    static inline TARGET void F(NAME)(const float *restrict p, int64_t ldp, const float *restrict x, int64_t ldx,    \
                                      int64_t nr, float *restrict acc, int64_t lda) {                               \
        VF c[R][NV];                                                                                                \
        for (int r = 0; r < R; r++)                                                                                 \
            for (int u = 0; u < NV; u++) c[r][u] = (VF){};                                                          \
        for (int64_t i = 0; i < nr; i++) {                                                                          \
            VF b[NV];                                                                                               \
            for (int u = 0; u < NV; u++) b[u] = *(const VF *)(x + i * ldx + u * VW);                                \
            for (int r = 0; r < R; r++) {                                                                           \
                const float a = p[i * ldp + r];                                                                     \
                for (int u = 0; u < NV; u++) c[r][u] += a * b[u];                                                   \
            }                                                                                                       \
        }                                                                                                           \
        for (int r = 0; r < R; r++)                                                                                 \
            for (int u = 0; u < NV; u++) *(VFU *)(acc + r * lda + u * VW) += c[r][u];                               \
    }
PVT(pvt_r1, RP, 1)
PVT(pvt_r2, RP, 2)
PVT(pvt_11, 1, 1)
PVT(pvt_12, 1, 2)
#if NVMAX >= 3
PVT(pvt_r3, RP, 3)
PVT(pvt_r4, RP, 4)
PVT(pvt_13, 1, 3)
PVT(pvt_14, 1, 4)
#endif

/* acc[c][0..w) += sum_{i < nr} p[i][c] x[i][0..w) for the columns c < nc of p; w a multiple of VW */
static inline TARGET void F(pvt)(const float *restrict p, int64_t ldp, const float *restrict x, int64_t ldx, int64_t nr,
                                 int64_t nc, float *restrict acc, int64_t w) {
    int64_t c = 0;
    for (; c + RP <= nc; c += RP) {
        int64_t t = 0;
#if NVMAX >= 3
        for (; t + 4 * VW <= w; t += 4 * VW) F(pvt_r4)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w);
        if (w - t == 3 * VW) F(pvt_r3)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w), t = w;
#endif
        for (; t + 2 * VW <= w; t += 2 * VW) F(pvt_r2)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w);
        if (t < w) F(pvt_r1)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w);
    }
    for (; c < nc; c++) {
        int64_t t = 0;
#if NVMAX >= 3
        for (; t + 4 * VW <= w; t += 4 * VW) F(pvt_14)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w);
        if (w - t == 3 * VW) F(pvt_13)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w), t = w;
#endif
        for (; t + 2 * VW <= w; t += 2 * VW) F(pvt_12)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w);
        if (t < w) F(pvt_11)(p + c, ldp, x + t, ldx, nr, acc + c * w + t, w);
    }
}

/* Keys j0..j0+bk-1 of batch b and their values into the thread's panels, kp[bk / VW][d][VW] and
 * vp[bk / VW][dv][VW] (zero past Tk), and, when d is not a whole number of vectors, the keys' rows
 * into kr[bk][dp] (zero padded), or with VPW always, in its column panels (kr[dp / VPW][bk][VPW]). A key block at a time, where it is used: no copy of all of k and v. */
static TARGET void F(bpack)(const struct bproblem *pr, struct bscratch *sc, int64_t b, int64_t j0) {
    if (sc->packed_b == b && sc->packed_j0 == j0) return;
    const int64_t d = pr->d, dv = pr->dv, tk = pr->tk;
    const float *k = pr->k + b * tk * d, *v = pr->v + b * tk * dv;
    for (int64_t j = 0; j < pr->bk; j++) {
        const int live = j0 + j < tk;
        float *kp = sc->kp + (j / VW) * d * VW + j % VW, *vp = sc->vp + (j / VW) * dv * VW + j % VW;
        for (int64_t t = 0; t < d; t++) kp[t * VW] = live ? k[(j0 + j) * d + t] : 0.0f;
        for (int64_t t = 0; t < dv; t++) vp[t * VW] = live ? v[(j0 + j) * dv + t] : 0.0f;
        if (VPW) /* the keys' rows in column panels as the forward packs v (F(pack)), for dS k */
            for (int64_t t0 = 0; t0 < pr->dp; t0 += VPW) {
                const int64_t w = t0 + VPW < pr->dp ? VPW : pr->dp - t0;
                for (int64_t u = 0; u < w; u++)
                    sc->kr[t0 * pr->bk + j * w + u] = live && t0 + u < d ? k[(j0 + j) * d + t0 + u] : 0.0f;
            }
        else if (pr->dp != d)
            for (int64_t t = 0; t < pr->dp; t++) sc->kr[j * pr->dp + t] = live && t < d ? k[(j0 + j) * d + t] : 0.0f;
    }
    sc->packed_b = b, sc->packed_j0 = j0;
}

/* The keys [lo, hi) that some row of query rows i0..i1-1 of head (b, g) may see. */
static inline TARGET void F(bkeys)(const struct bproblem *pr, int64_t b, int64_t g, int64_t i0, int64_t i1, int64_t *lo,
                                   int64_t *hi) {
    vis_range(pr->vis, b * pr->g + g, i0, i1, lo, hi);
}

/* D = rowsum(dO o) - dLSE of rows r0..r1-1 (of every head), in double, rounded to float once. */
static void F(bdelta)(const struct bproblem *pr, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *dout = pr->dout + r * pr->dv, *out = pr->out + r * pr->dv;
        double delta = 0;
        for (int64_t t = 0; t < pr->dv; t++) delta += (double)dout[t] * out[t];
        pr->delta[r] = (float)(pr->dlse ? delta - pr->dlse[r] : delta);
    }
}

/* A query block's rows into the thread's scratch: q (times scale log2 e, as the forward has it, so
 * that S - LSE comes out of the very scores the LSE was summed from) and dO, zero padded to whole
 * vectors and rows, LSE in base 2 as hi + lo (hi -inf: the row saw nothing, its gradients are 0) and D. */
static TARGET __attribute__((noinline)) void F(brows)(const struct bproblem *pr, const struct bscratch *sc, int64_t b,
                                                      int64_t g, int64_t i0, int64_t nr) {
    const int64_t d = pr->d, dv = pr->dv, dp = pr->dp, dvp = pr->dvp, row0 = (b * pr->g + g) * pr->tq + i0;
    const float mul = pr->scale * 1.4426950408889634f; /* the forward's factor, rounded the same way */
    if (d != dp || nr < pr->bqp) memset(sc->q, 0, sizeof(float) * pr->bqp * dp);
    if (dv != dvp || nr < pr->bqp) memset(sc->dout, 0, sizeof(float) * pr->bqp * dvp);
    for (int64_t r = 0; r < pr->bqp; r++) sc->lse2[r] = -INFINITY, sc->lse2lo[r] = sc->delta[r] = 0.0f;
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t t = 0; t < d; t++) sc->q[r * dp + t] = pr->q[(row0 + r) * d + t] * mul; /* as the forward */
        memcpy(sc->dout + r * dvp, pr->dout + (row0 + r) * dv, sizeof(float) * dv);
        const float lse = pr->lse[row0 + r];
        if (isfinite(lse)) { /* LSE log2 e as hi + lo: its rounding would be a row's relative error in P */
            const double lse2 = (double)lse * 1.4426950408889634;
            sc->lse2[r] = (float)lse2;
            sc->lse2lo[r] = (float)(lse2 - (float)lse2);
        }
        sc->delta[r] = pr->delta[row0 + r];
    }
}

/* One tile: the query block in the scratch (rows i0.. of head (b, g), nr of them) against keys
 * j0..j0+nc-1. dk, dv: nc rows to add dK_j / (scale log2 e), dV_j to, or NULL; dq: the block's dQ_i
 * (bqp x dp, unscaled), or NULL. */
static TARGET __attribute__((noinline)) void F(btile)(const struct bproblem *pr, struct bscratch *sc, int64_t b,
                                                      int64_t g, int64_t i0, int64_t nr, int64_t j0, int64_t nc,
                                                      float *dk, float *dv, float *dq) {
    const int64_t d = pr->d, dp = pr->dp, dvp = pr->dvp, bk = pr->bk;
    const int64_t ncp = (nc + VW - 1) / VW * VW, nrq = (nr + ROWS - 1) / ROWS * ROWS;
    const int64_t bg = b * pr->g + g;
    const float slope = vis_slope(pr->vis, bg);
    float *restrict s = sc->s, *restrict ds = sc->ds;
    F(bpack)(pr, sc, b, j0);
    const float *kp = sc->kp, *vp = sc->vp;
    for (int64_t r = 0; r < nrq; r += RQ) { /* S = q k^T, dP = dO v^T */
        int64_t c = 0;
        for (; c + 2 * VW <= ncp; c += 2 * VW) {
            F(qk2)(sc->q + r * dp, dp, d, kp + c * d, kp + (c + VW) * d, s + r * bk + c, bk, NULL);
            F(qk2)(sc->dout + r * dvp, dvp, pr->dv, vp + c * pr->dv, vp + (c + VW) * pr->dv, ds + r * bk + c, bk, NULL);
        }
        if (c < ncp) {
            F(qk1)(sc->q + r * dp, dp, d, kp + c * d, s + r * bk + c, bk, NULL);
            F(qk1)(sc->dout + r * dvp, dvp, pr->dv, vp + c * pr->dv, ds + r * bk + c, bk, NULL);
        }
    }
    for (int64_t r = 0; r < nrq; r++) { /* P = exp2(S - LSE log2 e) (S in base 2), dS = P (dP - D); 0 where hidden */
        float *restrict prow = s + r * bk, *restrict dsrow = ds + r * bk;
        int64_t iv[4], c4[4] = {0, 0, 0, 0};
        if (r < nr) vis_row(pr->vis, bg, i0 + r, iv), vis_cols(iv, j0, nc, c4);
        if (r >= nr || c4[1] <= c4[0] || sc->lse2[r] == -INFINITY) {
            memset(prow, 0, sizeof(float) * ncp);
            memset(dsrow, 0, sizeof(float) * ncp);
            continue;
        }
        float *restrict th = pr->vis->cap > 0.0f ? sc->th : NULL; /* the row's tanh, for dS's 1 - t^2 */
        if (th) F(softcap)(prow, ncp, pr->vis->cap, th);
        if (slope != 0.0f) F(alibi)(prow, c4[0], c4[3], slope, vis_pos(pr->vis, bg, i0 + r) - j0);
        const VF lse2 = (VF){} + sc->lse2[r], lse2lo = (VF){} + sc->lse2lo[r], delta = (VF){} + sc->delta[r];
        for (int64_t c = 0; c < ncp; c += VW) {
            const VF p = F(exp2v)((*(const VF *)(prow + c) - lse2) - lse2lo);
            *(VF *)(prow + c) = p;
            *(VF *)(dsrow + c) = p * (*(const VF *)(dsrow + c) - delta);
            if (th) *(VF *)(dsrow + c) *= 1.0f - *(const VF *)(th + c) * *(const VF *)(th + c);
        }
        for (int64_t c = 0; c < c4[0]; c++) prow[c] = dsrow[c] = 0.0f;
        for (int64_t c = c4[1]; c < c4[2]; c++) prow[c] = dsrow[c] = 0.0f;
        for (int64_t c = c4[3]; c < ncp; c++) prow[c] = dsrow[c] = 0.0f;
    }
    if (dv) F(pvt)(s, bk, sc->dout, dvp, nr, nc, dv, dvp); /* dV_j += P^T dO */
    if (dk) F(pvt)(ds, bk, sc->q, dp, nr, nc, dk, dp);     /* dK_j += dS^T q */
    if (dq) { /* dQ_i += dS k */
#if VPW
        for (int64_t t0 = 0; t0 < dp; t0 += VPW) { /* a panel of k's columns: its rows contiguous */
            const int64_t w = t0 + VPW < dp ? VPW : dp - t0;
            for (int64_t r = 0; r < nrq; r += RP)
                if (w == 2 * VW)
                    F(pvf_2)(ds + r * bk, bk, sc->kr + t0 * bk, w, nc, dq + r * dp + t0, dp);
                else /* the last panel, one vector wide */
                    F(pvf_1)(ds + r * bk, bk, sc->kr + t0 * bk, w, nc, dq + r * dp + t0, dp);
        }
#else
        const float *kr = dp != d ? sc->kr : pr->k + (b * pr->tk + j0) * d;
        for (int64_t r = 0; r < nrq; r += RP) F(pvf)(ds + r * bk, bk, kr, dp, nc, dq + r * dp, dp);
#endif
    }
}

/* dst[n][w0] = scale src[n][w] (the first w0 columns) */
static inline void F(bstore)(float *restrict dst, int64_t w0, const float *restrict src, int64_t w, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < w0; t++) dst[i * w0 + t] = src[i * w + t] * scale;
}

/* dQ_i of query rows i0..i0+nr-1 of head (b, g) (the block already in the scratch), against every
 * key block it sees in ascending order: the split schedule's second pass. */
static TARGET void F(bqblock)(const struct bproblem *pr, struct bscratch *sc, int64_t b, int64_t g, int64_t i0,
                              int64_t nr) {
    int64_t lo, hi;
    F(bkeys)(pr, b, g, i0, i0 + nr, &lo, &hi);
    memset(sc->dq, 0, sizeof(float) * pr->bqp * pr->dp);
    for (int64_t j0 = lo / pr->bk * pr->bk; lo < hi && j0 < hi; j0 += pr->bk)
        if (vis_meets(pr->vis, b * pr->g + g, i0, i0 + nr, j0, j0 + pr->bk < hi ? j0 + pr->bk : hi))
            F(btile)(pr, sc, b, g, i0, nr, j0, (j0 + pr->bk < hi ? j0 + pr->bk : hi) - j0, NULL, NULL, sc->dq);
    F(bstore)(pr->gq + ((b * pr->g + g) * pr->tq + i0) * pr->d, pr->d, sc->dq, pr->dp, nr, pr->scale);
}

/* dK_j, dV_j of keys j0.. of head b, over every (query head, query block) that sees them, in
 * ascending order. dq: NULL (the split schedule's first pass), or the head's (or its key group's) dQ
 * accumulators (G x query blocks x bqp x dp), which the tiles add to on the way. */
static TARGET void F(bkblock)(const struct bproblem *pr, struct bscratch *sc, int64_t b, int64_t j0, float *dq) {
    const int64_t nk = (j0 + pr->bk < pr->tk ? j0 + pr->bk : pr->tk) - j0;
    memset(sc->dk, 0, sizeof(float) * pr->bk * pr->dp);
    memset(sc->dv, 0, sizeof(float) * pr->bk * pr->dvp);
    for (int64_t g = 0, at = 0; g < pr->g; g++)
        for (int64_t i0 = 0; i0 < pr->tq; i0 += pr->bq, at += pr->bqp * pr->dp) {
            const int64_t nr = (i0 + pr->bq < pr->tq ? i0 + pr->bq : pr->tq) - i0;
            int64_t lo, hi;
            F(bkeys)(pr, b, g, i0, i0 + nr, &lo, &hi);
            if (lo >= hi || j0 >= hi || j0 + pr->bk <= lo) continue; /* the same tiles as bqblock visits */
            if (!vis_meets(pr->vis, b * pr->g + g, i0, i0 + nr, j0, j0 + pr->bk < hi ? j0 + pr->bk : hi)) continue;
            F(brows)(pr, sc, b, g, i0, nr);
            F(btile)(pr, sc, b, g, i0, nr, j0, (j0 + pr->bk < hi ? j0 + pr->bk : hi) - j0, sc->dk, sc->dv,
                     dq ? dq + at : NULL);
        }
    F(bstore)(pr->gk + (b * pr->tk + j0) * pr->d, pr->d, sc->dk, pr->dp, nk, 0.69314718f); /* dS^T (q scale log2 e) ln 2 */
    F(bstore)(pr->gv + (b * pr->tk + j0) * pr->dv, pr->dv, sc->dv, pr->dvp, nk, 1.0f);
}

/* dst (rows of head b's dQ, G x Tq x D) = scale dq, the head's accumulators (G x query blocks x bqp x dp) */
static void F(bdqstore)(const struct bproblem *pr, int64_t b, int64_t g, int64_t i0, const float *dq) {
    const int64_t nr = (i0 + pr->bq < pr->tq ? i0 + pr->bq : pr->tq) - i0;
    F(bstore)(pr->gq + ((b * pr->g + g) * pr->tq + i0) * pr->d, pr->d, dq, pr->dp, nr, pr->scale);
}

#define KGROUP_HEADS 8            /* key/value heads (B) from which the groups schedule is not used */
#define KGROUP_FLOATS (1 << 22)   /* the groups' dQ buffers take at most this (16 MB) */

/* The whole backward call. Returns -1 where memory ran out. */
static TARGET int F(brun)(struct bproblem *pr) {
    pr->bqp = (pr->bq + ROWS - 1) / ROWS * ROWS;
    pr->bk = (pr->bk + VW - 1) / VW * VW;
    pr->dp = (pr->d + VW - 1) / VW * VW;
    pr->dvp = (pr->dv + VW - 1) / VW * VW;
    const int64_t qblocks = (pr->tq + pr->bq - 1) / pr->bq, kblocks = (pr->tk + pr->bk - 1) / pr->bk;
    const int64_t hdq = pr->g * qblocks * pr->bqp * pr->dp; /* a head's dQ accumulators */
    int64_t groups = pr->b > 0 ? (KGROUP_HEADS + pr->b - 1) / pr->b : 1; /* key groups per head: shapes only */
    groups = groups < kblocks ? groups : kblocks > 0 ? kblocks : 1;
    while (groups > 1 && pr->b * groups * hdq > KGROUP_FLOATS) groups--;
    const int heads = groups == 1 && pr->b >= pr->threads; /* the schedule: groups, heads, else split */
    const int64_t items = groups > 1 || heads ? pr->b * groups : pr->b * kblocks, qitems = heads ? 0 : pr->b * pr->g * qblocks;
    const int threads = (int)(pr->threads < (items > qitems ? items : qitems) ? pr->threads : (items > qitems ? items : qitems));
    const int64_t nrows = pr->b * pr->g * pr->tq;
    float *delta = aligned_alloc(64, round64(sizeof(float) * nrows));
    float *gdq = groups > 1 ? aligned_alloc(64, round64(sizeof(float) * items * hdq)) : NULL; /* each item's dQ */
    if (!delta || (groups > 1 && !gdq)) {
        free(delta);
        free(gdq);
        return -1;
    }
    pr->delta = delta;
    /* per thread: q, dO of a query block; LSE (hi, lo), D; the P and dS tiles; dQ_i (split) or the head's dQ (heads);
     * dK_j, dV_j; the key block's panels of k and v, and k's rows padded */
    const int64_t sizes[] = {pr->bqp * pr->dp, pr->bqp * pr->dvp, pr->bqp, pr->bqp, pr->bqp, pr->bqp * pr->bk,
                             pr->bqp * pr->bk, groups > 1 ? 0 : heads ? hdq : pr->bqp * pr->dp, pr->bk * pr->dp,
                             pr->bk * pr->dvp, pr->bk * pr->d, pr->bk * pr->dv, VPW || pr->dp != pr->d ? pr->bk * pr->dp : 0,
                             pr->bk};
    enum { NPARTS = sizeof sizes / sizeof sizes[0] };
    int64_t per_thread = 0;
    for (int i = 0; i < NPARTS; i++) per_thread += (sizes[i] + 15) / 16 * 16; /* each buffer on a 64-byte line */
    int64_t next = 0, next2 = 0;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < nrows; r0 += 256) F(bdelta)(pr, r0, r0 + 256 < nrows ? r0 + 256 : nrows);
        float *mem = aligned_alloc(64, round64(sizeof(float) * per_thread));
        struct bscratch sc = {.packed_b = -1};
        float **parts[NPARTS] = {&sc.q,  &sc.dout, &sc.lse2, &sc.lse2lo, &sc.delta, &sc.s, &sc.ds,
                                 &sc.dq, &sc.dk,   &sc.dv,   &sc.kp,     &sc.vp,    &sc.kr,     &sc.th};
        for (int64_t i = 0, at = 0; mem && i < NPARTS; at += (sizes[i] + 15) / 16 * 16, i++) *parts[i] = mem + at;
        if (!mem) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        for (; mem && (groups > 1 || heads);) { /* a head and a key group (heads: all its keys); the first groups first */
            const int64_t it = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
            if (it >= items) break;
            const int64_t b = it % pr->b, p = it / pr->b;
            float *dq = groups > 1 ? gdq + it * hdq : sc.dq;
            memset(dq, 0, sizeof(float) * hdq);
            for (int64_t jb = p * kblocks / groups; jb < (p + 1) * kblocks / groups; jb++) F(bkblock)(pr, &sc, b, jb * pr->bk, dq);
            for (int64_t g = 0, at = 0; groups == 1 && g < pr->g; g++)
                for (int64_t i0 = 0; i0 < pr->tq; i0 += pr->bq, at += pr->bqp * pr->dp) F(bdqstore)(pr, b, g, i0, dq + at);
        }
        for (; mem && groups == 1 && !heads;) { /* split: key blocks first, under a causal band the most queries see them */
            const int64_t it = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
            if (it >= items) break;
            F(bkblock)(pr, &sc, it % pr->b, it / pr->b * pr->bk, NULL);
        }
#pragma omp barrier
        for (; mem && groups == 1 && !heads;) { /* split: query blocks, last first: under a causal band they see the most keys */
            const int64_t it = __atomic_fetch_add(&next2, 1, __ATOMIC_RELAXED);
            if (it >= qitems) break;
            const int64_t bg = it % (pr->b * pr->g), i0 = (qblocks - 1 - it / (pr->b * pr->g)) * pr->bq;
            const int64_t nr = (i0 + pr->bq < pr->tq ? i0 + pr->bq : pr->tq) - i0;
            F(brows)(pr, &sc, bg / pr->g, bg % pr->g, i0, nr);
            F(bqblock)(pr, &sc, bg / pr->g, bg % pr->g, i0, nr);
        }
        for (; groups > 1;) { /* groups: a query block's dQ, the groups' in group order */
            const int64_t it = __atomic_fetch_add(&next2, 1, __ATOMIC_RELAXED);
            if (it >= qitems) break;
            const int64_t b = it / (pr->g * qblocks), at = it % (pr->g * qblocks) * pr->bqp * pr->dp;
            float *dq = gdq + b * hdq + at; /* group 0's (item b) */
            for (int64_t p = 1; p < groups; p++) {
                const float *add = gdq + (p * pr->b + b) * hdq + at;
                for (int64_t x = 0; x < pr->bqp * pr->dp; x++) dq[x] += add[x];
            }
            F(bdqstore)(pr, b, it / qblocks % pr->g, it % qblocks * pr->bq, dq);
        }
        free(mem);
    }
    free(delta);
    free(gdq);
    return failed ? -1 : 0;
}
