/* attnlab.backends.kernel._tiles: the blockwise kernel's forward pass, compiled (float32, CPU).
 *
 * The Python loop in blockwise.py has to keep its tiles large (each PyTorch or NumPy call costs
 * microseconds and a fork-join of the threads), so its scores leave the L2 cache and every
 * softmax pass goes to memory. Here one query block of 96 rows meets key blocks of 512: the
 * scores of a tile stay in L2, the two GEMMs run on register tiles, and exp2 is a polynomial on
 * whole vectors. Work items (head, query block) go to OpenMP threads; since torch ships the same
 * libgomp.so.1 and the loader keeps one copy per soname, they are torch's own intra-op threads.
 *
 * The body (_tiles_body.h) is compiled for AVX-512, AVX2 and a 128-bit baseline (SSE2 or NEON),
 * and the best that the CPU runs is chosen at import (isa(name) picks another, for the tests).
 * What it serves: contiguous float32 q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv), a band (causal /
 * sliding window, bottom-right aligned) and key-padding lengths; dense masks, biases, float64 and
 * GPUs stay with the Python loop (the blockwise backend). Every argument is checked here, before
 * anything is read: dtype, C-contiguity, shapes against each other, lengths, block sizes. */

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

/* The backward pass: gradients of out (and of LSE) back to q, k, v. */
struct bproblem {
    const float *q, *k, *v, *out, *lse, *dout, *dlse; /* as the forward's; dout like out, dlse like lse (or NULL) */
    float *gq, *gk, *gv;                              /* the gradients dq, dk, dv: like q, k, v */
    const int64_t *klen;
    float *delta;                 /* (B, G, Tq): D = rowsum(dout out) - dlse */
    int64_t b, g, tq, tk, d, dv;
    int64_t left, right, bq, bk;
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

static size_t round64(size_t n) { return (n + 63) / 64 * 64; } /* aligned_alloc wants a multiple of the alignment */

/* Each variant's functions carry __attribute__((target(...))), which GCC and clang both honour
 * (clang ignores `#pragma GCC target`: under it such variants were baseline code in disguise). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define X86_VARIANTS 1
#define AVX512_TARGET "avx512f,avx512vl,fma"
#define AVX2_TARGET "avx2,fma"

#define TARGET __attribute__((target(AVX512_TARGET)))
#define VW 16
#define RQ 8
#define RP 6
#define NVMAX 4
#define ROWS 24
#define SFX avx512
#include "_tiles_body.h"

#define TARGET __attribute__((target(AVX2_TARGET)))
#define VW 8
#define RQ 6
#define RP 4
#define NVMAX 2
#define ROWS 12
#define SFX avx2
#include "_tiles_body.h"
#endif

#define TARGET
#define VW 4
#define RQ 4
#define RP 4
#define NVMAX 2
#define ROWS 4
#define SFX base
#include "_tiles_body.h"

/* The instruction sets compiled in, best first, and whether this CPU runs each. */
static const struct {
    const char *name, *target; /* target: the attribute's features, "" for the compiler's baseline */
    int (*run)(struct problem *);
    int (*brun)(struct bproblem *);
} isas[] = {
#ifdef X86_VARIANTS
    {"AVX-512", AVX512_TARGET, run_avx512, brun_avx512},
    {"AVX2", AVX2_TARGET, run_avx2, brun_avx2},
#endif
    {"128-bit vectors", "", run_base, brun_base}, /* SSE2 on x86-64, NEON on arm64: every CPU of those runs it */
};
#define NISAS ((int)(sizeof isas / sizeof isas[0]))
static int supported[NISAS];
static int chosen = NISAS - 1;

static void detect(void) {
    supported[NISAS - 1] = 1;
#ifdef X86_VARIANTS
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

static PyObject *build_info(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
    PyObject *variants = PyList_New(0);
    for (int i = 0; variants && i < NISAS; i++) {
        PyObject *v = Py_BuildValue("{s:s,s:s,s:O}", "name", isas[i].name, "target", isas[i].target, "runs_here",
                                    supported[i] ? Py_True : Py_False);
        if (!v || PyList_Append(variants, v) < 0) Py_CLEAR(variants);
        Py_XDECREF(v);
    }
    if (!variants) return NULL;
#define STR_(x) #x
#define STR(x) STR_(x)
#ifdef __clang__
    const char *compiler = "clang " STR(__clang_major__) "." STR(__clang_minor__) "." STR(__clang_patchlevel__);
#elif defined(__GNUC__)
    const char *compiler = "gcc " __VERSION__;
#else
    const char *compiler = "unknown";
#endif
#ifdef _OPENMP
    PyObject *openmp = PyLong_FromLong(_OPENMP);
#else
    PyObject *openmp = Py_NewRef(Py_None);
#endif
    return Py_BuildValue("{s:N,s:s,s:s,s:N}", "variants", variants, "chosen", isas[chosen].name, "compiler", compiler,
                         "openmp", openmp);
}

/* ---- Checking the arguments: everything the kernel reads or writes is checked before it runs. ---- */

static int little_endian(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

/* The buffer's element type: 'f' float32, 'i' int64, 0 anything else. */
static char kind_of(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && little_endian()) || (*f == '>' && !little_endian())) f++;
    if (f[0] && !f[1]) {
        if (f[0] == 'f' && view->itemsize == 4) return 'f';
        if ((f[0] == 'q' || f[0] == 'l') && view->itemsize == 8) return 'i';
    }
    return 0;
}

static void format_shape(char *buf, size_t size, int ndim, const Py_ssize_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%zd%s", i ? " " : "", shape[i], i + 1 < ndim || ndim == 1 ? "," : "");
    if (used < size) snprintf(buf + used, size - used, ")");
}

/* Take `obj`'s buffer as argument `name`: a C-contiguous array of `kind` ('f' float32, 'i' int64),
 * `ndim` dims named by the letters of `dims` (e.g. "BGTD"). dim[letter] holds each size seen so far
 * (-1 unset): the first array to show a letter sets it, every later one must match. */
static int take(PyObject *obj, Py_buffer *view, const char *name, int writable, char kind, const char *dims,
                Py_ssize_t dim[128]) {
    const int ndim = (int)strlen(dims);
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        view->obj = NULL;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_ValueError, "%s: expected a %s%s array, got %s (%S)", name, writable ? "writable " : "",
                     kind == 'f' ? "float32" : "int64", Py_TYPE(obj)->tp_name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return 0;
    }
    const char got = kind_of(view);
    if (got != kind) {
        PyErr_Format(PyExc_ValueError, "%s: expected %s items (buffer format %s), got format '%s' of %zd bytes", name,
                     kind == 'f' ? "float32" : "int64", kind == 'f' ? "'f'" : "'q' or 'l'",
                     view->format ? view->format : "B", view->itemsize);
        return 0;
    }
    char expected[160], seen[160];
    int ok = view->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = dim[(int)dims[i]] < 0 || dim[(int)dims[i]] == view->shape[i];
    if (!ok) {
        size_t used = (size_t)snprintf(expected, sizeof expected, "(");
        for (int i = 0; i < ndim && used < sizeof expected; i++) {
            const Py_ssize_t n = dim[(int)dims[i]];
            used += n < 0 ? (size_t)snprintf(expected + used, sizeof expected - used, "%s%c", i ? ", " : "", dims[i])
                          : (size_t)snprintf(expected + used, sizeof expected - used, "%s%c=%zd", i ? ", " : "", dims[i], n);
        }
        if (used < sizeof expected) snprintf(expected + used, sizeof expected - used, ")");
        format_shape(seen, sizeof seen, view->ndim, view->shape);
        PyErr_Format(PyExc_ValueError, "%s: expected shape %s, got %s", name, expected, seen);
        return 0;
    }
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous array, got strides that are not", name);
        return 0;
    }
    for (int i = 0; i < ndim; i++) dim[(int)dims[i]] = view->shape[i];
    return 1;
}

static void release(Py_buffer *views, int n) {
    for (int i = 0; i < n; i++)
        if (views[i].obj) PyBuffer_Release(&views[i]);
}

/* The scalar arguments every call shares; a band edge beyond Tq + Tk is the same as none. */
static int check_scalars(int64_t tq, int64_t tk, long long left, long long right, long long bq, long long bk, int threads,
                         int64_t *out_left, int64_t *out_right, int64_t *out_bq, int64_t *out_bk, int *out_threads) {
    if (left < -1 || right < -1) {
        PyErr_Format(PyExc_ValueError, "%s: expected -1 (unbounded) or a number of keys >= 0, got %lld",
                     left < -1 ? "left" : "right", left < -1 ? left : right);
        return 0;
    }
    if (bq < 1 || bk < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a block size >= 1, got %lld", bq < 1 ? "block_q" : "block_k",
                     bq < 1 ? bq : bk);
        return 0;
    }
    if (threads < 0) {
        PyErr_Format(PyExc_ValueError, "threads: expected >= 0 (0: OpenMP's default), got %d", threads);
        return 0;
    }
    const int64_t far = tq + tk;
    *out_left = left > far ? far : left;
    *out_right = right > far ? far : right;
    *out_bq = bq > tq ? (tq > 0 ? tq : 1) : bq; /* a block past the end is the same as the whole */
    *out_bk = bk > tk ? (tk > 0 ? tk : 1) : bk;
#ifdef _OPENMP
    *out_threads = threads == 0 ? omp_get_max_threads() : threads; /* OMP_NUM_THREADS, torch.set_num_threads, or every CPU */
    if (*out_threads > omp_get_thread_limit()) *out_threads = omp_get_thread_limit();
#else
    *out_threads = 1;
#endif
    return 1;
}

/* klen (B, G): every length in 0..Tk. */
static int check_klen(const int64_t *klen, int64_t b, int64_t g, int64_t tk) {
    for (int64_t i = 0; klen && i < b * g; i++)
        if (klen[i] < 0 || klen[i] > tk) {
            PyErr_Format(PyExc_ValueError, "klen: expected key-padding lengths in 0..Tk = 0..%lld, got %lld at [%lld, %lld]",
                         (long long)tk, (long long)klen[i], (long long)(i / g), (long long)(i % g));
            return 0;
        }
    return 1;
}

enum { B_ = 'B', G_ = 'G', T_ = 'T', K_ = 'K', D_ = 'D', V_ = 'V' };

static PyObject *forward(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "out", "lse", "klen", "scale", "left", "right", "block_q", "block_k",
                             "threads", NULL};
    PyObject *obj[6];
    Py_buffer view[6] = {{0}};
    struct problem pr = {0};
    long long left, right, bq, bk;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOfLLLLi:forward", kwlist, &obj[0], &obj[1], &obj[2], &obj[3],
                                     &obj[4], &obj[5], &pr.scale, &left, &right, &bq, &bk, &threads))
        return NULL;
    if (!take(obj[0], &view[0], "q", 0, 'f', "BGTD", dim) || !take(obj[1], &view[1], "k", 0, 'f', "BKD", dim) ||
        !take(obj[2], &view[2], "v", 0, 'f', "BKV", dim) || !take(obj[3], &view[3], "out", 1, 'f', "BGTV", dim) ||
        !take(obj[4], &view[4], "lse", 1, 'f', "BGT", dim) ||
        (obj[5] != Py_None && !take(obj[5], &view[5], "klen", 0, 'i', "BG", dim)))
        goto done;
    pr.b = dim[B_], pr.g = dim[G_], pr.tq = dim[T_], pr.tk = dim[K_], pr.d = dim[D_], pr.dv = dim[V_];
    if (pr.d < 1 || pr.dv < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a head dim >= 1, got 0", pr.d < 1 ? "q" : "v");
        goto done;
    }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.v = view[2].buf, pr.out = view[3].buf, pr.lse = view[4].buf;
    pr.klen = view[5].obj ? view[5].buf : NULL;
    if (!check_scalars(pr.tq, pr.tk, left, right, bq, bk, threads, &pr.left, &pr.right, &pr.bq, &pr.bk, &pr.threads) ||
        !check_klen(pr.klen, pr.b, pr.g, pr.tk))
        goto done;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = pr.b * pr.g * pr.tq == 0 ? 0 : isas[chosen].run(&pr);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    release(view, 6);
    return result;
}

static PyObject *backward(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "klen", "dq", "dk", "dv", "scale", "left",
                             "right", "block_q", "block_k", "threads", NULL};
    PyObject *obj[11];
    Py_buffer view[11] = {{0}};
    struct bproblem pr = {0};
    long long left, right, bq, bk;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOOfLLLLi:backward", kwlist, &obj[0], &obj[1], &obj[2],
                                     &obj[3], &obj[4], &obj[5], &obj[6], &obj[7], &obj[8], &obj[9], &obj[10], &pr.scale,
                                     &left, &right, &bq, &bk, &threads))
        return NULL;
    static const char *names[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "klen", "dq", "dk", "dv"};
    static const char *dims[] = {"BGTD", "BKD", "BKV", "BGTV", "BGT", "BGTV", "BGT", "BG", "BGTD", "BKD", "BKV"};
    for (int i = 0; i < 11; i++) {
        if ((i == 6 || i == 7) && obj[i] == Py_None) continue;
        if (!take(obj[i], &view[i], names[i], i >= 8, i == 7 ? 'i' : 'f', dims[i], dim)) goto done;
    }
    pr.b = dim[B_], pr.g = dim[G_], pr.tq = dim[T_], pr.tk = dim[K_], pr.d = dim[D_], pr.dv = dim[V_];
    if (pr.d < 1 || pr.dv < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a head dim >= 1, got 0", pr.d < 1 ? "q" : "v");
        goto done;
    }
    for (int i = 8; i < 11; i++)
        for (int j = 0; j < 8; j++)
            if (view[j].obj && view[i].len && view[j].len && (char *)view[i].buf < (char *)view[j].buf + view[j].len &&
                (char *)view[j].buf < (char *)view[i].buf + view[i].len) {
                PyErr_Format(PyExc_ValueError, "%s: expected an array of its own, got one that overlaps %s", names[i], names[j]);
                goto done;
            }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.v = view[2].buf, pr.out = view[3].buf, pr.lse = view[4].buf;
    pr.dout = view[5].buf, pr.dlse = view[6].obj ? view[6].buf : NULL, pr.klen = view[7].obj ? view[7].buf : NULL;
    pr.gq = view[8].buf, pr.gk = view[9].buf, pr.gv = view[10].buf;
    if (!check_scalars(pr.tq, pr.tk, left, right, bq, bk, threads, &pr.left, &pr.right, &pr.bq, &pr.bk, &pr.threads) ||
        !check_klen(pr.klen, pr.b, pr.g, pr.tk))
        goto done;
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    if (pr.b * pr.g * pr.tq == 0 || pr.tk == 0) { /* nothing attends to anything: every gradient is 0 */
        memset(pr.gq, 0, view[8].len);
        memset(pr.gk, 0, view[9].len);
        memset(pr.gv, 0, view[10].len);
    } else {
        status = isas[chosen].brun(&pr);
    }
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    release(view, 11);
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
    {"backward", (PyCFunction)(void (*)(void))backward, METH_VARARGS | METH_KEYWORDS,
     "backward(q, k, v, out, lse, dout, dlse, klen, dq, dk, dv, scale, left, right, block_q, block_k, threads)\n\n"
     "FlashAttention-2's backward of forward(): dq (B, G, Tq, D), dk (B, Tk, D), dv (B, Tk, Dv) written from\n"
     "q, k, v, out and lse as forward took and gave them, dout like out and dlse like lse (or None). The same\n"
     "checks as forward; the outputs may not overlap the inputs. Deterministic: the same bits for any threads."},
    {"build_info", build_info, METH_NOARGS,
     "build_info() -> {'variants': [{'name', 'target', 'runs_here'}, ...] (compiled in, best first), 'chosen',\n"
     "'compiler', 'openmp' (the _OPENMP date, None without OpenMP)}."},
    {"forward", (PyCFunction)(void (*)(void))forward, METH_VARARGS | METH_KEYWORDS,
     "forward(q, k, v, out, lse, klen, scale, left, right, block_q, block_k, threads)\n\n"
     "Blockwise attention of float32 C-contiguous arrays q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv) into\n"
     "out (B, G, Tq, Dv) and lse (B, G, Tq); klen (B, G) int64 key-padding lengths in 0..Tk, or None;\n"
     "left/right the band (-1 = none); block sizes >= 1; threads 0: OpenMP's default. Every argument is\n"
     "checked first (ValueError naming it)."},
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
