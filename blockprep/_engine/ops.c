/*
 * ops.c: GroupKernel.stage's ops items (see blockprep/_engine/twin.py for the rules): a step's rows
 * given as blockprep.wire operations or packed records, applied to the ids each row's request
 * held, then checked and recorded by stage.c's row step. Nothing persistent changes.
 */
#include "stage.h"

/* ---- rows given as blockprep.wire operations ------------------------------------------------- */

static PyObject *TAGS[4]; /* "w", "a", "s", "t" */

int bk_init_tags(void)
{
    static const char *tags[4] = {"w", "a", "s", "t"};
    for (int t = 0; t < 4; t++)
        if (!TAGS[t] && !(TAGS[t] = PyUnicode_InternFromString(tags[t])))
            return -1;
    return 0;
}
enum { OP_W, OP_A, OP_S, OP_T, OP_BAD };

/* The tag of op as wire.tag_of reads it: op[0], a str (a subclass compared by value) equal to
 * "w", "a", "s" or "t"; OP_BAD for anything else (no __eq__ of the caller's runs). */
static int op_tag(PyObject *op)
{
    if (!PyList_Check(op) || PyList_GET_SIZE(op) == 0)
        return OP_BAD;
    PyObject *tag = PyList_GET_ITEM(op, 0);
    for (int t = 0; t < 4; t++)
        if (tag == TAGS[t] || (PyUnicode_Check(tag) && PyUnicode_Compare(tag, TAGS[t]) == 0))
            return t;
    return OP_BAD;
}

/* Cells [from, n) of s->objs set to new references to the items of ids (an exact list). */
static int put_items(Scratch *s, Py_ssize_t at, PyObject *ids)
{
    Py_ssize_t k = PyList_GET_SIZE(ids);
    if (bk_scratch_row(s, at + k) < 0)
        return -1;
    bk_scratch_drop(s, at);
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *x = PyList_GET_ITEM(ids, i);
        Py_INCREF(x);
        s->objs[at + i] = x;
        s->odd |= !PyLong_CheckExact(x);
    }
    s->nobjs = at + k;
    return 0;
}

/* Apply ops to the cells, as wire.apply_ops: *n the length (-1: nothing held). Returns 0, 1 for
 * ops apply_ops rejects, -1 with an exception. */
static int apply_ops(Scratch *s, PyObject *ops, Py_ssize_t *n)
{
    if (!PyList_Check(ops) || PyList_GET_SIZE(ops) == 0)
        return 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        Py_INCREF(op);
        int tag = op_tag(op), status = 0;
        Py_ssize_t size = tag == OP_BAD ? 0 : PyList_GET_SIZE(op);
        if (*n < 0 && tag != OP_W) {
            status = 1;
        } else if ((tag == OP_W || tag == OP_A) && size == 2) {
            PyObject *ids = PyList_GET_ITEM(op, 1);
            if (!PyList_CheckExact(ids))
                status = 1;
            else if (put_items(s, tag == OP_W ? 0 : *n, ids) < 0)
                status = -1;
            else
                *n = s->nobjs;
        } else if (tag == OP_S && size == 3) {
            PyObject *positions = PyList_GET_ITEM(op, 1), *values = PyList_GET_ITEM(op, 2);
            Py_ssize_t k = PyList_CheckExact(positions) ? PyList_GET_SIZE(positions) : -1;
            if (k < 0 || !PyList_CheckExact(values) || PyList_GET_SIZE(values) != k)
                status = 1;
            for (Py_ssize_t j = 0; status == 0 && j < k; j++) {
                PyObject *q = PyList_GET_ITEM(positions, j);
                long long p = PyLong_CheckExact(q) ? exact_value(q) : -1;
                if (p < 0 || p >= *n) {
                    status = 1;
                    break;
                }
                for (Py_ssize_t e = 0; e < j && k > 1; e++) /* positions must not repeat */
                    if (exact_value(PyList_GET_ITEM(positions, e)) == p)
                        status = 1;
            }
            for (Py_ssize_t j = 0; status == 0 && j < k; j++) {
                Py_ssize_t p = (Py_ssize_t)exact_value(PyList_GET_ITEM(positions, j));
                PyObject *x = PyList_GET_ITEM(values, j);
                Py_INCREF(x);
                Py_XSETREF(s->objs[p], x);
                s->odd |= !PyLong_CheckExact(x);
            }
        } else if (tag == OP_T && size == 2) {
            PyObject *q = PyList_GET_ITEM(op, 1);
            long long length = PyLong_CheckExact(q) ? exact_value(q) : -1;
            if (length < 0 || length > *n)
                status = 1;
            else {
                bk_scratch_drop(s, (Py_ssize_t)length);
                *n = (Py_ssize_t)length;
            }
        } else {
            status = 1;
        }
        Py_DECREF(op);
        if (status)
            return status;
    }
    return *n < 0 ? 1 : 0;
}

/* ---- packed records (blockprep.packed): int32 words read in place, no int object per id ---- */

/* Apply the records at the word offsets of item (a tuple of ints) to the cells, as the ops
 * packed.record_op makes of them (the ids are ints by construction: cells hold their values,
 * no objects). Returns 0, 1 for records apply_ops would reject, -1 with ValueError for an
 * offset that is no record of data (a caller's bug: the message was checked). */
static int apply_records(Scratch *s, const unsigned char *data, Py_ssize_t words,
                         PyObject *item, Py_ssize_t r, Py_ssize_t *n)
{
    const Py_ssize_t k = PyTuple_GET_SIZE(item);
    if (k == 0)
        return 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *o = PyTuple_GET_ITEM(item, i);
        long long at = PyLong_CheckExact(o) ? exact_value(o) : -1;
        int32_t kind = 0, count = -1;
        if (at >= 0 && at <= words - R_HEADER) {
            kind = bk_word(data, at);
            count = bk_word(data, at + 3);
        }
        long long width = bk_record_width(kind, count);
        if (kind < R_WHOLE || kind > R_TRUNCATE || count < 0 || at + R_HEADER + width > words) {
            PyErr_Format(PyExc_ValueError, "row %zd: no packed record at word %R", r, o);
            return -1;
        }
        const Py_ssize_t v = (Py_ssize_t)at + R_HEADER, c = count;
        if (*n < 0 && kind != R_WHOLE)
            return 1;
        if (kind == R_WHOLE || kind == R_APPEND) {
            Py_ssize_t from = kind == R_WHOLE ? 0 : *n;
            if (bk_scratch_row(s, from + c) < 0)
                return -1;
            bk_scratch_drop(s, from);
            for (Py_ssize_t j = 0; j < c; j++) {
                s->objs[from + j] = NULL; /* a value cell: checked as a changed id */
                s->vals[from + j] = bk_word(data, v + j);
            }
            s->nobjs = *n = from + c;
        } else if (kind == R_SET) {
            for (Py_ssize_t j = 0; j < c; j++) {
                int32_t p = bk_word(data, v + j);
                if (p < 0 || p >= *n)
                    return 1;
                for (Py_ssize_t e = 0; e < j; e++) /* positions must not repeat */
                    if (bk_word(data, v + e) == p)
                        return 1;
            }
            for (Py_ssize_t j = 0; j < c; j++) {
                Py_ssize_t p = bk_word(data, v + j);
                Py_CLEAR(s->objs[p]);
                s->vals[p] = bk_word(data, v + c + j);
            }
        } else {
            if (c > *n)
                return 1;
            bk_scratch_drop(s, c);
            *n = c;
        }
    }
    return 0;
}

/* The ids an append or a set names are new ids: integers (convert) whatever the row held, in op
 * order; a TYPE fault names the first that is not. Returns 0, 1 with *fault_out, -1. */
static int check_set_ids(PyObject *ops, Py_ssize_t r, PyObject *convert, PyObject **fault_out)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        if (!PyList_Check(op) || PyList_GET_SIZE(op) < 2)
            continue;
        Py_INCREF(op);
        int tag = op_tag(op), status = 0;
        PyObject *ids = PyList_GET_ITEM(op, PyList_GET_SIZE(op) - 1); /* it holds two or more */
        if ((tag == OP_A || tag == OP_S) && PyList_CheckExact(ids)) {
            Py_INCREF(ids);
            for (Py_ssize_t j = 0; status == 0 && j < PyList_GET_SIZE(ids); j++) {
                PyObject *x = PyList_GET_ITEM(ids, j);
                if (PyLong_CheckExact(x))
                    continue;
                Py_INCREF(x);
                PyObject *c = PyObject_CallOneArg(convert, x);
                if (!c)
                    status = -1;
                else if (!PyLong_CheckExact(c))
                    status = (*fault_out = bk_fault(F_TYPE, r, x)) ? 1 : -1;
                Py_XDECREF(c);
                Py_DECREF(x);
            }
            Py_DECREF(ids);
        }
        Py_DECREF(op);
        if (status)
            return status;
    }
    return 0;
}

/* ---- one change to a row that stays, decided in one pass ------------------------------------ */

/* A record of row r (a request's row that stays) holding n ids marked by change (MARK words),
 * its first ids those row r holds (min(n, held length)); the record's ids, for the caller to
 * write the rest. NULL with MemoryError. */
static int32_t *held_record(GroupKernel *self, Scratch *s, Py_ssize_t r, Py_ssize_t n,
                            const int32_t *change)
{
    const Py_ssize_t m = self->lens[r] < n ? self->lens[r] : n;
    int32_t *rec = bk_scratch_record(s, n);
    if (!rec)
        return NULL;
    rec[0] = (int32_t)r;
    rec[1] = (int32_t)n;
    rec[2] = change[0] | (self->distinct ? CHECKED : 0);
    memcpy(rec + 3, change + 1, sizeof(int32_t) * (MARK - 1)); /* count, p0..p3 */
    memcpy(rec + HEADER, self->held + r * self->stride, sizeof(int32_t) * (size_t)m);
    return rec + HEADER;
}

/* What the general path decides for a set of id x at position p of row r (which stays and holds
 * its ids), when it takes it without a fault: no record (x is the held id) or one record marking
 * position p. Returns 0 (decided), 1 (not this case, or a fault: the general path decides and
 * words it), -1 with an exception. */
static int stage_one_set(GroupKernel *self, Scratch *s, Py_ssize_t r, long long p, long long x)
{
    const Py_ssize_t m = self->lens[r];
    if (m < 0 || m < self->shortest || m > self->width || p < 0 || p >= m)
        return 1;
    const int32_t *held = self->held + r * self->stride;
    if (x == held[p])
        return 0; /* it holds exactly what it held */
    if (x == BIG || x < 0 || x >= self->limit)
        return 1; /* a RANGE fault */
    if (self->distinct) {
        if (!self->checked[r])
            return 1; /* the full repeat check */
        for (Py_ssize_t q = 0; q < m; q++)
            if (held[q] == x && q != p)
                return 1; /* a REPEAT fault */
    }
    const int32_t change[MARK] = {POSITIONS, 1, (int32_t)p, 0, 0, 0};
    int32_t *ids = held_record(self, s, r, m, change);
    if (!ids)
        return -1;
    ids[p] = (int32_t)x;
    return 0;
}

/* The (p, x) of a row's single set, when item is exactly one: one packed record of one
 * position (data given), or [["s", [p], [x]]] of exact lists and ints. 1 when it is, else 0. */
static int one_set_of(PyObject *item, const unsigned char *data, Py_ssize_t words,
                      long long *p, long long *x)
{
    if (data && PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 1) {
        PyObject *o = PyTuple_GET_ITEM(item, 0);
        long long at = PyLong_CheckExact(o) ? exact_value(o) : -1;
        if (at < 0 || at > words - R_HEADER - 2 || bk_word(data, at) != R_SET ||
            bk_word(data, at + 3) != 1)
            return 0;
        *p = bk_word(data, at + R_HEADER);
        *x = bk_word(data, at + R_HEADER + 1);
        return 1;
    }
    if (!PyList_CheckExact(item) || PyList_GET_SIZE(item) != 1)
        return 0;
    PyObject *op = PyList_GET_ITEM(item, 0);
    if (!PyList_CheckExact(op) || PyList_GET_SIZE(op) != 3)
        return 0;
    PyObject *tag = PyList_GET_ITEM(op, 0), *ps = PyList_GET_ITEM(op, 1);
    PyObject *xs = PyList_GET_ITEM(op, 2);
    if (!PyUnicode_CheckExact(tag) || (tag != TAGS[OP_S] && PyUnicode_Compare(tag, TAGS[OP_S])))
        return 0;
    if (!PyList_CheckExact(ps) || PyList_GET_SIZE(ps) != 1 || !PyList_CheckExact(xs) ||
        PyList_GET_SIZE(xs) != 1)
        return 0;
    PyObject *po = PyList_GET_ITEM(ps, 0), *xo = PyList_GET_ITEM(xs, 0);
    if (!PyLong_CheckExact(po) || !PyLong_CheckExact(xo))
        return 0;
    *p = exact_value(po);
    *x = exact_value(xo);
    return 1;
}

/* The ids list of item when it is exactly [["a", ids]] of an exact list; else NULL. */
static PyObject *one_append_of(PyObject *item)
{
    if (!PyList_CheckExact(item) || PyList_GET_SIZE(item) != 1)
        return NULL;
    PyObject *op = PyList_GET_ITEM(item, 0);
    if (!PyList_CheckExact(op) || PyList_GET_SIZE(op) != 2)
        return NULL;
    PyObject *tag = PyList_GET_ITEM(op, 0), *ids = PyList_GET_ITEM(op, 1);
    if (!PyUnicode_CheckExact(tag) || (tag != TAGS[OP_A] && PyUnicode_Compare(tag, TAGS[OP_A])))
        return NULL;
    return PyList_CheckExact(ids) ? ids : NULL;
}

/* What the general path decides for ids appended to row r (which stays and holds its ids), when
 * it takes them without a fault: no record (nothing appended) or one record marking the new
 * positions. Reads the held row once and runs no Python code. Returns 0 (decided), 1 (not this
 * case, or a fault: the general path decides and words it), -1 with an exception. */
static int stage_append(GroupKernel *self, Scratch *s, Py_ssize_t r, PyObject *ids)
{
    const Py_ssize_t m = self->lens[r], k = PyList_GET_SIZE(ids), n = m + k;
    if (m < 0 || n > self->width || n < self->shortest)
        return 1;
    if (k == 0)
        return 0; /* it holds exactly what it held */
    const int32_t *held = self->held + r * self->stride;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *o = PyList_GET_ITEM(ids, i);
        long long x = PyLong_CheckExact(o) ? exact_value(o) : BIG;
        if (x == BIG || x < 0 || x >= self->limit)
            return 1; /* a TYPE or RANGE fault */
        if (self->distinct) {
            if (!self->checked[r])
                return 1; /* the full repeat check */
            for (Py_ssize_t q = 0; q < m; q++)
                if (held[q] == x)
                    return 1; /* a REPEAT fault */
            for (Py_ssize_t j = 0; j < i; j++)
                if (exact_value(PyList_GET_ITEM(ids, j)) == x)
                    return 1;
        }
    }
    int32_t change[MARK] = {WHOLE, 0, 0, 0, 0, 0};
    if (!self->ring) { /* a ring row's length changes: whole */
        Py_ssize_t differ = 0;
        int32_t lo = -1, hi = -1;
        for (Py_ssize_t p = m; p < n; p++)
            bk_note_differ((int32_t)p, &differ, change, &lo, &hi);
        bk_close_mark(self, differ, lo, hi, change);
    }
    if (bk_grow_held(self, n) < 0) /* changes no value */
        return -1;
    int32_t *out = held_record(self, s, r, n, change);
    if (!out)
        return -1;
    for (Py_ssize_t i = 0; i < k; i++)
        out[m + i] = (int32_t)exact_value(PyList_GET_ITEM(ids, i));
    return 0;
}

/* One visited row of a stage of ops items (see bk_stage_item in stage.h). */
int bk_stage_item(GroupKernel *self, Scratch *s, Py_ssize_t r, long long src, PyObject *item,
                  const unsigned char *data, Py_ssize_t words, PyObject *convert,
                  PyObject **fault_out)
{
    int status;
    long long one_p, one_x;
    if (src == PADDING) { /* a padding row: its ids, by value */
        if (!PyList_CheckExact(item)) {
            PyErr_Format(PyExc_TypeError, "row %zd must be a list, got %s", r, bk_type_name(item));
            return -1;
        }
        return bk_stage_row(self, s, r, item, PyList_GET_SIZE(item), src, convert, fault_out, 0);
    }
    if (src == r && one_set_of(item, data, words, &one_p, &one_x) &&
        (status = stage_one_set(self, s, r, one_p, one_x)) <= 0)
        return status; /* decided: the steady step (0), or an exception (-1) */
    PyObject *appended = src == r && !data ? one_append_of(item) : NULL;
    if (appended && (status = stage_append(self, s, r, appended)) <= 0)
        return status; /* decided: ids appended (0), or an exception (-1) */
    /* The cells start as the ids the request held (none for a new request). */
    Py_ssize_t n = -1;
    bk_scratch_drop(s, 0);
    s->odd = 0;
    status = 0;
    if (src >= 0 && self->lens[src] >= 0) {
        n = self->lens[src];
        status = bk_scratch_row(s, n);
        for (Py_ssize_t p = 0; status == 0 && p < n; p++) {
            s->objs[p] = NULL;
            s->vals[p] = self->held[src * self->stride + p];
        }
        s->nobjs = n;
    }
    const int records = data && PyTuple_CheckExact(item); /* else: malformed ops */
    if (status == 0 && records)
        status = apply_records(s, data, words, item, r, &n);
    else if (status == 0 && item != Py_None)
        status = apply_ops(s, item, &n);
    else if (status == 0 && n < 0)
        status = 1; /* a new request without its whole list */
    if (status == 1)
        *fault_out = Py_BuildValue("(O(inO))", Py_None, F_OPS, r, Py_None);
    else if (status == 0 && item != Py_None && !records)
        status = check_set_ids(item, r, convert, fault_out);
    if (status == 0) /* held cells keep their value in s->vals; the rest read from s->objs */
        status = bk_stage_row(self, s, r, NULL, n, src, convert, fault_out, 0);
    return status == 1 && !*fault_out ? -1 : status;
}
