# Writes build_info.cpp with the git sha and dirty flag; only touches the file when they change.
find_package(Git QUIET)
set(sha "unknown")
set(dirty 0)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse HEAD OUTPUT_VARIABLE sha
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(sha "unknown")
  endif()
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE st RESULT_VARIABLE rc2 ERROR_QUIET)
  if(rc2 EQUAL 0 AND NOT st STREQUAL "")
    set(dirty 1)
  endif()
endif()
# Without git metadata (a copied tree, e.g. on a remote build machine) the sha may come from a
# file .mtplab-git-sha written beside the sources by whoever copied them.
# MTPLAB_SHA_FROM_FILE=1 in the environment makes the file win over git: a copied tree may carry
# a stale .git (the scripts in scripts/device/ set it, after scripts/device/stamp.sh wrote the file).
if(EXISTS ${SRC}/.mtplab-git-sha AND (sha STREQUAL "unknown" OR "$ENV{MTPLAB_SHA_FROM_FILE}" STREQUAL "1"))
  file(STRINGS ${SRC}/.mtplab-git-sha lines LIMIT_COUNT 2)
  list(GET lines 0 sha)
  list(LENGTH lines n)
  if(n GREATER 1)
    list(GET lines 1 dirty)
  endif()
endif()
set(content "// Generated at build time by cmake/WriteBuildInfo.cmake.\n#include \"core/build_info.hpp\"\nnamespace mtplab {\nconst char* git_sha() { return \"${sha}\"; }\nbool git_dirty() { return ${dirty}; }\nconst char* project_version() { return \"${VERSION}\"; }\n}  // namespace mtplab\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
else()
  set(old "")
endif()
if(NOT old STREQUAL content)
  file(WRITE ${OUT} "${content}")
endif()
