/* stage.h: what stage.c (GroupKernel.stage, a row's checks and plan record) and ops.c
 * (GroupKernel.stage_ops) share: the scratch of one stage call and the row step. */
#ifndef BLOCKPREP_STAGE_H
#define BLOCKPREP_STAGE_H

#include "kernel.h"

typedef struct {
    int32_t *out; /* the plan's records */
    Py_ssize_t used, cap;
    long long *vals;  /* one row's ids */
    PyObject **objs;  /* a row built from ops: its id objects (owned), NULL for a held id */
    Py_ssize_t nobjs; /* objs[0..nobjs) hold references */
    Py_ssize_t *chg;  /* its changed positions */
    uint64_t *keys;   /* (value, position) pairs for the repeat check */
    Py_ssize_t row_cap;
} Scratch;

void bk_scratch_drop(Scratch *s, Py_ssize_t from);
void bk_scratch_free(Scratch *s);
int bk_scratch_row(Scratch *s, Py_ssize_t n);
int bk_scratch_reserve(Scratch *s, Py_ssize_t need);
int32_t *bk_scratch_record(Scratch *s, Py_ssize_t n);
int bk_read_src(GroupKernel *self, PyObject *srcs, long long r, long long *src);
PyObject *bk_finished_plan(Scratch *s);
int bk_stage_row(GroupKernel *self, Scratch *s, Py_ssize_t r, PyObject *lst, Py_ssize_t n,
                 long long src, PyObject *convert, PyObject **fault_out);

#endif
