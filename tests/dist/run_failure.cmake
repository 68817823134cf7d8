# Runs dist_failure_child under mpiexec with a hard limit and checks that the job failed fast:
# non-zero exit, within LIMIT seconds, rank 0 never completed, and (mode throw) the failing
# rank's `[rank 1@host] message` on stderr.
# Mode stop: rank 1 stops itself (SIGSTOP); rank 0's MPI wait must time out after
# MTPLAB_COLLECTIVE_TIMEOUT_S (3 s here), name rank 1 and the all-reduce, and end the job with exit
# 124. Rank 1 is killed afterwards by its pid in any case, so that a failure leaves no stopped
# process behind.
# Mode mismatch: rank 1 waits in a barrier of another group; both ranks time out, and rank 0, the
# lowest, reports once, naming the barrier rank 1 waits in (exit 124).
# Mode agreed: every rank fails inside dist::run_agreed; the message comes once (rank 0's), the
# job exits 1 without MPI_Abort.
# Mode nccl_hang: the waiting rank's own timeout error (MTPLAB_COLLECTIVE_TIMEOUT_S=3 here) must
# end the job; "SKIP:" (the ctest skip pattern) when the child finds fewer than 2 GPUs.
# -DMPIEXEC= -DNP_FLAG= -DFLAGS=a|b|c -DCHILD= -DMODE=throw|kill|exit|stop|mismatch|agreed|nccl_hang -DLIMIT=30
string(REPLACE "|" ";" flags "${FLAGS}")
set(ENV{MTPLAB_COLLECTIVE_TIMEOUT_S} 3)
string(RANDOM LENGTH 12 tag)
set(pid_file "${CMAKE_CURRENT_BINARY_DIR}/dist_failure_${MODE}_${tag}.pid")
set(ENV{MTPLAB_TEST_PID_FILE} "${pid_file}")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 2 ${flags} ${CHILD} ${MODE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${LIMIT})
string(TIMESTAMP t1 "%s")
if(EXISTS "${pid_file}")
  file(STRINGS "${pid_file}" stopped_pid LIMIT_COUNT 1)
  file(REMOVE "${pid_file}")
  if(stopped_pid MATCHES "^[0-9]+$")
    execute_process(COMMAND kill -KILL ${stopped_pid} OUTPUT_QUIET ERROR_QUIET)
  endif()
endif()
math(EXPR elapsed "${t1} - ${t0}")
message("---- stdout\n${out}---- stderr\n${err}----")
message("mode ${MODE}: job ended after ${elapsed} s with exit status \"${rc}\"")
if(rc STREQUAL "77" AND out MATCHES "SKIP:")
  return()
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself within ${LIMIT} s (${rc}): a rank hangs")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although rank 1 failed")
endif()
if(elapsed GREATER_EQUAL ${LIMIT})
  message(FATAL_ERROR "the job took ${elapsed} s (limit ${LIMIT} s)")
endif()
if(out MATCHES "completed")
  message(FATAL_ERROR "a rank completed the loop: the all-reduce of step 3 did not block")
endif()
if(MODE STREQUAL "agreed")
  string(REGEX MATCHALL "deliberate failure" copies "${err}")
  list(LENGTH copies n)
  if(NOT n EQUAL 1 OR NOT err MATCHES "\\[rank 0@[^]]+\\] deliberate failure on rank 0 of every rank\n")
    message(FATAL_ERROR "expected rank 0's message once, got ${n} cop(ies)")
  endif()
  if(NOT rc EQUAL 1 OR err MATCHES "MPI_ABORT")
    message(FATAL_ERROR "an agreed failure must exit 1 through MPI_Finalize, not MPI_Abort (exit ${rc})")
  endif()
  return()
endif()
# A collective timeout: exit 124, and rank 0's report of the MPI all-reduce it waited in, ending
# in `peers` (a regular expression); `what` says what the report must name.
function(expect_mpi_timeout peers what)
  if(NOT rc EQUAL 124)
    message(FATAL_ERROR "a collective timeout must end the job with exit 124, got ${rc}")
  endif()
  if(NOT err MATCHES "\\[rank 0@[^]]+\\] MPI all_reduce_sum\\(f32, 4096\\) did not complete within 3 s \\(MTPLAB_COLLECTIVE_TIMEOUT_S, group of 2 rank\\(s\\)\\): ${peers}")
    message(FATAL_ERROR "rank 0 did not report the MPI timeout ${what}")
  endif()
endfunction()
if(NOT err MATCHES "rank 0 enters the all-reduce of step 3")
  message(FATAL_ERROR "rank 0 never reached the all-reduce it should have waited in")
endif()
if(MODE STREQUAL "throw" AND NOT err MATCHES "\\[rank 1@[^]]+\\] deliberate failure at step 3 while rank 0 waits in an all-reduce\n")
  message(FATAL_ERROR "the failing rank did not report `[rank 1@host] message` (no source location without MTPLAB_DEBUG)")
endif()
if(MODE STREQUAL "stop")
  expect_mpi_timeout("rank 1 has not arrived" "naming the collective and rank 1")
  if(elapsed GREATER 15)
    message(FATAL_ERROR "the job took ${elapsed} s to end after a 3 s timeout")
  endif()
endif()
if(MODE STREQUAL "mismatch")
  expect_mpi_timeout("no rank is missing; rank 1 is waiting in barrier\\(group of 2\\)"
                     "naming the collective rank 1 waits in instead")
  string(REGEX MATCHALL "did not complete within" reports "${err}")
  list(LENGTH reports n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "the timeout was reported ${n} times (the lowest waiting rank reports, once)")
  endif()
endif()
if(MODE STREQUAL "nccl_hang" AND NOT err MATCHES "\\[rank 0@[^]]+\\] NCCL collectives up to all_reduce_sum\\(f32, 4096\\) did not complete within 3 s")
  message(FATAL_ERROR "rank 0 did not report the NCCL timeout")
endif()
