// mha::version(): the version string set by CMake's project(VERSION).
#include "mha/mha.hpp"

namespace mha {
const char* version() noexcept { return MHA_VERSION_STRING; }
}  // namespace mha
