/* attnlab.transformer._encode: a decoding step's new keys or values into an int8 cache, in one call (CPU).
 *
 * An int8 cache (attnlab.reference.quantized: one scale per token and k/v head, x^ = code * scale) takes one row
 * of D floats per sequence and k/v head at each decoding step. In torch that is some twenty small operations,
 * each a dispatch of a few microseconds (about 100 us for one layer's keys or values); here it is one pass over
 * the rows with the same bits as attnlab.transformer.quantize.encode_int8: scale = max|x| / 127 in float32,
 * code = x / scale rounded half to even and clamped to +-127 (a row of zeros: codes 0, scale 0). The call also
 * returns the longest row as read (code * scale), summed in double and rounded up to float32: the bound the
 * cache keeps of its rows. Every size is checked before anything is written. No -ffast-math: the division and
 * the rounding must be IEEE's, as torch's are. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

/* Row i of x (n, d) into codes and scales at slot `slot` of its (sequence, head): codes (n, cap, d), scales
 * (n, cap). Returns the largest sum of squares of a row as read. */
static double encode(const float *restrict x, signed char *restrict codes, float *restrict scales, Py_ssize_t n,
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

static PyObject *int8_rows(PyObject *self, PyObject *args) {
    Py_buffer x = {0}, codes = {0}, scales = {0};
    Py_ssize_t n, d, cap, slot;
    if (!PyArg_ParseTuple(args, "y*w*w*nnnn", &x, &codes, &scales, &n, &d, &cap, &slot))
        return NULL;
    int ok = 1;
    if (n < 1 || d < 1 || cap < 1 || slot < 0 || slot >= cap) {
        PyErr_Format(PyExc_ValueError, "rows and dim must be >= 1 and slot in 0..capacity - 1, got rows %zd, dim %zd, "
                     "capacity %zd, slot %zd", n, d, cap, slot);
        ok = 0;
    } else if (x.len != n * d * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "x must hold rows x dim = %zd float32 values, got %zd bytes", n * d, x.len);
        ok = 0;
    } else if (codes.len != n * cap * d) {
        PyErr_Format(PyExc_ValueError, "codes must hold rows x capacity x dim = %zd int8 values, got %zd bytes",
                     n * cap * d, codes.len);
        ok = 0;
    } else if (scales.len != n * cap * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "scales must hold rows x capacity = %zd float32 values, got %zd bytes", n * cap,
                     scales.len);
        ok = 0;
    }
    double top = 0.0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        top = encode(x.buf, codes.buf, scales.buf, n, d, cap, slot);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&scales);
    if (!ok)
        return NULL;
    const double norm = sqrt(top);
    float up = (float)norm;
    if ((double)up < norm)
        up = nextafterf(up, INFINITY);
    return PyFloat_FromDouble(up);
}

static PyMethodDef methods[] = {
    {"int8_rows", int8_rows, METH_VARARGS,
     "int8_rows(x, codes, scales, rows, dim, capacity, slot) -> float: each row of x (rows, dim) float32 as int8 "
     "codes and a scale at `slot` of codes (rows, capacity, dim) int8 and scales (rows, capacity) float32, every "
     "buffer C-contiguous; returns the longest row as read (code * scale), rounded up to float32."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode", "A decoding step's rows into an int8 cache.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__encode(void) { return PyModule_Create(&module); }
