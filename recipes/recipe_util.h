// Shared by the recipe binaries: option parsing conventions, logging set-up and the
// one-line error exit.
#pragma once

#include <loom/data/sampler.h>
#include <loom/error.h>
#include <loom/optim.h>
#include <loom/trainer.h>

#include <boost/program_options.hpp>

#include <memory>
#include <string>

namespace loom::recipes {

namespace po = boost::program_options;

// Parses argv; prints --help (with every option documented) and returns false when asked.
// Throws loom::Error with the option's name for a malformed or unknown option.
bool parse_options(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                   const std::string& usage);

// Defaults that differ between recipes.
struct RunDefaults {
  int loader_threads = 2;
  int64_t eval_every = 0;
  int64_t checkpoint_every = 0;
};

// The options every training recipe shares: --device, --mode, --threads, --loader-threads,
// --prefetch, --eval-every, --log-every, --checkpoint, --checkpoint-every, --resume, --seed,
// --synthetic, --profile.
void add_run_options(po::options_description& options, RunDefaults defaults);
// Validates them (throws loom::Error naming the option), applies --threads and fills the
// Trainer's options from them.
TrainerOptions run_options(const po::variables_map& vm, int argc, char** argv);

// --device, checked: the device is started here, so a missing one (no GPU, no driver) is an
// error naming why before any data is read. Throws loom::Error starting "--device: ".
Device run_device(const po::variables_map& vm);

// The command line as one string (stored in checkpoints).
std::string command_line(int argc, char** argv);

// Checks that `value` is finite and > 0 (or >= 0 when allow_zero), naming the option in the
// error: "--lr: expected a finite value, got nan".
void require_positive(const char* option, double value, bool allow_zero = false);
// Checks low <= value < high (so NaN fails), naming the option in the error.
void require_range(const char* option, double value, double low, double high);

// Limits loom's intra-op parallelism to `threads` (0: all cores) for the program's lifetime.
void set_threads(int threads);

// LR schedule by name: "cosine" (with linear warm-up), "step" (x0.1 after each third), "constant"
// (with linear warm-up).
std::shared_ptr<optim::Schedule> make_schedule(const std::string& name, optim::Optimizer& opt, double lr,
                                               int64_t warmup, int64_t total_steps);

// Evaluation sampler for data-parallel runs: rank r of W reads samples r, r+W, r+2W, ... of
// n, so the ranks cover the set exactly once (DistributedSampler pads the ranks to equal
// sizes, which would count samples twice). nullptr (the loader's sequential default) for one
// process.
std::shared_ptr<const data::Sampler> eval_shard(int64_t n);

// Starts loom::dist (data-parallel under mpirun; ranks other than 0 then log warnings and
// errors only) and runs `body`, turning any exception into one "error: ..." line and exit
// code 1. Under mpirun that line names the rank and the whole job ends (MPI_Abort): the other
// ranks would otherwise wait for this one for ever.
int run_main(const char* program, int (*body)(int, char**), int argc, char** argv);

}  // namespace loom::recipes
