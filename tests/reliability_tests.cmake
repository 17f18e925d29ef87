# Reliability checks run by ctest: valgrind memcheck on the real `mha run`.
#
# Included from tests/CMakeLists.txt, this file adds one test per case below when the CLI is built
# (MHA_BUILD_TOOLS), valgrind is found, and the build is not sanitized (ASan and valgrind exclude each
# other). Each test runs this same file as a script (cmake -P), which copies the PyTorch fixture
# folder tests/data/<case> (inputs only) into the build tree and runs
#   valgrind --error-exitcode=1 --leak-check=full --suppressions=tests/valgrind.supp \
#            mha run --npy <copy> --heads H [--causal] [--need-weights] [--norm-eps e] --out <tmp>/o.npy [extra]
# with H and the flags from the case's args.json, then requires exit code 0 and the output file.
# Under valgrind the CPU it emulates has no AVX-512, so the SIMD path runs its AVX2 kernels (and SSE2
# where MHA_ISA=sse2 says so).

if(CMAKE_SCRIPT_MODE_FILE)
  # --- script mode: one valgrind run. Variables: VALGRIND MHA SUPP FIXTURE WORK_DIR EXTRA ISA ---
  foreach(v VALGRIND MHA SUPP FIXTURE WORK_DIR)
    if(NOT DEFINED ${v})
      message(FATAL_ERROR "reliability_tests.cmake: ${v} is not set")
    endif()
  endforeach()
  if(NOT EXISTS "${FIXTURE}/args.json")
    message(FATAL_ERROR "fixture ${FIXTURE} is missing (tests/data/<case>/args.json); regenerate with tools/make_fixtures.py")
  endif()
  file(READ "${FIXTURE}/args.json" args)
  string(JSON heads GET "${args}" heads)
  string(JSON causal GET "${args}" causal)
  string(JSON need_weights GET "${args}" need_weights)
  string(JSON norm_eps_type TYPE "${args}" norm_eps)
  set(flags --heads ${heads})
  if(causal)
    list(APPEND flags --causal)
  endif()
  if(need_weights STREQUAL "averaged")
    list(APPEND flags --need-weights)
  endif()
  if(norm_eps_type STREQUAL "NUMBER")
    string(JSON norm_eps GET "${args}" norm_eps)
    list(APPEND flags --norm-eps ${norm_eps})
  endif()
  separate_arguments(extra_args UNIX_COMMAND "${EXTRA}")

  file(REMOVE_RECURSE "${WORK_DIR}")
  file(MAKE_DIRECTORY "${WORK_DIR}/in")
  file(GLOB inputs "${FIXTURE}/*.npy")
  foreach(f ${inputs})
    get_filename_component(name "${f}" NAME)
    if(NOT name MATCHES "^expected_")
      file(COPY "${f}" DESTINATION "${WORK_DIR}/in")
    endif()
  endforeach()

  set(env_cmd)
  if(ISA)
    set(env_cmd ${CMAKE_COMMAND} -E env MHA_ISA=${ISA})
  endif()
  set(cmd ${env_cmd} ${VALGRIND} --error-exitcode=1 --leak-check=full --track-origins=yes "--suppressions=${SUPP}"
          ${MHA} run --npy "${WORK_DIR}/in" ${flags} --out "${WORK_DIR}/o.npy" ${extra_args})
  list(JOIN cmd " " shown)
  message(STATUS "running: ${shown}")
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "valgrind run failed (exit code ${rc}): ${shown}")
  endif()
  if(NOT EXISTS "${WORK_DIR}/o.npy")
    message(FATAL_ERROR "mha run exited 0 under valgrind but wrote no ${WORK_DIR}/o.npy")
  endif()
  if(need_weights STREQUAL "averaged" AND NOT EXISTS "${WORK_DIR}/attn_weights.npy")
    message(FATAL_ERROR "mha run --need-weights wrote no ${WORK_DIR}/attn_weights.npy")
  endif()
  return()
endif()

# --- project mode: register the tests ---
if(MHA_BUILD_TOOLS AND TARGET mha_cli AND NOT MHA_SANITIZE AND NOT CMAKE_CROSSCOMPILING)
  find_program(MHA_VALGRIND valgrind)
  if(MHA_VALGRIND)
    # name | fixture case | ISA cap ("" = what the CPU, as valgrind emulates it, offers) | extra flags
    set(mha_valgrind_cases
        "cross_attention|cross_attention||--threads 2"
        "need_weights_averaged|need_weights_averaged||--threads 2"
        "seed000_fused_sse2|seed000_self_attention|sse2|--impl fused --threads 2"
        "causal_scalar|causal||--backend scalar")
    foreach(entry ${mha_valgrind_cases})
      string(REPLACE "|" ";" fields "${entry}")
      list(GET fields 0 name)
      list(GET fields 1 fixture)
      list(GET fields 2 isa)
      list(GET fields 3 extra)
      add_test(NAME valgrind_mha_run_${name}
               COMMAND ${CMAKE_COMMAND} -DVALGRIND=${MHA_VALGRIND} -DMHA=$<TARGET_FILE:mha_cli>
                       -DSUPP=${CMAKE_CURRENT_SOURCE_DIR}/valgrind.supp
                       -DFIXTURE=${CMAKE_CURRENT_SOURCE_DIR}/data/${fixture}
                       -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/valgrind/${name} -DISA=${isa} "-DEXTRA=${extra}"
                       -P ${CMAKE_CURRENT_LIST_FILE})
      set_tests_properties(valgrind_mha_run_${name} PROPERTIES LABELS valgrind TIMEOUT 300)
    endforeach()
  endif()
endif()
