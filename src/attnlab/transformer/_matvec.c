/* attnlab.transformer._matvec: a linear layer applied to a few rows, at the speed of memory (float32, CPU).
 *
 * A decoding step multiplies every weight matrix by one row per sequence: each weight is read once
 * and used for a handful of multiply-adds, so the step is a read of the weights from memory. torch's
 * CPU linear (MKL's sgemv/sgemm) reads a row-major (out, in) matrix at a third of the bandwidth for
 * so few rows; here each output row r is the dot products of W[r, :] with every input row, the
 * threads split the output rows, and W is streamed once. Compiled for AVX-512, AVX2 and the
 * baseline (GCC and clang's target_clones, chosen when the library loads).
 * Every argument is checked before anything is read: sizes in bytes against the shapes given. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_ROWS 8 /* input rows per call: beyond it torch's matrix product is the better read */
/* Weights smaller than this (floats, 512 KiB) are read by the calling thread alone: waking the other threads
 * costs more than the read, and on a busy machine a parallel region waits for its slowest (descheduled)
 * thread, so a small model's step would take as long as the other programs let the slowest thread run. */
#define PARALLEL_MIN (1 << 17)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* Output rows o0..o1 − 1 of y (M, R) = x (M, C) · W (R, C)ᵀ + b (R) (b may be NULL). Each row of W is read
 * from memory once; four input rows at a time share each load of it, the rest (M mod 4) take one each. */
CLONES static void rows(const float *restrict w, const float *restrict x, const float *restrict b, float *restrict y,
                        Py_ssize_t m, Py_ssize_t r, Py_ssize_t c, Py_ssize_t o0, Py_ssize_t o1) {
    for (Py_ssize_t o = o0; o < o1; o++) {
        const float *row = w + o * c;
        const float add = b ? b[o] : 0.0f;
        Py_ssize_t i = 0;
        for (; i + 4 <= m; i += 4) {
            const float *x0 = x + i * c, *x1 = x0 + c, *x2 = x1 + c, *x3 = x2 + c;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            #pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (Py_ssize_t j = 0; j < c; j++) {
                const float wj = row[j];
                s0 += wj * x0[j];
                s1 += wj * x1[j];
                s2 += wj * x2[j];
                s3 += wj * x3[j];
            }
            y[i * r + o] = s0 + add;
            y[(i + 1) * r + o] = s1 + add;
            y[(i + 2) * r + o] = s2 + add;
            y[(i + 3) * r + o] = s3 + add;
        }
        for (; i < m; i++) {
            const float *in = x + i * c;
            float s = 0.0f;
            #pragma omp simd reduction(+ : s)
            for (Py_ssize_t j = 0; j < c; j++)
                s += row[j] * in[j];
            y[i * r + o] = s + add;
        }
    }
}

/* The threads split the output rows in equal runs (OpenMP's outlined body would not be cloned); a small
 * weight (under PARALLEL_MIN floats) is one thread's. */
static void matvec(const float *w, const float *x, const float *b, float *y, Py_ssize_t m, Py_ssize_t r, Py_ssize_t c) {
    #pragma omp parallel if (r * c >= PARALLEL_MIN)
    {
        Py_ssize_t n = 1, t = 0;
#ifdef _OPENMP
        n = omp_get_num_threads();
        t = omp_get_thread_num();
#endif
        rows(w, x, b, y, m, r, c, r * t / n, r * (t + 1) / n);
    }
}

static int sized(const char *name, Py_buffer *buf, Py_ssize_t count) {
    if (buf->len != count * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd float32 values (%zd bytes), got %zd bytes", name, count,
                     count * (Py_ssize_t)sizeof(float), buf->len);
        return 0;
    }
    return 1;
}

static PyObject *linear(PyObject *self, PyObject *args) {
    Py_buffer w = {0}, x = {0}, y = {0}, b = {0};
    PyObject *bias;
    Py_ssize_t m, r, c;
    if (!PyArg_ParseTuple(args, "y*y*Ow*nnn", &w, &x, &bias, &y, &m, &r, &c))
        return NULL;
    int ok = 1;
    if (m < 1 || m > MAX_ROWS || r < 1 || c < 1) {
        PyErr_Format(PyExc_ValueError, "rows must be 1..%d and the weight's shape >= 1, got rows %zd, weight (%zd, %zd)",
                     MAX_ROWS, m, r, c);
        ok = 0;
    }
    if (ok && bias != Py_None && PyObject_GetBuffer(bias, &b, PyBUF_SIMPLE) < 0)
        ok = 0;
    ok = ok && sized("weight", &w, r * c) && sized("x", &x, m * c) && sized("out", &y, m * r) &&
         (bias == Py_None || sized("bias", &b, r));
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        matvec(w.buf, x.buf, bias == Py_None ? NULL : b.buf, y.buf, m, r, c);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    if (b.obj)
        PyBuffer_Release(&b);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"linear", linear, METH_VARARGS,
     "linear(weight, x, bias, out, rows, out_features, in_features) -> None: out (rows, out_features) = "
     "x (rows, in_features) · weightᵀ + bias, every buffer C-contiguous float32 (bias may be None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_matvec", "A linear layer on a few rows, float32, CPU.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__matvec(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod && PyModule_AddIntConstant(mod, "MAX_ROWS", MAX_ROWS) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
