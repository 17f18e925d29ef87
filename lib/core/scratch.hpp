// Scratch memory for the SIMD paths: 64-byte aligned blocks, and leases from the process-wide scratch
// cache (mha/workspace.hpp says what it keeps and when it frees). Baseline code only: the ISA kernels
// receive plain pointers, never an allocator.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mha::detail {

inline constexpr std::size_t kScratchAlign = 64;

// 64-byte aligned memory; throws std::bad_alloc. Blocks of 1 MiB or more are mapped from the OS
// directly (mmap) and unmapped when freed, so freeing them lowers the resident set at once (malloc
// would keep them in its heap, where a long-running process never gets them back). Free with
// free_aligned and the same byte count.
void* allocate_aligned(std::size_t bytes);
void free_aligned(void* p, std::size_t bytes) noexcept;

// A block leased from the scratch cache for one call: at least the bytes asked for, 64-byte aligned.
// Goes back to the cache (or is freed, see mha/workspace.hpp) when the lease is destroyed.
class ScratchLease {
public:
    explicit ScratchLease(std::size_t bytes);  // may throw std::bad_alloc
    ~ScratchLease();
    ScratchLease(const ScratchLease&) = delete;
    ScratchLease& operator=(const ScratchLease&) = delete;
    void* data() const noexcept;

private:
    struct Block* block_;
};

// The first 64-byte boundary at or after p.
inline void* align_up(void* p) noexcept {
    const auto v = reinterpret_cast<std::uintptr_t>(p);
    return reinterpret_cast<void*>((v + kScratchAlign - 1) / kScratchAlign * kScratchAlign);
}

}  // namespace mha::detail
