/* attnlab.attention._tiles: the blockwise kernel's forward pass, compiled (float32, CPU).
 *
 * The Python loop in blockwise.py has to keep its tiles large (each PyTorch or NumPy call costs
 * microseconds and a fork-join of the threads), so its scores leave the L2 cache and every
 * softmax pass goes to memory. Here one query block of 96 rows meets key blocks of 512: the
 * scores of a tile stay in L2, the two GEMMs run on register tiles, and exp2 is a polynomial on
 * whole vectors. Work items (head, query block) go to OpenMP threads; since torch ships the same
 * libgomp.so.1 and the loader keeps one copy per soname, they are torch's own intra-op threads.
 *
 * The body (_tiles_body.h) is compiled for AVX-512, AVX2 and a 128-bit baseline (SSE2 or NEON),
 * and the best that the CPU runs is chosen at import (isa(name) picks another, for the tests). What it serves: contiguous float32 q (B, G,
 * Tq, D), k (B, Tk, D), v (B, Tk, Dv), a band (causal / sliding window, bottom-right aligned) and
 * key-padding lengths; dense masks, biases, float64 and GPUs stay with the Python kernel. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

struct problem {
    const float *q, *k, *v;       /* (B, G, Tq, D), (B, Tk, D), (B, Tk, Dv), contiguous */
    float *out, *lse;             /* (B, G, Tq, Dv), (B, G, Tq) */
    const int64_t *klen;          /* (B, G) key-padding lengths, or NULL */
    const float *kp, *vp;         /* packed keys, padded values (or NULL: v as it is) */
    int64_t b, g, tq, tk, d, dv;
    int64_t left, right;          /* the band, -1 = unbounded */
    int64_t bq, bk;               /* query rows and keys per tile */
    int64_t bqp, tkp, dvp;        /* bq, Tk, Dv rounded up to whole register tiles / vectors */
    float scale;
    int threads;
};

struct scratch {
    float *q, *s, *acc, *m, *l; /* a thread's query block, score tile, accumulator, row maxima and sums */
};

static size_t round64(size_t n) { return (n + 63) / 64 * 64; } /* aligned_alloc wants a multiple of the alignment */

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,fma")
#define VW 16
#define RQ 8
#define RP 6
#define NVMAX 4
#define ROWS 24
#define SFX avx512
#include "_tiles_body.h"
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define VW 8
#define RQ 6
#define RP 4
#define NVMAX 2
#define ROWS 12
#define SFX avx2
#include "_tiles_body.h"
#pragma GCC pop_options
#endif

#define VW 4
#define RQ 4
#define RP 4
#define NVMAX 2
#define ROWS 4
#define SFX base
#include "_tiles_body.h"

/* The instruction sets compiled in, best first, and whether this CPU runs each. */
static const struct {
    const char *name;
    int (*run)(struct problem *);
} isas[] = {
#if defined(__x86_64__) && defined(__GNUC__)
    {"AVX-512", run_avx512},
    {"AVX2", run_avx2},
#endif
    {"128-bit vectors", run_base}, /* SSE2 on x86-64, NEON on arm64: every CPU of those runs it */
};
#define NISAS ((int)(sizeof isas / sizeof isas[0]))
static int supported[NISAS];
static int chosen = NISAS - 1;

static void detect(void) {
    supported[NISAS - 1] = 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    supported[0] = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    supported[1] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    for (chosen = 0; !supported[chosen]; chosen++) {
    }
}

static PyObject *isas_here(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < NISAS; i++) {
        PyObject *name = supported[i] ? PyUnicode_FromString(isas[i].name) : NULL;
        if (supported[i] && (!name || PyList_Append(list, name) < 0)) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *isa(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|z", &name)) return NULL;
    if (name) {
        int i = 0;
        while (i < NISAS && (strcmp(isas[i].name, name) != 0 || !supported[i])) i++;
        if (i == NISAS) {
            PyErr_Format(PyExc_ValueError, "isa: this CPU or build has no %R (see isas())", PyTuple_GET_ITEM(args, 0));
            return NULL;
        }
        chosen = i;
    }
    return PyUnicode_FromString(isas[chosen].name);
}

/* A buffer argument of exactly `n` items of `itemsize` bytes, C-contiguous (the caller, tiles.py, checks dtypes). */
static int check_buffer(Py_buffer *view, const char *name, Py_ssize_t n, Py_ssize_t itemsize) {
    if (!PyBuffer_IsContiguous(view, 'C') || view->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous buffer of %zd items of %zd bytes, got %zd bytes",
                     name, n, itemsize, view->len);
        return 0;
    }
    return 1;
}

static PyObject *forward(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer q, k, v, out, lse, klen = {0};
    PyObject *klen_obj;
    struct problem pr = {0};
    long long b, g, tq, tk, d, dv, left, right, bq, bk;
    int threads;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*OLLLLLLfLLLLi", &q, &k, &v, &out, &lse, &klen_obj, &b, &g, &tq, &tk, &d,
                          &dv, &pr.scale, &left, &right, &bq, &bk, &threads))
        return NULL;
    if (klen_obj != Py_None && PyObject_GetBuffer(klen_obj, &klen, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (b < 0 || g < 1 || tq < 0 || tk < 0 || d < 1 || dv < 1 || bq < 1 || bk < 1 || threads < 0) {
        PyErr_SetString(PyExc_ValueError, "sizes must be positive (b, tq, tk may be 0; threads 0 = OpenMP's default)");
        goto done;
    }
    if (!check_buffer(&q, "q", b * g * tq * d, 4) || !check_buffer(&k, "k", b * tk * d, 4) ||
        !check_buffer(&v, "v", b * tk * dv, 4) || !check_buffer(&out, "out", b * g * tq * dv, 4) ||
        !check_buffer(&lse, "lse", b * g * tq, 4) || (klen.obj && !check_buffer(&klen, "klen", b * g, 8)))
        goto done;
    pr.q = q.buf, pr.k = k.buf, pr.v = v.buf, pr.out = out.buf, pr.lse = lse.buf;
    pr.klen = klen.obj ? klen.buf : NULL;
    pr.b = b, pr.g = g, pr.tq = tq, pr.tk = tk, pr.d = d, pr.dv = dv;
    pr.left = left, pr.right = right, pr.bq = bq, pr.bk = bk, pr.threads = threads;
#ifdef _OPENMP
    if (pr.threads == 0) pr.threads = omp_get_max_threads(); /* OMP_NUM_THREADS, torch.set_num_threads, or every CPU */
#else
    pr.threads = 1;
#endif
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = b * g * tq == 0 ? 0 : isas[chosen].run(&pr);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&q);
    PyBuffer_Release(&k);
    PyBuffer_Release(&v);
    PyBuffer_Release(&out);
    PyBuffer_Release(&lse);
    if (klen.obj) PyBuffer_Release(&klen);
    return result;
}

static PyObject *default_threads(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
#ifdef _OPENMP
    return PyLong_FromLong(omp_get_max_threads());
#else
    return PyLong_FromLong(1);
#endif
}

static PyMethodDef methods[] = {
    {"default_threads", default_threads, METH_NOARGS, "default_threads() -> the threads a call with threads=0 uses (OpenMP's default)."},
    {"forward", forward, METH_VARARGS,
     "forward(q, k, v, out, lse, klen, b, g, tq, tk, d, dv, scale, left, right, block_q, block_k, threads)\n\n"
     "Blockwise attention of float32 buffers q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv) into out (B, G, Tq, Dv)\n"
     "and lse (B, G, Tq); klen (B, G) int64 key-padding lengths or None; left/right the band (-1 = none);\n"
     "threads 0: OpenMP's default."},
    {"isas", isas_here, METH_NOARGS, "isas() -> the instruction sets compiled in that this CPU runs, best first."},
    {"isa", isa, METH_VARARGS, "isa(name=None) -> the instruction set in use; with a name (one of isas()), use that one."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_tiles",
    .m_doc = "attnlab's compiled blockwise attention kernel.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__tiles(void) {
    detect();
    return PyModule_Create(&module);
}
