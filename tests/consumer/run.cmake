# CTest driver: install the built library into a temporary prefix, build tests/consumer against it, run it.
# Variables: BUILD_DIR (mha's build tree), SOURCE_DIR (tests/consumer), WORK_DIR (scratch), CXX,
# CXX_STANDARD (optional, e.g. 17: the consumer is compiled with -std=c++17 instead of what mha::mha asks).
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
                        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
                        "-DMHA_CONSUMER_CXX_STANDARD=${CXX_STANDARD}" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
# Verbose: the log shows the compile line, so which -std= the headers met.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build --verbose RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
