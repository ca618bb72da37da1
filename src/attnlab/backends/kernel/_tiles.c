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
 * sliding window, bottom-right aligned, or with by_length at each sequence's own length) and key-padding
 * lengths; dense masks, biases, float64 and GPUs stay with the Python loop (the blockwise backend). Every argument is checked here, before
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

#include "_tiles_problems.h"

static int amx_here, amx_use; /* this CPU and kernel let the process use AMX (-1: the CPU has it, Linux not asked
                                * yet); int4 decoding may (x86-64 Linux; amx(False) says it may not) */

/* Each variant's functions carry __attribute__((target(...))), which GCC and clang both honour
 * (clang ignores `#pragma GCC target`: under it such variants were baseline code in disguise). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define X86_VARIANTS 1
#include <immintrin.h>
#define AVX512_TARGET "avx512f,avx512vl,fma"
#define AVX2_TARGET "avx2,fma,f16c"
/* AMX's tiles for int4 keys' scores (_tiles_decode_amx.h): Linux asks the kernel for them (arch_prctl) */
#if defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define AMX_DECODE 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define TARGET __attribute__((target(AVX512_TARGET)))
#define VW 16
#define RQ 8
#define RP 6
#define NVMAX 4
#define ROWS 24
#define STRIP 0
#define VPW 0
#define SFX avx512
#define CVTPH(p) ((VF)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))) /* VW float16 values as floats */
#define WIDEN16(p) _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))) /* VW uint16 as uint32 */
#define WIDEN8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))) /* VW int8 as floats */
#define WIDEN8U(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p))) /* VW uint8 as uint32 */
#include "_tiles_body.h"

#define TARGET __attribute__((target(AVX2_TARGET)))
#define VW 8
#define RQ 6
#define RP 6
#define NVMAX 2
#define ROWS 12
#define STRIP 6
#define VPW 16
#define SFX avx2
#define CVTPH(p) ((VF)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define WIDEN16(p) _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define WIDEN8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define WIDEN8U(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#include "_tiles_body.h"
#endif

#define TARGET
#define VW 4
#define RQ 4
#define RP 4
#define NVMAX 2
#define ROWS 4
#define STRIP 0
#define VPW 0
#define SFX base
#define CVTPH(p) F(f16_soft)(p)
#include "_tiles_body.h"

/* The instruction sets compiled in, best first, and whether this CPU runs each. */
static const struct {
    const char *name, *target; /* target: the attribute's features, "" for the compiler's baseline */
    int (*run)(struct problem *);
    int (*brun)(struct bproblem *);
    int (*srun)(struct sproblem *);
    int (*drun)(struct dproblem *);
    int (*prun)(struct pproblem *);
    int (*fsrun)(struct problem *);
} isas[] = {
#ifdef X86_VARIANTS
    {"AVX-512", AVX512_TARGET, run_avx512, brun_avx512, srun_avx512, drun_avx512, prun_avx512, fsrun_avx512},
    {"AVX2", AVX2_TARGET, run_avx2, brun_avx2, srun_avx2, drun_avx2, prun_avx2, fsrun_avx2},
#endif
    {"128-bit vectors", "", run_base, brun_base, srun_base, drun_base, prun_base, fsrun_base}, /* SSE2 on x86-64, NEON on arm64: every CPU of those runs it */
};
#define NISAS ((int)(sizeof isas / sizeof isas[0]))
static int supported[NISAS];
static int chosen = NISAS - 1;

static void detect(void) {
    supported[NISAS - 1] = 1;
#ifdef X86_VARIANTS
    __builtin_cpu_init();
    supported[0] = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    supported[1] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    for (chosen = 0; !supported[chosen]; chosen++) {
    }
#ifdef AMX_DECODE
    unsigned a, b, c, d;
    if (supported[0] && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 30 & 1) && (d >> 24 & 1) && (d >> 25 & 1))
        amx_here = -1, amx_use = 1; /* the CPU has it; Linux is asked when first needed (amx_allowed) */
#endif
}

/* Whether the process may use AMX's tiles: Linux is asked once (arch_prctl), at the first int4 decoding or the first
 * question (amx(), build_info()), not at import: a process that never needs the tiles never holds their larger
 * signal frames. Called with the GIL held. */
static int amx_allowed(void) {
#ifdef AMX_DECODE
    if (amx_here < 0) amx_here = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#endif
    return amx_here;
}

static PyObject *amx(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *arg = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &arg)) return NULL;
    const int on = arg == Py_None ? -1 : PyObject_IsTrue(arg);
    if (on < 0 && arg != Py_None) return NULL; /* its truth raised */
    if (on == 1 && !amx_allowed()) {
        PyErr_SetString(PyExc_ValueError, "amx: this CPU, kernel or build has no AMX tiles (amx() says whether it does)");
        return NULL;
    }
    if (on >= 0) amx_use = on;
    return PyBool_FromLong(amx_use && amx_allowed());
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
    const int here = amx_allowed();
    return Py_BuildValue("{s:N,s:s,s:s,s:N,s:O,s:O}", "variants", variants, "chosen", isas[chosen].name, "compiler",
                         compiler, "openmp", openmp, "amx_here", here ? Py_True : Py_False, "amx",
                         here && amx_use ? Py_True : Py_False);
}

#include "_tiles_args.h"

#include "_tiles_entries.h"
#include "_tiles_fentry.h"

/* The largest row length of a float32 C-contiguous array (rows along its last axis), in float64: a query's
 * norm for the score bound of a read whose keys were checked when written, without a torch call. */
static PyObject *max_norm(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (kind_of(&view) != 'f' || view.ndim < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "max_norm(x): x must be a float32 C-contiguous array of at least one axis");
        return NULL;
    }
    const float *x = (const float *)view.buf;
    const Py_ssize_t d = view.shape[view.ndim - 1], rows = d ? view.len / 4 / d : 0;
    double best = 0.0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        double sum = 0.0;
        for (Py_ssize_t j = 0; j < d; j++) sum += (double)x[r * d + j] * x[r * d + j];
        if (!(sum <= best)) best = sum; /* NaN stays (no later row compares above it) */
        if (isnan(best)) break;
    }
    PyBuffer_Release(&view);
    return PyFloat_FromDouble(sqrt(best));
}

static PyObject *default_threads(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
#ifdef _OPENMP
    return PyLong_FromLong(omp_get_max_threads());
#else
    return PyLong_FromLong(1);
#endif
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decode, METH_VARARGS | METH_KEYWORDS,
     "decode(q, k, v, out, lse, dtype, scale, threads, *, spans=None, qpos=None, slopes=None, sinks=None, softcap=0.0,\n"
     "k_scale=None, v_scale=None, k_zero=None, v_zero=None, k_residual=None, v_residual=None, k_quantized=None,\n"
     "v_quantized=None, residual_dtype='float32')\n\n"
     "Decode attention, split over the cache: float32 C-contiguous q (B, H, Tq, D) against k (B, Hkv, Tk, D) and\n"
     "v (B, Hkv, Tk, Dv) stored as `dtype` ('float32'; 'float16' as format 'e' or its bits; 'bfloat16' as its bits,\n"
     "format 'h' or 'H'), each head's rows contiguous (a slice of a longer cache is fine); H a multiple of Hkv\n"
     "(query head h reads k/v head h // (H / Hkv)); spans (B|1, H|1, Tq, 4) int64: each row's keys [lo1, hi1) and\n"
     "[lo2, hi2), sorted (None: every key); qpos (B|1, H|1, Tq) and slopes (H|1,) float32 base 2: ALiBi;\n"
     "sinks (B|1, H|1) float32: learned sink logits. Codes: 'int8' (k_scale, v_scale (B, Hkv, Tk) float32),\n"
     "'float8_e4m3fn' (k_scale, v_scale (B, Hkv)) or 'int4' (uint8 k (B, Hkv, Tk, D/2) and v (.., Dv/2), two codes per\n"
     "byte, channel 2c low; keys x = code*scale + zero per channel over 32 tokens: k_scale, k_zero (B, Hkv, >= Tk/32, D);\n"
     "values per token over 32 channels: v_scale, v_zero (B, Hkv, >= Tk, Dv/32); positions >= k_quantized[b] (v_quantized)\n"
     "(B,) int64 from k_residual (v_residual) (B, Hkv, R, D) stored as residual_dtype, at slot position % R).\n"
     "Writes float32 out (B, H, Tq, Dv) and lse (B, H, Tq); the same bits for any threads. Returns the largest\n"
     "|scale q.k| it computed (0.0 where none), NaN where one of them was not finite (a NaN or Inf in a key read) or\n"
     "q or the output holds a NaN or Inf (in the output: from a value read)."},
    {"max_norm", max_norm, METH_O, "max_norm(x) -> the largest row length ||x_i|| (last axis) of a float32 C-contiguous\n"
     "array, summed in float64 (0.0 when empty; NaN where a row holds a NaN, inf where one overflows)."},
    {"default_threads", default_threads, METH_NOARGS, "default_threads() -> the threads a call with threads=0 uses (OpenMP's default)."},
    {"backward", (PyCFunction)(void (*)(void))backward, METH_VARARGS | METH_KEYWORDS,
     "backward(q, k, v, out, lse, dout, dlse, dq, dk, dv, scale, block_q, block_k, threads, *, spans=None, qpos=None,\n"
     "slopes=None, sinks=None, heads=1)\n\n"
     "FlashAttention-2's backward of forward(): dq (B, G, Tq, D), dk (B, Tk, D), dv (B, Tk, Dv) written from\n"
     "q, k, v, out and lse as forward took and gave them, dout like out and dlse like lse (or None). The same\n"
     "checks as forward; the outputs may not overlap the inputs. Deterministic: the same bits for any threads."},
    {"build_info", build_info, METH_NOARGS,
     "build_info() -> {'variants': [{'name', 'target', 'runs_here'}, ...] (compiled in, best first), 'chosen',\n"
     "'compiler', 'openmp' (the _OPENMP date, None without OpenMP)}."},
    {"forward", (PyCFunction)(void (*)(void))forward, METH_VARARGS | METH_KEYWORDS,
     "forward(q, k, v, out, lse, scale, block_q, block_k, threads, *, spans=None, qpos=None, slopes=None, sinks=None,\n"
     "heads=1)\n\n"
     "Blockwise attention of float32 C-contiguous arrays q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv) into\n"
     "out (B, G, Tq, Dv) and lse (B, G, Tq). The visibility lives in the masks' (B', H) space of the same B G\n"
     "heads (heads = H): spans (B'|1, H|1, Tq, 4) int64, each row's keys [lo1, hi1) and [lo2, hi2) (None: all);\n"
     "qpos (B'|1, H|1, Tq) and slopes (H|1,) float32 base 2: ALiBi; sinks (B'|1, H|1) float32: learned sinks.\n"
     "Block sizes >= 1; threads 0: OpenMP's default. Every argument is checked first (ValueError naming it)."},
    {"pool", (PyCFunction)(void (*)(void))pool, METH_VARARGS | METH_KEYWORDS,
     "pool(q, k, lse, sums, maxes, scale, block, block_q, block_k, threads, *, spans=None, qpos=None, slopes=None,\n"
     "heads=1, softcap=0.0, top_keys=None, top_weights=None)\n\n"
     "The pooled map of self-attention's weights exp(s - lse), s the forward's scores (scale, softcap, ALiBi), recomputed\n"
     "tile by tile: float32 q (B, G, T, D), k (B, T, D) and forward's lse (B, G, T); into float64 sums and float32 maxes\n"
     "(B, G, N, N), N = ceil(T / block): each cell's sum and largest weight over its block x block pairs (a pair a row\n"
     "does not see weighs 0). With int64 top_keys and float32 top_weights (B, G, T, K), 1 <= K <= min(T, 1024), also\n"
     "every row's K largest weights and their keys, largest first (ties: the earlier key; a row with fewer than K\n"
     "positive weights ends with its first keys of weight 0). Visibility as forward's. The same checks as forward;\n"
     "the same bits for any threads."},
    {"stats", (PyCFunction)(void (*)(void))stats, METH_VARARGS | METH_KEYWORDS,
     "stats(q, k, lse, sums, received, scale, block_q, block_k, threads, *, spans=None, heads=1, softcap=0.0,\n"
     "sinks=None)\n\n"
     "Statistics of self-attention's weights exp(scale q.k - lse), recomputed tile by tile: float32 q (B, G, T, D),\n"
     "k (B, T, D) and forward's lse (B, G, T); into float64 sums (B, G, 7) (per head, summed over rows: the\n"
     "weight on key i - 1, i, i + 1 and 0, sum_j w |i - j|, the entropy -sum_j w ln w and the entropy over\n"
     "ln(keys seen) where more than one) and received (B, G, T) (column sums). spans and softcap as forward's;\n"
     "sinks (B|1, G|1) float32 learned sink logits (lse includes them): the sink one more outcome of the entropy.\n"
     "The same checks as forward; the same bits for any threads."},
    {"forward_stats", (PyCFunction)(void (*)(void))forward_stats, METH_VARARGS | METH_KEYWORDS,
     "forward_stats(q, k, v, out, lse, sums, received, scale, block_q, block_k, threads, *, spans=None, heads=1,\n"
     "softcap=0.0, sinks=None)\n\n"
     "forward() of self-attention (k (B, T, D), v (B, T, Dv): one length) and stats() of its weights in one pass: out,\n"
     "lse as forward's (the same bits), float64 sums (B, G, 7) and received (B, G, T) as stats' (each tile's weights\n"
     "kept for the block's sweep once its rows' LSE is known, not recomputed). Needs bq x T floats per thread beside\n"
     "the forward's scratch. The same checks as both; the same bits for any threads."},
    {"amx", amx, METH_VARARGS, "amx(on=None) -> whether the AVX-512 variant's int4 decoding computes its keys' scores on\n"
     "AMX's tiles (exact integer products: _tiles_decode_amx.h); with on, turn it on (where this CPU and kernel allow\n"
     "AMX) or off."},
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
