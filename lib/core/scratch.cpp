// The process-wide scratch cache and mha::Workspace. The cache is a list of idle blocks under one mutex;
// its bookkeeping lives in each block's header, so giving a block back never allocates (and so never
// throws from a destructor). A release_scratch() bumps a generation counter: blocks leased before it are
// freed when they come back instead of being cached.
#include "scratch.hpp"

#include <cstdint>
#include <mutex>
#include <new>

#include <sys/mman.h>

#include "mha/workspace.hpp"

namespace mha {
namespace detail {

struct Block {
    Block* next;
    std::size_t bytes;  // usable bytes after the header
    std::uint64_t generation;
};
static_assert(sizeof(Block) <= kScratchAlign);

namespace {

struct Cache {
    std::mutex mutex;
    Block* idle = nullptr;  // unordered list
    std::size_t idle_bytes = 0;
    std::size_t limit = std::size_t{256} << 20;
    std::uint64_t generation = 0;
};

Cache& cache() {
    // Constructed on first use; a lease held by a static object constructed before that first use would
    // outlive it (no such object exists in the library).
    static Cache c;
    return c;
}

void* payload(Block* b) { return reinterpret_cast<char*>(b) + kScratchAlign; }

void free_block(Block* b) noexcept {
    if (b != nullptr) free_aligned(b, kScratchAlign + b->bytes);
}

void free_list(Block* b) noexcept {
    while (b != nullptr) {
        Block* next = b->next;
        free_block(b);
        b = next;
    }
}

// Unlinks idle blocks (largest first) until the cache holds at most `keep` bytes; returns them.
Block* trim_locked(Cache& c, std::size_t keep) {
    Block* freed = nullptr;
    while (c.idle_bytes > keep) {
        Block **largest = &c.idle, **at = &c.idle;
        for (; *at != nullptr; at = &(*at)->next)
            if ((*at)->bytes > (*largest)->bytes) largest = at;
        Block* b = *largest;
        *largest = b->next;
        c.idle_bytes -= b->bytes;
        b->next = freed;
        freed = b;
    }
    return freed;
}

}  // namespace

constexpr std::size_t kMapBytes = std::size_t{1} << 20;

void* allocate_aligned(std::size_t bytes) {
    if (bytes < kMapBytes) return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kScratchAlign));
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;  // page aligned
}

void free_aligned(void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    if (bytes < kMapBytes)
        ::operator delete(p, std::align_val_t(kScratchAlign));
    else
        ::munmap(p, bytes);
}

ScratchLease::ScratchLease(std::size_t bytes) : block_(nullptr) {
    Cache& c = cache();
    Block* stale = nullptr;  // an idle block too small for this call, freed instead of kept beside the new one
    std::uint64_t generation = 0;
    {
        std::lock_guard<std::mutex> lock(c.mutex);
        generation = c.generation;
        Block **best = nullptr, **largest = nullptr;
        for (Block** at = &c.idle; *at != nullptr; at = &(*at)->next) {
            if ((*at)->bytes >= bytes && (best == nullptr || (*at)->bytes < (*best)->bytes)) best = at;
            if (largest == nullptr || (*at)->bytes > (*largest)->bytes) largest = at;
        }
        Block** take = best != nullptr ? best : largest;
        if (take != nullptr) {
            Block* b = *take;
            *take = b->next;
            c.idle_bytes -= b->bytes;
            (best != nullptr ? block_ : stale) = b;
        }
    }
    if (block_ != nullptr) return;
    free_block(stale);
    if (bytes > SIZE_MAX - kScratchAlign) throw std::bad_alloc();
    block_ = static_cast<Block*>(allocate_aligned(kScratchAlign + bytes));
    block_->next = nullptr;
    block_->bytes = bytes;
    block_->generation = generation;
}

ScratchLease::~ScratchLease() {
    Cache& c = cache();
    Block* drop = nullptr;
    {
        std::lock_guard<std::mutex> lock(c.mutex);
        if (block_->generation != c.generation || block_->bytes > c.limit) {
            drop = block_;
        } else {
            block_->next = c.idle;
            c.idle = block_;
            c.idle_bytes += block_->bytes;
            drop = trim_locked(c, c.limit);
        }
    }
    if (drop == block_) drop->next = nullptr;
    free_list(drop);
}

void* ScratchLease::data() const noexcept { return payload(block_); }

}  // namespace detail

std::size_t release_scratch() noexcept {
    detail::Cache& c = detail::cache();
    detail::Block* all = nullptr;
    std::size_t bytes = 0;
    {
        std::lock_guard<std::mutex> lock(c.mutex);
        ++c.generation;
        all = c.idle;
        bytes = c.idle_bytes;
        c.idle = nullptr;
        c.idle_bytes = 0;
    }
    detail::free_list(all);
    return bytes;
}

void set_scratch_cache_limit(std::size_t bytes) noexcept {
    detail::Cache& c = detail::cache();
    detail::Block* drop = nullptr;
    {
        std::lock_guard<std::mutex> lock(c.mutex);
        c.limit = bytes;
        drop = detail::trim_locked(c, bytes);
    }
    detail::free_list(drop);
}

std::size_t scratch_cache_limit() noexcept {
    detail::Cache& c = detail::cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    return c.limit;
}

std::size_t scratch_cache_bytes() noexcept {
    detail::Cache& c = detail::cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    return c.idle_bytes;
}

Workspace::Workspace(std::size_t bytes) : data_(detail::allocate_aligned(bytes)), bytes_(bytes), owned_(true) {}
Workspace::Workspace(void* memory, std::size_t bytes) noexcept : data_(memory), bytes_(memory ? bytes : 0) {}
Workspace::~Workspace() {
    if (owned_) detail::free_aligned(data_, bytes_);
}
Workspace::Workspace(Workspace&& o) noexcept : data_(o.data_), bytes_(o.bytes_), owned_(o.owned_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.owned_ = false;
}
Workspace& Workspace::operator=(Workspace&& o) noexcept {
    if (this != &o) {
        if (owned_) detail::free_aligned(data_, bytes_);
        data_ = o.data_;
        bytes_ = o.bytes_;
        owned_ = o.owned_;
        o.data_ = nullptr;
        o.bytes_ = 0;
        o.owned_ = false;
    }
    return *this;
}

}  // namespace mha
