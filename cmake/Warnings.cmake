# Warnings as errors on our own code only; dependencies come in as SYSTEM headers from Debian.
function(fp4serve_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wimplicit-fallthrough
      -Wswitch-enum -Wno-switch-default -Werror>)
endfunction()

# One library per src/<module>; it may link only to modules upstream of it (docs/ARCHITECTURE.md).
function(fp4serve_add_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(fp4serve_${name} STATIC ${ARG_SOURCES})
  target_include_directories(fp4serve_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(fp4serve_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  set_target_properties(fp4serve_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  fp4serve_set_warnings(fp4serve_${name})
  add_library(fp4serve::${name} ALIAS fp4serve_${name})
endfunction()
