/* graphjit's replay lane, the guard scan (graphjit/guard_set.py, GuardSet.holds): every guarded value of a graph read
 * from its container and compared with the value it had at capture, in one C call, without the tuple each getter
 * builds and the list the Python expression `list(map(operator.call, getters, containers)) != expected` builds.
 *
 * It gives GuardSet.holds's answer for those values (its expression compares the typed ones, guardable.typed, by
 * marshal's bytes: typed_same here; 1, 1.0 and True differ, 0.0 and -0.0 too), with one difference: it reads and
 * compares value by value and stops at the first that differs (the Python expression reads every value, then compares), so a read
 * after a differing value is not made, and Python code run by one comparison (an __eq__) may change what a later read
 * finds.  A read or
 * a comparison that raises an Exception is a value that does not hold (0), as GuardSet.holds's `except Exception`
 * makes it; anything else (KeyboardInterrupt) is the call's (NULL).
 *
 * Memory: no state of its own and no lock; the lists passed in are the caller's (held by its frame for the call).
 * Every object read from them, a container, a key list, an expected value and each value read, is held (a new
 * reference) across the comparisons that use it: `==` may run Python code that rebinds a guarded container or
 * deletes the value read, and must not free what is still compared.  Sizes are read again at each step: a list that
 * shrinks meanwhile fails the scan (0), never is read past its end. */
#include "lane.h"

enum { SCAN_ITEM = 0, SCAN_ATTR = 1, SCAN_CALL = 2, SCAN_HAS = 3 }; /* GuardSet.kinds: c[key], getattr(c, key),
                                                                       getter(c), getter.name in c (HasKey) */

static PyObject *s_name; /* "name", interned by lane_guards_add */
/* Whether want is a value GuardSet compares by type and bits (guardable.typed): an int, float, complex, bool, str or
 * None of exactly that type, or an exact tuple of such values. */
static int is_typed(PyObject *v) {
  if (PyTuple_CheckExact(v)) {
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(v); j++)
      if (!is_typed(PyTuple_GET_ITEM(v, j))) return 0;
    return 1;
  }
  return PyLong_CheckExact(v) || PyFloat_CheckExact(v) || PyComplex_CheckExact(v) || PyBool_Check(v) ||
         PyUnicode_CheckExact(v) || v == Py_None;
}

/* GuardSet's comparison of a value read (got) with the value at capture (want), guardable.same_value: a typed want
 * holds for a value of exactly its type with the same bits (as marshal writes them: a float's or complex's doubles
 * bit for bit, so 0.0 != -0.0 and a NaN equals the same NaN; an int's, a str's value; a tuple item by item), any
 * other for the same object or an == one.  1 holds, 0 not, -1 error. */
static int typed_same(PyObject *got, PyObject *want) {
  if (got == want) return 1;
  if (!is_typed(want)) return same(got, want);
  PyTypeObject *tp = Py_TYPE(want);
  if (Py_TYPE(got) != tp) return 0;
  if (tp == &PyFloat_Type) {
    double a = PyFloat_AS_DOUBLE(got), b = PyFloat_AS_DOUBLE(want);
    return memcmp(&a, &b, sizeof a) == 0;
  }
  if (tp == &PyComplex_Type) {
    Py_complex a = PyComplex_AsCComplex(got), b = PyComplex_AsCComplex(want);
    return memcmp(&a.real, &b.real, sizeof a.real) == 0 && memcmp(&a.imag, &b.imag, sizeof a.imag) == 0;
  }
  if (tp == &PyTuple_Type) {
    Py_ssize_t n = PyTuple_GET_SIZE(want);
    if (PyTuple_GET_SIZE(got) != n) return 0;
    for (Py_ssize_t j = 0; j < n; j++) {
      int r = typed_same(PyTuple_GET_ITEM(got, j), PyTuple_GET_ITEM(want, j));
      if (r != 1) return r;
    }
    return 1;
  }
  return same(got, want); /* an int, a str (exact types: == compares their values), a bool */
}

/* c[key] (kind SCAN_ITEM) or getattr(c, key) (SCAN_ATTR) compared with want: 1 holds, 0 not, -1 error. */
static int read_same(int kind, PyObject *c, PyObject *key, PyObject *want) {
  PyObject *got;
  if (kind == SCAN_ITEM && PyDict_CheckExact(c)) { /* a plain dict: no __getitem__ or __missing__ of its own */
    got = PyDict_GetItemWithError(c, key);
    if (got == NULL) return PyErr_Occurred() ? swallowed() : 0;
    Py_INCREF(got);
  } else {
    got = kind == SCAN_ITEM ? PyObject_GetItem(c, key) : PyObject_GetAttr(c, key);
    if (got == NULL) return swallowed();
  }
  int r = typed_same(got, want);
  Py_DECREF(got);
  return r;
}

/* One container's values: its getter's (SCAN_CALL), or each of its keys' (want: the one value, or the tuple of one
 * value per key, as the Python getter returns them). */
static int container_same(int kind, PyObject *getter, PyObject *c, PyObject *keys, PyObject *want) {
  if (kind == SCAN_HAS) { /* HasKey(name)(c): `name in c`, a plain dict's by its own lookup */
    PyObject *name = PyObject_GetAttr(getter, s_name);
    if (name == NULL) return swallowed();
    int r = PyDict_CheckExact(c) ? PyDict_Contains(c, name) : PySequence_Contains(c, name);
    Py_DECREF(name);
    if (r < 0) return swallowed();
    return same(r ? Py_True : Py_False, want);
  }
  if (kind == SCAN_CALL) {
    PyObject *got = PyObject_CallOneArg(getter, c);
    if (got == NULL) return swallowed();
    int r = typed_same(got, want);
    Py_DECREF(got);
    return r;
  }
  Py_ssize_t m = PyList_GET_SIZE(keys);
  if (m == 1) {
    PyObject *key = PyList_GET_ITEM(keys, 0);
    Py_INCREF(key); /* a lookup may run __eq__ (a hash collision), which may empty keys */
    int r = read_same(kind, c, key, want);
    Py_DECREF(key);
    return r;
  }
  if (!PyTuple_CheckExact(want) || PyTuple_GET_SIZE(want) != m) return 0; /* a tuple never equals it */
  for (Py_ssize_t j = 0; j < m; j++) {
    if (j >= PyList_GET_SIZE(keys)) return 0; /* the keys changed under the scan: not what the guards were made for */
    PyObject *key = PyList_GET_ITEM(keys, j);
    Py_INCREF(key);
    int r = read_same(kind, c, key, PyTuple_GET_ITEM(want, j)); /* want: a tuple, held by the caller */
    Py_DECREF(key);
    if (r != 1) return r;
  }
  return 1;
}

/* guards_hold(kinds, getters, containers, keys, expected) -> bool: see the top of this file. */
static PyObject *guards_hold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyBytes_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
      !PyList_Check(args[3]) || !PyList_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "guards_hold(kinds: bytes, getters: list, containers: list, keys: list, "
                                     "expected: list)");
    return NULL;
  }
  PyObject *kinds = args[0], *getters = args[1], *containers = args[2], *keys = args[3], *expected = args[4];
  const char *kind = PyBytes_AS_STRING(kinds);
  Py_ssize_t n = PyBytes_GET_SIZE(kinds);
  for (Py_ssize_t i = 0; i < n; i++) {
    if (i >= PyList_GET_SIZE(getters) || i >= PyList_GET_SIZE(containers) || i >= PyList_GET_SIZE(keys) ||
        i >= PyList_GET_SIZE(expected))
      Py_RETURN_FALSE; /* a list changed under the scan: not a state the guards were made for */
    PyObject *g = PyList_GET_ITEM(getters, i), *c = PyList_GET_ITEM(containers, i), *k = PyList_GET_ITEM(keys, i),
             *w = PyList_GET_ITEM(expected, i);
    if (kind[i] != SCAN_CALL && kind[i] != SCAN_HAS && !PyList_Check(k)) Py_RETURN_FALSE; /* keys of a container: a list (GuardSet) */
    Py_INCREF(g);
    Py_INCREF(c);
    Py_INCREF(k);
    Py_INCREF(w);
    int r = container_same(kind[i], g, c, k, w);
    Py_DECREF(g);
    Py_DECREF(c);
    Py_DECREF(k);
    Py_DECREF(w);
    if (r < 0) return NULL;
    if (r == 0) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

static PyMethodDef guard_methods[] = {
    {"guards_hold", (PyCFunction)(void (*)(void))guards_hold, METH_FASTCALL,
     "guards_hold(kinds, getters, containers, keys, expected) -> whether every guarded value holds "
     "(graphjit/guard_set.py, GuardSet.holds)"},
    {NULL, NULL, 0, NULL},
};

int lane_guards_add(PyObject *m) {
  if (s_name == NULL && (s_name = PyUnicode_InternFromString("name")) == NULL) return -1;
  return PyModule_AddFunctions(m, guard_methods);
}
