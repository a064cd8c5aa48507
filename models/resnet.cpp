#include <loom/models/resnet.h>

#include <loom/autocast.h>
#include <loom/error.h>
#include <loom/nn/init.h>

#include <string>
#include <utility>

namespace loom::models {
namespace {

using nn::Conv2dOptions;

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

std::shared_ptr<nn::Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

template <class Block>
std::shared_ptr<nn::Sequential> make_layer(int64_t& inplanes, int64_t planes, int64_t blocks, int64_t stride) {
  auto layer = std::make_shared<nn::Sequential>();
  std::shared_ptr<nn::Sequential> downsample;
  if (stride != 1 || inplanes != planes * Block::kExpansion) {
    downsample = std::make_shared<nn::Sequential>();
    downsample->push_back(conv1x1(inplanes, planes * Block::kExpansion, stride));
    downsample->push_back(std::make_shared<nn::BatchNorm2d>(planes * Block::kExpansion));
  }
  layer->push_back(std::make_shared<Block>(inplanes, planes, stride, downsample));
  inplanes = planes * Block::kExpansion;
  for (int64_t i = 1; i < blocks; ++i) layer->push_back(std::make_shared<Block>(inplanes, planes));
  return layer;
}

void check_config(const ResNetConfig& c) {
  if (c.layers.empty() || c.layers.size() != c.widths.size())
    throw Error("ResNet: expected one width per stage and at least one stage, got " +
                std::to_string(c.layers.size()) + " stages and " + std::to_string(c.widths.size()) + " widths");
  for (std::size_t i = 0; i < c.layers.size(); ++i)
    if (c.layers[i] <= 0 || c.widths[i] <= 0)
      throw Error("ResNet: expected positive blocks and widths, got stage " + std::to_string(i + 1) +
                  " with " + std::to_string(c.layers[i]) + " blocks of width " + std::to_string(c.widths[i]));
  if (c.in_channels <= 0 || c.num_classes <= 0)
    throw Error("ResNet: expected in_channels > 0 and num_classes > 0, got " + std::to_string(c.in_channels) +
                " and " + std::to_string(c.num_classes));
}

struct Named {
  const char* name;
  ResNetConfig config;
};

std::vector<Named> known_models() {
  const std::vector<int64_t> imagenet{64, 128, 256, 512}, cifar{16, 32, 64};
  auto imagenet_cfg = [&](BlockKind b, std::vector<int64_t> layers) {
    return ResNetConfig{b, std::move(layers), imagenet, Stem::ImageNet, 3, 1000};
  };
  auto cifar_cfg = [&](int64_t depth) {
    int64_t n = (depth - 2) / 6;
    return ResNetConfig{BlockKind::Basic, {n, n, n}, cifar, Stem::Cifar, 3, 10};
  };
  return {
      {"resnet18", imagenet_cfg(BlockKind::Basic, {2, 2, 2, 2})},
      {"resnet34", imagenet_cfg(BlockKind::Basic, {3, 4, 6, 3})},
      {"resnet50", imagenet_cfg(BlockKind::Bottleneck, {3, 4, 6, 3})},
      {"resnet101", imagenet_cfg(BlockKind::Bottleneck, {3, 4, 23, 3})},
      {"resnet152", imagenet_cfg(BlockKind::Bottleneck, {3, 8, 36, 3})},
      {"resnet20", cifar_cfg(20)},
      {"resnet32", cifar_cfg(32)},
      {"resnet44", cifar_cfg(44)},
      {"resnet56", cifar_cfg(56)},
      {"resnet110", cifar_cfg(110)},
  };
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride,
                       std::shared_ptr<nn::Sequential> down) {
  // Registration order is torchvision's, so state_dict() lists keys in its order.
  conv1 = register_module("conv1", conv3x3(inplanes, planes, stride));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  if (down) downsample = register_module("downsample", std::move(down));
}

Tensor BasicBlock::forward(const Tensor& x) {
  auto out = relu(bn1->forward(conv1->forward(x)));
  out = bn2->forward(conv2->forward(out));
  auto identity = downsample ? downsample->forward(x) : x;
  // Stored in bfloat16 under autocast (loom/autocast.h), rounded before the relu, so the
  // backward pass's mask reads the stored sum; the relu commutes with the rounding.
  return relu(autocast_round(out + identity));
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride,
                       std::shared_ptr<nn::Sequential> down) {
  conv1 = register_module("conv1", conv1x1(inplanes, planes));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, stride));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  conv3 = register_module("conv3", conv1x1(planes, planes * kExpansion));
  bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(planes * kExpansion));
  if (down) downsample = register_module("downsample", std::move(down));
}

Tensor Bottleneck::forward(const Tensor& x) {
  auto out = relu(bn1->forward(conv1->forward(x)));
  out = relu(bn2->forward(conv2->forward(out)));
  out = bn3->forward(conv3->forward(out));
  auto identity = downsample ? downsample->forward(x) : x;
  return relu(autocast_round(out + identity));  // as in BasicBlock
}

ResNet::ResNet(const ResNetConfig& c) : config(c) {
  check_config(c);
  int64_t inplanes = c.widths[0];
  if (c.stem == Stem::ImageNet) {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(
                                         Conv2dOptions(c.in_channels, inplanes, 7).stride(2).padding(3).bias(false)));
  } else {
    conv1 = register_module("conv1", conv3x3(c.in_channels, inplanes));
  }
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(inplanes));
  relu = register_module("relu", std::make_shared<nn::ReLU>());
  if (c.stem == Stem::ImageNet) maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2d>(3, 2, 1));
  for (std::size_t i = 0; i < c.layers.size(); ++i) {
    int64_t stride = i == 0 ? 1 : 2;
    auto layer = c.block == BlockKind::Basic
                     ? make_layer<BasicBlock>(inplanes, c.widths[i], c.layers[i], stride)
                     : make_layer<Bottleneck>(inplanes, c.widths[i], c.layers[i], stride);
    layers.push_back(register_module("layer" + std::to_string(i + 1), layer));
  }
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<nn::Linear>(inplanes, c.num_classes));

  // torchvision's ResNet.__init__ re-initialises every conv (and sets BN to 1/0, which
  // BatchNorm2d already does).
  for (auto& [name, m] : named_modules())
    if (auto conv = std::dynamic_pointer_cast<nn::Conv2d>(m))
      nn::init::kaiming_normal_(conv->weight, 0, nn::init::FanMode::FanOut, nn::init::Nonlinearity::ReLU);
}

Tensor ResNet::forward(const Tensor& x) {
  if (!x.defined()) throw Error("ResNet: expected a defined input, got an empty handle");
  if (x.dim() != 4 || x.size(1) != config.in_channels)
    throw Error("ResNet: expected an input [N," + std::to_string(config.in_channels) + ",H,W], got " +
                shape_str(x.shape()));
  auto h = relu->forward(autocast_round(bn1->forward(conv1->forward(x))));
  if (maxpool) h = maxpool->forward(h);
  for (auto& layer : layers) h = layer->forward(h);
  h = flatten(avgpool->forward(h), 1);
  return fc->forward(h);
}

std::vector<std::string> resnet_names() {
  std::vector<std::string> names;
  for (const auto& m : known_models()) names.emplace_back(m.name);
  return names;
}

ResNetConfig resnet_config(const std::string& name, int64_t in_channels, int64_t num_classes) {
  for (auto& m : known_models()) {
    if (name != m.name) continue;
    ResNetConfig c = m.config;
    c.in_channels = in_channels;
    c.num_classes = num_classes;
    return c;
  }
  std::string valid;
  for (const auto& n : resnet_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw Error("resnet: unknown model '" + name + "', expected one of " + valid);
}

std::shared_ptr<ResNet> resnet(const std::string& name, int64_t in_channels, int64_t num_classes) {
  return std::make_shared<ResNet>(resnet_config(name, in_channels, num_classes));
}

}  // namespace loom::models
