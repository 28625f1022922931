/*
 * records.c: index_records, the index of a packed block-delta payload (blockprep/packed.py):
 * per cache group, which table rows its records change and where their records are. The twin
 * (the specification) is blockprep.packed.index_records: same arguments, results and errors.
 */
#include "kernel.h"

enum { MAX_GROUPS = 1 << 16 };

typedef struct {
    int32_t group;
    int32_t row;       /* the table row */
    Py_ssize_t offset; /* the record's first word: records of one row keep message order */
} Entry;

static int compare_entries(const void *a, const void *b)
{
    const Entry *x = a, *y = b;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    if (x->row != y->row)
        return x->row < y->row ? -1 : 1;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* A list of groups new, empty dicts. */
static PyObject *empty_dicts(Py_ssize_t groups)
{
    PyObject *out = PyList_New(groups);
    for (Py_ssize_t g = 0; out && g < groups; g++) {
        PyObject *d = PyDict_New();
        if (!d)
            Py_CLEAR(out); /* the items not set are NULL, which a list's dealloc skips */
        else
            PyList_SET_ITEM(out, g, d);
    }
    return out;
}

/* The per-group dicts of n sorted entries: {row: (offset, ...)}. */
static PyObject *grouped_dicts(const Entry *e, Py_ssize_t n, Py_ssize_t groups)
{
    PyObject *out = empty_dicts(groups);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t j = i;
        while (j < n && e[j].group == e[i].group && e[j].row == e[i].row)
            j++;
        PyObject *offsets = PyTuple_New(j - i);
        PyObject *key = offsets ? PyLong_FromLong(e[i].row) : NULL;
        for (Py_ssize_t k = i; key && k < j; k++) {
            PyObject *o = PyLong_FromSsize_t(e[k].offset);
            if (!o) {
                Py_CLEAR(key);
                break;
            }
            PyTuple_SET_ITEM(offsets, k - i, o);
        }
        int status = key ? PyDict_SetItem(PyList_GET_ITEM(out, e[i].group), key, offsets) : -1;
        Py_XDECREF(key);
        Py_XDECREF(offsets);
        if (status < 0) {
            Py_DECREF(out);
            return NULL;
        }
        i = j;
    }
    return out;
}

PyObject *bk_index_records(PyObject *module, PyObject *args)
{
    PyObject *packed, *count_arg, *rows, *groups_arg;
    if (!PyArg_ParseTuple(args, "OOOO:index_records", &packed, &count_arg, &rows, &groups_arg))
        return NULL;
    if (!PyBytes_CheckExact(packed) || PyBytes_GET_SIZE(packed) % 4) {
        PyErr_SetString(PyExc_TypeError, "data must be bytes of whole int32 words");
        return NULL;
    }
    /* A count past Py_ssize_t (a message may claim 2**63 records) is clipped: no payload holds
     * that many, so it is a miscount (None), as in the twin, never an OverflowError. */
    const Py_ssize_t count = PyNumber_AsSsize_t(count_arg, NULL);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(rows)) {
        PyErr_SetString(PyExc_TypeError, "rows must be a list of table rows");
        return NULL;
    }
    const Py_ssize_t groups = PyNumber_AsSsize_t(groups_arg, NULL); /* clipped: never overflows */
    if (groups == -1 && PyErr_Occurred())
        return NULL;
    if (groups < 1 || groups > MAX_GROUPS) {
        PyErr_Format(PyExc_ValueError, "groups must be in [1, %d], got %R", MAX_GROUPS, groups_arg);
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(packed);
    const Py_ssize_t words = PyBytes_GET_SIZE(packed) / 4, batch = PyList_GET_SIZE(rows);
    /* At most one record per header's worth of words: the entries' room, known up front. */
    Entry *entries = PyMem_Malloc(sizeof(Entry) * (size_t)(words / R_HEADER + 1));
    if (!entries)
        return PyErr_NoMemory();
    Py_ssize_t n = 0, i = 0;
    int bad = 0;
    while (i < words) {
        if (i + R_HEADER > words) {
            bad = 1;
            break;
        }
        int32_t kind = bk_word(data, i), group = bk_word(data, i + 1);
        int32_t row = bk_word(data, i + 2), c = bk_word(data, i + 3);
        long long width = bk_record_width(kind, c);
        if (kind < R_WHOLE || kind > R_TRUNCATE || c < 0 || group < 0 || group >= groups ||
            row < 0 || row >= batch || i + R_HEADER + width > words) {
            bad = 1; /* the twin's packed.records words the message */
            break;
        }
        PyObject *t = PyList_GET_ITEM(rows, row);
        long long table_row = PyLong_CheckExact(t) ? exact_value(t) : -1;
        if (table_row < 0 || table_row > INT32_MAX) {
            PyMem_Free(entries);
            PyErr_Format(PyExc_TypeError, "rows[%d] must be a table row (an int >= 0), got %R",
                         (int)row, t);
            return NULL;
        }
        entries[n].group = group;
        entries[n].row = (int32_t)table_row;
        entries[n].offset = i;
        n++;
        i += R_HEADER + (Py_ssize_t)width;
    }
    if (bad || n != count) {
        PyMem_Free(entries);
        Py_RETURN_NONE;
    }
    qsort(entries, (size_t)n, sizeof(Entry), compare_entries);
    PyObject *out = grouped_dicts(entries, n, groups);
    PyMem_Free(entries);
    return out;
}
