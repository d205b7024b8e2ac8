// The extension sparsereduce._sparsereduce: Worker, Handle (an allreduce in flight), CollectiveStats and the
// Error exception. The pure-Python package (python/sparsereduce/) wraps it for torch tensors.
//
// GIL: released while a Worker connects and joins, while waiting for a collective and while destroying a
// Worker, so other Python threads (training loop, DDP's autograd thread, other ranks in tests) keep running.
//
// Interpreter exit: a thread other than the exiting one never retakes the GIL once the interpreter exits (ExitGate).
//
// Signals: allreduce and Handle.wait wait in slices of kSignalCheckInterval and run Python's signal handlers
// between them, so Ctrl-C raises KeyboardInterrupt within about 0.1 s. The collective keeps running: its Handle
// (or, once that is gone, the Worker's Orphans) keeps the array held until it finished. The constructor joins on a
// thread of its own and waits for it the same way; Ctrl-C cancels the join (WorkerOptions::cancel).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <tuple>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "held_buffer.h"
#include "sparsereduce/worker.h"

namespace py = pybind11;

namespace sparsereduce::python {
namespace {

PyObject* g_error_type = nullptr;  // sparsereduce.Error, created once at import

// Interpreter exit. Python (3.11, 3.12) ends a thread that takes the GIL once the interpreter finalizes with
// pthread_exit; inside this extension that unwind runs through destructors (gil_scoped_release's is noexcept)
// and aborted the process (SIGABRT and a core dump instead of the script's exit status), e.g. when a script
// failed while the DDP hook's completer thread waited for a bucket. So the extension's own atexit hook, which runs
// on the exiting thread before finalization, marks the exit; from then on the other threads never retake the GIL
// in GilRelease (they sleep until the process has ended), and the hook lets the threads that were already retaking
// it finish first (GilRelease's count and the flag are sequentially consistent: each side sees the other).
struct ExitGate {
  std::atomic<bool> exiting{false};
  std::atomic<int> retaking{0};
  std::atomic<unsigned long> exiting_thread{0};
  std::mutex mutex;
  std::condition_variable retaken;
};
ExitGate g_exit;

void LeaveRetaking() {
  if (--g_exit.retaking == 0 && g_exit.exiting) {
    std::lock_guard lock(g_exit.mutex);  // the hook checks the count under it: no wake-up is lost
    g_exit.retaken.notify_all();
  }
}

void OnInterpreterExit() {
  g_exit.exiting_thread = PyThread_get_thread_ident();
  g_exit.exiting = true;
  Py_BEGIN_ALLOW_THREADS;
  std::unique_lock lock(g_exit.mutex);
  g_exit.retaken.wait_for(lock, std::chrono::seconds(2), [] { return g_exit.retaking.load() == 0; });
  Py_END_ALLOW_THREADS;
}

// Releases the GIL for the scope, as py::gil_scoped_release does, but a thread other than the exiting one does
// not retake it once the interpreter exits (see ExitGate).
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() {
    ++g_exit.retaking;
    if (g_exit.exiting && PyThread_get_thread_ident() != g_exit.exiting_thread) {
      LeaveRetaking();
      for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
    }
    PyEval_RestoreThread(state_);
    LeaveRetaking();
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

using Clock = std::chrono::steady_clock;
constexpr double kYear = 365.0 * 24 * 3600;  // seconds; longer timeouts would overflow integer durations
constexpr auto kSignalCheckInterval = std::chrono::milliseconds(100);

// The shortest decimal that reads back as the same float32 (0.01, not 0.010000).
std::string ShortestFloat(float x) {
  char text[32];
  auto [end, ec] = std::to_chars(text, text + sizeof text, x);
  return ec == std::errc() ? std::string(text, end) : std::to_string(x);
}

// A number of seconds as Python prints it (0.3, -1.0), for messages about the caller's arguments. Requires the GIL.
std::string PythonSeconds(double seconds) { return py::repr(py::float_(seconds)).cast<std::string>(); }

std::string JobRank(uint64_t job, uint32_t rank) {
  return "job " + std::to_string(job) + " rank " + std::to_string(rank);
}

// A Worker option in seconds -> whole milliseconds, rounded up (0.0001 s is 1 ms, not 0).
std::chrono::milliseconds Milliseconds(double seconds, const char* name) {
  // Positive, finite and at most a year: beyond that the conversion to integer milliseconds would overflow.
  if (!(seconds > 0 && seconds <= kYear)) {
    throw py::value_error(std::string("sparsereduce: ") + name +
                          " must be more than 0 and at most 31536000 seconds (a year), got " + PythonSeconds(seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

// Waits for `future` until `deadline` (none: no bound) in slices of kSignalCheckInterval, the GIL released;
// between slices runs Python's signal handlers (with the GIL) and raises what they raise (KeyboardInterrupt).
// True once the future is ready. Requires the GIL.
template <typename Future>
bool WaitUntil(const Future& future, std::optional<Clock::time_point> deadline) {
  for (;;) {
    Clock::time_point slice_end = Clock::now() + kSignalCheckInterval;
    if (deadline) slice_end = std::min(slice_end, *deadline);
    std::future_status status;
    {
      GilRelease release;
      status = future.wait_until(slice_end);
    }
    if (status == std::future_status::ready) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (deadline && Clock::now() >= *deadline) return false;
  }
}

// Collectives whose Handle went away before they finished (dropped early, or the synchronous allreduce
// interrupted by a signal): their buffer stays held, since the I/O thread still reads and writes it, and their
// Worker alive, so that they run to their end as if the Handle were still there. Shared by a PyWorker and its
// Handles; every member function requires the GIL.
class Orphans {
 public:
  struct Orphan {
    std::shared_ptr<Worker> worker;
    HeldBuffer buffer;
    std::shared_future<void> future;
  };

  Orphans() = default;
  Orphans(const Orphans&) = delete;
  Orphans& operator=(const Orphans&) = delete;

  // Destroyed with the last of the PyWorker and its Handles (garbage collection without close()): nobody can see
  // their results any more, so what is still in flight is aborted, then waited for (about 0.5 s at most, not
  // interruptible: a destructor cannot raise). It waited for the collectives to end, up to their deadline.
  ~Orphans() {
    if (!InForkedChild()) {  // in a child of fork() nothing runs them: there is nothing to wait for
      GilRelease release;
      for (Orphan& orphan : list_) orphan.worker->abort();
      for (Orphan& orphan : list_) orphan.future.wait();
    }
    Drop(std::move(list_));
  }

  // A copy in a child made by fork(): the collectives belong to the parent's I/O thread, which the child lacks.
  bool InForkedChild() const { return getpid() != creator_pid_; }
  pid_t creator_pid() const { return creator_pid_; }

  void Adopt(Orphan orphan) { list_.push_back(std::move(orphan)); }

  // Lets go of the collectives that finished.
  void Reap() {
    std::vector<Orphan> finished;
    for (auto it = list_.begin(); it != list_.end();) {
      if (it->future.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        finished.push_back(std::move(*it));
        it = list_.erase(it);
      } else {
        ++it;
      }
    }
    Drop(std::move(finished));
  }

  // Waits (interruptibly, see WaitUntil) until every orphan finished, then lets go of them.
  void WaitAll() {
    if (InForkedChild()) {
      Drop(std::move(list_));
      list_.clear();
      return;
    }
    std::vector<std::shared_future<void>> futures;
    for (const Orphan& orphan : list_) futures.push_back(orphan.future);
    for (const auto& future : futures) WaitUntil(future, std::nullopt);
    Reap();
  }

 private:
  // Releases the buffers (GIL held), then the Worker references without the GIL: the last one destroys a
  // closed Worker, which says goodbye and joins its I/O thread.
  static void Drop(std::vector<Orphan> orphans) {
    for (Orphan& orphan : orphans) orphan.buffer.Release();
    GilRelease release;
    orphans.clear();
  }

  std::vector<Orphan> list_;
  const pid_t creator_pid_ = getpid();
};

// One allreduce in flight. Holds the caller's buffer and the Worker until the collective has finished, so
// neither can go away while the I/O thread still reads or writes the memory; then lets both go, so that a finished
// handle the caller keeps does not keep a closed Worker in the job.
class Handle {
 public:
  Handle(std::shared_ptr<Worker> worker, std::shared_ptr<Orphans> orphans, HeldBuffer buffer,
         std::shared_future<void> future, uint64_t seq)
      : job_(worker->options().job),
        rank_(worker->options().rank),
        worker_(std::move(worker)),
        orphans_(std::move(orphans)),
        buffer_(std::move(buffer)),
        future_(std::move(future)),
        seq_(seq) {}

  // Dropping a handle early must not let the Worker write into freed memory, nor block: the buffer and the
  // Worker go to the orphans until the collective finished. Runs with the GIL.
  ~Handle() {
    if (!finished_ && future_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      orphans_->Adopt({worker_, std::move(buffer_), future_});
    }
    buffer_.Release();
    {
      // Possibly the last reference to a closed Worker: its destructor says goodbye and joins the I/O thread.
      GilRelease release;
      worker_.reset();
    }
    orphans_->Reap();
  }

  // Blocks (GIL released) until the allreduce finished; raises sparsereduce.Error if it failed, TimeoutError
  // if `timeout` seconds passed first (the collective keeps running: wait again, or its deadline ends it), and
  // whatever a signal handler raises (KeyboardInterrupt) if a signal arrives while waiting. None, inf or more
  // than a year: no timeout; NaN or negative: ValueError.
  void Wait(std::optional<double> timeout) {
    RefuseInForkedChild();
    std::optional<Clock::time_point> deadline;
    if (timeout) {
      double t = *timeout;
      if (std::isnan(t) || t < 0) {
        throw py::value_error("sparsereduce: timeout must be None or at least 0 seconds, got " + PythonSeconds(t));
      }
      if (t <= kYear)
        deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
    }
    if (!WaitUntil(future_, deadline)) {
      std::string message = "sparsereduce: " + JobRank(job_, rank_) + ": the allreduce (collective " +
                            std::to_string(seq_) + ", " + std::to_string(buffer_.count()) +
                            (buffer_.type() == ElementType::kFloat32 ? " float32" : " int32") +
                            " elements) did not finish within " + PythonSeconds(*timeout) +
                            " s (it keeps running: wait again)";
      PyErr_SetString(PyExc_TimeoutError, message.c_str());
      throw py::error_already_set();
    }
    Finish();
    future_.get();  // rethrows the collective's Error
  }

  bool Done() {
    if (finished_) return true;
    RefuseInForkedChild();  // else False forever: only the parent's I/O thread runs the collective
    if (future_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    Finish();
    return true;
  }

  std::optional<CollectiveStats> stats() const { return stats_; }

 private:
  // The Worker only keeps the stats of its latest collective; they are this one's when the sequence numbers
  // match (collectives are numbered from 1 in submission order), else a later one already replaced them.
  void Finish() {
    if (finished_) return;
    finished_ = true;
    buffer_.Release();
    bool ok = true;
    try {
      future_.get();
    } catch (...) {
      ok = false;
    }
    if (ok) {
      CollectiveStats s = worker_->last_stats();
      if (s.seq == seq_) stats_ = s;
    }
    std::shared_ptr<Worker> worker = std::move(worker_);
    GilRelease release;  // possibly the last reference to a closed Worker, whose destructor leaves the job
    worker.reset();
  }

  void RefuseInForkedChild() const {
    if (orphans_->InForkedChild()) {
      throw Error("UNSUPPORTED", "sparsereduce: " + JobRank(job_, rank_) + ": this allreduce runs in process " +
                                     std::to_string(orphans_->creator_pid()) +
                                     ", not in this one forked from it; create a new Worker here");
    }
  }

  const uint64_t job_;
  const uint32_t rank_;
  std::shared_ptr<Worker> worker_;  // until finished
  std::shared_ptr<Orphans> orphans_;
  HeldBuffer buffer_;
  std::shared_future<void> future_;
  uint64_t seq_;
  bool finished_ = false;
  std::optional<CollectiveStats> stats_;
};

class PyWorker {
 public:
  explicit PyWorker(WorkerOptions options) : job_(options.job), rank_(options.rank) {
    // Joining waits for the other ranks (which may be threads of this process) for up to connect_timeout +
    // join_timeout: on a thread of its own, so that this one runs the signal handlers and a KeyboardInterrupt
    // cancels the join.
    std::stop_source stop;
    options.cancel = stop.get_token();
    auto joining = std::async(std::launch::async, [options = std::move(options)]() mutable {
      return std::make_shared<Worker>(std::move(options));
    });
    try {
      WaitUntil(joining, std::nullopt);
    } catch (py::error_already_set&) {
      stop.request_stop();
      {
        GilRelease release;
        // ABORTED within milliseconds; a Worker that joined just before the stop leaves the job here.
        try {
          joining.get();
        } catch (...) {
        }
      }
      throw;
    }
    worker_ = joining.get();  // the library's Error if the join failed
  }

  // Leaves the job if close() was not called; then no collective is in flight unless a Handle keeps the Worker.
  ~PyWorker() {
    {
      GilRelease release;
      worker_.reset();
    }
    orphans_->Reap();
  }

  std::unique_ptr<Handle> AllreduceAsync(py::handle array, uint64_t key, std::optional<CodecOptions> codec) {
    orphans_->Reap();
    HeldBuffer buffer = HeldBuffer::Acquire(array.ptr(), JobRank(job_, rank_));
    AllreduceOptions options;
    options.key = key;
    options.codec = std::move(codec);
    std::shared_ptr<Worker> worker = Get();
    std::future<void> future;
    uint64_t seq = 0;
    {
      // The mutex pairs each submission with its sequence number; taken without the GIL so that a thread
      // holding it never waits for the GIL.
      GilRelease release;
      std::lock_guard lock(submit_mutex_);
      future = buffer.type() == ElementType::kFloat32 ? worker->allreduce_async(buffer.floats(), options)
                                                      : worker->allreduce_async(buffer.ints(), options);
      seq = ++submitted_;
    }
    return std::make_unique<Handle>(std::move(worker), orphans_, std::move(buffer), future.share(), seq);
  }

  // A signal handler's exception (KeyboardInterrupt) leaves the collective running: the Handle's destructor
  // passes the array on to the orphans.
  void Allreduce(py::handle array, uint64_t key, std::optional<CodecOptions> codec) {
    AllreduceAsync(array, key, std::move(codec))->Wait(std::nullopt);
  }

  CollectiveStats LastStats() { return Get()->last_stats(); }
  WorkerOptions Options() { return Get()->options(); }
  std::vector<std::string> Transports() { return Get()->transports(); }

  // Says goodbye to the aggregators now rather than at garbage collection. First waits (interruptibly) for the
  // collectives of dropped handles; handles still alive keep the Worker until they finish.
  void Close() {
    orphans_->WaitAll();
    std::shared_ptr<Worker> worker;
    {
      std::lock_guard lock(submit_mutex_);
      worker = std::move(worker_);
    }
    {
      GilRelease release;
      worker.reset();
    }
    orphans_->Reap();
  }

  bool closed() {
    std::lock_guard lock(submit_mutex_);
    return worker_ == nullptr;
  }

  // Worker::abort; nothing once closed.
  void Abort() {
    std::lock_guard lock(submit_mutex_);
    if (worker_) worker_->abort();
  }

 private:
  std::shared_ptr<Worker> Get() {
    std::lock_guard lock(submit_mutex_);
    if (!worker_) throw py::value_error("sparsereduce: " + JobRank(job_, rank_) + ": the Worker is closed");
    return worker_;
  }

  const uint64_t job_;
  const uint32_t rank_;
  std::mutex submit_mutex_;
  std::shared_ptr<Orphans> orphans_ = std::make_shared<Orphans>();
  std::shared_ptr<Worker> worker_;
  uint64_t submitted_ = 0;
};

void TranslateErrors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    py::object error = py::reinterpret_borrow<py::object>(g_error_type)(e.what());
    error.attr("code") = e.code();
    PyErr_SetObject(g_error_type, error.ptr());
  }
}

}  // namespace
}  // namespace sparsereduce::python

PYBIND11_MODULE(_sparsereduce, m) {
  using namespace sparsereduce;
  using namespace sparsereduce::python;
  m.doc() = "sparsereduce worker library: sparse allreduce through aggregator daemons";

  py::module_::import("atexit").attr("register")(py::cpp_function(&OnInterpreterExit));
  g_error_type = PyErr_NewExceptionWithDoc(
      "sparsereduce.Error",
      "A failure of the sparsereduce library. str(e) names the job, the rank and the aggregator involved; "
      "e.code is a stable name such as 'SPEC_MISMATCH', 'PEER_LEFT', 'DEADLINE_EXCEEDED' or 'UNAVAILABLE'.",
      PyExc_RuntimeError, nullptr);
  if (!g_error_type) throw py::error_already_set();
  py::handle(g_error_type).attr("code") = py::none();
  m.add_object("Error", py::handle(g_error_type));
  py::register_exception_translator(&TranslateErrors);

  py::class_<CollectiveStats>(m, "CollectiveStats", "What one allreduce did, seen from this worker.")
      .def_readonly("seq", &CollectiveStats::seq)
      .def_readonly("element_count", &CollectiveStats::element_count)
      .def_readonly("blocks", &CollectiveStats::blocks)
      .def_readonly("nonzero_blocks", &CollectiveStats::nonzero_blocks, "this rank's nonzero blocks")
      .def_readonly("bytes_sent", &CollectiveStats::bytes_sent)
      .def_readonly("bytes_received", &CollectiveStats::bytes_received)
      .def_readonly("seconds", &CollectiveStats::seconds)
      .def_readonly("selected_blocks", &CollectiveStats::selected_blocks, "topk / adaptive: the k chosen")
      .def_readonly("codec", &CollectiveStats::codec)
      .def("__repr__", [](const CollectiveStats& s) {
        return "CollectiveStats(seq=" + std::to_string(s.seq) +
               ", element_count=" + std::to_string(s.element_count) + ", blocks=" + std::to_string(s.blocks) +
               ", nonzero_blocks=" + std::to_string(s.nonzero_blocks) +
               ", bytes_sent=" + std::to_string(s.bytes_sent) +
               ", bytes_received=" + std::to_string(s.bytes_received) +
               ", seconds=" + std::to_string(s.seconds) + ", codec=" + s.codec +
               ", selected_blocks=" + std::to_string(s.selected_blocks) + ")";
      })
      // Values, so they pickle (a spawned process's arguments, a results file) and compare by value.
      .def(py::pickle(
          [](const CollectiveStats& s) {
            return py::make_tuple(s.seq, s.element_count, s.blocks, s.nonzero_blocks, s.selected_blocks, s.codec,
                                  s.bytes_sent, s.bytes_received, s.seconds);
          },
          [](const py::tuple& t) {
            if (t.size() != 9) throw std::runtime_error("CollectiveStats: a state of 9 fields was expected");
            return CollectiveStats{t[0].cast<uint64_t>(),    t[1].cast<uint64_t>(), t[2].cast<uint64_t>(),
                                   t[3].cast<uint64_t>(),    t[4].cast<uint64_t>(), t[5].cast<std::string>(),
                                   t[6].cast<uint64_t>(),    t[7].cast<uint64_t>(), t[8].cast<double>()};
          }))
      .def("__eq__", [](const CollectiveStats& a, const CollectiveStats& b) {
        return std::tie(a.seq, a.element_count, a.blocks, a.nonzero_blocks, a.selected_blocks, a.codec, a.bytes_sent,
                        a.bytes_received, a.seconds) == std::tie(b.seq, b.element_count, b.blocks, b.nonzero_blocks,
                                                                 b.selected_blocks, b.codec, b.bytes_sent,
                                                                 b.bytes_received, b.seconds);
      });

  py::class_<CodecOptions>(m, "Codec",
                           "A lossy compression stage for float32 allreduces (docs/PROTOCOL.md §11); 'none' is exact.")
      .def(py::init([](std::string name, float sparsity, bool fp32_results, float fraction, float alpha,
                       bool l2_norm, bool tensor_scale) {
             return CodecOptions{std::move(name), sparsity, fp32_results, fraction, alpha, l2_norm, tensor_scale};
           }),
           py::arg("name") = "none", py::kw_only(), py::arg("sparsity") = 1.0f, py::arg("fp32_results") = false,
           py::arg("fraction") = 0.01f, py::arg("alpha") = 0.0f, py::arg("l2_norm") = false,
           py::arg("tensor_scale") = false,
           "name: none, fp16, bf16, 3lc, diana, topk or adaptive. sparsity: 3lc's s in [1, 2). fp32_results: 3lc "
           "sums in fp32. fraction: topk's share of blocks. alpha: diana's step (0: "
           "1/sqrt(block size)). l2_norm: diana's block scale. tensor_scale: 3lc's scale over the whole tensor instead "
           "of per block.")
      .def_readwrite("name", &CodecOptions::name)
      .def_readwrite("sparsity", &CodecOptions::sparsity)
      .def_readwrite("fp32_results", &CodecOptions::fp32_results)
      .def_readwrite("fraction", &CodecOptions::fraction)
      .def_readwrite("alpha", &CodecOptions::alpha)
      .def_readwrite("l2_norm", &CodecOptions::l2_norm)
      .def_readwrite("tensor_scale", &CodecOptions::tensor_scale)
      .def("__repr__", [](const CodecOptions& c) {
        return "Codec('" + c.name + "', sparsity=" + ShortestFloat(c.sparsity) +
               ", fp32_results=" + (c.fp32_results ? "True" : "False") + ", fraction=" + ShortestFloat(c.fraction) +
               ", alpha=" + ShortestFloat(c.alpha) + ", l2_norm=" + (c.l2_norm ? "True" : "False") +
               ", tensor_scale=" + (c.tensor_scale ? "True" : "False") + ")";
      })
      .def(py::pickle(
          [](const CodecOptions& c) {
            return py::make_tuple(c.name, c.sparsity, c.fp32_results, c.fraction, c.alpha, c.l2_norm, c.tensor_scale);
          },
          [](const py::tuple& t) {
            if (t.size() != 7) throw std::runtime_error("Codec: a state of 7 fields was expected");
            return CodecOptions{t[0].cast<std::string>(), t[1].cast<float>(), t[2].cast<bool>(), t[3].cast<float>(),
                                t[4].cast<float>(),       t[5].cast<bool>(),  t[6].cast<bool>()};
          }))
      .def("__eq__", [](const CodecOptions& a, const CodecOptions& b) {
        return std::tie(a.name, a.sparsity, a.fp32_results, a.fraction, a.alpha, a.l2_norm, a.tensor_scale) ==
               std::tie(b.name, b.sparsity, b.fp32_results, b.fraction, b.alpha, b.l2_norm, b.tensor_scale);
      });
  py::implicitly_convertible<std::string, CodecOptions>();

  py::class_<Handle>(m, "Handle", "An allreduce in flight; the array must not be touched until it is done.")
      .def("wait", &Handle::Wait, py::arg("timeout") = py::none(),
           "Block until the allreduce finished (GIL released). Raises sparsereduce.Error if it failed, "
           "TimeoutError if `timeout` seconds passed first (None, inf or more than a year: no timeout; NaN or "
           "negative: ValueError), KeyboardInterrupt on Ctrl-C (within about 0.1 s). After a TimeoutError or an "
           "interrupt the collective keeps running: wait again, or drop the handle (the array stays held until the "
           "collective finished).")
      .def("done", &Handle::Done, "True once the allreduce finished, successfully or not.")
      .def_property_readonly("stats", &Handle::stats,
                             "CollectiveStats of this allreduce once done, or None if a later one already "
                             "replaced them in the Worker.");

  m.def("check_environment", &sparsereduce::CheckEnvironment,
        "Check the SPARSEREDUCE_* variables a Worker reads (aggregators, transport, TCP send buffer, secret) as its "
        "constructor does, without connecting; raises the Error (INVALID_ARGUMENT) it would.");

  py::class_<PyWorker>(m, "Worker")
      .def(py::init([](std::vector<std::string> aggregators, uint64_t job, uint32_t rank, uint32_t world_size,
                       std::string secret, uint32_t block_size, uint32_t slots, uint32_t blocks_per_message,
                       uint32_t window, double connect_timeout, double join_timeout, double collective_timeout,
                       std::string transport, std::string rdma_device, uint32_t rdma_port, int32_t rdma_gid_index,
                       uint32_t tcp_send_buffer, bool restore_on_failure, bool yield_while_scanning,
                       CodecOptions codec, uint64_t codec_seed) {
             WorkerOptions o;
             o.aggregators = std::move(aggregators);
             o.job = job;
             o.rank = rank;
             o.world_size = world_size;
             o.secret = std::move(secret);
             o.block_size = block_size;
             o.slots = slots;
             o.blocks_per_message = blocks_per_message;
             o.window = window;
             o.connect_timeout = Milliseconds(connect_timeout, "connect_timeout");
             o.join_timeout = Milliseconds(join_timeout, "join_timeout");
             o.collective_timeout = Milliseconds(collective_timeout, "collective_timeout");
             o.transport = std::move(transport);
             o.rdma_device = std::move(rdma_device);
             o.rdma_port = rdma_port;
             o.rdma_gid_index = rdma_gid_index;
             o.tcp_send_buffer = tcp_send_buffer;
             o.restore_on_failure = restore_on_failure;
             o.yield_while_scanning = yield_while_scanning;
             o.codec = std::move(codec);
             o.codec_seed = codec_seed;
             return std::make_unique<PyWorker>(std::move(o));
           }),
           py::arg("aggregators"), py::arg("job"), py::arg("rank"), py::arg("world_size"), py::kw_only(),
           py::arg("secret") = "", py::arg("block_size") = 256, py::arg("slots") = 8,
           py::arg("blocks_per_message") = 128, py::arg("window") = 1, py::arg("connect_timeout") = 30.0,
           py::arg("join_timeout") = 60.0, py::arg("collective_timeout") = 1800.0, py::arg("transport") = "",
           py::arg("rdma_device") = "", py::arg("rdma_port") = 1, py::arg("rdma_gid_index") = -1,
           py::arg("tcp_send_buffer") = 0, py::arg("restore_on_failure") = true,
           py::arg("yield_while_scanning") = false, py::arg("codec") = CodecOptions{},
           py::arg("codec_seed") = 0)
      .def("allreduce", &PyWorker::Allreduce, py::arg("array"), py::arg("key") = 0, py::arg("codec") = py::none(),
           "Sum `array` over all ranks, in place (GIL released while waiting). `key` names the tensor across calls "
           "for codecs with state; `codec` overrides the Worker's.")
      .def("allreduce_async", &PyWorker::AllreduceAsync, py::arg("array"), py::arg("key") = 0,
           py::arg("codec") = py::none(), "Start an allreduce of `array` in place and return a Handle.")
      .def_property_readonly("last_stats", &PyWorker::LastStats)
      .def_property_readonly("job", [](PyWorker& w) { return w.Options().job; })
      .def_property_readonly("rank", [](PyWorker& w) { return w.Options().rank; })
      .def_property_readonly("world_size", [](PyWorker& w) { return w.Options().world_size; })
      .def_property_readonly("block_size", [](PyWorker& w) { return w.Options().block_size; })
      .def_property_readonly("aggregators", [](PyWorker& w) { return w.Options().aggregators; })
      .def_property_readonly("transports", &PyWorker::Transports,
                             "Per aggregator, what the connection runs on: 'tcp', 'shm' or 'rdma'.")
      .def_property_readonly("closed", &PyWorker::closed)
      .def("close", &PyWorker::Close, "Leave the job now; later calls raise ValueError.")
      .def("abort", &PyWorker::Abort,
           "Fail every allreduce queued or in flight with ABORTED (their arrays restored) and leave the job; returns "
           "at once. The Worker is unusable afterwards; close() still releases it.");
}
