// serving_sim: a seeded continuous-batching simulation over one Llama-like attention layer (issue 22):
// R requests with prompts in [P0, P1] tokens and outputs in [O0, O1] tokens (uniform, seeded) served three ways:
//   continuous  a mha::PagedKVCache; each step runs one token of every generating sequence and chunks of the
//               prompts being prefilled (chunked prefill), at most --max-running sequences and --token-budget
//               tokens per step, in one MultiheadAttention::forward_step; finished sequences free their blocks
//               and waiting requests join;
//   alone       each request by itself through a B = 1 mha::KVCache: its prompt in one call, then one call per
//               output token, one request after another;
//   static      batches of --max-running requests through one KVCache [B, capacity = the batch's longest
//               prompt + output]: every prompt padded to the batch's longest, then decode steps until the
//               longest output is done (finished sequences keep decoding as padding).
// The first output token of a request comes from the call that ends its prompt. Reports output tokens/s of
// each and peak KV memory (bytes of K/V storage the method holds: blocks in use, or the caches' capacity)
// against the K/V bytes of the tokens held at that moment, as a Markdown table, then the tokens every method
// projects and their FLOPs, and one JSON object (--json FILE; tools/plot_bench.py --serving FILE draws it).
// Usage: serving_sim [--embed E --heads H --kv-heads HKV --head-dim D --requests R --prompt P0:P1 --output O0:O1
//                     --max-running N --token-budget T --block-size BS --dtype f32|bf16 --kv-type T --threads N
//                     --seed S --json FILE]
// --dtype: the layer's compute (bf16: bf16 weights, on the bf16 kernels where the CPU has them); --kv-type: the
// caches' element type (f32, bf16, f16, int8, fp8_e4m3, fp8_e5m2; fp8 with scales 1). Defaults f32 and f32.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

namespace {

struct Config {
    std::size_t E = 4096, H = 32, Hkv = 8, d = 128, requests = 64, p0 = 64, p1 = 1024, o0 = 32, o1 = 256;
    std::size_t max_running = 32, budget = 512, block_size = 64;
    mha::DataType dtype = mha::DataType::f32, kv_type = mha::DataType::f32;
    int threads = 0;
    unsigned seed = 22;
    std::string json;
};

struct Request {
    std::size_t prompt, output;
};

struct Result {
    double seconds = 0;
    std::size_t output_tokens = 0, peak_kv_bytes = 0, held_at_peak = 0;  // held: K/V bytes of the tokens held then
};

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

mha::MultiheadAttention make_layer(const Config& c, std::vector<float>& x) {
    std::mt19937 rng(c.seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto fill = [&](std::size_t n, float a) {
        std::vector<float> v(n);
        for (float& f : v) f = a * u(rng);
        return v;
    };
    const float a = 1.0f / std::sqrt(float(c.E));
    const std::vector<float> wq = fill(c.H * c.d * c.E, a), wk = fill(c.Hkv * c.d * c.E, a), wv = fill(c.Hkv * c.d * c.E, a),
                             wo = fill(c.E * c.H * c.d, a);
    mha::AttentionConfig cfg;
    cfg.embed_dim = c.E, cfg.num_heads = c.H, cfg.num_kv_heads = c.Hkv, cfg.head_dim = c.d, cfg.rope = mha::RopeConfig{};
    cfg.compute = c.dtype;
    mha::AttentionWeights w;
    w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data(), w.out_proj_weight = wo.data();
    x = fill(std::max(c.budget + c.max_running, c.max_running * c.p1) * c.E, 1.0f);  // token rows, reused
    return mha::MultiheadAttention(w, cfg);
}

// K and V of one token in the caches' element type.
std::size_t row_bytes(const Config& c) { return 2 * c.Hkv * mha::kv_row_bytes(c.kv_type, c.d); }

bool type_arg(const char* s, mha::DataType& t) {
    for (mha::DataType d : {mha::DataType::f32, mha::DataType::bf16, mha::DataType::f16, mha::DataType::int8,
                            mha::DataType::fp8_e4m3, mha::DataType::fp8_e5m2})
        if (mha::data_type_name(d) == s) return t = d, true;
    return false;
}

Result continuous(const Config& c, const mha::MultiheadAttention& m, const std::vector<Request>& reqs, const std::vector<float>& x) {
    const std::size_t bs = c.block_size, per_seq = (c.p1 + c.o1 + bs - 1) / bs;
    mha::PagedKVCache cache(c.max_running * per_seq, bs, c.Hkv, c.d, c.kv_type);
    const std::size_t block_bytes = bs * row_bytes(c);
    struct Running {
        std::size_t req, id, prefilled = 0, generated = 0;
    };
    std::deque<std::size_t> waiting;
    for (std::size_t r = 0; r < reqs.size(); ++r) waiting.push_back(r);
    std::vector<Running> running;
    std::vector<float> y((c.budget + c.max_running) * c.E);
    Result res;
    const auto t0 = Clock::now();
    while (!waiting.empty() || !running.empty()) {
        while (running.size() < c.max_running && !waiting.empty()) {
            running.push_back({waiting.front(), cache.add_sequence()});
            waiting.pop_front();
        }
        std::vector<std::size_t> ids, q;
        std::size_t T = 0;
        for (const Running& s : running)  // decodes first: one token each
            if (s.prefilled == reqs[s.req].prompt) ids.push_back(s.id), q.push_back(1), ++T;
        for (const Running& s : running) {  // then prompt chunks within the budget
            const std::size_t left = reqs[s.req].prompt - s.prefilled;
            if (left == 0 || T >= c.budget) continue;
            const std::size_t n = std::min(left, c.budget - T);
            ids.push_back(s.id), q.push_back(n), T += n;
        }
        m.forward_step(mha::ConstMatrix(x.data(), T, c.E), mha::Matrix(y.data(), T, c.E), cache, ids.data(), q.data(), ids.size(),
                       c.threads);
        std::size_t held = 0;
        for (Running& s : running) {
            const std::size_t k = std::find(ids.begin(), ids.end(), s.id) - ids.begin();
            if (k == ids.size()) continue;
            if (s.prefilled < reqs[s.req].prompt) {
                s.prefilled += q[k];
                if (s.prefilled == reqs[s.req].prompt) ++s.generated, ++res.output_tokens;  // the prompt's last call
            } else {
                ++s.generated, ++res.output_tokens;
            }
        }
        for (const Running& s : running) held += cache.length(s.id) * row_bytes(c);
        if (cache.used_blocks() * block_bytes > res.peak_kv_bytes) res.peak_kv_bytes = cache.used_blocks() * block_bytes, res.held_at_peak = held;
        for (std::size_t i = running.size(); i-- > 0;)
            if (running[i].generated == reqs[running[i].req].output) {
                cache.free_sequence(running[i].id);
                running.erase(running.begin() + std::ptrdiff_t(i));
            }
    }
    res.seconds = since(t0);
    return res;
}

Result alone(const Config& c, const mha::MultiheadAttention& m, const std::vector<Request>& reqs, const std::vector<float>& x) {
    Result res;
    std::vector<float> y(c.p1 * c.E);
    const auto t0 = Clock::now();
    for (const Request& r : reqs) {
        mha::KVCache cache(1, c.Hkv, c.d, r.prompt + r.output, c.kv_type);
        mha::ForwardOptions o;
        o.threads = c.threads;
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(x.data(), 1, r.prompt, c.E);
        m.forward(in, {mha::Batch(y.data(), 1, r.prompt, c.E)}, o, cache);
        in.query = mha::ConstBatch(x.data(), 1, 1, c.E);
        for (std::size_t t = 1; t < r.output; ++t) m.forward(in, {mha::Batch(y.data(), 1, 1, c.E)}, o, cache);
        res.output_tokens += r.output;
        if (cache.bytes() > res.peak_kv_bytes) res.peak_kv_bytes = cache.bytes(), res.held_at_peak = (r.prompt + r.output - 1) * row_bytes(c);
    }
    res.seconds = since(t0);
    return res;
}

Result static_batches(const Config& c, const mha::MultiheadAttention& m, const std::vector<Request>& reqs, const std::vector<float>& x) {
    Result res;
    const auto t0 = Clock::now();
    for (std::size_t b0 = 0; b0 < reqs.size(); b0 += c.max_running) {
        const std::size_t B = std::min(c.max_running, reqs.size() - b0);
        std::size_t P = 0, O = 0, held = 0;
        for (std::size_t i = 0; i < B; ++i) {
            P = std::max(P, reqs[b0 + i].prompt), O = std::max(O, reqs[b0 + i].output);
            held += (reqs[b0 + i].prompt + reqs[b0 + i].output - 1) * row_bytes(c);
        }
        mha::KVCache cache(B, c.Hkv, c.d, P + O, c.kv_type);
        std::vector<float> y(B * P * c.E);
        mha::ForwardOptions o;
        o.threads = c.threads;
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(x.data(), B, P, c.E);  // every prompt padded to the longest
        m.forward(in, {mha::Batch(y.data(), B, P, c.E)}, o, cache);
        in.query = mha::ConstBatch(x.data(), B, 1, c.E);
        for (std::size_t t = 1; t < O; ++t) m.forward(in, {mha::Batch(y.data(), B, 1, c.E)}, o, cache);
        for (std::size_t i = 0; i < B; ++i) res.output_tokens += reqs[b0 + i].output;
        if (cache.bytes() > res.peak_kv_bytes) res.peak_kv_bytes = cache.bytes(), res.held_at_peak = held;
    }
    res.seconds = since(t0);
    return res;
}

bool range_arg(const char* s, std::size_t& lo, std::size_t& hi) {
    return std::sscanf(s, "%zu:%zu", &lo, &hi) == 2 && lo >= 1 && lo <= hi;
}

}  // namespace

int main(int argc, char** argv) {
    Config c;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i];
        const char* v = argv[i + 1];
        const std::size_t n = std::strtoull(v, nullptr, 10);
        if (k == "--embed") c.E = n;
        else if (k == "--heads") c.H = n;
        else if (k == "--kv-heads") c.Hkv = n;
        else if (k == "--head-dim") c.d = n;
        else if (k == "--requests") c.requests = n;
        else if (k == "--max-running") c.max_running = n;
        else if (k == "--token-budget") c.budget = n;
        else if (k == "--block-size") c.block_size = n;
        else if (k == "--threads") c.threads = int(n);
        else if (k == "--seed") c.seed = unsigned(n);
        else if (k == "--json") c.json = v;
        else if (k == "--prompt" && range_arg(v, c.p0, c.p1)) continue;
        else if (k == "--output" && range_arg(v, c.o0, c.o1)) continue;
        else if (k == "--dtype" && type_arg(v, c.dtype) && (c.dtype == mha::DataType::f32 || c.dtype == mha::DataType::bf16)) continue;
        else if (k == "--kv-type" && type_arg(v, c.kv_type)) continue;
        else {
            std::fprintf(stderr, "serving_sim: bad argument %s %s (see the top of bench/serving_sim.cpp)\n", argv[i], v);
            return 2;
        }
    }
    if (argc % 2 == 0 || c.requests == 0 || c.max_running == 0 || c.budget < c.max_running) {
        std::fprintf(stderr, "serving_sim: arguments come in pairs; requests, max-running >= 1; token-budget >= max-running\n");
        return 2;
    }
    std::mt19937 rng(c.seed);
    std::vector<Request> reqs(c.requests);
    for (Request& r : reqs) {
        r.prompt = std::uniform_int_distribution<std::size_t>(c.p0, c.p1)(rng);
        r.output = std::uniform_int_distribution<std::size_t>(c.o0, c.o1)(rng);
    }
    std::vector<float> x;
    const mha::MultiheadAttention m = make_layer(c, x);
    (void)alone(c, m, {reqs.front()}, x);  // warm-up: the thread pool, the scratch cache, page faults
    const Result cont = continuous(c, m, reqs, x), one = alone(c, m, reqs, x), stat = static_batches(c, m, reqs, x);
    std::printf("serving_sim: %zu requests, prompts %zu-%zu, outputs %zu-%zu, E %zu H %zu Hkv %zu d %zu, at most %zu running, "
                "%zu tokens per step, blocks of %zu, dtype %s, kv-type %s, isa %s\n\n",
                c.requests, c.p0, c.p1, c.o0, c.o1, c.E, c.H, c.Hkv, c.d, c.max_running, c.budget, c.block_size,
                std::string(mha::data_type_name(c.dtype)).c_str(), std::string(mha::data_type_name(c.kv_type)).c_str(),
                std::string(mha::isa_name(mha::active_isa())).c_str());
    std::printf("| method | seconds | output tokens/s | vs alone | peak KV MB | tokens held then, MB | peak / held |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    const struct {
        const char* name;
        const Result& r;
    } rows[] = {{"continuous (paged)", cont}, {"alone (B = 1)", one}, {"static batches", stat}};
    for (const auto& row : rows)
        std::printf("| %s | %.2f | %.1f | %.2fx | %.1f | %.1f | %.2f |\n", row.name, row.r.seconds, row.r.output_tokens / row.r.seconds,
                    (row.r.output_tokens / row.r.seconds) / (one.output_tokens / one.seconds), row.r.peak_kv_bytes / 1e6,
                    row.r.held_at_peak / 1e6, double(row.r.peak_kv_bytes) / double(row.r.held_at_peak));
    std::printf("\ncontinuous / static: %.2fx output tokens/s\n", (cont.output_tokens / cont.seconds) / (stat.output_tokens / stat.seconds));
    // The projections' work, the same for every method: a floor on any method's time (at the FMA peak), so a
    // bound on what continuous batching can gain over running alone (docs/kv-cache-types.md, stop 50).
    std::size_t prompt_tokens = 0, decode_tokens = 0;
    for (const Request& r : reqs) prompt_tokens += r.prompt, decode_tokens += r.output - 1;
    const double flops_per_token = 2.0 * double(c.E) * double(2 * c.H * c.d + 2 * c.Hkv * c.d);
    const double projection_flops = flops_per_token * double(prompt_tokens + decode_tokens);
    std::printf("projections: %zu prompt tokens + %zu decode tokens, %.1f GFLOP (2·E·(2·H·d + 2·Hkv·d) per token)\n", prompt_tokens,
                decode_tokens, projection_flops / 1e9);
    if (!c.json.empty()) {
        FILE* f = std::fopen(c.json.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "serving_sim: cannot write %s\n", c.json.c_str());
            return 1;
        }
        std::fprintf(f, "{\"serving\": [");
        for (std::size_t i = 0; i < 3; ++i)
            std::fprintf(f, "%s{\"method\": \"%s\", \"seconds\": %.4f, \"output_tokens\": %zu, \"tokens_per_s\": %.3f, \"peak_kv_bytes\": %zu, "
                            "\"held_kv_bytes\": %zu}",
                         i ? ", " : "", rows[i].name, rows[i].r.seconds, rows[i].r.output_tokens, rows[i].r.output_tokens / rows[i].r.seconds,
                         rows[i].r.peak_kv_bytes, rows[i].r.held_at_peak);
        std::fprintf(f, "], \"prompt_tokens\": %zu, \"decode_tokens\": %zu, \"projection_flops\": %.0f}\n", prompt_tokens, decode_tokens,
                     projection_flops);
        std::fclose(f);
    }
    return 0;
}
