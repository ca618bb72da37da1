/* What each pass of the compiled kernel is handed, included once by _tiles.c before the passes: one
 * problem struct per pass (forward, backward, statistics, decode) and a thread's scratch, then the decode
 * pass's plan (the keys each row sees, the chunks of the cache) and the 16-bit conversions it shares. */

struct problem {
    const float *q, *k, *v;       /* (B, G, Tq, D), (B, Tk, D), (B, Tk, Dv), contiguous */
    float *out, *lse;             /* (B, G, Tq, Dv), (B, G, Tq) */
    const int64_t *klen;          /* (B, G) key-padding lengths, or NULL */
    const float *kp, *vp;         /* packed keys, padded values (or NULL: v as it is) */
    int64_t b, g, tq, tk, d, dv;
    int64_t left, right;          /* the band, -1 = unbounded */
    int by_length;                /* 1: query i of head (b, g) sits at klen[b, g] - Tq + i, else at Tk - Tq + i */
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
    const int64_t *klen;
    float *delta;                 /* (B, G, Tq): D = rowsum(dout out) - dlse */
    int64_t b, g, tq, tk, d, dv;
    int64_t left, right, bq, bk;
    int by_length;                /* as the forward's */
    int64_t bqp, dp, dvp;         /* bq, D, Dv rounded up to whole register tiles / vectors */
    float scale;
    int threads;
};

struct bscratch {
    float *q, *dout, *lse2, *lse2lo, *delta; /* a query block's rows (padded), LSE (base 2, hi + lo) and D */
    float *s, *ds;                  /* the tile's P and dS */
    float *dq, *dk, *dv;            /* accumulators: dQ of the block (or of the head), dK and dV of a key block */
    float *kp, *vp, *kr;            /* the key block packed: key and value panels, key rows padded to dp */
    int64_t packed_b, packed_j0;    /* which key block is packed (packed_b -1: none) */
};

/* The statistics pass (head_stats): sums per head of NSTATS row statistics, and column sums. */
enum { NSTATS = 7, NROW = 6 }; /* sums: prev, self, next, first, distance, entropy, entropy_norm */
struct sproblem {                 /* row accumulators: distance, sum w x, prev, self, next, first */
    const float *q, *k, *lse;     /* (B, G, T, D), (B, T, D), (B, G, T): self-attention, one length */
    double *sums, *received;      /* (B, G, NSTATS), (B, G, T) */
    const float *kp;              /* packed keys */
    int64_t b, g, t, d, left, right, bq, bk, bqp, tkp;
    float scale;
    int threads;
};

struct sscratch {
    float *q, *s, *col, *lse2, *lse2lo; /* the query block, its tile of weights, their column sums, LSE (hi, lo) */
    double *row;                        /* NROW accumulators per row of the block */
};

/* The decode pass (_tiles_decode.h): few query rows against a long cache, split into chunks of keys. */
enum { DT_F32, DT_F16, DT_BF16 }; /* how q, k and v are stored */
enum { DECODE_MIN_CHUNK = 512, DECODE_MAX_ITEMS = 4096, DECODE_MAX_PART = 1 << 22 };
struct dproblem {
    const void *q, *k, *v;        /* q (B, H, Tq, D) contiguous; k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) row-contiguous */
    float *out, *lse;             /* (B, H, Tq, Dv), (B, H, Tq) */
    const int64_t *lengths;       /* (B,) keys per sequence (query i of b sits at lengths[b] - Tq + i), or NULL: Tk */
    int64_t kb, kh, vb, vh;       /* k's and v's batch and head strides, in items */
    int64_t b, h, hkv, tq, tk, d, dv;
    int64_t left, right;          /* the band around each query's position, -1 = unbounded */
    int qtype, kvtype;            /* DT_*: q float32 or as k and v */
    float scale;
    int threads;
    int64_t g, rows, dp, dvp;     /* set by drun: G = H / Hkv, rows per group G Tq, D and Dv padded to vectors */
    int64_t chunks, part;         /* chunks per (b, k/v head), floats of one chunk's partial result */
    float *parts;                 /* per work item: acc (rows, dvp), then the rows' maxima and sums (base 2) */
};

/* The keys query row i of sequence b sees: [*lo, *hi) (empty when hi <= lo). */
static void decode_row(const struct dproblem *pr, int64_t b, int64_t i, int64_t *lo, int64_t *hi) {
    const int64_t len = pr->lengths ? pr->lengths[b] : pr->tk, pos = len - pr->tq + i;
    *lo = pr->left >= 0 && pos - pr->left > 0 ? pos - pr->left : 0;
    *hi = pr->right >= 0 && pos + pr->right + 1 < len ? pos + pr->right + 1 : len;
}

/* Chunk c of sequence b: keys [*j0, *j1) of the span its rows see, split into at most pr->chunks pieces of
 * at least DECODE_MIN_CHUNK keys (a multiple of 64). From the shapes, lengths and band alone: the same
 * chunks, and so the same bits, for any thread count. */
static void decode_chunk(const struct dproblem *pr, int64_t b, int64_t c, int64_t *j0, int64_t *j1) {
    int64_t lo, hi, lo_last, hi_first;
    decode_row(pr, b, 0, &lo, &hi_first);
    decode_row(pr, b, pr->tq - 1, &lo_last, &hi);
    const int64_t span = hi - lo;
    *j0 = *j1 = 0;
    if (span <= 0) return;
    int64_t n = (span + DECODE_MIN_CHUNK - 1) / DECODE_MIN_CHUNK;
    if (n > pr->chunks) n = pr->chunks;
    const int64_t size = ((span + n - 1) / n + 63) / 64 * 64;
    if (c * size >= span) return;
    *j0 = lo + c * size;
    *j1 = *j0 + size < hi ? *j0 + size : hi;
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
