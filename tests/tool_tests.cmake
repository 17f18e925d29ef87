# mha_tool_tests: runs the real `mha` binary (tests/tool/*.cpp). Included from tests/CMakeLists.txt
# when MHA_BUILD_TOOLS is on.
find_package(nlohmann_json REQUIRED)
file(GLOB mha_tool_test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/tool/*.cpp)
add_executable(mha_tool_tests ${mha_tool_test_sources})
target_link_libraries(mha_tool_tests PRIVATE mha::mha mha_npy nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_options(mha_tool_tests PRIVATE -Wall -Wextra)
target_compile_definitions(mha_tool_tests PRIVATE MHA_TOOL_PATH="$<TARGET_FILE:mha_cli>"
                                                  MHA_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data"
                                                  MHA_TEST_EMULATOR="${mha_test_emulator}")
add_dependencies(mha_tool_tests mha_cli)
gtest_discover_tests(mha_tool_tests DISCOVERY_TIMEOUT 120)

# tools/quickstart.sh test builds the Python package even in a build directory configured without it, and
# MHA_BUILD_PYTHON=ON without a Python fails loudly (three configures of the library alone; needs pybind11).
if(MHA_BUILD_PYTHON)
  add_test(NAME quickstart_turns_python_on
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tool/quickstart_python.sh ${PROJECT_SOURCE_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/quickstart_python)
  set_tests_properties(quickstart_turns_python_on PROPERTIES LABELS "tool;python" TIMEOUT 300)
endif()
