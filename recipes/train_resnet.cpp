// train_resnet: trains a ResNet on an image HDF5 file (Fashion-MNIST by default, as written
// by prepare_data) and reports test accuracy. See --help for every option.
#include "recipe_util.h"

#include <loom/autograd.h>
#include <loom/data/hdf5.h>
#include <loom/data/loader.h>
#include <loom/dist.h>
#include <loom/lazy.h>
#include <loom/models/resnet.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/trainer.h>

#include <spdlog/spdlog.h>

#include <array>
#include <filesystem>
#include <limits>

namespace {

using namespace loom;
namespace F = nn::functional;
namespace po = boost::program_options;

class ResNetTrainer : public Trainer {
 public:
  ResNetTrainer(std::shared_ptr<models::ResNet> net, std::shared_ptr<optim::Optimizer> opt, TrainerOptions o,
                double label_smoothing)
      : Trainer(net, std::move(opt), std::move(o)), net_(std::move(net)), label_smoothing_(label_smoothing) {}

  Tensor train_step(const data::Batch& b) override {
    return F::cross_entropy(net_->forward(b["input"]), b["target"], label_smoothing_);
  }

  // Sums over the batch's real rows (the padded tail of the last batch is masked out).
  std::map<std::string, Tensor> eval_step(const data::Batch& b) override {
    auto logits = net_->forward(b["input"]);
    auto real = real_rows(b, logits.dtype());
    auto correct = eq(argmax(logits, 1), b["target"]).to(logits.dtype());
    auto losses = F::cross_entropy(logits, b["target"], 0, -100, F::Reduction::None);
    return {{"accuracy", sum(correct * real)}, {"loss", sum(losses * real)}};
  }

 private:
  std::shared_ptr<models::ResNet> net_;
  double label_smoothing_;
};

int train(int argc, char** argv) {
  po::options_description o("train_resnet options");
  // clang-format off
  o.add_options()
    ("help,h", "show this help")
    ("data", po::value<std::string>()->default_value("data/fashion_mnist.h5"),
     "HDF5 file with train/images (uint8 [N,C,H,W]), train/labels (int64 [N]) and test/... (from prepare_data)")
    ("model", po::value<std::string>()->default_value("resnet20"), "resnet20, resnet32, resnet44, resnet56, resnet110 (CIFAR layout) or resnet18, resnet34, resnet50, ... (ImageNet layout)")
    ("epochs", po::value<int64_t>()->default_value(5), "passes over the training set")
    ("max-steps", po::value<int64_t>()->default_value(0), "stop after this many steps (0: no limit)")
    ("batch-size", po::value<int64_t>()->default_value(128), "images per step and process (under mpirun the global batch is this times the processes)")
    ("lr", po::value<double>()->default_value(0.1, "0.1"), "peak learning rate")
    ("momentum", po::value<double>()->default_value(0.9, "0.9"), "SGD momentum")
    ("weight-decay", po::value<double>()->default_value(5e-4, "5e-4"), "SGD weight decay")
    ("label-smoothing", po::value<double>()->default_value(0.0, "0"), "cross-entropy label smoothing")
    ("schedule", po::value<std::string>()->default_value("cosine"), "learning-rate schedule: cosine (to 0 at the last step), step (x0.1 at each third of the steps) or constant, each after --warmup")
    ("warmup", po::value<int64_t>()->default_value(200), "linear warm-up steps (for every --schedule)")
    ("augment", po::value<bool>()->default_value(true), "random crop (padding 2) and horizontal flip of training images")
    ("eval-batch-size", po::value<int64_t>()->default_value(500), "test images per evaluation batch (at most the test set)");
  // clang-format on
  recipes::add_run_options(o, {.loader_threads = 2, .eval_every = 0, .checkpoint_every = 0});
  po::variables_map vm;
  if (!recipes::parse_options(argc, argv, o, vm, "usage: train_resnet [options]\n\nTrains a ResNet and reports test accuracy."))
    return 0;

  auto batch_size = vm["batch-size"].as<int64_t>();
  recipes::require_positive("batch-size", static_cast<double>(batch_size));
  recipes::require_positive("epochs", static_cast<double>(vm["epochs"].as<int64_t>()));
  recipes::require_positive("max-steps", static_cast<double>(vm["max-steps"].as<int64_t>()), true);
  recipes::require_positive("lr", vm["lr"].as<double>());
  recipes::require_positive("momentum", vm["momentum"].as<double>(), true);
  recipes::require_positive("weight-decay", vm["weight-decay"].as<double>(), true);
  recipes::require_range("label-smoothing", vm["label-smoothing"].as<double>(), 0, 1);
  recipes::require_positive("warmup", static_cast<double>(vm["warmup"].as<int64_t>()), true);
  recipes::require_positive("eval-batch-size", static_cast<double>(vm["eval-batch-size"].as<int64_t>()));
  TrainerOptions to = recipes::run_options(vm, argc, argv);
  const Device device = recipes::run_device(vm);
  auto model_name = vm["model"].as<std::string>();
  models::resnet_config(model_name);  // an unknown name fails here, before the data is opened
  auto seed = vm["seed"].as<int64_t>();
  bool synthetic = vm["synthetic"].as<bool>();

  std::shared_ptr<data::Dataset> train_set, test_set;
  int64_t channels = 1, classes = 10;
  std::array<int64_t, 2> image{28, 28};  // the training crops' size: the images' own
  std::vector<double> mean{0.2860}, stddev{0.3530};  // Fashion-MNIST
  if (synthetic) {
    std::map<std::string, data::FieldSpec> f{{"input", {data::HostDType::UInt8, {1, 28, 28}, 0, 256}},
                                             {"target", {data::HostDType::Int64, {}, 0, 10}}};
    train_set = std::make_shared<data::SyntheticDataset>(60000, f, seed);
    test_set = std::make_shared<data::SyntheticDataset>(1000, f, seed + 1);
  } else {
    auto path = vm["data"].as<std::string>();
    to.inputs = {path};  // no checkpoint or profile may overwrite it
    if (!std::filesystem::exists(path))
      throw Error("--data: no such file '" + path + "'; create it with: prepare_data --fashion-mnist --output " + path);
    // Both splits' labels are read and checked here, before any training step.
    const data::HDF5DatasetOptions labels{.ranges = {{"target", {0, classes, "a class"}}}};
    auto train_h5 = std::make_shared<data::HDF5Dataset>(
        path, data::HDF5Fields{{"train/images", "input"}, {"train/labels", "target"}}, labels);
    auto test_h5 = std::make_shared<data::HDF5Dataset>(
        path, data::HDF5Fields{{"test/images", "input"}, {"test/labels", "target"}}, labels);
    for (const auto& [h5, split] : {std::pair{train_h5.get(), "train"}, std::pair{test_h5.get(), "test"}})
      if (auto s = h5->sample_shape("target"); !s.empty())
        throw Error("--data: '" + path + "' " + split + "/labels must be [N] class indices, got samples of " +
                    shape_str(s));
    test_set = test_h5;
    auto shape = train_h5->sample_shape("input");
    if (shape.size() != 3) throw Error("--data: '" + path + "' train/images must be [N,C,H,W], got samples of " + shape_str(shape));
    if (auto test_shape = test_h5->sample_shape("input"); test_shape != shape)
      throw Error("--data: '" + path + "' test/images hold samples of " + shape_str(test_shape) +
                  ", train/images of " + shape_str(shape) + "; both splits need one image shape");
    channels = shape[0];
    image = {shape[1], shape[2]};
    if (channels != 1) {
      mean.assign(channels, 0.5);
      stddev.assign(channels, 0.25);
    }
    train_set = train_h5;
  }

  std::vector<data::Transform> train_tf{data::to_float(), data::normalize(mean, stddev)};
  if (vm["augment"].as<bool>()) {
    train_tf.push_back(data::random_crop(image, 2));
    train_tf.push_back(data::random_horizontal_flip());
  }
  // Under mpirun each process trains on its shard of every epoch and evaluates its part of
  // the test set; the Trainer adds the parts up.
  data::DeviceLoader train_loader(train_set,
                                  {.batch_size = batch_size, .shuffle = true, .seed = static_cast<uint64_t>(seed),
                                   .last_batch = data::LastBatch::Drop, .threads = vm["loader-threads"].as<int>(),
                                   .prefetch = vm["prefetch"].as<int>(), .rank = dist::rank(),
                                   .world_size = dist::world_size(), .device = device},
                                  train_tf);
  // At most the test set (this process's part of it): a last batch is padded to the full size.
  const int64_t eval_batch = std::min(vm["eval-batch-size"].as<int64_t>(),
                                      std::max<int64_t>(1, (test_set->size() + dist::world_size() - 1) / dist::world_size()));
  data::DeviceLoader test_loader(test_set,
                                 {.batch_size = eval_batch, .last_batch = data::LastBatch::Pad,
                                  .threads = vm["loader-threads"].as<int>(), .prefetch = vm["prefetch"].as<int>(),
                                  .device = device, .sampler = recipes::eval_shard(test_set->size())},
                                 {data::to_float(), data::normalize(mean, stddev)});

  nn::manual_seed(static_cast<uint64_t>(seed));
  auto net = models::resnet(model_name, channels, classes);
  net->to(device);  // initialised on the host (the same values on every device), trained here
  auto opt = std::make_shared<optim::SGD>(
      net->parameters(), optim::SGDOptions{.lr = vm["lr"].as<double>(), .momentum = vm["momentum"].as<double>(),
                                           .weight_decay = vm["weight-decay"].as<double>()});
  if (vm["epochs"].as<int64_t>() > std::numeric_limits<int64_t>::max() / train_loader.batches_per_epoch())
    throw Error("--epochs: " + std::to_string(vm["epochs"].as<int64_t>()) + " epochs of " +
                std::to_string(train_loader.batches_per_epoch()) + " steps are more steps than an int64 counts");
  int64_t steps = vm["epochs"].as<int64_t>() * train_loader.batches_per_epoch();
  if (vm["max-steps"].as<int64_t>() > 0) steps = std::min(steps, vm["max-steps"].as<int64_t>());

  to.epochs = vm["epochs"].as<int64_t>();
  to.max_steps = vm["max-steps"].as<int64_t>();
  to.model_name = model_name;
  to.unit = "images";
  ResNetTrainer trainer(net, opt, to, vm["label-smoothing"].as<double>());
  trainer.set_schedule(recipes::make_schedule(vm["schedule"].as<std::string>(), *opt, vm["lr"].as<double>(),
                                              vm["warmup"].as<int64_t>(), steps));
  spdlog::info("{}: {} parameters, {} steps of {} images ({} per epoch), mode {}, precision {}, on {}", model_name, net->num_parameters(),
               steps, batch_size * dist::world_size(), train_loader.batches_per_epoch(), vm["mode"].as<std::string>(), vm["precision"].as<std::string>(),
               device_str(device));
  if (dist::is_distributed())
    spdlog::info("data-parallel over {} processes: {} images per process and step", dist::world_size(), batch_size);
  trainer.fit(train_loader, &test_loader);
  if (trainer.interrupted()) return 130;
  const auto& ev = trainer.last_eval();
  if (ev.count("accuracy"))
    spdlog::info("test accuracy {:.2f}%  (test loss {:.4f})", 100 * ev.at("accuracy"), ev.at("loss"));
  spdlog::info("training loader: {} batches, the step waited {:.1f}s for data in all", train_loader.stats().batches,
               train_loader.stats().wait_seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return loom::recipes::run_main("train_resnet", train, argc, argv); }
