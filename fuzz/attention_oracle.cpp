// See attention_oracle.hpp.
#include "attention_oracle.hpp"

mha_test::Expected oracle_attention(const mha_test::Problem& p) {
    mha_test::Expected ex = mha_test::attention_double(p);
    if (p.norm_eps) add_float_layernorm_bound(p, ex);
    return ex;
}
