// Scratch memory of a forward call: a caller-owned Workspace, or the library's bounded scratch cache.
//
// A SIMD forward needs scratch besides its inputs and outputs: the projected Q, K, V and the context
// (about 2·B·Lq·H·d + 2·B·Lk·Hkv·d floats), the grouped (fused) path's packed K/V panels (2·B·Lk·Hkv·d),
// and per thread of the arena it runs in a score block, an accumulator and GEMM pack buffers (about
// 2 MB per thread). scaled_dot_product_attention needs the panels and the per-thread part only.
// MultiheadAttention::workspace_bytes and sdpa_workspace_bytes say exactly how much one call needs.
//   - With a Workspace passed to forward, the call allocates nothing: it runs in the workspace or
//     throws mha::invalid_argument (before writing anything) if the workspace is too small or overlaps
//     the call's tensors. (oneTBB has its own memory: its task objects come from pools it keeps, and a
//     task_arena is built per call when ForwardOptions::threads differs from the caller's arena.)
//   - Without one, the call leases a block from the process-wide scratch cache: an idle block that is
//     large enough, else a new one (operator new; std::bad_alloc propagates before any output is
//     written). When the call returns the block goes back to the cache, unless the cache would then
//     hold more than scratch_cache_limit() bytes, in which case it is freed. So memory held between
//     calls never exceeds the limit, and steady-state calls of one shape allocate nothing.
//   - The scalar backend (the reference) allocates its own buffers per call, plus a copy of the weights.
#pragma once
#include <atomic>
#include <cstddef>

namespace mha {

class Workspace {
public:
    Workspace() noexcept = default;                       // empty (0 bytes)
    explicit Workspace(std::size_t bytes);                // owns `bytes` bytes, allocated now
    Workspace(void* memory, std::size_t bytes) noexcept;  // borrows the caller's memory (any alignment)
    ~Workspace();
    Workspace(Workspace&& other) noexcept;
    Workspace& operator=(Workspace&& other) noexcept;
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;

    void* data() const noexcept { return data_; }
    std::size_t bytes() const noexcept { return bytes_; }
    bool owns_memory() const noexcept { return owned_; }

    // Internal: one forward at a time may use a workspace (a second concurrent one is refused).
    bool try_acquire() const noexcept { return !in_use_.exchange(true, std::memory_order_acquire); }
    void release() const noexcept { in_use_.store(false, std::memory_order_release); }

private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
    bool owned_ = false;
    mutable std::atomic<bool> in_use_{false};
};

// The scratch cache used by calls made without a Workspace (one per process, shared by all threads).
// Frees every idle cached block now and returns the bytes freed; blocks in use by running calls are
// freed when those calls return. Safe to call from any thread at any time.
std::size_t release_scratch() noexcept;
// Idle bytes the cache may keep between calls (default 256 MiB); lowering it frees the excess now.
void set_scratch_cache_limit(std::size_t bytes) noexcept;
std::size_t scratch_cache_limit() noexcept;
// Idle bytes the cache holds now.
std::size_t scratch_cache_bytes() noexcept;

}  // namespace mha
