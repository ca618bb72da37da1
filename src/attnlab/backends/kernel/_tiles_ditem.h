/* The decode pass's work item (_tiles_decode.h includes this once per instruction set as ditem_SFX, and in the
 * AVX-512 variant once more, with DECODE_AMX, as ditem_amx_SFX). */

/* One work item: chunk it % chunks of (sequence b, k/v head hk), it / chunks = b Hkv + hk, for the group's
 * rows r = gi Tq + i (query head hk G + gi, query i). Writes the item's partial result: acc (rows, dvp)
 * unnormalised, then each row's maximum and sum (base 2; -inf and 0 where it saw nothing here).
 * Not inlined: the variant's work sits in a function named for it (the tests disassemble it). DITEM is its name:
 * ditem_SFX, and in the AVX-512 variant also ditem_amx_SFX, the same with int4 keys' scores on AMX (DECODE_AMX):
 * one function for both read another cache 2-5 % slower with two threads (float32 at 32,768 keys, one thread's CPU
 * time the same), so a cache that is not int4 on AMX never runs the AMX code's. */
static TARGET __attribute__((noinline)) void DITEM(const struct dproblem *pr, float *scr, int64_t it) {
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
    /* int4 (q4_*): the scaled queries of a key group and their constants, the values' accumulator (nibble order),
     * a value block's weights and the zero points' shares */
    const int i4 = pr->kvtype == DT_I4;
    const int64_t ng = i4 ? dv / 32 : 0;
    float *restrict qs = p + rows * VW, *restrict acc4 = qs + rows * dp, *restrict w4 = acc4 + rows * dvp;
    float *restrict zs = w4 + rows * ng * VW, *restrict qp = zs + rows * ng * VW, *restrict cz = qp + rows * dp;
    int64_t *bound = (int64_t *)(i4 ? cz + (rows + VW - 1) / VW * VW : qs); /* each row's keys: two intervals [lo, hi) */
    const int64_t flat0 = b * pr->h + hk * pr->g; /* the group's first query head */
    int gaps = 0; /* some row sees two runs of keys (sink tokens and a window): blocks between may be unseen */
    int whole = 1; /* every row sees every key of the chunk: no block's columns to work out */
    for (int64_t r = 0; r < rows; r++) {
        vis_row(pr->vis, flat0 + r / tq, r % tq, bound + 4 * r);
        gaps |= bound[4 * r + 3] > bound[4 * r + 2];
        whole &= bound[4 * r] <= j0 && bound[4 * r + 1] >= j1;
    }
    const float mul = pr->scale * 1.4426950408889634f; /* scores in base 2: exp2 instead of exp */
    const float *src = (const float *)pr->q + (b * pr->h + hk * pr->g) * tq * d; /* the group's rows, contiguous */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < dp; t++) q[r * dp + t] = t < d ? src[r * d + t] * mul : 0.0f;
    memset(acc, 0, sizeof(float) * rows * dvp);
    memset(lv, 0, sizeof(float) * rows * VW);
    if (i4) memset(acc4, 0, sizeof(float) * rows * dvp), memset(zs, 0, sizeof(float) * rows * ng * VW);
    if (i4) F(q4_order)(q, rows, dp, d, qp); /* the query in nibble order, once */
#ifdef DECODE_AMX
    struct amx_scratch t; /* int4 keys on AMX (_tiles_decode_amx.h): B tiles, A2 tiles, C, weights, a group's scores */
    amx_carve(scr + pr->amx_at, rows, d, &t);
    amx_begin(d);
    int64_t amx_lo = 0, amx_hi = 0; /* the keys whose scores t.sc holds */
    int on_amx = 0; /* the key group kg's scores go to AMX */
#endif
    const size_t item = pr->kvtype == DT_F32 ? 4 : pr->kvtype == DT_F16 || pr->kvtype == DT_BF16 ? 2 : 1;
    const int64_t krow = i4 ? d / 2 : d * (int64_t)item, vrow = i4 ? dv / 2 : dv * (int64_t)item; /* bytes per row */
    const int64_t per = pr->kvtype == DT_I8; /* int8: a scale per key and value row; float8: one per head */
    const float *ksc = pr->ks ? pr->ks + b * pr->ksb + hk * pr->ksh : NULL; /* the codes' scales */
    const float *vsc = pr->vs ? pr->vs + b * pr->vsb + hk * pr->vsh : NULL;
    const char *kh = (const char *)pr->k + (b * pr->kb + hk * pr->kh) * item;
    const char *vh = (const char *)pr->v + (b * pr->vb + hk * pr->vh) * item;
    const struct q4 *K4 = &pr->k4, *V4 = &pr->v4; /* int4: positions from held[b] on are in the rings */
    const int64_t kheld = i4 ? K4->held[b] : 0, vheld = i4 ? V4->held[b] : 0, ritem = pr->rtype == DT_F32 ? 4 : 2;
    const char *kres = i4 ? (const char *)K4->res + (b * K4->rb + hk * K4->rh) * ritem : NULL;
    const char *vres = i4 ? (const char *)V4->res + (b * V4->rb + hk * V4->rh) * ritem : NULL;
    const float *k4s = i4 ? K4->s + b * K4->sb + hk * K4->sh : NULL, *k4z = i4 ? K4->z + b * K4->zb + hk * K4->zh : NULL;
    const float *v4s = i4 ? V4->s + b * V4->sb + hk * V4->sh : NULL, *v4z = i4 ? V4->z + b * V4->zb + hk * V4->zh : NULL;
    int64_t kg = -1; /* int4: the key group whose scaled queries qs holds */
    /* read in place: whole blocks of keys, values of any dtype, where their rows are whole vectors (else
     * staged in L1 as float32, padded) */
    const int k_direct = dp == d, v_direct = dvp == dv;
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
        /* int4: a block is codes or the residual (held[b] and the ring's slots are multiples of 32, blocks of VW
         * start on a group's start: never both, never across the ring's end) */
        const int kq4 = i4 && j < kheld, vq4 = i4 && j < vheld;
        const char *ksrc = i4 && !kq4 ? kres + (j % K4->slots) * d * ritem : kh + j * krow;
        const char *vsrc = i4 && !vq4 ? vres + (j % V4->slots) * dv * ritem : vh + j * vrow;
        const int kst = i4 && !kq4 ? pr->rtype : pr->kvtype, vst = i4 && !vq4 ? pr->rtype : pr->kvtype;
        const void *kb = kf; /* the block's keys: rows u in [0, nk), stored as ktype */
        int64_t ldk = dp;
        int ktype = DT_F32;
        if (kq4)
            kb = ksrc, ldk = krow, ktype = DT_I4;
        else if (k_direct && nk == VW)
            kb = ksrc, ldk = d, ktype = kst;
        else
            F(stage)(ksrc, kst, nk, d, kf, dp);
        const void *vb = vf; /* the block's values: rows u in [0, nk) */
        int64_t ldv = dvp;
        int vtype = DT_F32;
        if (vq4)
            vb = vsrc, ldv = vrow, vtype = DT_I4;
        else if (v_direct)
            vb = vsrc, ldv = dv, vtype = vst;
        else
            F(stage)(vsrc, vst, nk, dv, vf, dvp);
        /* the block DECODE_AHEAD ahead, prefetched a few lines at a time: lines [0, split) as the rows' scores are
         * computed, [split, lines) as p v is: its keys, then its values, where SPLITS says (else, and for int4, all
         * during the scores). One stream per core is latency-bound
         * without it; all at once the prefetches queue behind each other for the core's line-fill buffers. */
        const int ahead = j + (DECODE_AHEAD + 1) * VW <= j1;
        const struct F(ahead) pf = {kh + (j + DECODE_AHEAD * VW) * krow, vh + (j + DECODE_AHEAD * VW) * vrow,
                                    ahead ? VW * krow / 64 : 0};
        const int64_t lines = ahead ? pf.k_lines + VW * vrow / 64 : 0;
        const int64_t split = !i4 && SPLITS(item) ? pf.k_lines : lines;
        if (kq4) { /* int4 keys: the group's scaled queries, then the rows' scores */
            if (j / 32 != kg) {
                kg = j / 32;
                for (int64_t x = 0; x < d * 4; x += 64) /* the scales and zero points two groups on (1-4 % faster) */
                    __builtin_prefetch((const char *)(k4s + (kg + 2) * K4->sr) + x, 0, DECODE_LOC),
                    __builtin_prefetch((const char *)(k4z + (kg + 2) * K4->zr) + x, 0, DECODE_LOC);
#ifdef DECODE_AMX
                /* AMX reads the group's 32 rows of codes whole: only where the call's keys hold them all */
                on_amx = (kg + 1) * 32 <= pr->tk &&
                         amx_group(q, rows, dp, d, k4s + kg * K4->sr, k4z + kg * K4->zr, t.b, t.w, cz);
                if (!on_amx)
#endif
                    F(q4_group)(q, qp, rows, dp, d, k4s + kg * K4->sr, k4z + kg * K4->zr, qs, cz);
            }
            for (int64_t x = 0; x < split; x++) __builtin_prefetch(F(ahead_at)(&pf, x), 0, DECODE_LOC);
            int64_t r = 0;
#ifdef DECODE_AMX
            if (on_amx) { /* the scores of the group's keys from here on (up to 32), at its first block read */
                if (j >= amx_hi)
                    amx_lo = j, amx_hi = (j / 32 + 1) * 32 < j1 ? (j / 32 + 1) * 32 : j1,
                    amx_scores((const uint8_t *)kb, ldk, amx_hi - j, rows, d, t.b, t.w, t.a2, t.c, t.sc);
                for (; r < rows; r++) *(VF *)(p + r * VW) = *(const VF *)(t.sc + r * 32 + (j - amx_lo));
            }
#endif
            while (r < rows) { /* four rows at a time (then 2, 1) */
                const int64_t nr = rows - r >= 4 ? 4 : rows - r >= 2 ? 2 : 1;
                const float *qq[4];
                VF *ss[4];
                for (int i = 0; i < nr; i++) qq[i] = qs + (r + i) * dp, ss[i] = (VF *)(p + (r + i) * VW);
                if (nr == 4) F(dotsq4)(qq, (const uint8_t *)kb, ldk, d, nk, ss);
                else if (nr == 2) F(dotsq2)(qq, (const uint8_t *)kb, ldk, d, nk, ss);
                else F(dotsq1)(qq, (const uint8_t *)kb, ldk, d, nk, ss);
                r += nr;
            }
        }
        for (int64_t r = 0; r < rows && !kq4;) { /* every row's scores into p[r], four rows at a time (then 2, 1) */
            const int64_t nr = rows - r >= 4 ? 4 : rows - r >= 2 ? 2 : 1;
            const int64_t x0 = split * r / rows, x1 = split * (r + nr) / rows;
            const float *qq[4];
            VF *ss[4];
            for (int i = 0; i < nr; i++) qq[i] = q + (r + i) * dp, ss[i] = (VF *)(p + (r + i) * VW);
            F(dots_rows)(ktype, nr, qq, kb, ldk, dp, &pf, x0, x1, ss);
            r += nr;
        }
        VF ks = {}, vs = {}; /* int8: the block's scales (0 past its nk keys); float8: the head's */
        if (ksc && per && nk == VW)
            ks = *(const VFU *)(ksc + j), vs = *(const VFU *)(vsc + j);
        else
            for (int u = 0; u < nk && (ksc || vsc); u++) ks[u] = ksc[(j + u) * per], vs[u] = vsc[(j + u) * per];
        for (int64_t r = 0; r < rows; r++) { /* each row's weights of the block: p[r] (0 where unseen) */
            int64_t c[4] = {0, nk, nk, nk}; /* the row sees keys j + [c0, c1) and j + [c2, c3) */
            if (!whole) F(seen_in)(bound + 4 * r, j, nk, c);
            if (c[1] <= c[0]) {
                *(VF *)(p + r * VW) = (VF){};
                continue;
            }
            VF s = *(const VF *)(p + r * VW);
            if (ksc) s *= ks; /* int8: code dot products times each key's scale */
            if (kq4) s += cz[r]; /* int4: the group's zero points' share */
            bad += s * 0.0f; /* NaN from here on where a score is not finite: a key that is not (q is) */
            big = F(select)(s > big, s, F(select)(-s > big, -s, big));
            if (pr->vis->cap > 0.0f) s = F(tanhv)(s * (1.0f / pr->vis->cap)) * pr->vis->cap;
            if (c[0] != 0 || c[1] != VW) {
                const VI seen = ((lane >= (int32_t)c[0]) & (lane < (int32_t)c[1])) | ((lane >= (int32_t)c[2]) & (lane < (int32_t)c[3]));
                s = F(select)(seen, s, (VF){} - INFINITY);
            }
            const float slope = vis_slope(pr->vis, flat0 + r / tq);
            if (slope != 0.0f) {
                const VF dist = __builtin_convertvector((VI){} + (int32_t)(vis_pos(pr->vis, flat0 + r / tq, r % tq) - j) - lane, VF);
                s -= slope * F(select)(dist < 0.0f, -dist, dist);
            }
            if (pr->scores) /* the row's scores of the block, as its weights will be computed from them */
                for (int64_t u = 0, at = ((flat0 + r / tq) * tq + r % tq) * pr->tk + j; u < nk; u++) pr->scores[at + u] = s[u];
            const VF was = (VF){} + m[r];
            const VI up = s > was; /* NaN lanes (reported by `bad`) count as m[r] */
#if VW == 16 /* none up (most blocks): no reduction. The Xeon, 8,192 and 32,768 keys, two runs: AVX-512 int8, fp8 and
              * int4 1-6 % faster (one thread's CPU time 1-3 %), bfloat16 and float16 -2 to +3 %; with AVX2 forced int8
              * and int4 1-2 % faster but bfloat16 3-4 % slower in wall time, so AVX2 keeps the reduction */
            const float top = F(any)(up) ? F(hmax)(F(select)(up, s, was)) : m[r];
#else
            const float top = F(hmax)(F(select)(up, s, was));
#endif
            if (top > m[r]) { /* a new maximum: rescale what the row has summed so far */
                const float alpha = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - top);
                *(VF *)(lv + r * VW) *= alpha;
                for (int64_t t = 0; t < dvp; t++) acc[r * dvp + t] *= alpha;
                for (int64_t t = 0; t < dvp && i4; t++) acc4[r * dvp + t] *= alpha;
                for (int64_t t = 0; t < ng * VW; t++) zs[r * ng * VW + t] *= alpha;
                m[r] = top;
            }
            const VF e = F(exp2v)(s - m[r]);
            *(VF *)(lv + r * VW) += e;
            *(VF *)(p + r * VW) = e;
            if (vsc) *(VF *)(p + r * VW) *= vs; /* int8: the weight times its value row's scale */
        }
        if (vq4) /* the values' scales and zero points DECODE_AHEAD blocks on */
            for (int64_t x = 0; x < VW * V4->sr * 4; x += 64)
                __builtin_prefetch((const char *)(v4s + (j + DECODE_AHEAD * VW) * V4->sr) + x, 0, DECODE_LOC),
                __builtin_prefetch((const char *)(v4z + (j + DECODE_AHEAD * VW) * V4->zr) + x, 0, DECODE_LOC);
        if (vq4) F(q4_weights)(p, rows, nk, v4s + j * V4->sr, V4->sr, v4z + j * V4->zr, V4->zr, ng, w4, zs);
        for (int64_t r = 0; r < rows; r += PV_ROWS) { /* acc += p v, PV_ROWS rows sharing each row of v */
            const int64_t nr = rows - r < PV_ROWS ? rows - r : PV_ROWS;
            const int64_t y0 = split + (lines - split) * r / rows, y1 = split + (lines - split) * (r + nr) / rows;
            int64_t a = whole ? 0 : nk, z = whole ? nk : 0; /* the keys some row of them sees */
            for (int64_t x = r; x < r + nr && !whole; x++) {
                int64_t c[4];
                F(seen_in)(bound + 4 * x, j, nk, c);
                if (c[1] > c[0]) a = c[0] < a ? c[0] : a, z = c[3] > z ? c[3] : z;
            }
            if (z <= a) {
                for (int64_t x = y0; x < y1; x++) __builtin_prefetch(F(ahead_at)(&pf, x), 0, DECODE_LOC);
                continue;
            }
            for (int64_t x = r; x < r + nr && vq4;) { /* int4 values: 4, 2 or 1 rows at a time */
                const int64_t n = r + nr - x >= 4 ? 4 : r + nr - x >= 2 ? 2 : 1;
                F(pvq_rows)(n, w4 + x * ng * VW, ng, a, z, (const uint8_t *)vb, ldv, dv, acc4 + x * dvp, dvp);
                x += n;
            }
            if (vq4) continue;
            if (nr == PV_ROWS) {
                F(pv_rows)(vtype, nr, p + r * VW, a, z, vb, ldv, dvp, acc + r * dvp, &pf, y0, y1);
                continue;
            }
            for (int64_t x = r; x < r + nr; x += 2) /* the first call prefetches the group's lines */
                F(pv_rows)(vtype, r + nr - x >= 2 ? 2 : 1, p + x * VW, a, z, vb, ldv, dvp, acc + x * dvp, &pf, x == r ? y0 : y1, y1);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int u = 0; u < VW; u++) l[r] += lv[r * VW + u];
    if (i4) F(q4_finish)(acc, acc4, zs, rows, dv, dvp, ng);
#ifdef DECODE_AMX
    amx_end();
#endif
    float top = 0.0f, nan = 0.0f;
    for (int u = 0; u < VW; u++) top = big[u] > top ? big[u] : top, nan += bad[u];
    pr->checks[2 * it] = top, pr->checks[2 * it + 1] = nan;
}
