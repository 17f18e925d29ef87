# CTest script: installs the python component of BUILD_DIR into PREFIX, then imports mha from PREFIX/SITE
# (and not from the build tree) and runs one forward.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX} --component python
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
if(IS_ABSOLUTE ${SITE})
  set(site ${SITE})
else()
  set(site ${PREFIX}/${SITE})
endif()
set(script "import numpy as np, mha, os; assert os.path.realpath(mha.__file__).startswith(os.path.realpath('${site}')), mha.__file__; \
a = mha.MultiheadAttention(16, 2); out, w = a(np.ones((1, 3, 16), np.float32)); assert out.shape == (1, 3, 16); print('ok', mha.__file__)")
# Run from the prefix: the test's own folder (<build>/python) holds the build tree's mha/, which `python -c`
# would import first.
execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${site} ${PYTHON} -c "${script}"
                WORKING_DIRECTORY ${PREFIX} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "importing the installed package failed: ${rc}")
endif()
