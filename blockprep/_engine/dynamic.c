/*
 * dynamic.c: a paged decode step's dynamic inputs in one call each (module functions of _kernel):
 * step_slots (a paged decode step's slots, or None when a row fails a check), paged_step (those
 * slots, the tokens and the lengths written into three columns in the same call) and
 * differing_rows. The twin (the specification) is blockprep/_engine/dynamic.py: same arguments,
 * results, errors and messages.
 *
 * Why C: interleaved with other work, each NumPy call of a step costs it the cache lines of its
 * own machinery (a cold min() or fancy index: 10-30 us); step_slots replaces a Qwen step's
 * Python row loop (about 4 us of 21). Every argument and every value read is checked before the
 * first write.
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

/* A paged step's checked arguments (step_slots' first seven): the views held until
 * paged_release. */
typedef struct {
    PyObject *seq_lens, *items;
    long long width, page_size, max_seq_len;
    Py_buffer lengths, table;
    Py_ssize_t rows;
} PagedArgs;

/* Check o[0..6] (seq_lens, items, lengths, table, width, page_size, max_seq_len) into p, in the
 * twin's order; -1 with the exception (and no view held) otherwise. */
static int paged_args(PyObject *const *o, PagedArgs *p)
{
    static const char *names[3] = {"width", "page_size", "max_seq_len"};
    long long a[3];
    p->seq_lens = o[0];
    p->items = o[1];
    if (!PyList_CheckExact(p->seq_lens)) {
        PyErr_Format(PyExc_TypeError, "seq_lens must be a list, got %s", bk_type_name(o[0]));
        return -1;
    }
    if (!PyDict_CheckExact(p->items)) {
        PyErr_Format(PyExc_TypeError, "items must be a dict, got %s", bk_type_name(o[1]));
        return -1;
    }
    for (int i = 0; i < 3; i++)
        if (bk_int_arg(o[4 + i], names[i], 1, (long long)INT32_MAX + 1, &a[i]) < 0)
            return -1;
    p->width = a[0];
    p->page_size = a[1];
    p->max_seq_len = a[2];
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(p->items, &pos, &key, &value))
        if (!PyLong_CheckExact(key)) {
            PyErr_Format(PyExc_TypeError, "items keys must be ints, got %s", bk_type_name(key));
            return -1;
        }
    if (int_view(o[2], &p->lengths, 4, 0, "lengths") < 0)
        return -1;
    if (int_view(o[3], &p->table, 4, 0, "table") < 0) {
        PyBuffer_Release(&p->lengths);
        return -1;
    }
    p->rows = PyList_GET_SIZE(p->seq_lens);
    if (p->lengths.shape[0] < p->rows) {
        PyErr_Format(PyExc_ValueError, "lengths holds %zd rows, fewer than the %zd seq_lens",
                     p->lengths.shape[0], p->rows);
    } else if (p->table.shape[0] / p->width < p->rows) {
        PyErr_Format(PyExc_ValueError, "table holds %zd cells, fewer than %zd rows of %lld",
                     p->table.shape[0], p->rows, p->width);
    } else {
        return 0;
    }
    PyBuffer_Release(&p->lengths);
    PyBuffer_Release(&p->table);
    return -1;
}

static void paged_release(PagedArgs *p)
{
    PyBuffer_Release(&p->lengths);
    PyBuffer_Release(&p->table);
}

/* Each row's decode slot into slots[0..rows): 1 when every row passes, 0 at the first row that
 * does not (the caller's row loop then words the error), -1 on no memory. Only exact ints count
 * as seq_lens and page ids; no Python code runs here (the items are indexed by row first,
 * borrowed from the dict, which nothing can change before the loop ends), and every table read is
 * inside the rows * width cells paged_args checked. */
static int paged_slots(const PagedArgs *p, long long *slots)
{
    const Py_ssize_t rows = p->rows;
    const long long width = p->width, page_size = p->page_size;
    PyObject **by_row = NULL;
    if (PyDict_GET_SIZE(p->items)) { /* each row's new ids (borrowed; NULL: the table's row) */
        by_row = PyMem_Calloc(rows ? rows : 1, sizeof *by_row);
        if (!by_row) {
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(p->items, &pos, &key, &value)) {
            long long row = exact_value(key);
            if (row >= 0 && row < rows && value != Py_None)
                by_row[row] = value;
        }
    }
    const long long page_max = (INT32_MAX - page_size + 1) / page_size; /* no slot overflows */
    int passed = 1;
    for (Py_ssize_t row = 0; passed && row < rows; row++) {
        PyObject *s = PyList_GET_ITEM(p->seq_lens, row), *ids = by_row ? by_row[row] : NULL;
        long long seq_len = PyLong_CheckExact(s) ? exact_value(s) : 0, page = -1;
        if (seq_len == BIG || seq_len < 1 || seq_len > p->max_seq_len) {
            passed = 0;
            break;
        }
        long long position = seq_len - 1, index = position / page_size;
        if (!ids) { /* as the table holds it */
            const char *at = (const char *)p->lengths.buf + row * p->lengths.strides[0];
            int32_t held;
            memcpy(&held, at, sizeof held);
            if (index < held && index < width) {
                Py_ssize_t cell = (Py_ssize_t)(row * width + index); /* < rows * width <= cells */
                int32_t x;
                memcpy(&x, (const char *)p->table.buf + cell * p->table.strides[0], sizeof x);
                page = x;
            }
        } else if (PyList_CheckExact(ids) && PyList_GET_SIZE(ids) <= width &&
                   index < PyList_GET_SIZE(ids)) {
            PyObject *x = PyList_GET_ITEM(ids, index);
            if (PyLong_CheckExact(x))
                page = exact_value(x);
        }
        if (page == BIG || page < 0 || page > page_max)
            passed = 0;
        else
            slots[row] = page * page_size + position - index * page_size;
    }
    PyMem_Free(by_row);
    return passed;
}

/* Room for a step's slots: on the stack up to STACK_ROWS rows, else from the heap. */
#define STACK_ROWS 256

/* paged_slots into stack (rows <= STACK_ROWS) or a heap block in *slots (the caller frees it when
 * it is not stack); paged_slots' answer, -1 on no memory too. */
static int slots_into(const PagedArgs *p, long long *stack, long long **slots)
{
    *slots = stack;
    if (p->rows > STACK_ROWS) {
        long long *heap = PyMem_Malloc(sizeof *heap * (size_t)p->rows);
        if (!heap) {
            PyErr_NoMemory();
            return -1;
        }
        *slots = heap;
    }
    return paged_slots(p, *slots);
}

PyObject *bk_step_slots(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "step_slots takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PagedArgs p;
    if (paged_args(args, &p) < 0)
        return NULL;
    long long stack[STACK_ROWS], *slots = stack;
    PyObject *result = NULL;
    int passed = slots_into(&p, stack, &slots);
    if (passed < 0)
        goto done;
    if (!passed) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    PyObject *list = PyList_New(p.rows);
    for (Py_ssize_t row = 0; list && row < p.rows; row++) {
        PyObject *slot = PyLong_FromLongLong(slots[row]);
        if (!slot)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, row, slot);
    }
    result = list;
done:
    if (slots != stack)
        PyMem_Free(slots);
    paged_release(&p);
    return result;
}

/* A writable 1-D int32 or int64 buffer of any stride with at least rows cells (put_ints' dst,
 * paged_step's outputs); its item size (4 or 8), or -1 with TypeError / ValueError (the twin's
 * words). */
static int int_column(PyObject *obj, Py_buffer *view, Py_ssize_t rows, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a writable 1-D int32 or int64 array", name);
        return -1;
    }
    const int items = int_items(view);
    if (view->ndim != 1 || !items) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be a writable 1-D int32 or int64 array", name);
        return -1;
    }
    if (view->shape[0] < rows) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd cells, fewer than the %zd rows", name,
                     view->shape[0], rows);
        PyBuffer_Release(view);
        return -1;
    }
    return items;
}

/* Cell i of a column of 4- or 8-byte ints (in its bounds: i < rows <= shape[0]). */
static inline void put_cell(const Py_buffer *v, int items, Py_ssize_t i, long long value)
{
    char *cell = (char *)v->buf + i * v->strides[0];
    if (items == 8) {
        int64_t x = value;
        memcpy(cell, &x, sizeof x);
    } else {
        int32_t x = (int32_t)value;
        memcpy(cell, &x, sizeof x);
    }
}

/* Whether the first rows cells of two columns may share a byte: their extents (from the lowest
 * cell's first byte to the highest cell's last) meet, as numpy.may_share_memory says. */
static int columns_meet(const Py_buffer *a, const Py_buffer *b, Py_ssize_t rows)
{
    if (rows == 0)
        return 0;
    const char *lo[2], *hi[2];
    const Py_buffer *v[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        const char *first = v[k]->buf, *last = first + (rows - 1) * v[k]->strides[0];
        lo[k] = first < last ? first : last;
        hi[k] = (first < last ? last : first) + v[k]->itemsize;
    }
    return lo[0] < hi[1] && lo[1] < hi[0];
}

/* paged_step: a paged decode step written in one call: step_slots' slots, then every token
 * checked to fit token_out's type, then tokens, seq_lens and slots written into the three
 * columns (with write false, the 12th argument, nothing is written: the checks alone, before a
 * table plan). False, nothing written, when a row fails step_slots' checks, tokens is not one
 * exact int per row or a token does not fit (int64's least value counts as not fitting); the
 * caller's general path then decides and words the error. */
PyObject *bk_paged_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *names[3] = {"token_out", "seq_out", "slot_out"};
    if (nargs != 11 && nargs != 12) {
        PyErr_Format(PyExc_TypeError, "paged_step takes 11 or 12 arguments (%zd given)", nargs);
        return NULL;
    }
    int write = 1;
    if (nargs == 12 && (write = PyObject_IsTrue(args[11])) < 0)
        return NULL;
    PyObject *const step_args[7] = {args[0], args[2], args[3], args[4], args[5], args[6], args[7]};
    PagedArgs p;
    if (paged_args(step_args, &p) < 0)
        return NULL;
    PyObject *tokens = args[1], *result = NULL;
    Py_buffer out[3];
    int items[3], held = 0;
    long long stack[STACK_ROWS], *slots = stack;
    if (!PyList_CheckExact(tokens)) {
        PyErr_Format(PyExc_TypeError, "tokens must be a list, got %s", bk_type_name(tokens));
        goto done;
    }
    for (; held < 3; held++)
        if ((items[held] = int_column(args[8 + held], &out[held], p.rows, names[held])) < 0)
            goto done;
    if (columns_meet(&out[0], &out[1], p.rows) || columns_meet(&out[0], &out[2], p.rows) ||
        columns_meet(&out[1], &out[2], p.rows)) {
        PyErr_SetString(PyExc_ValueError, "token_out, seq_out and slot_out must not overlap");
        goto done;
    }
    int passed = slots_into(&p, stack, &slots);
    if (passed < 0)
        goto done;
    passed = passed && PyList_GET_SIZE(tokens) == p.rows;
    for (Py_ssize_t row = 0; passed && row < p.rows; row++) {
        PyObject *x = PyList_GET_ITEM(tokens, row);
        long long value = PyLong_CheckExact(x) ? exact_value(x) : BIG;
        passed = value != BIG && (items[0] == 8 || (value >= -(long long)INT32_MAX - 1 &&
                                                     value <= INT32_MAX));
    }
    if (passed && write) { /* nothing below fails: every cell is in its column (rows <= shape[0]) */
        for (Py_ssize_t row = 0; row < p.rows; row++) {
            put_cell(&out[0], items[0], row, exact_value(PyList_GET_ITEM(tokens, row)));
            put_cell(&out[1], items[1], row, exact_value(PyList_GET_ITEM(p.seq_lens, row)));
            put_cell(&out[2], items[2], row, slots[row]);
        }
    }
    result = PyBool_FromLong(passed);
done:
    if (slots != stack)
        PyMem_Free(slots);
    while (held-- > 0)
        PyBuffer_Release(&out[held]);
    paged_release(&p);
    return result;
}

/* differing_rows(new, old): the rows r where new[r] != old[r] (operator.ne, as the twin's map),
 * for two exact lists of one length, in row order; None for anything else (the caller then
 * compares itself). Exact str pairs are compared here (identity, then contents: what str's !=
 * says); any other pair by its own !=, which may run Python code: the walk covers the rows the
 * lists had when the call began and ends early where a list shrank, as the twin's does. */
PyObject *bk_differing_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "differing_rows takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *new = args[0], *old = args[1];
    if (!PyList_CheckExact(new) || !PyList_CheckExact(old) ||
        PyList_GET_SIZE(new) != PyList_GET_SIZE(old))
        Py_RETURN_NONE;
    PyObject *rows = PyList_New(0);
    if (!rows)
        return NULL;
    /* The rows the lists had when the call began (a != that grows them adds none, as in the
     * twin); a list that shrinks ends the walk. */
    const Py_ssize_t n_rows = PyList_GET_SIZE(new);
    for (Py_ssize_t r = 0; r < n_rows && r < PyList_GET_SIZE(new) && r < PyList_GET_SIZE(old);
         r++) {
        PyObject *x = PyList_GET_ITEM(new, r), *y = PyList_GET_ITEM(old, r);
        int differ;
        if (PyUnicode_CheckExact(x) && PyUnicode_CheckExact(y)) {
            /* Equal strs have one length and one kind (PEP 393's canonical form): then memcmp. */
#if PY_VERSION_HEX < 0x030C0000
            if (PyUnicode_READY(x) < 0 || PyUnicode_READY(y) < 0) /* a legacy str, made ready */
                goto fail;
#endif
            Py_ssize_t n = PyUnicode_GET_LENGTH(x);
            differ = x != y && (n != PyUnicode_GET_LENGTH(y) ||
                                PyUnicode_KIND(x) != PyUnicode_KIND(y) ||
                                memcmp(PyUnicode_DATA(x), PyUnicode_DATA(y),
                                       (size_t)n * PyUnicode_KIND(x)) != 0);
        } else {
            Py_INCREF(x);
            Py_INCREF(y);
            PyObject *answer = PyObject_RichCompare(x, y, Py_NE);
            Py_DECREF(x);
            Py_DECREF(y);
            differ = answer ? PyObject_IsTrue(answer) : -1;
            Py_XDECREF(answer);
        }
        if (differ < 0)
            goto fail;
        if (differ) {
            PyObject *row = PyLong_FromSsize_t(r);
            if (!row || PyList_Append(rows, row) < 0) {
                Py_XDECREF(row);
                goto fail;
            }
            Py_DECREF(row);
        }
    }
    return rows;
fail:
    Py_DECREF(rows);
    return NULL;
}
