# The engine library targets. Owns: the dependencies shared by the layers' object libraries and the
# libraries linked from them (tandem_engine_dependencies), the include root and dependencies users
# of a library get (tandem_engine_usage), and tandem_engine_library(name STATIC|SHARED), which links
# the objects of every layer in TANDEM_LAYERS (cmake/TandemLayers.cmake).
# Assumes: the caller found Eigen3, Threads, ZLIB, spdlog, nlohmann_json and Gloo, defined tandem_isal and
# tandem_dnnl (oneDNN, empty when TANDEM_ONEDNN is OFF), and included
# TandemCuda.
# Guarantees: Eigen3 and Threads are the only public link dependencies; Gloo, spdlog,
# nlohmann_json, zlib, ISA-L, oneDNN and the CUDA libraries stay private. A SHARED library exports only the
# tandem:: API (cmake/tandem.map): template instantiations and inline code of Gloo, spdlog, fmt,
# nlohmann_json, Eigen and the standard library that the engine compiled in stay local to it.

set(TANDEM_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/tandem.map)

# What compiling and linking engine code needs, except the include root (each layer gets its own
# view of the tree instead).
function(tandem_engine_dependencies target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_link_libraries(${target}
    PUBLIC Eigen3::Eigen Threads::Threads
    # BUILD_INTERFACE: the installed package names none of them (not even as link-dependent
    # libraries), so consumers need not have their CMake packages.
    PRIVATE $<BUILD_INTERFACE:ZLIB::ZLIB> $<BUILD_INTERFACE:spdlog::spdlog>
            $<BUILD_INTERFACE:nlohmann_json::nlohmann_json> $<BUILD_INTERFACE:gloo>
            $<BUILD_INTERFACE:tandem_isal> $<BUILD_INTERFACE:tandem_dnnl>)
  target_compile_definitions(${target} PUBLIC $<$<BOOL:${TANDEM_WITH_CUDA}>:TANDEM_WITH_CUDA=1>)
  if(TANDEM_WITH_CUDA)
    tandem_link_cuda(${target})
  endif()
endfunction()

function(tandem_engine_usage target)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:include/tandem>)
  tandem_engine_dependencies(${target})
endfunction()

function(tandem_engine_library name type)
  set(objects "")
  foreach(layer IN LISTS TANDEM_LAYERS)
    list(APPEND objects $<TARGET_OBJECTS:${layer}>)
  endforeach()
  add_library(${name} ${type} ${objects})
  tandem_engine_usage(${name})
  # Only objects as sources: name the linker (the CUDA objects need no device link step).
  set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX OUTPUT_NAME tandem EXPORT_NAME tandem)
  if(type STREQUAL "SHARED")
    set_target_properties(${name} PROPERTIES
      VERSION ${PROJECT_VERSION}
      SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
      LINK_DEPENDS ${TANDEM_VERSION_SCRIPT})
    # -Bsymbolic-functions: calls inside the library bind locally (no PLT hop, no interposition).
    target_link_options(${name} PRIVATE "LINKER:--version-script=${TANDEM_VERSION_SCRIPT}"
      "LINKER:-Bsymbolic-functions")
    # --no-undefined: a missing definition fails here, not in the consumer's link. Not with
    # sanitizers, whose runtime the executable provides.
    if(NOT TANDEM_SANITIZE)
      target_link_options(${name} PRIVATE "LINKER:--no-undefined")
    endif()
    # In-tree targets (tests, benchmarks) that call zlib or Gloo themselves got them through the
    # static library's link closure; give them the same here. Not exported: the package stays clean.
    target_link_libraries(${name} INTERFACE $<BUILD_INTERFACE:ZLIB::ZLIB> $<BUILD_INTERFACE:gloo>)
    if(TANDEM_WITH_CUDA)  # the GPU tests call the CUDA runtime, cuDNN and NCCL directly
      target_link_libraries(${name} INTERFACE $<BUILD_INTERFACE:CUDA::cudart>
        $<BUILD_INTERFACE:${TANDEM_CUDNN_LIB}> $<BUILD_INTERFACE:${TANDEM_NCCL_LIB}>)
    endif()
  endif()
endfunction()
