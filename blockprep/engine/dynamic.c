/*
 * dynamic.c: a decode step's dynamic inputs in one call each (module functions of _kernel):
 * int_range (the smallest and largest of a 1-D int64 array's first n values), decode_inputs (per
 * table row, its request's token, position seq - 1 and KV length) and step_slots (a paged decode
 * step's slots, or None when a row fails a check). The twin (the specification) is
 * blockprep/engine/dynamic.py: same arguments, results, errors and messages.
 *
 * Why C: interleaved with other work, each NumPy call of a step costs it the cache lines of its
 * own machinery (a cold min() or fancy index: 10-30 us); int_range and decode_inputs replace seven
 * of them in a DeepSeek step, step_slots a Qwen step's Python row loop (about 4 us of 21).
 * Every argument and every value read is checked before the first write.
 */
#include "kernel.h"

/* The item size of a buffer of int32 (4) or int64 (8) items in native order; 0 for any other. */
static int int_items(const Py_buffer *v)
{
    const char *f = v->format ? v->format : "B";
    while (*f == '=' || *f == '<' || *f == '@')
        f++;
    if (!f[0] || f[1])
        return 0;
    if (v->itemsize == 8 && (f[0] == 'q' || f[0] == 'l' || f[0] == 'n'))
        return 8;
    return v->itemsize == 4 && f[0] == 'i' ? 4 : 0;
}

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
    if (int_items(view) != itemsize) {
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

/* step_slots: each row's decode slot, or None at the first row that fails a check (the caller's
 * row loop then words the error). Only exact ints count as seq_lens and page ids; no Python code
 * runs once the arguments are read (the items are indexed by row first, borrowed from the dict,
 * which nothing can change before the loop ends), and every table read is inside the rows *
 * width cells checked first. */
PyObject *bk_step_slots(PyObject *module, PyObject *args)
{
    PyObject *seq_lens, *items, *lengths_obj, *table_obj, *o[3];
    static const char *names[3] = {"width", "page_size", "max_seq_len"};
    long long a[3];
    if (!PyArg_ParseTuple(args, "OOOOOOO:step_slots", &seq_lens, &items, &lengths_obj,
                          &table_obj, &o[0], &o[1], &o[2]))
        return NULL;
    if (!PyList_CheckExact(seq_lens)) {
        PyErr_Format(PyExc_TypeError, "seq_lens must be a list, got %s", bk_type_name(seq_lens));
        return NULL;
    }
    if (!PyDict_CheckExact(items)) {
        PyErr_Format(PyExc_TypeError, "items must be a dict, got %s", bk_type_name(items));
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (bk_int_arg(o[i], names[i], 1, (long long)INT32_MAX + 1, &a[i]) < 0)
            return NULL;
    const long long width = a[0], page_size = a[1], max_seq_len = a[2];
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(items, &pos, &key, &value))
        if (!PyLong_CheckExact(key)) {
            PyErr_Format(PyExc_TypeError, "items keys must be ints, got %s", bk_type_name(key));
            return NULL;
        }
    Py_buffer lengths, table;
    if (int_view(lengths_obj, &lengths, 4, 0, "lengths") < 0)
        return NULL;
    if (int_view(table_obj, &table, 4, 0, "table") < 0) {
        PyBuffer_Release(&lengths);
        return NULL;
    }
    const Py_ssize_t rows = PyList_GET_SIZE(seq_lens);
    PyObject *result = NULL, **by_row = NULL;
    if (lengths.shape[0] < rows) {
        PyErr_Format(PyExc_ValueError, "lengths holds %zd rows, fewer than the %zd seq_lens",
                     lengths.shape[0], rows);
        goto done;
    }
    if (table.shape[0] / width < rows) {
        PyErr_Format(PyExc_ValueError, "table holds %zd cells, fewer than %zd rows of %lld",
                     table.shape[0], rows, width);
        goto done;
    }
    if (PyDict_GET_SIZE(items)) { /* each row's new ids (borrowed; NULL: the table's row) */
        by_row = PyMem_Calloc(rows ? rows : 1, sizeof *by_row);
        if (!by_row) {
            PyErr_NoMemory();
            goto done;
        }
        pos = 0;
        while (PyDict_Next(items, &pos, &key, &value)) {
            long long row = exact_value(key);
            if (row >= 0 && row < rows && value != Py_None)
                by_row[row] = value;
        }
    }
    const long long page_max = (INT32_MAX - page_size + 1) / page_size; /* no slot overflows */
    PyObject *slots = PyList_New(rows);
    if (!slots)
        goto done;
    for (Py_ssize_t row = 0; row < rows; row++) {
        PyObject *s = PyList_GET_ITEM(seq_lens, row), *ids = by_row ? by_row[row] : NULL;
        long long seq_len = PyLong_CheckExact(s) ? exact_value(s) : 0, page = -1;
        if (seq_len == BIG || seq_len < 1 || seq_len > max_seq_len)
            goto doubt;
        long long position = seq_len - 1, index = position / page_size;
        if (!ids) { /* as the table holds it */
            long long held = *(const int32_t *)((const char *)lengths.buf + row * lengths.strides[0]);
            if (index >= held || index >= width)
                goto doubt;
            Py_ssize_t cell = (Py_ssize_t)(row * width + index); /* < rows * width <= cells */
            int32_t x;
            memcpy(&x, (const char *)table.buf + cell * table.strides[0], sizeof x);
            page = x;
        } else {
            if (!PyList_CheckExact(ids) || PyList_GET_SIZE(ids) > width ||
                index >= PyList_GET_SIZE(ids))
                goto doubt;
            PyObject *p = PyList_GET_ITEM(ids, index);
            if (PyLong_CheckExact(p))
                page = exact_value(p);
        }
        if (page == BIG || page < 0 || page > page_max)
            goto doubt;
        PyObject *slot = PyLong_FromLongLong(page * page_size + position - index * page_size);
        if (!slot) {
            Py_DECREF(slots);
            goto done;
        }
        PyList_SET_ITEM(slots, row, slot);
    }
    result = slots;
    goto done;
doubt:
    Py_DECREF(slots);
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(by_row);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&table);
    return result;
}

/* put_ints(dst, values): dst[i] = values[i] for a list of exact ints, into a writable 1-D int32
 * or int64 buffer of any stride (a token buffer's column 0). Every value is checked to fit
 * before the first write. What `dst[:len(values)] = values` does for a NumPy dst, without the
 * conversion machinery (about 6,500 instructions for 16 values there); with the twin the callers
 * assign with NumPy themselves (their checks before make these ones pass). */
PyObject *bk_put_ints(PyObject *module, PyObject *args)
{
    PyObject *dst, *values;
    if (!PyArg_ParseTuple(args, "OO:put_ints", &dst, &values))
        return NULL;
    if (!PyList_CheckExact(values)) {
        PyErr_Format(PyExc_TypeError, "values must be a list, got %s", bk_type_name(values));
        return NULL;
    }
    Py_buffer v;
    if (PyObject_GetBuffer(dst, &v, PyBUF_RECORDS) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "dst must be a writable 1-D int32 or int64 array");
        return NULL;
    }
    const int items = int_items(&v), wide = items == 8;
    if (v.ndim != 1 || !items) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_TypeError, "dst must be a writable 1-D int32 or int64 array");
        return NULL;
    }
    const Py_ssize_t n = PyList_GET_SIZE(values);
    if (n > v.shape[0]) {
        PyErr_Format(PyExc_ValueError, "%zd values for %zd cells", n, v.shape[0]);
        PyBuffer_Release(&v);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* no Python code runs in this loop or the next */
        PyObject *x = PyList_GET_ITEM(values, i);
        if (!PyLong_CheckExact(x)) {
            PyErr_Format(PyExc_TypeError, "values[%zd] is %s, not an int", i, bk_type_name(x));
            PyBuffer_Release(&v);
            return NULL;
        }
        int overflow = 0;
        long long value = exact_value(x);
        if (value == BIG) /* beyond int64, or int64's least value itself */
            PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow || (!wide && (value < -(long long)INT32_MAX - 1 || value > INT32_MAX))) {
            PyErr_Format(PyExc_ValueError, "values[%zd] = %R does not fit %s", i, x,
                         wide ? "int64" : "int32");
            PyBuffer_Release(&v);
            return NULL;
        }
    }
    char *cell = v.buf;
    for (Py_ssize_t i = 0; i < n; i++, cell += v.strides[0]) { /* i < shape[0]: in the buffer */
        long long value = exact_value(PyList_GET_ITEM(values, i)); /* BIG: LLONG_MIN, checked */
        if (wide) {
            int64_t x = value;
            memcpy(cell, &x, sizeof x);
        } else {
            int32_t x = (int32_t)value;
            memcpy(cell, &x, sizeof x);
        }
    }
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}
