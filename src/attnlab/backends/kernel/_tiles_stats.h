/* The statistics pass (attnlab.head_stats), included by _tiles_body.h once per instruction set.
 *
 * After the forward has given each row's LSE, the exact weights of a tile are P = exp(S - LSE),
 * recomputed from the very scores the forward summed (q times scale log2 e, LSE in base 2 as
 * hi + lo, as the backward does). From each tile, while it is in the L2 cache, one pass adds
 * every row's weight-weighted distance and entropy terms, its weights on keys i - 1, i, i + 1 and
 * 0, and every key's column sum (the attention it receives). With learned sinks (the LSE holds them) the
 * sink is one more outcome of the entropy, share exp(sink - LSE), and of the count it is normalised by. A head is one work item, its query
 * blocks in order: its sums and column sums are written by one thread in one order, so the result
 * is the same for any thread count. Memory: the outputs (per head NSTATS sums and T column sums)
 * and one tile per thread. */

/* One weight from its base-2 score, as the row's sweep computes it (the few looked up by position). */
static inline TARGET float F(sweight)(float score, const struct sscratch *sc, int64_t r) {
    return F(exp2v)((VF){} + ((score - sc->lse2[r]) - sc->lse2lo[r]))[0];
}

/* One row of a tile: its weights from the scores p (base 2), added to the column sums; the row's distance and
 * entropy terms into acc[0] and acc[1]. `at` = the row's position less the tile's first key. mode 1: the
 * row sees every column and all lie at or before it (|i - j| = at - c, no masking); 2: every column, all at
 * or after it; 0: any columns c4 (masked lane by lane). Inlined with a constant mode: three loops. */
static inline TARGET __attribute__((always_inline)) void F(srow)(const float *restrict p, float *restrict col,
                                                                 int64_t ncp, float lse2s, float lse2los, int64_t at,
                                                                 double *restrict acc, const int64_t c4[4], int mode) {
    VI lane;
    VF lanef;
    for (int u = 0; u < VW; u++) lane[u] = u, lanef[u] = (float)u;
    const VF lse2 = (VF){} + lse2s, lse2lo = (VF){} + lse2los, here = (VF){} + (float)at;
    VF dist = (VF){}, ent = (VF){};
    for (int64_t c = 0; c < ncp; c += VW) {
        const VF x = (*(const VF *)(p + c) - lse2) - lse2lo;
        VF w = F(exp2v)(x), far;
        if (mode == 1) {
            far = here - (lanef + (float)c); /* i - j, exact in float */
        } else if (mode == 2) {
            far = (lanef + (float)c) - here;
        } else {
            const VI idx = lane + (int32_t)c;
            const VI seen = ((idx >= (int32_t)c4[0]) & (idx < (int32_t)c4[1])) |
                            ((idx >= (int32_t)c4[2]) & (idx < (int32_t)c4[3]));
            w = F(select)(seen, w, (VF){});
            const VF gap = __builtin_convertvector(idx - (int32_t)at, VF); /* j - i */
            far = F(select)((VI)(gap < 0.0f), -gap, gap);
            ent += w * F(select)(seen, x, (VF){}); /* w is 0 where unseen, but x may be inf there */
            dist += w * far;
            *(VF *)(col + c) += w;
            continue;
        }
        dist += w * far;
        ent += w * x;
        *(VF *)(col + c) += w;
    }
    for (int u = 0; u < VW; u++) acc[0] += dist[u], acc[1] += ent[u];
}

/* RQ rows of a tile that see each of its columns, all before the rows (mode 1) or all after them (mode 2), and
 * none of keys i - 1, i, i + 1: np (1 or 2) panels of keys from column c. The scores stay in registers (qk2's
 * loop, the same sums), and from them, as srow does and in its order (so the same bits): each weight
 * 2^(s - LSE), the column sums (rows in order), each row's distance and entropy terms into dist[r] and ent[r];
 * with `first` the weight on column 0 (key 0) into acc[5] of each row. Nothing goes through the tile in memory. */
static inline TARGET __attribute__((always_inline)) void F(sfast)(const float *restrict q, int64_t d,
                                                                  const float *restrict k0, const float *restrict k1,
                                                                  int np, int64_t c, const struct sscratch *sc,
                                                                  const float *restrict here, float *restrict col,
                                                                  VF *restrict dist, VF *restrict ent, int first,
                                                                  double *restrict acc, int mode) {
    VF a[RQ][2];
    for (int r = 0; r < RQ; r++) a[r][0] = a[r][1] = (VF){};
    for (int64_t t = 0; t < d; t++) {
        const VF b0 = *(const VF *)(k0 + t * VW), b1 = np == 2 ? *(const VF *)(k1 + t * VW) : (VF){};
        for (int r = 0; r < RQ; r++) {
            const float x = q[r * d + t];
            a[r][0] += x * b0;
            if (np == 2) a[r][1] += x * b1;
        }
    }
    VF lanef;
    for (int u = 0; u < VW; u++) lanef[u] = (float)u;
    for (int u = 0; u < np; u++) {
        VF cs = *(const VF *)(col + c + u * VW);
        const VF at = lanef + (float)(c + u * VW);
        for (int r = 0; r < RQ; r++) {
            const VF x = (a[r][u] - sc->lse2[r]) - sc->lse2lo[r];
            const VF w = F(exp2n)(x); /* exp2v's bits: x <= 0 here (but for rounding) */
            const VF far = mode == 1 ? here[r] - at : at - here[r];
            dist[r] += w * far;
            ent[r] += w * x;
            cs += w;
            if (first && u == 0) acc[r * NROW + 5] += w[0];
        }
        *(VF *)(col + c + u * VW) = cs;
    }
}

/* Rows r0..r0+RQ-1 of a tile (columns c4 of each in cs, their positions pos0 + r) on the fast path: the tile's
 * panels through sfast, then each row's terms added to its accumulators as srow adds them. */
static inline TARGET __attribute__((always_inline)) void F(sstrip)(const struct sproblem *pr, const struct sscratch *sc,
                                                                   const float *kp, int64_t r0, int64_t pos0,
                                                                   int64_t j0, int64_t ncp, int mode) {
    const int64_t d = pr->d;
    VF dist[RQ], ent[RQ];
    float here[RQ];
    for (int r = 0; r < RQ; r++) dist[r] = ent[r] = (VF){}, here[r] = (float)(pos0 + r - j0);
    const struct sscratch rs = {NULL, NULL, NULL, sc->lse2 + r0, sc->lse2lo + r0, NULL};
    const float *q = sc->q + r0 * d;
    double *acc = sc->row + r0 * NROW;
    const int first = j0 == 0;
    int64_t c = 0;
    for (; c + 2 * VW <= ncp; c += 2 * VW)
        F(sfast)(q, d, kp + (j0 + c) * d, kp + (j0 + c + VW) * d, 2, c, &rs, here, sc->col, dist, ent, first && c == 0,
                 acc, mode);
    if (c < ncp) F(sfast)(q, d, kp + (j0 + c) * d, NULL, 1, c, &rs, here, sc->col, dist, ent, first && c == 0, acc, mode);
    for (int r = 0; r < RQ; r++)
        for (int u = 0; u < VW; u++) acc[r * NROW] += dist[r][u], acc[r * NROW + 1] += ent[r][u];
}

/* One head (b, g): every query block against every key it may see. */
static TARGET __attribute__((noinline)) void F(shead)(const struct sproblem *pr, const struct sscratch *sc, int64_t bg) {
    const int64_t d = pr->d, t = pr->t, bq = pr->bq, bk = pr->bk, bqp = pr->bqp, b = bg / pr->g;
    const float mul = pr->scale * 1.4426950408889634f; /* the forward's factor, rounded the same way */
    const float *kp = pr->kp + b * pr->tkp * d;
    const float sink2 = vis_sink(pr->vis, bg); /* the head's learned sink logit, base 2 (-inf: none) */
    double *restrict sums = pr->sums + bg * NSTATS, *restrict recv = pr->received + bg * t;
    float *restrict q = sc->q, *restrict s = sc->s, *restrict col = sc->col;
    for (int i = 0; i < NSTATS; i++) sums[i] = 0.0;
    memset(recv, 0, sizeof(double) * t);
    for (int64_t i0 = 0; i0 < t; i0 += bq) {
        const int64_t nr = i0 + bq < t ? bq : t - i0, row0 = bg * t + i0;
        memset(q, 0, sizeof(float) * bqp * d);
        for (int64_t r = 0; r < bqp; r++) sc->lse2[r] = -INFINITY, sc->lse2lo[r] = 0.0f;
        for (int64_t r = 0; r < nr; r++) {
            for (int64_t c = 0; c < d; c++) q[r * d + c] = pr->q[(row0 + r) * d + c] * mul;
            const float lse = pr->lse[row0 + r];
            if (isfinite(lse)) {
                const double lse2 = (double)lse * 1.4426950408889634;
                sc->lse2[r] = (float)lse2;
                sc->lse2lo[r] = (float)(lse2 - (float)lse2);
            }
        }
        memset(sc->row, 0, sizeof(double) * bqp * NROW);
        int64_t lo, hi; /* the keys that some row of the block may see */
        vis_range(pr->vis, bg, i0, i0 + nr, &lo, &hi);
        lo -= lo % VW;
        for (int64_t j0 = lo; j0 < hi; j0 += bk) {
            const int64_t nc = (j0 + bk < hi ? j0 + bk : hi) - j0, ncp = (nc + VW - 1) / VW * VW;
            if (!vis_meets(pr->vis, bg, i0, i0 + nr, j0, j0 + nc)) continue; /* no row sees it: not read */
            memset(col, 0, sizeof(float) * ncp);
            for (int64_t r0 = 0; r0 < nr; r0 += RQ) { /* a strip of RQ rows */
                int64_t c4s[RQ][4];
                int mode = pr->vis->cap > 0.0f || r0 + RQ > nr || nc != ncp ? 0 : -1; /* -1: not yet known */
                for (int64_t r = r0; r < r0 + RQ && r < nr; r++) {
                    const int64_t pos = i0 + r;
                    int64_t iv[4];
                    vis_row(pr->vis, bg, pos, iv);
                    vis_cols(iv, j0, nc, c4s[r - r0]);
                    if (mode == 0) continue;
                    const int whole = c4s[r - r0][0] == 0 && c4s[r - r0][1] == ncp && sc->lse2[r] != -INFINITY;
                    const int m = !whole ? 0 : pos > j0 + nc ? 1 : pos + 1 < j0 ? 2 : 0; /* keys i - 1, i, i + 1 outside */
                    mode = mode == -1 || mode == m ? m : 0;
                }
                if (mode == 1) {
                    F(sstrip)(pr, sc, kp, r0, i0 + r0, j0, ncp, 1);
                    continue;
                }
                if (mode == 2) {
                    F(sstrip)(pr, sc, kp, r0, i0 + r0, j0, ncp, 2);
                    continue;
                }
                int64_t c = 0; /* scores (base 2) of the strip, then row by row */
                for (; c + 2 * VW <= ncp; c += 2 * VW)
                    F(qk2)(q + r0 * d, d, d, kp + (j0 + c) * d, kp + (j0 + c + VW) * d, s + r0 * bk + c, bk, NULL);
                if (c < ncp) F(qk1)(q + r0 * d, d, d, kp + (j0 + c) * d, s + r0 * bk + c, bk, NULL);
                for (int64_t r = r0; r < r0 + RQ && r < nr; r++) {
                    float *restrict p = s + r * bk;
                    double *restrict acc = sc->row + r * NROW;
                    const int64_t pos = i0 + r, *c4 = c4s[r - r0];
                    if (c4[1] <= c4[0] || sc->lse2[r] == -INFINITY) continue;
                    if (pr->vis->cap > 0.0f) F(softcap)(p, ncp, pr->vis->cap, NULL); /* Gemma-2's scores, as the forward's */
                    const int whole = c4[0] == 0 && c4[1] == ncp; /* every column seen, none padding */
                    if (whole && pos >= j0 + nc - 1) F(srow)(p, col, ncp, sc->lse2[r], sc->lse2lo[r], pos - j0, acc, c4, 1);
                    else if (whole && pos <= j0) F(srow)(p, col, ncp, sc->lse2[r], sc->lse2lo[r], pos - j0, acc, c4, 2);
                    else F(srow)(p, col, ncp, sc->lse2[r], sc->lse2lo[r], pos - j0, acc, c4, 0);
                    for (int o = -1; o <= 1; o++) { /* the weights on keys i - 1, i, i + 1 */
                        const int64_t cc = pos + o - j0;
                        if ((cc >= c4[0] && cc < c4[1]) || (cc >= c4[2] && cc < c4[3])) acc[3 + o] += F(sweight)(p[cc], sc, r);
                    }
                    if (j0 == 0 && c4[0] == 0) acc[5] += F(sweight)(p[0], sc, r);
                }
            }
            for (int64_t c = 0; c < nc; c++) recv[j0 + c] += col[c];
        }
        for (int64_t r = 0; r < nr; r++) {
            const double *acc = sc->row + r * NROW;
            const int64_t pos = i0 + r;
            int64_t iv[4]; /* the keys row i sees: how many */
            vis_row(pr->vis, bg, pos, iv);
            const int64_t seen = (iv[1] > iv[0] ? iv[1] - iv[0] : 0) + (iv[3] > iv[2] ? iv[3] - iv[2] : 0);
            double entropy = -acc[1] * 0.69314718055994531; /* -sum w log w, log w = x ln 2 */
            int64_t outcomes = seen;
            if (sink2 != -INFINITY && sc->lse2[r] != -INFINITY) { /* the sink: one more outcome, share 2^x */
                const double x = ((double)sink2 - sc->lse2[r]) - sc->lse2lo[r];
                entropy -= exp2(x) * x * 0.69314718055994531, outcomes += 1;
            }
            sums[0] += acc[2], sums[1] += acc[3], sums[2] += acc[4], sums[3] += acc[5];
            sums[4] += acc[0], sums[5] += entropy;
            if (outcomes > 1) sums[6] += entropy / log((double)outcomes);
        }
    }
}

/* The whole pass: pack the keys, then every head on the threads. */
static TARGET int F(srun)(struct sproblem *pr) {
    pr->bqp = (pr->bq + ROWS - 1) / ROWS * ROWS;
    pr->bk = (pr->bk + VW - 1) / VW * VW;
    pr->tkp = (pr->t + VW - 1) / VW * VW;
    const int64_t heads = pr->b * pr->g;
    float *kp = aligned_alloc(64, round64(sizeof(float) * pr->b * pr->tkp * pr->d));
    if (!kp) return -1;
    pr->kp = kp;
    struct problem pk = {0}; /* pack reads the keys as the forward's problem holds them */
    pk.k = pr->k, pk.d = pk.dv = pr->d, pk.tk = pr->t, pk.tkp = pr->tkp, pk.dvp = pr->d;
    int64_t next = 0;
    int failed = 0;
    const int64_t qn = (pr->bqp * pr->d + 15) / 16 * 16, sn = pr->bqp * pr->bk, cn = (pr->bk + 15) / 16 * 16;
    const int64_t ln = (pr->bqp + 15) / 16 * 16;
    const size_t floats = sizeof(float) * (qn + sn + cn + 2 * ln), per_thread = floats + sizeof(double) * pr->bqp * NROW;
#pragma omp parallel num_threads(pr->threads)
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < pr->b; b++) F(pack)(&pk, b, kp + b * pr->tkp * pr->d, NULL);
        float *mem = aligned_alloc(64, round64(per_thread));
        if (!mem) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        } else {
            const struct sscratch sc = {mem, mem + qn, mem + qn + sn, mem + qn + sn + cn, mem + qn + sn + cn + ln,
                                        (double *)(mem + qn + sn + cn + 2 * ln)};
            for (;;) {
                const int64_t bg = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
                if (bg >= heads) break;
                F(shead)(pr, &sc, bg);
            }
            free(mem);
        }
    }
    free(kp);
    return failed ? -1 : 0;
}

#include "_tiles_fstats.h"
