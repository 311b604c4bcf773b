// The compiled decision path: TE's generic_gemm with the plugin's dispatch in front, for the calls TE
// makes on every training step (sixteen positionals, the tail by keyword, plain tensors, no output
// quantizer). Why it exists: in Python, reading the metadata a verdict depends on through torch's getters
// costs more than the 1.5 us a call the plugin may add (issue 14; benchmarks/dispatch_overhead.py), and
// the Python frame alone costs half of it. Here the same metadata is read from the at::Tensor, the key is
// a fixed array of words, and the call is forwarded with the vector it came in.
//
// What it is not: a second implementation of the decision. host/wrapper.py stays the definition. A call
// this file does not recognise goes to the Python wrapper exactly as it came. A key seen for the first
// time goes to wrapper.py's decide(), and the Decision it returns is the one the Python path cached under
// its own key; this file only remembers which Decision its key maps to. Its key holds everything the
// Python key holds for the calls it takes (tensor dtype, sizes, contiguity, start modulo MAX_ALIGN,
// device; the flags; the output dtype; alpha, beta; whether a comm argument was given), so two calls
// with one key here have one key there: the mapping can never name another problem's verdict
// (tests/test_hotpath.py checks both paths give identical decisions and results).

#include <Python.h>
#include <structmember.h>

#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <unordered_map>

namespace {

constexpr int kMaxDim = 6;       // deeper tensors go to the Python path (TE's GEMM operands are 2-D or 3-D)
constexpr int kTensorWords = 2 + kMaxDim;
constexpr int kTensors = 5;      // A, B, D, bias, gelu_in
constexpr int kWords = kTensors * kTensorWords + 5;
constexpr int kMaxDtypes = 32;   // output dtype objects remembered by identity (TE uses a dozen)

// The positions and names this file reads; the constructor checks them against host/signature.py's
// REQUIRED and TAIL, the one source, so a change there cannot leave this file reading the wrong slot.
constexpr const char* kRequired[] = {
    "A", "transA", "B", "transB", "D", "quantizer", "output_dtype", "bias", "bias_type", "gelu", "gelu_in",
    "grad", "workspace", "workspace_size", "accumulate", "use_split_accumulator"};
constexpr const char* kTailNames[] = {"comm_overlap", "comm_type", "extra_output", "bulk_overlap", "alpha", "beta"};
constexpr int kNargs = sizeof kRequired / sizeof kRequired[0];
constexpr int kTail = sizeof kTailNames / sizeof kTailNames[0];
enum Arg { kA = 0, kTransA = 1, kB = 2, kTransB = 3, kD = 4, kQuantizer = 5, kOutDtype = 6, kBias = 7,
           kGelu = 9, kGeluIn = 10, kGrad = 11, kAccumulate = 14 };
enum Tail { kComm = 0, kCommType = 1, kExtra = 2, kBulk = 3, kAlpha = 4, kBeta = 5 };

using Key = std::array<int64_t, kWords>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 0x9E3779B97F4A7C15ull;  // splitmix64's increment as the seed
    for (int64_t w : k) {
      h ^= static_cast<uint64_t>(w) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

struct Entry {
  PyObject* decision;  // host.dispatch.Decision (strong)
  PyObject* count;     // its tally's itertools.count (strong): next() counts one call
  bool ok;
};

using Map = std::unordered_map<Key, Entry, KeyHash>;

struct Wrapper {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* dict;         // __dict__: functools.update_wrapper's attributes, __te_flydsl_native__
  PyObject* native;       // TE's generic_gemm
  PyObject* python_path;  // host.wrapper's full Python wrapper: every call this file does not take
  PyObject* decide;       // decide(dispatcher, *args, **kwargs) -> Decision (never runs the GEMM)
  PyObject* run;          // run(dispatcher, decision, *args, **kwargs) -> the backend's output
  PyObject* globals;      // host.dispatch's module dict: its _current is the process's dispatcher
  PyObject* plain;        // tuple of the tensor classes read as is (views.PLAIN_TENSORS)
  PyObject* dtypes;       // dict whose keys are the output dtypes the host knows (views.DTYPE_FORMATS)
  PyObject* tail[kTail];  // the tail's names, in host/signature.py's order
  PyObject* defaults[kTail];  // and their defaults (signature.DEFAULTS)
  int64_t align;          // views.MAX_ALIGN: starts are told apart modulo this many elements
  PyObject* known[kMaxDtypes];
  int n_known;
  PyObject* last;         // the dispatcher `map` belongs to (strong: its address cannot be reused)
  bool passthrough;
  bool has_backend;
  Map* map;
  Py_ssize_t fast;        // calls decided from `map`
  Py_ssize_t handed;      // calls handed to the Python wrapper
};

PyObject* s_current;
PyObject* s_passthrough;
PyObject* s_backend;
PyObject* s_ran_unavailable;
PyObject* s_declined;
PyObject* s_ok;
PyObject* s_loud;
PyObject* s_tally;
PyObject* s_count;

void clear_map(Wrapper* self) {
  Map* m = self->map;
  if (m == nullptr) return;
  Map old;
  old.swap(*m);  // empty before any DECREF runs a finaliser that could call back in
  for (auto& kv : old) {
    Py_DECREF(kv.second.decision);
    Py_DECREF(kv.second.count);
  }
}

// One tensor's words: absent (0), or its dtype, contiguity, device, start and sizes. False: not one this
// file reads (a subclass, not strided, symbolic sizes, too many dims): the Python path takes the call.
bool tensor_words(Wrapper* self, PyObject* obj, int64_t* w) {
  if (obj == Py_None) return true;
  PyTypeObject* type = Py_TYPE(obj);
  bool plain = false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->plain); ++i) {
    plain |= reinterpret_cast<PyObject*>(type) == PyTuple_GET_ITEM(self->plain, i);
  }
  if (!plain || !THPVariable_Check(obj)) return false;
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined() || t.layout() != c10::kStrided || t.is_nested() ||
        t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      return false;
    }
    const int64_t dim = t.dim();
    if (dim > kMaxDim) return false;
    const c10::Device dev = t.device();
    const int64_t start = t.storage_offset() % self->align;  // as wrapper.py's key holds it
    w[0] = 1 | (static_cast<int64_t>(t.scalar_type()) << 8) | (static_cast<int64_t>(t.is_contiguous()) << 16) |
           (static_cast<int64_t>(dev.type()) << 24) | (static_cast<int64_t>(dev.index() + 1) << 32) |
           (start << 48);
    w[1] = dim;
    const auto sizes = t.sizes();
    for (int64_t i = 0; i < dim; ++i) w[2 + i] = sizes[i];
    return true;
  } catch (...) {
    return false;
  }
}

int bool_bit(PyObject* v) { return v == Py_True ? 1 : (v == Py_False ? 0 : -1); }

// The output dtype's word: its address, for None or an object the host names (views.DTYPE_FORMATS);
// remembered with a strong reference so the address keeps naming it. 0: the Python path takes the call.
int64_t dtype_word(Wrapper* self, PyObject* v) {
  if (v == Py_None) return 1;
  for (int i = 0; i < self->n_known; ++i) {
    if (self->known[i] == v) return reinterpret_cast<int64_t>(v);
  }
  if (self->n_known == kMaxDtypes) return 0;
  int has = PyDict_Contains(self->dtypes, v);
  if (has != 1) {
    PyErr_Clear();  // an unhashable output dtype: the Python path judges it
    return 0;
  }
  Py_INCREF(v);
  self->known[self->n_known++] = v;
  return reinterpret_cast<int64_t>(v);
}

bool float_bits(PyObject* v, int64_t* out) {
  if (!PyFloat_CheckExact(v)) return false;
  double d = PyFloat_AS_DOUBLE(v);
  std::memcpy(out, &d, sizeof d);
  return true;
}

// The key of a call, or false for a call the Python path takes.
bool build_key(Wrapper* self, PyObject* const* args, PyObject* kwnames, Key& key) {
  key.fill(0);
  PyObject* tail[kTail];
  for (int i = 0; i < kTail; ++i) tail[i] = self->defaults[i];
  if (kwnames != nullptr) {
    const Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nk; ++j) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, j);
      int slot = -1;
      for (int i = 0; i < kTail && slot < 0; ++i) {
        if (name == self->tail[i]) slot = i;
      }
      for (int i = 0; i < kTail && slot < 0; ++i) {
        if (PyUnicode_Compare(name, self->tail[i]) == 0) slot = i;
      }
      if (slot < 0) return false;  // not TE 2.20's: host/signature.py names it
      tail[slot] = args[kNargs + j];
    }
  }
  if (args[kQuantizer] != Py_None) return false;  // an output quantizer: keyed by its registered key, in Python
  static constexpr int kTensorArgs[kTensors] = {kA, kB, kD, kBias, kGeluIn};
  for (int i = 0; i < kTensors; ++i) {
    if (!tensor_words(self, args[kTensorArgs[i]], &key[i * kTensorWords])) return false;
  }
  if (key[0] == 0 || key[kTensorWords] == 0) return false;  // A or B None: the problem's to decline
  int64_t flags = 0;
  static constexpr int kFlagArgs[5] = {kTransA, kTransB, kGelu, kGrad, kAccumulate};
  for (int i = 0; i < 5; ++i) {
    const int b = bool_bit(args[kFlagArgs[i]]);
    if (b < 0) return false;
    flags |= static_cast<int64_t>(b) << i;
  }
  const int bulk = bool_bit(tail[kBulk]);
  if (bulk < 0) return false;
  const bool no_comm = tail[kComm] == Py_None && tail[kCommType] == Py_None && tail[kExtra] == Py_None;
  flags |= (static_cast<int64_t>(bulk) << 5) | (static_cast<int64_t>(no_comm) << 6);
  int64_t* w = &key[kTensors * kTensorWords];
  w[0] = flags;
  w[1] = dtype_word(self, args[kOutDtype]);
  if (w[1] == 0 || !float_bits(tail[kAlpha], &w[2])) return false;
  if (tail[kBeta] != Py_None) {
    w[3] = 1;
    if (!float_bits(tail[kBeta], &w[4])) return false;
  }
  return true;
}

// Call fn(extra..., *args, **kwargs) with the vector the call came in.
PyObject* call_with(PyObject* fn, PyObject* const* extra, int n_extra, PyObject* const* args, size_t nargsf,
                    PyObject* kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t total = nargs + n_extra + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
  PyObject* stack[kNargs + kTail + 2];
  if (total > static_cast<Py_ssize_t>(sizeof stack / sizeof stack[0])) {
    PyErr_SetString(PyExc_SystemError, "te_flydsl_plugin._hotpath: too many arguments");
    return nullptr;
  }
  for (int i = 0; i < n_extra; ++i) stack[i] = extra[i];
  for (Py_ssize_t i = 0; i < total - n_extra; ++i) stack[n_extra + i] = args[i];
  return PyObject_Vectorcall(fn, stack, nargs + n_extra, kwnames);
}

bool refresh(Wrapper* self, PyObject* d) {
  PyObject* pt = PyObject_GetAttr(d, s_passthrough);
  if (pt == nullptr) return false;
  const int passthrough = PyObject_IsTrue(pt);
  Py_DECREF(pt);
  PyObject* be = PyObject_GetAttr(d, s_backend);
  if (be == nullptr || passthrough < 0) {
    Py_XDECREF(be);
    return false;
  }
  self->has_backend = be != Py_None;
  Py_DECREF(be);
  clear_map(self);
  self->passthrough = passthrough;
  Py_INCREF(d);
  Py_XSETREF(self->last, d);
  return true;
}

// The call once its Decision is known: what host/wrapper.py's generic_gemm does after its lookup.
PyObject* finish(Wrapper* self, PyObject* d, const Entry& e, PyObject* const* args, size_t nargsf,
                 PyObject* kwnames) {
  if (e.ok) {
    PyObject* extra[2] = {d, e.decision};
    PyObject* out = call_with(self->run, extra, 2, args, nargsf, kwnames);
    if (out == nullptr) return nullptr;
    Py_XDECREF(PyIter_Next(e.count));
    return out;
  }
  Py_XDECREF(PyIter_Next(e.count));
  PyObject* loud = PyObject_GetAttr(e.decision, s_loud);
  if (loud == nullptr) return nullptr;
  const int is_loud = PyObject_IsTrue(loud);
  Py_DECREF(loud);
  if (is_loud < 0) return nullptr;
  if (is_loud) {
    PyObject* r = PyObject_CallMethodOneArg(d, s_declined, e.decision);
    if (r == nullptr) return nullptr;  // strict mode's GemmNotSupportedError
    Py_DECREF(r);
  }
  return PyObject_Vectorcall(self->native, args, nargsf, kwnames);
}

// One call, with the dispatcher `d` held (any Python it runs may replace host.dispatch._current).
PyObject* dispatch_call(Wrapper* self, PyObject* d, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (d != self->last && !refresh(self, d)) return nullptr;
  if (self->passthrough) {
    if (self->has_backend) {
      PyObject* r = PyObject_CallMethodNoArgs(d, s_ran_unavailable);
      if (r == nullptr) return nullptr;
      Py_DECREF(r);
    }
    return PyObject_Vectorcall(self->native, args, nargsf, kwnames);
  }
  Key key;
  if (PyVectorcall_NARGS(nargsf) != kNargs || !build_key(self, args, kwnames, key)) {
    ++self->handed;
    return PyObject_Vectorcall(self->python_path, args, nargsf, kwnames);
  }
  auto it = self->map->find(key);
  if (it != self->map->end()) {
    ++self->fast;
    const Entry e = it->second;  // a copy: a callback may clear the map while this call runs
    Py_INCREF(e.decision);
    Py_INCREF(e.count);
    PyObject* out = finish(self, d, e, args, nargsf, kwnames);
    Py_DECREF(e.decision);
    Py_DECREF(e.count);
    return out;
  }
  PyObject* decision = call_with(self->decide, &d, 1, args, nargsf, kwnames);
  PyObject* ok = decision ? PyObject_GetAttr(decision, s_ok) : nullptr;
  PyObject* tally = ok ? PyObject_GetAttr(decision, s_tally) : nullptr;
  PyObject* count = tally ? PyObject_GetAttr(tally, s_count) : nullptr;
  Py_XDECREF(tally);
  const int is_ok = count ? PyObject_IsTrue(ok) : -1;
  Py_XDECREF(ok);
  PyObject* out = nullptr;
  if (is_ok >= 0) {
    Entry e{decision, count, is_ok == 1};
    if (d == self->last) {  // still this dispatcher's: remember it
      Py_INCREF(decision);
      Py_INCREF(count);
      self->map->emplace(key, e);
    }
    out = finish(self, d, e, args, nargsf, kwnames);
  }
  Py_XDECREF(decision);
  Py_XDECREF(count);
  return out;
}

PyObject* wrapper_call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Wrapper* self = reinterpret_cast<Wrapper*>(obj);
  PyObject* d = PyDict_GetItemWithError(self->globals, s_current);  // borrowed
  if (d == nullptr && PyErr_Occurred()) return nullptr;
  if (d == nullptr || d == Py_None) {  // no dispatcher yet: the Python path creates it
    ++self->handed;
    return PyObject_Vectorcall(self->python_path, args, nargsf, kwnames);
  }
  Py_INCREF(d);
  PyObject* out = dispatch_call(self, d, args, nargsf, kwnames);
  Py_DECREF(d);
  return out;
}

// The objects the wrapper holds one reference to each, beside its arrays and the map's entries.
std::array<PyObject**, 9> members(Wrapper* self) {
  return {&self->dict,    &self->native, &self->python_path, &self->decide, &self->run,
          &self->globals, &self->plain,  &self->dtypes,      &self->last};
}

int wrapper_traverse(PyObject* obj, visitproc visit, void* arg) {
  Wrapper* self = reinterpret_cast<Wrapper*>(obj);
  Py_VISIT(Py_TYPE(obj));
  for (PyObject** member : members(self)) Py_VISIT(*member);
  for (auto* value : self->defaults) Py_VISIT(value);
  for (int i = 0; i < self->n_known; ++i) Py_VISIT(self->known[i]);
  if (self->map != nullptr) {
    for (auto& kv : *self->map) {
      Py_VISIT(kv.second.decision);
      Py_VISIT(kv.second.count);
    }
  }
  return 0;
}

int wrapper_clear(PyObject* obj) {
  Wrapper* self = reinterpret_cast<Wrapper*>(obj);
  clear_map(self);
  for (PyObject** member : members(self)) Py_CLEAR(*member);
  for (auto& name : self->tail) Py_CLEAR(name);
  for (auto& value : self->defaults) Py_CLEAR(value);
  for (int i = 0; i < self->n_known; ++i) Py_CLEAR(self->known[i]);
  self->n_known = 0;
  return 0;
}

void wrapper_dealloc(PyObject* obj) {
  Wrapper* self = reinterpret_cast<Wrapper*>(obj);
  PyTypeObject* type = Py_TYPE(obj);
  PyObject_GC_UnTrack(obj);
  wrapper_clear(obj);
  delete self->map;
  self->map = nullptr;
  type->tp_free(obj);
  Py_DECREF(type);
}

// Whether `names` (a tuple of str) is exactly `expected`.
bool names_are(PyObject* names, const char* const* expected, int n) {
  if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != n) return false;
  for (int i = 0; i < n; ++i) {
    PyObject* name = PyTuple_GET_ITEM(names, i);
    if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, expected[i]) != 0) return false;
  }
  return true;
}

PyObject* wrapper_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"native", "python_path", "decide", "run", "globals", "plain", "dtypes",
                                "required", "tail", "defaults", "align", nullptr};
  PyObject *native, *python_path, *decide, *run, *globals, *plain, *dtypes, *required, *tail, *defaults;
  long long align;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO!O!O!OOO!L", const_cast<char**>(names), &native,
                                   &python_path, &decide, &run, &PyDict_Type, &globals, &PyTuple_Type, &plain,
                                   &PyDict_Type, &dtypes, &required, &tail, &PyTuple_Type, &defaults, &align)) {
    return nullptr;
  }
  if (!names_are(required, kRequired, kNargs) || !names_are(tail, kTailNames, kTail) ||
      PyTuple_GET_SIZE(defaults) != kTail || align <= 0) {
    PyErr_SetString(PyExc_ValueError,
                    "te_flydsl_plugin._hotpath: host/signature.py's REQUIRED / TAIL / DEFAULTS or MAX_ALIGN "
                    "differ from what this file reads; update _hotpath.cpp's tables with them");
    return nullptr;
  }
  Wrapper* self = reinterpret_cast<Wrapper*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = wrapper_call;
  self->map = new Map();
  self->align = align;
  PyObject* refs[] = {native, python_path, decide, run, globals, plain, dtypes};
  PyObject** slots[] = {&self->native, &self->python_path, &self->decide, &self->run,
                        &self->globals, &self->plain, &self->dtypes};
  for (size_t i = 0; i < sizeof refs / sizeof refs[0]; ++i) *slots[i] = Py_NewRef(refs[i]);
  for (int i = 0; i < kTail; ++i) {
    PyObject* name = Py_NewRef(PyTuple_GET_ITEM(tail, i));
    PyUnicode_InternInPlace(&name);
    self->tail[i] = name;
    self->defaults[i] = Py_NewRef(PyTuple_GET_ITEM(defaults, i));
  }
  return reinterpret_cast<PyObject*>(self);
}

PyObject* get_counts(PyObject* obj, void*) {
  Wrapper* self = reinterpret_cast<Wrapper*>(obj);
  return Py_BuildValue("{snsnsn}", "fast", self->fast, "handed", self->handed, "keys",
                       static_cast<Py_ssize_t>(self->map->size()));
}

PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {"counts", get_counts, nullptr,
     "{'fast': calls decided here, 'handed': calls handed to the Python wrapper, 'keys': keys remembered}",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMemberDef wrapper_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Wrapper, vectorcall), READONLY, nullptr},
    {"__dictoffset__", T_PYSSIZET, offsetof(Wrapper, dict), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot wrapper_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(wrapper_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(wrapper_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(wrapper_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(wrapper_clear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_getset, wrapper_getset},
    {Py_tp_members, wrapper_members},
    {Py_tp_doc, const_cast<char*>("generic_gemm with the plugin's dispatch in front (host/_hotpath.cpp)")},
    {0, nullptr},
};

PyType_Spec wrapper_spec = {
    "te_flydsl_plugin.host._hotpath.Wrapper",
    sizeof(Wrapper),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    wrapper_slots,
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hotpath", "The compiled decision path of host/wrapper.py.", -1, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__hotpath() {
  struct {
    PyObject** slot;
    const char* text;
  } names[] = {{&s_current, "_current"}, {&s_passthrough, "passthrough"},
               {&s_backend, "backend"},  {&s_ran_unavailable, "ran_unavailable"},
               {&s_declined, "declined"}, {&s_ok, "ok"},
               {&s_loud, "loud"},        {&s_tally, "tally"},
               {&s_count, "_count"}};
  for (auto& n : names) {
    *n.slot = PyUnicode_InternFromString(n.text);
    if (*n.slot == nullptr) return nullptr;
  }
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  PyObject* type = PyType_FromSpec(&wrapper_spec);
  if (type == nullptr || PyModule_AddObject(m, "Wrapper", type) < 0) {
    Py_XDECREF(type);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
