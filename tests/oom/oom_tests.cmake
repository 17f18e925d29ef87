# The out-of-memory test (issue 11, tests/oom/test_out_of_memory.cpp): its own executable, so nothing
# else runs under the address-space limit it sets, one ctest per case, label oom. Registered under
# MHA_SANITIZE too: there the limited cases skip themselves (RLIMIT_AS and ASan do not mix) and only
# the self-check of the verdict runs.
add_executable(mha_oom_tests ${CMAKE_CURRENT_LIST_DIR}/test_out_of_memory.cpp)
target_link_libraries(mha_oom_tests PRIVATE mha::mha GTest::gtest_main)
target_compile_options(mha_oom_tests PRIVATE -Wall -Wextra)
if(CMAKE_CROSSCOMPILING)
  target_compile_definitions(mha_oom_tests PRIVATE MHA_OOM_EMULATED=1)
endif()
gtest_discover_tests(mha_oom_tests DISCOVERY_TIMEOUT 120 PROPERTIES LABELS oom TIMEOUT 120)
