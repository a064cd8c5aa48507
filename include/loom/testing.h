// Test hooks into the engine. Not for production code.
//
//   {
//     loom::testing::DeviceQueueHold hold;  // the device thread runs nothing new
//     loom::mark_step();                    // returns: the program is only queued
//   }                                       // released: the program runs
#pragma once

#include <loom/dtype.h>

#include <memory>

namespace loom::testing {

// While it lives, the device's thread runs nothing queued after it was made.
class DeviceQueueHold {
 public:
  explicit DeviceQueueHold(Device device = {});
  ~DeviceQueueHold();
  DeviceQueueHold(const DeviceQueueHold&) = delete;
  DeviceQueueHold& operator=(const DeviceQueueHold&) = delete;

 private:
  std::shared_ptr<void> gate_;
};

// Number of programs queued on the device and not yet finished.
int pending_device_programs(Device device = {});

}  // namespace loom::testing
