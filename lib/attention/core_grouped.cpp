// The attention core's grouped path: per (batch, KV head, query block) the G query heads' rows stacked into
// one [G·rows, d] block against one pass over that KV head's keys, K_hᵀ and V_h packed into GEMM panels once
// per call. Per key tile [j0, j0 + kt) (FlashAttention's online softmax):
//   S = scale·Q_stack·K_tileᵀ, masks added row by row;
//   m_new = max(m, max S_row); P_row = exp(S_row − m_new); l = l·e^(m − m_new) + Σ P_row;
//   O_row = O_row·e^(m − m_new); then O += P·V_tile (GEMM with beta = 1)
//   out rows = O / l (rows with l = 0, every key masked, become 0: zero probabilities).
// Tiles outside the block's visible keys are never visited; a tile whose keys are all padded is skipped.
// Memory per task: G·rows × (d + tile + d) floats.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "../simd/nonfinite.hpp"
#include "../simd/round_bf16.hpp"
#include "core_context.hpp"

namespace mha::detail {
namespace {

constexpr std::size_t kPackBlock = kGroupedPackBlock;

// Each (batch, KV head)'s K_hᵀ and V_h in panels (fp32, or bf16 on the bf16 kernels), in the call's scratch.
class GroupedPanels {
public:
    explicit GroupedPanels(const CoreContext& c)
        : c_(c), isa_(active_isa()), bf16_(on_bf16_kernels(c.operands)), keys_(c.base + c.layout.key_panels),
          values_(c.base + c.layout.value_panels) {
        if (bf16_) {  // the same regions in uint16 elements
            key_stride_ = simd::Bf16Panels::min_panel_stride(c.d);
            value_stride_ = simd::Bf16Panels::min_panel_stride(c.Lk);
            key_head_ = simd::Bf16Panels::elements(c.Lk, key_stride_);
            value_head_ = simd::Bf16Panels::elements(c.d, value_stride_);
        } else {
            key_stride_ = simd::PanelMatrix::min_panel_stride(isa_, c.d);
            value_stride_ = simd::PanelMatrix::min_panel_stride(isa_, c.Lk);
            key_head_ = simd::PanelMatrix::floats(isa_, c.Lk, key_stride_);
            value_head_ = simd::PanelMatrix::floats(isa_, c.d, value_stride_);
        }
    }
    bool bf16() const noexcept { return bf16_; }
    simd::PanelMatrix keys(std::size_t bh) const noexcept { return {keys_ + bh * key_head_, c_.d, c_.Lk, key_stride_, isa_}; }
    simd::PanelMatrix values(std::size_t bh) const noexcept { return {values_ + bh * value_head_, c_.Lk, c_.d, value_stride_, isa_}; }
    simd::Bf16Panels keys16(std::size_t bh) const noexcept { return {keys16_at(bh), c_.d, c_.Lk, key_stride_}; }
    simd::Bf16Panels values16(std::size_t bh) const noexcept { return {values16_at(bh), c_.Lk, c_.d, value_stride_}; }

    // Packs every (batch, KV head)'s keys and values, and sets the value flags while the rows are in cache.
    void pack() const {
        std::uint8_t* flags = c_.value_flags();
        if (flags != nullptr) std::fill(flags, flags + c_.B * c_.Hkv, std::uint8_t{0});
        const std::size_t nj = (c_.Lk + kPackBlock - 1) / kPackBlock;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c_.B * c_.Hkv * nj), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) pack_block(t / nj, (t % nj) * kPackBlock);
        });
    }

private:
    std::uint16_t* keys16_at(std::size_t bh) const noexcept { return reinterpret_cast<std::uint16_t*>(keys_) + bh * key_head_; }
    std::uint16_t* values16_at(std::size_t bh) const noexcept { return reinterpret_cast<std::uint16_t*>(values_) + bh * value_head_; }
    // Keys [j0, j0 + kPackBlock) of (b, kvh) = bh: columns of K_hᵀ (panels j0 / NR..) and rows of V_h.
    void pack_block(std::size_t bh, std::size_t j0) const {
        const std::size_t b = bh / c_.Hkv, kvh = bh % c_.Hkv;
        // Rows past a sequence's keys, or outside every query's window, are never read.
        const KeyRange seen = c_.visible_block(b, 0, c_.Lq);
        if (j0 >= seen.hi || j0 + kPackBlock <= seen.lo) return;
        const std::size_t n = std::min(kPackBlock, c_.keys_of(b) - j0);
        if (c_.keys.is_f32_heads()) {
            pack_rows(bh, j0, c_.p.k.head(b, kvh).row_block(j0, n), c_.p.v.head(b, kvh).row_block(j0, n));
        } else if (packs_runs_in_place()) {  // fp32 rows in blocks: each block's run packed from the pool
            c_.keys.runs(j0, j0 + n, [&](std::size_t j, std::size_t len) {
                if (c_.keys.released(b, j) || c_.values.released(b, j))
                    pack_widened(bh, j, len);  // zeros (masked keys before a window)
                else
                    pack_rows(bh, j, c_.keys.run_view<float>(b, kvh, j, len), c_.values.run_view<float>(b, kvh, j, len));
            });
        } else {  // rows of another format: widened here, a pack block at a time
            pack_widened(bh, j0, n);
        }
        count_kv_rows(2 * n);
    }

    // Keys [j, j + n) of bh (n <= kPackBlock) widened into the slot, then packed.
    void pack_widened(std::size_t bh, std::size_t j, std::size_t n) const {
        const std::size_t b = bh / c_.Hkv, kvh = bh % c_.Hkv;
        const CoreSlot s = c_.slot();
        const Matrix wk(s.widen_rows, n, c_.d, c_.d), wv(s.widen_rows + kPackBlock * c_.d, n, c_.d, c_.d);
        c_.keys.widen(b, kvh, j, j + n, wk);
        c_.values.widen(b, kvh, j, j + n, wv);
        pack_rows(bh, j, wk, wv);
    }

    // fp32 rows in a paged pool whose every block starts a K panel (block_rows a multiple of the panel width; bf16
    // V panels pair rows 2q, 2q + 1, and blocks have even rows): packed run by run, with no widened copy.
    bool packs_runs_in_place() const noexcept {
        if (c_.keys.format->type != DataType::f32 || c_.values.format->type != DataType::f32) return false;
        if (c_.keys.block_table == nullptr || c_.values.block_table == nullptr) return false;
        const std::size_t width = bf16_ ? simd::kBf16PanelWidth : simd::PanelMatrix::panel_width(isa_);
        return c_.keys.block_rows % width == 0 && c_.values.block_rows % width == 0;
    }

    // Rows k, v of keys [j, j + rows) of bh (j a multiple of the K panel width, and even) into the panels, and the
    // value flags while the rows are in cache.
    void pack_rows(std::size_t bh, std::size_t j, ConstMatrix k, ConstMatrix v) const {
        if (bf16_) {  // an odd chunk's last pair gets a zero partner (P·V reads whole pairs)
            simd::pack_panels_bf16(k, Trans::yes, keys16_at(bh) + j / simd::kBf16PanelWidth * key_stride_, key_stride_);
            simd::pack_panels_bf16(v, Trans::no, values16_at(bh) + j * simd::kBf16PanelWidth, value_stride_);
        } else {
            const std::size_t nr = simd::PanelMatrix::panel_width(isa_);
            simd::pack_panels(isa_, k, Trans::yes, keys_ + bh * key_head_ + j / nr * key_stride_, key_stride_);
            simd::pack_panels(isa_, v, Trans::no, values_ + bh * value_head_ + j * nr, value_stride_);
        }
        if (std::uint8_t* flags = c_.value_flags(); flags != nullptr) {  // a NaN/±inf value needs the careful P·V
            bool bad = false;
            for (std::size_t r = 0; r < v.rows && !bad; ++r) bad = simd::any_nonfinite(v.row(r), c_.d);
            if (bad) __atomic_store_n(&flags[bh], std::uint8_t{1}, __ATOMIC_RELAXED);
        }
    }

    const CoreContext& c_;
    Isa isa_;
    bool bf16_;
    float* keys_;
    float* values_;
    std::size_t key_stride_ = 0, value_stride_ = 0, key_head_ = 0, value_head_ = 0;  // bf16: in uint16 elements
};

static_assert(kKeyTileAlign % simd::kBf16PanelWidth == 0, "a key tile must start at a bf16 panel");

void grouped_task(const CoreContext& c, const GroupedPanels& panels, std::size_t b, std::size_t kvh, std::size_t i0,
                  std::size_t rows) {
    constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
    const std::size_t d = c.d, G = c.G, tile = kKeyTile, m = G * rows, bh = b * c.Hkv + kvh;
    const CoreSlot s = c.slot();
    const Matrix q(s.q_stack, m, d, d);
    c.stack_queries(b, kvh, i0, rows, q);
    const Matrix sc(s.scores, m, tile, tile);
    const Matrix o(s.accumulator, m, d, d);
    float* row_max = s.row_stats;
    float* row_sum = row_max + m;
    reset_online_softmax(row_max, row_sum, o);

    const bool use16 = panels.bf16();
    const simd::PanelMatrix k_t = panels.keys(bh), v = panels.values(bh);
    const simd::Bf16Panels k16 = use16 ? panels.keys16(bh) : simd::Bf16Panels{}, v16 = use16 ? panels.values16(bh) : simd::Bf16Panels{};
    const simd::MaskRow padding = c.key_padding_row(b);
    const bool careful = c.value_nonfinite(b, kvh);  // a value is NaN or ±inf: masked keys must be skipped
    const KeyRange block = c.visible_block(b, i0, rows);

    assert(use16 || kKeyTileAlign % simd::PanelMatrix::panel_width(k_t.isa) == 0);  // tiles start at a panel
    for (std::size_t j0 = block.lo / kKeyTileAlign * kKeyTileAlign; j0 < block.hi; j0 += tile) {
        const std::size_t kt = std::min(tile, block.hi - j0);
        if (padding.present() && all_masked(padding.from(j0), kt)) continue;
        const Matrix st = sc.columns(0, kt);
        if (use16)
            simd::gemm_bf16(c.p.scale, ConstMatrix(q), k16.columns(j0, kt), 0.0f, nullptr, st, s.gemm16);
        else
            simd::gemm_panels(c.p.scale, ConstMatrix(q), Trans::no, k_t.columns(j0, kt), 0.0f, st);
        for (std::size_t row = 0; row < m; ++row) {
            const std::size_t t = row / rows, i = i0 + row % rows;
            const float old_max = row_max[row];
            const float tile_sum = c.softmax_tile(b, kvh * G + t, i, j0, st.row(row), kt, row_max[row]);
            if (row_max[row] != old_max && old_max != kMinusInf) {
                // The max grew: rescale what was accumulated under the old max. Under a max of -inf every p was 0,
                // so o is still 0 (or NaN from 0·inf or 0·NaN in V) and the sum 0 (or NaN from a NaN score): a
                // rescale by 0 would keep them.
                const float alpha = std::exp(old_max - row_max[row]);
                row_sum[row] *= alpha;
                simd::scale_row(o.row(row), d, alpha);
            }
            row_sum[row] += tile_sum;
        }
        // P as the input of P·V (the bf16 kernel rounds as it packs).
        if (rounds_to_bf16(c.operands) && (careful || !use16)) simd::round_to_bf16_inplace(st);
        if (careful) {  // unpacked V, masked keys left out
            for (std::size_t t = 0; t < G; ++t)
                c.accumulate_unmasked(b, kvh * G + t, i0, j0, ConstMatrix(st.row_block(t * rows, rows)), o.row_block(t * rows, rows));
        } else if (use16) {
            simd::gemm_bf16(1.0f, ConstMatrix(st), v16.rows(j0, kt), 1.0f, nullptr, o, s.gemm16);
        } else {
            simd::gemm_panels(1.0f, ConstMatrix(st), Trans::no, v.rows(j0, kt), 1.0f, o);
        }
    }

    for (std::size_t row = 0; row < m; ++row) {
        // l = 0: every key masked, the row is 0. A NaN l (NaN scores) stays NaN. A sink joins l here.
        const float inv = c.row_normalizer(kvh * G + row / rows, row_max[row], row_sum[row]);
        float* dst = c.p.out.head(b, kvh * G + row / rows).row(i0 + row % rows);
        const float* src = o.row(row);
        for (std::size_t col = 0; col < d; ++col) dst[col] = src[col] * inv;
    }
}

}  // namespace

void run_grouped(const CoreContext& c) {
    const GroupedPanels panels(c);
    panels.pack();
    const std::size_t qr = group_query_rows(c.G, c.Lq), nqb = (c.Lq + qr - 1) / qr;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c.B * c.Hkv * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t bh = t / nqb, i0 = (t % nqb) * qr;
            grouped_task(c, panels, bh / c.Hkv, bh % c.Hkv, i0, std::min(qr, c.Lq - i0));
        }
    });
}

}  // namespace mha::detail
