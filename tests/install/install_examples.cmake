# Run by ctest (tests/install/CMakeLists.txt) in script mode: every step must succeed, and the
# first that does not ends the test with its output.
cmake_minimum_required(VERSION 3.25)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY ${WORK_DIR})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

# 1. The install: headers, libraries, the package files.
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
include(GNUInstallDirs)
foreach(f include/loom/loom.h include/loom/trainer.h include/loom/nn/layers.h
          ${CMAKE_INSTALL_LIBDIR}/libloom_framework.a ${CMAKE_INSTALL_LIBDIR}/libloom_training.a
          ${CMAKE_INSTALL_LIBDIR}/cmake/loom/loomConfig.cmake
          ${CMAKE_INSTALL_LIBDIR}/cmake/loom/loomConfigVersion.cmake
          ${CMAKE_INSTALL_LIBDIR}/cmake/loom/loomTargets.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f} under ${prefix}")
  endif()
endforeach()
# Only the public API is installed: no private header of the engine.
file(GLOB_RECURSE installed_headers RELATIVE ${prefix}/include ${prefix}/include/*)
foreach(h IN LISTS installed_headers)
  if(NOT h MATCHES "^loom/")
    message(FATAL_ERROR "installed a header outside include/loom/: ${h}")
  endif()
endforeach()
# The heap counter's malloc wrappers stay out of what users link.
if(NM)
  run("nm" ${NM} -g --defined-only ${prefix}/${CMAKE_INSTALL_LIBDIR}/libloom_framework.a)
  if(run_output MATCHES "[\r\n][0-9a-f]+ [TW] (malloc|free|calloc|realloc)[\r\n]")
    message(FATAL_ERROR "the installed libloom_framework.a defines ${CMAKE_MATCH_1}: the heap counter's wrappers must not be in it")
  endif()
endif()

# 2. examples/ against the prefix, as another project: find_package(loom) must find it there.
set(launcher)
if(CXX_LAUNCHER)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
run("configuring examples/" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples -B ${WORK_DIR}/build
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${launcher}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
file(STRINGS ${WORK_DIR}/build/CMakeCache.txt loom_dir REGEX "^loom_DIR:")
if(NOT loom_dir MATCHES "${prefix}/")
  message(FATAL_ERROR "find_package(loom) found another loom: ${loom_dir}")
endif()
run("building examples/" ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)

# 3. The examples run and say they learned.
run("train_loop" ${WORK_DIR}/build/train_loop)
message(STATUS "${run_output}")
if(NOT run_output MATCHES "train_loop: loss fell from")
  message(FATAL_ERROR "train_loop did not report a falling loss:\n${run_output}")
endif()
run("hdf5_trainer" ${WORK_DIR}/build/hdf5_trainer ${WORK_DIR}/quadrants.h5)
message(STATUS "${run_output}")
if(NOT run_output MATCHES "hdf5_trainer: [0-9]+ steps, loss .* test accuracy 0\\.9" AND
   NOT run_output MATCHES "test accuracy 1[\r\n]")
  message(FATAL_ERROR "hdf5_trainer did not report its accuracy:\n${run_output}")
endif()
message(STATUS "InstallAndExamples: installed, found, built and ran both examples")
