// The exception thrown for bad input at the public API. Its message names the argument and the values.
#pragma once
#include <stdexcept>
#include <string>

namespace mha {

class invalid_argument : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

}  // namespace mha
