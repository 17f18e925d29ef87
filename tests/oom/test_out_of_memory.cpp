// Out of memory (issue 11): a forward call or a constructor that cannot get its memory throws
// std::bad_alloc before it writes any output, and leaks nothing. Each case runs under a real limit,
// RLIMIT_AS = the current address-space size (VmSize) + a budget, with malloc's free memory taken first,
// swept from 0 upward (doubling until the call succeeds, then finer steps below that). Under every budget
// the call must either succeed with results bitwise equal to an unlimited run, or throw std::bad_alloc
// with the outputs all sentinel; any other exception or a partly written output fails the test, and a
// std::terminate from a noexcept kernel kills the process, which fails the ctest.
// Its own executable (ctest label oom), so nothing else runs under the limit. Skipped under ASan: its
// shadow memory reserves terabytes of address space and it aborts (no bad_alloc) when an mmap fails.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include <mha/mha.hpp>

#include "../attention_test_util.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define MHA_OOM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MHA_OOM_ASAN 1
#endif
#endif
#ifndef MHA_OOM_ASAN
#define MHA_OOM_ASAN 0
#endif

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
// Scratch blocks of at least this size come from mmap, smaller ones from operator new (lib/core/scratch.cpp).
constexpr std::size_t kMapBytes = kMiB;

#ifndef MHA_OOM_EMULATED
#define MHA_OOM_EMULATED 0  // 1 in a cross build, whose tests run under qemu (oom_tests.cmake)
#endif
#define MHA_OOM_SKIP_UNDER_ASAN()                                                                              \
    do {                                                                                                       \
        if (MHA_OOM_ASAN)                                                                                      \
            GTEST_SKIP() << "RLIMIT_AS does not work under AddressSanitizer (its shadow memory reserves "      \
                            "terabytes of address space, and a failed mmap aborts instead of throwing)";       \
        if (MHA_OOM_EMULATED)                                                                                  \
            GTEST_SKIP() << "RLIMIT_AS limits qemu's own address space (it reserves the guest's), not the "    \
                            "emulated program's";                                                              \
    } while (0)

// ---- the process's address space and heap -----------------------------------------------------------

// VmSize of /proc/self/status in bytes, read without allocating (it runs right before a limit is set).
std::size_t vm_size_bytes() {
    static char buf[16384];
    const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    std::size_t n = 0;
    for (ssize_t r; n < sizeof buf - 1 && (r = ::read(fd, buf + n, sizeof buf - 1 - n)) > 0;) n += static_cast<std::size_t>(r);
    ::close(fd);
    buf[n] = '\0';
    const char* p = std::strstr(buf, "VmSize:");
    return p ? std::strtoull(p + 7, nullptr, 10) * 1024 : 0;
}

// Blocks from operator new not yet deleted (the replacements below count them): a call that fails
// must leave this where it was. (malloc's own statistics count blocks parked in its per-thread caches
// as in use, so they move by a few bytes on every call and cannot tell a leak.)
std::atomic<long> live_blocks{0};
std::atomic<long> new_calls{0};  // every operator new that returned a block

// Touches stack pages now, so the main thread's stack never has to grow under a limit (growing it past
// RLIMIT_AS is a SIGSEGV, not a bad_alloc).
[[gnu::noinline]] void grow_stack() {
    volatile char pad[512 * 1024];
    for (std::size_t i = 0; i < sizeof pad; i += 4096) pad[i] = 0;
}

enum class Outcome { success, bad_alloc, other };

struct Result {
    Outcome outcome = Outcome::success;
    char what[256] = {};  // the other exception: type and message (copied without allocating)
};

// Holds every free byte of this thread's malloc heap (largest pieces first, down to 16 bytes) while
// it lives, so that under a limit whatever a call allocates needs new address space: without it a
// small block or vector comes from memory malloc already has and no budget would fail. The blocks
// are chained through themselves (draining must not allocate bookkeeping); freed on destruction.
class HeapDrain {
public:
    HeapDrain() = default;
    HeapDrain(const HeapDrain&) = delete;
    HeapDrain& operator=(const HeapDrain&) = delete;
    void drain() {  // call with the limit at VmSize (else malloc just grows)
        for (std::size_t size = std::size_t{1} << 26; size >= 16; size /= 2)
            while (void* p = std::malloc(size)) {
                *static_cast<void**>(p) = head_;
                head_ = p;
            }
    }
    ~HeapDrain() {
        while (head_ != nullptr) {
            void* next = *static_cast<void**>(head_);
            std::free(head_);
            head_ = next;
        }
    }

private:
    void* head_ = nullptr;
};

bool set_soft_limit(const rlimit& saved, std::size_t bytes) {
    rlimit limited = saved;
    limited.rlim_cur = std::min<rlim_t>(bytes, saved.rlim_max);
    return ::setrlimit(RLIMIT_AS, &limited) == 0;
}

// Runs f with the soft RLIMIT_AS at VmSize + budget, malloc's free memory drained, and restores the
// old limit before returning. Nothing in here allocates besides f, and nothing reports until the
// limit is gone.
Result under_limit(std::size_t budget, const std::function<void()>& f) {
    Result r;
    rlimit saved{};
    HeapDrain drained;
    if (::getrlimit(RLIMIT_AS, &saved) != 0 || !set_soft_limit(saved, vm_size_bytes())) {
        r.outcome = Outcome::other;
        std::snprintf(r.what, sizeof r.what, "getrlimit or setrlimit failed");
        return r;
    }
    drained.drain();
    if (!set_soft_limit(saved, vm_size_bytes() + budget)) {
        ::setrlimit(RLIMIT_AS, &saved);
        r.outcome = Outcome::other;
        std::snprintf(r.what, sizeof r.what, "setrlimit failed");
        return r;
    }
    try {
        f();
    } catch (const std::bad_alloc&) {  // and anything derived from it
        r.outcome = Outcome::bad_alloc;
    } catch (const std::exception& e) {
        r.outcome = Outcome::other;
        std::snprintf(r.what, sizeof r.what, "%s: %s", typeid(e).name(), e.what());
    } catch (...) {
        r.outcome = Outcome::other;
        std::snprintf(r.what, sizeof r.what, "an exception not derived from std::exception");
    }
    ::setrlimit(RLIMIT_AS, &saved);
    return r;
}

// ---- outputs with sentinels ---------------------------------------------------------------------------

// A NaN with a payload no computation produces; compared bit for bit.
constexpr std::uint32_t kSentinelBits = 0x7fa5a5a5u;

std::uint32_t bits(float x) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

// An output buffer with guard floats on both sides; all of it starts as the sentinel.
struct Guarded {
    static constexpr std::size_t kGuard = 64;
    std::vector<float> store;
    std::size_t n = 0;
    explicit Guarded(std::size_t count) : store(count + 2 * kGuard), n(count) { fill(); }
    float* data() { return store.data() + kGuard; }
    const float* data() const { return store.data() + kGuard; }
    void fill() {
        float s = 0.0f;
        std::memcpy(&s, &kSentinelBits, sizeof s);
        std::fill(store.begin(), store.end(), s);
    }
    std::vector<float> payload() const { return {data(), data() + n}; }
};

// One output of a call: its buffer, the unlimited run's result, and a name for messages.
struct Checked {
    const char* name;
    const Guarded* buffer;
    const std::vector<float>* expected;
};

// What is wrong with a call's effect on its outputs ("" if nothing): the guards keep the sentinel
// always; after a success each buffer equals the unlimited run bit for bit, after a bad_alloc it is
// all sentinel; any other outcome is wrong in itself.
std::string verdict(const Result& r, const std::vector<Checked>& outputs) {
    std::string err;
    if (r.outcome == Outcome::other) err += std::string("threw ") + r.what + " instead of std::bad_alloc; ";
    for (const Checked& o : outputs) {
        const Guarded& g = *o.buffer;
        std::size_t guards = 0, written = 0, wrong = 0;
        for (std::size_t i = 0; i < g.store.size(); ++i) {
            const bool guard = i < Guarded::kGuard || i >= Guarded::kGuard + g.n;
            const std::uint32_t u = bits(g.store[i]);
            if (guard) {
                guards += u != kSentinelBits;
                continue;
            }
            written += u != kSentinelBits;
            wrong += u != bits((*o.expected)[i - Guarded::kGuard]);
        }
        const std::string of = " of " + std::to_string(g.n) + " floats of " + o.name;
        if (guards != 0) err += "wrote " + std::to_string(guards) + " floats outside " + o.name + "; ";
        if (r.outcome == Outcome::bad_alloc && written != 0)
            err += "threw std::bad_alloc after writing " + std::to_string(written) + of + "; ";
        if (r.outcome == Outcome::success && wrong != 0)
            err += "succeeded but " + std::to_string(wrong) + of + " differ from the unlimited run; ";
    }
    return err;
}

// ---- the sweep -------------------------------------------------------------------------------------------

struct Tally {
    int bad_allocs = 0, successes = 0;
    std::size_t last_failure = 0, first_success = 0;  // of the doubling phase
    std::vector<std::string> errors;
};

// attempt(budget) runs one call under that budget, appends what went wrong to errors, and returns
// the outcome. Budgets: 0, 4 KiB, 8 KiB, ... (doubling) until a call succeeds, then kFine − 1 budgets
// evenly spaced below that success and as many between the last failure and it (the states where some
// allocations of a call succeeded and a later one failed), then twice the first success.
Tally sweep(const std::function<Outcome(std::size_t, std::vector<std::string>&)>& attempt) {
    constexpr std::size_t kCap = std::size_t{1} << 30, kFine = 32;
    Tally t;
    auto run = [&](std::size_t budget) {
        std::vector<std::string> errors;
        const Outcome o = attempt(budget, errors);
        for (const std::string& e : errors) t.errors.push_back("budget " + std::to_string(budget) + ": " + e);
        t.bad_allocs += o == Outcome::bad_alloc;
        t.successes += o == Outcome::success;
        return o;
    };
    std::size_t budget = 0;
    for (;;) {
        if (run(budget) == Outcome::success) break;
        t.last_failure = budget;
        budget = budget == 0 ? 4096 : 2 * budget;
        if (budget > kCap) {
            t.errors.push_back("no call succeeded with a budget of up to " + std::to_string(kCap) + " bytes");
            return t;
        }
    }
    t.first_success = budget;
    for (std::size_t i = 1; i < kFine; ++i) run(t.first_success * i / kFine);
    for (std::size_t i = 1; i < kFine; ++i) run(t.last_failure + (t.first_success - t.last_failure) * i / kFine);
    run(2 * t.first_success);
    return t;
}

void report(const char* name, const Tally& t, const char* what, std::size_t bytes) {
    std::printf("[ oom      ] %s: %s %zu; %d budgets threw std::bad_alloc, %d succeeded "
                "(doubling: last failure at %zu, first success at %zu bytes over VmSize)\n",
                name, what, bytes, t.bad_allocs, t.successes, t.last_failure, t.first_success);
    for (std::size_t i = 0; i < t.errors.size() && i < 10; ++i) ADD_FAILURE() << name << ", " << t.errors[i];
    if (t.errors.size() > 10) ADD_FAILURE() << name << ": " << t.errors.size() - 10 << " more errors";
    EXPECT_GT(t.bad_allocs, 0) << name << ": no budget was small enough to fail; the sweep tested nothing";
    EXPECT_GT(t.successes, 0) << name;
}

// ---- problems ----------------------------------------------------------------------------------------------

// Uniform in [-bound, bound).
std::vector<float> uniform(std::size_t n, float bound, std::uint32_t seed) { return mha_test::random_floats(n, -bound, bound, seed); }

struct Weights {
    std::vector<float> in_w, in_b, out_w, out_b, gamma, beta;
    explicit Weights(std::size_t E)
        : in_w(uniform(3 * E * E, 1.0f / std::sqrt(float(E)), 1)), in_b(uniform(3 * E, 0.1f, 2)),
          out_w(uniform(E * E, 1.0f / std::sqrt(float(E)), 3)), out_b(uniform(E, 0.1f, 4)), gamma(uniform(E, 1.0f, 5)),
          beta(uniform(E, 0.1f, 6)) {}
    mha::AttentionWeights get() const {
        return {in_w.data(), in_b.data(), out_w.data(), out_b.data(), gamma.data(), beta.data()};
    }
};

enum class ScratchPath { mapped, operator_new };  // what the SIMD scratch block of one call must come from

struct ForwardCase {
    const char* name;
    std::size_t E, H, B, Lq, Lk;
    bool cross;         // separate key and value tensors (else self-attention)
    bool padding_mask;  // a boolean key_padding_mask (the SIMD path converts it to floats in a vector)
    mha::ForwardOptions opt;
    ScratchPath path;
};

// The sweep over one forward call; see the file header.
void run_forward_case(const ForwardCase& c) {
    const Weights w(c.E);
    const mha::MultiheadAttention m(w.get(), c.E, c.H);
    const std::vector<float> query = uniform(c.B * c.Lq * c.E, 1.0f, 7), key = uniform(c.B * c.Lk * c.E, 1.0f, 8),
                             value = uniform(c.B * c.Lk * c.E, 1.0f, 9);
    std::vector<std::uint8_t> padding(c.B * c.Lk, 0);
    for (std::size_t b = 0; b < c.B; ++b)
        for (std::size_t j = c.Lk - 1 - b; j < c.Lk; ++j) padding[b * c.Lk + j] = 1;  // the last b + 1 keys

    mha::AttentionInputs in;
    in.query = mha::ConstBatch(query.data(), c.B, c.Lq, c.E);
    if (c.cross) {
        in.key = mha::ConstBatch(key.data(), c.B, c.Lk, c.E);
        in.value = mha::ConstBatch(value.data(), c.B, c.Lk, c.E);
    }
    if (c.padding_mask) in.key_padding_mask = mha::MaskView::boolean(padding.data(), c.B, c.Lk);
    const std::size_t weight_floats = c.opt.need_weights == mha::NeedWeights::none ? 0
                                      : c.B * c.Lq * c.Lk * (c.opt.need_weights == mha::NeedWeights::per_head ? c.H : 1);
    Guarded out(c.B * c.Lq * c.E), attn(weight_floats);
    mha::AttentionOutputs outs{mha::Batch(out.data(), c.B, c.Lq, c.E), weight_floats ? attn.data() : nullptr};
    const std::function<void()> call = [&] { m.forward(in, outs, c.opt); };

    // The unlimited run; it also starts TBB's workers (their stacks), the malloc arenas of the threads
    // it uses and the stack depth of the call. A second run must give the same bits.
    grow_stack();
    call();
    const std::vector<float> expected_out = out.payload(), expected_attn = attn.payload();
    out.fill();
    attn.fill();
    call();
    ASSERT_EQ(out.payload(), expected_out) << "two unlimited runs differ";
    ASSERT_EQ(verdict(Result{}, {{"output", &out, &expected_out}, {"attn_weights", &attn, &expected_attn}}), "");

    const std::size_t scratch = m.workspace_bytes(in, c.opt);
    if (c.opt.backend == mha::Backend::simd) {
        if (c.path == ScratchPath::mapped)
            ASSERT_GE(scratch, kMapBytes) << c.name << " should need a scratch block from mmap";
        else
            ASSERT_LT(scratch, kMapBytes) << c.name << " should need a scratch block from operator new";
    }

    const Tally t = sweep([&](std::size_t budget, std::vector<std::string>& errors) {
        mha::release_scratch();  // the call must allocate its scratch again
        out.fill();
        attn.fill();
        const long blocks = live_blocks.load();
        const Result r = under_limit(budget, call);
        mha::release_scratch();
        const long blocks_now = live_blocks.load();  // before any message is built
        const std::string err = verdict(r, {{"output", &out, &expected_out}, {"attn_weights", &attn, &expected_attn}});
        if (!err.empty()) errors.push_back(err);
        if (blocks_now != blocks)
            errors.push_back("blocks live from operator new went from " + std::to_string(blocks) + " to " +
                             std::to_string(blocks_now) + " over the call (a leak?)");
        return r.outcome;
    });
    report(c.name, t, "workspace_bytes", scratch);
}

class OutOfMemory : public ::testing::Test {
protected:
    void SetUp() override { MHA_OOM_SKIP_UNDER_ASAN(); }
};

mha::ForwardOptions options(mha::Impl impl, int threads) {
    mha::ForwardOptions o;
    o.impl = impl;
    o.threads = threads;
    return o;
}

TEST_F(OutOfMemory, SimdMaterializedMappedScratch) {
    mha::ForwardOptions o = options(mha::Impl::materialized, 2);
    o.norm_eps = 1e-5f;
    run_forward_case({"simd materialized, self-attention, post-norm", 256, 4, 2, 192, 192, false, false, o, ScratchPath::mapped});
}

TEST_F(OutOfMemory, SimdMaterializedSmallScratch) {
    // threads = 1: unless the machine has one core, the call also builds its own task_arena under the limit.
    run_forward_case({"simd materialized, tiny, 1 thread", 16, 2, 1, 5, 7, true, false,
                      options(mha::Impl::materialized, 1), ScratchPath::operator_new});
}

TEST_F(OutOfMemory, SimdFused) {
    mha::ForwardOptions o = options(mha::Impl::fused, 2);
    o.causal = true;
    run_forward_case({"simd fused, cross-attention, boolean padding mask", 128, 4, 2, 160, 384, true, true, o,
                      ScratchPath::mapped});
}

TEST_F(OutOfMemory, SimdNeedWeightsAveraged) {
    mha::ForwardOptions o = options(mha::Impl::automatic, 2);
    o.need_weights = mha::NeedWeights::averaged;
    run_forward_case({"simd need_weights averaged, boolean padding mask", 192, 4, 2, 256, 256, false, true, o,
                      ScratchPath::mapped});
}

TEST_F(OutOfMemory, ScalarBackend) {
    mha::ForwardOptions o;
    o.backend = mha::Backend::scalar;
    o.need_weights = mha::NeedWeights::per_head;
    run_forward_case({"scalar backend, per-head weights", 256, 4, 1, 96, 96, true, true, o, ScratchPath::mapped});
}

// The constructor packs the weights (allocate_aligned: mmap at E = 512, operator new at E = 16): under
// every budget it either builds an object that computes what an unlimited one does, or throws
// std::bad_alloc having freed everything it took (malloc's bytes in use and VmSize back where they were).
void run_constructor_case(const char* name, std::size_t E, std::size_t H) {
    const Weights w(E);
    const std::size_t B = 1, L = 8;
    const std::vector<float> query = uniform(B * L * E, 1.0f, 7);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(query.data(), B, L, E);
    auto forward = [&](const mha::MultiheadAttention& m) {
        Guarded out(B * L * E);
        m.forward(in, {mha::Batch(out.data(), B, L, E)});
        return out.payload();
    };
    grow_stack();
    const mha::MultiheadAttention unlimited(w.get(), E, H);
    const std::vector<float> expected = forward(unlimited);

    const Tally t = sweep([&](std::size_t budget, std::vector<std::string>& errors) {
        std::optional<mha::MultiheadAttention> built;
        const long blocks = live_blocks.load();
        const std::size_t vm = vm_size_bytes();
        const Result r = under_limit(budget, [&] { built.emplace(w.get(), E, H); });
        const long blocks_now = live_blocks.load();  // before any message is built
        const std::size_t vm_now = vm_size_bytes();
        if (r.outcome == Outcome::other) errors.push_back(std::string("threw ") + r.what + " instead of std::bad_alloc");
        if (r.outcome == Outcome::success) {
            if (built->weight_bytes() != unlimited.weight_bytes()) errors.push_back("weight_bytes differs");
            if (forward(*built) != expected) errors.push_back("the object built under the limit computes other results");
            return r.outcome;
        }
        // Failed: nothing may stay allocated. VmSize may grow a little (malloc keeps its heap top), never
        // by a leaked mmap'd packed block (at E = 512 those are 1 MiB and 3 MiB).
        if (blocks_now != blocks)
            errors.push_back("blocks live from operator new went from " + std::to_string(blocks) + " to " + std::to_string(blocks_now));
        if (vm_now >= vm + kMiB)
            errors.push_back("VmSize grew by " + std::to_string(vm_now - vm) + " bytes (a leaked mmap block?)");
        return r.outcome;
    });
    report(name, t, "weight_bytes", unlimited.weight_bytes());
}

TEST_F(OutOfMemory, ConstructorMappedWeights) { run_constructor_case("constructor, E = 512 (mmap'd packs)", 512, 8); }

TEST_F(OutOfMemory, ConstructorSmallWeights) { run_constructor_case("constructor, E = 16 (operator new packs)", 16, 2); }

// mha/workspace.hpp: "With a Workspace passed to forward, the call allocates nothing". Then no budget
// can make it fail: with malloc's free memory drained and no address space to spare it must succeed.
// (Validation builds its error texts only on failure; boolean masks are read in place. A thread count
// other than the current arena's makes oneTBB build a task_arena; this case uses the current one.)
TEST_F(OutOfMemory, WorkspaceForwardNeedsNoMemory) {
    const std::size_t E = 64, H = 4, B = 2, L = 96;
    const Weights w(E);
    const mha::MultiheadAttention m(w.get(), E, H);
    const std::vector<float> query = uniform(B * L * E, 1.0f, 7);
    std::vector<std::uint8_t> padding(B * L, 0);
    for (std::size_t j = 0; j < B * L; j += 5) padding[j] = 1;
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(query.data(), B, L, E);
    in.key_padding_mask = mha::MaskView::boolean(padding.data(), B, L);
    Guarded out(B * L * E);
    const mha::AttentionOutputs outs{mha::Batch(out.data(), B, L, E)};
    mha::Workspace ws(m.workspace_bytes(in));
    grow_stack();
    m.forward(in, outs, {}, ws);  // warm-up and the expected result
    const std::vector<float> expected = out.payload();

    out.fill();
    const long calls = new_calls.load();
    m.forward(in, outs, {}, ws);
    EXPECT_EQ(new_calls.load() - calls, 0) << "operator new calls in a forward with a workspace";

    out.fill();
    const Result r = under_limit(0, [&] { m.forward(in, outs, {}, ws); });
    EXPECT_EQ(r.outcome, Outcome::success) << r.what;
    EXPECT_EQ(verdict(r, {{"output", &out, &expected}}), "");
}

// The checks above can fail: verdict() catches each kind of wrong outcome (this runs under ASan too).
TEST(OutOfMemoryChecks, VerdictCatchesEveryWrongOutcome) {
    Guarded out(100);
    const std::vector<float> expected = uniform(100, 1.0f, 11);
    const std::vector<Checked> outputs{{"output", &out, &expected}};
    Result bad_alloc, success, other;
    bad_alloc.outcome = Outcome::bad_alloc;
    other.outcome = Outcome::other;
    std::snprintf(other.what, sizeof other.what, "std::runtime_error: boom");

    EXPECT_EQ(verdict(bad_alloc, outputs), "");  // untouched
    out.data()[37] = 0.0f;                       // partly written, then bad_alloc
    EXPECT_NE(verdict(bad_alloc, outputs).find("after writing 1 of 100"), std::string::npos);

    std::copy(expected.begin(), expected.end(), out.data());
    EXPECT_EQ(verdict(success, outputs), "");
    EXPECT_NE(verdict(bad_alloc, outputs), "");  // fully written, then bad_alloc
    EXPECT_NE(verdict(other, outputs).find("instead of std::bad_alloc"), std::string::npos);
    out.store[3] = 1.0f;  // a guard before the output
    EXPECT_NE(verdict(success, outputs).find("outside output"), std::string::npos);

    out.fill();
    std::copy(expected.begin(), expected.begin() + 99, out.data());  // success, but one float never written
    EXPECT_NE(verdict(success, outputs).find("1 of 100 floats of output differ"), std::string::npos);
    out.fill();
    std::copy(expected.begin(), expected.end(), out.data());
    out.data()[0] = std::nextafter(expected[0], 2.0f);  // one ulp off
    EXPECT_NE(verdict(success, outputs), "");
}

}  // namespace

// Counting replacements of the global operator new and delete (the array, nothrow and sized forms of
// libstdc++ forward to these).
void* operator new(std::size_t bytes) {
    if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) {
        live_blocks.fetch_add(1, std::memory_order_relaxed);
        new_calls.fetch_add(1, std::memory_order_relaxed);
        return p;
    }
    throw std::bad_alloc();
}
void* operator new(std::size_t bytes, std::align_val_t align) {
    const auto a = static_cast<std::size_t>(align);
    void* p = nullptr;
    if (::posix_memalign(&p, std::max(a, sizeof(void*)), bytes == 0 ? 1 : bytes) != 0) throw std::bad_alloc();
    live_blocks.fetch_add(1, std::memory_order_relaxed);
    new_calls.fetch_add(1, std::memory_order_relaxed);
    return p;
}
void operator delete(void* p) noexcept {
    if (p == nullptr) return;
    live_blocks.fetch_sub(1, std::memory_order_relaxed);
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { ::operator delete(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { ::operator delete(p); }
