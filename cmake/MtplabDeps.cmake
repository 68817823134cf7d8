# Normalises the dependencies whose CMake exports differ between distributions.
# yaml-cpp 0.7 (Debian 12) exports `yaml-cpp`; 0.8 (Ubuntu 24.04) exports `yaml-cpp::yaml-cpp`.
add_library(mtplab_yaml INTERFACE)
if(TARGET yaml-cpp::yaml-cpp)
  target_link_libraries(mtplab_yaml INTERFACE yaml-cpp::yaml-cpp)
elseif(TARGET yaml-cpp)
  target_link_libraries(mtplab_yaml INTERFACE yaml-cpp)
else()
  message(FATAL_ERROR "yaml-cpp was found but exports neither yaml-cpp nor yaml-cpp::yaml-cpp")
endif()
add_library(mtplab::yaml ALIAS mtplab_yaml)

# HDF5's C API, serial or parallel build alike (only the serial API is used).
add_library(mtplab_hdf5 INTERFACE)
if(TARGET hdf5::hdf5)
  target_link_libraries(mtplab_hdf5 INTERFACE hdf5::hdf5)
else()
  target_include_directories(mtplab_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
  target_link_libraries(mtplab_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
  target_compile_definitions(mtplab_hdf5 INTERFACE ${HDF5_C_DEFINITIONS} ${HDF5_DEFINITIONS})
endif()
add_library(mtplab::hdf5 ALIAS mtplab_hdf5)
