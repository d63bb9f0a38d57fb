# Included by scripts/ci/cuda.sh through CMAKE_PROJECT_INCLUDE (after the top-level project()):
# the CUDA side's C++ files (core/cuda, kernels/cuda, dist/group/cuda) compile with -Werror on top of the
# project's -Wall -Wextra -Wno-unused-parameter. Source properties are directory-scoped, and the
# layers' object libraries (tandem_core, tandem_kernels, tandem_dist_group) are created in the top-level
# directory, so setting them here, before the targets exist, is enough; the rest of the engine keeps
# its ordinary flags. (The .cu files get their warnings-as-errors from CMAKE_CUDA_FLAGS.)
file(GLOB _tandem_cuda_cxx CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/core/cuda/*.cpp ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cpp ${CMAKE_SOURCE_DIR}/dist/group/cuda/*.cpp)
list(FILTER _tandem_cuda_cxx EXCLUDE REGEX "no_cuda\\.cpp$")
if(_tandem_cuda_cxx)
  set_property(SOURCE ${_tandem_cuda_cxx} APPEND PROPERTY COMPILE_OPTIONS -Werror)
endif()
