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
 *
 * A plan checks a call's layout with the functions lane_checks.c shares (lane.h: layout_matches), which also serve
 * keys.py's signing checks (LayoutCheck, WalkCheck); both files are compiled into one library.  A keyword call's plan
 * (a Hugging Face model's forward) holds a WalkCheck instead: the one keys.py signs such a call with, made again with
 * the plan's tensor check (strides included); it gives the call's tensors in the order the handoff indexes them.
 */
#include "lane.h"

#define LANE_ABI 6

typedef int (*feed_launch_t)(unsigned long long *table, void *stream);

static PyObject *s_entries, *s_lane, *s_phase, *s_check, *s_recheck, *s_feeds, *s_advances, *s_handoff,
    *s_broken, *s_last_key, *s_targets, *s_apply;

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

typedef struct {
  PyObject_HEAD
  PyObject *refs; /* the dict the plan was made from: keeps every borrowed object below alive; NULL once retired */
  PyObject *miss; /* what run() returns where the Python path must serve the call (lane.MISS): a reference of its own */
  /* the environment a served call needs */
  PyObject *env_dict, *settings, *tls;
  int prebound;
  Layout layout; /* the call's arguments, owner, modes and tensors' metadata (strides included); unused with walk */
  PyObject *walk;   /* a keyword call's: the WalkCheck of its structure (borrowed from refs), or NULL: layout */
  Py_ssize_t n_walk; /* the tensors walk gives */
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

static int address(PyObject *ptr, PyObject *t, unsigned long long *out) { /* 0, or -1 with an error set */
  PyObject *r = PyObject_Vectorcall(ptr, &t, 1, NULL);
  if (r == NULL) return -1;
  *out = PyLong_AsUnsignedLongLong(r);
  Py_DECREF(r);
  return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
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
#define INT(var, name)                     \
  do {                                     \
    if ((o = item(d, name)) == NULL) return -1; \
    var = PyLong_AsSsize_t(o);             \
    if (var == -1 && PyErr_Occurred()) return -1; \
  } while (0)
  Py_ssize_t n_tensors;
  PyObject *walk = PyDict_GetItemString(d, "walk"); /* optional: a plain call's plan has none */
  if (walk != NULL && walk != Py_None) {
    if (!is_walk_check(walk)) {
      PyErr_SetString(PyExc_TypeError, "graphjit lane plan: walk: a WalkCheck");
      return -1;
    }
    INT(n_tensors, "n_tensors");
    if (n_tensors < 1 || n_tensors > LANE_MAX) {
      PyErr_SetString(PyExc_ValueError, "graphjit lane plan: n_tensors outside 1..MAX_TENSORS");
      return -1;
    }
    self->walk = walk;
    self->n_walk = n_tensors;
  } else {
    self->walk = NULL;
    n_tensors = layout_init(&self->layout, d);
    if (n_tensors < 0) return -1;
  }
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
                             PyObject *kwargs, PyObject **tensors, Py_ssize_t *n_tensors, PyObject **walked) {
  if (self->walk == NULL && kwargs != Py_None && (!PyDict_Check(kwargs) || PyDict_GET_SIZE(kwargs) != 0)) return 0;
  /* GRAPHJIT_* read again since the plan (env.refresh), or another thread's settings: the Python path */
  if (PyDict_GetItemWithError(self->env_dict, s_settings) != self->settings) return PyErr_Occurred() ? -1 : 0;
  /* inside another graphed call's warmup, capture or verify: part of it (the Python path says so) */
  PyObject *phase = PyObject_GetAttr(self->tls, s_phase);
  if (phase == NULL) return -1;
  Py_DECREF(phase);
  if (phase != Py_None) return 0;
  /* the arguments, the owner, the modes, the tensors' metadata (strides included) */
  int ok;
  if (self->walk != NULL) { /* a keyword call: the walk check signs it as Signer.sign_walk would (bound as written) */
    PyObject *a[3] = {self->prebound ? Py_None : instance, args, kwargs};
    PyObject *got = PyObject_Vectorcall(self->walk, a, 3, NULL);
    if (got == NULL) return -1;
    if (!PyList_CheckExact(got) || PyList_GET_SIZE(got) != self->n_walk) { /* None: not this key's structure */
      Py_DECREF(got);
      return 0;
    }
    *walked = got; /* holds the tensors below until the call is done */
    for (Py_ssize_t i = 0; i < self->n_walk; ++i) tensors[i] = PyList_GET_ITEM(got, i);
    *n_tensors = self->n_walk;
  } else {
    ok = layout_matches(&self->layout, self->prebound, instance, args, tensors, n_tensors);
    if (ok <= 0) return ok;
  }
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
  if (PyErr_Occurred() && swallowed() < 0) return NULL;
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
  PyObject *targets = NULL, *outs = NULL, *result = NULL, *walked = NULL;
  int ok = signed_as_planned(self, state, entry, instance, args, kwargs, tensors, &n, &walked);
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
      Py_XDECREF(walked);
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
    Py_XDECREF(walked);
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
  Py_XDECREF(walked);
  Py_DECREF(refs);
  Py_DECREF(state);
  Py_DECREF(entry);
  return result;
miss:
  Py_XDECREF(targets);
  Py_XDECREF(walked);
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
  if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&FrontType) < 0) return NULL;
  PyObject *m = PyModule_Create(&lane_module);
  if (m == NULL || lane_checks_add(m) < 0 || lane_guards_add(m) < 0) return NULL;
#define INTERN(var, text) \
  if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
  INTERN(s_phase, "phase");
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
#undef INTERN
  Py_INCREF(&PlanType);
  if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) return NULL;
  Py_INCREF(&FrontType);
  if (PyModule_AddObject(m, "Front", (PyObject *)&FrontType) < 0) return NULL;
  if (PyModule_AddIntConstant(m, "ABI", LANE_ABI) < 0) return NULL;
  if (PyModule_AddIntConstant(m, "MAX_TENSORS", LANE_MAX) < 0) return NULL;
  return m;
}
