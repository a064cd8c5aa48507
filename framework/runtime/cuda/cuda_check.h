// Errors from the CUDA runtime, cuBLASLt, cuDNN and NVRTC as loom::Error, naming the call:
//
//   check(cudaMemcpyAsync(...), "cudaMemcpyAsync");   // throws "cudaMemcpyAsync: out of memory"
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nvrtc.h>

#include <string>

namespace loom::runtime::cuda {

void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
void check(cudnnStatus_t status, const char* what);
void check(nvrtcResult status, const char* what);

}  // namespace loom::runtime::cuda
