#include <gtest/gtest.h>
#include <mha/mha.hpp>
TEST(Smoke, Version) { EXPECT_STREQ(mha::version(), "0.1.0"); }
