// What the binary was built from (generated at build time, see cmake/WriteBuildInfo.cmake).
#pragma once
namespace mtplab {
const char* git_sha();
bool git_dirty();
const char* project_version();
}  // namespace mtplab
