# Test data stored xz-compressed (tools/test_data_xz.py): every tracked tests/data/**/<file>.xz is inflated to
# tests/data/**/<file> (git-ignored, tests/data/.gitignore) by the target fp4serve_test_data, which every test
# and benchmark executable depends on, so tests, benchmarks, the CLI tests and the Python tools read the plain
# files where they always were. The tracked tree stays small enough to ship to the GPU machine.
find_program(FP4SERVE_XZ xz REQUIRED)  # Debian xz-utils
file(GLOB_RECURSE FP4SERVE_TEST_DATA_XZ CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/data/*.xz)
set(FP4SERVE_TEST_DATA_INFLATED "")
foreach(packed IN LISTS FP4SERVE_TEST_DATA_XZ)
  string(REGEX REPLACE "\\.xz$" "" plain "${packed}")
  file(RELATIVE_PATH label ${PROJECT_SOURCE_DIR} ${plain})
  # xz keeps the .xz file's timestamp on its output; the touch makes the output newer than its input.
  add_custom_command(OUTPUT ${plain}
    COMMAND ${FP4SERVE_XZ} --decompress --keep --force ${packed}
    COMMAND ${CMAKE_COMMAND} -E touch ${plain}
    DEPENDS ${packed}
    COMMENT "Inflating ${label}"
    VERBATIM)
  list(APPEND FP4SERVE_TEST_DATA_INFLATED ${plain})
endforeach()
add_custom_target(fp4serve_test_data ALL DEPENDS ${FP4SERVE_TEST_DATA_INFLATED})
