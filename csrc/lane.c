/* graphjit's replay lane (graphjit/lane.py): a plain call of a key that already replays through its graph's feed
 * nodes, checked and launched in one C function instead of graphjit's Python path.
 *
 * A Plan is made once per key (lane.py: lane.plan) from what the Python path decided for that key: the call's
 * layout (where its tensors are, its plain scalars, its owner's training flag), the framework's modes as zero-argument
 * probes and the values they must give, a metadata check of the key's tensors that includes their strides, the
 * handoff of handoff.py (which inputs are adopted, which are copied in, where the static buffers are, which outputs
 * come out fresh) and how the graph is launched.  Plan.run(instance, args, kwargs) serves a call only where every one
 * of those holds and the key's entry is still the one planned, with the same guards, advances, step context and
 * handoff; anything else returns MISS having changed nothing, and the Python path decides the call as before (its
 * checks are the reference; this lane only ever says "the Python path would replay this call the same way").
 *
 * Concurrency: every step that writes (the feed table, the addresses seen, the counters) runs under the function's
 * lock (the RLock the Python path replays under), acquired through its own acquire/release.  The plan's
 * configuration is immutable once made; a Plan is replaced, never changed, so a call that began with one plan finishes
 * with it (it holds a reference).  The launch itself releases the GIL, as torch's replay does.
 *
 * Memory ordering: the table is host memory the library reads on this thread, inside the launch call that follows
 * the writes (program order on one thread); the library copies the node parameters into the executable graph before
 * it returns, so the next call may write the table again at once.
 *
 * Counting: a served call is counted in the plan (hits, copies); the Python side moves the counts into graphjit's
 * stats before anything reads them (lane.py: flush).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define LANE_ABI 2
#define LANE_MAX 64 /* tensors in one call the lane serves; a call with more takes the Python path */

typedef int (*feed_launch_t)(unsigned long long *table, void *stream);

static PyObject *s_entries, *s_lane, *s_settings, *s_phase, *s_training, *s_check, *s_recheck, *s_feeds, *s_advances, *s_handoff,
    *s_broken, *s_last_key, *s_targets, *s_apply;

#if PY_VERSION_HEX >= 0x030D0000
#define LOOKUP_ATTR(o, n, r) PyObject_GetOptionalAttr((o), (n), (r))
#else
#define LOOKUP_ATTR(o, n, r) _PyObject_LookupAttr((o), (n), (r))
#endif

/* The object of a weak reference (a new reference), or NULL where it is gone (no error set). */
static PyObject *deref(PyObject *ref) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject *o = NULL;
  if (PyWeakref_GetRef(ref, &o) <= 0) {
    PyErr_Clear();
    return NULL;
  }
  return o;
#else
  PyObject *o = PyWeakref_GetObject(ref);
  if (o == NULL || o == Py_None) {
    PyErr_Clear();
    return NULL;
  }
  Py_INCREF(o);
  return o;
#endif
}

typedef struct {
  Py_ssize_t i;
  unsigned long long p;
} Adopted;
typedef struct {
  Py_ssize_t i;
  PyObject *buffer; /* borrowed from refs */
  unsigned long long p, nbytes, seen;
} Moved;
typedef struct {
  PyObject *t; /* borrowed from refs */
  unsigned long long p;
} Fresh;

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
} Layout;

typedef struct {
  PyObject_HEAD
  PyObject *refs; /* the dict the plan was made from: keeps every borrowed object below alive; NULL once retired */
  PyObject *miss; /* what run() returns where the Python path must serve the call (lane.MISS): a reference of its own */
  /* the environment a served call needs */
  PyObject *env_dict, *settings, *tls;
  int prebound;
  Layout layout; /* the call's arguments, owner, modes and tensors' metadata (strides included) */
  /* the key */
  PyObject *state_ref, *entry_ref; /* weak references: a plan never keeps its function or its entry alive */
  PyObject *key, *entry_check, *recheck, *feeds, *advances, *handoff;
  PyObject *acquire, *release;
  /* the handoff */
  PyObject *ptr, *negated, *adopted_ptrs, *inside_owned, *empty;
  Adopted *adopted;
  Py_ssize_t n_adopted;
  Py_ssize_t *aliases; /* pairs (i, o): tensors i and o are one tensor */
  Py_ssize_t n_aliases;
  Moved *moved;
  Py_ssize_t n_moved;
  Fresh *fresh;
  Py_ssize_t n_fresh;
  unsigned long long *table;
  Py_ssize_t in_dst, in_src, in_bytes, out_dst;
  Py_ssize_t dirty; /* the table's word that says the nodes may hold a call's pointers (set before each launch); -1 */
  int copy;
  Py_ssize_t single_source; /* the one output is the call's tensor at this index; -1: a fresh one */
  PyObject *rebuild;        /* None, or the outputs' rebuild (fresh outputs, the call's tensors, the call) */
  PyObject *result;         /* outputs.result (alias) */
  PyObject *single_output;  /* the graph's one output tensor where it returns one tensor (alias: the result), else None */
  /* the launch */
  feed_launch_t fn; /* the library's gj_feed_launch, or NULL: launch_py */
  PyObject *stream_fn, *stream_arg, *launch_py;
  PyObject *launch_failed; /* called with a launch's exception: raises the call's error as the Python path does */
  /* served calls not yet counted in graphjit's stats */
  unsigned long long hits, copies;
  unsigned long long raised; /* calls whose launch raised: counted as calls, not replays */
  int made;                  /* __init__ ran (once only) */
  int ready;                 /* made whole (a failed __init__ leaves it 0: never run) */
} Plan;

/* ---- helpers ------------------------------------------------------------------------------------------------- */

/* 1 equal, 0 not (an Exception raised by __eq__ cleared: not equal), -1 with anything else set (KeyboardInterrupt,
 * SystemExit: the call's own, never swallowed) */
static int same(PyObject *a, PyObject *b) {
  if (a == b) return 1;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyErr_Clear();
    return 0;
  }
  return r;
}

static int truthy_call(PyObject *fn, PyObject *const *args, size_t n) { /* 1, 0, or -1 with an error set */
  PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
  if (r == NULL) return -1;
  int t = PyObject_IsTrue(r);
  Py_DECREF(r);
  return t;
}

static int address(PyObject *ptr, PyObject *t, unsigned long long *out) { /* 0, or -1 with an error set */
  PyObject *r = PyObject_Vectorcall(ptr, &t, 1, NULL);
  if (r == NULL) return -1;
  *out = PyLong_AsUnsignedLongLong(r);
  Py_DECREF(r);
  return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *item(PyObject *d, const char *name) { /* borrowed; NULL with KeyError set */
  PyObject *v = PyDict_GetItemString(d, name);
  if (v == NULL) PyErr_Format(PyExc_KeyError, "graphjit lane plan: missing %s", name);
  return v;
}

/* ---- a call's layout (shared by Plan and LayoutCheck) ----------------------------------------------------------- */

/* Fills l from the dict d (kinds, types, owner, owner_id, training, probes, expected, check, method; the objects stay
 * d's); the number of tensors of the layout, or -1 with an error set. */
/* Fills the owner and modes part of l from the dict d (owner, owner_id, training, probes, expected, check, method;
 * the objects stay d's): 0, or -1 with an error set. */
static int owner_modes_init(Layout *l, PyObject *d) {
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
  return PyErr_Occurred() ? -1 : 0;
}

/* Fills l from the dict d (kinds, types and what owner_modes_init reads; the objects stay d's); the number of tensors
 * of the layout, or -1 with an error set. */
static Py_ssize_t layout_init(Layout *l, PyObject *d) {
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
    PyErr_SetString(PyExc_ValueError, "graphjit lane layout: 1 to 64 tensors");
    return -1;
  }
  return n_tensors;
}

/* Whether a call's owner and the framework's modes are l's: the owner the same object (a bound call: instance), its
 * training flag as keyed, each modes probe giving what it gave.  prebound: the graphed function is a bound method
 * itself (a call never hands it an instance).  1 yes, 0 no (no error set), -1 an error. */
static int owner_modes_match(const Layout *l, int prebound, PyObject *instance) {
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
  return 1;
}

/* Whether a call (instance: its bound instance or None; args: its positional arguments) has the layout l: each
 * tensor of the framework's types (gathered into tensors, *n of them), each scalar of its type and value, the owner
 * the same object with its training flag as keyed, the modes probes giving what they gave, the tensors passing the
 * check.  prebound: the graphed function is a bound method itself (a call never hands it an instance).  1 yes, 0 no
 * (no error set), -1 an error (the caller clears it: a miss, and the Python path meets it again). */
static int layout_matches(const Layout *l, int prebound, PyObject *instance, PyObject *args, PyObject **tensors,
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

/* ---- making a plan ----------------------------------------------------------------------------------------- */

static void plan_free_arrays(Plan *p) {
  PyMem_Free(p->adopted);
  PyMem_Free(p->aliases);
  PyMem_Free(p->moved);
  PyMem_Free(p->fresh);
  p->adopted = NULL;
  p->aliases = NULL;
  p->moved = NULL;
  p->fresh = NULL;
}

static int plan_init(Plan *self, PyObject *args, PyObject *kw) {
  PyObject *d;
  if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
    PyErr_SetString(PyExc_TypeError, "Plan(dict) takes no keyword arguments");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &d)) return -1;
  if (self->made) {
    PyErr_SetString(PyExc_RuntimeError, "a graphjit lane plan is made once");
    return -1;
  }
  self->made = 1; /* a failure below leaves it made and not ready: it never runs and is never made again */
  Py_INCREF(d);
  self->refs = d;
#define GET(field, name)                    \
  do {                                      \
    self->field = item(d, name);            \
    if (self->field == NULL) return -1;     \
  } while (0)
  GET(miss, "miss");
  Py_INCREF(self->miss);
  GET(env_dict, "env_dict");
  GET(settings, "settings");
  GET(tls, "tls");
  GET(state_ref, "state");
  GET(key, "key");
  GET(entry_ref, "entry");
  GET(entry_check, "entry_check");
  GET(recheck, "recheck");
  GET(feeds, "feeds");
  GET(advances, "advances");
  GET(handoff, "handoff");
  GET(acquire, "acquire");
  GET(release, "release");
  GET(ptr, "ptr");
  GET(negated, "negated");
  GET(adopted_ptrs, "adopted_ptrs");
  GET(inside_owned, "inside_owned");
  GET(empty, "empty");
  GET(rebuild, "rebuild");
  GET(result, "result");
  GET(single_output, "single_output");
  GET(stream_fn, "stream_fn");
  GET(stream_arg, "stream_arg");
  GET(launch_py, "launch_py");
  GET(launch_failed, "launch_failed");
#undef GET
  PyObject *o;
  if (!PyWeakref_CheckRef(self->state_ref) || !PyWeakref_CheckRef(self->entry_ref) || !PyDict_Check(self->env_dict) ||
      !PyAnySet_Check(self->adopted_ptrs)) {
    PyErr_SetString(PyExc_TypeError, "graphjit lane plan: state, entry: weak references; env_dict: a dict; "
                                     "adopted_ptrs: a set");
    return -1;
  }
  Py_ssize_t n_tensors = layout_init(&self->layout, d);
  if (n_tensors < 0) return -1;
#define INT(var, name)                     \
  do {                                     \
    if ((o = item(d, name)) == NULL) return -1; \
    var = PyLong_AsSsize_t(o);             \
    if (var == -1 && PyErr_Occurred()) return -1; \
  } while (0)
  Py_ssize_t v;
  INT(v, "prebound");
  self->prebound = (int)v;
  INT(v, "copy");
  self->copy = (int)v;
  INT(self->single_source, "single_source");
  INT(self->in_dst, "in_dst");
  INT(self->in_src, "in_src");
  INT(self->in_bytes, "in_bytes");
  INT(self->out_dst, "out_dst");
  INT(self->dirty, "dirty");
#undef INT
  if ((o = item(d, "table")) == NULL) return -1;
  self->table = (unsigned long long *)PyLong_AsVoidPtr(o);
  if ((o = item(d, "fn")) == NULL) return -1;
  self->fn = (feed_launch_t)PyLong_AsVoidPtr(o);
  if (PyErr_Occurred()) return -1;
  if (self->table == NULL) {
    PyErr_SetString(PyExc_ValueError, "graphjit lane plan: no feed table");
    return -1;
  }
  if (self->fn == NULL && self->launch_py == Py_None) {
    PyErr_SetString(PyExc_ValueError, "graphjit lane plan: no launch");
    return -1;
  }
  /* the handoff's lists: tuples of tuples of ints (and buffers) */
  PyObject *adopted = item(d, "adopted"), *aliases = item(d, "aliases"), *moved = item(d, "moved"),
           *fresh = item(d, "fresh");
  if (!adopted || !aliases || !moved || !fresh) return -1;
  if (!PyTuple_Check(adopted) || !PyTuple_Check(aliases) || !PyTuple_Check(moved) || !PyTuple_Check(fresh)) {
    PyErr_SetString(PyExc_TypeError, "graphjit lane plan: adopted, aliases, moved, fresh: tuples");
    return -1;
  }
  self->n_adopted = PyTuple_GET_SIZE(adopted);
  self->n_aliases = PyTuple_GET_SIZE(aliases);
  self->n_moved = PyTuple_GET_SIZE(moved);
  self->n_fresh = PyTuple_GET_SIZE(fresh);
  self->adopted = PyMem_Calloc(self->n_adopted + 1, sizeof(Adopted));
  self->aliases = PyMem_Calloc(2 * self->n_aliases + 1, sizeof(Py_ssize_t));
  self->moved = PyMem_Calloc(self->n_moved + 1, sizeof(Moved));
  self->fresh = PyMem_Calloc(self->n_fresh + 1, sizeof(Fresh));
  if (!self->adopted || !self->aliases || !self->moved || !self->fresh) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t j = 0; j < self->n_adopted; ++j) {
    PyObject *e = PyTuple_GET_ITEM(adopted, j);
    if (!PyArg_ParseTuple(e, "nK", &self->adopted[j].i, &self->adopted[j].p)) return -1;
    if (self->adopted[j].i < 0 || self->adopted[j].i >= n_tensors) goto bad_index;
  }
  for (Py_ssize_t j = 0; j < self->n_aliases; ++j) {
    PyObject *e = PyTuple_GET_ITEM(aliases, j);
    if (!PyArg_ParseTuple(e, "nn", &self->aliases[2 * j], &self->aliases[2 * j + 1])) return -1;
    if (self->aliases[2 * j] < 0 || self->aliases[2 * j] >= n_tensors || self->aliases[2 * j + 1] < 0 ||
        self->aliases[2 * j + 1] >= n_tensors)
      goto bad_index;
  }
  for (Py_ssize_t j = 0; j < self->n_moved; ++j) {
    PyObject *e = PyTuple_GET_ITEM(moved, j);
    Moved *m = &self->moved[j];
    if (!PyArg_ParseTuple(e, "nOKK", &m->i, &m->buffer, &m->p, &m->nbytes)) return -1;
    if (m->i < 0 || m->i >= n_tensors) goto bad_index;
    m->seen = 0; /* none yet: a null address is never served */
  }
  for (Py_ssize_t j = 0; j < self->n_fresh; ++j) {
    PyObject *e = PyTuple_GET_ITEM(fresh, j);
    if (!PyArg_ParseTuple(e, "OK", &self->fresh[j].t, &self->fresh[j].p)) return -1;
  }
  if (self->n_moved > LANE_MAX || self->n_fresh > LANE_MAX || self->single_source >= n_tensors) goto bad_index;
  if (self->copy && self->rebuild == Py_None && self->single_source < 0 && self->n_fresh < 1) goto bad_index;
  self->ready = 1;
  return 0;
bad_index:
  PyErr_SetString(PyExc_ValueError, "graphjit lane plan: an index outside the call's tensors");
  return -1;
}

/* ---- a call ------------------------------------------------------------------------------------------------ */

/* The part before the lock: the call is the key's, its environment the planned one.  1 served so far, 0 a miss
 * (no error set), -1 an error (the caller clears it: a miss). */
static int signed_as_planned(Plan *self, PyObject *state, PyObject *entry, PyObject *instance, PyObject *args,
                             PyObject *kwargs, PyObject **tensors, Py_ssize_t *n_tensors) {
  if (kwargs != Py_None && (!PyDict_Check(kwargs) || PyDict_GET_SIZE(kwargs) != 0)) return 0;
  /* GRAPHJIT_* read again since the plan (env.refresh), or another thread's settings: the Python path */
  if (PyDict_GetItemWithError(self->env_dict, s_settings) != self->settings) return PyErr_Occurred() ? -1 : 0;
  /* inside another graphed call's warmup, capture or verify: part of it (the Python path says so) */
  PyObject *phase = PyObject_GetAttr(self->tls, s_phase);
  if (phase == NULL) return -1;
  Py_DECREF(phase);
  if (phase != Py_None) return 0;
  /* the arguments, the owner, the modes, the tensors' metadata (strides included) */
  int ok = layout_matches(&self->layout, self->prebound, instance, args, tensors, n_tensors);
  if (ok <= 0) return ok;
  /* the key's entry: still the planned one, with the same guards, recheck, step context, advances and handoff */
  PyObject *entries = PyObject_GetAttr(state, s_entries);
  if (entries == NULL) return -1;
  PyObject *current = PyDict_Check(entries) ? PyDict_GetItemWithError(entries, self->key) : NULL;
  Py_DECREF(entries); /* the state holds it: current stays alive while the state does (the caller holds it) */
  if (current != entry) return PyErr_Occurred() ? -1 : 0;
  PyObject *const names[5] = {s_check, s_recheck, s_feeds, s_advances, s_handoff};
  PyObject *const want[5] = {self->entry_check, self->recheck, self->feeds, self->advances, self->handoff};
  for (int k = 0; k < 5; ++k) {
    PyObject *v = PyObject_GetAttr(entry, names[k]);
    if (v == NULL) return -1;
    Py_DECREF(v);
    if (v != want[k]) return 0;
  }
  PyObject *broken = PyObject_GetAttr(self->handoff, s_broken);
  if (broken == NULL) return -1;
  Py_DECREF(broken);
  if (broken != Py_False) return 0;
  /* the values the graph froze (GuardSet.holds) */
  if (self->entry_check != Py_None) {
    ok = truthy_call(self->entry_check, NULL, 0);
    if (ok <= 0) return ok;
  }
  return 1;
}

/* Under the lock: the handoff of handoff.py (Handoff.replay), up to the launch.  1 launched, 0 a miss, -1 an error;
 * *outs gets the fresh outputs (a new list) where the call copies them out. */
static int hand_off(Plan *self, PyObject **tensors, PyObject **outs, unsigned long long *k_out) {
  unsigned long long p;
  for (Py_ssize_t j = 0; j < self->n_adopted; ++j) {
    if (address(self->ptr, tensors[self->adopted[j].i], &p) < 0) return -1;
    if (p != self->adopted[j].p) return 0; /* moved: the copy path says how (InputMoved) */
  }
  for (Py_ssize_t j = 0; j < self->n_aliases; ++j)
    if (tensors[self->aliases[2 * j]] != tensors[self->aliases[2 * j + 1]]) return 0;
  unsigned long long *table = self->table, k = 0;
  for (Py_ssize_t j = 0; j < self->n_moved; ++j) {
    Moved *m = &self->moved[j];
    PyObject *t = tensors[m->i];
    if (t == m->buffer) continue;
    if (address(self->ptr, t, &p) < 0) return -1;
    if (p == m->p) continue; /* the buffer itself, as another tensor object */
    int neg = truthy_call(self->negated, &t, 1);
    if (neg != 0) return neg < 0 ? -1 : 0;
    if (p != m->seen) { /* an address this input did not come from last time: where is it? */
      if (p == 0) return 0;
      PyObject *addr = PyLong_FromUnsignedLongLong(p);
      if (addr == NULL) return -1;
      int owned = PySet_Contains(self->adopted_ptrs, addr);
      if (owned == 0) owned = truthy_call(self->inside_owned, &addr, 1);
      Py_DECREF(addr);
      if (owned != 0) return owned < 0 ? -1 : 0;
      m->seen = p;
    }
    table[self->in_dst + k] = m->p;
    table[self->in_src + k] = p;
    table[self->in_bytes + k] = m->nbytes;
    ++k;
  }
  Py_ssize_t n_out = 0;
  if (self->copy && self->n_fresh) {
    for (Py_ssize_t j = 0; j < self->n_fresh; ++j) {
      if (address(self->ptr, self->fresh[j].t, &p) < 0) return -1;
      if (p != self->fresh[j].p) return 0; /* a module buffer returned as it is, rebound since */
    }
    PyObject *list = PyList_New(self->n_fresh);
    if (list == NULL) return -1;
    for (Py_ssize_t j = 0; j < self->n_fresh; ++j) {
      PyObject *o = PyObject_Vectorcall(self->empty, &self->fresh[j].t, 1, NULL);
      if (o == NULL || address(self->ptr, o, &p) < 0) {
        Py_XDECREF(o);
        Py_DECREF(list);
        return -1;
      }
      PyList_SET_ITEM(list, j, o);
      table[self->out_dst + j] = p;
    }
    *outs = list;
    n_out = self->n_fresh;
  }
  int rc;
  if (self->dirty >= 0) table[self->dirty] = 1; /* the nodes may hold this call's pointers from here on */
  if (self->fn != NULL) {
    PyObject *s = PyObject_Vectorcall(self->stream_fn, &self->stream_arg, 1, NULL);
    void *stream = s ? PyLong_AsVoidPtr(s) : NULL;
    Py_XDECREF(s);
    if (PyErr_Occurred()) goto failed; /* nothing launched: a miss */
    table[4] = k;
    table[5] = (unsigned long long)n_out;
    table[6] = 1;
    feed_launch_t fn = self->fn;
    Py_BEGIN_ALLOW_THREADS rc = fn(table, stream);
    Py_END_ALLOW_THREADS
  } else {
    PyObject *a[2] = {PyLong_FromUnsignedLongLong(k), PyLong_FromSsize_t(n_out)};
    if (a[0] == NULL || a[1] == NULL) {
      Py_XDECREF(a[0]);
      Py_XDECREF(a[1]);
      goto failed;
    }
    PyObject *r = PyObject_Vectorcall(self->launch_py, a, 2, NULL);
    Py_DECREF(a[0]);
    Py_DECREF(a[1]);
    if (r == NULL) goto launch_failed; /* the launch may have run (a replay by torch): the call's error */
    rc = (int)PyLong_AsLong(r);
    Py_DECREF(r);
    if (rc == -1 && PyErr_Occurred()) goto launch_failed;
  }
  if (rc != 0) { /* refused before launching: the Python path launches again and says why */
    Py_CLEAR(*outs);
    return 0;
  }
  *k_out = k;
  return 1;
failed:
  Py_CLEAR(*outs);
  return -1;
launch_failed:
  Py_CLEAR(*outs);
  return -2;
}

static PyObject *tensor_tuple(PyObject **tensors, Py_ssize_t n) {
  PyObject *t = PyTuple_New(n);
  if (t == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; ++i) {
    Py_INCREF(tensors[i]);
    PyTuple_SET_ITEM(t, i, tensors[i]);
  }
  return t;
}

/* The call's result, as Handoff.replay gives it (new reference), or NULL with an error. */
static PyObject *outputs(Plan *self, PyObject **tensors, Py_ssize_t n, PyObject *outs, PyObject *args,
                         PyObject *kwargs) {
  if (self->copy && self->rebuild == Py_None) { /* one output: the call's own tensor, or fresh (plan_init) */
    PyObject *r = self->single_source >= 0 ? tensors[self->single_source] : PyList_GET_ITEM(outs, 0);
    Py_INCREF(r);
    return r;
  }
  if (!self->copy && self->single_output != Py_None) { /* one output, aliased: StaticOutputs.result's single case */
    PyObject *r = self->single_source >= 0 ? tensors[self->single_source] : self->single_output;
    Py_INCREF(r);
    return r;
  }
  PyObject *none_fresh = NULL;
  if (outs == NULL && self->copy) { /* copied outputs, none of them fresh (each one of the call's tensors or arguments) */
    outs = none_fresh = PyList_New(0);
    if (outs == NULL) return NULL;
  }
  PyObject *tt = tensor_tuple(tensors, n);
  PyObject *kw = kwargs == Py_None ? PyDict_New() : (Py_INCREF(kwargs), kwargs);
  PyObject *call = (tt && kw) ? PyTuple_Pack(2, args, kw) : NULL;
  Py_XDECREF(kw);
  PyObject *r = NULL;
  if (call != NULL) {
    if (self->copy) {
      PyObject *a[3] = {outs, tt, call};
      r = PyObject_Vectorcall(self->rebuild, a, 3, NULL);
    } else {
      PyObject *none = PyTuple_New(0);
      if (none != NULL) {
        PyObject *a[4] = {none, Py_False, tt, call};
        r = PyObject_Vectorcall(self->result, a, 4, NULL);
        Py_DECREF(none);
      }
    }
  }
  Py_XDECREF(call);
  Py_XDECREF(tt);
  Py_XDECREF(none_fresh);
  return r;
}

/* A miss: the error of a check cleared where it is an Exception (the Python path meets it again and handles it);
 * anything else (KeyboardInterrupt, SystemExit) is the call's. */
static PyObject *missed(Plan *self) {
  if (PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
    PyErr_Clear();
  }
  if (self->miss == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "a graphjit lane plan that was never made");
    return NULL;
  }
  Py_INCREF(self->miss);
  return self->miss;
}

/* A launch that raised: the call's error, as the Python path gives it (launch_failed turns an Exception into what
 * _State.replay raises: UnrecoverableCaptureError where the backend is poisoned); counted as a call. */
static PyObject *launch_raised(Plan *self) {
  self->raised += 1;
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyErr_NormalizeException(&et, &ev, &tb);
  if (tb != NULL && ev != NULL) PyException_SetTraceback(ev, tb);
  PyObject *r = ev != NULL ? PyObject_CallOneArg(self->launch_failed, ev) : NULL;
  if (r != NULL) { /* it returned instead of raising: the original error stands */
    Py_DECREF(r);
    PyErr_Restore(et, ev, tb);
    return NULL;
  }
  Py_XDECREF(et);
  Py_XDECREF(ev);
  Py_XDECREF(tb);
  return NULL;
}

static PyObject *plan_run(Plan *self, PyObject *const *argv, Py_ssize_t argc) {
  if (argc != 3) {
    PyErr_SetString(PyExc_TypeError, "run(instance, args, kwargs)");
    return NULL;
  }
  PyObject *refs = self->refs;
  if (!self->ready || refs == NULL) return missed(self); /* retired (its key's entry released) */
  PyObject *state = deref(self->state_ref), *entry = deref(self->entry_ref);
  if (state == NULL || entry == NULL) { /* the function or the key's entry is gone */
    Py_XDECREF(state);
    Py_XDECREF(entry);
    return missed(self);
  }
  Py_INCREF(refs); /* retire() while this call runs Python code leaves every object it reads alive */
  PyObject *instance = argv[0], *args = argv[1], *kwargs = argv[2];
  PyObject *tensors[LANE_MAX];
  Py_ssize_t n = 0;
  PyObject *targets = NULL, *outs = NULL, *result = NULL;
  int ok = signed_as_planned(self, state, entry, instance, args, kwargs, tensors, &n);
  if (ok > 0 && self->advances != Py_None) { /* where this call holds the scalars its replay sets (advances.py) */
    if (!PyDict_Check(kwargs)) {
      ok = 0;
    } else {
      PyObject *a[3] = {self->advances, args, kwargs};
      targets = PyObject_VectorcallMethod(s_targets, a, 3, NULL);
      ok = targets == NULL ? -1 : (targets == Py_None ? 0 : 1);
    }
  }
  if (ok <= 0) goto miss;
  PyObject *got = PyObject_CallNoArgs(self->acquire);
  if (got == NULL) goto miss;
  Py_DECREF(got);
  /* under the lock: still the plan serving the function's calls (not replaced, not retired meanwhile) */
  PyObject *current = self->refs == NULL ? NULL : PyObject_GetAttr(state, s_lane);
  ok = current == (PyObject *)self ? 1 : (current == NULL && PyErr_Occurred() ? -1 : 0);
  Py_XDECREF(current);
  unsigned long long k = 0;
  if (ok > 0) ok = hand_off(self, tensors, &outs, &k);
  if (ok > 0) { /* launched: the call is served from here on; an error now is the call's, as on the Python path */
    self->hits += 1;
    self->copies += k;
    result = outputs(self, tensors, n, outs, args, kwargs);
  }
  Py_XDECREF(outs);
  {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* the error of the handoff or of the result, kept across the release */
    PyObject *r = PyObject_CallNoArgs(self->release);
    if (r == NULL) {
      Py_XDECREF(et);
      Py_XDECREF(ev);
      Py_XDECREF(tb);
      Py_XDECREF(result);
      Py_XDECREF(targets);
      Py_DECREF(refs);
      Py_DECREF(state);
      Py_DECREF(entry);
      return NULL; /* the lock could not be released: nothing sensible is left to do */
    }
    Py_DECREF(r);
    PyErr_Restore(et, ev, tb);
  }
  if (ok == -2) { /* the launch raised: the call's error, as the Python path would raise it */
    Py_XDECREF(targets);
    PyObject *r = launch_raised(self);
    Py_DECREF(refs);
    Py_DECREF(state);
    Py_DECREF(entry);
    return r;
  }
  if (ok <= 0) goto miss;
  if (result != NULL && PyObject_SetAttr(state, s_last_key, self->key) < 0) Py_CLEAR(result);
  if (result != NULL && targets != NULL) { /* the Python scalars the call would have advanced */
    PyObject *a[2] = {self->advances, targets};
    PyObject *r = PyObject_VectorcallMethod(s_apply, a, 2, NULL);
    if (r == NULL) Py_CLEAR(result);
    Py_XDECREF(r);
  }
  Py_XDECREF(targets);
  Py_DECREF(refs);
  Py_DECREF(state);
  Py_DECREF(entry);
  return result;
miss:
  Py_XDECREF(targets);
  Py_DECREF(refs);
  Py_DECREF(state);
  Py_DECREF(entry);
  return missed(self);
}

static PyObject *plan_retire(Plan *self, PyObject *Py_UNUSED(ignored)) {
  /* the key's entry is released: the objects the plan holds (its buffers, the graph's handoff) go with it; a call
   * running on the plan now holds them until it ends (plan_run's reference), later ones miss */
  Py_CLEAR(self->refs);
  Py_RETURN_NONE;
}

static PyObject *plan_take(Plan *self, PyObject *Py_UNUSED(ignored)) {
  PyObject *r = Py_BuildValue("(KKK)", self->hits, self->copies, self->raised);
  if (r != NULL) self->hits = self->copies = self->raised = 0;
  return r;
}

/* ---- the type ---------------------------------------------------------------------------------------------- */

static int plan_traverse(Plan *self, visitproc visit, void *arg) {
  Py_VISIT(self->refs);
  Py_VISIT(self->miss);
  return 0;
}

static int plan_clear(Plan *self) {
  /* every borrowed pointer points into refs: run() misses from now on (refs NULL); the arrays go at dealloc */
  Py_CLEAR(self->refs);
  return 0;
}

static void plan_dealloc(Plan *self) {
  PyObject_GC_UnTrack(self);
  plan_clear(self);
  Py_CLEAR(self->miss);
  plan_free_arrays(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef plan_methods[] = {
    {"run", (PyCFunction)(void (*)(void))plan_run, METH_FASTCALL,
     "run(instance, args, kwargs): the call's result where the plan serves it, else MISS (nothing changed)."},
    {"take", (PyCFunction)plan_take, METH_NOARGS,
     "take(): (served calls, input copies, calls whose launch raised) not yet counted in graphjit's stats; zero "
     "afterwards."},
    {"retire", (PyCFunction)plan_retire, METH_NOARGS,
     "retire(): the key's entry is released: drop every object the plan holds; it serves no call after."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef plan_members[] = {
    {"hits", T_ULONGLONG, offsetof(Plan, hits), READONLY, "served calls not yet taken"},
    {"raised", T_ULONGLONG, offsetof(Plan, raised), READONLY, "calls whose launch raised, not yet taken"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "graphjit._lane.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One key's replay lane: Plan(dict); see graphjit/lane.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)plan_init,
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_traverse = (traverseproc)plan_traverse,
    .tp_clear = (inquiry)plan_clear,
    .tp_methods = plan_methods,
    .tp_members = plan_members,
};

/* ---- a signer's layout: Signer.sign_plain's check of a call in one C call ------------------------------------- */

/* LayoutCheck(dict) (dict: what layout_init reads, and env_dict, settings) is called with (instance, args) and gives
 * the list of the call's tensors where graphjit's settings are the ones it was made under and the call has the
 * layout (keys.py then reuses the last key: the call signs as the last one did), else None, having changed nothing
 * (an Exception of a probe, a comparison or the check is cleared: the Python path meets it again and says so; any
 * other error, KeyboardInterrupt say, is the call's).  It only reads: no lock, no state of its own, so threads may
 * call one check at once. */
typedef struct {
  PyObject_HEAD
  PyObject *refs; /* the dict it was made from: keeps every borrowed object below alive */
  PyObject *env_dict, *settings; /* graphjit.env's globals and the settings it was made under */
  Layout layout;
  vectorcallfunc vectorcall;
} LayoutCheck;

static PyObject *layout_check_vectorcall(LayoutCheck *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
    PyErr_SetString(PyExc_TypeError, "a graphjit layout check takes (instance, args)");
    return NULL;
  }
  if (self->refs == NULL) Py_RETURN_NONE; /* never made */
  PyObject *tensors[LANE_MAX], *refs = self->refs;
  Py_ssize_t n = 0;
  Py_INCREF(refs); /* the borrowed objects outlive any Python code the probes and the check run */
  /* GRAPHJIT_* read again since (env.refresh): GRAPHJIT_LANE=off among them, so the Python path signs */
  int ok = PyDict_GetItemWithError(self->env_dict, s_settings) != self->settings ? (PyErr_Occurred() ? -1 : 0)
           : layout_matches(&self->layout, 0, args[0], args[1], tensors, &n);
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
  if (ok < 0) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL; /* KeyboardInterrupt and the like: the call's */
    PyErr_Clear();
  }
  Py_RETURN_NONE;
}

static int layout_check_init(LayoutCheck *self, PyObject *args, PyObject *kw) {
  PyObject *d;
  if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
    PyErr_SetString(PyExc_TypeError, "LayoutCheck(dict) takes no keyword arguments");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &d)) return -1;
  if (self->refs != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "a graphjit layout check is made once");
    return -1;
  }
  Layout l;
  if (layout_init(&l, d) < 0) return -1;
  PyObject *env_dict = item(d, "env_dict"), *settings = item(d, "settings");
  if (env_dict == NULL || settings == NULL) return -1;
  if (!PyDict_Check(env_dict)) {
    PyErr_SetString(PyExc_TypeError, "graphjit layout check: env_dict: a dict");
    return -1;
  }
  Py_INCREF(d);
  self->refs = d;
  self->env_dict = env_dict;
  self->settings = settings;
  self->layout = l;
  self->vectorcall = (vectorcallfunc)layout_check_vectorcall;
  return 0;
}

static PyObject *layout_check_call(LayoutCheck *self, PyObject *args, PyObject *kw) {
  return PyVectorcall_Call((PyObject *)self, args, kw);
}

static int layout_check_traverse(LayoutCheck *self, visitproc visit, void *arg) {
  Py_VISIT(self->refs);
  return 0;
}

static int layout_check_clear(LayoutCheck *self) {
  Py_CLEAR(self->refs); /* every borrowed pointer points into refs: a call gives None from now on */
  return 0;
}

static void layout_check_dealloc(LayoutCheck *self) {
  PyObject_GC_UnTrack(self);
  layout_check_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LayoutCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "graphjit._lane.LayoutCheck",
    .tp_basicsize = sizeof(LayoutCheck),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A plain call's layout, checked in one call: LayoutCheck(dict)(instance, args) -> its tensors or None; "
              "see graphjit/keys.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)layout_check_init,
    .tp_call = (ternaryfunc)layout_check_call,
    .tp_vectorcall_offset = offsetof(LayoutCheck, vectorcall),
    .tp_dealloc = (destructor)layout_check_dealloc,
    .tp_traverse = (traverseproc)layout_check_traverse,
    .tp_clear = (inquiry)layout_check_clear,
};

/* ---- a walked call's structure: Signer.sign_walk's check of a call in one C call ------------------------------ */

/* A spec (graphjit/walk_spec.py) says what one argument held when it was last walked (keys.py's walk), as nested
 * tuples: (0, type) a tensor of that exact type; (1, type, value, hash) a value of that exact type equal to value
 * (and, where hash is an int, hashing to it: a key is found by its hash too); (2, type, specs) a list or tuple of that
 * exact type with one item per spec; (3, type, keys, hashes, specs) a dict of that exact type whose items (as its
 * items() gives them) have those keys in that order, each of its key's type, equal to it and hashing to its hash, and
 * one value per spec; (4, type, keys or None, hashes, specs,
 * slot names, slot specs) an object of that exact type whose __dict__ (None: not read) holds such keys and values, and
 * whose slots hold the slot specs (None: unset).  A call matches where every argument matches its spec; its tensors
 * are gathered in the walk's order. */
enum { SPEC_TENSOR = 0, SPEC_VALUE = 1, SPEC_SEQ = 2, SPEC_DICT = 3, SPEC_OBJECT = 4 };
#define SPEC_DEPTH 32 /* nesting a spec may have (walk_spec.py makes none deeper) */

static PyObject *s_dict; /* "__dict__" */

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
    if (n != 5 || !PyType_Check(PyTuple_GET_ITEM(spec, 1)) ||
        !PyType_IsSubtype((PyTypeObject *)PyTuple_GET_ITEM(spec, 1), &PyDict_Type) ||
        !keys_valid(PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 3), PyTuple_GET_ITEM(spec, 4)))
      goto bad;
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
  PyObject *path[SPEC_DEPTH + 1]; /* the objects being matched, outermost first: one met again is a cycle */
  int depth;
} Walk;

static int spec_matches(PyObject *spec, PyObject *v, Walk *w);

/* Whether one dict item matches: the key of the expected key's type, equal to it and hashing to its hash, the value
 * matching its spec. */
static int item_matches(PyObject *k, PyObject *val, PyObject *want, PyObject *hash, PyObject *spec, Walk *w) {
  int ok = k == want ? 1 : (Py_TYPE(k) != Py_TYPE(want) ? 0 : same(k, want));
  if (ok > 0) ok = same_hash(k, hash);
  if (ok > 0) ok = spec_matches(spec, val, w);
  return ok;
}

/* Matches the items of a dict (exactly a dict) against keys, hashes and specs, in order.  snapshot: its items are
 * taken first and then matched, as tree.object_fields takes an object's __dict__ items; else it is read as it is
 * matched, as the walk iterates a dict argument's items. */
static int dict_matches(PyObject *d, PyObject *keys, PyObject *hashes, PyObject *specs, int snapshot, Walk *w) {
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
                          PyTuple_GET_ITEM(hashes, i), PyTuple_GET_ITEM(specs, i), w);
      }
      if (ok > 0 && PyList_GET_SIZE(items) != n) ok = 0;
      Py_DECREF(items);
    }
  } else {
    while (ok > 0 && i < n && PyDict_Next(d, &pos, &k, &val)) {
      Py_INCREF(k);
      Py_INCREF(val);
      ok = item_matches(k, val, PyTuple_GET_ITEM(keys, i), PyTuple_GET_ITEM(hashes, i), PyTuple_GET_ITEM(specs, i), w);
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
  case SPEC_DICT: /* an exact dict read as the walk iterates it; a subclass through its items(), taken first */
    return dict_matches(v, PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 3), PyTuple_GET_ITEM(spec, 4),
                        !PyDict_CheckExact(v), w);
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
        ok = PyDict_CheckExact(d) ? dict_matches(d, keys, PyTuple_GET_ITEM(spec, 3), PyTuple_GET_ITEM(spec, 4), 1, w)
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
 * name; env_dict, settings; and what owner_modes_init reads) is called with (instance, args, kwargs) and gives the
 * list of the call's tensors, in the walk's order, where graphjit's settings are the ones it was made under, every
 * argument matches its spec, the owner and the modes are as keyed and the tensors pass the check (keys.py then reuses
 * the last walked key: the walk would give it again), else None, having changed nothing (an Exception of a
 * comparison, an attribute, a probe or the check is cleared: the walk meets it again and says so; any other error is
 * the call's).  It only reads: threads may call one check at once. */
typedef struct {
  PyObject_HEAD
  PyObject *refs;
  PyObject *env_dict, *settings, *args, *kwargs;
  Layout layout; /* its owner and modes part */
  vectorcallfunc vectorcall;
} WalkCheck;

static int walk_check_matches(WalkCheck *self, PyObject *instance, PyObject *args, PyObject *kwargs, Walk *w) {
  if (PyDict_GetItemWithError(self->env_dict, s_settings) != self->settings) return PyErr_Occurred() ? -1 : 0;
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
  ok = owner_modes_match(&self->layout, 0, instance);
  if (ok <= 0) return ok;
  PyObject *t = w->tensors;
  return truthy_call(self->layout.check, PySequence_Fast_ITEMS(t), (size_t)PyList_GET_SIZE(t));
}

static PyObject *walk_check_vectorcall(WalkCheck *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL) {
    PyErr_SetString(PyExc_TypeError, "a graphjit walk check takes (instance, args, kwargs)");
    return NULL;
  }
  PyObject *refs = self->refs;
  if (refs == NULL) Py_RETURN_NONE; /* never made */
  Walk w;
  w.depth = 0;
  w.tensors = PyList_New(0);
  if (w.tensors == NULL) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  Py_INCREF(refs);
  int ok = walk_check_matches(self, args[0], args[1], args[2], &w);
  Py_DECREF(refs);
  if (ok > 0) return w.tensors;
  Py_DECREF(w.tensors);
  if (ok < 0) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL; /* KeyboardInterrupt and the like: the call's */
    PyErr_Clear();
  }
  Py_RETURN_NONE;
}

static int walk_check_init(WalkCheck *self, PyObject *args, PyObject *kw) {
  PyObject *d;
  if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
    PyErr_SetString(PyExc_TypeError, "WalkCheck(dict) takes no keyword arguments");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &d)) return -1;
  if (self->refs != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "a graphjit walk check is made once");
    return -1;
  }
  Layout l;
  memset(&l, 0, sizeof l);
  if (owner_modes_init(&l, d) < 0) return -1;
  PyObject *env_dict = item(d, "env_dict"), *settings = item(d, "settings"), *specs = item(d, "args"),
           *named = item(d, "kwargs");
  if (env_dict == NULL || settings == NULL || specs == NULL || named == NULL) return -1;
  if (!PyDict_Check(env_dict) || !PyTuple_CheckExact(specs) || !PyTuple_CheckExact(named)) {
    PyErr_SetString(PyExc_TypeError, "graphjit walk check: env_dict: a dict; args, kwargs: tuples");
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
  Py_INCREF(d);
  self->refs = d;
  self->env_dict = env_dict;
  self->settings = settings;
  self->args = specs;
  self->kwargs = named;
  self->layout = l;
  self->vectorcall = (vectorcallfunc)walk_check_vectorcall;
  return 0;
}

static PyObject *walk_check_call(WalkCheck *self, PyObject *args, PyObject *kw) {
  return PyVectorcall_Call((PyObject *)self, args, kw);
}

static int walk_check_traverse(WalkCheck *self, visitproc visit, void *arg) {
  Py_VISIT(self->refs);
  return 0;
}

static int walk_check_clear(WalkCheck *self) {
  Py_CLEAR(self->refs); /* every borrowed pointer points into refs: a call gives None from now on */
  return 0;
}

static void walk_check_dealloc(WalkCheck *self) {
  PyObject_GC_UnTrack(self);
  walk_check_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject WalkCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "graphjit._lane.WalkCheck",
    .tp_basicsize = sizeof(WalkCheck),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A walked call's structure, checked in one call: WalkCheck(dict)(instance, args, kwargs) -> its tensors "
              "or None; see graphjit/walk_spec.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)walk_check_init,
    .tp_call = (ternaryfunc)walk_check_call,
    .tp_vectorcall_offset = offsetof(WalkCheck, vectorcall),
    .tp_dealloc = (destructor)walk_check_dealloc,
    .tp_traverse = (traverseproc)walk_check_traverse,
    .tp_clear = (inquiry)walk_check_clear,
};

/* ---- the front: a graphed function's wrapper (wrapt calls it with (wrapped, instance, args, kwargs)) ---------- */

/* The wrapper of a function decorated while the lane was loaded: the plan its state holds now (state.lane) serves
 * the call where it can, else the state's Python path (state.decide) decides it, with no Python frame in between. */
typedef struct {
  PyObject_HEAD
  PyObject *state, *decide, *unbound; /* unbound: the instance wrapt hands an unbound call (the decide's None) */
  vectorcallfunc vectorcall;
} Front;

static PyObject *front_vectorcall(Front *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 4 || kwnames != NULL) {
    PyErr_SetString(PyExc_TypeError, "a graphed function's wrapper takes (wrapped, instance, args, kwargs)");
    return NULL;
  }
  if (self->state == NULL || self->decide == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "a graphed function's wrapper used after it was cleared");
    return NULL;
  }
  PyObject *call[4] = {args[0], args[1] == self->unbound ? Py_None : args[1], args[2], args[3]};
  PyObject *plan = PyObject_GetAttr(self->state, s_lane);
  if (plan == NULL) return NULL;
  if (Py_IS_TYPE(plan, &PlanType)) {
    PyObject *r = plan_run((Plan *)plan, call + 1, 3);
    PyObject *miss = ((Plan *)plan)->miss;
    Py_DECREF(plan);
    if (r != miss) return r; /* served (or the served call's error) */
    Py_DECREF(r); /* the plan's own reference to miss keeps it alive */
  } else {
    Py_DECREF(plan);
  }
  return PyObject_Vectorcall(self->decide, call, 4, NULL);
}

static int front_init(Front *self, PyObject *args, PyObject *kw) {
  PyObject *state, *decide, *unbound;
  if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
    PyErr_SetString(PyExc_TypeError, "Front(state, decide, unbound) takes no keyword arguments");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "OOO", &state, &decide, &unbound)) return -1;
  Py_INCREF(state);
  Py_INCREF(decide);
  Py_INCREF(unbound);
  Py_XSETREF(self->state, state);
  Py_XSETREF(self->decide, decide);
  Py_XSETREF(self->unbound, unbound);
  self->vectorcall = (vectorcallfunc)front_vectorcall;
  return 0;
}

static PyObject *front_call(Front *self, PyObject *args, PyObject *kw) {
  return PyVectorcall_Call((PyObject *)self, args, kw);
}

static int front_traverse(Front *self, visitproc visit, void *arg) {
  Py_VISIT(self->state);
  Py_VISIT(self->decide);
  Py_VISIT(self->unbound);
  return 0;
}

static int front_clear(Front *self) {
  Py_CLEAR(self->state);
  Py_CLEAR(self->decide);
  Py_CLEAR(self->unbound);
  return 0;
}

static void front_dealloc(Front *self) {
  PyObject_GC_UnTrack(self);
  front_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FrontType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "graphjit._lane.Front",
    .tp_basicsize = sizeof(Front),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A graphed function's wrapper: Front(state, decide, unbound); see graphjit/lane.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)front_init,
    .tp_call = (ternaryfunc)front_call,
    .tp_vectorcall_offset = offsetof(Front, vectorcall),
    .tp_dealloc = (destructor)front_dealloc,
    .tp_traverse = (traverseproc)front_traverse,
    .tp_clear = (inquiry)front_clear,
};

static struct PyModuleDef lane_module = {
    PyModuleDef_HEAD_INIT, "_lane", "graphjit's replay lane (see graphjit/lane.py).", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lane(void) {
  if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&FrontType) < 0 || PyType_Ready(&LayoutCheckType) < 0 ||
      PyType_Ready(&WalkCheckType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&lane_module);
  if (m == NULL) return NULL;
#define INTERN(var, text) \
  if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
  INTERN(s_settings, "_settings");
  INTERN(s_phase, "phase");
  INTERN(s_training, "training");
  INTERN(s_check, "check");
  INTERN(s_recheck, "recheck");
  INTERN(s_feeds, "feeds");
  INTERN(s_advances, "advances");
  INTERN(s_handoff, "handoff");
  INTERN(s_broken, "broken");
  INTERN(s_last_key, "last_key");
  INTERN(s_targets, "targets");
  INTERN(s_apply, "apply");
  INTERN(s_lane, "lane");
  INTERN(s_entries, "entries");
  INTERN(s_dict, "__dict__");
#undef INTERN
  Py_INCREF(&PlanType);
  if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) return NULL;
  Py_INCREF(&FrontType);
  if (PyModule_AddObject(m, "Front", (PyObject *)&FrontType) < 0) return NULL;
  Py_INCREF(&LayoutCheckType);
  if (PyModule_AddObject(m, "LayoutCheck", (PyObject *)&LayoutCheckType) < 0) return NULL;
  Py_INCREF(&WalkCheckType);
  if (PyModule_AddObject(m, "WalkCheck", (PyObject *)&WalkCheckType) < 0) return NULL;
  if (PyModule_AddIntConstant(m, "ABI", LANE_ABI) < 0) return NULL;
  if (PyModule_AddIntConstant(m, "MAX_TENSORS", LANE_MAX) < 0) return NULL;
  return m;
}
