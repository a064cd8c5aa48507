#include "runtime/cuda/cuda_check.h"

#include <loom/error.h>

namespace loom::runtime::cuda {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // a sticky error stays; a recoverable one is cleared for the next call
  throw Error(std::string(what) + ": " + cudaGetErrorString(status) + " (" +
              cudaGetErrorName(status) + ")");
}

void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string(what) + ": " + cublasLtGetStatusString(status));
}

void check(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw Error(std::string(what) + ": " + cudnnGetErrorString(status));
}

void check(nvrtcResult status, const char* what) {
  if (status == NVRTC_SUCCESS) return;
  throw Error(std::string(what) + ": " + nvrtcGetErrorString(status));
}

}  // namespace loom::runtime::cuda
