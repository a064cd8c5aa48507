# What `cmake --install` puts under the prefix, for a project of your own that writes
#   find_package(loom REQUIRED)
#   target_link_libraries(app PRIVATE loom::loom)
# (examples/ is such a project): the public headers (include/loom/), the static libraries, and
# a CMake package (lib/cmake/loom/) whose targets carry their own link dependencies.
#
# Exported targets, one per library, each linking what it needs:
#   loom::framework    tensors, the lazy engine, autograd, metrics, profiler
#   loom::distributed  data-parallel training over MPI (loom/dist.h)
#   loom::loaders      datasets, HDF5, transforms, the DeviceLoader (loom/data/)
#   loom::optim        optimizers and schedules (loom/optim.h)
#   loom::nn           modules, layers, functional (loom/nn/)
#   loom::models       ResNets, the decoder (loom/models/)
#   loom::training     the Trainer and checkpoints (loom/trainer.h, loom/checkpoint.h)
#   loom::loom         all of the above, with the umbrella header loom/loom.h
# The malloc wrappers of the heap counter (loom_heap_count) are not installed: they are for
# loom's own tests and benchmarks.
include(CMakePackageConfigHelpers)

set(loom_libraries loom_framework loom_distributed loom_loaders loom_optim loom_nn loom_models
    loom_training)
foreach(lib IN LISTS loom_libraries)
  string(REPLACE "loom_" "" export_name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${export_name})
endforeach()

add_library(loom INTERFACE)
target_link_libraries(loom INTERFACE ${loom_libraries})
set_target_properties(loom PROPERTIES EXPORT_NAME loom)
# In-tree code (tests/docs) links the same name as an installed project does.
add_library(loom::loom ALIAS loom)

install(TARGETS ${loom_libraries} loom EXPORT loomTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/loom DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

set(loom_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${loom_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/loomConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/loomConfig.cmake
                              INSTALL_DESTINATION ${loom_cmake_dir})
# 0.x: a minor version may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/loomConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/loomConfig.cmake ${PROJECT_BINARY_DIR}/loomConfigVersion.cmake
        DESTINATION ${loom_cmake_dir})
