/* The compiled kernel's argument checks, included once by _tiles.c: everything the kernel reads or
 * writes is checked (dtype, contiguity, shapes, lengths, sizes) before it runs. */

static int little_endian(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

/* The buffer's element type: 'f' float32, 'd' float64, 'i' int64, 'e' float16, 'u' 16-bit integers (the bits
 * of bfloat16 or float16 values, as torch's bfloat16 tensors reach NumPy), 0 anything else. */
static char kind_of(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && little_endian()) || (*f == '>' && !little_endian())) f++;
    if (f[0] && !f[1]) {
        if (f[0] == 'f' && view->itemsize == 4) return 'f';
        if (f[0] == 'd' && view->itemsize == 8) return 'd';
        if ((f[0] == 'q' || f[0] == 'l') && view->itemsize == 8) return 'i';
        if (f[0] == 'e' && view->itemsize == 2) return 'e';
        if ((f[0] == 'h' || f[0] == 'H') && view->itemsize == 2) return 'u';
        if (f[0] == 'b' && view->itemsize == 1) return 'b';
        if (f[0] == 'B' && view->itemsize == 1) return 'B';
    }
    return 0;
}

static const char *kind_name(char kind) {
    return kind == 'f' ? "float32" : kind == 'd' ? "float64" : kind == 'e' ? "float16" : kind == 'u' ? "bfloat16"
         : kind == 'b' ? "int8" : kind == 'B' ? "float8_e4m3fn" : kind == 'n' ? "uint8 (int4 codes, two per byte)" : "int64";
}
static const char *kind_format(char kind) {
    return kind == 'f' ? "'f'" : kind == 'd' ? "'d'" : kind == 'e' ? "'e', or 'h'/'H' holding its bits"
         : kind == 'u' ? "'h' or 'H' holding its bits" : kind == 'b' ? "'b'" : kind == 'B' ? "'B' holding its bits"
         : kind == 'n' ? "'B'" : "'q' or 'l'";
}

static void format_shape(char *buf, size_t size, int ndim, const Py_ssize_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%zd%s", i ? " " : "", shape[i], i + 1 < ndim || ndim == 1 ? "," : "");
    if (used < size) snprintf(buf + used, size - used, ")");
}

/* The last two dims C-contiguous (a size-1 dim's stride is free), every leading stride a multiple of the
 * item size and >= 0: what a slice [:, :, :T] of a (B, H, capacity, D) cache is. */
static int rows_contiguous(const Py_buffer *view) {
    const Py_ssize_t n = view->ndim, item = view->itemsize;
    if (n < 2 || !view->strides) return PyBuffer_IsContiguous(view, 'C');
    if (view->shape[n - 1] > 1 && view->strides[n - 1] != item) return 0;
    if (view->shape[n - 2] > 1 && view->strides[n - 2] != view->shape[n - 1] * item) return 0;
    for (Py_ssize_t i = 0; i < n - 2; i++)
        if (view->shape[i] > 1 && (view->strides[i] < 0 || view->strides[i] % item != 0)) return 0;
    return 1;
}

/* The last dim contiguous and the leading strides >= 0, whole items (a slice [..., :T] of a longer array). */
static int last_contiguous(const Py_buffer *view) {
    const Py_ssize_t n = view->ndim, item = view->itemsize;
    if (n < 1 || !view->strides) return PyBuffer_IsContiguous(view, 'C');
    if (view->shape[n - 1] > 1 && view->strides[n - 1] != item) return 0;
    for (Py_ssize_t i = 0; i < n - 1; i++)
        if (view->shape[i] > 1 && (view->strides[i] < 0 || view->strides[i] % item != 0)) return 0;
    return 1;
}

/* Take `obj`'s buffer as argument `name`: a C-contiguous array of `kind` ('f' float32, 'd' float64, 'i' int64;
 * 'e' float16 takes 'u' buffers too, and 'u' stands for bfloat16), `ndim` dims named by the letters of `dims`
 * (e.g. "BGTD"). dim[letter] holds each size seen so far (-1 unset): the first array to show a letter sets
 * it, every later one must match. With `rows`, only the last two dims need be contiguous (a cache's
 * (T, D) rows per head; the leading dims may have any strides >= 0). */
static int take_rows(PyObject *obj, Py_buffer *view, const char *name, int writable, char kind, const char *dims,
                     Py_ssize_t dim[128], int rows) {
    const int ndim = (int)strlen(dims);
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        view->obj = NULL;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_ValueError, "%s: expected a %s%s array, got %s (%S)", name, writable ? "writable " : "",
                     kind_name(kind), Py_TYPE(obj)->tp_name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return 0;
    }
    const char got = kind_of(view);
    if (got != kind && !(kind == 'e' && got == 'u') && !(kind == 'n' && got == 'B')) {
        PyErr_Format(PyExc_ValueError, "%s: expected %s items (buffer format %s), got format '%s' of %zd bytes", name,
                     kind_name(kind), kind_format(kind),
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
    if (rows == 2 ? !last_contiguous(view) : rows ? !rows_contiguous(view) : !PyBuffer_IsContiguous(view, 'C')) {
        PyErr_Format(PyExc_ValueError, "%s: expected a %s array, got strides that are not", name,
                     rows == 2 ? "last-dim-contiguous (leading strides >= 0)"
                     : rows ? "row-contiguous (last two dims C-contiguous, leading strides >= 0)" : "C-contiguous");
        return 0;
    }
    for (int i = 0; i < ndim; i++) dim[(int)dims[i]] = view->shape[i];
    return 1;
}

static int take(PyObject *obj, Py_buffer *view, const char *name, int writable, char kind, const char *dims,
                Py_ssize_t dim[128]) {
    return take_rows(obj, view, name, writable, kind, dims, dim, 0);
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

enum { B_ = 'B', G_ = 'G', T_ = 'T', K_ = 'K', D_ = 'D', V_ = 'V' };

/* The visibility arguments every pass shares (struct vis): spans (sb, sh, Tq, 4) int64, qpos (pb, ph, Tq) int64,
 * slopes (ns,) float32 and sinks (kb, kh) float32, each optional (None), over the masks' (B, H) index space
 * of `flat` = B H heads. Every value is checked: intervals inside 0..Tk, sorted and apart. */
static int take_one(PyObject *obj, Py_buffer *view, const char *name, char kind, int ndim, const int64_t *last,
                    int64_t flat, int64_t heads, int64_t *nb, int64_t *nh) {
    if (obj == Py_None) return 1;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    static const char *dims[] = {"", "N", "BH", "BHT", "BHTS"};
    if (!take(obj, view, name, 0, kind, dims[ndim], dim)) return 0;
    const int64_t b = heads > 0 ? flat / heads : 0;
    const int off = ndim == 1 ? 1 : 0; /* slopes: (H or 1,) */
    const int64_t n0 = off ? 1 : view->shape[0], n1 = view->shape[1 - off];
    if ((n0 != 1 && n0 != b) || (n1 != 1 && n1 != heads)) {
        PyErr_Format(PyExc_ValueError, "%s: expected leading dims (1 or B=%lld, 1 or H=%lld), got (%zd, %zd)", name,
                     (long long)b, (long long)heads, n0, n1);
        return 0;
    }
    for (int i = 2 - off; i < ndim; i++)
        if (last[i - 2 + off] >= 0 && view->shape[i] != last[i - 2 + off]) {
            PyErr_Format(PyExc_ValueError, "%s: expected dim %d of size %lld, got %zd", name, i, (long long)last[i - 2 + off],
                         view->shape[i]);
            return 0;
        }
    *nb = n0, *nh = n1;
    return 1;
}

static int take_vis(PyObject *obj[4], Py_buffer view[4], struct vis *v, int64_t flat, int64_t heads, int64_t tq, int64_t tk,
                    double softcap) {
    if (!(softcap >= 0.0) || isinf(softcap)) {
        char got[32]; /* PyErr_Format has no %g */
        snprintf(got, sizeof got, "%g", softcap);
        PyErr_Format(PyExc_ValueError, "softcap: expected 0 (none) or a finite cap > 0, got %s", got);
        return 0;
    }
    v->cap = (float)(softcap * 1.4426950408889634); /* the kernels' scores are in base 2 */
    if (heads < 1 || flat % heads != 0) {
        PyErr_Format(PyExc_ValueError, "heads: expected a divisor >= 1 of the %lld heads, got %lld", (long long)flat,
                     (long long)heads);
        return 0;
    }
    const int64_t rows[2] = {tq, 4};
    if (!take_one(obj[0], &view[0], "spans", 'i', 4, rows, flat, heads, &v->sb, &v->sh) ||
        !take_one(obj[1], &view[1], "qpos", 'i', 3, rows, flat, heads, &v->pb, &v->ph) ||
        !take_one(obj[2], &view[2], "slopes", 'f', 1, rows, flat, heads, &v->ns, &v->ns) ||
        !take_one(obj[3], &view[3], "sinks", 'f', 2, rows, flat, heads, &v->kb, &v->kh))
        return 0;
    v->spans = view[0].obj ? view[0].buf : NULL, v->qpos = view[1].obj ? view[1].buf : NULL;
    v->slopes = view[2].obj ? view[2].buf : NULL, v->sinks = view[3].obj ? view[3].buf : NULL;
    v->heads = heads, v->tq = tq, v->tk = tk;
    if (v->slopes && !v->qpos) {
        PyErr_SetString(PyExc_ValueError, "qpos: expected each query's position with slopes (ALiBi), got None");
        return 0;
    }
    const int64_t n = v->spans ? v->sb * v->sh * tq : 0;
    for (int64_t r = 0; r < n; r++) {
        const int64_t *s = v->spans + 4 * r;
        const int ok = s[0] >= 0 && s[1] <= tk && s[2] >= 0 && s[3] <= tk && s[0] <= tk && s[2] <= tk && s[1] >= 0 &&
                       s[3] >= 0 && (s[3] <= s[2] || s[1] <= s[0] || s[1] < s[2]);
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "spans: expected sorted, separate key intervals inside 0..Tk=%lld, got "
                         "[%lld, %lld) and [%lld, %lld) at row %lld", (long long)tk, (long long)s[0], (long long)s[1],
                         (long long)s[2], (long long)s[3], (long long)r);
            return 0;
        }
    }
    return 1;
}
