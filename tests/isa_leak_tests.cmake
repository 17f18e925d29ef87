# ISA leak checks run by ctest (label isa): tools/check_isa_leak.py on the linked mha tool and test
# binary, which fails if any function outside lib/simd's per-ISA kernels holds AVX-512 (EVEX) or AVX
# (VEX) instructions, i.e. if the linker kept an ISA-flagged copy of a shared inline function that the
# SSE2 or AVX2 path may run (SIGILL on a CPU without that ISA; see the script's header).
#
# Included from tests/CMakeLists.txt. Not in sanitized builds (MHA_SANITIZE): what ships is the plain
# build, and the instrumented one adds nothing to check. Needs python3 and objdump (binutils).

# x86 only, and not in a cross build (its binaries are another target's).
if(NOT MHA_SANITIZE AND NOT CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  find_package(Python3 COMPONENTS Interpreter)
  # GNU objdump whatever the compiler (the script parses its output format), c++filt for the names.
  find_program(MHA_OBJDUMP objdump)
  find_program(MHA_CXXFILT c++filt)
  if(Python3_Interpreter_FOUND AND MHA_OBJDUMP)
    set(mha_isa_targets mha_tests)
    if(TARGET mha_cli)
      list(APPEND mha_isa_targets mha_cli)
    endif()
    set(cxxfilt_arg)
    if(MHA_CXXFILT)
      set(cxxfilt_arg --cxxfilt ${MHA_CXXFILT})
    endif()
    foreach(target ${mha_isa_targets})
      add_test(NAME isa_leak_${target}
               COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/check_isa_leak.py --objdump ${MHA_OBJDUMP}
                       ${cxxfilt_arg} $<TARGET_FILE:${target}>)
      set_tests_properties(isa_leak_${target} PROPERTIES LABELS isa TIMEOUT 300)
    endforeach()
  else()
    message(STATUS "ISA leak tests skipped: python3 or objdump not found")
  endif()
endif()
