# Runs dist_failure_child under mpiexec with a hard limit and checks that the job failed fast:
# non-zero exit, within LIMIT seconds, rank 0 never completed, and (mode throw) the failing
# rank's `[rank 1@host] message (file:line)` on stderr.
# Mode nccl_hang: the waiting rank's own timeout error (MTPLAB_COLLECTIVE_TIMEOUT_S=3 here) must
# end the job; "SKIP:" (the ctest skip pattern) when the child finds fewer than 2 GPUs.
# -DMPIEXEC= -DNP_FLAG= -DFLAGS=a|b|c -DCHILD= -DMODE=throw|kill|exit|nccl_hang -DLIMIT=30
string(REPLACE "|" ";" flags "${FLAGS}")
set(ENV{MTPLAB_COLLECTIVE_TIMEOUT_S} 3)
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 2 ${flags} ${CHILD} ${MODE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${LIMIT})
string(TIMESTAMP t1 "%s")
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
if(NOT err MATCHES "rank 0 enters the all-reduce of step 3")
  message(FATAL_ERROR "rank 0 never reached the all-reduce it should have waited in")
endif()
if(MODE STREQUAL "throw" AND NOT err MATCHES "\\[rank 1@[^]]+\\] deliberate failure at step 3 [^\n]*\\(failure_child\\.cpp:[0-9]+\\)")
  message(FATAL_ERROR "the failing rank did not report `[rank 1@host] message (file:line)`")
endif()
if(MODE STREQUAL "nccl_hang" AND NOT err MATCHES "\\[rank 0@[^]]+\\] NCCL collectives up to all_reduce_sum\\(f32, 4096\\) did not complete within 3 s")
  message(FATAL_ERROR "rank 0 did not report the NCCL timeout")
endif()
