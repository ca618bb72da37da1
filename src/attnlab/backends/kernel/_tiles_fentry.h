/* The Python entry point of the forward with head_stats' statistics (_tiles_fstats.h), included once by _tiles.c
 * after _tiles_entries.h: the forward's and the statistics pass's checks together, then the chosen variant's fsrun. */

static PyObject *forward_stats(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "out", "lse", "sums", "received", "scale", "block_q", "block_k", "threads",
                             "spans", "heads", "softcap", "sinks", NULL};
    PyObject *obj[7], *vobj[4] = {Py_None, Py_None, Py_None, Py_None};
    Py_buffer view[11] = {{0}};
    struct problem pr = {0};
    struct vis vis = {0};
    long long bq, bk, heads = 1;
    double softcap = 0.0;
    int64_t l, r;
    int threads;
    PyObject *result = NULL;
    Py_ssize_t dim[128];
    for (int i = 0; i < 128; i++) dim[i] = -1;
    dim['S'] = NSTATS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOfLLi|$OLdO:forward_stats", kwlist, &obj[0], &obj[1], &obj[2],
                                     &obj[3], &obj[4], &obj[5], &obj[6], &pr.scale, &bq, &bk, &threads, &vobj[0], &heads,
                                     &softcap, &vobj[3]))
        return NULL;
    static const char *names[] = {"q", "k", "v", "out", "lse", "sums", "received"};
    static const char *dims[] = {"BGTD", "BTD", "BTV", "BGTV", "BGT", "BGS", "BGT"}; /* self-attention: one length */
    for (int i = 0; i < 7; i++)
        if (!take(obj[i], &view[i], names[i], i >= 3, i >= 5 ? 'd' : 'f', dims[i], dim)) goto done;
    pr.b = dim[B_], pr.g = dim[G_], pr.tq = pr.tk = dim[T_], pr.d = dim[D_], pr.dv = dim[V_];
    if (pr.d < 1 || pr.dv < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a head dim >= 1, got 0", pr.d < 1 ? "q" : "v");
        goto done;
    }
    pr.q = view[0].buf, pr.k = view[1].buf, pr.v = view[2].buf, pr.out = view[3].buf, pr.lse = view[4].buf;
    pr.sums = view[5].buf, pr.received = view[6].buf;
    if (!check_scalars(pr.tq, pr.tk, -1, -1, bq, bk, threads, &l, &r, &pr.bq, &pr.bk, &pr.threads) ||
        !take_vis(vobj, view + 7, &vis, pr.b * pr.g, heads, pr.tq, pr.tk, softcap))
        goto done;
    pr.vis = &vis;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = pr.b * pr.g * pr.tq == 0 ? 0 : isas[chosen].fsrun(&pr);
    Py_END_ALLOW_THREADS
    result = status != 0 ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    release(view, 11);
    return result;
}
