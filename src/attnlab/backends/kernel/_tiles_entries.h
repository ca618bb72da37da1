/* The Python entry points of the compiled kernel (forward, backward, stats, pool, decode), included once by _tiles.c
 * after the argument checks: each takes its buffers (every one checked before anything is read), fills the
 * pass's problem and its visibility (struct vis), and runs the chosen instruction set's pass without the GIL. */

static PyObject *forward(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "out", "lse", "scale", "block_q", "block_k", "threads", "spans", "qpos",
                             "slopes", "sinks", "heads", "softcap", NULL};
    PyObject *obj[5], *vobj[4] = {Py_None, Py_None, Py_None, Py_None};
    Py_buffer view[9] = {{0}};
    struct problem pr = {0};
    struct vis vis = {0};
    long long bq, bk, heads = 1, unused;
    double softcap = 0.0;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOfLLi|$OOOOLd:forward", kwlist, &obj[0], &obj[1], &obj[2], &obj[3],
                                     &obj[4], &pr.scale, &bq, &bk, &threads, &vobj[0], &vobj[1], &vobj[2], &vobj[3], &heads,
                                     &softcap))
        return NULL;
    if (!take(obj[0], &view[0], "q", 0, 'f', "BGTD", dim) || !take(obj[1], &view[1], "k", 0, 'f', "BKD", dim) ||
        !take(obj[2], &view[2], "v", 0, 'f', "BKV", dim) || !take(obj[3], &view[3], "out", 1, 'f', "BGTV", dim) ||
        !take(obj[4], &view[4], "lse", 1, 'f', "BGT", dim))
        goto done;
    pr.b = dim[B_], pr.g = dim[G_], pr.tq = dim[T_], pr.tk = dim[K_], pr.d = dim[D_], pr.dv = dim[V_];
    if (pr.d < 1 || pr.dv < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a head dim >= 1, got 0", pr.d < 1 ? "q" : "v");
        goto done;
    }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.v = view[2].buf, pr.out = view[3].buf, pr.lse = view[4].buf;
    int64_t l, r;
    if (!check_scalars(pr.tq, pr.tk, -1, -1, bq, bk, threads, &l, &r, &pr.bq, &pr.bk, &pr.threads) ||
        !take_vis(vobj, view + 5, &vis, pr.b * pr.g, heads, pr.tq, pr.tk, softcap))
        goto done;
    (void)unused;
    pr.vis = &vis;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = pr.b * pr.g * pr.tq == 0 ? 0 : isas[chosen].run(&pr);
    Py_END_ALLOW_THREADS
    result = status != 0 ? PyErr_NoMemory() : Py_NewRef(Py_None); /* status: a scratch buffer was not allocated */
done:
    release(view, 9);
    return result;
}

static PyObject *backward(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "dq", "dk", "dv", "scale", "block_q", "block_k",
                             "threads", "spans", "qpos", "slopes", "sinks", "heads", "softcap", NULL};
    PyObject *obj[10], *vobj[4] = {Py_None, Py_None, Py_None, Py_None};
    Py_buffer view[14] = {{0}};
    struct bproblem pr = {0};
    struct vis vis = {0};
    long long bq, bk, heads = 1;
    double softcap = 0.0;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOfLLi|$OOOOLd:backward", kwlist, &obj[0], &obj[1], &obj[2],
                                     &obj[3], &obj[4], &obj[5], &obj[6], &obj[7], &obj[8], &obj[9], &pr.scale, &bq, &bk,
                                     &threads, &vobj[0], &vobj[1], &vobj[2], &vobj[3], &heads, &softcap))
        return NULL;
    static const char *names[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "dq", "dk", "dv"};
    static const char *dims[] = {"BGTD", "BKD", "BKV", "BGTV", "BGT", "BGTV", "BGT", "BGTD", "BKD", "BKV"};
    for (int i = 0; i < 10; i++) {
        if (i == 6 && obj[i] == Py_None) continue;
        if (!take(obj[i], &view[i], names[i], i >= 7, 'f', dims[i], dim)) goto done;
    }
    pr.b = dim[B_], pr.g = dim[G_], pr.tq = dim[T_], pr.tk = dim[K_], pr.d = dim[D_], pr.dv = dim[V_];
    if (pr.d < 1 || pr.dv < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a head dim >= 1, got 0", pr.d < 1 ? "q" : "v");
        goto done;
    }
    for (int i = 7; i < 10; i++)
        for (int j = 0; j < 7; j++)
            if (view[j].obj && view[i].len && view[j].len && (char *)view[i].buf < (char *)view[j].buf + view[j].len &&
                (char *)view[j].buf < (char *)view[i].buf + view[i].len) {
                PyErr_Format(PyExc_ValueError, "%s: expected an array of its own, got one that overlaps %s", names[i], names[j]);
                goto done;
            }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.v = view[2].buf, pr.out = view[3].buf, pr.lse = view[4].buf;
    pr.dout = view[5].buf, pr.dlse = view[6].obj ? view[6].buf : NULL;
    pr.gq = view[7].buf, pr.gk = view[8].buf, pr.gv = view[9].buf;
    int64_t l, r;
    if (!check_scalars(pr.tq, pr.tk, -1, -1, bq, bk, threads, &l, &r, &pr.bq, &pr.bk, &pr.threads) ||
        !take_vis(vobj, view + 10, &vis, pr.b * pr.g, heads, pr.tq, pr.tk, softcap))
        goto done;
    pr.vis = &vis;
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    if (pr.b * pr.g * pr.tq == 0 || pr.tk == 0) { /* nothing attends to anything: every gradient is 0 */
        memset(pr.gq, 0, view[7].len);
        memset(pr.gk, 0, view[8].len);
        memset(pr.gv, 0, view[9].len);
    } else {
        status = isas[chosen].brun(&pr);
    }
    Py_END_ALLOW_THREADS
    result = status != 0 ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    release(view, 14);
    return result;
}

static PyObject *stats(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "lse", "sums", "received", "scale", "block_q", "block_k", "threads", "spans",
                             "heads", "softcap", "sinks", NULL};
    PyObject *obj[5], *vobj[4] = {Py_None, Py_None, Py_None, Py_None};
    Py_buffer view[9] = {{0}};
    struct sproblem pr = {0};
    struct vis vis = {0};
    long long bq, bk, heads = 1;
    double softcap = 0.0;
    int64_t l, r;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    dim['S'] = NSTATS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOfLLi|$OLdO:stats", kwlist, &obj[0], &obj[1], &obj[2], &obj[3],
                                     &obj[4], &pr.scale, &bq, &bk, &threads, &vobj[0], &heads, &softcap, &vobj[3]))
        return NULL;
    static const char *names[] = {"q", "k", "lse", "sums", "received"};
    static const char *dims[] = {"BGTD", "BTD", "BGT", "BGS", "BGT"};
    for (int i = 0; i < 5; i++)
        if (!take(obj[i], &view[i], names[i], i >= 3, i >= 3 ? 'd' : 'f', dims[i], dim)) goto done;
    pr.b = dim[B_], pr.g = dim[G_], pr.t = dim[T_], pr.d = dim[D_];
    if (pr.d < 1) {
        PyErr_SetString(PyExc_ValueError, "q: expected a head dim >= 1, got 0");
        goto done;
    }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.lse = view[2].buf, pr.sums = view[3].buf, pr.received = view[4].buf;
    if (!check_scalars(pr.t, pr.t, -1, -1, bq, bk, threads, &l, &r, &pr.bq, &pr.bk, &pr.threads) ||
        !take_vis(vobj, view + 5, &vis, pr.b * pr.g, heads, pr.t, pr.t, softcap))
        goto done;
    pr.vis = &vis;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = pr.b * pr.g * pr.t == 0 ? 0 : isas[chosen].srun(&pr);
    Py_END_ALLOW_THREADS
    result = status != 0 ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    release(view, 9);
    return result;
}

static PyObject *pool(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "lse", "sums", "maxes", "scale", "block", "block_q", "block_k", "threads", "spans",
                             "qpos", "slopes", "heads", "softcap", "top_keys", "top_weights", NULL};
    PyObject *obj[7] = {0}, *vobj[4] = {Py_None, Py_None, Py_None, Py_None}; /* no sinks: the LSE holds them */
    Py_buffer view[11] = {{0}};
    struct pproblem pr = {0};
    struct vis vis = {0};
    long long block, bq, bk, heads = 1;
    double softcap = 0.0;
    int64_t l, r;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    obj[5] = obj[6] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOdLLLi|$OOOLdOO:pool", kwlist, &obj[0], &obj[1], &obj[2], &obj[3],
                                     &obj[4], &pr.scale64, &block, &bq, &bk, &threads, &vobj[0], &vobj[1], &vobj[2], &heads,
                                     &softcap, &obj[5], &obj[6]))
        return NULL;
    if ((obj[5] == Py_None) != (obj[6] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "top_keys, top_weights: expected both (every row's largest) or neither, got one");
        return NULL;
    }
    pr.scale = (float)pr.scale64, pr.softcap64 = softcap;
    if (block < 1) {
        PyErr_Format(PyExc_ValueError, "block: expected the cells' side in tokens, >= 1, got %lld", block);
        return NULL;
    }
    static const char *names[] = {"q", "k", "lse", "sums", "maxes", "top_keys", "top_weights"};
    static const char *dims[] = {"BGTD", "BTD", "BGT", "BGNN", "BGNN", "BGTX", "BGTX"};
    for (int i = 0; i < 7; i++) {
        if (obj[i] == Py_None) continue;
        if (!take(obj[i], &view[i], names[i], i >= 3, i == 3 ? 'd' : i == 5 ? 'i' : 'f', dims[i], dim)) goto done;
        if (i == 2) dim['N'] = (dim[T_] + block - 1) / block; /* the cells a side */
    }
    pr.b = dim[B_], pr.g = dim[G_], pr.t = dim[T_], pr.d = dim[D_], pr.block = block, pr.n = dim['N'];
    pr.ntop = obj[5] == Py_None ? 0 : dim['X'];
    if (obj[5] != Py_None && (pr.ntop < 1 || pr.ntop > pr.t || pr.ntop > 1024)) {
        PyErr_Format(PyExc_ValueError, "top_keys: expected 1..min(T=%lld, 1024) largest a row (its last dim), got %lld",
                     (long long)pr.t, (long long)pr.ntop);
        goto done;
    }
    pr.topk = obj[5] == Py_None ? NULL : view[5].buf, pr.topw = obj[6] == Py_None ? NULL : view[6].buf;
    if (pr.d < 1) {
        PyErr_SetString(PyExc_ValueError, "q: expected a head dim >= 1, got 0");
        goto done;
    }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.lse = view[2].buf, pr.sums = view[3].buf, pr.maxes = view[4].buf;
    if (!check_scalars(pr.t, pr.t, -1, -1, bq, bk, threads, &l, &r, &pr.bq, &pr.bk, &pr.threads) ||
        !take_vis(vobj, view + 7, &vis, pr.b * pr.g, heads, pr.t, pr.t, softcap))
        goto done;
    pr.vis = &vis;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = pr.b * pr.g * pr.t == 0 ? 0 : isas[chosen].prun(&pr);
    Py_END_ALLOW_THREADS
    result = status != 0 ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    release(view, 11);
    return result;
}

/* How k and v are stored, by name. */
static int stored_type(const char *name) {
    return !strcmp(name, "float32") ? DT_F32 : !strcmp(name, "float16") ? DT_F16 : !strcmp(name, "bfloat16") ? DT_BF16
         : !strcmp(name, "int8") ? DT_I8 : !strcmp(name, "float8_e4m3fn") ? DT_F8 : !strcmp(name, "int4") ? DT_I4 : -1;
}

/* int4's arguments (struct q4) for the keys (values = 0) or the values: scale and zero, float32 with the last dim
 * contiguous (keys (B, N, C, D), C >= ceil(K / 32) groups of 32 keys; values (B, N, S, Dv / 32), S >= K rows),
 * the residual ring (B, N, R, D or Dv) stored as rkind, each head's rows contiguous, R a multiple of 32, and the
 * positions held as codes (B,) int64, each >= 0 and a multiple of 32. */
static int take_q4(PyObject *obj[4], Py_buffer view[4], int values, char rkind, Py_ssize_t dim[128], struct q4 *x) {
    static const char *names[2][4] = {{"k_scale", "k_zero", "k_residual", "k_quantized"},
                                      {"v_scale", "v_zero", "v_residual", "v_quantized"}};
    const char *const *name = names[values];
    if (!take_rows(obj[0], &view[0], name[0], 0, 'f', values ? "BNSJ" : "BNCD", dim, 2) ||
        !take_rows(obj[1], &view[1], name[1], 0, 'f', values ? "BNSJ" : "BNCD", dim, 2) ||
        !take_rows(obj[2], &view[2], name[2], 0, rkind, values ? "BNUV" : "BNRD", dim, 1) ||
        !take(obj[3], &view[3], name[3], 0, 'i', "B", dim))
        return 0;
    const long long have = view[0].shape[2], need = values ? dim['K'] : (dim['K'] + 31) / 32, slots = view[2].shape[2];
    if (have < need) {
        PyErr_Format(PyExc_ValueError, "%s: expected at least %lld %s (dim 2), got %lld", name[0], need,
                     values ? "value rows" : "groups of 32 keys", have);
        return 0;
    }
    if (values && 32 * view[0].shape[3] != dim['V']) {
        PyErr_Format(PyExc_ValueError, "v_scale: expected Dv / 32 = %lld groups of 32 channels (dim 3), got %zd",
                     (long long)dim['V'] / 32, view[0].shape[3]);
        return 0;
    }
    if (slots < 32 || slots % 32 != 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected a ring of a multiple of 32 slots (dim 2), got %lld", name[2], slots);
        return 0;
    }
    const int64_t *held = view[3].buf;
    for (Py_ssize_t b = 0; b < view[3].shape[0]; b++)
        if (held[b] < 0 || held[b] % 32 != 0) {
            PyErr_Format(PyExc_ValueError, "%s: expected positions held as codes >= 0 and a multiple of 32, got %lld "
                         "(sequence %zd)", name[3], (long long)held[b], b);
            return 0;
        }
    const Py_ssize_t *ss = view[0].strides, *zs = view[1].strides, *rs = view[2].strides, ri = view[2].itemsize;
    *x = (struct q4){view[0].buf, view[1].buf, ss[0] / 4, ss[1] / 4, ss[2] / 4, zs[0] / 4, zs[1] / 4, zs[2] / 4,
                     view[2].buf, rs[0] / ri, rs[1] / ri, slots, held};
    return 1;
}

/* Every float of a float32 buffer finite. */
static int all_finite(const Py_buffer *b) {
    const float *f = (const float *)b->buf;
    for (Py_ssize_t i = 0, n = b->len / 4; i < n; i++)
        if (!isfinite(f[i])) return 0;
    return 1;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "out", "lse", "dtype", "scale", "threads", "spans", "qpos", "slopes", "sinks",
                             "softcap", "k_scale", "v_scale", "k_zero", "v_zero", "k_residual", "v_residual",
                             "k_quantized", "v_quantized", "residual_dtype", "scores", NULL};
    PyObject *obj[5], *vobj[4] = {Py_None, Py_None, Py_None, Py_None}, *sobj[2] = {Py_None, Py_None};
    PyObject *q4obj[2][4] = {{Py_None, Py_None, Py_None, Py_None}, {Py_None, Py_None, Py_None, Py_None}};
    PyObject *scores = Py_None;
    Py_buffer view[20] = {{0}};
    struct dproblem pr = {0};
    struct vis vis = {0};
    const char *dtype, *rname = "float32";
    int64_t bq, bk, l, r; /* check_scalars' block sizes and band: the decode pass has none */
    double softcap = 0.0;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOsfi|$OOOOdOOOOOOOOsO:decode", kwlist, &obj[0], &obj[1], &obj[2],
                                     &obj[3], &obj[4], &dtype, &pr.scale, &threads, &vobj[0], &vobj[1], &vobj[2], &vobj[3],
                                     &softcap, &sobj[0], &sobj[1], &q4obj[0][1], &q4obj[1][1], &q4obj[0][2], &q4obj[1][2],
                                     &q4obj[0][3], &q4obj[1][3], &rname, &scores))
        return NULL;
    pr.kvtype = stored_type(dtype);
    if (pr.kvtype < 0) {
        PyErr_Format(PyExc_ValueError, "dtype: expected 'float32', 'float16', 'bfloat16', 'int8', 'float8_e4m3fn' or 'int4' "
                     "(how k and v are stored), got '%s'", dtype);
        return NULL;
    }
    pr.rtype = stored_type(rname);
    if (pr.rtype < 0 || pr.rtype > DT_BF16) {
        PyErr_Format(PyExc_ValueError, "residual_dtype: expected 'float32', 'float16' or 'bfloat16' (int4's residual), "
                     "got '%s'", rname);
        return NULL;
    }
    const char kind = pr.kvtype == DT_F32 ? 'f' : pr.kvtype == DT_F16 ? 'e' : pr.kvtype == DT_I8 ? 'b'
                    : pr.kvtype == DT_F8 ? 'B' : pr.kvtype == DT_I4 ? 'n' : 'u';
    const int coded = pr.kvtype == DT_I8 || pr.kvtype == DT_F8 || pr.kvtype == DT_I4, i4 = pr.kvtype == DT_I4;
    for (int i = 0; i < 2; i++)
        if ((sobj[i] == Py_None) == coded) {
            PyErr_Format(PyExc_ValueError, "%s: expected %s, got %s", i ? "v_scale" : "k_scale",
                         pr.kvtype == DT_I8 ? "float32 scales (B, N, K) for int8 codes"
                         : pr.kvtype == DT_F8 ? "float32 scales (B, N) for float8 codes"
                         : i4 ? "float32 scales of int4's groups" : "None for a float cache",
                         sobj[i] == Py_None ? "None" : Py_TYPE(sobj[i])->tp_name);
            return NULL;
        }
    static const char *q4names[2][4] = {{"", "k_zero", "k_residual", "k_quantized"}, {"", "v_zero", "v_residual", "v_quantized"}};
    for (int i = 0; i < 2; i++)
        for (int a = 1; a < 4; a++)
            if ((q4obj[i][a] == Py_None) == i4) {
                PyErr_Format(PyExc_ValueError, "%s: expected %s, got %s", q4names[i][a], i4 ? "an array with int4 codes"
                             : "None unless dtype is 'int4'", q4obj[i][a] == Py_None ? "None" : Py_TYPE(q4obj[i][a])->tp_name);
                return NULL;
            }
    if (!take(obj[0], &view[0], "q", 0, 'f', "BHTD", dim) ||
        !take_rows(obj[1], &view[1], "k", 0, kind, i4 ? "BNKP" : "BNKD", dim, 1) ||
        !take_rows(obj[2], &view[2], "v", 0, kind, i4 ? "BNKW" : "BNKV", dim, 1) ||
        !take(obj[3], &view[3], "out", 1, 'f', "BHTV", dim) || !take(obj[4], &view[4], "lse", 1, 'f', "BHT", dim))
        goto done;
    if (i4 && (2 * dim['P'] != dim['D'] || 2 * dim['W'] != dim['V'] || dim['D'] % 32 || dim['V'] % 32)) {
        const int keys = 2 * dim['P'] != dim['D'] || dim['D'] % 32;
        PyErr_Format(PyExc_ValueError, "%s: expected int4 codes two per byte of a head width divisible by 32 (%lld / 2 "
                     "bytes), got %lld bytes", keys ? "k" : "v", (long long)(keys ? dim['D'] : dim['V']),
                     (long long)(keys ? dim['P'] : dim['W']));
        goto done;
    }
    pr.b = dim['B'], pr.h = dim['H'], pr.hkv = dim['N'], pr.tq = dim['T'], pr.tk = dim['K'], pr.d = dim['D'], pr.dv = dim['V'];
    if (pr.d < 1 || pr.dv < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a head dim >= 1, got 0", pr.d < 1 ? "q" : "v");
        goto done;
    }
    if (pr.hkv < 1 || pr.h % pr.hkv != 0) {
        PyErr_Format(PyExc_ValueError, "q: expected a multiple of k's %lld key/value heads (dim 1), got %lld heads",
                     (long long)pr.hkv, (long long)pr.h);
        goto done;
    }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.v = view[2].buf, pr.out = view[3].buf, pr.lse = view[4].buf;
    if (scores != Py_None) { /* each row's scores as the pass computed them (base 2), written where it saw a key */
        if (!take(scores, &view[19], "scores", 1, 'f', "BHTK", dim))
            goto done;
        pr.scores = view[19].buf;
    }
    if (i4) {
        const char rkind = pr.rtype == DT_F32 ? 'f' : pr.rtype == DT_F16 ? 'e' : 'u';
        q4obj[0][0] = sobj[0], q4obj[1][0] = sobj[1];
        if (!take_q4(q4obj[0], view + 11, 0, rkind, dim, &pr.k4) || !take_q4(q4obj[1], view + 15, 1, rkind, dim, &pr.v4))
            goto done;
    } else if (coded) {
        const char *sdims = pr.kvtype == DT_I8 ? "BNK" : "BN";
        if (!take_rows(sobj[0], &view[9], "k_scale", 0, 'f', sdims, dim, 2) ||
            !take_rows(sobj[1], &view[10], "v_scale", 0, 'f', sdims, dim, 2))
            goto done;
        pr.ks = view[9].buf, pr.vs = view[10].buf; /* strides in floats (a size-1 dim's is never multiplied) */
        pr.ksb = view[9].strides[0] / 4, pr.ksh = view[9].strides[1] / 4; /* PyBUF_RECORDS: strides are given */
        pr.vsb = view[10].strides[0] / 4, pr.vsh = view[10].strides[1] / 4;
    }
    if (!check_scalars(pr.tq, pr.tk, -1, -1, 1, 1, threads, &l, &r, &bq, &bk, &pr.threads) ||
        !take_vis(vobj, view + 5, &vis, pr.b * pr.h, pr.h, pr.tq, pr.tk, softcap))
        goto done;
    pr.vis = &vis;
    const Py_ssize_t item = view[1].itemsize; /* leading strides in items (a size-1 dim's is never multiplied) */
    pr.kb = view[1].strides[0] / item, pr.kh = view[1].strides[1] / item;
    pr.vb = view[2].strides[0] / item, pr.vh = view[2].strides[1] / item;
    pr.amx = pr.kvtype == DT_I4 && chosen == 0 && amx_use && amx_allowed(); /* the AVX-512 variant's int4 keys */
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = pr.b * pr.h * pr.tq == 0 ? 0 : isas[chosen].drun(&pr);
    Py_END_ALLOW_THREADS
    /* what the pass saw of k; NaN where q or the output holds a NaN or Inf (a row that sees no key computes no
     * score, so q is scanned; a NaN or Inf in a value read shows in the output): a few thousand floats each */
    const double largest = all_finite(&view[0]) && all_finite(&view[3]) ? pr.largest : NAN;
    result = status != 0 ? PyErr_NoMemory() : PyFloat_FromDouble(largest);
done:
    release(view, 20);
    return result;
}
