// The process group: MPI started from the launcher's environment (or not at all), this
// process's place in it, and how a failing rank takes the job down with it.
#include "mpi_util.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace loom::dist {
namespace {

struct World {
  bool mpi = false;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
};

// mpirun/mpiexec of Open MPI, MPICH's and Intel MPI's Hydra, and PMIx launchers (srun) each
// set one of these. Without them MPI_Init would start a singleton, which is slow and, in a
// container without a network, can fail, for a program that runs alone anyway.
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Any exception that escapes (main, a std::thread) ends every rank with its message. Without
// this, the rank would die and the others would learn of it only from mpirun, which reports a
// signal and not the reason.
[[noreturn]] void on_terminate() {
  std::string what = "terminate called without an active exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = std::string("uncaught exception: ") + x.what();
    } catch (...) {
      what = "uncaught exception of an unknown type";
    }
  }
  dist::abort("loom: " + what);
}

World start() {
  World w;
  if (!launched_by_mpi()) return w;
  int provided = 0;
  // SERIALIZED: loom calls MPI from whichever thread runs the training loop, one call at a time.
  detail::check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "dist::init", "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw Error("dist::init: this MPI library offers no MPI_THREAD_SERIALIZED support");
  }
  // Failures come back as status codes (and then loom::Error) instead of MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  w.mpi = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  MPI_Comm local;
  detail::check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local),
                "dist::init", "MPI_Comm_split_type");
  MPI_Comm_rank(local, &w.local_rank);
  MPI_Comm_size(local, &w.local_size);
  MPI_Comm_free(&local);
  std::atexit(finalize_at_exit);
  std::set_terminate(on_terminate);
  return w;
}

// Started once: a start that failed fails the same way at every later call (MPI cannot be
// initialized twice, so a retry would only report that instead of the cause).
const World& world() {
  struct Started {
    World world;
    std::exception_ptr error;
  };
  static const Started s = [] {
    Started r;
    try {
      r.world = start();
    } catch (...) {
      r.error = std::current_exception();
    }
    return r;
  }();
  if (s.error) std::rethrow_exception(s.error);
  return s.world;
}

}  // namespace

void init() { world(); }
int rank() { return world().rank; }
int world_size() { return world().size; }
int local_rank() { return world().local_rank; }
int local_size() { return world().local_size; }
bool is_distributed() { return world().size > 1; }

void barrier() {
  if (!is_distributed()) return;
  detail::check(MPI_Barrier(MPI_COMM_WORLD), "dist::barrier", "MPI_Barrier");
}

void abort(const std::string& message, int code) {
  std::fflush(stdout);
  // Asks MPI directly rather than world(): this also runs when starting MPI failed.
  int started = 0, finalized = 0;
  MPI_Initialized(&started);
  MPI_Finalized(&finalized);
  const bool mpi = started && !finalized;
  int r = 0, size = 1;
  if (mpi) {
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::fprintf(stderr, "[rank %d of %d] %s\n", r, size, message.c_str());
  } else {
    std::fprintf(stderr, "%s\n", message.c_str());
  }
  std::fflush(stderr);
  if (mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

namespace detail {

bool mpi_started() { return world().mpi; }

void check(int status, const char* who, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) length = 0;
  throw Error(std::string(who) + ": " + call + " failed: " +
              (length > 0 ? std::string(text, static_cast<std::size_t>(length)) : "MPI error " + std::to_string(status)) +
              " (did another rank fail?)");
}

}  // namespace detail
}  // namespace loom::dist
