// Argument checks shared by MultiheadAttention::forward and scaled_dot_product_attention: masks (type,
// pointer, shape against B, H, Lq, Lk, extent) and the options both take. Each throws mha::invalid_argument
// naming the argument and its values.
#pragma once
#include <string>

#include "../core/validate.hpp"
#include "mha/attention.hpp"

namespace mha::detail {

inline std::string dims(const MaskView& m) {
    std::string s = "[";
    for (int i = 0; i < m.rank; ++i) s += (i ? ", " : "") + std::to_string(m.shape[i]);
    return s + "]";
}

inline void check_mask_data(const char* name, const MaskView& m) {
    if (m.type != MaskType::boolean && m.type != MaskType::additive)
        fail(std::string(name) + " has an unknown mask type " + std::to_string(static_cast<int>(m.type)));
    if (m.type == MaskType::boolean && m.bools == nullptr) fail(std::string(name) + " is boolean with a null pointer");
    if (m.type == MaskType::additive && m.values == nullptr) fail(std::string(name) + " is additive with a null pointer");
    // Checked before dims() prints the shape: MaskView::shape has 3 entries.
    if (m.rank != 2 && m.rank != 3) fail(std::string(name) + " has rank " + std::to_string(m.rank) + " but must be 2 or 3");
}

// Elements of a validated mask (shape checked against B, H, Lq, Lk, so the product fits).
inline std::size_t mask_elements(const MaskView& m) {
    std::size_t n = 1;
    for (int i = 0; i < m.rank; ++i) n *= m.shape[i];
    return n;
}

// The mask's bytes fit in the address space after its pointer (its shape matched the inputs).
inline void check_mask_extent(const char* name, const MaskView& m) {
    std::size_t n = 1;
    for (int i = 0; i < m.rank; ++i) n = detail::checked_madd(n, m.shape[i], 0, name, "size");
    if (m.type == MaskType::boolean)
        detail::checked_extent(name, m.bools, n);
    else
        detail::checked_extent(name, m.values, n);
}

// The options both entry points take.
inline void check_common_options(Impl impl, Backend backend, int threads) {
    if (static_cast<unsigned>(impl) > static_cast<unsigned>(Impl::fused))
        fail("impl " + std::to_string(static_cast<int>(impl)) + " is not automatic, materialized or fused");
    if (static_cast<unsigned>(backend) > static_cast<unsigned>(Backend::simd))
        fail("backend " + std::to_string(static_cast<int>(backend)) + " is not scalar or simd");
    if (threads < 0) fail("threads " + std::to_string(threads) + " is negative");
}

inline void check_causal_alignment(CausalAlignment a) {
    if (static_cast<unsigned>(a) > static_cast<unsigned>(CausalAlignment::bottom_right))
        fail("causal_alignment " + std::to_string(static_cast<int>(a)) + " is not top_left or bottom_right");
}

// A present mask's data shares memory with elements [p, p + n).
template <class T>
inline bool mask_overlaps(const MaskView& m, const T* p, std::size_t n) {
    if (!m.present()) return false;
    return m.type == MaskType::boolean ? detail::overlaps(p, n, m.bools, mask_elements(m))
                                       : detail::overlaps(p, n, m.values, mask_elements(m));
}

// key_padding_mask [B, Lk] and attn_mask [Lq, Lk] or [B·H, Lq, Lk] (H query heads), when present.
inline void check_masks(const MaskView& key_padding_mask, const MaskView& attn_mask, std::size_t B, std::size_t H,
                        std::size_t Lq, std::size_t Lk) {
    if (const MaskView& m = key_padding_mask; m.present()) {
        check_mask_data("key_padding_mask", m);
        if (m.rank != 2 || m.shape[0] != B || m.shape[1] != Lk)
            fail("key_padding_mask has shape " + dims(m) + " but must be [B, Lk] = [" + std::to_string(B) + ", " +
                 std::to_string(Lk) + "]");
        check_mask_extent("key_padding_mask", m);
    }
    if (const MaskView& m = attn_mask; m.present()) {
        check_mask_data("attn_mask", m);
        const bool ok2 = m.rank == 2 && m.shape[0] == Lq && m.shape[1] == Lk;
        const bool ok3 = m.rank == 3 && m.shape[0] % H == 0 && m.shape[0] / H == B &&  // B·H may not fit
                          m.shape[1] == Lq && m.shape[2] == Lk;
        if (!ok2 && !ok3)
            fail("attn_mask has shape " + dims(m) + " but must be [Lq, Lk] = [" + std::to_string(Lq) + ", " +
                 std::to_string(Lk) + "] or [B·H, Lq, Lk] = [" + std::to_string(B * H) + ", " + std::to_string(Lq) +
                 ", " + std::to_string(Lk) + "]");
        check_mask_extent("attn_mask", m);
    }
}

}  // namespace mha::detail
