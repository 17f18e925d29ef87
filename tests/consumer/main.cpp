// Links the installed library and runs one attention forward whose answer is known: with one head,
// E = 2, identity projections and zero biases, a single query row attends to itself only, so the
// output equals the input.
#include <cstdio>
#include <mha/mha.hpp>

int main() {
    const float in_proj[3 * 2 * 2] = {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1};
    const float out_proj[2 * 2] = {1, 0, 0, 1};
    mha::MultiheadAttention attn({in_proj, nullptr, out_proj, nullptr}, 2, 1);
    const float query[2] = {0.25f, -0.5f};
    float out[2] = {0, 0};
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(query, 1, 1, 2);
    attn.forward(in, {mha::Batch(out, 1, 1, 2)});
    std::printf("mha %s: %g %g\n", mha::version(), out[0], out[1]);
    return out[0] == 0.25f && out[1] == -0.5f ? 0 : 1;
}
