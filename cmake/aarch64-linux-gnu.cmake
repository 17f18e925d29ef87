# Cross-compiling for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu and multiarch libtbb-dev:arm64
# (a compile check of the non-x86 build: tools/cross_check_aarch64.sh). xsimd is header-only, so the host's
# headers and package config serve; TBB's config is found under /usr/lib/aarch64-linux-gnu/cmake.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
if(NOT DEFINED xsimd_DIR AND EXISTS /usr/lib/x86_64-linux-gnu/cmake/xsimd)
  set(xsimd_DIR /usr/lib/x86_64-linux-gnu/cmake/xsimd CACHE PATH "xsimd's package config (header-only: the host's serves)")
endif()
