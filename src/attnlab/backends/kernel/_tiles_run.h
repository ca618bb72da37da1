/* The forward's whole call, and the prelude it shares with the forward with statistics (_tiles_fstats.h's fsrun).
 * Included by _tiles_body.h once per instruction set, after the item it runs (F(item)). */

/* What every forward-shaped call does first: the tile sizes rounded to whole vectors and rows, and buffers for the
 * packed keys (*kp, also pr->kp) and, where they are packed, values (*vp, also pr->vp; else NULL). -1 where memory
 * runs out (then nothing is left allocated). */
static TARGET int F(packs)(struct problem *pr, float **kp, float **vp) {
    pr->bqp = (pr->bq + ROWS - 1) / ROWS * ROWS;
    pr->bk = (pr->bk + VW - 1) / VW * VW;
    pr->tkp = (pr->tk + VW - 1) / VW * VW;
    pr->dvp = (pr->dv + VW - 1) / VW * VW;
    const int pack_v = VPW || pr->dv % VW != 0;
    *kp = aligned_alloc(64, round64(sizeof(float) * pr->b * pr->tkp * pr->d));
    *vp = pack_v ? aligned_alloc(64, round64(sizeof(float) * pr->b * pr->tkp * pr->dvp)) : NULL;
    if (!*kp || (pack_v && !*vp)) {
        free(*kp);
        free(*vp);
        return -1;
    }
    pr->kp = *kp;
    pr->vp = *vp;
    return 0;
}

/* A thread's scratch floats for q: a whole number of 64-byte lines, so every buffer after it starts on one. */
static inline int64_t F(qfloats)(const struct problem *pr) { return (pr->bqp * pr->d + 15) / 16 * 16; }

/* Inside a parallel region: every sequence's k and v packed, the threads sharing the sequences (a barrier after). */
static TARGET void F(pack_all)(struct problem *pr, float *kp, float *vp) {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < pr->b; b++) F(pack)(pr, b, kp + b * pr->tkp * pr->d, vp ? vp + b * pr->tkp * pr->dvp : NULL);
}

/* The forward's item scratch laid out from mem: q, scores, the output block, the rows' maxima and sums. */
static inline struct scratch F(scratch_at)(const struct problem *pr, float *mem) {
    const int64_t qn = F(qfloats)(pr);
    return (struct scratch){mem, mem + qn, mem + qn + pr->bqp * pr->bk, mem + qn + pr->bqp * (pr->bk + pr->dvp),
                            mem + qn + pr->bqp * (pr->bk + pr->dvp + 1)};
}

/* The whole call: pack the keys, then every (head, query block) on the threads, the costliest first. */
static TARGET int F(run)(struct problem *pr) {
    float *kp, *vp;
    if (F(packs)(pr, &kp, &vp) != 0) return -1;
    const int64_t qblocks = (pr->tq + pr->bq - 1) / pr->bq, items = pr->b * pr->g * qblocks;
    int64_t next = 0;
    int failed = 0;
    const size_t per_thread = sizeof(float) * (F(qfloats)(pr) + pr->bqp * (pr->bk + pr->dvp) + 2 * pr->bqp);
#pragma omp parallel num_threads(pr->threads)
    {
        F(pack_all)(pr, kp, vp);
        float *mem = aligned_alloc(64, round64(per_thread));
        if (!mem) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        } else {
            const struct scratch sc = F(scratch_at)(pr, mem);
            for (;;) {
                const int64_t it = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
                if (it >= items) break;
                /* last query blocks first: under a causal band they see the most keys */
                const int64_t bg = it / qblocks, i0 = (qblocks - 1 - it % qblocks) * pr->bq;
                F(item)(pr, &sc, bg / pr->g, bg % pr->g, i0, i0 + pr->bq < pr->tq ? i0 + pr->bq : pr->tq);
            }
            free(mem);
        }
    }
    free(kp);
    free(vp);
    return failed ? -1 : 0;
}
