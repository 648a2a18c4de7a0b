# Finds the DLPack header (dlpack/dlpack.h, header-only) and defines DLPack::dlpack.
#   MHCCL_EXTRA_INCLUDE_DIR, DLPACK_INCLUDE_HINTS: folders to look in first (then the system's).
# Defines DLPACK_INCLUDE_DIR.
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h HINTS ${MHCCL_EXTRA_INCLUDE_DIR} ${DLPACK_INCLUDE_HINTS})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DLPack REQUIRED_VARS DLPACK_INCLUDE_DIR)
if(DLPack_FOUND AND NOT TARGET DLPack::dlpack)
  add_library(DLPack::dlpack INTERFACE IMPORTED)
  set_target_properties(DLPack::dlpack PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${DLPACK_INCLUDE_DIR})
endif()
