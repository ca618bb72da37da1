/* The decode pass, included by _tiles_body.h once per instruction set (struct dproblem is in _tiles.c).
 *
 * A few query rows (Tq of them, for the G query heads of a key/value head: G Tq rows) against a long
 * cache: the work is reading the keys and values, so each is read once. A work item is one chunk of
 * one (sequence, k/v head)'s keys: every row of the group meets each key block (VW keys) while it is
 * in L1, so grouped-query attention reads each k/v head once, not G times. Keys and values are used
 * as stored, converted as loaded (bfloat16: a widening load and a shift; float16: F16C's or AVX-512's
 * vcvtph2ps, bit arithmetic on the baseline; int8 and float8 codes times their scales; int4's groups and residual
 * ring as _tiles_decode_q4.h says): each vector of keys once for four rows, each vector of
 * values once for PV_ROWS rows (a block is staged in L1 only where its rows are not whole vectors).
 * Scores: for each row, VW dot products over D folded into one vector of VW scores by a tree of
 * shuffles. The block DECODE_AHEAD blocks on is prefetched a few lines per step, its values in p v's loops
 * where that measured faster (a core's one stream of keys and values was latency-bound without it). While
 * reading, the pass notes its scores' largest |value| and whether one was not finite (a NaN or Inf in a key
 * read): the check of a plain call's k (its output, of v), with no read of its own. Each item keeps
 * its rows' running maxima, sums and unnormalised outputs (FlashDecoding's partial results); after
 * every item is done each row merges its chunks by their log-sum-exp, in chunk order. Chunks come
 * from the shapes and the visibility (decode_chunk), never from the thread count: the same bits for
 * any number of threads. */

#include "_tiles_decode_ops.h"
#include "_tiles_decode_q4.h"
#if defined(X86_VARIANTS) && VW == 16 && defined(AMX_DECODE) /* the AVX-512 variant only */
#include "_tiles_decode_amx.h"
#define DECODE_AMX_HERE 1
#endif

/* Keys j + [c[0], c[1]) and j + [c[2], c[3]) of a block of nk are those a query with keys iv sees. */
static inline TARGET void F(seen_in)(const int64_t *iv, int64_t j, int64_t nk, int64_t c[4]) {
    vis_cols(iv, j, nk, c);
}

#define DITEM F(ditem)
#include "_tiles_ditem.h"
#undef DITEM
#ifdef DECODE_AMX_HERE
#define DECODE_AMX 1
#define DITEM F(ditem_amx)
#include "_tiles_ditem.h"
#undef DITEM
#undef DECODE_AMX
#endif

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
    int64_t chunks = decode_pieces(pr->tk, heads, pr->kvtype);
    if (chunks > DECODE_MAX_ITEMS / heads) chunks = DECODE_MAX_ITEMS / heads;
    if (chunks > DECODE_MAX_PART / (heads * pr->part)) chunks = DECODE_MAX_PART / (heads * pr->part);
    pr->chunks = chunks < 1 ? 1 : chunks;
    const int64_t items = heads * pr->chunks;
    float *parts = aligned_alloc(64, round64(sizeof(float) * (size_t)(items * (pr->part + 2))));
    if (!parts) return -1;
    pr->parts = parts, pr->checks = parts + items * pr->part;
    const int64_t x4 = pr->kvtype == DT_I4 ? pr->rows * (2 * pr->dp + pr->dvp + 2 * (pr->dv / 32) * VW) + (pr->rows + VW - 1) / VW * VW : 0;
    size_t per_thread = sizeof(float) * (pr->rows * (pr->dp + 2 * VW) + VW * (pr->dp + pr->dvp) + 8 * pr->rows + x4);
    pr->amx_at = 0;
#ifdef DECODE_AMX_HERE
    if (amx_fits(pr)) { /* its scratch after the rest, on a 64-byte line */
        pr->amx_at = (int64_t)(round64(per_thread) / sizeof(float));
        per_thread = round64(per_thread) + sizeof(float) * amx_carve(NULL, pr->rows, pr->d, NULL);
    }
#endif
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
#ifdef DECODE_AMX_HERE
                if (pr->amx_at > 0) F(ditem_amx)(pr, mem, it);
                else
#endif
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

#undef DECODE_AMX_HERE
#undef COMB
#undef SPLITS
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
#undef WIDEN8
#undef WIDEN8U
