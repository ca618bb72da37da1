/* The decode pass's int4 scores on AMX's tile multiply (Sapphire Rapids and later), included by _tiles_decode.h in the
 * AVX-512 variant where the compiler knows AMX. In vector registers an int4 key block's scores were a quarter of its
 * pass (one thread, 32,768 keys, D = 128, four rows a k/v head: about 6 of 26 ns a key and head), each code widened,
 * looked up and multiplied by four rows. Here the tile unit multiplies, exactly, in integers:
 * - a key group's scaled queries qs = q * s (float32, as q4_group computes them) become integers
 *   X = round(qs 2^e), e per row and group so that the row's largest |qs| 2^e lies in [2^25, 2^26): a product a
 *   float32 holds within 2^-2 of the largest keeps all its bits, a smaller one is rounded to 2^-26 of the largest
 *   (a float32 sum of the same products rounds each partial sum to 2^-24 of itself);
 * - byte k of a key's codes holds channels 2k (low nibble) and 2k + 1 (high): A1 is the bytes as stored (the
 *   cache itself, loaded straight into a tile) and A2 their high nibbles, so with B1 = X at the even channels and
 *   B2 = X_odd - 16 X_even, A1 B1 + A2 B2 = low X_even + high X_odd (TDPBUSD: unsigned bytes times signed ones,
 *   summed in int32);
 * - X as four signed bytes, X = sum_p d_p 256^p (the bytes of X + 0x80808080, each minus 128): 4 rows x 4
 *   digits are B's 16 columns, and a row's score is sum_p C_p 256^p 2^-e in float32 plus the group's zero
 *   points' share cz, as q4_group adds it;
 * - the scores of a group's 32 keys (two blocks) at once, at its first block read.
 * A group whose qs holds a NaN or Inf (a scale that is not finite) goes the vector way (q4_group, dotsq*), whose
 * scores then show it to the check. AMX needs Linux's permission (arch_prctl: _tiles.c asks at the first int4
 * decoding). Measured (the 2-core Xeon of benchmarks/README.md, 8,192-131,072 keys): the int4 pass 1.2x faster. */

#define AMX_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,fma,amx-tile,amx-int8")))
#define AMX_ROWS 64 /* rows (G Tq) a work item may have for this path (more: the vector way) */

/* Where it applies: int4 keys, D 64, 128 or 256 (a key's codes one tile row of 32 or 64 bytes, or two of 64), at most
 * AMX_ROWS rows, and the process allowed AMX (pr->amx, from the decode call). */
static inline int amx_fits(const struct dproblem *pr) {
    return pr->amx && pr->kvtype == DT_I4 && (pr->d == 64 || pr->d == 128 || pr->d == 256) && pr->rows <= AMX_ROWS;
}

struct amx_config { /* ldtilecfg's 64 bytes: palette 1, then each tile's bytes per row and rows */
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tiles 0, 1: C of a call's two blocks (16 keys x 16 int32); 2, 3: B1 and B2 (W / 4 rows of 64 bytes); 4, 5: block
 * 0's A1 and A2 (16 keys x W bytes), 6, 7: block 1's; W = 64 bytes of codes (128 channels) or, for D = 64, 32. Constants
 * in memory: GCC 12 does not see ldtilecfg read its operand, and dropped the stores of a configuration built on the
 * stack. */
#define AMX_CONFIG(W)                                                                                          \
    {.palette = 1, .colsb = {64, 64, 64, 64, W, W, W, W}, .rows = {16, 16, W / 4, W / 4, 16, 16, 16, 16}}
static const struct amx_config amx_wide = AMX_CONFIG(64), amx_narrow = AMX_CONFIG(32);
#undef AMX_CONFIG

static AMX_TARGET void amx_begin(int64_t d) { _tile_loadconfig(d == 64 ? &amx_narrow : &amx_wide); }

static AMX_TARGET void amx_end(void) { _tile_release(); }

/* The AMX scratch of a work item, from `at` (on a 64-byte line): each row group's B1 and B2 for each chunk of 128
 * channels (2 KB), a call's A2 tiles (2 blocks x chunks x 1 KB), C (2 tiles), each row group's 16 column weights and
 * the rows' scores of a call's 32 keys. Fills s (where not NULL) and returns the size in floats: the one place that
 * lays it out, for drun's allocation and the work item's pointers. */
struct amx_scratch {
    int8_t *b;
    uint8_t *a2;
    int32_t *c;
    float *w, *sc;
};

static inline int64_t amx_carve(float *at, int64_t rows, int64_t d, struct amx_scratch *s) {
    const int64_t chunks = (d + 127) / 128, groups = (rows + 3) / 4;
    const int64_t b = 512 * groups * chunks, a2 = 512 * chunks, c = 512, w = 16 * groups; /* floats each */
    if (s) s->b = (int8_t *)at, s->a2 = (uint8_t *)(at + b), s->c = (int32_t *)(at + b + a2), s->w = at + b + a2 + c,
           s->sc = s->w + w;
    return b + a2 + c + w + 32 * rows;
}

/* A vector of 16 int32 as four signed bytes each (x = sum_p d_p 256^p, d_p in [-128, 127]: the bytes of
 * x + 0x80808080, each minus 128), and in each 128-bit lane four values' digits turned into four digits' values. */
static inline AMX_TARGET __m512i amx_digits(__m512i x) {
    const __m512i half = _mm512_set1_epi32((int32_t)0x80808080u);
    const __m512i spread = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    return _mm512_shuffle_epi8(_mm512_xor_si512(_mm512_add_epi32(x, half), half), spread);
}

static inline AMX_TARGET __m512i amx_round(__m512 x) { /* to the nearest integer, ties to even */
    return _mm512_cvt_roundps_epi32(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* Four rows' vectors of amx_digits (16 bytes k each) as four rows of B (64 bytes: the rows' lanes side by side). */
static inline AMX_TARGET void amx_b_rows(const __m512i x[4], int8_t *b) {
    const __m512i t0 = _mm512_shuffle_i32x4(x[0], x[1], 0x44), t1 = _mm512_shuffle_i32x4(x[0], x[1], 0xEE);
    const __m512i t2 = _mm512_shuffle_i32x4(x[2], x[3], 0x44), t3 = _mm512_shuffle_i32x4(x[2], x[3], 0xEE);
    _mm512_store_si512(b, _mm512_shuffle_i32x4(t0, t2, 0x88));
    _mm512_store_si512(b + 64, _mm512_shuffle_i32x4(t0, t2, 0xDD));
    _mm512_store_si512(b + 128, _mm512_shuffle_i32x4(t1, t3, 0x88));
    _mm512_store_si512(b + 192, _mm512_shuffle_i32x4(t1, t3, 0xDD));
}

/* A key group's B tiles and column weights w (16 per row group: column 4i + p of row 4g + i weighs 256^p 2^-e), and
 * each row's zero points' share cz = q . z, from q (rows, dp, channel order) and the group's d scales s and zero points
 * z. Byte k of a key's codes holds channels 2k (low nibble) and 2k + 1 (high), so with qs = q * s and
 * X = round(qs 2^e) (e per row: its largest |qs| 2^e in [2^25, 2^26)), B1 holds X's even channels and B2
 * Y = X_odd - 16 X_even, and A1 the bytes as stored, A2 their high nibbles: byte * X_even + high * Y = low * X_even
 * + high * X_odd, exact in int32 (|Y| < 2^31 - 2^24, every C below 2^23). Row group g's chunk t of 128 channels: B1 at
 * b + (g chunks + t) 2048 bytes, B2 1024 bytes on. Returns 0 (nothing usable written) where some qs is not finite. */
static AMX_TARGET int amx_group(const float *restrict q, int64_t rows, int64_t dp, int64_t d, const float *restrict s,
                                const float *restrict z, int8_t *restrict b, float *restrict w, float *restrict cz) {
    const int64_t kw = d == 64 ? 32 : 64, chunks = d / 2 / kw, groups = (rows + 3) / 4, vecs = d / 32;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    memset(w, 0, sizeof(float) * 16 * groups); /* rows of the last group past `rows`: weight 0 */
    for (int64_t g = 0; g < groups; g++) {
        __m512i x1[4][8], x2[4][8]; /* row i's digits of B1 and B2: 16 channel pairs (bytes k) each */
        for (int i = 0; i < 4; i++) {
            const int64_t r = 4 * g + i;
            if (r >= rows) {
                for (int64_t v = 0; v < vecs; v++) x1[i][v] = x2[i][v] = _mm512_setzero_si512();
                continue;
            }
            __m512 e[8], o[8], c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(); /* c: q . z */
            __m512i top = _mm512_setzero_si512(); /* the largest |qs| as bits: positive floats order as their bits do */
            const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
            for (int64_t v = 0; v < vecs; v++) { /* channels 32v .. 32v + 31 */
                const float *x = q + r * dp + 32 * v, *y = s + 32 * v;
                const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(y));
                const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(y + 16));
                c0 = _mm512_fmadd_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(z + 32 * v), c0);
                c1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(z + 32 * v + 16), c1);
                e[v] = _mm512_permutex2var_ps(lo, ev, hi), o[v] = _mm512_permutex2var_ps(lo, od, hi);
                top = _mm512_max_epi32(top, _mm512_max_epi32(_mm512_and_si512(_mm512_castps_si512(lo), magnitude),
                                                            _mm512_and_si512(_mm512_castps_si512(hi), magnitude)));
            }
            const int32_t bits = _mm512_reduce_max_epi32(top);
            if (bits >= 0x7f800000) return 0; /* an Inf or NaN */
            /* 25 - the exponent of the largest (bits x 2^-149 where subnormal) */
            const int ex = bits == 0 ? 0 : bits >> 23 ? 152 - (bits >> 23) : 143 + __builtin_clz((unsigned)bits);
            for (int p = 0; p < 4; p++) { /* row group g's column 4i + p: 2^(8p - ex), by its bits where it is normal */
                const int at = 127 + 8 * p - ex;
                const uint32_t wb = (uint32_t)at << 23;
                if (at > 0 && at < 255) memcpy(w + 4 * r + p, &wb, sizeof wb);
                else w[4 * r + p] = ldexpf(1.0f, 8 * p - ex);
            }
            const __m512 sc = _mm512_set1_ps((float)ex);
            for (int64_t v = 0; v < vecs; v++) {
                const __m512i xe = amx_round(_mm512_scalef_ps(e[v], sc)), xo = amx_round(_mm512_scalef_ps(o[v], sc));
                x1[i][v] = amx_digits(xe), x2[i][v] = amx_digits(_mm512_sub_epi32(xo, _mm512_slli_epi32(xe, 4)));
            }
            cz[r] = _mm512_reduce_add_ps(_mm512_add_ps(c0, c1));
        }
        for (int64_t v = 0; v < vecs; v++) { /* bytes 16v .. 16v + 15: B rows 4 (v % (kw / 16)) on in chunk v / (kw / 16) */
            const __m512i a1[4] = {x1[0][v], x1[1][v], x1[2][v], x1[3][v]}, a2[4] = {x2[0][v], x2[1][v], x2[2][v], x2[3][v]};
            int8_t *at = b + (g * chunks + v / (kw / 16)) * 2048 + v % (kw / 16) * 256;
            amx_b_rows(a1, at), amx_b_rows(a2, at + 1024);
        }
    }
    return 1;
}

/* The scores of every row against n <= 32 keys of int4 codes k (rows ldk bytes apart; two blocks of 16: a group's)
 * into sc (rows, 32; 0 past n), the group's B tiles and weights as amx_group wrote them (without cz: the caller adds
 * it). Rows past n are read (unused): they are codes of the same group. */
static AMX_TARGET void amx_scores(const uint8_t *restrict k, int64_t ldk, int64_t n, int64_t rows, int64_t d,
                                  const int8_t *restrict b, const float *restrict w, uint8_t *restrict a2,
                                  int32_t *restrict c, float *restrict sc) {
    const int64_t kw = d == 64 ? 32 : 64, chunks = d / 2 / kw, groups = (rows + 3) / 4, blocks = n > 16 ? 2 : 1;
    const __m512i nibble = _mm512_set1_epi8(15);
    for (int64_t x = 0; x < blocks * chunks; x++) /* A2: each key's high nibbles, 16 keys of a block and chunk */
        for (int u = 0; u < 16; u++) {
            const uint8_t *src = k + (x / chunks * 16 + u) * ldk + x % chunks * kw;
            const __m512i y = kw == 64 ? _mm512_loadu_si512(src) : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)src));
            const __m512i h = _mm512_and_si512(_mm512_srli_epi16(y, 4), nibble);
            if (kw == 64) _mm512_store_si512(a2 + x * 1024 + u * 64, h);
            else _mm256_store_si256((__m256i *)(a2 + x * 1024 + u * 32), _mm512_castsi512_si256(h));
        }
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int64_t g = 0; g < groups; g++) {
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t t = 0; t < chunks; t++) {
            const int8_t *bt = b + (g * chunks + t) * 2048;
            _tile_loadd(2, bt, 64);
            _tile_loadd(3, bt + 1024, 64);
            _tile_loadd(4, k + t * kw, ldk); /* block 0's codes as stored */
            _tile_loadd(5, a2 + t * 1024, kw);
            _tile_dpbusd(0, 4, 2);
            _tile_dpbusd(0, 5, 3);
            if (blocks == 2) {
                _tile_loadd(6, k + 16 * ldk + t * kw, ldk);
                _tile_loadd(7, a2 + (chunks + t) * 1024, kw);
                _tile_dpbusd(1, 6, 2);
                _tile_dpbusd(1, 7, 3);
            }
        }
        _tile_stored(0, c, 64);
        if (blocks == 2) _tile_stored(1, c + 256, 64);
        /* key u's 16 columns (4 rows x 4 digits) weighed and summed per row: adjacent lanes twice */
        const __m512 wg = _mm512_load_ps(w + 16 * g);
        float zt[64] __attribute__((aligned(64)));
        for (int64_t h = 0; h < blocks; h++) {
            for (int j = 0; j < 4; j++) {
                __m512 pair[2];
                for (int i = 0; i < 2; i++) {
                    const int32_t *cu = c + (h * 16 + 4 * j + 2 * i) * 16;
                    const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cu)), wg);
                    const __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cu + 16)), wg);
                    pair[i] = _mm512_add_ps(_mm512_permutex2var_ps(x, ev, y), _mm512_permutex2var_ps(x, od, y));
                }
                _mm512_store_ps(zt + 16 * j, _mm512_add_ps(_mm512_permutex2var_ps(pair[0], ev, pair[1]),
                                                          _mm512_permutex2var_ps(pair[0], od, pair[1])));
            }
            __m512 out[4]; /* zt: key u's 4 rows at zt + 4u */
            F(t16x4)(zt, (VF *)out);
            const int64_t live = n - 16 * h < 16 ? n - 16 * h : 16;
            const __mmask16 keep = (__mmask16)((1u << live) - 1u);
            for (int i = 0; i < 4 && 4 * g + i < rows; i++)
                _mm512_store_ps(sc + (4 * g + i) * 32 + 16 * h, _mm512_maskz_mov_ps(keep, out[i]));
        }
        if (blocks == 1)
            for (int i = 0; i < 4 && 4 * g + i < rows; i++) _mm512_store_ps(sc + (4 * g + i) * 32 + 16, _mm512_setzero_ps());
    }
}
