# Test helpers. Labels: unit (no MPI launcher), mpi (under mpiexec), gpu (needs a GPU, skips with
# a reason elsewhere), slurm (starts a local Slurm), reference (transformers fixtures).
#
#   mtplab_unit_test(NAME SOURCES a.cpp b.cpp LIBS mtplab_core [LABELS x])
#   mtplab_mpi_test(NAME NP 2 SOURCES ... LIBS ... [ARGS ...])   # one ctest entry per NP
#   mtplab_gpu_test(NAME SOURCES ... LIBS ... [NP 2])
# Every test executable sees tests/ on its include path, for the shared helpers in tests/common/.
set(MTPLAB_MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe")
set(MTPLAB_MPIEXEC_FLAGS --oversubscribe --bind-to none)

function(_mtplab_test_exe name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT TARGET ${name})
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest mtplab_warnings)
    # tests/common/ (seeds, error_of, random vectors, traces): #include "common/<name>.hpp".
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  endif()
endfunction()

function(mtplab_unit_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  _mtplab_test_exe(${name} SOURCES ${T_SOURCES} LIBS ${T_LIBS} GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST
                       PROPERTIES LABELS unit ENVIRONMENT "MTPLAB_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  # gtest_discover_tests writes PROPERTIES unquoted, so a second label would be read as a property
  # name; extra labels go on the directory instead (tests/<module>/ holds one kind of test).
  if(T_LABELS)
    set_property(DIRECTORY APPEND PROPERTY LABELS ${T_LABELS})
  endif()
endfunction()

function(mtplab_mpi_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;NP;ARGS;LABELS" ${ARGN})
  _mtplab_test_exe(${name} SOURCES ${T_SOURCES} LIBS ${T_LIBS})
  foreach(np IN LISTS T_NP)
    add_test(NAME ${name}.np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MTPLAB_MPIEXEC_FLAGS}
                     $<TARGET_FILE:${name}> ${T_ARGS})
    set_tests_properties(${name}.np${np} PROPERTIES LABELS "mpi;${T_LABELS}" TIMEOUT 300
                         ENVIRONMENT "${MTPLAB_MPI_ENV};MTPLAB_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
                         PROCESSORS ${np})
  endforeach()
endfunction()

# A GPU test exits 77 when there is no (or too few) GPU, which ctest reports as skipped.
function(mtplab_gpu_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;NP;ARGS" ${ARGN})
  _mtplab_test_exe(${name} SOURCES ${T_SOURCES} LIBS ${T_LIBS})
  if(NOT T_NP)
    add_test(NAME ${name} COMMAND $<TARGET_FILE:${name}> ${T_ARGS})
    set(tests ${name})
  else()
    set(tests)
    foreach(np IN LISTS T_NP)
      add_test(NAME ${name}.np${np}
               COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MTPLAB_MPIEXEC_FLAGS}
                       $<TARGET_FILE:${name}> ${T_ARGS})
      list(APPEND tests ${name}.np${np})
    endforeach()
  endif()
  set_tests_properties(${tests} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT "${MTPLAB_MPI_ENV};MTPLAB_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
