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
 * - int4's newest rows (its residual ring, in the model's float32): copied to their slot.
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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode", "A decoding step's rows into a quantized cache.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__encode(void) { return PyModule_Create(&module); }
