# Warnings as errors on our own code only; dependencies come in as SYSTEM headers from Debian.
function(fp4serve_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wimplicit-fallthrough
      -Wswitch-enum -Wno-switch-default -Werror>)
endfunction()

# The include root of one module library: ${CMAKE_BINARY_DIR}/include_roots/<name>/<path> is a symbolic link to
# src/<path>, the folder the library is declared in (path = core, backends/cpu/kernels, ...). That root, not src/,
# is the library's PUBLIC include directory, so "<path>/x.h" resolves only for targets that link the library
# (directly or transitively): an include of a module a library does not link fails to compile ("No such file").
# Includes stay written relative to src/. A folder that holds other modules' folders exposes them too
# (backends/cpu holds kernels/, which backend_cpu links; backends holds both wings, which backends links).
function(fp4serve_module_include_root name out_var)
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
  if(rel STREQUAL "" OR rel MATCHES "^\\.\\.")
    message(FATAL_ERROR "fp4serve_add_module(${name}): declare modules in a folder under src/, not ${CMAKE_CURRENT_SOURCE_DIR}")
  endif()
  set(root ${CMAKE_BINARY_DIR}/include_roots/${name})
  set(link ${root}/${rel})
  get_filename_component(parent ${link} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(IS_SYMLINK ${link})
    file(READ_SYMLINK ${link} target)
    if(NOT target STREQUAL CMAKE_CURRENT_SOURCE_DIR)
      file(REMOVE ${link})  # a stale link (the source tree moved): the link only, never what it points to
    endif()
  elseif(EXISTS ${link})
    file(REMOVE_RECURSE ${link})  # not a link: something of ours in the build tree, replaced
  endif()
  if(NOT IS_SYMLINK ${link})
    file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${link} SYMBOLIC)
  endif()
  set(${out_var} ${root} PARENT_SCOPE)
endfunction()

# One library per src/<module>; it may link only to modules upstream of it (docs/ARCHITECTURE.md), and it sees only
# the headers of the modules it links (its include root, above).
function(fp4serve_add_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(fp4serve_${name} STATIC ${ARG_SOURCES})
  fp4serve_module_include_root(${name} include_root)
  target_include_directories(fp4serve_${name} PUBLIC ${include_root} ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(fp4serve_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  set_target_properties(fp4serve_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  fp4serve_set_warnings(fp4serve_${name})
  add_library(fp4serve::${name} ALIAS fp4serve_${name})
endfunction()
