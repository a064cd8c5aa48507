// loom_bench's parts: one table filled by independent sections, and the machine bounds they
// share (the SGEMM peak and the memory bandwidth are measured in the same run, so every
// figure is a ratio to something measured under the same load).
#pragma once

#include <loom/dtype.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::bench {

struct Options {
  std::vector<std::string> sections;  // gemm, sincos, fused, train, host, infer
  std::vector<std::string> models;    // resnet20, resnet18, decoder
  std::vector<std::string> modes;     // captured, compiled, lazy, eager
  std::vector<std::string> precisions{"fp32"};  // fp32, bf16 (loom/autocast.h): training rows
  int64_t steps = 5;       // timed training steps per (model, mode)
  int64_t warmup = 2;      // untimed steps first (step 1 creates optimizer state: 2 graphs)
  int64_t host_steps = 3;  // steps with the device idle, for the host rows (the best counts)
  int64_t reps = 5;        // repetitions of each kernel measurement (the best is kept)
  int threads = 0;         // TBB threads (0: all cores)
  bool metrics = false;    // print loom::metrics::report() after the table
  std::string profile;     // Chrome trace of the timed training steps, when not empty
  Device device;           // where the train, host and infer sections run (--device)
  std::map<std::string, int64_t> batches;  // --batch: per-model training batch (decoder: sequences)

  bool has(const std::vector<std::string>& list, const std::string& item) const;
  bool section(const std::string& s) const { return has(sections, s); }
  bool on_cpu() const { return device.type == DeviceType::CPU; }
  // The training batch of `model`: --batch's value, else `fallback` (the CPU's default).
  int64_t batch(const std::string& model, int64_t fallback) const;
};

// One row of the table; empty cells print as "-".
struct Row {
  std::string section, benchmark, mode;
  std::string precision;  // fp32 or bf16, where the row depends on it
  std::string time;   // per step / per call / per node, with its unit
  std::string rate;   // images/s, tokens/s, GB/s, GFLOP/s, ns/node
  std::string gflops; // achieved GFLOP/s (the FLOP counts)
  std::string peak;   // GFLOP/s as a share of the hardware peak of the row's precision
  std::string ratio;  // this row's speed as a multiple of the reference in `vs`
  std::string vs;
  std::string idle;   // share of the timed window the device had no program to run
};

class Table {
 public:
  void add(Row row) { rows_.push_back(std::move(row)); }
  std::string str() const;

 private:
  std::vector<Row> rows_;
};

// Measured bounds; zero when the section that measures them did not run.
struct Bounds {
  double fma_gflops = 0;    // the hardware's float32 peak: an FMA-bound loop (hardware_peak.cpp);
                            // on another device, loom's matmul there (device_peak.cpp)
  double bf16_gflops = 0;   // bfloat16 dot products; the float32 peak on a CPU without them
  double sgemm_gflops = 0;  // the best large Eigen SGEMM on all threads
  double copy_bytes_s = 0;  // the best stream-like kernel, bytes moved per second
};

int thread_count();  // the TBB threads loom and the kernels here may use
double now_seconds();
std::string format(const char* fmt, double value);  // one printf conversion
std::string format_time(double seconds);             // "12.3 ms", "850 ns", ...
void progress(const std::string& line);              // to stderr, while the table is built
// How the device computes float32 matmuls and convolutions where that is a setting: on CUDA
// "TF32 on" or "TF32 off" (LOOM_CUDA_TF32=1, runtime/cuda/library_ops.cpp); "" elsewhere.
std::string device_precision_note(const Options& o);

// The hardware peak of `precision` ("fp32", "bf16"), or the SGEMM peak when the FMA loop did
// not run; 0 when neither did.
double peak_gflops(const Bounds& b, const std::string& precision);

// Sections. measure_hardware_peak and measure_sgemm_peak add their rows when the gemm section is
// selected. On a device other than the CPU, measure_device_peak takes their place: loom's
// matmul on that device in fp32 and bf16 is the denominator of the %peak cells.
void measure_hardware_peak(const Options& o, Bounds& b, Table& t);
void measure_device_peak(const Options& o, Bounds& b, Table& t);
void measure_sgemm_peak(const Options& o, Bounds& b, Table& t);
void bench_loom_matmul(const Options& o, const Bounds& b, Table& t);
void bench_sin_cos(const Options& o, Bounds& b, Table& t);
void bench_fused(const Options& o, Table& t);  // fused elementwise chains against the triad
void bench_training(const Options& o, const Bounds& b, Table& t);
void bench_inference(const Options& o, Table& t);

}  // namespace loom::bench
