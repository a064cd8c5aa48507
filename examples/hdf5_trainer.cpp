// hdf5_trainer: a loom::Trainer subclass over an HDF5 file. The program first writes the file
// (points in [-1, 1]², labelled by their quadrant: train/x float32 [N,2], train/y int64 [N],
// the same under test/), then trains a small MLP on it with fit() and evaluates it after each
// epoch. Exits 1 unless the test accuracy ends above 90%.
//
//   ./hdf5_trainer [file]        (default quadrants.h5 in the current directory)
#include <loom/loom.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace data = loom::data;
namespace nn = loom::nn;
namespace F = loom::nn::functional;

namespace {

// n points and their quadrant (0..3), deterministic per seed.
void write_split(data::HDF5Writer& out, const std::string& split, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> coord(-1.0f, 1.0f);
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    const float a = coord(gen), b = coord(gen);
    x.push_back(a);
    x.push_back(b);
    y.push_back((a < 0 ? 1 : 0) + (b < 0 ? 2 : 0));
  }
  out.write(split + "/x", data::HostArray::from_vector<float>(x, {n, 2}));
  out.write(split + "/y", data::HostArray::from_vector<int64_t>(y, {n}));
}

class QuadrantTrainer : public loom::Trainer {
 public:
  QuadrantTrainer(std::shared_ptr<nn::Sequential> net, loom::TrainerOptions options)
      : loom::Trainer(net,
                      std::make_shared<loom::optim::SGD>(net->parameters(),
                                                         loom::optim::SGDOptions{.lr = 0.1, .momentum = 0.9}),
                      std::move(options)),
        net_(std::move(net)) {}

 protected:
  loom::Tensor train_step(const data::Batch& b) override {
    return F::cross_entropy(net_->forward(b["input"]), b["target"]);
  }
  std::map<std::string, loom::Tensor> eval_step(const data::Batch& b) override {
    auto logits = net_->forward(b["input"]);
    auto real = real_rows(b, loom::DType::Float32);  // the last batch's padding does not count
    auto hit = loom::eq(loom::argmax(logits, 1), b["target"]).to(loom::DType::Float32);
    return {{"accuracy", loom::sum(hit * real)}};
  }

 private:
  std::shared_ptr<nn::Sequential> net_;
};

}  // namespace

int main(int argc, char** argv) try {
  const std::string file = argc > 1 ? argv[1] : "quadrants.h5";
  {
    data::HDF5Writer out(file);
    write_split(out, "train", 1024, 1);
    write_split(out, "test", 256, 2);
    out.close();
  }

  auto fields = [](const std::string& split) {
    return data::HDF5Fields{{split + "/x", "input"}, {split + "/y", "target"}};
  };
  auto train = std::make_shared<data::HDF5Dataset>(file, fields("train"),
                                                   data::HDF5DatasetOptions{.ranges = {{"target", {0, 4, "a quadrant"}}}});
  auto test = std::make_shared<data::HDF5Dataset>(file, fields("test"));
  data::DeviceLoader train_loader(train, {.batch_size = 32, .shuffle = true, .seed = 1, .threads = 1});
  data::DeviceLoader test_loader(test, {.batch_size = 64, .last_batch = data::LastBatch::Pad, .threads = 1});

  nn::manual_seed(0);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(2, 32));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(32, 4));

  QuadrantTrainer trainer(net, {.epochs = 4, .log_every = 32, .model_name = "quadrants"});
  trainer.fit(train_loader, &test_loader);

  const auto losses = trainer.losses();
  const double accuracy = trainer.last_eval().at("accuracy");
  std::cout << "hdf5_trainer: " << trainer.step() << " steps, loss " << losses.front() << " -> "
            << losses.back() << ", test accuracy " << accuracy << '\n';
  if (!(accuracy > 0.9) || !(losses.back() < losses.front())) {
    std::cerr << "hdf5_trainer: expected a falling loss and a test accuracy above 0.9\n";
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "hdf5_trainer: error: " << e.what() << '\n';
  return 1;
}
