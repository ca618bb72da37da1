/* The pooled pass (the long view's overview, attnlab.analysis.longview.overview), included by _tiles_body.h
 * once per instruction set.
 *
 * After the forward has given each row's LSE, the weights of a tile are P = exp(S - LSE), recomputed
 * from the forward's own scores (q times scale log2 e, softcapped and ALiBi'd in base 2 as the forward
 * does, LSE in base 2 as hi + lo, as the statistics and the backward do). While the tile is in the L2
 * cache, one sweep keeps each of its columns' sum and largest weight over the tile's rows, which then
 * fold into the cells (block x block pairs) of the pooled map. A work item is one row of cells of one
 * head: its cells are written by one thread in one order, so the result is the same for any thread
 * count, and tiles no row of the item sees are skipped (not read). A pair a row does not see is a
 * weight of 0: it adds nothing to the sum and the largest is at least 0. With K > 0 the same sweep also keeps
 * every row's K largest weights (largest first, ties: the earlier key, as the keys come in order), which a
 * tile adds to only where its largest weight passes the row's K-th; a row with fewer than K positive
 * weights is completed by its first keys of weight 0, as a stable sort of the whole row would. Memory: the
 * outputs and one tile per thread; never a row of T weights, let alone T x T. */

/* Weights above this are recomputed in double: a float32 score of magnitude |s| is off by some |s| 2^-24, and
 * so its weight by as much relative to itself, which passes 1e-6 for large weights only (a row has at most
 * 1 / POOL_EXACT of them, so the cost is a few dot products a row). */
#ifndef POOL_EXACT
#define POOL_EXACT 0.015625f
#endif

/* The weight of query i on key j of head bg from the float32 q and k as given, in double: the products are
 * exact, and so is the weight, but for the float32 LSE's rounding. */
static TARGET double F(pexact)(const struct pproblem *pr, int64_t bg, int64_t i, int64_t j) {
    const float *q = pr->q + (bg * pr->t + i) * pr->d, *k = pr->k + ((bg / pr->g) * pr->t + j) * pr->d;
    double dot = 0.0;
    for (int64_t c = 0; c < pr->d; c++) dot += (double)q[c] * (double)k[c];
    double s = pr->scale64 * dot;
    if (pr->softcap64 > 0.0) s = pr->softcap64 * tanh(s / pr->softcap64);
    const float slope = vis_slope(pr->vis, bg);
    if (slope != 0.0f) {
        const int64_t gap = vis_pos(pr->vis, bg, i) - j;
        s -= (double)slope * 0.69314718055994531 * (double)(gap < 0 ? -gap : gap); /* slopes are base 2 */
    }
    return exp(s - (double)pr->lse[bg * pr->t + i]);
}

/* Keep w at key j among a row's n (of at most k) largest, largest first; an equal weight stays ahead (earlier key). */
static inline TARGET void F(topput)(float *restrict tw, int64_t *restrict tk, int64_t *restrict n, int64_t k, float w, int64_t j) {
    int64_t p = *n < k ? *n : k - 1; /* full: the last is dropped */
    for (; p > 0 && tw[p - 1] < w; p--) tw[p] = tw[p - 1], tk[p] = tk[p - 1];
    tw[p] = w, tk[p] = j;
    if (*n < k) (*n)++;
}

/* Row `cell` of head bg's cells: its rows, a query block of at most bq at a time, against every key they see. */
static TARGET __attribute__((noinline)) void F(pitem)(const struct pproblem *pr, const struct pscratch *sc, int64_t bg,
                                                      int64_t cell) {
    const int64_t d = pr->d, t = pr->t, bk = pr->bk, block = pr->block, n = pr->n, b = bg / pr->g;
    const float mul = pr->scale * 1.4426950408889634f; /* the forward's factor, rounded the same way */
    const float *kp = pr->kp + b * pr->tkp * d;
    const struct vis *vis = pr->vis;
    const float slope = vis_slope(vis, bg);
    double *restrict sums = pr->sums + (bg * n + cell) * n;
    float *restrict maxes = pr->maxes + (bg * n + cell) * n;
    float *restrict q = sc->q, *restrict s = sc->s, *restrict csum = sc->csum, *restrict cmax = sc->cmax;
    VI lane;
    for (int u = 0; u < VW; u++) lane[u] = u;
    memset(sums, 0, sizeof(double) * n);
    memset(maxes, 0, sizeof(float) * n);
    const int64_t first = cell * block, last = first + block < t ? first + block : t;
    for (int64_t i0 = first; i0 < last; i0 += pr->bq) {
        const int64_t nr = i0 + pr->bq < last ? pr->bq : last - i0, nrp = (nr + RQ - 1) / RQ * RQ, row0 = bg * t + i0;
        for (int64_t r = 0; r < nrp; r++)
            for (int64_t c = 0; c < d; c++) q[r * d + c] = r < nr ? pr->q[(row0 + r) * d + c] * mul : 0.0f;
        for (int64_t r = 0; r < nr; r++) {
            const float lse = pr->lse[row0 + r];
            const double lse2 = (double)lse * 1.4426950408889634;
            sc->lse2[r] = isfinite(lse) ? (float)lse2 : -INFINITY;
            sc->lse2lo[r] = isfinite(lse) ? (float)(lse2 - (float)lse2) : 0.0f;
        }
        for (int64_t r = 0; r < nr; r++) sc->tn[r] = 0;
        int64_t lo, hi; /* the keys that some row of the block may see */
        vis_range(vis, bg, i0, i0 + nr, &lo, &hi);
        lo -= lo % VW;
        for (int64_t j0 = lo; j0 < hi; j0 += bk) {
            const int64_t nc = (j0 + bk < hi ? j0 + bk : hi) - j0, ncp = (nc + VW - 1) / VW * VW;
            if (!vis_meets(vis, bg, i0, i0 + nr, j0, j0 + nc)) continue; /* no row sees it: not read */
            for (int64_t r = 0; r < nrp; r += RQ) { /* scores (base 2) */
                int64_t c = 0;
                for (; c + 2 * VW <= ncp; c += 2 * VW)
                    F(qk2)(q + r * d, d, d, kp + (j0 + c) * d, kp + (j0 + c + VW) * d, s + r * bk + c, bk, NULL);
                if (c < ncp) F(qk1)(q + r * d, d, d, kp + (j0 + c) * d, s + r * bk + c, bk, NULL);
            }
            memset(csum, 0, sizeof(float) * ncp);
            memset(cmax, 0, sizeof(float) * ncp);
            for (int64_t r = 0; r < nr; r++) {
                float *restrict row = s + r * bk;
                int64_t iv[4], c4[4]; /* the row sees columns c4[0]..c4[1]-1 and c4[2]..c4[3]-1 of this tile */
                vis_row(vis, bg, i0 + r, iv);
                vis_cols(iv, j0, nc, c4);
                if (c4[1] <= c4[0] || sc->lse2[r] == -INFINITY) continue;
                if (vis->cap > 0.0f) F(softcap)(row, ncp, vis->cap, NULL);
                if (slope != 0.0f) F(alibi)(row, c4[0], c4[3], slope, vis_pos(vis, bg, i0 + r) - j0);
                const VF lse2 = (VF){} + sc->lse2[r], lse2lo = (VF){} + sc->lse2lo[r];
                const int64_t c0 = c4[0] - c4[0] % VW;
                VF big = (VF){};
                for (int64_t c = c0; c < c4[3]; c += VW) { /* the weights, in place; the largest of each lane */
                    const VI idx = lane + (int32_t)c;
                    const VI seen = ((idx >= (int32_t)c4[0]) & (idx < (int32_t)c4[1])) |
                                    ((idx >= (int32_t)c4[2]) & (idx < (int32_t)c4[3]));
                    const VF w = F(select)(seen, F(exp2v)((*(const VF *)(row + c) - lse2) - lse2lo), (VF){});
                    *(VF *)(row + c) = w;
                    big = F(select)(w > big, w, big);
                }
                float most = 0.0f;
                for (int u = 0; u < VW; u++) most = big[u] > most ? big[u] : most;
                if (most > POOL_EXACT) /* the few large weights, exact */
                    for (int64_t c = c4[0]; c < c4[3]; c++)
                        if (row[c] > POOL_EXACT) row[c] = (float)F(pexact)(pr, bg, i0 + r, j0 + c);
                big = (VF){};
                for (int64_t c = c0; c < c4[3]; c += VW) {
                    const VF w = *(const VF *)(row + c), top = *(const VF *)(cmax + c);
                    *(VF *)(csum + c) += w;
                    *(VF *)(cmax + c) = F(select)(w > top, w, top);
                    big = F(select)(w > big, w, big);
                }
                if (pr->ntop > 0) { /* the row's largest: only where this tile has one above its K-th so far */
                    float *tw = sc->tw + r * pr->ntop;
                    int64_t *tk = sc->tk + r * pr->ntop, *tn = sc->tn + r;
                    float bar = *tn < pr->ntop ? 0.0f : tw[pr->ntop - 1];
                    most = 0.0f;
                    for (int u = 0; u < VW; u++) most = big[u] > most ? big[u] : most;
                    if (most > bar)
                        for (int64_t c = c4[0]; c < c4[3]; c++) /* unseen columns between the intervals hold 0 */
                            if (row[c] > bar) {
                                F(topput)(tw, tk, tn, pr->ntop, row[c], j0 + c);
                                bar = *tn < pr->ntop ? 0.0f : tw[pr->ntop - 1];
                            }
                }
            }
            for (int64_t c = 0, k = j0 / block, edge = (k + 1) * block - j0; c < nc; k++, edge += block) {
                const int64_t stop = edge < nc ? edge : nc; /* columns c..stop-1 are cell k's */
                double sum = 0.0;
                float top = maxes[k];
                for (; c < stop; c++) {
                    sum += csum[c];
                    top = cmax[c] > top ? cmax[c] : top;
                }
                sums[k] += sum, maxes[k] = top;
            }
        }
        for (int64_t r = 0; r < nr && pr->ntop > 0; r++) { /* the rows' largest, completed by the first keys of weight 0 */
            float *out_w = pr->topw + (row0 + r) * pr->ntop;
            int64_t *out_k = pr->topk + (row0 + r) * pr->ntop, got = sc->tn[r];
            memcpy(out_w, sc->tw + r * pr->ntop, sizeof(float) * got);
            memcpy(out_k, sc->tk + r * pr->ntop, sizeof(int64_t) * got);
            for (int64_t j = 0, have = got; have < pr->ntop; j++) {
                int kept = 0;
                for (int64_t u = 0; u < got && !kept; u++) kept = out_k[u] == j;
                if (!kept) out_w[have] = 0.0f, out_k[have++] = j;
            }
        }
    }
}

/* The whole pass: pack the keys, then every row of cells of every head on the threads, the last rows first
 * (under a causal band they see the most keys). */
static TARGET int F(prun)(struct pproblem *pr) {
    pr->bqp = (pr->bq + ROWS - 1) / ROWS * ROWS;
    pr->bk = (pr->bk + VW - 1) / VW * VW;
    pr->tkp = (pr->t + VW - 1) / VW * VW;
    const int64_t items = pr->b * pr->g * pr->n;
    float *kp = aligned_alloc(64, round64(sizeof(float) * pr->b * pr->tkp * pr->d));
    if (!kp) return -1;
    pr->kp = kp;
    struct problem pk = {0}; /* pack reads the keys as the forward's problem holds them */
    pk.k = pr->k, pk.d = pk.dv = pr->d, pk.tk = pr->t, pk.tkp = pr->tkp, pk.dvp = pr->d;
    int64_t next = 0;
    int failed = 0;
    const int64_t qn = (pr->bqp * pr->d + 15) / 16 * 16, sn = pr->bqp * pr->bk, cn = (pr->bk + 15) / 16 * 16;
    const int64_t ln = (pr->bqp + 15) / 16 * 16, tn = pr->bqp * pr->ntop; /* the top keys' scratch: (bqp, K) */
    const size_t per_thread = sizeof(float) * (qn + sn + 2 * cn + 2 * ln + tn + 1) + sizeof(int64_t) * (tn + pr->bqp);
#pragma omp parallel num_threads(pr->threads)
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < pr->b; b++) F(pack)(&pk, b, kp + b * pr->tkp * pr->d, NULL);
        float *mem = aligned_alloc(64, round64(per_thread));
        if (!mem) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        } else {
            float *tw = mem + qn + sn + 2 * cn + 2 * ln;
            int64_t *tk = (int64_t *)(tw + tn + (tn & 1)); /* 8-byte aligned: the parts before are even in floats */
            const struct pscratch sc = {mem, mem + qn, mem + qn + sn, mem + qn + sn + cn, mem + qn + sn + 2 * cn,
                                        mem + qn + sn + 2 * cn + ln, tw, tk, tk + tn};
            for (;;) {
                const int64_t it = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
                if (it >= items) break;
                F(pitem)(pr, &sc, it / pr->n, pr->n - 1 - it % pr->n);
            }
            free(mem);
        }
    }
    free(kp);
    return failed ? -1 : 0;
}
