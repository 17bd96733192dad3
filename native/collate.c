/* trioserve's C collator. The API, its error codes and its contracts are in collate.h;
 * the formats in docs/native.md.
 *
 * Rules kept throughout:
 *   - validate everything first, then write: a failing call leaves its output untouched;
 *   - every size is computed with the checked helpers below (never a bare + or *);
 *   - every read and write is bounded by a size checked in the validation pass;
 *   - no allocation, no global state, no Python API: callers release the GIL.
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "collate.h"

#define TS_TABLE_ENTRY 16u   /* u64 offset + u64 length */
#define TS_U32_MAX 0xFFFFFFFFu

/* ---- checked arithmetic ------------------------------------------------------------ */

static int add_u64(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_add_overflow(a, b, r); }

static int mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_mul_overflow(a, b, r); }

/* Round up to the next multiple of TS_ALIGN. */
static int align_u64(uint64_t a, uint64_t *r)
{
    uint64_t t;
    if (add_u64(a, TS_ALIGN - 1, &t)) {
        return 1;
    }
    *r = t & ~(uint64_t)(TS_ALIGN - 1);
    return 0;
}

/* A memory range [p, p + len) must fit in the address space to be compared at all. */
static int range_ok(const void *p, uint64_t len)
{
    uintptr_t end;
    if (len > (uint64_t)SIZE_MAX) {
        return 0;
    }
    return !__builtin_add_overflow((uintptr_t)p, (uintptr_t)len, &end);
}

/* Do two non-empty ranges overlap? (Both already passed range_ok.) */
static int overlaps(const void *a, uint64_t alen, const void *b, uint64_t blen)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    if (alen == 0 || blen == 0) {
        return 0;
    }
    return a0 < b0 + (uintptr_t)blen && b0 < a0 + (uintptr_t)alen;
}

static void set_bad(uint64_t *bad, uint64_t i)
{
    if (bad != NULL) {
        *bad = i;
    }
}

/* ---- big-endian fields ---------------------------------------------------------------- */

static uint32_t get_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint64_t get_be64(const uint8_t *p)
{
    return ((uint64_t)get_be32(p) << 32) | (uint64_t)get_be32(p + 4);
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* ---- frames ------------------------------------------------------------------------ */

/* Header size: prefix + metadata + u32 count + table; also checks the 32-bit fields. */
static int frame_head(uint64_t meta_len, uint64_t n, uint64_t *head)
{
    uint64_t table;
    if (meta_len > TS_U32_MAX || n > TS_U32_MAX) {
        return TS_E_LIMIT;
    }
    /* Both are below 2**32, so this cannot overflow; checked anyway. */
    if (mul_u64(n, TS_TABLE_ENTRY, &table) || add_u64(TS_FRAME_PREFIX + 4, meta_len, head) ||
        add_u64(*head, table, head)) {
        return TS_E_OVERFLOW;
    }
    return TS_OK;
}

/* Walk the layout: the offset of every blob (stored when offsets != NULL) and the total. */
static int frame_layout(uint64_t meta_len, const uint64_t *lens, uint64_t n, uint64_t *offsets,
                        uint64_t *size, uint64_t *bad)
{
    uint64_t pos, end, i;
    int rc = frame_head(meta_len, n, &pos);
    if (rc != TS_OK) {
        return rc;
    }
    if (n > 0 && lens == NULL) {
        return TS_E_ARG;
    }
    end = pos; /* with no blobs the frame ends after its (empty) table */
    for (i = 0; i < n; i++) {
        if (align_u64(pos, &pos) || add_u64(pos, lens[i], &end)) {
            set_bad(bad, i);
            return TS_E_OVERFLOW;
        }
        if (offsets != NULL) {
            offsets[i] = pos;
        }
        pos = end;
    }
    /* The length field counts everything after itself. */
    if (end - 4 > TS_U32_MAX) {
        return TS_E_LIMIT;
    }
    *size = end;
    return TS_OK;
}

int ts_frame_size(uint64_t meta_len, const uint64_t *lens, uint64_t n, uint64_t *size)
{
    if (size == NULL) {
        return TS_E_ARG;
    }
    return frame_layout(meta_len, lens, n, NULL, size, NULL);
}

int ts_frame_pack(uint8_t kind, uint8_t flags, const uint8_t *meta, uint64_t meta_len,
                  const void *const *ptrs, const uint64_t *lens, uint64_t n, uint8_t *out,
                  uint64_t out_size, uint64_t *written, uint64_t *bad)
{
    uint64_t size, head, pos, off, i;
    uint8_t *p;
    int rc;

    if (written == NULL || (meta_len > 0 && meta == NULL) || out == NULL ||
        !range_ok(out, out_size)) {
        return TS_E_ARG;
    }
    if (n > 0 && ptrs == NULL) {
        return TS_E_ARG;
    }
    rc = frame_layout(meta_len, lens, n, NULL, &size, bad);
    if (rc != TS_OK) {
        return rc;
    }
    if (out_size < size) {
        return TS_E_SHORT;
    }
    if (!range_ok(meta, meta_len)) {
        return TS_E_ARG;
    }
    if (overlaps(out, size, meta, meta_len)) {
        return TS_E_OVERLAP;
    }
    for (i = 0; i < n; i++) {
        if (ptrs[i] == NULL) {
            continue; /* reserved: zero-filled below */
        }
        if (!range_ok(ptrs[i], lens[i])) {
            set_bad(bad, i);
            return TS_E_ARG;
        }
        if (overlaps(out, size, ptrs[i], lens[i])) {
            set_bad(bad, i);
            return TS_E_OVERLAP;
        }
    }

    /* Everything is checked: write. Offsets below are all <= size <= out_size. */
    head = TS_FRAME_PREFIX + 4 + meta_len + n * TS_TABLE_ENTRY; /* checked by frame_layout */
    p = out;
    put_be32(p, (uint32_t)(size - 4));
    p[4] = kind;
    p[5] = flags;
    p[6] = 0;
    p[7] = 0;
    put_be32(p + 8, (uint32_t)meta_len);
    if (meta_len > 0) {
        memcpy(p + TS_FRAME_PREFIX, meta, (size_t)meta_len);
    }
    put_be32(p + TS_FRAME_PREFIX + meta_len, (uint32_t)n);
    pos = head; /* end of what is written so far */
    for (i = 0; i < n; i++) {
        off = (pos + (TS_ALIGN - 1)) & ~(uint64_t)(TS_ALIGN - 1);
        put_be64(p + TS_FRAME_PREFIX + 4 + meta_len + i * TS_TABLE_ENTRY, off);
        put_be64(p + TS_FRAME_PREFIX + 4 + meta_len + i * TS_TABLE_ENTRY + 8, lens[i]);
        if (off > pos) {
            memset(p + pos, 0, (size_t)(off - pos));
        }
        if (lens[i] > 0) {
            if (ptrs[i] == NULL) {
                memset(p + off, 0, (size_t)lens[i]);
            } else {
                memcpy(p + off, ptrs[i], (size_t)lens[i]);
            }
        }
        pos = off + lens[i];
    }
    *written = size;
    return TS_OK;
}

int ts_frame_parse(const uint8_t *buf, uint64_t size, ts_frame_info *info)
{
    uint64_t length, meta_len, meta_end, count, table;

    if (info == NULL || (buf == NULL && size > 0)) {
        return TS_E_ARG;
    }
    if (size < TS_FRAME_PREFIX + 4) {
        return TS_E_SHORT;
    }
    length = get_be32(buf);
    if (length + 4 != size) { /* length < 2**32: no overflow */
        return TS_E_LENGTH;
    }
    meta_len = get_be32(buf + 8);
    meta_end = TS_FRAME_PREFIX + meta_len;
    if (meta_end > size - 4) { /* size >= 16 here */
        return TS_E_META;
    }
    count = get_be32(buf + meta_end);
    table = meta_end + 4;
    if (count > (size - table) / TS_TABLE_ENTRY) {
        return TS_E_COUNT;
    }
    info->kind = buf[4];
    info->flags = buf[5];
    info->meta_offset = TS_FRAME_PREFIX;
    info->meta_length = meta_len;
    info->count = count;
    info->data_start = table + count * TS_TABLE_ENTRY;
    return TS_OK;
}

int ts_frame_blobs(const uint8_t *buf, uint64_t size, uint64_t *offsets, uint64_t *lengths,
                   uint64_t n, uint64_t *bad)
{
    ts_frame_info info;
    uint64_t i, table, off, len;
    int rc = ts_frame_parse(buf, size, &info);

    if (rc != TS_OK) {
        return rc;
    }
    if (info.count != n || (n > 0 && (offsets == NULL || lengths == NULL))) {
        return TS_E_ARG;
    }
    table = info.meta_offset + info.meta_length + 4;
    for (i = 0; i < n; i++) {
        off = get_be64(buf + table + i * TS_TABLE_ENTRY);
        len = get_be64(buf + table + i * TS_TABLE_ENTRY + 8);
        if (off < info.data_start || off > size || len > size - off) {
            set_bad(bad, i);
            return TS_E_BLOB;
        }
        offsets[i] = off;
        lengths[i] = len;
    }
    return TS_OK;
}

/* ---- typed tensors ------------------------------------------------------------------ */

/* Product of factors with a zero short-cut: any zero factor makes the product 0 without
 * looking at the others, so a product is reported as overflowing exactly when its true
 * value exceeds 2**64 - 1. */
static int product_u64(const uint64_t *factors, uint64_t count, uint64_t *r)
{
    uint64_t i, acc = 1;
    for (i = 0; i < count; i++) {
        if (factors[i] == 0) {
            *r = 0;
            return 0;
        }
    }
    for (i = 0; i < count; i++) {
        if (mul_u64(acc, factors[i], &acc)) {
            return 1;
        }
    }
    *r = acc;
    return 0;
}

/* The shape of input i: shapes holds one shape per input, or one shared by all. */
static const int64_t *shape_of(const int64_t *shapes, uint64_t shared, uint64_t ndim, uint64_t i)
{
    return shared ? shapes : shapes + i * ndim; /* i * ndim < n * ndim, checked by the plan */
}

int ts_collate_plan(const int64_t *shapes, uint64_t shape_count, uint64_t n, uint64_t ndim,
                    uint64_t itemsize, ts_plan *plan, uint64_t *bad)
{
    uint64_t i, d, cells, max_rows = 0, row_bytes, nbytes, f[3];
    int ragged = 0;

    if (plan == NULL) {
        return TS_E_ARG;
    }
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        return TS_E_ITEMSIZE;
    }
    if (n == 0) {
        return TS_E_EMPTY;
    }
    if (shape_count != 1 && shape_count != n) {
        return TS_E_ARG;
    }
    if (mul_u64(shape_count, ndim, &cells)) {
        return TS_E_OVERFLOW;
    }
    if (cells > 0 && shapes == NULL) {
        return TS_E_ARG;
    }
    /* Every dimension non-negative, every trailing dimension equal to input 0's. */
    for (i = 0; i < shape_count; i++) {
        const int64_t *shape = shapes + i * ndim;
        for (d = 0; d < ndim; d++) {
            if (shape[d] < 0 || (d > 0 && shape[d] != shapes[d])) {
                set_bad(bad, i);
                return TS_E_SHAPE;
            }
        }
    }
    /* row_bytes = itemsize * prod(trailing), zero short-cut included. */
    row_bytes = itemsize;
    for (d = 1; d < ndim; d++) {
        if (shapes[d] == 0) {
            row_bytes = 0;
            break;
        }
    }
    if (row_bytes != 0) {
        for (d = 1; d < ndim; d++) {
            if (mul_u64(row_bytes, (uint64_t)shapes[d], &row_bytes)) {
                return TS_E_OVERFLOW;
            }
        }
    }
    if (ndim == 0) {
        max_rows = 1;
    } else {
        for (i = 0; i < shape_count; i++) {
            uint64_t rows = (uint64_t)shapes[i * ndim];
            if (rows != (uint64_t)shapes[0]) {
                ragged = 1;
            }
            if (rows > max_rows) {
                max_rows = rows;
            }
        }
    }
    f[0] = n;
    f[1] = max_rows;
    f[2] = row_bytes;
    if (product_u64(f, 3, &nbytes)) {
        return TS_E_OVERFLOW;
    }
    plan->row_bytes = row_bytes;
    plan->max_rows = max_rows;
    plan->nbytes = nbytes;
    plan->ragged = ragged;
    return TS_OK;
}

int ts_collate_check(const void *const *ptrs, const uint64_t *lens, const int64_t *shapes,
                     uint64_t shape_count, uint64_t n, uint64_t ndim, uint64_t itemsize,
                     ts_plan *plan, uint64_t *bad)
{
    uint64_t i, rows, want;
    int rc = ts_collate_plan(shapes, shape_count, n, ndim, itemsize, plan, bad);

    if (rc != TS_OK) {
        return rc;
    }
    if (ptrs == NULL || lens == NULL) {
        return TS_E_ARG;
    }
    for (i = 0; i < n; i++) {
        rows = ndim == 0 ? 1 : (uint64_t)shape_of(shapes, shape_count == 1, ndim, i)[0];
        /* rows <= max_rows and max_rows * row_bytes <= nbytes did not overflow. */
        want = rows * plan->row_bytes;
        if (lens[i] != want) {
            set_bad(bad, i);
            return TS_E_SIZE;
        }
        if (want > 0 && (ptrs[i] == NULL || !range_ok(ptrs[i], want))) {
            set_bad(bad, i);
            return TS_E_ARG;
        }
    }
    return TS_OK;
}

int ts_collate(const void *const *ptrs, const uint64_t *lens, const int64_t *shapes,
               uint64_t shape_count, uint64_t n, uint64_t ndim, uint64_t itemsize, uint8_t *out,
               uint64_t out_size, int64_t *lengths, ts_plan *plan, uint64_t *bad)
{
    uint64_t i, stride, want;
    int rc;

    if (plan == NULL) {
        return TS_E_ARG;
    }
    rc = ts_collate_check(ptrs, lens, shapes, shape_count, n, ndim, itemsize, plan, bad);
    if (rc != TS_OK) {
        return rc;
    }
    if ((out == NULL && out_size > 0) || !range_ok(out, out_size)) {
        return TS_E_ARG;
    }
    if (out_size < plan->nbytes) {
        return TS_E_SHORT;
    }
    for (i = 0; i < n; i++) {
        if (overlaps(out, plan->nbytes, ptrs[i], lens[i])) {
            set_bad(bad, i);
            return TS_E_OVERLAP;
        }
    }

    /* stride * n == nbytes did not overflow, so neither does stride or any i * stride. */
    stride = plan->max_rows * plan->row_bytes;
    for (i = 0; i < n; i++) {
        want = lens[i]; /* <= stride, checked */
        if (stride > 0) { /* out may be NULL when the output is empty */
            uint8_t *dst = out + i * stride;
            if (want > 0) {
                memcpy(dst, ptrs[i], (size_t)want);
            }
            if (stride > want) {
                memset(dst + want, 0, (size_t)(stride - want));
            }
        }
        if (lengths != NULL) {
            lengths[i] = ndim == 0 ? 1 : shape_of(shapes, shape_count == 1, ndim, i)[0];
        }
    }
    return TS_OK;
}

int ts_split(uint64_t size, const int64_t *lengths, uint64_t n, uint64_t row_bytes,
             int64_t stride_rows, uint64_t *offsets, uint64_t *nbytes, uint64_t *bad)
{
    uint64_t i, pos = 0, len, stride = 0, end;

    if (n > 0 && (lengths == NULL || offsets == NULL || nbytes == NULL)) {
        return TS_E_ARG;
    }
    if (stride_rows >= 0 && mul_u64((uint64_t)stride_rows, row_bytes, &stride)) {
        return TS_E_OVERFLOW;
    }
    for (i = 0; i < n; i++) {
        if (lengths[i] < 0 || (stride_rows >= 0 && lengths[i] > stride_rows)) {
            set_bad(bad, i);
            return TS_E_SHAPE;
        }
        if (mul_u64((uint64_t)lengths[i], row_bytes, &len)) {
            set_bad(bad, i);
            return TS_E_OVERFLOW;
        }
        if (stride_rows >= 0 && mul_u64(i, stride, &pos)) {
            set_bad(bad, i);
            return TS_E_OVERFLOW;
        }
        if (add_u64(pos, len, &end)) {
            set_bad(bad, i);
            return TS_E_OVERFLOW;
        }
        if (end > size) {
            set_bad(bad, i);
            return TS_E_SHORT;
        }
        if (stride_rows < 0) {
            pos = end;
        }
    }
    /* The ranges must cover the buffer exactly: a size mismatch is a wrong shape. */
    if (stride_rows < 0) {
        end = pos;
    } else if (mul_u64(n, stride, &end)) {
        return TS_E_OVERFLOW;
    }
    if (end != size) {
        return TS_E_SIZE;
    }

    pos = 0;
    for (i = 0; i < n; i++) {
        len = (uint64_t)lengths[i] * row_bytes;
        offsets[i] = stride_rows < 0 ? pos : i * stride;
        nbytes[i] = len;
        pos += len;
    }
    return TS_OK;
}
