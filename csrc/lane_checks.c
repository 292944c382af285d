/* graphjit's replay lane, its signing checks (graphjit/sign_checks.py): a call checked in one C call against what the
 * Python path decided for the last call like it, so that keys.py reuses that call's key without reading the call in
 * Python.  LayoutCheck checks a plain positional call (Signer.sign_plain), WalkCheck a walked one: keyword arguments,
 * containers, objects holding tensors (Signer.sign_walk, graphjit/walk_spec.py).  Both, and the plans of lane.c,
 * check a call's owner and modes and its tensors' metadata the same way (the Layout functions below).
 *
 * Each only reads: no lock, no state of its own, so threads may call one check at once; an Exception raised while it
 * reads (a comparison, an attribute, a probe, the metadata check) is a refusal (None: the Python path meets it again
 * and says so), anything else (KeyboardInterrupt) is the call's.  The objects a check reads are borrowed from the
 * dict it was made from, which it holds (and holds once more around each call, so that Python code run by a
 * comparison cannot free them). */
#include "lane.h"

PyObject *s_settings, *s_training;

/* ---- helpers ------------------------------------------------------------------------------------------------- */

/* 1 equal, 0 not (an Exception raised by __eq__ cleared: not equal), -1 with anything else set (KeyboardInterrupt,
 * SystemExit: the call's own, never swallowed) */
int same(PyObject *a, PyObject *b) {
  if (a == b) return 1;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  return r < 0 ? swallowed() : r;
}

/* With an error set: 0 where it is an Exception (cleared), -1 for anything else (left set). */
int swallowed(void) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  PyErr_Clear();
  return 0;
}

int truthy_call(PyObject *fn, PyObject *const *args, size_t n) { /* 1, 0, or -1 with an error set */
  PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
  if (r == NULL) return -1;
  int t = PyObject_IsTrue(r);
  Py_DECREF(r);
  return t;
}

PyObject *item(PyObject *d, const char *name) { /* borrowed; NULL with KeyError set */
  PyObject *v = PyDict_GetItemString(d, name);
  if (v == NULL) PyErr_Format(PyExc_KeyError, "graphjit lane plan: missing %s", name);
  return v;
}

/* ---- a call's layout (shared by Plan and LayoutCheck) ----------------------------------------------------------- */

/* Fills the owner and modes part of l from the dict d (owner, owner_id, training, probes, expected, check, method;
 * the objects stay d's): 0, or -1 with an error set. */
int owner_modes_init(Layout *l, PyObject *d) {
#define GET(field, name)                    \
  do {                                      \
    l->field = item(d, name);               \
    if (l->field == NULL) return -1;        \
  } while (0)
  GET(owner, "owner");
  GET(training, "training");
  GET(probes, "probes");
  GET(expected, "expected");
  GET(check, "check");
#undef GET
  if (!PyTuple_Check(l->probes) || !PyTuple_Check(l->expected) ||
      PyTuple_GET_SIZE(l->probes) != PyTuple_GET_SIZE(l->expected)) {
    PyErr_SetString(PyExc_TypeError, "graphjit lane layout: probes, expected: tuples, as many expected values as "
                                     "probes");
    return -1;
  }
  PyObject *o = item(d, "method");
  if (o == NULL) return -1;
  long method = PyLong_AsLong(o);
  if (method == -1 && PyErr_Occurred()) return -1;
  l->method = method != 0;
  if ((o = item(d, "owner_id")) == NULL) return -1;
  l->owner_id = PyLong_AsUnsignedLongLong(o);
  if (PyErr_Occurred()) return -1;
  l->by_type = PyDict_GetItemString(d, "by_type"); /* optional, all three or none */
  l->probe = PyDict_GetItemString(d, "probe");
  l->backend = PyDict_GetItemString(d, "backend");
  if (l->by_type != NULL && (!PyDict_Check(l->by_type) || l->probe == NULL || l->backend == NULL)) {
    PyErr_SetString(PyExc_TypeError, "graphjit lane layout: by_type a dict, with probe and backend");
    return -1;
  }
  return 0;
}

/* Fills l from the dict d (kinds, types and what owner_modes_init reads; the objects stay d's); the number of tensors
 * of the layout, or -1 with an error set. */
Py_ssize_t layout_init(Layout *l, PyObject *d) {
  if (owner_modes_init(l, d) < 0) return -1;
  if ((l->kinds = item(d, "kinds")) == NULL || (l->types = item(d, "types")) == NULL) return -1;
  if (!PyTuple_Check(l->kinds) || !PyTuple_Check(l->types)) {
    PyErr_SetString(PyExc_TypeError, "graphjit lane layout: kinds, types: tuples");
    return -1;
  }
  l->nargs = PyTuple_GET_SIZE(l->kinds);
  Py_ssize_t n_tensors = 0;
  for (Py_ssize_t i = 0; i < l->nargs; ++i) {
    PyObject *k = PyTuple_GET_ITEM(l->kinds, i);
    if (k == Py_None) {
      ++n_tensors;
    } else if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 2) {
      PyErr_SetString(PyExc_TypeError, "graphjit lane layout: a scalar's kind is (type, value)");
      return -1;
    }
  }
  if (n_tensors == 0 || n_tensors > LANE_MAX) {
    PyErr_Format(PyExc_ValueError, "graphjit lane layout: 1 to %d tensors", LANE_MAX);
    return -1;
  }
  return n_tensors;
}

/* Whether a call's owner and the framework's modes are l's: the owner the same object (a bound call: instance), its
 * training flag as keyed, each modes probe giving what it gave, the backend cached for the probe type the one the
 * layout was made with (where it holds by_type).  prebound: the graphed function is a bound method
 * itself (a call never hands it an instance).  1 yes, 0 no (no error set), -1 an error. */
int owner_modes_match(const Layout *l, int prebound, PyObject *instance) {
  PyObject *owner = l->owner;
  if (l->method) {
    if (prebound || instance == Py_None || (unsigned long long)(uintptr_t)instance != l->owner_id) return 0;
    owner = instance;
  } else if (!prebound && instance != Py_None) {
    return 0;
  }
  if (owner != Py_None) {
    PyObject *training = NULL;
    if (LOOKUP_ATTR(owner, s_training, &training) < 0) return -1;
    int ok = same(training ? training : Py_None, l->training);
    Py_XDECREF(training);
    if (ok <= 0) return ok;
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(l->probes); ++k) {
    PyObject *r = PyObject_CallNoArgs(PyTuple_GET_ITEM(l->probes, k));
    if (r == NULL) return -1;
    int ok = same(r, PyTuple_GET_ITEM(l->expected, k));
    Py_DECREF(r);
    if (ok <= 0) return ok;
  }
  if (l->by_type != NULL) { /* the framework's backend, as cached, still the one the layout was made with */
    PyObject *b = PyDict_GetItemWithError(l->by_type, l->probe);
    if (b == NULL && PyErr_Occurred()) return -1;
    if (b != l->backend) return 0;
  }
  return 1;
}

/* Whether a call (instance: its bound instance or None; args: its positional arguments) has the layout l: each
 * tensor of the framework's types (gathered into tensors, *n of them), each scalar of its type and value, the owner
 * the same object with its training flag as keyed, the modes probes giving what they gave, the tensors passing the
 * check.  prebound: the graphed function is a bound method itself (a call never hands it an instance).  1 yes, 0 no
 * (no error set), -1 an error (the caller clears it: a miss, and the Python path meets it again). */
int layout_matches(const Layout *l, int prebound, PyObject *instance, PyObject *args, PyObject **tensors,
                          Py_ssize_t *n_tensors) {
  if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != l->nargs) return 0;
  Py_ssize_t n = 0, n_types = PyTuple_GET_SIZE(l->types);
  for (Py_ssize_t i = 0; i < l->nargs; ++i) {
    PyObject *a = PyTuple_GET_ITEM(args, i), *kind = PyTuple_GET_ITEM(l->kinds, i);
    if (kind == Py_None) {
      PyTypeObject *tp = Py_TYPE(a);
      Py_ssize_t t = 0;
      while (t < n_types && (PyTypeObject *)PyTuple_GET_ITEM(l->types, t) != tp) ++t;
      if (t == n_types || n == LANE_MAX) return 0;
      tensors[n++] = a;
    } else if ((PyObject *)Py_TYPE(a) != PyTuple_GET_ITEM(kind, 0)) {
      return 0;
    } else {
      int eq = same(a, PyTuple_GET_ITEM(kind, 1));
      if (eq <= 0) return eq;
    }
  }
  *n_tensors = n;
  int ok = owner_modes_match(l, prebound, instance);
  if (ok <= 0) return ok;
  /* the tensors' metadata */
  return truthy_call(l->check, tensors, (size_t)n);
}

/* ---- a signer's layout: Signer.sign_plain's check of a call in one C call ------------------------------------- */

/* What both checks start with (LayoutCheck is this head alone; WalkCheck adds its specs): the dict a check was made
 * from, which keeps every object it borrows alive (NULL: never made, or cleared: a call then gives None), graphjit.env's
 * globals and the settings it was made under, the call's owner and modes (for LayoutCheck its arguments too), and its
 * vectorcall. */
typedef struct {
  PyObject_HEAD
  PyObject *refs;
  PyObject *env_dict, *settings;
  Layout layout;
  vectorcallfunc vectorcall;
} Check;

/* Whether graphjit's settings are still those the check was made under (GRAPHJIT_* read again since, GRAPHJIT_LANE=off
 * among them: the Python path signs): 1, 0, or -1 with an error set. */
static int settings_current(const Check *c) {
  if (PyDict_GetItemWithError(c->env_dict, s_settings) == c->settings) return 1;
  return PyErr_Occurred() ? -1 : 0;
}

/* What a call the check did not serve gives: None (ok 0, or an Exception, cleared: the Python path meets it again and
 * says so), or NULL with anything else (KeyboardInterrupt and the like: the call's). */
static PyObject *refused(int ok) {
  if (ok < 0 && swallowed() < 0) return NULL;
  Py_RETURN_NONE;
}

/* The start of a check's __init__: its one argument, a dict (*d, borrowed), and the check not made yet; 0, or -1
 * with an error set. */
static int check_open(Check *self, PyObject *args, PyObject *kw, PyObject **d) {
  if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
    PyErr_Format(PyExc_TypeError, "%s(dict) takes no keyword arguments", Py_TYPE(self)->tp_name);
    return -1;
  }
  if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, d)) return -1;
  if (self->refs != NULL) {
    PyErr_Format(PyExc_RuntimeError, "a %s is made once", Py_TYPE(self)->tp_name);
    return -1;
  }
  return 0;
}

/* The end of a check's __init__, once everything else in d was found valid: its env_dict and settings read, d held,
 * the layout and the vectorcall set; 0, or -1 with an error set (the check then stays unmade). */
static int check_made(Check *self, PyObject *d, const Layout *l, vectorcallfunc vectorcall) {
  PyObject *env_dict = item(d, "env_dict"), *settings = item(d, "settings");
  if (env_dict == NULL || settings == NULL) return -1;
  if (!PyDict_Check(env_dict)) {
    PyErr_Format(PyExc_TypeError, "%s: env_dict: a dict", Py_TYPE(self)->tp_name);
    return -1;
  }
  Py_INCREF(d);
  self->refs = d;
  self->env_dict = env_dict;
  self->settings = settings;
  self->layout = *l;
  self->vectorcall = vectorcall;
  return 0;
}

static PyObject *check_call(PyObject *self, PyObject *args, PyObject *kw) { return PyVectorcall_Call(self, args, kw); }

static int check_traverse(Check *self, visitproc visit, void *arg) {
  Py_VISIT(self->refs);
  return 0;
}

static int check_clear(Check *self) {
  Py_CLEAR(self->refs); /* every borrowed pointer points into refs: a call gives None from now on */
  return 0;
}

static void check_dealloc(Check *self) {
  PyObject_GC_UnTrack(self);
  check_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* LayoutCheck(dict) (dict: what layout_init reads, and env_dict, settings) is called with (instance, args) and gives
 * the list of the call's tensors where graphjit's settings are the ones it was made under and the call has the
 * layout (keys.py then reuses the last key: the call signs as the last one did), else None, having changed nothing
 * (an Exception of a probe, a comparison or the check is cleared: the Python path meets it again and says so; any
 * other error, KeyboardInterrupt say, is the call's).  It only reads: no lock, no state of its own, so threads may
 * call one check at once. */
static PyObject *layout_check_vectorcall(Check *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
    PyErr_SetString(PyExc_TypeError, "a graphjit layout check takes (instance, args)");
    return NULL;
  }
  if (self->refs == NULL) Py_RETURN_NONE; /* never made */
  PyObject *tensors[LANE_MAX], *refs = self->refs;
  Py_ssize_t n = 0;
  Py_INCREF(refs); /* the borrowed objects outlive any Python code the probes and the check run */
  int ok = settings_current(self);
  if (ok > 0) ok = layout_matches(&self->layout, 0, args[0], args[1], tensors, &n);
  PyObject *list = ok > 0 ? PyList_New(n) : NULL;
  if (list == NULL && ok > 0) ok = -1; /* no memory for the list: a refusal, as any Exception is */
  if (ok > 0) {
    for (Py_ssize_t i = 0; i < n; ++i) {
      Py_INCREF(tensors[i]);
      PyList_SET_ITEM(list, i, tensors[i]);
    }
    Py_DECREF(refs);
    return list;
  }
  Py_DECREF(refs);
  return refused(ok);
}

static int layout_check_init(Check *self, PyObject *args, PyObject *kw) {
  PyObject *d;
  Layout l;
  if (check_open(self, args, kw, &d) < 0 || layout_init(&l, d) < 0) return -1;
  return check_made(self, d, &l, (vectorcallfunc)layout_check_vectorcall);
}

static PyTypeObject LayoutCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "graphjit._lane.LayoutCheck",
    .tp_basicsize = sizeof(Check),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A plain call's layout, checked in one call: LayoutCheck(dict)(instance, args) -> its tensors or None; "
              "see graphjit/keys.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)layout_check_init,
    .tp_call = check_call,
    .tp_vectorcall_offset = offsetof(Check, vectorcall),
    .tp_dealloc = (destructor)check_dealloc,
    .tp_traverse = (traverseproc)check_traverse,
    .tp_clear = (inquiry)check_clear,
};

/* ---- a walked call's structure: Signer.sign_walk's check of a call in one C call ------------------------------ */

/* A spec (graphjit/walk_spec.py) says what one argument held when it was last walked (keys.py's walk), as nested
 * tuples: (0, type) a tensor of that exact type; (1, type, value, hash) a value of that exact type equal to value
 * (and, where hash is an int, hashing to it: a key is found by its hash too); (2, type, specs) a list or tuple of that
 * exact type with one item per spec; (3, type, keys, hashes, specs) a dict of that exact type whose items (as its
 * items() gives them) have those keys in that order, each of its key's type, equal to it and hashing to its hash, and
 * one value per spec, and for a subclass (its spec has 8 items) (..., attribute keys or None, hashes, specs) whose
 * __dict__ holds such keys and values (None: no attributes), a spec (6, None) standing for the item of the attribute's
 * name, the same object (a mirror: tree.dict_attrs); (4, type, keys or None, hashes, specs,
 * slot names, slot specs) an object of that exact type whose __dict__ (None: not read) holds such keys and values, and
 * whose slots hold the slot specs (None: unset); (5, type) a value of that exact type, any value (a counter the key
 * holds: its value is gathered, and keys.py puts it into the key).  A call matches where every argument matches its
 * spec; its tensors and free values are gathered in the walk's order. */
enum { SPEC_TENSOR = 0, SPEC_VALUE = 1, SPEC_SEQ = 2, SPEC_DICT = 3, SPEC_OBJECT = 4, SPEC_FREE = 5, SPEC_MIRROR = 6 };
#define SPEC_DEPTH 32 /* nesting a spec may have (walk_spec.py makes none deeper) */

static PyObject *s_dict; /* "__dict__", interned by lane_checks_add */

/* Whether keys, hashes (ints) and specs are tuples of one length. */
static int keys_valid(PyObject *keys, PyObject *hashes, PyObject *specs) {
  if (!PyTuple_CheckExact(keys) || !PyTuple_CheckExact(hashes) || !PyTuple_CheckExact(specs) ||
      PyTuple_GET_SIZE(keys) != PyTuple_GET_SIZE(hashes) || PyTuple_GET_SIZE(keys) != PyTuple_GET_SIZE(specs))
    return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hashes); ++i)
    if (!PyLong_CheckExact(PyTuple_GET_ITEM(hashes, i))) return 0;
  return 1;
}

/* 1 where v hashes to want (an int), 0 where not, -1 with an error set (v unhashable: the walk says so). */
static int same_hash(PyObject *v, PyObject *want) {
  Py_hash_t h = PyObject_Hash(v);
  if (h == -1 && PyErr_Occurred()) return -1;
  Py_hash_t w = (Py_hash_t)PyLong_AsSsize_t(want);
  if (w == -1 && PyErr_Occurred()) return -1;
  return h == w;
}

/* 0 where spec is well formed (checked once, so that matching reads it without checks), -1 with an error set. */
static int spec_valid(PyObject *spec, int depth) {
  if (depth > SPEC_DEPTH || !PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) < 2) goto bad;
  long tag = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
  Py_ssize_t n = PyTuple_GET_SIZE(spec);
  PyObject *children;
  switch (tag) {
  case SPEC_TENSOR:
  case SPEC_FREE:
    if (n != 2 || !PyType_Check(PyTuple_GET_ITEM(spec, 1))) goto bad;
    return 0;
  case SPEC_VALUE:
    if (n != 4 || !PyType_Check(PyTuple_GET_ITEM(spec, 1)) ||
        !(PyTuple_GET_ITEM(spec, 3) == Py_None || PyLong_CheckExact(PyTuple_GET_ITEM(spec, 3))))
      goto bad;
    return 0;
  case SPEC_SEQ:
    if (n != 3 || !PyType_Check(PyTuple_GET_ITEM(spec, 1)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(spec, 2))) goto bad;
    if (!PyType_IsSubtype((PyTypeObject *)PyTuple_GET_ITEM(spec, 1), &PyTuple_Type) &&
        !PyType_IsSubtype((PyTypeObject *)PyTuple_GET_ITEM(spec, 1), &PyList_Type))
      goto bad;
    children = PyTuple_GET_ITEM(spec, 2);
    break;
  case SPEC_DICT:
    if ((n != 5 && n != 8) || !PyType_Check(PyTuple_GET_ITEM(spec, 1)) ||
        !PyType_IsSubtype((PyTypeObject *)PyTuple_GET_ITEM(spec, 1), &PyDict_Type) ||
        (n == 5) != ((PyTypeObject *)PyTuple_GET_ITEM(spec, 1) == &PyDict_Type) ||
        !keys_valid(PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 3), PyTuple_GET_ITEM(spec, 4)))
      goto bad;
    if (n == 8 && PyTuple_GET_ITEM(spec, 5) != Py_None) {
      PyObject *attrs = PyTuple_GET_ITEM(spec, 7);
      if (!keys_valid(PyTuple_GET_ITEM(spec, 5), PyTuple_GET_ITEM(spec, 6), attrs)) goto bad;
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(attrs); ++i) {
        PyObject *a = PyTuple_GET_ITEM(attrs, i);
        if (PyTuple_CheckExact(a) && PyTuple_GET_SIZE(a) == 2 && PyLong_CheckExact(PyTuple_GET_ITEM(a, 0)) &&
            PyLong_AsLong(PyTuple_GET_ITEM(a, 0)) == SPEC_MIRROR)
          continue;
        if (spec_valid(a, depth + 1) < 0) return -1;
      }
    }
    children = PyTuple_GET_ITEM(spec, 4);
    break;
  case SPEC_OBJECT: {
    if (n != 7 || !PyType_Check(PyTuple_GET_ITEM(spec, 1))) goto bad;
    PyObject *keys = PyTuple_GET_ITEM(spec, 2), *values = PyTuple_GET_ITEM(spec, 4);
    PyObject *names = PyTuple_GET_ITEM(spec, 5), *slots = PyTuple_GET_ITEM(spec, 6);
    if (!(keys == Py_None ? PyTuple_CheckExact(values) && PyTuple_GET_SIZE(values) == 0
                          : keys_valid(keys, PyTuple_GET_ITEM(spec, 3), values)) ||
        !PyTuple_CheckExact(names) || !PyTuple_CheckExact(slots) || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(slots))
      goto bad;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); ++i) {
      PyObject *slot = PyTuple_GET_ITEM(slots, i);
      if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) goto bad;
      if (slot != Py_None && spec_valid(slot, depth + 1) < 0) return -1;
    }
    children = values;
    break;
  }
  default:
    goto bad;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(children); ++i)
    if (spec_valid(PyTuple_GET_ITEM(children, i), depth + 1) < 0) return -1;
  return 0;
bad:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "graphjit walk check: a malformed spec");
  return -1;
}

typedef struct {
  PyObject *tensors;            /* the list the call's tensors are appended to */
  PyObject *free;               /* the list its free values are appended to (SPEC_FREE) */
  PyObject *path[SPEC_DEPTH + 1]; /* the objects being matched, outermost first: one met again is a cycle */
  int depth;
} Walk;

static int spec_matches(PyObject *spec, PyObject *v, Walk *w);

/* Whether one dict item matches: the key of the expected key's type, equal to it and hashing to its hash, the value
 * matching its spec. */
static int item_matches(PyObject *k, PyObject *val, PyObject *want, PyObject *hash, PyObject *spec, PyObject *owner,
                        Walk *w) {
  int ok = k == want ? 1 : (Py_TYPE(k) != Py_TYPE(want) ? 0 : same(k, want));
  if (ok > 0) ok = same_hash(k, hash);
  if (ok > 0 && owner != NULL) {
    /* an attribute of a dict subclass: a mirror is the owner's item of its name, the same object, as tree.dict_attrs
     * reads it (dict.get); any other attribute must not have become one (the walk would key it as a mirror) */
    PyObject *item = PyDict_GetItemWithError(owner, k);
    if (item == NULL && PyErr_Occurred()) return -1;
    if (PyLong_AsLong(PyTuple_GET_ITEM(spec, 0)) == SPEC_MIRROR) return item == val;
    if (item == val) return 0;
  }
  if (ok > 0) ok = spec_matches(spec, val, w);
  return ok;
}

/* Matches the items of a dict (exactly a dict) against keys, hashes and specs, in order.  snapshot: its items are
 * taken first and then matched, as tree.object_fields takes an object's __dict__ items; else it is read as it is
 * matched, as the walk iterates a dict argument's items. */
static int dict_matches(PyObject *d, PyObject *keys, PyObject *hashes, PyObject *specs, int snapshot, PyObject *owner,
                        Walk *w) {
  Py_ssize_t n = PyTuple_GET_SIZE(keys), pos = 0, i = 0;
  if (PyDict_GET_SIZE(d) != n) return 0;
  PyObject *k, *val;
  int ok = 1;
  Py_INCREF(d); /* its values' comparisons may run Python code */
  if (snapshot) {
    /* an exact dict's items as PyDict_Items lists them; a subclass's as its own items() gives them (an OrderedDict
     * in its order), as the walk takes them */
    PyObject *items = PyDict_CheckExact(d) ? PyDict_Items(d) : PyMapping_Items(d);
    if (items != NULL && !PyList_CheckExact(items)) Py_SETREF(items, PySequence_List(items));
    if (items == NULL) {
      ok = -1;
    } else {
      for (i = 0; ok > 0 && i < n && i < PyList_GET_SIZE(items); ++i) {
        PyObject *pair = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
          ok = 0;
          break;
        }
        ok = item_matches(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), PyTuple_GET_ITEM(keys, i),
                          PyTuple_GET_ITEM(hashes, i), PyTuple_GET_ITEM(specs, i), owner, w);
      }
      if (ok > 0 && PyList_GET_SIZE(items) != n) ok = 0;
      Py_DECREF(items);
    }
  } else {
    while (ok > 0 && i < n && PyDict_Next(d, &pos, &k, &val)) {
      Py_INCREF(k);
      Py_INCREF(val);
      ok = item_matches(k, val, PyTuple_GET_ITEM(keys, i), PyTuple_GET_ITEM(hashes, i), PyTuple_GET_ITEM(specs, i), owner,
                        w);
      Py_DECREF(k);
      Py_DECREF(val);
      ++i;
    }
    if (ok > 0 && (i != n || PyDict_GET_SIZE(d) != n)) ok = 0; /* changed while it was read */
  }
  Py_DECREF(d);
  return ok;
}

/* 1 where v matches spec (its tensors appended to w->tensors), 0 where not, -1 with an error set (an Exception of a
 * comparison or of reading an attribute is cleared by the caller: a refusal). */
static int spec_matches(PyObject *spec, PyObject *v, Walk *w) {
  long tag = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
  if ((PyObject *)Py_TYPE(v) != PyTuple_GET_ITEM(spec, 1)) return 0;
  switch (tag) {
  case SPEC_TENSOR:
    return PyList_Append(w->tensors, v) < 0 ? -1 : 1;
  case SPEC_FREE:
    return PyList_Append(w->free, v) < 0 ? -1 : 1;
  case SPEC_VALUE: {
    int ok = same(v, PyTuple_GET_ITEM(spec, 2));
    if (ok <= 0) return ok;
    PyObject *hash = PyTuple_GET_ITEM(spec, 3); /* a key is found by its hash and by ==: both as they were */
    return hash == Py_None ? 1 : same_hash(v, hash);
  }
  case SPEC_SEQ: {
    PyObject *specs = PyTuple_GET_ITEM(spec, 2);
    Py_ssize_t n = PyTuple_GET_SIZE(specs);
    int is_list = PyList_Check(v);
    if ((is_list ? PyList_GET_SIZE(v) : PyTuple_GET_SIZE(v)) != n) return 0;
    int ok = 1;
    Py_INCREF(v);
    for (Py_ssize_t i = 0; ok > 0 && i < n; ++i) {
      if (is_list && PyList_GET_SIZE(v) != n) { /* changed while it was read */
        ok = 0;
        break;
      }
      PyObject *e = is_list ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
      Py_INCREF(e);
      ok = spec_matches(PyTuple_GET_ITEM(specs, i), e, w);
      Py_DECREF(e);
    }
    Py_DECREF(v);
    return ok;
  }
  case SPEC_DICT: { /* an exact dict read as the walk iterates it; a subclass through its items(), taken first, then
                     its attributes (a snapshot of its __dict__, as tree.dict_attrs takes it) */
    int ok = dict_matches(v, PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 3), PyTuple_GET_ITEM(spec, 4),
                          !PyDict_CheckExact(v), NULL, w);
    if (ok <= 0 || PyTuple_GET_SIZE(spec) == 5) return ok;
    for (int i = 0; i < w->depth; ++i)
      if (w->path[i] == v) return 0; /* a cycle: the walk keys it apart */
    if (w->depth >= SPEC_DEPTH) return 0;
    PyObject *d = PyObject_GetAttr(v, s_dict), *keys = PyTuple_GET_ITEM(spec, 5);
    if (d == NULL) { /* no __dict__ (slots only): no attributes */
      if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
      PyErr_Clear();
      return keys == Py_None;
    }
    if (!PyDict_CheckExact(d)) {
      ok = 0;
    } else if (keys == Py_None) {
      ok = PyDict_GET_SIZE(d) == 0;
    } else {
      w->path[w->depth++] = v;
      Py_INCREF(v);
      ok = dict_matches(d, keys, PyTuple_GET_ITEM(spec, 6), PyTuple_GET_ITEM(spec, 7), 1, v, w);
      Py_DECREF(v);
      w->depth--;
    }
    Py_DECREF(d);
    return ok;
  }
  case SPEC_OBJECT: {
    for (int i = 0; i < w->depth; ++i)
      if (w->path[i] == v) return 0; /* a cycle: the walk keys it apart */
    if (w->depth >= SPEC_DEPTH) return 0;
    w->path[w->depth++] = v;
    Py_INCREF(v);
    int ok = 1;
    PyObject *keys = PyTuple_GET_ITEM(spec, 2);
    if (keys != Py_None) {
      PyObject *d = PyObject_GetAttr(v, s_dict);
      if (d == NULL) {
        ok = -1;
      } else {
        ok = PyDict_CheckExact(d)
                 ? dict_matches(d, keys, PyTuple_GET_ITEM(spec, 3), PyTuple_GET_ITEM(spec, 4), 1, NULL, w)
                 : 0;
        Py_DECREF(d);
      }
    }
    PyObject *names = PyTuple_GET_ITEM(spec, 5), *slots = PyTuple_GET_ITEM(spec, 6);
    for (Py_ssize_t i = 0; ok > 0 && i < PyTuple_GET_SIZE(names); ++i) {
      PyObject *want = PyTuple_GET_ITEM(slots, i), *a = PyObject_GetAttr(v, PyTuple_GET_ITEM(names, i));
      if (a == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
          ok = -1;
          break;
        }
        PyErr_Clear();
        ok = want == Py_None; /* unset, as it was */
        continue;
      }
      ok = want == Py_None ? 0 : spec_matches(want, a, w);
      Py_DECREF(a);
    }
    Py_DECREF(v);
    w->depth--;
    return ok;
  }
  default:
    return 0;
  }
}

/* WalkCheck(dict) (dict: args, a tuple of specs, one per positional argument; kwargs, ((name, spec), ...) sorted by
 * name; env_dict, settings; free, true where the specs hold free values; and what owner_modes_init reads) is called
 * with (instance, args, kwargs) and gives the list of the call's tensors, in the walk's order (with free values: the
 * pair (tensors, free values)), where graphjit's settings are the ones it was made under, every
 * argument matches its spec, the owner and the modes are as keyed and the tensors pass the check (keys.py then reuses
 * the last walked key: the walk would give it again), else None, having changed nothing (an Exception of a
 * comparison, an attribute, a probe or the check is cleared: the walk meets it again and says so; any other error is
 * the call's).  It only reads: threads may call one check at once. */
typedef struct {
  Check head; /* its layout: the owner and modes part only */
  PyObject *args, *kwargs;
  int has_free; /* its specs hold free values: a call gives (tensors, free values) */
} WalkCheck;

static int walk_check_matches(WalkCheck *self, PyObject *instance, PyObject *args, PyObject *kwargs, Walk *w) {
  int current = settings_current(&self->head);
  if (current <= 0) return current;
  Py_ssize_t n = PyTuple_GET_SIZE(self->args), n_kw = PyTuple_GET_SIZE(self->kwargs);
  if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != n) return 0;
  if (kwargs == Py_None ? n_kw != 0 : (!PyDict_Check(kwargs) || PyDict_GET_SIZE(kwargs) != n_kw)) return 0;
  int ok = 1;
  for (Py_ssize_t i = 0; ok > 0 && i < n; ++i)
    ok = spec_matches(PyTuple_GET_ITEM(self->args, i), PyTuple_GET_ITEM(args, i), w);
  for (Py_ssize_t i = 0; ok > 0 && i < n_kw; ++i) {
    PyObject *pair = PyTuple_GET_ITEM(self->kwargs, i);
    PyObject *v = PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(pair, 0));
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(v);
    ok = spec_matches(PyTuple_GET_ITEM(pair, 1), v, w);
    Py_DECREF(v);
  }
  if (ok <= 0) return ok;
  ok = owner_modes_match(&self->head.layout, 0, instance);
  if (ok <= 0) return ok;
  PyObject *t = w->tensors;
  return truthy_call(self->head.layout.check, PySequence_Fast_ITEMS(t), (size_t)PyList_GET_SIZE(t));
}

static PyObject *walk_check_vectorcall(WalkCheck *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL) {
    PyErr_SetString(PyExc_TypeError, "a graphjit walk check takes (instance, args, kwargs)");
    return NULL;
  }
  PyObject *refs = self->head.refs;
  if (refs == NULL) Py_RETURN_NONE; /* never made */
  Walk w;
  w.depth = 0;
  w.tensors = PyList_New(0);
  w.free = PyList_New(0);
  if (w.tensors == NULL || w.free == NULL) {
    Py_XDECREF(w.tensors);
    Py_XDECREF(w.free);
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  Py_INCREF(refs);
  int ok = walk_check_matches(self, args[0], args[1], args[2], &w);
  Py_DECREF(refs);
  if (ok > 0) {
    if (!self->has_free) { /* the plain case: the tensors alone */
      Py_DECREF(w.free);
      return w.tensors;
    }
    PyObject *r = PyTuple_Pack(2, w.tensors, w.free); /* (tensors, free values) */
    Py_DECREF(w.tensors);
    Py_DECREF(w.free);
    if (r != NULL) return r;
    ok = -1;
  } else {
    Py_DECREF(w.tensors);
    Py_DECREF(w.free);
  }
  return refused(ok);
}

static int walk_check_init(WalkCheck *self, PyObject *args, PyObject *kw) {
  PyObject *d;
  Layout l;
  memset(&l, 0, sizeof l);
  if (check_open(&self->head, args, kw, &d) < 0 || owner_modes_init(&l, d) < 0) return -1;
  PyObject *specs = item(d, "args"), *named = item(d, "kwargs");
  if (specs == NULL || named == NULL) return -1;
  if (!PyTuple_CheckExact(specs) || !PyTuple_CheckExact(named)) {
    PyErr_SetString(PyExc_TypeError, "graphjit walk check: args, kwargs: tuples");
    return -1;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(specs); ++i)
    if (spec_valid(PyTuple_GET_ITEM(specs, i), 0) < 0) return -1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(named); ++i) {
    PyObject *pair = PyTuple_GET_ITEM(named, i);
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
      PyErr_SetString(PyExc_TypeError, "graphjit walk check: kwargs: ((name, spec), ...)");
      return -1;
    }
    if (spec_valid(PyTuple_GET_ITEM(pair, 1), 0) < 0) return -1;
  }
  PyObject *has_free = PyDict_GetItemString(d, "free"); /* optional: False where absent */
  if (check_made(&self->head, d, &l, (vectorcallfunc)walk_check_vectorcall) < 0) return -1;
  self->args = specs;
  self->kwargs = named;
  self->has_free = has_free != NULL && PyObject_IsTrue(has_free) == 1;
  return 0;
}

static PyTypeObject WalkCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "graphjit._lane.WalkCheck",
    .tp_basicsize = sizeof(WalkCheck),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A walked call's structure, checked in one call: WalkCheck(dict)(instance, args, kwargs) -> its tensors "
              "or None; see graphjit/walk_spec.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)walk_check_init,
    .tp_call = check_call,
    .tp_vectorcall_offset = offsetof(WalkCheck, head.vectorcall),
    .tp_dealloc = (destructor)check_dealloc,
    .tp_traverse = (traverseproc)check_traverse,
    .tp_clear = (inquiry)check_clear,
};

int is_walk_check(PyObject *o) { return Py_IS_TYPE(o, &WalkCheckType); }

int lane_checks_add(PyObject *m) {
  if ((s_settings = PyUnicode_InternFromString("_settings")) == NULL ||
      (s_training = PyUnicode_InternFromString("training")) == NULL ||
      (s_dict = PyUnicode_InternFromString("__dict__")) == NULL)
    return -1;
  if (PyType_Ready(&LayoutCheckType) < 0 || PyType_Ready(&WalkCheckType) < 0) return -1;
  Py_INCREF(&LayoutCheckType);
  if (PyModule_AddObject(m, "LayoutCheck", (PyObject *)&LayoutCheckType) < 0) return -1;
  Py_INCREF(&WalkCheckType);
  if (PyModule_AddObject(m, "WalkCheck", (PyObject *)&WalkCheckType) < 0) return -1;
  return 0;
}
