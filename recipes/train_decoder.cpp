// train_decoder: trains a Llama-style decoder on byte-level tokens (an HDF5 file from
// prepare_data --text) and reports tokens/s, training and validation loss and bits per byte;
// --generate "prompt" samples text from a checkpoint instead. See --help.
#include "recipe_util.h"

#include <loom/autograd.h>
#include <loom/checkpoint.h>
#include <loom/data/hdf5.h>
#include <loom/data/loader.h>
#include <loom/debug.h>
#include <loom/dist.h>
#include <loom/lazy.h>
#include <loom/models/decoder.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/trainer.h>

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <numbers>
#include <random>

namespace {

using namespace loom;
namespace F = nn::functional;
namespace po = boost::program_options;

class DecoderTrainer : public Trainer {
 public:
  DecoderTrainer(std::shared_ptr<models::Decoder> net, std::shared_ptr<optim::Optimizer> opt, TrainerOptions o)
      : Trainer(net, std::move(opt), std::move(o)), net_(std::move(net)) {}

  Tensor train_step(const data::Batch& b) override { return loss(b); }

  // The sum over real windows of each window's mean token loss; evaluate() divides by the
  // number of real windows. Padded rows of the last batch are masked out.
  std::map<std::string, Tensor> eval_step(const data::Batch& b) override {
    auto logits = net_->forward(b["input"]);
    int64_t n = b.size(), t = logits.size(1), v = logits.size(-1);
    auto per_token = F::cross_entropy(reshape(logits, {-1, v}), reshape(b["target"], {-1}), 0, -100, F::Reduction::None);
    auto per_window = mean(reshape(per_token, {n, t}), {1});
    return {{"loss", sum(per_window * real_rows(b, per_window.dtype()))}};
  }

 private:
  Tensor loss(const data::Batch& b) {
    auto logits = net_->forward(b["input"]);
    int64_t v = logits.size(-1);
    return F::cross_entropy(reshape(logits, {-1, v}), reshape(b["target"], {-1}));
  }
  std::shared_ptr<models::Decoder> net_;
};

models::DecoderConfig config_of(const po::variables_map& vm) {
  models::DecoderConfig c;
  c.vocab_size = vm["vocab"].as<int64_t>();
  c.hidden_size = vm["hidden"].as<int64_t>();
  c.num_layers = vm["layers"].as<int64_t>();
  c.num_heads = vm["heads"].as<int64_t>();
  c.num_kv_heads = vm["kv-heads"].as<int64_t>();
  c.intermediate_size = vm["intermediate"].as<int64_t>();
  c.max_seq_len = vm["seq-len"].as<int64_t>();
  try {
    c.validate();
  } catch (const Error& e) {
    // The config's names are the options': say which options they are.
    throw Error(std::string(e.what()) + " (the options --vocab, --hidden, --layers, --heads, --kv-heads, "
                "--intermediate, --seq-len set vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, "
                "intermediate_size, max_seq_len)");
  }
  return c;
}

std::string model_name(const models::DecoderConfig& c) {
  return "decoder-v" + std::to_string(c.vocab_size) + "-h" + std::to_string(c.hidden_size) + "-l" +
         std::to_string(c.num_layers) + "-a" + std::to_string(c.num_heads) + "-kv" + std::to_string(c.num_kv_heads) +
         "-i" + std::to_string(c.intermediate_size) + "-t" + std::to_string(c.max_seq_len);
}

// Samples `count` bytes after `prompt`. The context is right-padded to the model's fixed
// length, so every step runs the same compiled graph (the causal mask keeps the padding out).
int generate(const std::shared_ptr<models::Decoder>& net, const std::string& prompt, int64_t count, double temperature,
             uint64_t seed) {
  NoGradGuard no_grad;
  net->eval();
  int64_t t_max = net->config.max_seq_len;
  std::vector<int64_t> text;
  for (unsigned char ch : prompt) text.push_back(ch);
  if (text.empty()) text.push_back('\n');
  std::mt19937_64 rng(seed);
  // Every step runs the same forward on a new window and picks the row of the last real
  // token by an index tensor (not a slice, whose bounds would be a new graph per position):
  // captured after two calls and replayed without tracing from then on (loom/compile.h).
  const int64_t vocab = net->config.vocab_size;
  auto next_logits = compile([&net, t_max, vocab](const Tensor& window, const Tensor& position) {
    return embedding(reshape(net->forward(window), {t_max, vocab}), position).reshape({vocab}).to(DType::Float64);
  });
  std::cout << prompt << std::flush;
  debug::ExpectedReads sampling;  // each token is read to pick the next: no warning about it
  for (int64_t i = 0; i < count; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(text.size()) - t_max);
    std::vector<int64_t> window(text.begin() + start, text.end());
    int64_t last = static_cast<int64_t>(window.size()) - 1;
    window.resize(t_max, 0);
    auto values = next_logits(from_vector(window, {1, t_max}), from_vector<int64_t>({last}, {1})).to_vector<double>();
    int64_t next = 0;
    if (temperature <= 0) {
      next = std::max_element(values.begin(), values.end()) - values.begin();
    } else {
      double m = *std::max_element(values.begin(), values.end());
      std::vector<double> p(values.size());
      for (std::size_t k = 0; k < p.size(); ++k) p[k] = std::exp((values[k] - m) / temperature);
      next = std::discrete_distribution<int64_t>(p.begin(), p.end())(rng);
    }
    text.push_back(next);
    std::cout << static_cast<char>(next) << std::flush;
  }
  std::cout << '\n';
  return 0;
}

int run(int argc, char** argv) {
  po::options_description o("train_decoder options");
  // clang-format off
  o.add_options()
    ("help,h", "show this help")
    ("data", po::value<std::string>()->default_value("data/fortunes.h5"),
     "HDF5 file with train/tokens and val/tokens (1-D byte-level tokens, from prepare_data --text)")
    ("vocab", po::value<int64_t>()->default_value(256), "vocabulary size (256 for bytes)")
    ("hidden", po::value<int64_t>()->default_value(256), "hidden size")
    ("layers", po::value<int64_t>()->default_value(4), "decoder layers")
    ("heads", po::value<int64_t>()->default_value(8), "attention heads")
    ("kv-heads", po::value<int64_t>()->default_value(4), "key/value heads (grouped-query attention)")
    ("intermediate", po::value<int64_t>()->default_value(704), "SwiGLU intermediate size")
    ("seq-len", po::value<int64_t>()->default_value(128), "tokens per training window")
    ("batch-size", po::value<int64_t>()->default_value(16), "windows per step and process (under mpirun the global batch is this times the processes)")
    ("steps", po::value<int64_t>()->default_value(2000), "training steps")
    ("lr", po::value<double>()->default_value(3e-3, "3e-3"), "peak AdamW learning rate")
    ("weight-decay", po::value<double>()->default_value(0.1, "0.1"), "AdamW weight decay")
    ("warmup", po::value<int64_t>()->default_value(100), "linear warm-up steps (cosine decay after)")
    ("clip", po::value<double>()->default_value(1.0, "1.0"), "gradient-norm clipping (0: off)")
    ("eval-windows", po::value<int64_t>()->default_value(256), "validation windows per evaluation")
    ("generate", po::value<std::string>(), "sample text after this prompt from --checkpoint instead of training")
    ("length", po::value<int64_t>()->default_value(300), "--generate: bytes to sample")
    ("temperature", po::value<double>()->default_value(0.8, "0.8"), "--generate: sampling temperature (0: greedy)");
  // clang-format on
  recipes::add_run_options(o, {.loader_threads = 1, .eval_every = 500, .checkpoint_every = 500});
  po::variables_map vm;
  if (!recipes::parse_options(argc, argv, o, vm,
                              "usage: train_decoder [options]\n       train_decoder --checkpoint FILE --generate \"prompt\" [options]\n\n"
                              "Trains a Llama-style decoder on byte-level text, or samples from a trained one."))
    return 0;
  for (const char* k : {"batch-size", "steps", "seq-len", "eval-windows"})
    recipes::require_positive(k, static_cast<double>(vm[k].as<int64_t>()));
  recipes::require_positive("lr", vm["lr"].as<double>());
  recipes::require_positive("weight-decay", vm["weight-decay"].as<double>(), true);
  recipes::require_positive("clip", vm["clip"].as<double>(), true);
  recipes::require_positive("warmup", static_cast<double>(vm["warmup"].as<int64_t>()), true);
  recipes::require_positive("length", static_cast<double>(vm["length"].as<int64_t>()), true);
  recipes::require_positive("temperature", vm["temperature"].as<double>(), true);
  TrainerOptions to = recipes::run_options(vm, argc, argv);
  const Device device = recipes::run_device(vm);
  auto cfg = config_of(vm);
  auto seed = vm["seed"].as<int64_t>();
  nn::manual_seed(static_cast<uint64_t>(seed));
  auto net = std::make_shared<models::Decoder>(cfg);
  net->to(device);  // initialised on the host (the same values on every device), trained here

  if (vm.count("generate")) {
    auto path = vm["checkpoint"].as<std::string>();
    if (path.empty()) throw Error("--generate: needs --checkpoint FILE of a trained model");
    auto ck = load_checkpoint(path);
    if (ck.model_name != model_name(cfg))
      throw Error("--generate: checkpoint '" + path + "' holds " + ck.model_name + ", the options describe " +
                  model_name(cfg) + " (pass the same model options as for training)");
    net->load_state_dict(ck.model);
    return generate(net, vm["generate"].as<std::string>(), vm["length"].as<int64_t>(), vm["temperature"].as<double>(),
                    static_cast<uint64_t>(seed));
  }

  int64_t seq = cfg.max_seq_len, batch = vm["batch-size"].as<int64_t>();
  int64_t world = dist::world_size();
  // An epoch is a fixed number of random windows, whatever --steps says, so that a run resumed
  // with a larger --steps continues where it stopped (its epochs are the first run's).
  constexpr int64_t kWindowsPerEpoch = int64_t{1} << 18;
  if (batch > kWindowsPerEpoch / world)
    throw Error("--batch-size: at most " + std::to_string(kWindowsPerEpoch / world) + " windows per step and process");
  const int64_t windows = kWindowsPerEpoch / (batch * world) * batch * world;
  std::shared_ptr<data::Dataset> train_set, val_set;
  if (vm["synthetic"].as<bool>()) {
    std::map<std::string, data::FieldSpec> f{
        {"input", {data::HostDType::Int64, {seq}, 0, static_cast<double>(cfg.vocab_size)}},
        {"target", {data::HostDType::Int64, {seq}, 0, static_cast<double>(cfg.vocab_size)}}};
    train_set = std::make_shared<data::SyntheticDataset>(windows, f, seed);
    val_set = std::make_shared<data::SyntheticDataset>(vm["eval-windows"].as<int64_t>(), f, seed + 1);
  } else {
    auto path = vm["data"].as<std::string>();
    to.inputs = {path};  // no checkpoint or profile may overwrite it
    if (!std::filesystem::exists(path))
      throw Error("--data: no such file '" + path + "'; create it with: prepare_data --text /usr/share/games/fortunes --output " + path);
    auto train_tokens = data::read_hdf5(path, "train/tokens");
    auto val_tokens = data::read_hdf5(path, "val/tokens");
    if (train_tokens.shape.size() != 1 || val_tokens.shape.size() != 1)
      throw Error("--data: '" + path + "' train/tokens and val/tokens must be 1-D");
    spdlog::info("{}: {} training and {} validation tokens", path, train_tokens.numel(), val_tokens.numel());
    // Every token of both splits is checked against --vocab here, before any training step.
    const data::ValueRange vocab{0, cfg.vocab_size, "a token (--vocab)"};
    train_set = std::make_shared<data::TokenWindowDataset>(
        std::move(train_tokens), seq,
        data::TokenWindowOptions{.windows = windows, .random = true,
                                 .seed = static_cast<uint64_t>(seed), .range = vocab},
        path + " train/tokens");
    int64_t fit = (val_tokens.numel() - 1) / seq;
    val_set = std::make_shared<data::TokenWindowDataset>(
        std::move(val_tokens), seq,
        data::TokenWindowOptions{.windows = std::min(fit, vm["eval-windows"].as<int64_t>()), .random = false,
                                 .range = vocab},
        path + " val/tokens");
  }
  // Under mpirun each process takes every world-th training window and its part of the
  // validation windows; the Trainer adds the validation parts up.
  data::DeviceLoader train_loader(train_set, {.batch_size = batch, .shuffle = false, .seed = static_cast<uint64_t>(seed),
                                              .threads = vm["loader-threads"].as<int>(), .prefetch = vm["prefetch"].as<int>(),
                                              .rank = dist::rank(), .world_size = world, .device = device});
  // At most the validation windows (this process's part of them): a last batch is padded to the full size.
  const int64_t val_batch = std::min(batch, std::max<int64_t>(1, (val_set->size() + world - 1) / world));
  data::DeviceLoader val_loader(val_set, {.batch_size = val_batch, .last_batch = data::LastBatch::Pad,
                                          .threads = vm["loader-threads"].as<int>(), .prefetch = vm["prefetch"].as<int>(),
                                          .device = device, .sampler = recipes::eval_shard(val_set->size())});

  auto opt = std::make_shared<optim::AdamW>(net->parameters(),
                                            optim::AdamOptions{.lr = vm["lr"].as<double>(), .beta1 = 0.9, .beta2 = 0.95,
                                                               .weight_decay = vm["weight-decay"].as<double>()});
  const int64_t steps = vm["steps"].as<int64_t>(), per_epoch = train_loader.batches_per_epoch();
  to.epochs = steps / per_epoch + (steps % per_epoch != 0);
  to.max_steps = steps;
  to.clip_grad_norm = vm["clip"].as<double>();
  to.model_name = model_name(cfg);
  to.unit = "tokens";
  to.units_per_sample = seq;
  DecoderTrainer trainer(net, opt, to);
  trainer.set_schedule(recipes::make_schedule("cosine", *opt, vm["lr"].as<double>(), vm["warmup"].as<int64_t>(), steps));
  spdlog::info("{}: {} parameters, {} steps of {}x{} tokens, mode {}, precision {}, on {}", model_name(cfg), net->num_parameters(), steps,
               batch * world, seq, vm["mode"].as<std::string>(), vm["precision"].as<std::string>(), device_str(device));
  if (world > 1) spdlog::info("data-parallel over {} processes: {} windows per process and step", world, batch);
  trainer.fit(train_loader, &val_loader);
  if (trainer.interrupted()) return 130;
  auto losses = trainer.losses();
  double val = trainer.last_eval().count("loss") ? trainer.last_eval().at("loss") : NAN;
  if (losses.empty()) {  // a resume of a finished run: it only evaluated
    spdlog::info("validation loss {:.4f} = {:.3f} bits per byte", val, val / std::numbers::ln2);
    return 0;
  }
  int64_t tail = std::min<int64_t>(50, static_cast<int64_t>(losses.size()));
  double train_loss = 0;
  for (int64_t i = static_cast<int64_t>(losses.size()) - tail; i < static_cast<int64_t>(losses.size()); ++i) train_loss += losses[i];
  train_loss /= std::max<int64_t>(tail, 1);
  train_loss = dist::all_reduce(train_loss, dist::ReduceOp::Mean);  // each rank saw its own windows
  spdlog::info("training loss {:.4f} (last {} steps), validation loss {:.4f} = {:.3f} bits per byte", train_loss, tail,
               val, val / std::numbers::ln2);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return loom::recipes::run_main("train_decoder", run, argc, argv); }
