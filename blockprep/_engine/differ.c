/*
 * differ.c: the module blockprep._differ, diff_lists: the compiled step of both encoders
 * (blockprep/events.py PackedDeltaEncoder.encode and blockprep/wire.py BlockDeltaEncoder.encode,
 * the specification). It compares each request's lists with the copies last sent and packs what
 * changed as int32 records, choosing each row's operation by wire.diff_ops's rule; with `as_ops`
 * it hands back the records as blockprep.wire operations instead ({request: ops} or
 * {request: {group: ops}}). A module of its own, below blockprep.wire, which imports it.
 *
 * It takes only the canonical step: request ids that are exact str or int (so no lookup runs
 * Python code), exact lists of exact ints (the caller's and the held copies alike: the Python
 * code may have kept other ints there), every sent id in [0, 2**31), grouped lists as exact
 * dicts whose keys are `names` in order. For anything else it returns None having changed
 * nothing, and the caller runs the Python encoder, which defines every result and error.
 *
 * Plan, then commit: every list is read, checked and every allocation made before the first
 * change to a held copy; the commit only swaps list items (a set's ids), which cannot fail.
 */
#include "kernel.h"

#define ID_LIMIT 2147483648LL

typedef struct {
    uint32_t *w;
    Py_ssize_t n, cap;
} Words;

typedef struct { /* a set's id, written into a held copy at commit */
    PyObject *list;
    Py_ssize_t at;
    PyObject *value; /* borrowed from the caller's list, alive for the call */
} Cell;

typedef struct {
    Words out;
    Cell *cells;
    Py_ssize_t ncells, capcells;
    Py_ssize_t *pos; /* scratch: one row's changed positions */
    Py_ssize_t cappos;
    Py_ssize_t count; /* records */
} Diff;

enum { DECLINE = 1, ERROR = -1 };

/* The growable array buf of *cap items of `size` bytes, with room for need >= 1 items (NULL
 * with MemoryError, buf left as it was). */
static void *grown(void *buf, Py_ssize_t *cap, Py_ssize_t need, size_t size)
{
    if (need <= *cap)
        return buf;
    Py_ssize_t more = *cap ? *cap : 256;
    while (more < need)
        more *= 2;
    void *p = PyMem_Realloc(buf, (size_t)more * size);
    if (!p)
        return PyErr_NoMemory();
    *cap = more;
    return p;
}

static int words_reserve(Words *o, Py_ssize_t k)
{
    uint32_t *w = grown(o->w, &o->cap, o->n + k, sizeof(uint32_t));
    return w ? (o->w = w, 0) : ERROR;
}

/* Whether item i of `new` differs from item i of the held copy `old`: 0 or 1, or DECLINE_ID
 * when either is not an exact int (the held copies are the caller's ids when the Python code
 * made them, so they are checked like the caller's: exact_value reads only exact ints) or is
 * beyond int64 (exact_value's one BIG for all of them: the Python encoder refuses such ids). */
enum { DECLINE_ID = -1 };
static inline int id_differs(PyObject *new, PyObject *old, Py_ssize_t i)
{
    PyObject *a = PyList_GET_ITEM(new, i), *b = PyList_GET_ITEM(old, i);
    if (!PyLong_CheckExact(a) || (a != b && !PyLong_CheckExact(b)))
        return DECLINE_ID;
    if (a == b)
        return 0;
    const long long x = exact_value(a), y = exact_value(b);
    return x == BIG || y == BIG ? DECLINE_ID : x != y;
}

/* Record header then items [from, to) of `lst` (each an id in range, else DECLINE). */
static int put_ids(Diff *d, int32_t kind, Py_ssize_t g, Py_ssize_t row, PyObject *lst,
                   Py_ssize_t from, Py_ssize_t to)
{
    if (words_reserve(&d->out, 4 + (to - from)))
        return ERROR;
    uint32_t *w = d->out.w + d->out.n;
    w[0] = (uint32_t)kind, w[1] = (uint32_t)g, w[2] = (uint32_t)row, w[3] = (uint32_t)(to - from);
    for (Py_ssize_t i = from; i < to; i++) {
        PyObject *x = PyList_GET_ITEM(lst, i);
        long long v = PyLong_CheckExact(x) ? exact_value(x) : -1;
        if (v < 0 || v >= ID_LIMIT)
            return DECLINE;
        w[4 + i - from] = (uint32_t)v;
    }
    d->out.n += 4 + (to - from);
    d->count++;
    return 0;
}

static int put_truncate(Diff *d, Py_ssize_t g, Py_ssize_t row, Py_ssize_t length)
{
    if (words_reserve(&d->out, 4))
        return ERROR;
    uint32_t *w = d->out.w + d->out.n;
    w[0] = R_TRUNCATE, w[1] = (uint32_t)g, w[2] = (uint32_t)row, w[3] = (uint32_t)length;
    d->out.n += 4;
    d->count++;
    return 0;
}

/* A fresh copy of `lst` as the held list (the twin keeps a copy of the values sent). */
static int fresh_copy(PyObject *lst, PyObject **held)
{
    *held = PyList_GetSlice(lst, 0, PyList_GET_SIZE(lst));
    return *held ? 0 : ERROR;
}

/*
 * One row (group g of batch row `row`): `old` the held copy (NULL: none), `new` the caller's
 * list. Packs its records and sets *held to the list held afterwards (a new reference: `old`
 * itself when unchanged or changed by a set at commit, else a fresh copy of `new`).
 */
static int diff_row(Diff *d, Py_ssize_t g, Py_ssize_t row, PyObject *old, PyObject *new,
                    PyObject **held)
{
    *held = NULL;
    if (!PyList_CheckExact(new))
        return DECLINE;
    Py_ssize_t n = PyList_GET_SIZE(new);
    if (n >= ID_LIMIT)
        return DECLINE;
    if (old == NULL) {
        int r = put_ids(d, R_WHOLE, g, row, new, 0, n);
        return r ? r : fresh_copy(new, held);
    }
    Py_ssize_t m = PyList_GET_SIZE(old);
    Py_ssize_t common = n < m ? n : m, prefix = 0;
    if (n == m) { /* the positions that differ */
        Py_ssize_t k = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int differs = id_differs(new, old, i);
            if (differs == DECLINE_ID)
                return DECLINE;
            if (!differs)
                continue;
            Py_ssize_t *pos = grown(d->pos, &d->cappos, k + 1, sizeof(Py_ssize_t));
            if (!pos)
                return ERROR;
            d->pos = pos;
            d->pos[k++] = i;
        }
        if (k == 0) {
            Py_INCREF(old);
            *held = old;
            return 0;
        }
        if (2 * k > n) {
            int r = put_ids(d, R_WHOLE, g, row, new, 0, n);
            return r ? r : fresh_copy(new, held);
        }
        if (words_reserve(&d->out, 4 + 2 * k))
            return ERROR;
        Cell *cells = grown(d->cells, &d->capcells, d->ncells + k, sizeof(Cell));
        if (!cells)
            return ERROR;
        d->cells = cells;
        uint32_t *w = d->out.w + d->out.n;
        w[0] = R_SET, w[1] = (uint32_t)g, w[2] = (uint32_t)row, w[3] = (uint32_t)k;
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_ssize_t p = d->pos[j];
            long long v = exact_value(PyList_GET_ITEM(new, p));
            if (v < 0 || v >= ID_LIMIT)
                return DECLINE;
            w[4 + j] = (uint32_t)p;
            w[4 + k + j] = (uint32_t)v;
            d->cells[d->ncells + j] = (Cell){old, p, PyList_GET_ITEM(new, p)};
        }
        d->out.n += 4 + 2 * k;
        d->ncells += k;
        d->count++;
        Py_INCREF(old);
        *held = old;
        return 0;
    }
    for (; prefix < common; prefix++) { /* the common prefix */
        int differs = id_differs(new, old, prefix);
        if (differs == DECLINE_ID)
            return DECLINE;
        if (differs)
            break;
    }
    int r;
    if (prefix == common && n < m) { /* a truncate */
        r = put_truncate(d, g, row, n);
    } else if (prefix == common) { /* n > m: an append */
        r = put_ids(d, R_APPEND, g, row, new, m, n);
    } else if (2 * prefix >= n) {
        r = put_truncate(d, g, row, prefix);
        if (!r)
            r = put_ids(d, R_APPEND, g, row, new, prefix, n);
    } else {
        r = put_ids(d, R_WHOLE, g, row, new, 0, n);
    }
    return r ? r : fresh_copy(new, held); /* every id past the prefix was sent, so checked */
}

static int plain_key(PyObject *key)
{
    return PyUnicode_CheckExact(key) || PyLong_CheckExact(key);
}

static int same_name(PyObject *a, PyObject *b)
{
    return a == b || (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b) &&
                      PyUnicode_Compare(a, b) == 0);
}

/* Group `name`'s held list in `old` (borrowed; NULL with DECLINE in *r when there is none). The
 * held dict is read in step with the caller's (`*at`, the same order as a rule) and looked up
 * only when the orders differ, after checking every key is an exact str (no __eq__ runs). */
static PyObject *held_list(PyObject *old, PyObject *name, Py_ssize_t *at, int *r)
{
    PyObject *key, *was;
    if (PyDict_Next(old, at, &key, &was) && same_name(key, name) && PyList_CheckExact(was))
        return was;
    Py_ssize_t i = 0;
    while (PyDict_Next(old, &i, &key, &was))
        if (!PyUnicode_CheckExact(key)) {
            *r = DECLINE;
            return NULL;
        }
    was = PyDict_GetItemWithError(old, name);
    *r = was ? (PyList_CheckExact(was) ? 0 : DECLINE) : PyErr_Occurred() ? ERROR : DECLINE;
    return *r ? NULL : was;
}

/*
 * One grouped request: `lists` its {group: ids}, `old` its held {group: list} (NULL: none).
 * Sets *held to the dict held afterwards (a new reference): `old` itself when every group's
 * held list stays (unchanged, or changed by a set at commit), else a new dict.
 */
static int diff_request(Diff *d, PyObject *names, Py_ssize_t row, PyObject *old, PyObject *lists,
                        PyObject **held)
{
    *held = NULL;
    Py_ssize_t G = PyTuple_GET_SIZE(names);
    if (!PyDict_CheckExact(lists) || PyDict_GET_SIZE(lists) != G)
        return DECLINE;
    if (old && (!PyDict_CheckExact(old) || PyDict_GET_SIZE(old) != G))
        return DECLINE;
    PyObject *small[16], **copies = G <= 16 ? small : PyMem_Malloc((size_t)G * sizeof(PyObject *));
    if (!copies) {
        PyErr_NoMemory();
        return ERROR;
    }
    Py_ssize_t at = 0, old_at = 0, g = 0;
    PyObject *key, *ids, *was = NULL;
    int r = 0, replaced = old == NULL;
    for (; !r && PyDict_Next(lists, &at, &key, &ids); g++) {
        PyObject *name = PyTuple_GET_ITEM(names, g);
        if (!same_name(key, name)) {
            r = DECLINE;
            break;
        }
        if (old && !(was = held_list(old, name, &old_at, &r)))
            break;
        r = diff_row(d, g, row, was, ids, &copies[g]);
        if (r)
            break;
        replaced |= copies[g] != was;
    }
    if (!r && !replaced) {
        Py_INCREF(old);
        *held = old;
    } else if (!r) {
        PyObject *dict = *held = PyDict_New();
        for (Py_ssize_t i = 0; i < G && !r; i++)
            r = !dict || PyDict_SetItem(dict, PyTuple_GET_ITEM(names, i), copies[i]) ? ERROR : 0;
        if (r) {
            Py_XDECREF(dict);
            *held = NULL;
        }
    }
    for (Py_ssize_t i = 0; i < g; i++) /* the copies made (g: the groups diffed in full) */
        Py_DECREF(copies[i]);
    if (copies != small)
        PyMem_Free(copies);
    return r;
}

static PyObject *TAGS[5]; /* by record kind: -, "w", "a", "s", "t" */

/* A list of the n words at w as ints. */
static PyObject *int_list(const uint32_t *w, Py_ssize_t n)
{
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *x = PyLong_FromLong((long)w[i]);
        if (!x) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, x);
    }
    return out;
}

/* One record as a blockprep.wire operation. */
static PyObject *record_op(const uint32_t *w)
{
    uint32_t kind = w[0], n = w[3];
    PyObject *tag = TAGS[kind];
    if (kind == R_TRUNCATE)
        return Py_BuildValue("[On]", tag, (Py_ssize_t)n);
    if (kind == R_SET) {
        PyObject *at = int_list(w + 4, n), *ids = at ? int_list(w + 4 + n, n) : NULL;
        if (!ids) {
            Py_XDECREF(at);
            return NULL;
        }
        return Py_BuildValue("[ONN]", tag, at, ids);
    }
    return Py_BuildValue("[ON]", tag, int_list(w + 4, n));
}

/* The records of d as blockprep.wire's rows: {request: [op, ...]} (flat) or
 * {request: {group: [op, ...]}}, in record order. */
static PyObject *ops_rows(const Diff *d, PyObject *requests, PyObject *names)
{
    PyObject *rows = PyDict_New();
    for (Py_ssize_t i = 0; rows && i < d->out.n;) {
        const uint32_t *w = d->out.w + i;
        PyObject *request = PyList_GET_ITEM(requests, w[2]);
        PyObject *into = rows, *key = request, *ops, *op;
        if (names != Py_None) { /* the request's {group: ops} */
            if (!(into = PyDict_GetItemWithError(rows, request))) {
                if (PyErr_Occurred() || !(into = PyDict_New()) ||
                    PyDict_SetItem(rows, request, into) < 0) {
                    Py_XDECREF(into);
                    goto error;
                }
                Py_DECREF(into); /* rows holds it */
            }
            key = PyTuple_GET_ITEM(names, w[1]);
        }
        if (!(ops = PyDict_GetItemWithError(into, key))) {
            if (PyErr_Occurred() || !(ops = PyList_New(0)) || PyDict_SetItem(into, key, ops) < 0) {
                Py_XDECREF(ops);
                goto error;
            }
            Py_DECREF(ops); /* into holds it */
        }
        if (!(op = record_op(w)) || PyList_Append(ops, op) < 0) {
            Py_XDECREF(op);
            goto error;
        }
        Py_DECREF(op);
        i += 4 + bk_record_width((int32_t)w[0], (int32_t)w[3]);
    }
    return rows;
error:
    Py_DECREF(rows);
    return NULL;
}

/* The records as the little-endian payload. */
static PyObject *payload(const Diff *d)
{
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(d->out.n * 4));
    if (!data)
        return NULL;
    unsigned char *b = (unsigned char *)PyBytes_AS_STRING(data);
#if PY_LITTLE_ENDIAN
    if (d->out.n)
        memcpy(b, d->out.w, (size_t)d->out.n * 4);
#else
    for (Py_ssize_t i = 0; i < d->out.n; i++) {
        uint32_t v = d->out.w[i];
        b[4 * i] = (unsigned char)v, b[4 * i + 1] = (unsigned char)(v >> 8);
        b[4 * i + 2] = (unsigned char)(v >> 16), b[4 * i + 3] = (unsigned char)(v >> 24);
    }
#endif
    return data;
}

/* diff_lists(held, request_ids, block_lists, names, as_ops=False)
 *     -> (data or rows, count, new_held) | None */
static PyObject *diff_lists(PyObject *module, PyObject *args)
{
    PyObject *held, *requests, *lists, *names;
    int as_ops = 0;
    if (!PyArg_ParseTuple(args, "OOOO|p", &held, &requests, &lists, &names, &as_ops))
        return NULL;
    if (!PyDict_CheckExact(held) || !PyList_CheckExact(requests) || !PyList_CheckExact(lists) ||
        PyList_GET_SIZE(lists) != PyList_GET_SIZE(requests) ||
        (names != Py_None && !PyTuple_CheckExact(names)))
        Py_RETURN_NONE;
    Py_ssize_t A = PyList_GET_SIZE(requests);
    if (names != Py_None) /* group names: exact str, so no lookup runs a key's __eq__ */
        for (Py_ssize_t g = 0; g < PyTuple_GET_SIZE(names); g++)
            if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, g)))
                Py_RETURN_NONE;
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(held, &at, &key, &value)) /* every lookup below compares plain keys */
        if (!plain_key(key))
            Py_RETURN_NONE;
    Diff d = {0};
    PyObject *new_held = PyDict_New();
    PyObject *result = NULL;
    int r = new_held ? 0 : ERROR;
    for (Py_ssize_t row = 0; row < A && !r; row++) {
        PyObject *request = PyList_GET_ITEM(requests, row);
        PyObject *now = PyList_GET_ITEM(lists, row);
        if (!plain_key(request)) {
            r = DECLINE;
            break;
        }
        PyObject *old = PyDict_GetItemWithError(held, request);
        if (!old && PyErr_Occurred()) {
            r = ERROR;
            break;
        }
        if (PyDict_Contains(new_held, request)) { /* a repeated request: the caller's rule */
            r = DECLINE;
            break;
        }
        PyObject *copy = NULL;
        if (names == Py_None) {
            if (old && !PyList_CheckExact(old))
                r = DECLINE;
            else
                r = diff_row(&d, 0, row, old, now, &copy);
        } else {
            r = diff_request(&d, names, row, old, now, &copy);
        }
        if (!r) {
            r = PyDict_SetItem(new_held, request, copy) ? ERROR : 0;
            Py_DECREF(copy);
        }
    }
    if (!r) {
        PyObject *out = as_ops ? ops_rows(&d, requests, names) : payload(&d);
        if (out)
            result = Py_BuildValue("(NnO)", out, d.count, new_held);
        if (result) { /* commit: the sets' ids into the held copies (item swaps, no failure) */
            for (Py_ssize_t i = 0; i < d.ncells; i++) {
                Cell *c = &d.cells[i];
                PyObject *was = PyList_GET_ITEM(c->list, c->at);
                Py_INCREF(c->value);
                PyList_SET_ITEM(c->list, c->at, c->value);
                Py_DECREF(was); /* an int: its deallocation runs no Python code */
            }
        }
    } else if (r == DECLINE) {
        result = Py_None;
        Py_INCREF(result);
    }
    Py_XDECREF(new_held);
    PyMem_Free(d.out.w);
    PyMem_Free(d.cells);
    PyMem_Free(d.pos);
    return result;
}

static PyMethodDef differ_methods[] = {
    {"diff_lists", (PyCFunction)diff_lists, METH_VARARGS,
     "diff_lists(held, request_ids, block_lists, names, as_ops=False) -> (data or rows, count, "
     "new_held), or None for a step it does not take (nothing changed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef differ_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_differ",
    .m_doc = "The block-list encoders' compiled step (see blockprep/events.py and wire.py).",
    .m_size = -1,
    .m_methods = differ_methods,
};

PyMODINIT_FUNC PyInit__differ(void)
{
    static const char *tags[5] = {"", "w", "a", "s", "t"};
    for (int t = 0; t < 5; t++)
        if (!TAGS[t] && !(TAGS[t] = PyUnicode_InternFromString(tags[t])))
            return NULL;
    return PyModule_Create(&differ_module);
}
