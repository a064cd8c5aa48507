// ResNets with torchvision's module layout, so named_parameters()/state_dict() keys equal
// the PyTorch ones (conv1.weight, bn1.running_mean, layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, fc.bias, ...).
//
//   loom::nn::manual_seed(0);
//   auto net = loom::models::resnet("resnet20", /*in_channels=*/3, /*num_classes=*/10);
//   auto logits = net->forward(images);              // images [N, 3, 32, 32] -> [N, 10]
//   auto loss = loom::nn::functional::cross_entropy(logits, labels);
//   loss.backward();
//
// Two layouts:
//  - ImageNet (resnet18/34/50/101/152): conv1 7x7 stride 2 padding 3, bn1, relu,
//    maxpool 3x3 stride 2 padding 1, layer1..layer4 (64/128/256/512 planes, stride 2 from
//    layer2 on), adaptive avgpool to 1x1, fc. Bottleneck puts the stride on its 3x3 conv
//    (torchvision's "ResNet v1.5").
//  - CIFAR (He et al. 2016, resnet20/32/44/56/110): conv1 3x3 stride 1 padding 1 with 16
//    channels, bn1, relu, layer1..layer3 of n = (depth - 2) / 6 BasicBlocks with 16/32/64
//    channels (stride 2 in layer2 and layer3), global avgpool, fc 64 -> classes. Shortcuts
//    that change shape are projections (option B): downsample.0 = 1x1 conv with the block's
//    stride and no bias, downsample.1 = BatchNorm2d, named as torchvision names them.
//
// Initialisation (both layouts) follows torchvision's ResNet.__init__: every Conv2d weight
// is re-drawn with kaiming_normal_(mode=fan_out, nonlinearity=relu), BatchNorm weight 1 and
// bias 0, fc keeps Linear's default. zero_init_residual is not applied (torchvision's
// default is false).
#pragma once

#include <loom/nn/layers.h>

#include <memory>
#include <string>
#include <vector>

namespace loom::models {

// conv3x3 -> bn -> relu -> conv3x3 -> bn, plus the shortcut, then relu.
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  // `downsample` (may be null) maps the input onto the output's shape for the shortcut.
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride = 1,
             std::shared_ptr<nn::Sequential> downsample = nullptr);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Sequential> downsample;
};

// conv1x1 -> bn -> relu -> conv3x3 (stride) -> bn -> relu -> conv1x1 (planes·4) -> bn,
// plus the shortcut, then relu.
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride = 1,
             std::shared_ptr<nn::Sequential> downsample = nullptr);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Sequential> downsample;
};

enum class BlockKind { Basic, Bottleneck };
enum class Stem { ImageNet, Cifar };

struct ResNetConfig {
  BlockKind block = BlockKind::Basic;
  std::vector<int64_t> layers{2, 2, 2, 2};         // blocks per stage (layer1, layer2, ...)
  std::vector<int64_t> widths{64, 128, 256, 512};  // planes per stage; stage i > 0 has stride 2
  Stem stem = Stem::ImageNet;                      // the stem's width is widths[0]
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
};

class ResNet : public nn::Module {
 public:
  // Throws loom::Error for an invalid config (empty or mismatched layers/widths,
  // non-positive sizes).
  explicit ResNet(const ResNetConfig& config);
  // [N, in_channels, H, W] -> logits [N, num_classes].
  Tensor forward(const Tensor& x) override;

  ResNetConfig config;
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::MaxPool2d> maxpool;  // null for the CIFAR stem
  std::vector<std::shared_ptr<nn::Sequential>> layers;  // layer1, layer2, ...
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;
};

// The names resnet() knows, in order: resnet18, resnet34, resnet50, resnet101, resnet152,
// resnet20, resnet32, resnet44, resnet56, resnet110.
std::vector<std::string> resnet_names();
// The config of a named model; throws loom::Error listing the valid names for an unknown one.
ResNetConfig resnet_config(const std::string& name, int64_t in_channels = 3, int64_t num_classes = 1000);
std::shared_ptr<ResNet> resnet(const std::string& name, int64_t in_channels = 3, int64_t num_classes = 1000);

}  // namespace loom::models
