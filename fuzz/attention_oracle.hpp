// The expected result of fuzz_attention: tests/attention_test_util.hpp's double-precision attention
// with its error bound, plus the float-layernorm term for the SIMD post-norm (below). oracle_attention
// is compiled in its own TU (attention_oracle.cpp) without libFuzzer's coverage instrumentation: the
// oracle's loops are not code under test, and tracing their comparisons slowed every run several
// times over. tests/test_adversarial.cpp uses add_float_layernorm_bound too.
#pragma once
#include <cmath>
#include <vector>

#include "attention_test_util.hpp"

// The oracle's post-norm bound assumes the layernorm itself is computed in double and rounded once
// (as the scalar reference does); the SIMD layernorm works in float. Its extra error, for
// z = fl(o + x), mean0 = fl(Σz/n), d = fl(z − mean0), c = fl(Σd/n), var = Σd²/n − c²,
// y = γ·(d·r − c·r) + β (lib/simd/layernorm_impl.hpp), to first order:
//   rounding z and d:            |γ_j|·r·u·(|z_j| + |d_j|)
//   c (an n-term sum of d):      |γ_j|·r·(n + 1)·u·mean|d|
//   r = 1/sqrt(var + eps):       |γ_j ŷ_j|·((n + 2)/2 + 3)·u   (relative error of var halved, sqrt, division)
//   the last multiply-adds:      3·u·(|γ_j ŷ_j| + |β_j|)
// added to the oracle's tolerance with its factor c = 2 (|d_j| taken as |z_j − mean| + u·|z_j|).
inline void add_float_layernorm_bound(const mha_test::Problem& p, mha_test::Expected& ex) {
    mha_test::Problem pre = p;
    pre.norm_eps.reset();
    const mha_test::Expected o = mha_test::attention_double(pre);
    const std::size_t n = p.E;
    for (std::size_t row = 0; row < p.B * p.Lq; ++row) {
        std::vector<double> z(n);
        double mean = 0.0, var = 0.0, mean_dev = 0.0;
        for (std::size_t j = 0; j < n; ++j) z[j] = o.output[row * n + j] + double(p.query[row * n + j]), mean += z[j] / double(n);
        for (std::size_t j = 0; j < n; ++j) var += (z[j] - mean) * (z[j] - mean) / double(n), mean_dev += std::abs(z[j] - mean) / double(n);
        const double r = 1.0 / std::sqrt(var + double(*p.norm_eps)), u = mha_test::kU;
        for (std::size_t j = 0; j < n; ++j) {
            const double g = p.norm_w.empty() ? 1.0 : std::abs(double(p.norm_w[j]));
            const double b = p.norm_b.empty() ? 0.0 : std::abs(double(p.norm_b[j]));
            const double dev = std::abs(z[j] - mean) + u * std::abs(z[j]), yhat = std::abs(z[j] - mean) * r;
            const double extra = g * r * u * (std::abs(z[j]) + dev) + g * r * double(n + 1) * u * (mean_dev + u * std::abs(mean)) +
                                 g * yhat * (double(n + 2) / 2 + 3) * u + 3 * u * (g * yhat + b);
            ex.output_tol[row * n + j] += 2 * extra;
        }
    }
}


mha_test::Expected oracle_attention(const mha_test::Problem& p);
