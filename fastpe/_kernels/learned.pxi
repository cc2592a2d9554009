# Learned position tables: x[b, t] += table[pos[b, t]].

cdef enum:
    # tokens of one batch row per work unit on strided rows: long runs keep the
    # streams of x and of the table rows sequential (blocks of 32 measured 1.5x a
    # streaming pass, runs of 512 1.25x)
    LEARNED_TOKENS = 512
    # Shared positions, rows of unit stride: a unit is a block of tokens of every
    # batch row (or of a group of them), batch inner, so the block's table rows
    # are read from memory once and from L2 for the other batch rows (batch-major,
    # as NumPy's broadcast add goes, reads the whole table slice once per batch row)
    LEARNED_BLOCK_BYTES = 256 << 10
    # Batch rows of unit stride sharing positions, this many at a time: each vector of a
    # table row read once for all, and as many streams of x in flight. (8, 2048, 1024):
    # 4 at a time measured 0.86x the time of pairs in float32 and 0.93x in float16; 6
    # about the same as 4, 8 slower than pairs (rows 2048 tokens apart share cache sets)
    LEARNED_ROWS = 4


cdef struct LearnedCall:
    Py_ssize_t batch, seq, dim
    Py_ssize_t sb, ss, sd       # x element strides
    Py_ssize_t tr, td           # table element strides
    const int64_t *pos          # (pos_rows, seq) or NULL for offset + t
    Py_ssize_t pos_rows
    int64_t offset
    Py_ssize_t tokens           # tokens per unit
    Py_ssize_t group            # batch rows per unit: 1, or a group walked batch inner


cdef inline void add_table_rows_half(store_t *row, Py_ssize_t rows, Py_ssize_t stride,
                                     const store_t *trow, Py_ssize_t dim,
                                     Py_ssize_t ahead) noexcept nogil:
    """row += trow on `rows` unit-stride half or bfloat16 rows, stride apart (ahead:
    fpe_f32_madd_rows's), each row whole (as fpe_f32_madd_rows goes)."""
    cdef Py_ssize_t r
    for r in range(rows):
        if store_t is fpe_f16:
            fpe_f16_add_rows(row + r * stride, 1, 0, trow, dim, ahead)
        elif store_t is fpe_bf16:
            fpe_bf16_add_rows(row + r * stride, 1, 0, trow, dim, ahead)


cdef inline void add_table_row(store_t *row, Py_ssize_t sd, const store_t *trow,
                               Py_ssize_t td, Py_ssize_t dim) noexcept nogil:
    cdef Py_ssize_t j, j0, n
    cdef float a[CONVERT_CHUNK]
    cdef float b[CONVERT_CHUNK]
    if store_t is float or store_t is double:
        if sd == 1 and td == 1:
            for j in range(dim):
                row[j] = row[j] + trow[j]
            return
        for j in range(dim):
            row[j * sd] = row[j * sd] + trow[j * td]
    else:
        # half and bfloat16 add in float32, rounding once
        if sd == 1 and td == 1 and (store_t is fpe_f16 or FPE_HALF_ADD_RUNS):
            add_table_rows_half(row, 1, 0, trow, dim, 0)
            return
        j0 = 0
        while j0 < dim:
            n = min(<Py_ssize_t>CONVERT_CHUNK, dim - j0)
            gather(row + j0 * sd, sd, a, n)
            gather(trow + j0 * td, td, b, n)
            for j in range(n):
                a[j] = a[j] + b[j]
            scatter(a, row + j0 * sd, sd, n)
            j0 += n


cdef inline void add_table_row_to_two(real_t *r0, real_t *r1, const real_t *trow,
                                      Py_ssize_t dim) noexcept nogil:
    """add_table_row on two unit-stride rows of float32/float64 with the same table row,
    each row whole (as madd_rows_two)."""
    cdef Py_ssize_t j
    for j in range(dim):
        r0[j] = r0[j] + trow[j]
    for j in range(dim):
        r1[j] = r1[j] + trow[j]


cdef void learned_unit(const LearnedCall *a, store_t *x, const store_t *table,
                       Py_ssize_t unit) noexcept nogil:
    """A block of a.tokens tokens of a.group batch rows: one row's run (group 1,
    units batch-major) or every row of the group, batch inner (units token-major)."""
    cdef Py_ssize_t nblocks = ceil_div(a.seq, a.tokens)
    cdef Py_ssize_t ngroups = ceil_div(a.batch, a.group)
    cdef Py_ssize_t b = unit // nblocks
    cdef Py_ssize_t blk = unit % nblocks
    if a.group > 1:
        b, blk = (unit % ngroups) * a.group, unit // ngroups
    cdef Py_ssize_t b1 = min(b + a.group, a.batch)
    cdef Py_ssize_t prow = b if a.pos_rows > 1 else 0
    cdef Py_ssize_t t0 = blk * a.tokens
    cdef Py_ssize_t t1 = min(t0 + a.tokens, a.seq)
    cdef Py_ssize_t t, j
    cdef store_t *col
    cdef float kind = 0
    if a.sd != 1 and magnitude(a.ss) < magnitude(a.sd):
        # tokens lie closer in memory than features (a transposed x): walk them
        # inner, in memory order
        for j in range(a.dim):
            col = x + b * a.sb + j * a.sd
            for t in range(t0, t1):
                if store_t is double:
                    col[t * a.ss] = col[t * a.ss] + table[
                        position_at(a.pos, prow, a.seq, t, a.offset) * a.tr + j * a.td]
                else:
                    store(col, t * a.ss, load(col, t * a.ss, kind) + load(
                        table, position_at(a.pos, prow, a.seq, t, a.offset) * a.tr + j * a.td,
                        kind))
        return
    cdef const store_t *trow
    cdef Py_ssize_t n
    # the next token's rows, prefetched as these are added (fastpe_math.h)
    cdef Py_ssize_t ahead = a.ss * <Py_ssize_t>sizeof(store_t) if (
        row_prefetch_on and a.ss > 0) else 0
    if a.sd == 1 and a.td == 1 and (
            (store_t is float and FPE_ROWS_VECTOR)
            or (store_t is not float and store_t is not double and FPE_HALF_ADD_RUNS)):
        # up to LEARNED_ROWS batch rows a call, one after another: as many streams of x
        # in flight, the table row in L1 for all of them
        while b + 1 < b1:
            n = min(<Py_ssize_t>LEARNED_ROWS, b1 - b)
            for t in range(t0, t1):
                trow = table + position_at(a.pos, prow, a.seq, t, a.offset) * a.tr
                if store_t is float:
                    fpe_f32_madd_rows(x + b * a.sb + t * a.ss, n, a.sb, trow, a.dim, 1.0,
                                      ahead)
                else:
                    add_table_rows_half(x + b * a.sb + t * a.ss, n, a.sb, trow, a.dim, ahead)
            b += n
    if a.sd == 1 and a.td == 1 and (store_t is float or store_t is double or FPE_HALF_ADD_RUNS):
        # two batch rows a call: two streams of x in flight, the table row in L1 for both
        while b + 1 < b1:
            for t in range(t0, t1):
                trow = table + position_at(a.pos, prow, a.seq, t, a.offset) * a.tr
                if store_t is float or store_t is double:
                    add_table_row_to_two(x + b * a.sb + t * a.ss, x + (b + 1) * a.sb + t * a.ss,
                                         trow, a.dim)
                else:
                    add_table_rows_half(x + b * a.sb + t * a.ss, 2, a.sb, trow, a.dim, ahead)
            b += 2
    for b in range(b, b1):
        for t in range(t0, t1):
            add_table_row(x + b * a.sb + t * a.ss, a.sd,
                          table + position_at(a.pos, prow, a.seq, t, a.offset) * a.tr, a.td,
                          a.dim)


cdef void learned_run(const LearnedCall *a, store_t *x, const store_t *table,
                      int nthreads) noexcept nogil:
    cdef Py_ssize_t u, nunits = ceil_div(a.batch, a.group) * ceil_div(a.seq, a.tokens)
    if nthreads > 1:
        for u in prange(nunits, schedule="dynamic", num_threads=nthreads):
            learned_unit(a, x, table, u)
    else:
        for u in range(nunits):
            learned_unit(a, x, table, u)


def learned_call(object x, object table, object positions, object offset, int num_threads):
    """add_learned's compiled entry: x += table[positions] (positions None: rows offset
    to offset + seq) and True for the common case, checked here in C (a mid-sized add
    is then one call, not a dozen Python checks whose code the add itself has evicted
    from the caches); False, with nothing written, for anything else: the general path
    validates, raises or normalises, and calls this again.

    Common case: x an exact, writable, aligned, native float array of 2 or 3
    dimensions with whole-element strides and disjoint elements; table an exact,
    aligned, native 2-D array of the same dtype and width with whole-element strides,
    provably apart from x (views_apart); positions None and offset an int >= 0 with
    offset + seq <= the table's rows (any offset when seq is 0), or
    offset 0 and positions as owned_positions() takes them, every value in [0, rows):
    copied before they are checked (up to POSITIONS_STACK on the stack, more on the
    heap), so that a rewrite by another thread cannot move a read past the table.
    """
    cdef LearnedCall a
    cdef Py_ssize_t dims[3]
    cdef Py_ssize_t strides[3]
    cdef int64_t posbuf[POSITIONS_STACK]
    cdef int64_t *pos = NULL
    cdef Py_ssize_t pos_rows = 1
    cdef int code = fast_rows(x, dims, strides)
    if code < 0 or not cnp.PyArray_CheckExact(table) or type(offset) is not int:
        return False
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef cnp.ndarray ta = <cnp.ndarray>table
    if (cnp.PyArray_NDIM(ta) != 2 or cnp.PyArray_TYPE(ta) != cnp.PyArray_TYPE(xa)
            or not (cnp.PyArray_ISALIGNED(ta) and cnp.PyArray_ISNOTSWAPPED(ta))
            or not whole_element_strides(ta) or ta.shape[1] != dims[2]
            or not views_apart(xa, ta)):
        return False
    if positions is None:
        # every row from offset to offset + seq - 1 in the table (none: any offset),
        # whatever the batch: an empty one does not make the table long enough
        if not (0 <= offset <= INT64_MAX_VALUE) or (
                dims[1] and offset > ta.shape[0] - dims[1]):
            return False
    elif offset != 0:
        return False
    else:
        pos = owned_positions(positions, xa, dims[0], dims[1], ta.shape[0] - 1, posbuf,
                              POSITIONS_STACK, &pos_rows)
        if pos == NULL:
            return False
    a.batch, a.seq, a.dim = dims[0], dims[1], dims[2]
    a.sb, a.ss, a.sd = strides[0], strides[1], strides[2]
    a.tr, a.td = elem_stride(ta, 0), elem_stride(ta, 1)
    a.pos = pos
    a.pos_rows = pos_rows
    a.offset = offset if pos == NULL else 0
    try:
        learned_execute(&a, code, <char *>cnp.PyArray_DATA(xa),
                        <const char *>cnp.PyArray_DATA(ta), cnp.PyArray_ITEMSIZE(ta),
                        num_threads)
    finally:
        if pos != &posbuf[0]:
            free(pos)
    return True


cdef int learned_execute(LearnedCall *a, int code, char *xp, const char *tp,
                         Py_ssize_t itemsize, int num_threads) except -1:
    """Share the rows out into units and run them; `a` holds the call."""
    if a.batch == 0 or a.seq == 0 or a.dim == 0:
        return 0
    a.tokens, a.group = LEARNED_TOKENS, 1
    cdef Py_ssize_t nblocks
    if a.sd == 1 and a.pos_rows == 1 and a.batch > 1:
        a.tokens = max(1, LEARNED_BLOCK_BYTES // (a.dim * itemsize))
        nblocks = ceil_div(a.seq, a.tokens)
        # whole batches per unit while there are blocks enough to share out among
        # the threads, else groups of rows (any split gives the same bits: each
        # element is one addition)
        a.group = ceil_div(a.batch, min(a.batch, ceil_div(4 * max(num_threads, 1), nblocks)))
    cdef int nthreads = units_threads(ceil_div(a.batch, a.group) * ceil_div(a.seq, a.tokens),
                                      num_threads)
    if keeps_gil(nthreads, a.batch * a.seq * a.dim * itemsize):
        learned_run_code(a, code, xp, tp, nthreads)
    else:
        with nogil:
            learned_run_code(a, code, xp, tp, nthreads)
    return 0


cdef void learned_run_code(const LearnedCall *a, int code, char *xp, const char *tp,
                           int nthreads) noexcept nogil:
    """learned_run on x and the table of storage `code`."""
    if code == CODE_F32:
        learned_run(a, <float *>xp, <const float *>tp, nthreads)
    elif code == CODE_F64:
        learned_run(a, <double *>xp, <const double *>tp, nthreads)
    elif code == CODE_F16:
        learned_run(a, <fpe_f16 *>xp, <const fpe_f16 *>tp, nthreads)
    else:
        learned_run(a, <fpe_bf16 *>xp, <const fpe_bf16 *>tp, nthreads)
