# The engine's layers: one OBJECT library per folder, tandem_<folder>, whose sources can include
# only their own folder and the folders it declares below it. Owns: tandem_layer(), the include
# views, and TANDEM_LAYERS (the layer targets, in declaration order) for the libraries that link
# their objects (cmake/TandemLibrary.cmake).
#
# How the rule is enforced: every engine include is written from the repository root
# ("core/tensor.h", "nn/module.h"), and a layer's sources do not get the root as an include
# directory. They get a view instead, <build>/layers/<folder>/, holding one symbolic link per
# folder the layer may use. A file in core/ that includes "nn/module.h" finds no such file and
# fails to compile, naming the include. tests/layers_test.py proves it for every pair of folders
# with the compile commands the build itself uses.
#
# Assumes: included from the top-level CMakeLists.txt (cmake/TandemLibrary.cmake's usage
# requirements defined; TandemCuda included, so TANDEM_WITH_CUDA is known).

set(TANDEM_LAYERS "")

# tandem_layer(<folder> [<folder it may use>...]): the object library tandem_<folder> of
# <folder>/*.cpp and <folder>/<sub>/*.cpp; <folder>/cuda/ (.cu and .cpp) only in a CUDA build, and
# core/cuda/no_cuda.cpp only without one. A folder may be nested (dist/store): its library is then
# tandem_dist_store, and it sees exactly the nested folders it names (a view holds dist/store, not
# all of dist/), so the layers inside one folder are kept apart as the folders are.
function(tandem_layer layer)
  set(uses ${ARGN})
  string(REPLACE "/" "_" name ${layer})
  foreach(dep IN LISTS uses)
    string(REPLACE "/" "_" dep_name ${dep})
    if(NOT TARGET tandem_${dep_name})
      message(FATAL_ERROR "tandem_layer(${layer}): '${dep}' is not a layer declared before it")
    endif()
  endforeach()
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${layer}/*.cpp ${PROJECT_SOURCE_DIR}/${layer}/*/*.cpp)
  set(cuda_dir ${PROJECT_SOURCE_DIR}/${layer}/cuda)
  if(TANDEM_WITH_CUDA)
    file(GLOB cuda_srcs CONFIGURE_DEPENDS ${cuda_dir}/*.cu)
    list(APPEND srcs ${cuda_srcs})
    list(FILTER srcs EXCLUDE REGEX "/no_cuda\\.cpp$")
  else()
    list(FILTER srcs EXCLUDE REGEX "^${cuda_dir}/")
    if(EXISTS ${cuda_dir}/no_cuda.cpp)
      list(APPEND srcs ${cuda_dir}/no_cuda.cpp)
    endif()
  endif()

  set(view ${PROJECT_BINARY_DIR}/layers/${name})
  file(REMOVE_RECURSE ${view})
  foreach(folder IN LISTS uses ITEMS ${layer})
    get_filename_component(parent ${view}/${folder} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${view}/${folder} SYMBOLIC)
  endforeach()

  add_library(tandem_${name} OBJECT ${srcs})
  target_include_directories(tandem_${name} PRIVATE ${view})
  tandem_engine_dependencies(tandem_${name})
  set_target_properties(tandem_${name} PROPERTIES TANDEM_LAYER_USES "${uses}")
  set(TANDEM_LAYERS ${TANDEM_LAYERS} tandem_${name} PARENT_SCOPE)
endfunction()
