/* The forward with head_stats' statistics in the same pass (kernel.forward_stats), included by _tiles_stats.h
 * once per instruction set.
 *
 * The statistics pass (_tiles_stats.h) recomputes every score after the forward: q k^T a second time and an
 * exponential per score, about two thirds of the forward's own work. Here the forward's query block keeps its
 * tiles of weights 2^(s - m) (m the row's running maximum when the tile was summed) in a buffer of the block's
 * rows times every key, e (bq x T floats per thread), beside each row's m per tile, and sums the entropy's
 * terms online: h = sum 2^(s - m) (s - m), rescaled with l whenever m grows (h' = a (h + (m - m') l), a =
 * 2^(m - m')). Once the block's rows have their LSE, one sweep over e gives the weights w = e 2^(m_tile - m) / l,
 * their column sums (the attention received), each row's distance and its weights on keys i - 1, i, i + 1 and 0;
 * the entropy is -sum w log w = ln 2 (log2 l - h / l) (no cancellation: both terms >= 0). The forward's part is the
 * forward's item line for line (out and LSE the same bits), writing its tiles into e instead of the scratch.
 * A head is one work item, its query blocks in order: the same bits for any thread count. */

/* The forward of query rows i0..i1-1 of head bg (F(item)'s code, the tiles in e, row stride lde), each row's
 * maximum after tile n in mt[n bqp + r] and its entropy sum h in hs. */
static TARGET __attribute__((noinline)) void F(fsforward)(const struct problem *pr, const struct scratch *sc, float *restrict e,
                                                          int64_t lde, float *restrict mt, float *restrict hs, int64_t bg,
                                                          int64_t i0, int64_t i1) {
    const int64_t d = pr->d, dv = pr->dv, dvp = pr->dvp, bqp = pr->bqp, bk = pr->bk, tk = pr->tk;
    const int64_t b = bg / pr->g, nr = i1 - i0;
    const struct vis *vis = pr->vis;
    float *restrict q = sc->q, *restrict acc = sc->acc, *restrict m = sc->m, *restrict l = sc->l;
    const float *src = pr->q + (bg * pr->tq + i0) * d;
    const float mul = pr->scale * 1.4426950408889634f; /* scores in base 2: exp2 instead of exp */
    const float sink = vis_sink(vis, bg), slope = vis_slope(vis, bg);
    for (int64_t r = 0; r < bqp; r++)
        for (int64_t t = 0; t < d; t++) q[r * d + t] = r < nr ? src[r * d + t] * mul : 0.0f;
    for (int64_t r = 0; r < bqp; r++) /* a learned sink: a first "key" of score sink and no value (its term of h: 0) */
        m[r] = sink, l[r] = sink == -INFINITY ? 0.0f : 1.0f, hs[r] = 0.0f;
    memset(acc, 0, sizeof(float) * bqp * dvp);
    int64_t lo, hi;
    vis_range(vis, bg, i0, i1, &lo, &hi);
    lo -= lo % VW;
    const float *kp = pr->kp + b * pr->tkp * d;
    const float *v = pr->vp ? pr->vp + b * pr->tkp * dvp : pr->v + b * tk * dv;
#if !VPW
    const int64_t ldv = pr->vp ? dvp : dv;
#endif
    for (int64_t j0 = lo; j0 < hi; j0 += bk) {
        const int64_t nc = (j0 + bk < hi ? j0 + bk : hi) - j0, ncp = (nc + VW - 1) / VW * VW;
        if (!vis_meets(vis, bg, i0, i1, j0, j0 + nc)) continue;
        float *restrict s = e + j0, *restrict mtile = mt + (j0 - lo) / bk * bqp;
        const int64_t strip = STRIP ? STRIP : bqp;
        for (int64_t r0 = 0; r0 < bqp; r0 += strip) {
            VF smax[STRIP ? STRIP : 1];
            for (int u = 0; STRIP && u < strip; u++) smax[u] = (VF){} - INFINITY;
            for (int64_t r = r0; r < r0 + strip; r += RQ) {
                VF *mx = STRIP ? smax + (r - r0) : NULL;
                int64_t c = 0;
                for (; c + 2 * VW <= ncp; c += 2 * VW)
                    F(qk2)(q + r * d, d, d, kp + (j0 + c) * d, kp + (j0 + c + VW) * d, s + r * lde + c, lde, mx);
                if (c < ncp) F(qk1)(q + r * d, d, d, kp + (j0 + c) * d, s + r * lde + c, lde, mx);
            }
            for (int64_t r = r0; r < r0 + strip; r++) {
                float *restrict row = s + r * lde;
                int64_t iv[4], c4[4] = {0, 0, 0, 0};
                mtile[r] = m[r];
                if (r < nr) vis_row(vis, bg, i0 + r, iv), vis_cols(iv, j0, nc, c4);
                if (r >= nr || c4[1] <= c4[0]) { /* nothing: zero weights */
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
                    mx = smax[r - r0];
                else
                    for (int64_t c = 0; c < ncp; c += VW) {
                        const VF x = *(const VF *)(row + c);
                        mx = F(select)(x > mx, x, mx);
                    }
                float top = m[r];
                for (int u = 0; u < VW; u++) top = mx[u] > top ? mx[u] : top;
                if (top > m[r]) { /* a new maximum: rescale l, acc and h */
                    const float alpha = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - top), was = l[r];
                    l[r] *= alpha;
                    for (int64_t t = 0; t < dvp; t++) acc[r * dvp + t] *= alpha;
                    hs[r] = m[r] == -INFINITY ? 0.0f : alpha * (hs[r] + (m[r] - top) * was);
                    m[r] = top;
                }
                mtile[r] = top;
                VF sum = (VF){}, h = (VF){};
                for (int64_t c = 0; c < ncp; c += VW) {
                    const VF x = *(const VF *)(row + c) - top, w = F(exp2n)(x);
                    *(VF *)(row + c) = w;
                    sum += w;
                    h += w * F(select)((VI)(x > -200.0f), x, (VF){}); /* 0, not 0 x -inf, where hidden */
                }
                for (int u = 0; u < VW; u++) l[r] += sum[u], hs[r] += h[u];
            }
#if VPW
            for (int64_t t0 = 0; t0 < dvp; t0 += VPW) {
                const int64_t w = t0 + VPW < dvp ? VPW : dvp - t0;
                const float *vt = v + t0 * pr->tkp + j0 * w;
                for (int64_t r = r0; r < r0 + strip; r += RP)
                    if (w == 2 * VW)
                        F(pv_2)(s + r * lde, lde, vt, w, nc, acc + r * dvp + t0, dvp);
                    else
                        F(pv_1)(s + r * lde, lde, vt, w, nc, acc + r * dvp + t0, dvp);
            }
#else
            for (int64_t r = r0; r < r0 + strip; r += RP) F(pv)(s + r * lde, lde, v + j0 * ldv, ldv, nc, acc + r * dvp, dvp);
#endif
        }
    }
    float *out = pr->out + (bg * pr->tq + i0) * dv, *lse = pr->lse + bg * pr->tq + i0;
    for (int64_t r = 0; r < nr; r++) { /* as the forward's */
        const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int64_t t = 0; t < dv; t++) out[r * dv + t] = acc[r * dvp + t] * inv;
        lse[r] = l[r] > 0 ? (float)(((double)m[r] + log2((double)l[r])) * 0.69314718055994531) : -INFINITY;
    }
}

#ifndef SWEEP
#define SWEEP 8 /* rows the sweep takes together (AVX2, one layer at 8,192 / 32,768 tokens: 4 rows 0.96x / 0.86x the time of 1, 8 0.93x of 4 at both, 16 as 8) */
#endif

/* After F(fsforward) of rows i0..i0+nr-1 of head bg: the weights w = e 2^(mt - m) / l tile by tile, their column
 * sums added to recv (a tile's rows in order, then once per key, as the statistics pass does) and each row's
 * statistics to sums (NSTATS, as the statistics pass sums them: row accumulators racc, NROW each). */
static TARGET __attribute__((noinline)) void F(fssweep)(const struct problem *pr, const struct scratch *sc,
                                                        const float *restrict e, int64_t lde, const float *restrict mt,
                                                        const float *restrict hs, double *restrict racc, float *restrict col,
                                                        int64_t bg, int64_t i0, int64_t nr, double *restrict sums,
                                                        double *restrict recv) {
    const int64_t bqp = pr->bqp, bk = pr->bk;
    const float *m = sc->m, *l = sc->l;
    const float sink = vis_sink(pr->vis, bg);
    VF lanef;
    for (int u = 0; u < VW; u++) lanef[u] = (float)u;
    memset(racc, 0, sizeof(double) * nr * NROW);
    int64_t lo, hi;
    vis_range(pr->vis, bg, i0, i0 + nr, &lo, &hi);
    lo -= lo % VW;
    for (int64_t j0 = lo; j0 < hi; j0 += bk) {
        const int64_t nc = (j0 + bk < hi ? j0 + bk : hi) - j0, ncp = (nc + VW - 1) / VW * VW;
        if (!vis_meets(pr->vis, bg, i0, i0 + nr, j0, j0 + nc)) continue; /* not read by the forward either */
        const float *mtile = mt + (j0 - lo) / bk * bqp;
        memset(col, 0, sizeof(float) * ncp);
        for (int64_t r0 = 0; r0 < nr; r0 += SWEEP) { /* SWEEP rows at a time: each column vector loaded once */
            float cr[SWEEP];
            const float *row[SWEEP];
            VF here[SWEEP], dist[SWEEP];
            for (int u = 0; u < SWEEP; u++) { /* a row past the block or that sees nothing: weight 0, row r0's memory */
                const int64_t r = r0 + u;
                const int live = r < nr && l[r] > 0.0f;
                cr[u] = live ? exp2f(mtile[r] - m[r]) / l[r] : 0.0f; /* the tile's weights: e times this */
                row[u] = e + (live ? r : r0) * lde + j0;
                here[u] = (VF){} + (float)(i0 + r - j0), dist[u] = (VF){};
            }
            for (int64_t c = 0; c < ncp; c += VW) {
                const VF at = lanef + (float)c;
                VF cs = *(const VF *)(col + c);
                for (int u = 0; u < SWEEP; u++) {
                    const VF w = *(const VF *)(row[u] + c) * cr[u];
                    VU far; /* |j - i|, exact: the difference's sign bit cleared */
                    const VF gap = at - here[u];
                    __builtin_memcpy(&far, &gap, sizeof far);
                    far &= 0x7fffffffu;
                    VF farf;
                    __builtin_memcpy(&farf, &far, sizeof farf);
                    cs += w; /* rows in order, as the statistics pass adds them */
                    dist[u] += w * farf;
                }
                *(VF *)(col + c) = cs;
            }
            for (int u = 0; u < SWEEP && r0 + u < nr; u++) {
                const int64_t r = r0 + u;
                double *acc = racc + r * NROW;
                for (int z = 0; z < VW; z++) acc[0] += dist[u][z];
                for (int o = -1; o <= 1; o++) { /* the weights on keys i - 1, i, i + 1 (0 where hidden) */
                    const int64_t c = i0 + r + o - j0;
                    if (c >= 0 && c < nc) acc[3 + o] += row[u][c] * cr[u];
                }
                if (j0 == 0) acc[5] += row[u][0] * cr[u];
            }
        }
        for (int64_t c = 0; c < nc; c++) recv[j0 + c] += col[c];
    }
    for (int64_t r = 0; r < nr; r++) {
        const double *acc = racc + r * NROW;
        int64_t iv[4];
        vis_row(pr->vis, bg, i0 + r, iv);
        const int64_t seen = (iv[1] > iv[0] ? iv[1] - iv[0] : 0) + (iv[3] > iv[2] ? iv[3] - iv[2] : 0);
        double entropy = 0.0; /* -sum w ln w over every outcome (keys and the sink) */
        int64_t outcomes = seen;
        if (l[r] > 0.0f) {
            entropy = (log2((double)l[r]) - (double)hs[r] / l[r]) * 0.69314718055994531;
            outcomes += sink != -INFINITY;
        }
        sums[0] += acc[2], sums[1] += acc[3], sums[2] += acc[4], sums[3] += acc[5];
        sums[4] += acc[0], sums[5] += entropy;
        if (outcomes > 1) sums[6] += entropy / log((double)outcomes);
    }
}

/* The whole call: pack k and v, then every head on the threads, its query blocks in order. */
static TARGET int F(fsrun)(struct problem *pr) {
    float *kp, *vp;
    if (F(packs)(pr, &kp, &vp) != 0) return -1;
    const int64_t heads = pr->b * pr->g, lde = (pr->tkp + 15) / 16 * 16 + 16; /* e's rows apart by more than 4 KiB steps */
    const int64_t ntiles = (pr->tkp + pr->bk - 1) / pr->bk + 1;
    int64_t next = 0;
    int failed = 0;
    const int64_t qn = F(qfloats)(pr), sn = (pr->bqp * (pr->bk + pr->dvp) + 2 * pr->bqp + 15) / 16 * 16;
    const int64_t en = pr->bqp * lde, mn = (ntiles * pr->bqp + pr->bqp + 15) / 16 * 16, cn = (pr->bk + 15) / 16 * 16;
    const size_t per_thread = sizeof(float) * (qn + sn + en + mn + cn) + sizeof(double) * pr->bqp * NROW;
#pragma omp parallel num_threads(pr->threads)
    {
        F(pack_all)(pr, kp, vp);
        float *mem = aligned_alloc(64, round64(per_thread));
        if (!mem) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        } else {
            const struct scratch sc = F(scratch_at)(pr, mem);
            float *e = mem + qn + sn, *mt = e + en, *hs = mt + ntiles * pr->bqp, *col = mt + mn;
            double *racc = (double *)(col + cn);
            for (;;) {
                const int64_t bg = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
                if (bg >= heads) break;
                double *sums = pr->sums + bg * NSTATS, *recv = pr->received + bg * pr->tk;
                for (int i = 0; i < NSTATS; i++) sums[i] = 0.0;
                memset(recv, 0, sizeof(double) * pr->tk);
                for (int64_t i0 = 0; i0 < pr->tq; i0 += pr->bq) {
                    const int64_t i1 = i0 + pr->bq < pr->tq ? i0 + pr->bq : pr->tq;
                    F(fsforward)(pr, &sc, e, lde, mt, hs, bg, i0, i1);
                    F(fssweep)(pr, &sc, e, lde, mt, hs, racc, col, bg, i0, i1 - i0, sums, recv);
                }
            }
            free(mem);
        }
    }
    free(kp);
    free(vp);
    return failed ? -1 : 0;
}
