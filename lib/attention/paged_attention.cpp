// mha::paged_attention (mha/paged_kv_cache.hpp), level 2: validates a caller's pool, block tables, lengths and
// query offsets, then runs the paged core (paged_core.hpp) through the SIMD backend.
#include <cmath>
#include <string>

#include "../core/validate.hpp"
#include "mha/paged_kv_cache.hpp"
#include "kv_cache_access.hpp"
#include "paged_kv_cache_access.hpp"
#include "simd_attention.hpp"
#include "validate_call.hpp"

namespace mha {

using detail::fail;

void paged_attention(const ConstMatrix& q, const PagedKVPool& pool, const PagedSequences& seqs, const Matrix& out,
                     const PagedAttentionOptions& options) {
    auto str = [](std::size_t n) { return std::to_string(n); };
    const std::size_t pool_bytes = detail::check_caller_pool(pool);
    const std::size_t n = seqs.count, bs = pool.block_size, d = pool.head_dim;
    if (n == 0) fail("paged_attention needs at least one sequence");
    if (seqs.block_tables == nullptr || seqs.key_lengths == nullptr || seqs.query_starts == nullptr)
        fail("block_tables, key_lengths and query_starts must not be null");
    if (seqs.query_starts[0] != 0) fail("query_starts[0] is " + str(seqs.query_starts[0]) + ", not 0");
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t q0 = seqs.query_starts[i], q1 = seqs.query_starts[i + 1], L = seqs.key_lengths[i];
        if (q1 <= q0) fail("sequence " + str(i) + " has no query rows (query_starts " + str(q0) + ", " + str(q1) + ")");
        if (q1 - q0 > L)
            fail("sequence " + str(i) + " has " + str(q1 - q0) + " query rows but only " + str(L) + " keys (the queries are its last positions)");
        const std::size_t blocks = L / bs + (L % bs != 0);  // (L + bs − 1) / bs wraps near SIZE_MAX
        if (blocks > seqs.table_stride)
            fail("sequence " + str(i) + " has " + str(L) + " keys in " + str(blocks) + " blocks but table_stride is " + str(seqs.table_stride));
        for (std::size_t b = 0; b < blocks; ++b)
            if (seqs.block_tables[i * seqs.table_stride + b] >= pool.num_blocks)
                fail("block_tables[" + str(i) + "][" + str(b) + "] = " + str(seqs.block_tables[i * seqs.table_stride + b]) +
                     " is not below num_blocks " + str(pool.num_blocks));
    }
    const std::size_t T = seqs.query_starts[n];
    if (q.cols == 0 || q.cols % d != 0 || (q.cols / d) % pool.kv_heads != 0)
        fail("q has " + str(q.cols) + " columns: it must be H·head_dim with H a multiple of kv_heads " + str(pool.kv_heads));
    if (q.rows != T) fail("q has " + str(q.rows) + " rows but query_starts[n] is " + str(T));
    if (out.rows != q.rows || out.cols != q.cols)
        fail("out is " + detail::shape_str(out.rows, out.cols) + " but must be " + detail::shape_str(q.rows, q.cols));
    detail::check_matrix("q", q);
    detail::check_matrix("out", out);
    if (detail::overlaps(q, out)) fail("out overlaps q");
    if (detail::overlaps_pool(pool, pool_bytes, out.data, detail::matrix_elements(out))) fail("out overlaps the pool's keys or values");
    if (!std::isfinite(options.scale) || options.scale < 0.0f) fail("scale " + std::to_string(options.scale) + " is not finite and >= 0");
    if (options.threads < 0) fail("threads " + std::to_string(options.threads) + " is negative");
    detail::check_modifiers(options.modifiers, q.cols / d, "modifiers");
    const float scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(d));
    simd_paged_attention(q, pool, seqs, out, q.cols / d, scale, options.threads, options.modifiers);
}

}  // namespace mha
