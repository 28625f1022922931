/*
 * dynamic.c: a decode step's dynamic inputs in one call each (module functions of _kernel):
 * int_range (the smallest and largest of a 1-D int64 array's first n values) and decode_inputs
 * (per table row, its request's token, position seq - 1 and KV length). The twin (the
 * specification) is blockprep/engine/dynamic.py: same arguments, results, errors and messages.
 *
 * Why C: interleaved with other work, each NumPy call of a step costs it the cache lines of its
 * own machinery (a cold min() or fancy index: 10-30 us); these two calls replace seven.
 * Every argument and every value read is checked before the first write.
 */
#include "kernel.h"

/* obj's buffer, with integer items of itemsize bytes: 1-D (any stride) to read, or C-contiguous
 * and writable to write. -1 with TypeError / ValueError (the twin's words) otherwise. */
static int int_view(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable,
                    const char *name)
{
    const char *kind = itemsize == 8 ? "int64" : "int32";
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be an %s array", name, kind);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    while (*f == '=' || *f == '<' || *f == '@')
        f++;
    int ok = view->itemsize == itemsize && f[0] && !f[1] &&
             (itemsize == 8 ? (f[0] == 'q' || f[0] == 'l' || f[0] == 'n') : f[0] == 'i');
    if (!ok) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be an %s array", name, kind);
        return -1;
    }
    if (writable) {
        if (view->readonly || !PyBuffer_IsContiguous(view, 'C')) {
            PyBuffer_Release(view);
            PyErr_Format(PyExc_ValueError, "%s must be C-contiguous and writable", name);
            return -1;
        }
    } else if (view->ndim != 1) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D %s array", name, kind);
        return -1;
    }
    return 0;
}

/* Item i of a 1-D int64 view (any stride or alignment). */
static inline long long item64(const Py_buffer *v, Py_ssize_t i)
{
    long long x;
    memcpy(&x, (const char *)v->buf + i * v->strides[0], sizeof x);
    return x;
}

PyObject *bk_int_range(PyObject *module, PyObject *args)
{
    PyObject *values, *n_obj;
    if (!PyArg_ParseTuple(args, "OO:int_range", &values, &n_obj))
        return NULL;
    if (!PyLong_CheckExact(n_obj)) {
        PyErr_Format(PyExc_TypeError, "n must be an int, got %s", bk_type_name(n_obj));
        return NULL;
    }
    Py_buffer v;
    if (int_view(values, &v, 8, 0, "values") < 0)
        return NULL;
    long long n = exact_value(n_obj);
    if (n == BIG || n < 1 || n > v.shape[0]) {
        PyErr_Format(PyExc_ValueError, "n must be in [1, %zd], got %R", v.shape[0], n_obj);
        PyBuffer_Release(&v);
        return NULL;
    }
    long long lo = item64(&v, 0), hi = lo;
    for (Py_ssize_t i = 1; i < n; i++) {
        long long x = item64(&v, i);
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    PyBuffer_Release(&v);
    return Py_BuildValue("(LL)", lo, hi);
}

PyObject *bk_decode_inputs(PyObject *module, PyObject *args)
{
    static const char *names[6] = {"source", "tokens", "seq", "input_ids", "position_ids",
                                   "kv_seq_lens"};
    static const Py_ssize_t sizes[6] = {8, 8, 8, 8, 4, 4};
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO:decode_inputs", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5]))
        return NULL;
    Py_buffer v[6];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 6; got++)
        if (int_view(o[got], &v[got], sizes[got], got >= 3, names[got]) < 0)
            goto done;
    const Py_buffer *src = &v[0], *tok = &v[1], *lens = &v[2];
    const Py_ssize_t T = src->shape[0], A = tok->shape[0];
    if (lens->shape[0] < A) {
        PyErr_Format(PyExc_ValueError, "seq holds %zd lengths, fewer than the %zd tokens",
                     lens->shape[0], A);
        goto done;
    }
    const Py_ssize_t cells = v[3].len / 8;
    if (T == 0 || cells % T || cells / T == 0) {
        PyErr_Format(PyExc_ValueError, "input_ids must hold a positive multiple of %zd cells, got %zd",
                     T, cells);
        goto done;
    }
    if (v[4].len / 4 != cells || v[5].len / 4 != T) {
        PyErr_Format(PyExc_ValueError,
                     "position_ids must hold %zd cells and kv_seq_lens %zd, got %zd and %zd", cells,
                     T, v[4].len / 4, v[5].len / 4);
        goto done;
    }
    for (Py_ssize_t t = 0; t < T; t++) {
        long long q = item64(src, t);
        if (q < 0 || q >= A) {
            PyErr_Format(PyExc_ValueError, "source[%zd] = %lld is not a request in [0, %zd)", t, q,
                         A);
            goto done;
        }
    }
    for (Py_ssize_t q = 0; q < A; q++) {
        long long s = item64(lens, q);
        if (s < 1 || s > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "seq[%zd] = %lld is not a length in [1, 2**31)", q, s);
            goto done;
        }
    }
    /* Everything checked: the writes (each within its buffer: t < T, column < S). */
    const Py_ssize_t S = cells / T;
    int64_t *ids = v[3].buf;
    int32_t *positions = v[4].buf, *kv = v[5].buf;
    for (Py_ssize_t t = 0; t < T; t++) {
        Py_ssize_t q = (Py_ssize_t)item64(src, t);
        int64_t token = (int64_t)item64(tok, q);
        int32_t length = (int32_t)item64(lens, q);
        for (Py_ssize_t c = 0; c < S; c++) {
            ids[t * S + c] = token;
            positions[t * S + c] = length - 1;
        }
        kv[t] = length;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return result;
}
