/* graphjit's replay lane: what lane.c (the plans, the front), lane_checks.c (the checks that sign a call like the
 * last one) and lane_guards.c (the guard scan) share.  Every function here has hidden visibility (the library is
 * built with -fvisibility=hidden). */
#ifndef GRAPHJIT_LANE_H
#define GRAPHJIT_LANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define LANE_MAX 256 /* tensors in one call the lane serves; a call with more takes the Python path */

#if PY_VERSION_HEX >= 0x030D0000
#define LOOKUP_ATTR(o, n, r) PyObject_GetOptionalAttr((o), (n), (r))
#else
#define LOOKUP_ATTR(o, n, r) _PyObject_LookupAttr((o), (n), (r))
#endif

extern PyObject *s_settings, *s_training; /* "_settings", "training": interned by lane_checks_add */

/* What a plain call of one key looks like (keys.py: the layout of Signer.sign_plain): its arguments, its owner, the
 * framework's modes and its tensors' metadata.  Every object is borrowed from the dict it was made from (the
 * holder's refs). */
typedef struct {
  int method;
  Py_ssize_t nargs;
  PyObject *kinds;  /* per argument: None for a tensor, else (type, value) of a plain scalar */
  PyObject *types;  /* the tensor types of the key's framework (a tuple) */
  PyObject *owner;  /* None, or the function's own owner (an unbound call) */
  unsigned long long owner_id; /* a bound call: its instance's id; 0 otherwise */
  PyObject *training;          /* the owner's training flag, as keyed */
  PyObject *probes, *expected; /* the framework's modes: functions of no argument and what each must give */
  PyObject *check;             /* the tensors' metadata, called with the tensors */
  /* where the dict has them: the backends by tensor type (graphjit.backends' cache), the tensor type looked up in it
   * and the backend it must give (the framework's backend not replaced since); NULL: not checked */
  PyObject *by_type, *probe, *backend;
} Layout;

/* 1 equal, 0 not (an Exception raised by __eq__ cleared: not equal), -1 with anything else set. */
int same(PyObject *a, PyObject *b);
/* With an error set: 0 where it is an Exception (cleared: a refusal, a value that does not hold), -1 for anything
 * else (KeyboardInterrupt, SystemExit: left set, the call's). */
int swallowed(void);
/* fn(*args) made a bool: 1, 0, or -1 with an error set. */
int truthy_call(PyObject *fn, PyObject *const *args, size_t n);
/* d[name], borrowed; NULL with KeyError set. */
PyObject *item(PyObject *d, const char *name);
/* The owner and modes part of a Layout from a dict: 0, or -1 with an error set. */
int owner_modes_init(Layout *l, PyObject *d);
/* A whole Layout from a dict: its number of tensors, or -1 with an error set. */
Py_ssize_t layout_init(Layout *l, PyObject *d);
/* Whether a call's owner and the framework's modes are l's: 1, 0, or -1 with an error set. */
int owner_modes_match(const Layout *l, int prebound, PyObject *instance);
/* Whether a plain call has the layout l (its tensors gathered into tensors): 1, 0, or -1 with an error set. */
int layout_matches(const Layout *l, int prebound, PyObject *instance, PyObject *args, PyObject **tensors,
                   Py_ssize_t *n_tensors);
/* Whether o is a WalkCheck (lane.c's plans of keyword calls hold one). */
int is_walk_check(PyObject *o);
/* The interned names above made, LayoutCheck and WalkCheck readied and added to the module m: 0, or -1. */
int lane_checks_add(PyObject *m);
/* The guard scan (lane_guards.c) added to the module m: 0, or -1. */
int lane_guards_add(PyObject *m);

#endif
