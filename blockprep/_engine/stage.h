/* stage.h: what stage.c (GroupKernel.stage, a row's checks and plan record) and ops.c (stage's
 * ops items) share: the scratch of one stage call and the row steps. */
#ifndef BLOCKPREP_STAGE_H
#define BLOCKPREP_STAGE_H

#include "kernel.h"


void bk_scratch_drop(Scratch *s, Py_ssize_t from);
int bk_scratch_row(Scratch *s, Py_ssize_t n);
int bk_scratch_reserve(Scratch *s, Py_ssize_t need);
int32_t *bk_scratch_record(Scratch *s, Py_ssize_t n);
int bk_read_src(GroupKernel *self, PyObject *srcs, long long r, long long *src);
PyObject *bk_finished_plan(Scratch *s);
int bk_stage_row(GroupKernel *self, Scratch *s, Py_ssize_t r, PyObject *lst, Py_ssize_t n,
                 long long src, PyObject *convert, PyObject **fault_out, int strict);
/* Row r of a stage of ops items (ops.c): item its ops on the ids its source held (None: as they
 * were), or with data a tuple of record offsets in it, or a padding row's ids. 0 staged, 1 a
 * fault (*fault_out set), -1 an exception. */
int bk_stage_item(GroupKernel *self, Scratch *s, Py_ssize_t r, long long src, PyObject *item,
                  const unsigned char *data, Py_ssize_t words, PyObject *convert,
                  PyObject **fault_out);

#endif
