# Install rules: the package consumers build against. Owns: which headers are public, the installed
# shared library and its CMake package (tandem::tandem, TandemConfig.cmake, TandemConfigVersion.cmake),
# tandem.pc, and the apps under bin/.
# Assumes: TANDEM_PACKAGE_LIBRARY names the SHARED engine library (cmake/TandemLibrary.cmake) and the
# apps' targets exist when their sources do.
# Guarantees, after `cmake --install <build> --prefix P`:
#   P/include/tandem/<folder>/*.h  the public headers, folder layout kept, so "core/tensor.h" resolves
#                                  with -IP/include/tandem; none includes a CUDA, NCCL or Gloo header
#                                  (scripts/ci/embed.sh compiles each alone and greps the preprocessed
#                                  output). Internal headers (kernels/cpu, kernels/cuda, core/cuda,
#                                  TANDEM_INTERNAL_HEADERS below) are not installed.
#   P/lib/libtandem.so*             exports the tandem:: API only (cmake/tandem.map)
#   P/lib/cmake/Tandem/             find_package(Tandem) -> tandem::tandem; needs Eigen3 and Threads only
#   P/lib/pkgconfig/tandem.pc       relocatable (paths from ${pcfiledir}); Requires: eigen3
#   P/bin/tandem-mnist, tandem-train, tandem-test, tandem-run  (each finds P/lib through its RUNPATH when linked shared)
# Components: runtime (the .so), devel (headers, namelink, CMake package, tandem.pc), apps (bin/).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TANDEM_PUBLIC_HEADER_DIRS core data dist/store dist/group dist/parallel kernels nn nn/models optim train
  train/models)
# Not installed: internal, or their API names a private dependency's types (train/config.h is
# built on nlohmann::json, and train/checkpoint.h includes it), which would make that dependency
# public. scripts/ci/embed.sh fails when an installed header pulls in CUDA, NCCL, Gloo, spdlog,
# fmt, nlohmann-json or zlib headers, so a new header of that kind must be listed here.
set(TANDEM_INTERNAL_HEADERS kernels/dispatch.h dist/group/gloo_store_adapter.h dist/group/shm_allreduce.h
  dist/group/gloo_reduce.h dist/parallel/fsdp_unit.h train/py_config.h train/py_config_tokens.h train/config.h train/checkpoint.h
  train/metrics_writer.h train/runner_internal.h train/cuda_graph_step.h train/run_config.h
  train/sharded_checkpoint.h)
foreach(dir IN LISTS TANDEM_PUBLIC_HEADER_DIRS)
  file(GLOB _headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/${dir}/*.h)
  list(REMOVE_ITEM _headers ${TANDEM_INTERNAL_HEADERS})
  if(_headers)
    install(FILES ${_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tandem/${dir} COMPONENT devel)
  endif()
endforeach()

install(TARGETS ${TANDEM_PACKAGE_LIBRARY} EXPORT TandemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
set(TANDEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Tandem)
install(EXPORT TandemTargets NAMESPACE tandem:: FILE TandemTargets.cmake DESTINATION ${TANDEM_CMAKE_DIR}
  COMPONENT devel)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/TandemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/TandemConfig.cmake INSTALL_DESTINATION ${TANDEM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/TandemConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/TandemConfig.cmake ${PROJECT_BINARY_DIR}/TandemConfigVersion.cmake
  DESTINATION ${TANDEM_CMAKE_DIR} COMPONENT devel)

# pkg-config: every path relative to the .pc file, so the prefix can move after installation.
file(RELATIVE_PATH TANDEM_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
string(REGEX REPLACE "/$" "" TANDEM_PC_TO_PREFIX "${TANDEM_PC_TO_PREFIX}")
set(TANDEM_PC_CFLAGS "")
if(TANDEM_WITH_CUDA)
  set(TANDEM_PC_CFLAGS " -DTANDEM_WITH_CUDA=1")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/tandem.pc.in ${PROJECT_BINARY_DIR}/tandem.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tandem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)

foreach(app tandem-mnist tandem-train tandem-test tandem-run)
  if(TARGET ${app})
    file(RELATIVE_PATH _rel /root/${CMAKE_INSTALL_BINDIR} /root/${CMAKE_INSTALL_LIBDIR})
    set_target_properties(${app} PROPERTIES INSTALL_RPATH "$ORIGIN/${_rel}")
    install(TARGETS ${app} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT apps)
  endif()
endforeach()
