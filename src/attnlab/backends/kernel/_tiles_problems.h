/* What each pass of the compiled kernel is handed, included once by _tiles.c before the passes: one
 * problem struct per pass (forward, backward, statistics, decode) and a thread's scratch, then the decode
 * pass's plan (the keys each row sees, the chunks of the cache) and the 16-bit conversions it shares. */

struct vis;

struct problem {
    const float *q, *k, *v;       /* (B, G, Tq, D), (B, Tk, D), (B, Tk, Dv), contiguous */
    float *out, *lse;             /* (B, G, Tq, Dv), (B, G, Tq) */
    double *sums, *received;      /* forward_stats: (B, G, NSTATS), (B, G, Tq); else NULL */
    const struct vis *vis;        /* which keys each row sees, ALiBi, sinks */
    const float *kp, *vp;         /* packed keys, padded values (or NULL: v as it is) */
    int64_t b, g, tq, tk, d, dv;
    int64_t bq, bk;               /* query rows and keys per tile */
    int64_t bqp, tkp, dvp;        /* bq, Tk, Dv rounded up to whole register tiles / vectors */
    float scale;
    int threads;
};

struct scratch {
    float *q, *s, *acc, *m, *l; /* a thread's query block, score tile, accumulator, row maxima and sums */
};

/* The backward pass: gradients of out (and of LSE) back to q, k, v. */
struct bproblem {
    const float *q, *k, *v, *out, *lse, *dout, *dlse; /* as the forward's; dout like out, dlse like lse (or NULL) */
    float *gq, *gk, *gv;                              /* the gradients dq, dk, dv: like q, k, v */
    const struct vis *vis;        /* as the forward's */
    float *delta;                 /* (B, G, Tq): D = rowsum(dout out) - dlse */
    int64_t b, g, tq, tk, d, dv;
    int64_t bq, bk;
    int64_t bqp, dp, dvp;         /* bq, D, Dv rounded up to whole register tiles / vectors */
    float scale;
    int threads;
};

struct bscratch {
    float *q, *dout, *lse2, *lse2lo, *delta; /* a query block's rows (padded), LSE (base 2, hi + lo) and D */
    float *s, *ds;                  /* the tile's P and dS */
    float *dq, *dk, *dv;            /* accumulators: dQ of the block (or of the head), dK and dV of a key block */
    float *kp, *vp, *kr;            /* the key block packed: key and value panels, key rows padded to dp */
    float *th;                      /* a row's tanh of its scores under softcapping (bk floats) */
    int64_t packed_b, packed_j0;    /* which key block is packed (packed_b -1: none) */
};

/* The statistics pass (head_stats): sums per head of NSTATS row statistics, and column sums. */
enum { NSTATS = 7, NROW = 6 }; /* sums: prev, self, next, first, distance, entropy, entropy_norm */
struct sproblem {                 /* row accumulators: distance, sum w x, prev, self, next, first */
    const float *q, *k, *lse;     /* (B, G, T, D), (B, T, D), (B, G, T): self-attention, one length */
    double *sums, *received;      /* (B, G, NSTATS), (B, G, T) */
    const float *kp;              /* packed keys */
    const struct vis *vis;        /* which keys each row sees (the forward's description) */
    int64_t b, g, t, d, bq, bk, bqp, tkp;
    float scale;
    int threads;
};

struct sscratch {
    float *q, *s, *col, *lse2, *lse2lo; /* the query block, its tile of weights, their column sums, LSE (hi, lo) */
    double *row;                        /* NROW accumulators per row of the block */
};

/* The pooled pass (the long view's overview): per head, the sum and the largest of the weights of each
 * cell of block x block pairs (the last cells narrower), N = ceil(T / block) cells a side. */
struct pproblem {
    const float *q, *k, *lse;     /* (B, G, T, D), (B, T, D), (B, G, T): self-attention, one length */
    double *sums;                 /* (B, G, N, N) */
    float *maxes;                 /* (B, G, N, N) */
    int64_t *topk;                /* (B, G, T, K) every row's K largest weights' keys, largest first, or NULL */
    float *topw;                  /* (B, G, T, K) their weights */
    int64_t ntop;                 /* K, 0: no top keys */
    const float *kp;              /* packed keys */
    const struct vis *vis;        /* which keys each row sees, ALiBi, softcap (the forward's description) */
    int64_t b, g, t, d, bq, bk, block, n, bqp, tkp;
    float scale;                  /* as the forward rounds it */
    double scale64, softcap64;    /* as given: a large weight is recomputed in double from them (0: no softcap) */
    int threads;
};

struct pscratch {
    float *q, *s, *csum, *cmax, *lse2, *lse2lo; /* query rows, score tile, the tile's column sums and maxima, LSE */
    float *tw;                                  /* each row of the query block's top weights so far (bqp, K) */
    int64_t *tk, *tn;                           /* their keys (bqp, K) and how many (bqp) */
};

/* The decode pass (_tiles_decode.h): few query rows against a long cache, split into chunks of keys. */
enum { DT_F32, DT_F16, DT_BF16, DT_I8, DT_F8, DT_I4 }; /* how q, k and v are stored (int8: codes, a float32 scale per
                                                * key; float8_e4m3fn: codes, one scale per sequence and k/v head;
                                                * int4: KIVI's groups of 32 and a float residual, struct q4) */
enum { DECODE_CHUNK = 4096, DECODE_CHUNK_I4 = 8192, DECODE_MIN_CHUNK = 512, DECODE_MIN_ITEMS = 32, DECODE_MAX_ITEMS = 4096,
       DECODE_MAX_PART = 1 << 22 };

/* How many chunks each of `heads` (sequence, k/v head) pairs' span of keys is cut into: chunks of DECODE_CHUNK
 * keys, smaller (down to DECODE_MIN_CHUNK) where that leaves fewer than DECODE_MIN_ITEMS work items in all, so
 * that up to 16 or so threads share them. Each work item's start costs a core's read stream time (not its first
 * blocks' prefetch: prefetching the next item's first blocks during the last ones did not recover it). On the
 * AVX-512 Xeon, 8 k/v heads of 4,096-32,768 keys, this rule against chunks of 512: float32 1.02-1.09x faster,
 * 16-bit 1.06-1.12x. Chunks of 4,096 against 2,048 (stop 45, the same Xeon, 32,768 and 131,072 keys, two threads):
 * float32 1.01x, 16-bit 1.01-1.04x, int8 and float8 1.03-1.04x; AVX2 forced 1.01-1.04x. int4 restarts six streams an
 * item (codes, scales and zero points of keys and values) and its group's query digits: chunks of DECODE_CHUNK_I4
 * (32,768 keys, against 2,048: 4,096 1.04x, 8,192 1.06x faster). */
static inline int64_t decode_pieces(int64_t span, int64_t heads, int kvtype) {
    const int64_t chunk = kvtype == DT_I4 ? DECODE_CHUNK_I4 : DECODE_CHUNK;
    const int64_t big = (span + chunk - 1) / chunk, most = (span + DECODE_MIN_CHUNK - 1) / DECODE_MIN_CHUNK;
    const int64_t want = (DECODE_MIN_ITEMS + heads - 1) / heads, n = want < most ? want : most;
    return n > big ? n : big;
}
/* One side (keys or values) of an int4 cache (attnlab.reference.quantized): codes two per byte along the head
 * (channel 2c in the low nibble), x = code * scale + zero; keys grouped per channel over 32 tokens (scale and
 * zero (B, Hkv, C/32, D)), values per token over 32 channels ((B, Hkv, C, Dv/32)); positions >= held[b] come
 * from the float ring `res` (B, Hkv, slots, D) at slot position % slots, stored as rtype. */
struct q4 {
    const float *s, *z;           /* scales and zero points, the last dim contiguous */
    int64_t sb, sh, sr, zb, zh, zr; /* their batch, head and row (group or token) strides, in floats */
    const void *res;              /* the residual ring, each head's rows contiguous */
    int64_t rb, rh, slots;        /* its batch and head strides in items, its slots (a multiple of 32) */
    const int64_t *held;          /* (B,) positions held as codes, each a multiple of 32 */
};

struct dproblem {
    const void *q, *k, *v;        /* q (B, H, Tq, D) contiguous; k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) row-contiguous */
    float *out, *lse;             /* (B, H, Tq, Dv), (B, H, Tq) */
    float *scores;                /* (B, H, Tq, Tk) or NULL: each row's scores in base 2 (scale log2 e q.k, softcap,
                                   * ALiBi), written for the keys of the blocks it sees (-inf where it does not see
                                   * a key of them); the caller fills the rest with -inf */
    const struct vis *vis;        /* which keys each row sees, ALiBi, sinks: (B, H) is the decode's own */
    int64_t kb, kh, vb, vh;       /* k's and v's batch and head strides, in items */
    const float *ks, *vs;         /* int8 codes' scales (B, Hkv, Tk), one per key (k) and per value row (v), each
                                   * head's contiguous; float8's (B, Hkv), one per head: x = code * scale; NULL for
                                   * float caches */
    int64_t ksb, ksh, vsb, vsh;   /* the scales' batch and head strides, in floats */
    struct q4 k4, v4;             /* int4 (kvtype DT_I4): keys' and values' groups and residual rings */
    int64_t b, h, hkv, tq, tk, d, dv;
    int qtype, kvtype, rtype;     /* DT_*: q float32 or as k and v; rtype: int4's residual (F32, F16 or BF16) */
    float scale;
    int threads;
    int amx;                      /* int4 keys' scores may use AMX (the AVX-512 variant, where the process may) */
    int64_t amx_at;               /* set by drun: where a thread's AMX scratch starts in its floats (0: none) */
    int64_t g, rows, dp, dvp;     /* set by drun: G = H / Hkv, rows per group G Tq, D and Dv padded to vectors */
    int64_t chunks, part;         /* chunks per (b, k/v head), floats of one chunk's partial result */
    float *parts;                 /* per work item: acc (rows, dvp), then the rows' maxima and sums (base 2) */
    float *checks;                /* per work item: its scores' largest |value| (base 2) and a sum that is NaN
                                   * where one of them was not finite */
    float largest;                /* set by drun: the largest |scale q.k| computed; NaN where one was not finite */
};

static float f8_float(uint8_t x) { /* a float8_e4m3fn code's value (never NaN: the cache writes none) */
    const int e = (x >> 3) & 15, m = x & 7;
    const float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    return x & 0x80 ? -v : v;
}

static float bf16_float(uint16_t x) {
    const uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float f16_float(uint16_t x) { /* IEEE half to float: subnormals by a multiplication, Inf and NaN kept */
    const uint32_t em = x & 0x7fffu, sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t bits = em << 13;
    float f;
    memcpy(&f, &bits, sizeof f);
    f *= 0x1p112f;
    memcpy(&bits, &f, sizeof bits);
    if (em >= 0x7c00u) bits = (em << 13) | 0x7f800000u;
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; } /* aligned_alloc wants a multiple of the alignment */

/* Which keys each query row sees and how its scores change (attnlab.masks, as Python stored it). Rows live
 * in the masks' (B, H) index space; a pass's (b, g) heads map onto it by flat = b G + g = bi H + hi. */
struct vis {
    const int64_t *spans;         /* (sb, sh, Tq, 4): each row's keys [lo1, hi1) and [lo2, hi2), sorted; NULL: all */
    const int64_t *qpos;          /* (pb, ph, Tq): each query's position, for ALiBi; NULL without ALiBi */
    const float *slopes;          /* (ns,) ALiBi slopes per head, base 2 (ns 1 or H); NULL: none */
    const float *sinks;           /* (kb, kh) learned sink logits (natural log); NULL: none */
    int64_t sb, sh, pb, ph, ns, kb, kh;
    int64_t heads, tq, tk;        /* H of the (B, H) space, Tq, Tk */
    float cap;                    /* logit softcapping in base 2, c log2 e (Gemma-2); 0: none */
};

static inline int64_t vis_at(int64_t nb, int64_t nh, int64_t heads, int64_t flat) { /* (bi, hi) as an index of (nb, nh) */
    return (nb > 1 ? flat / heads : 0) * nh + (nh > 1 ? flat % heads : 0);
}

/* Row i of head `flat`: its keys as two sorted intervals (the second empty where hi <= lo). */
static inline void vis_row(const struct vis *v, int64_t flat, int64_t i, int64_t iv[4]) {
    if (!v->spans) {
        iv[0] = 0, iv[1] = v->tk, iv[2] = iv[3] = 0;
        return;
    }
    const int64_t *p = v->spans + (vis_at(v->sb, v->sh, v->heads, flat) * v->tq + i) * 4;
    iv[0] = p[0], iv[1] = p[1], iv[2] = p[2], iv[3] = p[3];
    if (iv[1] <= iv[0]) iv[0] = iv[2], iv[1] = iv[3], iv[2] = iv[3] = 0; /* the first empty: the second alone */
}

/* The keys [*lo, *hi) some row i0..i1-1 of head `flat` sees (*hi <= *lo: none). */
static inline void vis_range(const struct vis *v, int64_t flat, int64_t i0, int64_t i1, int64_t *lo, int64_t *hi) {
    *lo = v->tk, *hi = 0;
    for (int64_t i = i0; i < i1; i++) {
        int64_t iv[4];
        vis_row(v, flat, i, iv);
        for (int s = 0; s < 4; s += 2)
            if (iv[s + 1] > iv[s]) {
                if (iv[s] < *lo) *lo = iv[s];
                if (iv[s + 1] > *hi) *hi = iv[s + 1];
            }
    }
}

/* Whether some row i0..i1-1 of head `flat` sees a key of [j0, j1): a tile no row sees is skipped (not read). */
static inline int vis_meets(const struct vis *v, int64_t flat, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    if (!v->spans) return 1;
    for (int64_t i = i0; i < i1; i++) {
        int64_t iv[4];
        vis_row(v, flat, i, iv);
        if ((iv[1] > iv[0] && iv[0] < j1 && iv[1] > j0) || (iv[3] > iv[2] && iv[2] < j1 && iv[3] > j0)) return 1;
    }
    return 0;
}

/* The columns of a tile of n keys from j0 that a row with keys iv sees: c[0]..c[1]-1 and c[2]..c[3]-1. */
static inline void vis_cols(const int64_t iv[4], int64_t j0, int64_t n, int64_t c[4]) {
    for (int s = 0; s < 4; s++) {
        const int64_t x = iv[s] - j0;
        c[s] = x < 0 ? 0 : x > n ? n : x;
    }
    if (c[1] <= c[0]) c[0] = c[2], c[1] = c[3];
    if (c[3] <= c[2] || c[0] == c[2]) c[2] = c[3] = c[1]; /* one run: the second is empty, just after it */
}

static inline float vis_slope(const struct vis *v, int64_t flat) {
    return v->slopes ? v->slopes[v->ns > 1 ? flat % v->heads : 0] : 0.0f;
}

static inline int64_t vis_pos(const struct vis *v, int64_t flat, int64_t i) {
    return v->qpos ? v->qpos[vis_at(v->pb, v->ph, v->heads, flat) * v->tq + i] : 0;
}

static inline float vis_sink(const struct vis *v, int64_t flat) { /* base 2; -inf: no sink */
    return v->sinks ? v->sinks[vis_at(v->kb, v->kh, v->heads, flat)] * 1.4426950408889634f : -INFINITY;
}

/* Chunk c of the group (sequence b, k/v head hk): keys [*j0, *j1) of the span its rows see (int4: from the start
 * of its first group), split into decode_pieces' count of pieces (at most pr->chunks; each a multiple of 64 keys). From the shapes and the visibility
 * alone: the same chunks, and so the same bits, for any thread count. */
static void decode_chunk(const struct dproblem *pr, int64_t b, int64_t hk, int64_t c, int64_t *j0, int64_t *j1) {
    int64_t lo = pr->tk, hi = 0;
    for (int64_t gi = 0; gi < pr->g; gi++) {
        int64_t l, h;
        vis_range(pr->vis, b * pr->h + hk * pr->g + gi, 0, pr->tq, &l, &h);
        if (h > l) lo = l < lo ? l : lo, hi = h > hi ? h : hi;
    }
    if (pr->kvtype == DT_I4 && hi > lo) lo -= lo % 32; /* int4: chunks (and so blocks) start on a group of 32 */
    const int64_t span = hi - lo;
    *j0 = *j1 = 0;
    if (span <= 0) return;
    int64_t n = decode_pieces(span, pr->b * pr->hkv, pr->kvtype);
    if (n > pr->chunks) n = pr->chunks;
    const int64_t size = ((span + n - 1) / n + 63) / 64 * 64;
    if (c * size >= span) return;
    *j0 = lo + c * size;
    *j1 = *j0 + size < hi ? *j0 + size : hi;
}

