# Finds NCCL as one installation: nccl.h and the libnccl beside it, so that the library linked
# (and found at run time, through the build's RPATH) is the one whose headers the device API
# code was compiled against.
#   NCCL_ROOT (CMake or environment variable): an installation prefix to prefer.
# Defines NCCL::nccl, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.
set(_nccl_roots ${NCCL_ROOT} $ENV{NCCL_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_roots ${CUDAToolkit_LIBRARY_ROOT})
endif()
foreach(_d ${CUDAToolkit_INCLUDE_DIRS})
  get_filename_component(_p ${_d} DIRECTORY)
  list(APPEND _nccl_roots ${_p})
endforeach()
list(APPEND _nccl_roots /usr/local/cuda /usr)

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_roots} PATH_SUFFIXES include NO_DEFAULT_PATH)
if(NCCL_INCLUDE_DIR)
  get_filename_component(_nccl_prefix ${NCCL_INCLUDE_DIR} DIRECTORY)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${_nccl_prefix} PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu
    NO_DEFAULT_PATH)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*" "\\1" _maj "${_nccl_ver}")
  string(REGEX REPLACE ".*NCCL_MINOR ([0-9]+).*" "\\1" _min "${_nccl_ver}")
  string(REGEX REPLACE ".*NCCL_PATCH ([0-9]+).*" "\\1" _pat "${_nccl_ver}")
  set(NCCL_VERSION "${_maj}.${_min}.${_pat}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_INCLUDE_DIR NCCL_LIBRARY VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NCCL_VERSION VERSION_LESS 2.28)
  message(FATAL_ERROR "mhccl needs NCCL >= 2.28 (symmetric windows and the device API), found ${NCCL_VERSION}")
endif()
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl SHARED IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()
