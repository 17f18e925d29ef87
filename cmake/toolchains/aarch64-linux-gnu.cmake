# Cross build for aarch64 Linux with Debian's g++-aarch64-linux-gnu and arm64 multiarch packages
# (libtbb-dev:arm64, libgtest-dev:arm64, libbenchmark-dev:arm64; xsimd is header-only, the host's serves).
# Tests run under qemu-aarch64-static through CTest's emulator; MHA_QEMU_CPU (cortex-a72 | max, default max)
# picks the emulated CPU at configure time, or at test time from the environment.
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries and CMake package files from the arm64 multiarch folders; headers from /usr/include (shared).
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# Programs run as `qemu-aarch64-static -L /usr/aarch64-linux-gnu prog`: the loader is then the cross
# toolchain's (libc6-arm64-cross), so libc must be too, not the arm64 multiarch libc6 that libtbb-dev:arm64
# pulls in (a newer Debian revision: the two mixed hang in pthread_create). DT_RPATH (not RUNPATH) to the
# cross libc folder applies to every library loaded, TBB's dependencies included.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,--disable-new-dtags,-rpath,/usr/aarch64-linux-gnu/lib")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-Wl,--disable-new-dtags,-rpath,/usr/aarch64-linux-gnu/lib")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-Wl,--disable-new-dtags,-rpath,/usr/aarch64-linux-gnu/lib")
# The emulator CTest (and gtest_discover_tests) run the test binaries with. A wrapper script so the CPU
# model can be changed per ctest run with MHA_QEMU_CPU without reconfiguring.
set(CMAKE_CROSSCOMPILING_EMULATOR ${CMAKE_CURRENT_LIST_DIR}/qemu-aarch64.sh)
# xsimd is header-only: Debian installs its CMake package only in the build machine's multiarch folder.
if(NOT DEFINED xsimd_DIR AND EXISTS /usr/lib/x86_64-linux-gnu/cmake/xsimd/xsimdConfig.cmake)
  set(xsimd_DIR /usr/lib/x86_64-linux-gnu/cmake/xsimd)
endif()
