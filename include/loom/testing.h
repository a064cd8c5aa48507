// Test hooks into the engine. Not for production code.
//
//   {
//     loom::testing::DeviceQueueHold hold;  // the device thread takes no new work
//     loom::mark_step();                    // returns: the program is only queued
//   }                                       // released: the program runs
#pragma once

namespace loom::testing {

class DeviceQueueHold {
 public:
  DeviceQueueHold();
  ~DeviceQueueHold();
  DeviceQueueHold(const DeviceQueueHold&) = delete;
  DeviceQueueHold& operator=(const DeviceQueueHold&) = delete;
};

// Number of programs queued on the device and not yet finished.
int pending_device_programs();

}  // namespace loom::testing
