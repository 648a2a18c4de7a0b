// mhccl._mhccl: the nanobind binding of the C++ API. Thin: tensors arrive as nb::ndarray (the
// DLPack protocol, no copy) and become DLTensor views; streams arrive as integers; mhccl::Error
// becomes the mhccl.Error subclass of its code (python/mhccl/_errors.py: InvalidArgumentError,
// PeerTimeoutError, ...) with its message, code, peer, call index and op. The user-facing
// classes (output allocation, torch streams, torch.distributed bootstrap) are in
// python/mhccl/_api.py.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "mhccl/all_gather.h"
#include "mhccl/all_reduce_mhc.h"
#include "mhccl/checks.h"
#include "mhccl/communicator.h"
#include "mhccl/error.h"
#include "mhccl/fp8_groups.h"
#include "mhccl/info.h"
#include "mhccl/mxfp8.h"
#include "tune/verify.h"

namespace nb = nanobind;

namespace {

// Any DLPack array (torch tensors, NumPy arrays in the CPU tests). The array-API framework tag
// only names the type: the stub says Any rather than numpy.typing.NDArray, so that the stub
// imports no NumPy (not a dependency); arrays are never returned, so the tag changes nothing
// else.
using Array = nb::ndarray<nb::array_api>;
using MaybeArray = std::optional<Array>;

// A DLTensor view of an array, with its own shape and stride storage.
class View {
 public:
  explicit View(const Array& a) : shape_(a.ndim()), strides_(a.ndim()) {
    for (size_t i = 0; i < a.ndim(); ++i) {
      shape_[i] = static_cast<int64_t>(a.shape(i));
      strides_[i] = a.stride(i);
    }
    t_.data = a.data();  // nanobind's data() already includes the byte offset
    t_.byte_offset = 0;
    t_.ndim = static_cast<int>(a.ndim());
    t_.shape = shape_.data();
    t_.strides = strides_.data();
    const auto dt = a.dtype();
    t_.dtype = DLDataType{dt.code, dt.bits, dt.lanes};
    t_.device = DLDevice{static_cast<DLDeviceType>(a.device_type()), a.device_id()};
  }
  View(const View&) = delete;
  const DLTensor* get() const { return &t_; }

 private:
  std::vector<int64_t> shape_, strides_;
  DLTensor t_{};
};

// Optional arrays become optional views (nullptr when absent).
struct Views {
  std::vector<std::unique_ptr<View>> owned;
  const DLTensor* operator()(const MaybeArray& a) {
    if (!a) return nullptr;
    owned.push_back(std::make_unique<View>(*a));
    return owned.back()->get();
  }
  const DLTensor* operator()(const Array& a) {
    owned.push_back(std::make_unique<View>(a));
    return owned.back()->get();
  }
};

// An op's call without the interpreter's lock: the NCCL fallback's call waits on the host for its
// operations to be enqueued (up to the budget where NCCL must wait for peers), and ranks run as
// threads of one process would otherwise wait for one another's lock until that budget
// expired. The views hold no Python object; the call's C++ side serializes the calls of a
// communicator (Communicator::Impl::call_mutex). Its exceptions are translated once the lock is
// taken again.
template <class Call>
void released_call(Call&& call) {
  nb::gil_scoped_release release;
  call();
}

mhccl::Protocol parse_protocol(const std::string& p) {
  if (p == "auto") return mhccl::Protocol::kAuto;
  if (p == "one-shot") return mhccl::Protocol::kOneShot;
  if (p == "two-shot") return mhccl::Protocol::kTwoShot;
  if (p == "nccl") return mhccl::Protocol::kNccl;
  throw mhccl::Error(mhccl::ErrorCode::kInvalidArgument,
                     "protocol: expected 'auto', 'one-shot', 'two-shot' or 'nccl', got '" + p + "'");
}

// The self-test's device and stream, the caller's current device restored after it.
struct SelfTestStream {
  int previous = 0;
  cudaStream_t stream = nullptr;
  explicit SelfTestStream(int device) {
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  }
  ~SelfTestStream() {
    if (stream) cudaStreamDestroy(stream);
    cudaSetDevice(previous);
  }
};

cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Every ErrorCode, by enumerator: the enumerators are numbered from 0 without gaps (error.h), and
// error_code_id() names each ("unknown" past the last), so a code added in C++ appears here
// (and the Python tests ask for its class) without a list to keep in step.
std::vector<mhccl::ErrorCode> error_codes() {
  std::vector<mhccl::ErrorCode> codes;
  for (int i = 0;; ++i) {
    const auto code = static_cast<mhccl::ErrorCode>(i);
    if (std::strcmp(mhccl::error_code_id(code), "unknown") == 0) return codes;
    codes.push_back(code);
  }
}

// A C++ string as a Python str: UTF-8, an invalid byte as a backslash escape ("\\xff"). The
// library's messages and reports quote paths and environment variables as they are, which need
// not be UTF-8 (nanobind's own conversion raised UnicodeDecodeError in place of the report or the
// mhccl error carrying them).
nb::str text(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace");
  if (o == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

// mhccl::Error as the Python exception of its code (mhccl._errors.from_cpp). Should that module
// not import (a broken installation), the builtin classes the codes once mapped to, with the
// message, so that the error itself is never lost.
void set_python_error(const mhccl::Error& e) {
  try {
    nb::object exc = nb::module_::import_("mhccl._errors")
                         .attr("from_cpp")(mhccl::error_code_id(e.code()), text(e.what()), e.peer(),
                                           e.call_index(), text(e.op()));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (nb::python_error&) {  // discarded: the original error is the one to report
    PyObject* message = PyUnicode_DecodeUTF8(e.what(), static_cast<Py_ssize_t>(std::strlen(e.what())), "backslashreplace");
    PyErr_SetObject(e.is_argument_error() ? PyExc_ValueError : PyExc_RuntimeError, message);
    Py_XDECREF(message);
  }
}

mhccl::AllReduceMHCConfig make_config(int64_t hidden_size, int hc_mult, int64_t max_num_tokens,
                                      int top_k, bool quantize, bool residual_only,
                                      int64_t two_shot_min_rows, int64_t two_shot_min_finalize_rows,
                                      int64_t nccl_min_rows, int64_t nccl_min_finalize_rows,
                                      bool enable_pdl, bool quantize_fp8, bool fp8_ue8m0) {
  mhccl::AllReduceMHCConfig c;
  c.hidden_size = hidden_size;
  c.hc_mult = hc_mult;
  c.max_num_tokens = max_num_tokens;
  c.top_k = top_k;
  c.quantize_layer_input = quantize;
  c.residual_only = residual_only;
  c.quantize_layer_input_fp8 = quantize_fp8;
  c.fp8_ue8m0_scales = fp8_ue8m0;
  c.two_shot_min_rows = two_shot_min_rows;
  c.two_shot_min_finalize_rows = two_shot_min_finalize_rows;
  c.nccl_min_rows = nccl_min_rows;
  c.nccl_min_finalize_rows = nccl_min_finalize_rows;
  c.enable_pdl = enable_pdl;
  return c;
}

mhccl::MHCEpilogueArgs epilogue(Views& v, const Array& residual, const Array& post, const Array& comb,
                                const MaybeArray& pre, const MaybeArray& norm_weight, double eps,
                                const Array& residual_out, const MaybeArray& layer_input,
                                const MaybeArray& values, const MaybeArray& scales,
                                const MaybeArray& fp8_values, const MaybeArray& fp8_scales) {
  mhccl::MHCEpilogueArgs e;
  e.residual = v(residual);
  e.post = v(post);
  e.comb = v(comb);
  e.pre = v(pre);
  e.norm_weight = v(norm_weight);
  e.eps = static_cast<float>(eps);
  e.residual_out = v(residual_out);
  e.layer_input = v(layer_input);
  e.mxfp8_values = v(values);
  e.mxfp8_scales = v(scales);
  e.fp8_values = v(fp8_values);
  e.fp8_scales = v(fp8_scales);
  return e;
}

}  // namespace

NB_MODULE(_mhccl, m) {
  m.doc() = "mhccl's C++ API (internal; use the mhccl package)";

  // The module mhccl._errors is imported when an error is translated (not here: importing the
  // extension alone, as nanobind's stubgen does, then imports nothing more).
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const mhccl::Error& e) {
      set_python_error(e);
    }
  });

  m.def("_error_codes", [] {
    std::vector<std::string> ids;
    for (const auto code : error_codes()) ids.emplace_back(mhccl::error_code_id(code));
    return ids;
  }, "Every mhccl::ErrorCode enumerator's name, in the enum's order (for the tests).");
  // A C++ mhccl::Error of the code named, thrown through the translator above (for the tests).
  // `message` may be bytes: a message that is not UTF-8, as one quoting a path can be.
  m.def("_raise_for_test", [](const std::string& code_id, nb::handle message, int peer,
                              int64_t call_index, const std::string& op) {
    const std::string what = nb::isinstance<nb::bytes>(message)
                                 ? std::string(nb::borrow<nb::bytes>(message).c_str(), nb::len(message))
                                 : nb::cast<std::string>(message);
    for (const auto code : error_codes()) {
      if (code_id == mhccl::error_code_id(code)) {
        throw mhccl::Error(code, what, mhccl::ErrorContext{peer, call_index, op});
      }
    }
    throw mhccl::Error(mhccl::ErrorCode::kInvalidArgument,
                       "code_id: expected an ErrorCode enumerator's name, got '" + code_id + "'");
  }, nb::arg("code_id"), nb::arg("message"), nb::arg("peer") = -1, nb::arg("call_index") = -1,
     nb::arg("op") = "");

  m.def("environment_report", [] { return text(mhccl::environment_report()); },
        "The C++ library's environment report (mhccl/info.h): versions, GPUs, P2P matrix, variables.");
  m.def("mxfp8_scale_bytes", &mhccl::mxfp8_scale_bytes, nb::arg("m"), nb::arg("hidden"));
  // The C++ definitions (-1 out of range), for the tests to hold the Python twins against.
  m.def("fp8_group_scale_bytes", [](int64_t m, int64_t hidden) { return mhccl::fp8_group_scale_bytes(m, hidden); },
        nb::arg("m"), nb::arg("hidden"));
  m.def("fp8_group_scale_rows", [](int64_t m) { return mhccl::fp8_group_scale_rows(m); }, nb::arg("m"));

  m.def("unique_id", [] {
    const ncclUniqueId id = mhccl::Communicator::make_unique_id();
    return nb::bytes(id.internal, sizeof id.internal);
  }, "A fresh NCCL unique id (128 bytes), made by rank 0 and handed to every rank.");

  nb::class_<mhccl::Communicator>(m, "Communicator", nb::is_weak_referenceable())
      // CommunicatorOptions as keyword arguments; wait_timeout_ms None: the default (30 s, or
      // MHCCL_WAIT_TIMEOUT_MS, which the C++ constructor applies over any value and checks).
      .def("__init__", [](mhccl::Communicator* self, nb::bytes id, int rank, int tp, int device,
                          std::optional<uint64_t> wait_timeout_ms, bool watchdog,
                          bool force_nccl_fallback) {
             ncclUniqueId uid;
             if (id.size() != sizeof uid.internal) {
               throw mhccl::Error(mhccl::ErrorCode::kInvalidArgument,
                                  "id: expected the 128 bytes of an NCCL unique id, got " +
                                      std::to_string(id.size()));
             }
             std::memcpy(uid.internal, id.c_str(), sizeof uid.internal);
             mhccl::CommunicatorOptions o;
             if (wait_timeout_ms) o.wait_timeout_ms = *wait_timeout_ms;
             o.watchdog = watchdog;
             o.force_nccl_fallback = force_nccl_fallback;
             nb::gil_scoped_release release;  // collective: the other ranks' threads run meanwhile
             new (self) mhccl::Communicator(uid, rank, tp, device, o);
           },
           nb::arg("id"), nb::arg("rank"), nb::arg("tp"), nb::arg("device"),
           nb::kw_only(), nb::arg("wait_timeout_ms").none() = nb::none(), nb::arg("watchdog") = true,
           nb::arg("force_nccl_fallback") = false)
      .def_prop_ro("rank", &mhccl::Communicator::rank)
      // The options in effect (wait_timeout_ms: MHCCL_WAIT_TIMEOUT_MS applied).
      .def_prop_ro("wait_timeout_ms", [](const mhccl::Communicator& c) { return c.options().wait_timeout_ms; })
      .def_prop_ro("watchdog", [](const mhccl::Communicator& c) { return c.options().watchdog; })
      .def_prop_ro("force_nccl_fallback",
                   [](const mhccl::Communicator& c) { return c.options().force_nccl_fallback; })
      .def_prop_ro("tp", &mhccl::Communicator::tp)
      .def_prop_ro("device", &mhccl::Communicator::device)
      .def_prop_ro("peers_reachable", &mhccl::Communicator::peers_reachable)
      .def_prop_ro("usable", &mhccl::Communicator::usable)
      .def("check_errors", &mhccl::Communicator::check_errors)
      .def_prop_ro("rejected_calls", &mhccl::Communicator::rejected_calls)
      .def_prop_ro("launched_calls", &mhccl::Communicator::launched_calls)
      // The stream the rejected call was made on (the count advances in stream order on it).
      .def("note_rejected_call",
           [](mhccl::Communicator& c, uintptr_t stream) { c.note_rejected_call(as_stream(stream)); },
           nb::arg("stream"));

  nb::class_<mhccl::AllReduceMHC>(m, "AllReduceMHC")
      .def("__init__", [](mhccl::AllReduceMHC* self, mhccl::Communicator& comm, int64_t hidden_size,
                          int hc_mult, int64_t max_num_tokens, int top_k, bool quantize_layer_input,
                          bool residual_only, int64_t two_shot_min_rows,
                          int64_t two_shot_min_finalize_rows, int64_t nccl_min_rows,
                          int64_t nccl_min_finalize_rows, bool enable_pdl,
                          bool quantize_layer_input_fp8, bool fp8_ue8m0_scales, const std::string& tuning_file) {
             auto cfg = make_config(hidden_size, hc_mult, max_num_tokens, top_k,
                                          quantize_layer_input, residual_only, two_shot_min_rows,
                                          two_shot_min_finalize_rows, nccl_min_rows,
                                          nccl_min_finalize_rows, enable_pdl,
                                          quantize_layer_input_fp8, fp8_ue8m0_scales);
             cfg.tuning_file = tuning_file;  // a tuning table (docs/TUNING.md); "": MHCCL_TUNING_FILE
             nb::gil_scoped_release release;
             new (self) mhccl::AllReduceMHC(comm, cfg);
           },
           nb::arg("comm"), nb::arg("hidden_size"), nb::arg("hc_mult"), nb::arg("max_num_tokens"),
           nb::arg("top_k"), nb::arg("quantize_layer_input") = false, nb::arg("residual_only") = false,
           nb::arg("two_shot_min_rows") = 0, nb::arg("two_shot_min_finalize_rows") = 0,
           nb::arg("nccl_min_rows") = 0, nb::arg("nccl_min_finalize_rows") = 0,
           nb::arg("enable_pdl") = true, nb::arg("quantize_layer_input_fp8") = false,
           nb::arg("fp8_ue8m0_scales") = false, nb::arg("tuning_file") = "", nb::keep_alive<1, 2>())
      .def("call", [](mhccl::AllReduceMHC& op, const Array& x, const Array& residual, const Array& post,
                      const Array& comb, const MaybeArray& pre, const MaybeArray& norm_weight, double eps,
                      const Array& residual_out, const MaybeArray& layer_input, const MaybeArray& values,
                      const MaybeArray& scales, const MaybeArray& fp8_values,
                      const MaybeArray& fp8_scales, uintptr_t stream, const std::string& protocol) {
             Views v;
             mhccl::AllReduceMHCCallArgs a;
             a.x = v(x);
             a.epilogue = epilogue(v, residual, post, comb, pre, norm_weight, eps, residual_out,
                                   layer_input, values, scales, fp8_values, fp8_scales);
             a.protocol = parse_protocol(protocol);
             released_call([&] { op.call(a, as_stream(stream)); });
           },
           nb::arg("x"), nb::arg("residual"), nb::arg("post"), nb::arg("comb"), nb::arg("pre").none(),
           nb::arg("norm_weight").none(), nb::arg("eps"), nb::arg("residual_out"),
           nb::arg("layer_input").none(), nb::arg("mxfp8_values").none(), nb::arg("mxfp8_scales").none(),
           nb::arg("fp8_values").none(), nb::arg("fp8_scales").none(),
           nb::arg("stream"), nb::arg("protocol") = "auto")
      .def("finalize", [](mhccl::AllReduceMHC& op, const Array& gemm2, const Array& weights,
                          const Array& routes, const Array& shared, const Array& residual,
                          const Array& post, const Array& comb, const MaybeArray& pre,
                          const MaybeArray& norm_weight, double eps, const Array& residual_out,
                          const MaybeArray& layer_input, const MaybeArray& values,
                          const MaybeArray& scales, const MaybeArray& fp8_values,
                          const MaybeArray& fp8_scales, uintptr_t stream, const std::string& protocol) {
             Views v;
             mhccl::AllReduceMHCFinalizeArgs a;
             a.gemm2_permuted = v(gemm2);
             a.expert_weights = v(weights);
             a.expanded_idx_to_permuted_idx = v(routes);
             a.shared_output = v(shared);
             a.epilogue = epilogue(v, residual, post, comb, pre, norm_weight, eps, residual_out,
                                   layer_input, values, scales, fp8_values, fp8_scales);
             a.protocol = parse_protocol(protocol);
             released_call([&] { op.finalize(a, as_stream(stream)); });
           },
           nb::arg("gemm2_permuted"), nb::arg("expert_weights"), nb::arg("expanded_idx_to_permuted_idx"),
           nb::arg("shared_output"), nb::arg("residual"), nb::arg("post"), nb::arg("comb"),
           nb::arg("pre").none(), nb::arg("norm_weight").none(), nb::arg("eps"), nb::arg("residual_out"),
           nb::arg("layer_input").none(), nb::arg("mxfp8_values").none(), nb::arg("mxfp8_scales").none(),
           nb::arg("fp8_values").none(), nb::arg("fp8_scales").none(),
           nb::arg("stream"), nb::arg("protocol") = "auto")
      .def("protocol_for", [](const mhccl::AllReduceMHC& op, int64_t m, bool finalize) {
             return std::string(mhccl::protocol_name(op.protocol_for(m, finalize)));
           }, nb::arg("m"), nb::arg("finalize") = false)
      .def_prop_ro("tuning_source", [](const mhccl::AllReduceMHC& op) { return text(op.tuning_source()); })
      .def_prop_ro("two_shot_min_rows", [](const mhccl::AllReduceMHC& op) { return op.config().two_shot_min_rows; })
      .def_prop_ro("two_shot_min_finalize_rows",
                   [](const mhccl::AllReduceMHC& op) { return op.config().two_shot_min_finalize_rows; })
      .def_prop_ro("mailbox_bytes", &mhccl::AllReduceMHC::mailbox_bytes);

  nb::class_<mhccl::LamportAllGather>(m, "LamportAllGather")
      .def("__init__", [](mhccl::LamportAllGather* self, mhccl::Communicator& comm, int64_t capacity) {
             nb::gil_scoped_release release;
             new (self) mhccl::LamportAllGather(comm, capacity);
           }, nb::arg("comm"), nb::arg("rank_capacity_bytes"), nb::keep_alive<1, 2>())
      .def("accepts", [](const mhccl::LamportAllGather& op, const Array& t) { return op.accepts(*View(t).get()); })
      .def("call", [](mhccl::LamportAllGather& op, const Array& in, const Array& out, uintptr_t stream) {
             const View vin(in), vout(out);
             released_call([&] { op.call(*vin.get(), *vout.get(), as_stream(stream)); });
           }, nb::arg("inp"), nb::arg("out"), nb::arg("stream"))
      .def_prop_ro("rank_capacity_bytes", &mhccl::LamportAllGather::rank_capacity_bytes)
      .def_prop_ro("mailbox_bytes", &mhccl::LamportAllGather::mailbox_bytes);

  // The host-side checks, callable without a GPU (what every op runs before its first launch).
  m.def("check_config", [](int64_t hidden_size, int hc_mult, int64_t max_num_tokens, int top_k,
                           bool quantize_layer_input, bool residual_only, int tp,
                           int64_t two_shot_min_rows, int64_t two_shot_min_finalize_rows,
                           int64_t nccl_min_rows, int64_t nccl_min_finalize_rows,
                           bool quantize_layer_input_fp8, bool fp8_ue8m0_scales) {
          mhccl::check_all_reduce_mhc_config(
              make_config(hidden_size, hc_mult, max_num_tokens, top_k, quantize_layer_input,
                          residual_only, two_shot_min_rows, two_shot_min_finalize_rows,
                          nccl_min_rows, nccl_min_finalize_rows, true, quantize_layer_input_fp8,
                          fp8_ue8m0_scales), tp);
        }, nb::arg("hidden_size"), nb::arg("hc_mult"), nb::arg("max_num_tokens"), nb::arg("top_k"),
        nb::arg("quantize_layer_input") = false, nb::arg("residual_only") = false, nb::arg("tp") = 1,
        nb::arg("two_shot_min_rows") = 0, nb::arg("two_shot_min_finalize_rows") = 0,
        nb::arg("nccl_min_rows") = 0, nb::arg("nccl_min_finalize_rows") = 0,
        nb::arg("quantize_layer_input_fp8") = false, nb::arg("fp8_ue8m0_scales") = false);
  m.def("check_call", [](int64_t hidden_size, int hc_mult, int64_t max_num_tokens, int top_k,
                         bool quantize_layer_input, bool residual_only, int device, const Array& x,
                         const Array& residual, const Array& post, const Array& comb, const MaybeArray& pre,
                         const MaybeArray& norm_weight, double eps, const Array& residual_out,
                         const MaybeArray& layer_input, const MaybeArray& values, const MaybeArray& scales,
                         const MaybeArray& fp8_values, const MaybeArray& fp8_scales,
                         bool quantize_layer_input_fp8, bool fp8_ue8m0_scales) {
          Views v;
          mhccl::AllReduceMHCCallArgs a;
          a.x = v(x);
          a.epilogue = epilogue(v, residual, post, comb, pre, norm_weight, eps, residual_out,
                                layer_input, values, scales, fp8_values, fp8_scales);
          return mhccl::check_all_reduce_mhc_call(
              make_config(hidden_size, hc_mult, max_num_tokens, top_k, quantize_layer_input,
                          residual_only, 0, 0, 0, 0, true, quantize_layer_input_fp8,
                          fp8_ue8m0_scales), device, a);
        }, nb::arg("hidden_size"), nb::arg("hc_mult"), nb::arg("max_num_tokens"), nb::arg("top_k"),
        nb::arg("quantize_layer_input"), nb::arg("residual_only"), nb::arg("device"), nb::arg("x"),
        nb::arg("residual"), nb::arg("post"), nb::arg("comb"), nb::arg("pre").none(),
        nb::arg("norm_weight").none(), nb::arg("eps"), nb::arg("residual_out"),
        nb::arg("layer_input").none(), nb::arg("mxfp8_values").none(), nb::arg("mxfp8_scales").none(),
        nb::arg("fp8_values").none() = nb::none(), nb::arg("fp8_scales").none() = nb::none(),
        nb::arg("quantize_layer_input_fp8") = false, nb::arg("fp8_ue8m0_scales") = false);
  m.def("check_all_gather_config", &mhccl::check_all_gather_config, nb::arg("rank_capacity_bytes"));
  m.def("check_all_gather", [](int64_t capacity, int tp, int device, const Array& in, const Array& out) {
          mhccl::check_all_gather_config(capacity);
          return mhccl::check_all_gather_call(capacity, tp, device, *View(in).get(), *View(out).get());
        }, nb::arg("rank_capacity_bytes"), nb::arg("tp"), nb::arg("device"), nb::arg("inp"), nb::arg("out"));
  m.def("all_gather_accepts", [](int64_t capacity, const Array& in) {
          return mhccl::all_gather_accepts(capacity, *View(in).get());
        }, nb::arg("rank_capacity_bytes"), nb::arg("inp"));
  // The self-test's own argument checks (tools/tune/verify.h), made before its communicator.
  m.def("self_test_check", [](int64_t hidden_size, int hc_mult, int top_k, const std::vector<std::string>& variants,
                              const std::vector<int64_t>& ms, int tp) {
          mhccl::tune::VerifyOptions o;
          o.hidden = hidden_size;
          o.hc = hc_mult;
          o.top_k = top_k;
          o.variants = variants;
          if (!ms.empty()) o.ms = ms;
          mhccl::tune::check_verify_options(o, tp);
        }, nb::arg("hidden_size"), nb::arg("hc_mult"), nb::arg("top_k"), nb::arg("variants"), nb::arg("ms"),
        nb::arg("tp"));
  // The deployment self-test (python -m mhccl.selftest; tools/tune/verify.h): collective over the
  // communicator's group. Returns (ok, report, first_failure).
  m.def("self_test", [](mhccl::Communicator& comm, int64_t hidden_size, int hc_mult, int top_k,
                        const std::vector<std::string>& variants, const std::vector<int64_t>& ms,
                        const std::string& tuning_file, bool print) {
          mhccl::tune::VerifyOptions o;
          o.hidden = hidden_size;
          o.hc = hc_mult;
          o.top_k = top_k;
          o.variants = variants;
          if (!ms.empty()) o.ms = ms;
          o.tuning_file = tuning_file;
          o.print = print;
          mhccl::tune::VerifyResult r;
          {
            nb::gil_scoped_release release;
            SelfTestStream guard(comm.device());
            r = mhccl::tune::verify(comm, guard.stream, o);
          }
          return std::make_tuple(r.ok, text(r.report), text(r.first_failure));
        }, nb::arg("comm"), nb::arg("hidden_size") = 5120, nb::arg("hc_mult") = 4, nb::arg("top_k") = 6,
        nb::arg("variants") = std::vector<std::string>{}, nb::arg("ms") = std::vector<int64_t>{},
        nb::arg("tuning_file") = "", nb::arg("print") = true);
}
