# Finds what the CUDA backend needs (LOOM_CUDA: AUTO, ON, OFF) and sets LOOM_WITH_CUDA.
# The toolkit's libraries are linked dynamically: the CUDA runtime, cuBLASLt, NVRTC and cuDNN.
# None of them needs a GPU or a driver to load, so a build with the backend runs everywhere;
# without a GPU the "cuda" device has no devices and says why.
set(LOOM_WITH_CUDA OFF)
if(NOT LOOM_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  set(loom_cuda_missing "")
  if(NOT CUDAToolkit_FOUND)
    set(loom_cuda_missing "the CUDA toolkit (set CUDAToolkit_ROOT)")
  elseif(CUDAToolkit_VERSION_MAJOR LESS 12)
    set(loom_cuda_missing "CUDA 12 or later (found ${CUDAToolkit_VERSION})")
  elseif(NOT TARGET CUDA::nvrtc OR NOT TARGET CUDA::cublasLt)
    set(loom_cuda_missing "NVRTC and cuBLASLt")
  else()
    find_library(LOOM_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ENV CUDNN_ROOT
                 PATH_SUFFIXES lib lib64)
    find_path(LOOM_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDNN_ROOT
              PATH_SUFFIXES include)
    if(NOT LOOM_CUDNN_LIBRARY OR NOT LOOM_CUDNN_INCLUDE_DIR)
      set(loom_cuda_missing "cuDNN (libcudnn.so and cudnn.h; set CUDNN_ROOT)")
    endif()
  endif()
  if(loom_cuda_missing STREQUAL "")
    set(LOOM_WITH_CUDA ON)
    message(STATUS "loom: building the CUDA backend (CUDA ${CUDAToolkit_VERSION}, ${LOOM_CUDNN_LIBRARY})")
    # The GPU tests decide when they run; this says beforehand what they will find.
    if(NOT EXISTS "/proc/driver/nvidia/version")
      message(STATUS "loom: no NVIDIA driver is loaded on this machine (no /proc/driver/nvidia): "
                     "the GPU tests Cuda.Device, Cuda.OpHarness and Cuda.TrainingReference will be skipped")
    endif()
  elseif(LOOM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOOM_CUDA=ON but ${loom_cuda_missing} was not found")
  else()
    message(STATUS "loom: no CUDA backend: ${loom_cuda_missing} not found")
  endif()
endif()
