/* attnlab.transformer._encode: a decoding step's new keys or values into a quantized cache, in one call (CPU).
 *
 * A quantized cache (attnlab.reference.quantized) takes one row of D floats per sequence and k/v head at each
 * decoding step. In torch that is some twenty small operations, each a dispatch of a few microseconds (about
 * 100 us for one layer's keys or values); here it is one pass over the rows, with torch's bits:
 * - int8 (attnlab.transformer.quantize.encode_int8): scale = max|x| / 127 in float32, code = x / scale rounded
 *   half to even and clamped to +-127 (a row of zeros: codes 0, scale 0);
 * - fp8 (Store._write_fp8, once every head's scale is set): y = x / scale, clamped to +-448 (each entry beyond
 *   counted), rounded half to even to float8 e4m3fn (4 exponent bits, bias 7, 3 mantissa bits, no infinity;
 *   below 2^-6 steps of 2^-9), as torch's cast rounds every value up to 448.
 * - int4's newest rows (its residual ring, in the model's float32): copied to their slot; and the group of 32
 *   positions that leaves the ring when one is due: encoded as encode_int4 does.
 * Each call also returns the longest row as read (code * scale), summed in double and rounded up to float32:
 * the bound the cache keeps of its rows. Every size is checked before anything is written. No -ffast-math: the
 * division and the rounding must be IEEE's, as torch's are. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Row i of x (n, d) into codes and scales at slot `slot` of its (sequence, head): codes (n, cap, d), scales
 * (n, cap). Returns the largest sum of squares of a row as read. */
static double encode_int8(const float *restrict x, signed char *restrict codes, float *restrict scales, Py_ssize_t n,
                          Py_ssize_t d, Py_ssize_t cap, Py_ssize_t slot) {
    double top = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float *row = x + i * d;
        signed char *out = codes + (i * cap + slot) * d;
        float amax = 0.0f;
        for (Py_ssize_t j = 0; j < d; j++) {
            const float a = fabsf(row[j]);
            amax = a > amax ? a : amax;
        }
        const float scale = amax / 127.0f, safe = scale > 0.0f ? scale : 1.0f;
        double sum = 0.0;
        for (Py_ssize_t j = 0; j < d; j++) {
            float c = nearbyintf(row[j] / safe); /* the default rounding: half to even, as torch.round */
            c = c < -127.0f ? -127.0f : c > 127.0f ? 127.0f : c;
            out[j] = (signed char)c;
            const double r = (double)(c * scale); /* the entry as read: one float32 product */
            sum += r * r;
        }
        scales[i * cap + slot] = scale;
        top = sum > top ? sum : top;
    }
    return top;
}

#define FP8_MAX 448.0f

/* |y| <= 448 (finite) as a float8 e4m3fn byte, rounded half to even. */
static unsigned char e4m3(float y) {
    uint32_t b;
    memcpy(&b, &y, sizeof b);
    const unsigned sign = (b >> 24) & 0x80u;
    const float a = fabsf(y);
    if (a < 0.015625f) /* below 2^-6: subnormal steps of 2^-9 (8 steps is 2^-6, whose bits are the first normal's) */
        return (unsigned char)(sign | (unsigned)nearbyintf(a * 512.0f));
    const uint32_t m = b & 0x7fffffu, rest = m & 0xfffffu;
    uint32_t code = ((((b >> 23) & 0xffu) - 127u + 7u) << 3) | (m >> 20); /* exponent rebiased, 3 mantissa bits */
    code += rest > 0x80000u || (rest == 0x80000u && (code & 1u)); /* half to even; a carry moves the exponent */
    return (unsigned char)(sign | code);
}

/* The float32 value of a float8 e4m3fn byte (never NaN here: |value| <= 448). */
static float e4m3_value(unsigned char c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const float a = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf((float)m, -9);
    return c & 0x80 ? -a : a;
}

/* Row i of x (n, d) divided by scales[i], as fp8 codes at slot `slot` of codes (n, cap, d); counts in *over the
 * entries beyond +-448 (clamped there). Returns the largest sum of squares of a row as read. */
static double encode_fp8(const float *restrict x, unsigned char *restrict codes, const float *restrict scales,
                         Py_ssize_t n, Py_ssize_t d, Py_ssize_t cap, Py_ssize_t slot, Py_ssize_t *over) {
    double top = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float *row = x + i * d, scale = scales[i];
        unsigned char *out = codes + (i * cap + slot) * d;
        double sum = 0.0;
        for (Py_ssize_t j = 0; j < d; j++) {
            float y = row[j] / scale;
            *over += fabsf(y) > FP8_MAX;
            y = y < -FP8_MAX ? -FP8_MAX : y > FP8_MAX ? FP8_MAX : y;
            out[j] = e4m3(y);
            const double r = (double)(e4m3_value(out[j]) * scale); /* as read: the code's value times the scale */
            sum += r * r;
        }
        top = sum > top ? sum : top;
    }
    return top;
}

/* Row i of x (n, d) copied to slot `slot` of its ring (n, cap, d) of float32 (int4's newest rows, kept as the model's
 * float32). Returns the largest sum of squares of a row. */
static double copy_f32(const float *restrict x, float *restrict ring, Py_ssize_t n, Py_ssize_t d, Py_ssize_t cap,
                       Py_ssize_t slot) {
    double top = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float *row = x + i * d;
        float *out = ring + (i * cap + slot) * d;
        double sum = 0.0;
        for (Py_ssize_t j = 0; j < d; j++) {
            out[j] = row[j];
            sum += (double)row[j] * row[j];
        }
        top = sum > top ? sum : top;
    }
    return top;
}

#define GROUP 32 /* int4: tokens per key group (one channel), channels per value group (one token) */

/* int4 (KIVI's groups, attnlab.reference.quantized): positions first..first + 31 of each row i, read from its float32
 * ring (n, slots, d) at slot (first + t) % slots, become codes (n, cap, d / 2: channel 2u in byte u's low nibble,
 * 2u + 1 in its high one), scales and zero points: keys grouped per channel (scale, zero (n, cap / 32, d): over the
 * 32 tokens), values per token (scale, zero (n, cap, d / 32): over 32 channels). encode_int4's bits: zero = the
 * group's minimum, scale = (max - min) / 15, code = (x - zero) / scale (1 where scale is 0) rounded half to even,
 * clamped to 0..15. Returns the largest sum of squares of a row as read: code * scale + zero, two float32
 * roundings as the reference's dequantize (the build keeps them apart: -ffp-contract=off). */
static double encode_int4(const float *restrict ring, unsigned char *restrict codes, float *restrict scale,
                          float *restrict zero, Py_ssize_t n, Py_ssize_t d, Py_ssize_t slots, Py_ssize_t cap,
                          Py_ssize_t first, int channel) {
    double top = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float *x = ring + i * slots * d;
        if (channel) { /* one scale and zero per channel, over the group's 32 tokens */
            float *s = scale + (i * (cap / GROUP) + first / GROUP) * d, *z = zero + (i * (cap / GROUP) + first / GROUP) * d;
            for (Py_ssize_t c = 0; c < d; c++) {
                float lo = INFINITY, hi = -INFINITY;
                for (Py_ssize_t t = 0; t < GROUP; t++) {
                    const float v = x[((first + t) % slots) * d + c];
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                s[c] = (hi - lo) / 15.0f, z[c] = lo;
            }
        } else { /* one scale and zero per 32 channels of each token */
            for (Py_ssize_t t = 0; t < GROUP; t++) {
                const float *row = x + ((first + t) % slots) * d;
                float *s = scale + (i * cap + first + t) * (d / GROUP), *z = zero + (i * cap + first + t) * (d / GROUP);
                for (Py_ssize_t j = 0; j < d / GROUP; j++) {
                    float lo = INFINITY, hi = -INFINITY;
                    for (Py_ssize_t c = j * GROUP; c < (j + 1) * GROUP; c++)
                        lo = row[c] < lo ? row[c] : lo, hi = row[c] > hi ? row[c] : hi;
                    s[j] = (hi - lo) / 15.0f, z[j] = lo;
                }
            }
        }
        for (Py_ssize_t t = 0; t < GROUP; t++) {
            const float *row = x + ((first + t) % slots) * d;
            unsigned char *out = codes + (i * cap + first + t) * (d / 2);
            const Py_ssize_t at = channel ? (i * (cap / GROUP) + first / GROUP) * d : (i * cap + first + t) * (d / GROUP);
            double sum = 0.0;
            for (Py_ssize_t c = 0; c < d; c++) {
                const Py_ssize_t k = at + (channel ? c : c / GROUP);
                const float safe = scale[k] > 0.0f ? scale[k] : 1.0f;
                float q = nearbyintf((row[c] - zero[k]) / safe);
                q = q < 0.0f ? 0.0f : q > 15.0f ? 15.0f : q;
                if (c % 2)
                    out[c / 2] |= (unsigned char)((unsigned)q << 4);
                else
                    out[c / 2] = (unsigned char)q;
                const float product = q * scale[k], v = product + zero[k];
                sum += (double)v * v;
            }
            top = sum > top ? sum : top;
        }
    }
    return top;
}

/* sqrt(sum of squares) rounded up to float32: a bound, never below the double it comes from. */
static PyObject *bound(double top) {
    const double norm = sqrt(top);
    float up = (float)norm;
    if ((double)up < norm)
        up = nextafterf(up, INFINITY);
    return PyFloat_FromDouble(up);
}

/* The buffers' sizes against the shapes: x (n, d) float32, codes (n, cap, d) of `item` bytes each, scales (NULL for
 * none) `scale_count` float32 values. */
static int sizes(Py_buffer *x, Py_buffer *codes, Py_ssize_t item, Py_buffer *scales, Py_ssize_t n, Py_ssize_t d,
                 Py_ssize_t cap, Py_ssize_t slot, Py_ssize_t scale_count) {
    if (n < 1 || d < 1 || cap < 1 || slot < 0 || slot >= cap)
        PyErr_Format(PyExc_ValueError, "rows and dim must be >= 1 and slot in 0..capacity - 1, got rows %zd, dim %zd, "
                     "capacity %zd, slot %zd", n, d, cap, slot);
    else if (x->len != n * d * (Py_ssize_t)sizeof(float))
        PyErr_Format(PyExc_ValueError, "x must hold rows x dim = %zd float32 values, got %zd bytes", n * d, x->len);
    else if (codes->len != n * cap * d * item)
        PyErr_Format(PyExc_ValueError, "%s must hold rows x capacity x dim = %zd %s, got %zd bytes",
                     item == 1 ? "codes" : "ring", n * cap * d, item == 1 ? "one-byte codes" : "float32 values",
                     codes->len);
    else if (scales && scales->len != scale_count * (Py_ssize_t)sizeof(float))
        PyErr_Format(PyExc_ValueError, "scales must hold %zd float32 values, got %zd bytes", scale_count, scales->len);
    else
        return 1;
    return 0;
}

/* int8_rows and fp8_rows: the buffers parsed and checked, the rows encoded with the GIL released. fp8's scales are
 * read (one per row), int8's written (one per row and slot). */
static PyObject *encode_rows(PyObject *args, int fp8) {
    Py_buffer x = {0}, codes = {0}, scales = {0};
    Py_ssize_t n, d, cap, slot, over = 0;
    if (!PyArg_ParseTuple(args, fp8 ? "y*w*y*nnnn" : "y*w*w*nnnn", &x, &codes, &scales, &n, &d, &cap, &slot))
        return NULL;
    const int ok = sizes(&x, &codes, 1, &scales, n, d, cap, slot, fp8 ? n : n * cap);
    double top = 0.0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        top = fp8 ? encode_fp8(x.buf, codes.buf, scales.buf, n, d, cap, slot, &over)
                  : encode_int8(x.buf, codes.buf, scales.buf, n, d, cap, slot);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&scales);
    if (!ok)
        return NULL;
    PyObject *norm = bound(top);
    return fp8 && norm ? Py_BuildValue("(Nn)", norm, over) : norm;
}

static PyObject *f32_rows(PyObject *self, PyObject *args) {
    Py_buffer x = {0}, ring = {0};
    Py_ssize_t n, d, cap, slot;
    if (!PyArg_ParseTuple(args, "y*w*nnnn", &x, &ring, &n, &d, &cap, &slot))
        return NULL;
    const int ok = sizes(&x, &ring, sizeof(float), NULL, n, d, cap, slot, 0);
    double top = 0.0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        top = copy_f32(x.buf, ring.buf, n, d, cap, slot);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&ring);
    return ok ? bound(top) : NULL;
}

static PyObject *int4_group(PyObject *self, PyObject *args) {
    Py_buffer ring = {0}, codes = {0}, scale = {0}, zero = {0};
    Py_ssize_t n, d, slots, cap, first;
    int channel;
    if (!PyArg_ParseTuple(args, "y*w*w*w*nnnnnp", &ring, &codes, &scale, &zero, &n, &d, &slots, &cap, &first, &channel))
        return NULL;
    const Py_ssize_t groups = channel ? cap / GROUP * d : cap * (d / GROUP); /* scales (and zeros) per row */
    int ok = 0;
    if (n < 1 || d < GROUP || d % GROUP || cap % GROUP || slots < GROUP || first < 0 || first % GROUP || first + GROUP > cap)
        PyErr_Format(PyExc_ValueError, "rows >= 1, dim a multiple of 32, capacity a multiple of 32, ring slots >= 32 and "
                     "first a multiple of 32 with first + 32 <= capacity, got rows %zd, dim %zd, capacity %zd, slots "
                     "%zd, first %zd", n, d, cap, slots, first);
    else if (ring.len != n * slots * d * (Py_ssize_t)sizeof(float))
        PyErr_Format(PyExc_ValueError, "ring must hold rows x slots x dim = %zd float32 values, got %zd bytes",
                     n * slots * d, ring.len);
    else if (codes.len != n * cap * (d / 2))
        PyErr_Format(PyExc_ValueError, "codes must hold rows x capacity x dim / 2 = %zd bytes, got %zd", n * cap * (d / 2),
                     codes.len);
    else if (scale.len != n * groups * (Py_ssize_t)sizeof(float) || zero.len != scale.len)
        PyErr_Format(PyExc_ValueError, "scale and zero must hold %zd float32 values each, got %zd and %zd bytes",
                     n * groups, scale.len, zero.len);
    else
        ok = 1;
    double top = 0.0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        top = encode_int4(ring.buf, codes.buf, scale.buf, zero.buf, n, d, slots, cap, first, channel);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&ring);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&scale);
    PyBuffer_Release(&zero);
    return ok ? bound(top) : NULL;
}

static PyObject *int8_rows(PyObject *self, PyObject *args) { return encode_rows(args, 0); }

static PyObject *fp8_rows(PyObject *self, PyObject *args) { return encode_rows(args, 1); }

static PyMethodDef methods[] = {
    {"int8_rows", int8_rows, METH_VARARGS,
     "int8_rows(x, codes, scales, rows, dim, capacity, slot) -> float: each row of x (rows, dim) float32 as int8 "
     "codes and a scale at `slot` of codes (rows, capacity, dim) int8 and scales (rows, capacity) float32, every "
     "buffer C-contiguous; returns the longest row as read (code * scale), rounded up to float32."},
    {"fp8_rows", fp8_rows, METH_VARARGS,
     "fp8_rows(x, codes, scales, rows, dim, capacity, slot) -> (float, int): each row i of x (rows, dim) float32 "
     "divided by scales[i] (rows,) float32, clamped to +-448 and rounded to float8 e4m3fn at `slot` of codes "
     "(rows, capacity, dim) (one byte each), every buffer C-contiguous; returns the longest row as read (rounded "
     "up to float32) and how many entries were beyond +-448."},
    {"f32_rows", f32_rows, METH_VARARGS,
     "f32_rows(x, ring, rows, dim, capacity, slot) -> float: each row of x (rows, dim) float32 copied to `slot` of "
     "ring (rows, capacity, dim) float32 (int4's residual), both C-contiguous; returns the longest row, rounded up."},
    {"int4_group", int4_group, METH_VARARGS,
     "int4_group(ring, codes, scale, zero, rows, dim, ring_slots, capacity, first, channel) -> float: positions "
     "first..first + 31 of each row's float32 ring (rows, ring_slots, dim) as int4 codes (rows, capacity, dim / 2), "
     "scales and zero points (channel: (rows, capacity / 32, dim); else (rows, capacity, dim / 32)), every buffer "
     "C-contiguous; returns the longest of those rows as read, rounded up to float32."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode", "A decoding step's rows into a quantized cache.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__encode(void) { return PyModule_Create(&module); }
