/* trioserve's C collator: the whole C API.
 *
 * native/build_collate.py reads this file verbatim as the cffi cdef, so it holds only what
 * cffi's parser accepts: typedefs, an enum, integer #defines and prototypes (no include
 * guards, no includes). collate.c includes <stddef.h> and <stdint.h> before it.
 *
 * Every function validates all of its arguments before it writes to an output buffer, uses
 * overflow-checked arithmetic for every size, and returns TS_OK or one TS_E_* code; a
 * failure leaves `out` untouched (small result arrays and structs may be partly filled).
 * Where an argument names an index (`*bad`), the
 * function stores there the position of the offending blob, input or length (set only on
 * failure, and only where the pointer is not NULL). No function allocates memory, calls
 * Python or keeps state, so calls may run concurrently without the GIL.
 *
 * The formats are documented in docs/native.md.
 */

#define TS_ALIGN 64          /* every blob of a frame starts on a multiple of this offset */
#define TS_FRAME_PREFIX 12   /* u32 length, u8 kind, u8 flags, u16 reserved, u32 meta length */

enum {
    TS_OK = 0,
    TS_E_ARG = 1,        /* a NULL pointer where data is needed, or an impossible argument */
    TS_E_ITEMSIZE = 2,   /* element size other than 1, 2, 4 or 8 */
    TS_E_EMPTY = 3,      /* nothing to collate (no inputs) */
    TS_E_SHAPE = 4,      /* negative dimension, different rank or trailing dimensions */
    TS_E_SIZE = 5,       /* a buffer's size does not match its shape or the lengths */
    TS_E_OVERFLOW = 6,   /* a size computation overflows 64 bits */
    TS_E_SHORT = 7,      /* the output (or input) buffer is too small */
    TS_E_LENGTH = 8,     /* a frame's length field does not match the buffer */
    TS_E_META = 9,       /* a frame's metadata runs past its end */
    TS_E_COUNT = 10,     /* a frame's blob count does not fit in the frame */
    TS_E_BLOB = 11,      /* a blob's offset or length lies outside the frame's blob region */
    TS_E_LIMIT = 12,     /* a frame too large for its 32-bit length or count fields */
    TS_E_OVERLAP = 13    /* the output overlaps an input */
};

/* The fixed part of a frame, as found by ts_frame_parse. */
typedef struct {
    uint8_t kind;
    uint8_t flags;
    uint64_t meta_offset;   /* always TS_FRAME_PREFIX */
    uint64_t meta_length;
    uint64_t count;         /* number of blobs; count * 16 bytes of table fit in the frame */
    uint64_t data_start;    /* first byte after the blob table */
} ts_frame_info;

/* The result of planning a collation. */
typedef struct {
    uint64_t row_bytes;     /* itemsize * product of the trailing dimensions */
    uint64_t max_rows;      /* largest first dimension (1 for rank-0 inputs) */
    uint64_t nbytes;        /* n * max_rows * row_bytes: the output size */
    int ragged;             /* 1 when first dimensions differ: output is padded */
} ts_plan;

/* Buffers are passed as two parallel arrays of n entries, ptrs[i] and lens[i], rather
 * than an array of structs: cffi fills a `void *[]` and a `uint64_t[]` from Python lists
 * several times faster, which matters for batches of small inputs. */

/* ---- frames ------------------------------------------------------------------------ */

/* Size of the frame ts_frame_pack writes for this metadata length and blob lengths. */
int ts_frame_size(uint64_t meta_len, const uint64_t *lens, uint64_t n, uint64_t *size);

/* Write one whole frame (length prefix included) into out[0 .. *written): header,
 * metadata, blob table, zero padding and blobs, each blob at a 64-byte-aligned offset.
 * Every byte of out[0 .. *written) is written. ptrs[i] == NULL reserves lens[i] zero bytes
 * for blob i (to be filled in place later). */
int ts_frame_pack(uint8_t kind, uint8_t flags, const uint8_t *meta, uint64_t meta_len,
                  const void *const *ptrs, const uint64_t *lens, uint64_t n, uint8_t *out,
                  uint64_t out_size, uint64_t *written, uint64_t *bad);

/* Check a frame's fixed part against its size and describe it. */
int ts_frame_parse(const uint8_t *buf, uint64_t size, ts_frame_info *info);

/* Check every blob table entry of the frame (which must hold exactly n blobs) and store
 * the blobs' offsets and lengths, each range lying inside [data_start, size]. */
int ts_frame_blobs(const uint8_t *buf, uint64_t size, uint64_t *offsets, uint64_t *lengths,
                   uint64_t n, uint64_t *bad);

/* ---- typed tensors ------------------------------------------------------------------ */

/* Plan the collation of n row-major inputs of rank ndim. shapes holds shape_count shapes
 * of ndim dimensions each: shape_count == n (input i has shapes[i * ndim .. +ndim)) or
 * shape_count == 1 (every input has that shape: the common, equal-shapes case). */
int ts_collate_plan(const int64_t *shapes, uint64_t shape_count, uint64_t n, uint64_t ndim,
                    uint64_t itemsize, ts_plan *plan, uint64_t *bad);

/* ts_collate_plan, then check each input's size against its shape (lens[i] must be
 * rows_i * row_bytes, rows_i its first dimension, or 1 for rank 0). Lets a caller size
 * the output only once the inputs are known to be right. */
int ts_collate_check(const void *const *ptrs, const uint64_t *lens, const int64_t *shapes,
                     uint64_t shape_count, uint64_t n, uint64_t ndim, uint64_t itemsize,
                     ts_plan *plan, uint64_t *bad);

/* ts_collate_check, then stack (equal shapes) or pad (first dimensions differ; pad bytes
 * are zero) the n inputs into out[0 .. plan->nbytes), input i at
 * out + i * max_rows * row_bytes. If lengths is not NULL it receives the n first
 * dimensions (1 for rank 0). The output must not overlap an input. */
int ts_collate(const void *const *ptrs, const uint64_t *lens, const int64_t *shapes,
               uint64_t shape_count, uint64_t n, uint64_t ndim, uint64_t itemsize, uint8_t *out,
               uint64_t out_size, int64_t *lengths, ts_plan *plan, uint64_t *bad);

/* Slice a batched output of `size` bytes into n per-request ranges of lengths[i] rows of
 * row_bytes each: consecutive (stride_rows < 0) or request i at i * stride_rows rows
 * (padded). The ranges must cover the buffer exactly. */
int ts_split(uint64_t size, const int64_t *lengths, uint64_t n, uint64_t row_bytes,
             int64_t stride_rows, uint64_t *offsets, uint64_t *nbytes, uint64_t *bad);
