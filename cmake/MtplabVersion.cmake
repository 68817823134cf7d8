# The git commit the binary is built from, refreshed at every build (not only at configure).
set(MTPLAB_VERSION_CPP ${CMAKE_BINARY_DIR}/generated/build_info.cpp)
add_custom_target(mtplab_git_version ALL
  COMMAND ${CMAKE_COMMAND} -DSRC=${CMAKE_SOURCE_DIR} -DOUT=${MTPLAB_VERSION_CPP}
          -DVERSION=${PROJECT_VERSION} -P ${CMAKE_SOURCE_DIR}/cmake/WriteBuildInfo.cmake
  BYPRODUCTS ${MTPLAB_VERSION_CPP}
  COMMENT "Recording the git commit")
