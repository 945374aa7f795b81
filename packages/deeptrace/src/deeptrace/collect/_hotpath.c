/* The collector's hot path in C: what runs on the training thread for every span and collective.
 *
 * The same objects as deeptrace/collect/contexts.py (SpanContext, CollectiveContext, ThreadState) and
 * heartbeat.py (GroupMarks), with the same attributes, so that the writer thread, the heartbeat and the tests
 * read them unchanged; contexts.py stays the reference and the fallback where this module is not built.
 *
 * Why in C: recording a span from Python costs a few microseconds inside a real step, almost all of it cache
 * misses on the interpreter's frames, code objects and dictionaries after the training code's own work has
 * evicted them. Here a span is one allocation, two clock reads and a list append, with no Python frame, so the
 * collector stays under 1 % of a step even at several spans per millisecond (tools/bench/collector_overhead.py).
 *
 * A Hub per collector holds what the contexts need: the creating thread's ident and state (the fast path), the
 * current step, the groups' marks, and the collector's Python callables for the rare paths (another thread's
 * state, a full buffer's flush, a new group, async lanes, error messages), so that those stay written once, in
 * Python. Messages come from the same Python helpers as the pure path's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* The clock of time.monotonic_ns() on Linux, so these spans line up with everything timed in Python. */
static inline long long
monotonic_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

static PyObject *str_step, *str_layer, *str_nbytes, *str_group, *str_seq, *str_world;

/* ---- ThreadState: a thread's track name, its innermost open span, and the buffer spans go to ---------------- */

typedef struct {
    PyObject_HEAD
    PyObject *base;   /* str: the thread's track */
    PyObject *buffer; /* list: the collector's buffer */
    Py_ssize_t limit; /* flush once the buffer holds this many */
    PyObject *top;    /* the innermost open span, None outside any */
} ThreadStateObject;

static PyTypeObject ThreadStateType;

static PyObject *
threadstate_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"base", "buffer", "limit", NULL};
    PyObject *base, *buffer;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UO!n", keywords, &base, &PyList_Type, &buffer, &limit)) {
        return NULL;
    }
    ThreadStateObject *self = PyObject_GC_New(ThreadStateObject, type);
    if (self == NULL) {
        return NULL;
    }
    self->base = Py_NewRef(base);
    self->buffer = Py_NewRef(buffer);
    self->limit = limit;
    self->top = Py_NewRef(Py_None);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int
threadstate_traverse(ThreadStateObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->base);
    Py_VISIT(self->buffer);
    Py_VISIT(self->top);
    return 0;
}

static int
threadstate_clear(ThreadStateObject *self)
{
    Py_CLEAR(self->base);
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->top);
    return 0;
}

static void
threadstate_dealloc(ThreadStateObject *self)
{
    PyObject_GC_UnTrack(self);
    threadstate_clear(self);
    PyObject_GC_Del(self);
}

static int
set_top(ThreadStateObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "top cannot be deleted");
        return -1;
    }
    Py_SETREF(self->top, Py_NewRef(value));
    return 0;
}

static PyObject *
get_top(ThreadStateObject *self, void *closure)
{
    return Py_NewRef(self->top);
}

static PyMemberDef threadstate_members[] = {
    {"base", T_OBJECT, offsetof(ThreadStateObject, base), READONLY, NULL},
    {"buffer", T_OBJECT, offsetof(ThreadStateObject, buffer), READONLY, NULL},
    {"limit", T_PYSSIZET, offsetof(ThreadStateObject, limit), 0, NULL},
    {NULL},
};

static PyGetSetDef threadstate_getset[] = {
    {"top", (getter)get_top, (setter)set_top, "the innermost open span, None outside any", NULL},
    {NULL},
};

static PyTypeObject ThreadStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deeptrace.collect._hotpath.ThreadState",
    .tp_basicsize = sizeof(ThreadStateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Per thread: its track, its innermost open span, and the collector's buffer and its limit.",
    .tp_new = threadstate_new,
    .tp_traverse = (traverseproc)threadstate_traverse,
    .tp_clear = (inquiry)threadstate_clear,
    .tp_dealloc = (destructor)threadstate_dealloc,
    .tp_members = threadstate_members,
    .tp_getset = threadstate_getset,
};

/* ---- GroupMarks: a process group's next sequence number and its last entered and left collectives ---------- */

typedef struct {
    PyObject_HEAD
    Py_ssize_t next_seq;
    PyObject *entered; /* None or a CollectiveContext */
    PyObject *left;
} GroupMarksObject;

static PyTypeObject GroupMarksType;

static PyObject *
groupmarks_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "GroupMarks() takes no arguments");
        return NULL;
    }
    GroupMarksObject *self = PyObject_GC_New(GroupMarksObject, type);
    if (self == NULL) {
        return NULL;
    }
    self->next_seq = 0;
    self->entered = Py_NewRef(Py_None);
    self->left = Py_NewRef(Py_None);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int
groupmarks_traverse(GroupMarksObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->entered);
    Py_VISIT(self->left);
    return 0;
}

static int
groupmarks_clear(GroupMarksObject *self)
{
    Py_CLEAR(self->entered);
    Py_CLEAR(self->left);
    return 0;
}

static void
groupmarks_dealloc(GroupMarksObject *self)
{
    PyObject_GC_UnTrack(self);
    groupmarks_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *
groupmarks_left_seq(GroupMarksObject *self, PyObject *unused)
{
    if (self->left == NULL || self->left == Py_None) {
        Py_RETURN_NONE;
    }
    return PyObject_GetAttr(self->left, str_seq);
}

static PyMemberDef groupmarks_members[] = {
    {"next_seq", T_PYSSIZET, offsetof(GroupMarksObject, next_seq), 0, NULL},
    {"entered", T_OBJECT, offsetof(GroupMarksObject, entered), READONLY, NULL},
    {"left", T_OBJECT, offsetof(GroupMarksObject, left), READONLY, NULL},
    {NULL},
};

static PyMethodDef groupmarks_methods[] = {
    {"left_seq", (PyCFunction)groupmarks_left_seq, METH_NOARGS, "the sequence number last left, None before any"},
    {NULL},
};

static PyTypeObject GroupMarksType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deeptrace.collect._hotpath.GroupMarks",
    .tp_basicsize = sizeof(GroupMarksObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One process group's next sequence number and its collectives last entered and last left.",
    .tp_new = groupmarks_new,
    .tp_traverse = (traverseproc)groupmarks_traverse,
    .tp_clear = (inquiry)groupmarks_clear,
    .tp_dealloc = (destructor)groupmarks_dealloc,
    .tp_members = groupmarks_members,
    .tp_methods = groupmarks_methods,
};

/* ---- Hub: one collector's state for its contexts ------------------------------------------------------------ */

#define MAX_KNOWN 16 /* categories compared by identity (spans.Category has 8) */
#define GROUP_CACHE 4

typedef struct {
    PyObject_HEAD
    int has_main;              /* the creating thread still runs (its ident may be trusted) */
    unsigned long main_ident;
    PyObject *main_state;      /* ThreadState of the creating thread */
    PyObject *step;            /* the step begun last, None before any */
    PyObject *groups;          /* dict: group -> GroupMarks (shared with the heartbeat) */
    PyObject *categories;      /* the known categories (a set) */
    PyObject *known[MAX_KNOWN];/* the same, borrowed from the set: a call site passes one of these */
    int known_count;
    PyObject *comm;            /* Category.COMM: a collective's category */
    PyObject *collector;       /* the Collector (contexts' `collector` attribute) */
    PyObject *thread_state;    /* () -> ThreadState of the calling thread (not the creating one) */
    PyObject *flush;           /* () -> None: hand the buffer to the writer */
    PyObject *new_group;       /* (group) -> GroupMarks */
    PyObject *take_lane;       /* (context) -> None: begin() */
    PyObject *free_lane;       /* (context) -> None: end() */
    PyObject *reused;          /* (name) -> exception: a context entered twice */
    PyObject *unknown_category;/* (category) -> exception */
    /* The marks of the groups used last, by the identity of the group object a call site passes (a literal, the
     * same object every time): found without hashing into `groups`, whose table is cold inside a step. Strong
     * references, so that an address is never reused by another group while cached. */
    PyObject *group_keys[GROUP_CACHE];
    PyObject *group_marks[GROUP_CACHE];
    int group_next;
} HubObject;

static PyTypeObject HubType, SpanType, CollectiveType;

static PyObject *
hub_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"main_ident", "main_state", "groups", "categories", "comm", "collector",
                               "thread_state", "flush", "new_group", "take_lane", "free_lane", "reused",
                               "unknown_category", NULL};
    unsigned long main_ident;
    PyObject *main_state, *groups, *categories, *comm, *collector, *thread_state, *flush, *new_group, *take_lane,
        *free_lane, *reused, *unknown_category;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$kO!O!O!OOOOOOOOO", keywords, &main_ident, &ThreadStateType,
                                     &main_state, &PyDict_Type, &groups, &PyFrozenSet_Type, &categories, &comm,
                                     &collector, &thread_state, &flush, &new_group, &take_lane, &free_lane, &reused,
                                     &unknown_category)) {
        return NULL;
    }
    /* The categories themselves, compared by identity first: cheaper than hashing into the set, whose table is
     * cold in a step by the time the next span starts. The set stays the check for anything else. */
    PyObject *known[MAX_KNOWN], *member;
    int known_count = 0;
    PyObject *members = PyObject_GetIter(categories);
    if (members == NULL) {
        return NULL;
    }
    while ((member = PyIter_Next(members)) != NULL) {
        if (known_count < MAX_KNOWN) {
            known[known_count++] = member; /* borrowed: the set, which the hub keeps, holds it */
        }
        Py_DECREF(member);
    }
    Py_DECREF(members);
    if (PyErr_Occurred()) {
        return NULL;
    }
    HubObject *self = PyObject_GC_New(HubObject, type);
    if (self == NULL) {
        return NULL;
    }
    self->has_main = 1;
    self->main_ident = main_ident;
    self->main_state = Py_NewRef(main_state);
    self->step = Py_NewRef(Py_None);
    self->groups = Py_NewRef(groups);
    self->categories = Py_NewRef(categories);
    memcpy(self->known, known, sizeof(PyObject *) * (size_t)known_count);
    self->known_count = known_count;
    self->comm = Py_NewRef(comm);
    self->collector = Py_NewRef(collector);
    self->thread_state = Py_NewRef(thread_state);
    self->flush = Py_NewRef(flush);
    self->new_group = Py_NewRef(new_group);
    self->take_lane = Py_NewRef(take_lane);
    self->free_lane = Py_NewRef(free_lane);
    self->reused = Py_NewRef(reused);
    self->unknown_category = Py_NewRef(unknown_category);
    for (int i = 0; i < GROUP_CACHE; i++) {
        self->group_keys[i] = self->group_marks[i] = NULL;
    }
    self->group_next = 0;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int
hub_traverse(HubObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->main_state);
    Py_VISIT(self->step);
    Py_VISIT(self->groups);
    Py_VISIT(self->categories);
    Py_VISIT(self->comm);
    Py_VISIT(self->collector);
    Py_VISIT(self->thread_state);
    Py_VISIT(self->flush);
    Py_VISIT(self->new_group);
    Py_VISIT(self->take_lane);
    Py_VISIT(self->free_lane);
    Py_VISIT(self->reused);
    Py_VISIT(self->unknown_category);
    for (int i = 0; i < GROUP_CACHE; i++) {
        Py_VISIT(self->group_keys[i]);
        Py_VISIT(self->group_marks[i]);
    }
    return 0;
}

static int
hub_clear(HubObject *self)
{
    Py_CLEAR(self->main_state);
    Py_CLEAR(self->step);
    Py_CLEAR(self->groups);
    Py_CLEAR(self->categories);
    Py_CLEAR(self->comm);
    Py_CLEAR(self->collector);
    Py_CLEAR(self->thread_state);
    Py_CLEAR(self->flush);
    Py_CLEAR(self->new_group);
    Py_CLEAR(self->take_lane);
    Py_CLEAR(self->free_lane);
    Py_CLEAR(self->reused);
    Py_CLEAR(self->unknown_category);
    for (int i = 0; i < GROUP_CACHE; i++) {
        Py_CLEAR(self->group_keys[i]);
        Py_CLEAR(self->group_marks[i]);
    }
    return 0;
}

static void
hub_dealloc(HubObject *self)
{
    PyObject_GC_UnTrack(self);
    hub_clear(self);
    PyObject_GC_Del(self);
}

/* Raise the exception that a Python helper builds (one place for each message). */
static PyObject *
raise_built(PyObject *builder, PyObject *argument)
{
    PyObject *error = PyObject_CallOneArg(builder, argument);
    if (error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
    return NULL;
}

/* The calling thread's state (a new reference): the creating thread's without a call, another's from Python. */
static ThreadStateObject *
current_thread(HubObject *hub)
{
    if (hub->has_main && PyThread_get_thread_ident() == hub->main_ident) {
        return (ThreadStateObject *)Py_NewRef(hub->main_state);
    }
    PyObject *state = PyObject_CallNoArgs(hub->thread_state);
    if (state != NULL && !Py_IS_TYPE(state, &ThreadStateType)) {
        PyErr_Format(PyExc_TypeError, "thread_state() returned %R, not a ThreadState", state);
        Py_CLEAR(state);
    }
    return (ThreadStateObject *)state;
}

static inline int
is_known_category(HubObject *hub, PyObject *category)
{
    for (int i = 0; i < hub->known_count; i++) {
        if (hub->known[i] == category) {
            return 1;
        }
    }
    return 0;
}

/* One keyword argument of a fast call, matched by identity first (call sites pass interned names). */
static int
keyword_is(PyObject *key, PyObject *name)
{
    return key == name || PyUnicode_Compare(key, name) == 0;
}

static PyObject *
unexpected_keyword(const char *function, PyObject *key)
{
    PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", function, key);
    return NULL;
}

static PyObject *
get_main_ident(HubObject *self, void *closure)
{
    if (!self->has_main) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLong(self->main_ident);
}

static int
set_main_ident(HubObject *self, PyObject *value, void *closure)
{
    if (value == NULL || value == Py_None) {
        self->has_main = 0; /* the creating thread ended: its ident may be reused by another thread */
        return 0;
    }
    unsigned long ident = PyLong_AsUnsignedLong(value);
    if (ident == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    self->main_ident = ident;
    self->has_main = 1;
    return 0;
}

static PyObject *
get_step(HubObject *self, void *closure)
{
    return Py_NewRef(self->step);
}

static int
set_step(HubObject *self, PyObject *value, void *closure)
{
    Py_SETREF(self->step, Py_NewRef(value == NULL ? Py_None : value));
    return 0;
}

/* ---- SpanContext -------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    HubObject *hub;
    PyObject *name;
    PyObject *category;
    PyObject *step;
    PyObject *layer;
    PyObject *nbytes;
    long long start_ns; /* 0 until entered: a second entry is refused */
    long long end_ns;
    PyObject *parent;   /* NULL until entered; then the span innermost at entry, None, or a begun span's lane */
    PyObject *thread;   /* NULL until entered */
    vectorcallfunc call; /* context_call: what the `with` statement calls to enter and to leave (see WithSlot) */
} SpanObject;

static PyObject *context_call(PyObject *context, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *
hub_span(HubObject *hub, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "span() takes 2 positional arguments (name, category) but %zd were given",
                     nargs);
        return NULL;
    }
    PyObject *step = Py_None, *layer = Py_None, *nbytes = Py_None;
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < keywords; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (keyword_is(key, str_layer)) {
            layer = value;
        } else if (keyword_is(key, str_step)) {
            step = value;
        } else if (keyword_is(key, str_nbytes)) {
            nbytes = value;
        } else {
            return unexpected_keyword("span", key);
        }
    }
    PyObject *category = args[1];
    if (!is_known_category(hub, category)) {
        int known = PySet_Contains(hub->categories, category);
        if (known <= 0) {
            return known < 0 ? NULL : raise_built(hub->unknown_category, category);
        }
    }
    SpanObject *self = PyObject_GC_New(SpanObject, &SpanType);
    if (self == NULL) {
        return NULL;
    }
    self->hub = (HubObject *)Py_NewRef(hub);
    self->name = Py_NewRef(args[0]);
    self->category = Py_NewRef(category);
    self->step = Py_NewRef(step == Py_None ? hub->step : step);
    self->layer = Py_NewRef(layer);
    self->nbytes = Py_NewRef(nbytes);
    self->start_ns = 0;
    self->end_ns = 0;
    self->parent = NULL;
    self->thread = NULL;
    self->call = context_call;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int
span_traverse(SpanObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->hub);
    Py_VISIT(self->name);
    Py_VISIT(self->category);
    Py_VISIT(self->step);
    Py_VISIT(self->layer);
    Py_VISIT(self->nbytes);
    Py_VISIT(self->parent);
    Py_VISIT(self->thread);
    return 0;
}

static int
span_clear(SpanObject *self)
{
    Py_CLEAR(self->hub);
    Py_CLEAR(self->name);
    Py_CLEAR(self->category);
    Py_CLEAR(self->step);
    Py_CLEAR(self->layer);
    Py_CLEAR(self->nbytes);
    Py_CLEAR(self->parent);
    Py_CLEAR(self->thread);
    return 0;
}

static void
span_dealloc(SpanObject *self)
{
    PyObject_GC_UnTrack(self);
    span_clear(self);
    PyObject_GC_Del(self);
}

/* Entering a span or a collective: become the innermost open span of the calling thread. The start is taken
 * before the span becomes the top (the heartbeat thread reads the top's start). */
static int
open_on_thread(PyObject *context, HubObject *hub, PyObject **thread_slot, PyObject **parent_slot,
               long long *start_slot)
{
    ThreadStateObject *thread = current_thread(hub);
    if (thread == NULL) {
        return -1;
    }
    Py_XSETREF(*thread_slot, (PyObject *)thread);
    Py_XSETREF(*parent_slot, Py_NewRef(thread->top));
    *start_slot = monotonic_now_ns();
    Py_SETREF(thread->top, Py_NewRef(context));
    return 0;
}

/* Leaving: the end time, the thread's top back to the parent (a begun context is never the top), and the finished
 * context appended to the buffer, flushed once full. */
static int
close_on_thread(PyObject *context, HubObject *hub, PyObject *thread_object, PyObject *parent, long long *end_slot)
{
    *end_slot = monotonic_now_ns();
    if (thread_object == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a span context was left without being entered");
        return -1;
    }
    ThreadStateObject *thread = (ThreadStateObject *)thread_object;
    if (thread->top == context) {
        Py_SETREF(thread->top, Py_NewRef(parent));
    }
    return 0;
}

static PyObject *
append_finished(PyObject *context, HubObject *hub, PyObject *thread_object)
{
    ThreadStateObject *thread = (ThreadStateObject *)thread_object;
    if (PyList_Append(thread->buffer, context) < 0) {
        return NULL;
    }
    if (PyList_GET_SIZE(thread->buffer) >= thread->limit) {
        PyObject *done = PyObject_CallNoArgs(hub->flush);
        if (done == NULL) {
            return NULL;
        }
        Py_DECREF(done);
    }
    Py_RETURN_NONE;
}

static PyObject *
span_enter(SpanObject *self, PyObject *unused)
{
    if (self->start_ns) {
        return raise_built(self->hub->reused, self->name);
    }
    if (open_on_thread((PyObject *)self, self->hub, &self->thread, &self->parent, &self->start_ns) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
}

static PyObject *
span_leave(PyObject *object)
{
    SpanObject *self = (SpanObject *)object;
    if (close_on_thread((PyObject *)self, self->hub, self->thread, self->parent, &self->end_ns) < 0) {
        return NULL;
    }
    return append_finished((PyObject *)self, self->hub, self->thread);
}

static PyObject *
call_then_self(PyObject *function, PyObject *self)
{
    PyObject *done = PyObject_CallOneArg(function, self);
    if (done == NULL) {
        return NULL;
    }
    Py_DECREF(done);
    return Py_NewRef(self);
}

/* begin() of either context: entered (the result of its enter), then onto a lane (contexts.take_lane). */
static PyObject *
begin_context(PyObject *self, HubObject *hub, PyObject *entered)
{
    if (entered == NULL) {
        return NULL;
    }
    Py_DECREF(entered);
    return call_then_self(hub->take_lane, self);
}

/* end() of either context: its lane freed (contexts.free_lane refuses one never begun), then left. */
static PyObject *
end_context(PyObject *self, HubObject *hub, PyObject *(*leave)(PyObject *))
{
    PyObject *freed = call_then_self(hub->free_lane, self);
    if (freed == NULL) {
        return NULL;
    }
    Py_DECREF(freed);
    return leave(self);
}

static PyObject *
span_begin(SpanObject *self, PyObject *unused)
{
    return begin_context((PyObject *)self, self->hub, span_enter(self, NULL));
}

static PyObject *
span_end(SpanObject *self, PyObject *unused)
{
    return end_context((PyObject *)self, self->hub, span_leave);
}

static PyObject *
get_collector(PyObject *self, void *offset)
{
    HubObject *hub = *(HubObject **)((char *)self + (Py_ssize_t)offset);
    return Py_NewRef(hub->collector);
}

static PyMethodDef span_methods[] = {
    {"begin", (PyCFunction)span_begin, METH_NOARGS,
     "Start where a `with` block does not fit; `end()` ends it (on a lane track of its own)."},
    {"end", (PyCFunction)span_end, METH_NOARGS, "End a span started with `begin()`."},
    {NULL},
};

static PyMemberDef span_members[] = {
    {"name", T_OBJECT, offsetof(SpanObject, name), READONLY, NULL},
    {"category", T_OBJECT, offsetof(SpanObject, category), READONLY, NULL},
    {"step", T_OBJECT, offsetof(SpanObject, step), READONLY, NULL},
    {"layer", T_OBJECT, offsetof(SpanObject, layer), READONLY, NULL},
    {"nbytes", T_OBJECT, offsetof(SpanObject, nbytes), READONLY, NULL},
    {"start_ns", T_LONGLONG, offsetof(SpanObject, start_ns), READONLY, NULL},
    {"end_ns", T_LONGLONG, offsetof(SpanObject, end_ns), READONLY, NULL},
    {"parent", T_OBJECT_EX, offsetof(SpanObject, parent), 0, NULL},
    {"thread", T_OBJECT_EX, offsetof(SpanObject, thread), READONLY, NULL},
    {NULL},
};

static PyGetSetDef span_getset[] = {
    {"collector", (getter)get_collector, NULL, "the collector that made it", (void *)offsetof(SpanObject, hub)},
    {NULL},
};

static PyTypeObject SpanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deeptrace.collect._hotpath.SpanContext",
    .tp_basicsize = sizeof(SpanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(SpanObject, call),
    .tp_call = PyVectorcall_Call,
    .tp_doc = "`with collector.span(...)`: times the block; the finished object is the buffered span.",
    .tp_traverse = (traverseproc)span_traverse,
    .tp_clear = (inquiry)span_clear,
    .tp_dealloc = (destructor)span_dealloc,
    .tp_methods = span_methods,
    .tp_members = span_members,
    .tp_getset = span_getset,
};

/* ---- CollectiveContext -------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    HubObject *hub;
    PyObject *name;
    PyObject *group;
    PyObject *given_seq; /* the seq argument: None takes the group's next number at entry */
    Py_ssize_t seq;      /* the sequence number once entered (start_ns set); an int object only when read */
    PyObject *marks;    /* NULL until entered */
    PyObject *step;
    PyObject *nbytes;
    long long start_ns;
    long long end_ns;
    PyObject *parent;
    PyObject *thread;
    vectorcallfunc call;
} CollectiveObject;

static PyObject *
hub_collective(HubObject *hub, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError,
                     "collective() takes 1 or 2 positional arguments (name, group) but %zd were given", nargs);
        return NULL;
    }
    PyObject *group = nargs == 2 ? args[1] : str_world, *nbytes = Py_None, *seq = Py_None, *step = Py_None;
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < keywords; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (keyword_is(key, str_group) && nargs < 2) {
            group = value;
        } else if (keyword_is(key, str_nbytes)) {
            nbytes = value;
        } else if (keyword_is(key, str_seq)) {
            seq = value;
        } else if (keyword_is(key, str_step)) {
            step = value;
        } else {
            return unexpected_keyword("collective", key);
        }
    }
    CollectiveObject *self = PyObject_GC_New(CollectiveObject, &CollectiveType);
    if (self == NULL) {
        return NULL;
    }
    self->hub = (HubObject *)Py_NewRef(hub);
    self->name = Py_NewRef(args[0]);
    self->group = Py_NewRef(group);
    self->given_seq = Py_NewRef(seq);
    self->seq = 0;
    self->marks = NULL;
    self->step = Py_NewRef(step == Py_None ? hub->step : step);
    self->nbytes = Py_NewRef(nbytes);
    self->start_ns = 0;
    self->end_ns = 0;
    self->parent = NULL;
    self->thread = NULL;
    self->call = context_call;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int
collective_traverse(CollectiveObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->hub);
    Py_VISIT(self->name);
    Py_VISIT(self->group);
    Py_VISIT(self->given_seq);
    Py_VISIT(self->marks);
    Py_VISIT(self->step);
    Py_VISIT(self->nbytes);
    Py_VISIT(self->parent);
    Py_VISIT(self->thread);
    return 0;
}

static int
collective_clear(CollectiveObject *self)
{
    Py_CLEAR(self->hub);
    Py_CLEAR(self->name);
    Py_CLEAR(self->group);
    Py_CLEAR(self->given_seq);
    Py_CLEAR(self->marks);
    Py_CLEAR(self->step);
    Py_CLEAR(self->nbytes);
    Py_CLEAR(self->parent);
    Py_CLEAR(self->thread);
    return 0;
}

static void
collective_dealloc(CollectiveObject *self)
{
    PyObject_GC_UnTrack(self);
    collective_clear(self);
    PyObject_GC_Del(self);
}

/* The marks of a group (a new reference): its sequence counter and the heartbeat's record of it at once. */
static PyObject *
group_marks(HubObject *hub, PyObject *group)
{
    for (int i = 0; i < GROUP_CACHE; i++) {
        if (hub->group_keys[i] == group) {
            return Py_NewRef(hub->group_marks[i]);
        }
    }
    PyObject *marks = PyDict_GetItemWithError(hub->groups, group);
    if (marks != NULL) {
        Py_INCREF(marks);
    } else if (PyErr_Occurred()) {
        return NULL;
    } else {
        marks = PyObject_CallOneArg(hub->new_group, group);
        if (marks == NULL) {
            return NULL;
        }
    }
    if (!Py_IS_TYPE(marks, &GroupMarksType)) {
        PyErr_Format(PyExc_TypeError, "the marks of group %R are %R, not GroupMarks", group, marks);
        Py_DECREF(marks);
        return NULL;
    }
    int slot = hub->group_next;
    hub->group_next = (slot + 1) % GROUP_CACHE;
    Py_XSETREF(hub->group_keys[slot], Py_NewRef(group));
    Py_XSETREF(hub->group_marks[slot], Py_NewRef(marks));
    return marks;
}

static PyObject *
collective_enter(CollectiveObject *self, PyObject *unused)
{
    HubObject *hub = self->hub;
    if (self->start_ns) {
        return raise_built(hub->reused, self->name);
    }
    PyObject *marks = group_marks(hub, self->group);
    if (marks == NULL) {
        return NULL;
    }
    Py_XSETREF(self->marks, marks);
    GroupMarksObject *group = (GroupMarksObject *)marks;
    Py_ssize_t seq = group->next_seq;
    if (self->given_seq != Py_None) {
        seq = PyLong_AsSsize_t(self->given_seq);
        if (seq == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    self->seq = seq;
    group->next_seq = seq + 1;
    if (open_on_thread((PyObject *)self, hub, &self->thread, &self->parent, &self->start_ns) < 0) {
        return NULL;
    }
    /* The heartbeat reads name, group, seq and start from the object: one store, on the marks just touched. */
    Py_SETREF(group->entered, Py_NewRef(self));
    return Py_NewRef(self);
}

static PyObject *
collective_leave(PyObject *object)
{
    CollectiveObject *self = (CollectiveObject *)object;
    if (close_on_thread((PyObject *)self, self->hub, self->thread, self->parent, &self->end_ns) < 0) {
        return NULL;
    }
    GroupMarksObject *group = (GroupMarksObject *)self->marks;
    Py_SETREF(group->left, Py_NewRef(self)); /* after end_ns: the heartbeat reads it */
    return append_finished((PyObject *)self, self->hub, self->thread);
}

static PyObject *
collective_begin(CollectiveObject *self, PyObject *unused)
{
    return begin_context((PyObject *)self, self->hub, collective_enter(self, NULL));
}

static PyObject *
collective_end(CollectiveObject *self, PyObject *unused)
{
    return end_context((PyObject *)self, self->hub, collective_leave);
}

static PyObject *
get_seq(CollectiveObject *self, void *closure)
{
    return self->start_ns ? PyLong_FromSsize_t(self->seq) : Py_NewRef(self->given_seq);
}

static PyObject *
get_comm_category(CollectiveObject *self, void *closure)
{
    return Py_NewRef(self->hub->comm);
}

static PyMethodDef collective_methods[] = {
    {"begin", (PyCFunction)collective_begin, METH_NOARGS,
     "Enter where a `with` block does not fit; `end()` leaves it (on a lane track of its own)."},
    {"end", (PyCFunction)collective_end, METH_NOARGS, "Leave a collective entered with `begin()`."},
    {NULL},
};

static PyMemberDef collective_members[] = {
    {"name", T_OBJECT, offsetof(CollectiveObject, name), READONLY, NULL},
    {"group", T_OBJECT, offsetof(CollectiveObject, group), READONLY, NULL},
    {"marks", T_OBJECT_EX, offsetof(CollectiveObject, marks), READONLY, NULL},
    {"step", T_OBJECT, offsetof(CollectiveObject, step), READONLY, NULL},
    {"nbytes", T_OBJECT, offsetof(CollectiveObject, nbytes), READONLY, NULL},
    {"start_ns", T_LONGLONG, offsetof(CollectiveObject, start_ns), READONLY, NULL},
    {"end_ns", T_LONGLONG, offsetof(CollectiveObject, end_ns), READONLY, NULL},
    {"parent", T_OBJECT_EX, offsetof(CollectiveObject, parent), 0, NULL},
    {"thread", T_OBJECT_EX, offsetof(CollectiveObject, thread), READONLY, NULL},
    {NULL},
};

static PyGetSetDef collective_getset[] = {
    {"collector", (getter)get_collector, NULL, "the collector that made it",
     (void *)offsetof(CollectiveObject, hub)},
    {"category", (getter)get_comm_category, NULL, "Category.COMM", NULL},
    {"seq", (getter)get_seq, NULL, "the sequence number in its group; before entry the one given, or None", NULL},
    {NULL},
};

static PyTypeObject CollectiveType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deeptrace.collect._hotpath.CollectiveContext",
    .tp_basicsize = sizeof(CollectiveObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(CollectiveObject, call),
    .tp_call = PyVectorcall_Call,
    .tp_doc = "`with collector.collective(...)`: a COMM span with its group's next sequence number.",
    .tp_traverse = (traverseproc)collective_traverse,
    .tp_clear = (inquiry)collective_clear,
    .tp_dealloc = (destructor)collective_dealloc,
    .tp_methods = collective_methods,
    .tp_members = collective_members,
    .tp_getset = collective_getset,
};

/* ---- Entering and leaving without a bound method ------------------------------------------------------------ */

/* A `with` statement looks __enter__ and __exit__ up on the context's type and binds each to the context. For a C
 * method that binding is a new method object per lookup: two per span, allocated, tracked by the GC and freed
 * around every block, with the method table and the descriptors read from memory that a step's work has long
 * evicted. Both names hold a WithSlot instead, whose binding is the context itself, and the context is callable:
 * called with no argument it enters, with the three exception arguments it leaves. So `ctx.__enter__()`,
 * `ctx.__exit__(t, v, tb)` and the unbound `type(ctx).__enter__(ctx)` of contextlib.ExitStack keep their meaning,
 * at about a third of the cost of a C method pair per `with` block (measured cold: 60-110 ns against 245-260). */

typedef struct {
    PyObject_HEAD
    int leave; /* 0: __enter__, 1: __exit__ */
    vectorcallfunc call;
} WithSlotObject;

static PyObject *
enter_context(PyObject *context)
{
    if (Py_IS_TYPE(context, &SpanType)) {
        return span_enter((SpanObject *)context, NULL);
    }
    return collective_enter((CollectiveObject *)context, NULL);
}

static PyObject *
leave_context(PyObject *context)
{
    return Py_IS_TYPE(context, &SpanType) ? span_leave(context) : collective_leave(context);
}

static PyObject *
context_call(PyObject *context, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        if (nargs == 0) {
            return enter_context(context);
        }
        if (nargs == 3) {
            return leave_context(context);
        }
    }
    PyErr_Format(PyExc_TypeError, "%s is entered and left by a `with` statement (or begin() and end()), not called",
                 Py_TYPE(context)->tp_name);
    return NULL;
}

static PyObject *
withslot_get(PyObject *slot, PyObject *context, PyObject *type)
{
    return Py_NewRef(context == NULL || context == Py_None ? slot : context);
}

/* The unbound call: type(ctx).__enter__(ctx), type(ctx).__exit__(ctx, t, v, tb). */
static PyObject *
withslot_call(PyObject *slot, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    int leave = ((WithSlotObject *)slot)->leave;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || nargs != (leave ? 4 : 1) ||
        !(Py_IS_TYPE(args[0], &SpanType) || Py_IS_TYPE(args[0], &CollectiveType))) {
        PyErr_SetString(PyExc_TypeError, leave ? "__exit__(context, exc_type, exc, tb) of a span or collective context"
                                               : "__enter__(context) of a span or collective context");
        return NULL;
    }
    return leave ? leave_context(args[0]) : enter_context(args[0]);
}

static PyTypeObject WithSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deeptrace.collect._hotpath.WithSlot",
    .tp_basicsize = sizeof(WithSlotObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "__enter__ or __exit__ of the C contexts: binds to the context itself (see _hotpath.c).",
    .tp_vectorcall_offset = offsetof(WithSlotObject, call),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = withslot_get,
};

/* A context type's dict before PyType_Ready: its __enter__ and __exit__ slots (the type adds its own methods). */
static int
add_with_slots(PyTypeObject *type)
{
    PyObject *dict = PyDict_New();
    if (dict == NULL) {
        return -1;
    }
    const char *names[] = {"__enter__", "__exit__"};
    for (int leave = 0; leave < 2; leave++) {
        WithSlotObject *slot = PyObject_New(WithSlotObject, &WithSlotType);
        if (slot == NULL) {
            Py_DECREF(dict);
            return -1;
        }
        slot->leave = leave;
        slot->call = withslot_call;
        int failed = PyDict_SetItemString(dict, names[leave], (PyObject *)slot);
        Py_DECREF(slot);
        if (failed < 0) {
            Py_DECREF(dict);
            return -1;
        }
    }
    type->tp_dict = dict;
    return 0;
}

/* ---- Packing finished contexts into trace records (the writer thread) --------------------------------------- */

/* The span record of trace_format.py: "<BBIIIqqqiqq", 58 bytes, little-endian. */
#define SPAN_RECORD_BYTES 58
#define TAG_SPAN 2
#define NONE_I32 INT32_MIN
#define NONE_I64 INT64_MIN
#define NO_STRING 0xFFFFFFFFu

static unsigned char *
put_le(unsigned char *out, unsigned long long value, int bytes)
{
    for (int i = 0; i < bytes; i++) {
        out[i] = (unsigned char)(value >> (8 * i));
    }
    return out + bytes;
}

/* An optional integer field: None -> `none`, else an int within [low, high]; -1 with an error set otherwise. */
static int
optional_field(PyObject *value, long long low, long long high, long long none, long long *out)
{
    if (value == NULL || value == Py_None) {
        *out = none;
        return 0;
    }
    if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "not an integer");
        return -1;
    }
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (number < low || number > high) {
        PyErr_SetString(PyExc_OverflowError, "out of range");
        return -1;
    }
    *out = number;
    return 0;
}

/* A string's id from the encoder's table, interned by the encoder's own Python method when new. */
static int
string_id(PyObject *ids, PyObject *intern, PyObject *text, unsigned long long *out)
{
    PyObject *found = PyDict_GetItemWithError(ids, text);
    PyObject *made = NULL;
    if (found == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        found = made = PyObject_CallOneArg(intern, text);
        if (made == NULL) {
            return -1;
        }
    }
    unsigned long long id = PyLong_AsUnsignedLongLong(found);
    Py_XDECREF(made);
    if (id == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = id;
    return 0;
}

/* The track key of contexts.track_key: (thread, depth of the open chain at entry), or (thread, -1 - lane). */
static PyObject *
track_key_of(PyObject *thread_object, PyObject *parent)
{
    long depth = 0;
    if (parent != NULL && PyLong_CheckExact(parent)) {
        depth = -1 - PyLong_AsLong(parent);
    } else {
        while (parent != NULL && parent != Py_None) {
            if (Py_IS_TYPE(parent, &SpanType)) {
                parent = ((SpanObject *)parent)->parent;
            } else if (Py_IS_TYPE(parent, &CollectiveType)) {
                parent = ((CollectiveObject *)parent)->parent;
            } else {
                PyErr_SetString(PyExc_TypeError, "a parent of another kind");
                return NULL;
            }
            depth++;
        }
    }
    PyObject *number = PyLong_FromLong(depth);
    if (number == NULL) {
        return NULL;
    }
    PyObject *key = PyTuple_Pack(2, ((ThreadStateObject *)thread_object)->base, number);
    Py_DECREF(number);
    return key;
}

typedef struct {
    PyObject *ids, *track_ids, *codes, *intern, *track_id, *encode_one;
} Encoder;

/* One C context's record into `out`; -1 with an error set where a field is invalid or missing. */
static int
pack_context(Encoder *encoder, PyObject *item, unsigned char *out)
{
    PyObject *name, *category, *step, *layer, *nbytes, *parent, *thread, *group = NULL;
    long long seq_value = NONE_I64; /* a span's */
    long long start, end;
    if (Py_IS_TYPE(item, &SpanType)) {
        SpanObject *span = (SpanObject *)item;
        name = span->name, category = span->category, step = span->step, layer = span->layer;
        nbytes = span->nbytes, parent = span->parent, thread = span->thread;
        start = span->start_ns, end = span->end_ns;
    } else {
        CollectiveObject *collective = (CollectiveObject *)item;
        name = collective->name, category = collective->hub->comm, step = collective->step, layer = NULL;
        nbytes = collective->nbytes, parent = collective->parent, thread = collective->thread;
        group = collective->group;
        seq_value = (long long)collective->seq; /* entered: a context never entered is refused below */
        start = collective->start_ns, end = collective->end_ns;
    }
    if (thread == NULL) {
        PyErr_SetString(PyExc_AttributeError, "never entered");
        return -1;
    }
    PyObject *code_object = PyDict_GetItemWithError(encoder->codes, category);
    if (code_object == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, category);
        }
        return -1;
    }
    long code = PyLong_AsLong(code_object);
    unsigned long long name_id, track, group_id = NO_STRING;
    long long step_value, layer_value, nbytes_value;
    if (code == -1 && PyErr_Occurred()) {
        return -1;
    }
    /* Strings are interned in encode_one's order (group, track, name), so both write the same string table. */
    if (group != NULL && string_id(encoder->ids, encoder->intern, group, &group_id) < 0) {
        return -1;
    }
    PyObject *key = track_key_of(thread, parent);
    if (key == NULL) {
        return -1;
    }
    PyObject *found = PyDict_GetItemWithError(encoder->track_ids, key);
    Py_DECREF(key);
    PyObject *made = NULL;
    if (found == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        found = made = PyObject_CallOneArg(encoder->track_id, item); /* the encoder names and caches it */
        if (made == NULL) {
            return -1;
        }
    }
    track = PyLong_AsUnsignedLongLong(found);
    Py_XDECREF(made);
    if ((track == (unsigned long long)-1 && PyErr_Occurred()) ||
        string_id(encoder->ids, encoder->intern, name, &name_id) < 0 ||
        optional_field(step, INT64_MIN, INT64_MAX, NONE_I64, &step_value) < 0 ||
        optional_field(layer, INT32_MIN, INT32_MAX, NONE_I32, &layer_value) < 0 ||
        optional_field(nbytes, INT64_MIN, INT64_MAX, NONE_I64, &nbytes_value) < 0) {
        return -1;
    }
    out = put_le(out, TAG_SPAN, 1);
    out = put_le(out, (unsigned long long)code, 1);
    out = put_le(out, name_id, 4);
    out = put_le(out, track, 4);
    out = put_le(out, group_id, 4);
    out = put_le(out, (unsigned long long)start, 8);
    out = put_le(out, (unsigned long long)end, 8);
    out = put_le(out, (unsigned long long)step_value, 8);
    out = put_le(out, (unsigned long long)layer_value, 4);
    out = put_le(out, (unsigned long long)seq_value, 8);
    put_le(out, (unsigned long long)nbytes_value, 8);
    return 0;
}

/* Room for `more` bytes after `used`. */
static int
reserve(unsigned char **buffer, Py_ssize_t *capacity, Py_ssize_t used, Py_ssize_t more)
{
    if (used + more <= *capacity) {
        return 0;
    }
    Py_ssize_t grown = (used + more) * 2;
    unsigned char *larger = PyMem_Realloc(*buffer, (size_t)grown);
    if (larger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buffer = larger;
    *capacity = grown;
    return 0;
}

static int
encoder_attribute(PyObject *encoder, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(encoder, name);
    return *out == NULL ? -1 : 0;
}

/* pack_records(items, encoder) -> bytes: the records of a batch, in order. The C contexts are packed here; every
 * other item (spans timed elsewhere, Python contexts) and any C context with an invalid field go through
 * encoder.encode_one, the Python reference, which also warns about what it drops. */
static PyObject *
pack_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pack_records(items: list, encoder)");
        return NULL;
    }
    PyObject *items = args[0], *encoder_object = args[1], *result = NULL;
    Encoder encoder = {NULL};
    if (encoder_attribute(encoder_object, "_ids", &encoder.ids) < 0 ||
        encoder_attribute(encoder_object, "_track_ids", &encoder.track_ids) < 0 ||
        encoder_attribute(encoder_object, "_codes", &encoder.codes) < 0 ||
        encoder_attribute(encoder_object, "_intern", &encoder.intern) < 0 ||
        encoder_attribute(encoder_object, "_track_id", &encoder.track_id) < 0 ||
        encoder_attribute(encoder_object, "encode_one", &encoder.encode_one) < 0) {
        goto done;
    }
    if (!PyDict_Check(encoder.ids) || !PyDict_Check(encoder.track_ids) || !PyDict_Check(encoder.codes)) {
        PyErr_SetString(PyExc_TypeError, "the encoder's tables are not dicts");
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(items), capacity = count * SPAN_RECORD_BYTES, used = 0;
    unsigned char *buffer = PyMem_Malloc(capacity > 0 ? (size_t)capacity : 1);
    if (buffer == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (Py_IS_TYPE(item, &SpanType) || Py_IS_TYPE(item, &CollectiveType)) {
            if (reserve(&buffer, &capacity, used, SPAN_RECORD_BYTES) < 0) {
                PyMem_Free(buffer);
                goto done;
            }
            if (pack_context(&encoder, item, buffer + used) == 0) {
                used += SPAN_RECORD_BYTES;
                continue;
            }
            PyErr_Clear(); /* encode_one meets the same problem and reports it */
        }
        Py_INCREF(item);
        PyObject *record = PyObject_CallOneArg(encoder.encode_one, item);
        Py_DECREF(item);
        if (record == NULL || !PyBytes_Check(record)) {
            if (record != NULL) {
                PyErr_SetString(PyExc_TypeError, "encode_one() must return bytes");
            }
            Py_XDECREF(record);
            PyMem_Free(buffer);
            goto done;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(record);
        if (reserve(&buffer, &capacity, used, size) < 0) {
            Py_DECREF(record);
            PyMem_Free(buffer);
            goto done;
        }
        memcpy(buffer + used, PyBytes_AS_STRING(record), (size_t)size);
        used += size;
        Py_DECREF(record);
    }
    result = PyBytes_FromStringAndSize((const char *)buffer, used);
    PyMem_Free(buffer);
done:
    Py_XDECREF(encoder.ids);
    Py_XDECREF(encoder.track_ids);
    Py_XDECREF(encoder.codes);
    Py_XDECREF(encoder.intern);
    Py_XDECREF(encoder.track_id);
    Py_XDECREF(encoder.encode_one);
    return result;
}

/* ---- Hub's methods and type --------------------------------------------------------------------------------- */

static PyMethodDef hub_methods[] = {
    {"span", (PyCFunction)(void (*)(void))hub_span, METH_FASTCALL | METH_KEYWORDS,
     "span(name, category, *, step=None, layer=None, nbytes=None) -> SpanContext"},
    {"collective", (PyCFunction)(void (*)(void))hub_collective, METH_FASTCALL | METH_KEYWORDS,
     "collective(name, group='world', *, nbytes=None, seq=None, step=None) -> CollectiveContext"},
    {NULL},
};

static PyGetSetDef hub_getset[] = {
    {"main_ident", (getter)get_main_ident, (setter)set_main_ident,
     "the creating thread's ident; None once it ended", NULL},
    {"step", (getter)get_step, (setter)set_step, "the step begun last: the default step of new contexts", NULL},
    {NULL},
};

static PyTypeObject HubType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deeptrace.collect._hotpath.Hub",
    .tp_basicsize = sizeof(HubObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One collector's state for its span and collective contexts.",
    .tp_new = hub_new,
    .tp_traverse = (traverseproc)hub_traverse,
    .tp_clear = (inquiry)hub_clear,
    .tp_dealloc = (destructor)hub_dealloc,
    .tp_methods = hub_methods,
    .tp_getset = hub_getset,
};

static PyMethodDef module_methods[] = {
    {"pack_records", (PyCFunction)(void (*)(void))pack_records, METH_FASTCALL,
     "pack_records(items, encoder) -> bytes: a batch's span records (trace_writer.SpanEncoder)"},
    {NULL},
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "deeptrace.collect._hotpath",
    .m_doc = "The collector's span and collective contexts in C (see deeptrace/collect/native.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyTypeObject *types[] = {&ThreadStateType, &GroupMarksType, &HubType, &SpanType, &CollectiveType};
    const char *names[] = {"ThreadState", "GroupMarks", "Hub", "SpanContext", "CollectiveContext"};
    str_step = PyUnicode_InternFromString("step");
    str_layer = PyUnicode_InternFromString("layer");
    str_nbytes = PyUnicode_InternFromString("nbytes");
    str_group = PyUnicode_InternFromString("group");
    str_seq = PyUnicode_InternFromString("seq");
    str_world = PyUnicode_InternFromString("world");
    if (!str_step || !str_layer || !str_nbytes || !str_group || !str_seq || !str_world) {
        return NULL;
    }
    if (PyType_Ready(&WithSlotType) < 0 || add_with_slots(&SpanType) < 0 || add_with_slots(&CollectiveType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) < 0 || PyModule_AddObjectRef(module, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
