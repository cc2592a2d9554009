# Sinusoidal encodings: write PE rows (a table) or fuse x = x * scale + PE[pos].

from libc.string cimport memcpy


cdef enum:
    # staged PE rows: added to the first stage_early_rows batch rows as they are made,
    # the others stage_late_rows batch rows at a time afterwards. EARLY_ROWS: the early
    # rows of Intel's and Zen 5's staging (below; a Zen 4 takes none). float32 rows made
    # in pairs (and float16 ones where the variant converts in registers) go to the early
    # rows in registers (fpe_pe_rows2_f32), at every batch size: on an Intel Xeon
    # (8, 2048, 1024) took 0.89x the time of none early in the baseline, 0.9-1x
    # in the wide variants, and (4, 2048, 1024) 0.88x. Other rows are added after each is
    # made, and only where the batch has no more rows than that (on a Zen 5 with 1 MiB
    # chunks, batch 8 with none early took 0.86-0.95x the time of 2 early and 3 to 8
    # late; batch 2 both early 0.9x that of none). bfloat16 rows added in registers so
    # (rounded in integers, in element order or split into even and odd elements, or by
    # VCVTNEPS2BF16) took 0.95-1.5x the time of adding them after each pair on that Xeon,
    # batch 1 to 8: their rounding takes the vector ports that making the rows needs. So
    # bfloat16 (where the variant converts in registers) takes its early row after each
    # pair is made: on an Intel Xeon (Emerald Rapids) (8, 2048, 1024) took 0.91-0.94x the
    # time of none early (avx512 and avx2), batch 2 to 16 and dim 4096 0.8-1.0x.
    # One early row, not two: on an Intel Xeon (Emerald Rapids) two rows of a batch, some
    # MiB apart at the same offset in a 4 KiB page, written in turn vector by vector took
    # 1.1-1.6x the time (batch 2 to 8, float32 and float16, every variant).
    EARLY_ROWS = 1
    # staged rows that prefetch the next token's (row_prefetch) go to at most this many
    # batch rows at a time: on an Intel Xeon, (8, 2048, 1024) so took 0.87-0.88x the
    # time of eight rows without the prefetch in float32 (eight with it 1.07-1.15x),
    # 0.84-0.90x in float16 and bfloat16 (eight with it 0.93-0.97x)
    PREFETCH_LATE_ROWS = 4
    CHUNK_TOKENS = 512
    CHUNK_BYTES = 4 << 20
    # Wider rows are made in blocks of this many frequencies, so that the work space
    # of a thread (angles, steps, PE rows) grows with the work, not with dim: one
    # token of a 10**8-wide table needs a few hundred KB, not 32 rows of 800 MB
    FREQ_BLOCK = 4096
    # tables larger than this are written with non-temporal stores (more than the L2
    # and a share of the L3: such a table is not in cache when the call ends anyway)
    STREAM_TABLE_BYTES = 8 << 20


# Staged PE rows, set at import by the CPU's vendor and family (sinusoidal_staging):
# chunks of at most stage_bytes of them, added to stage_early_rows batch rows as they are
# made and stage_late_rows batch rows at a time afterwards. On a Zen 4 (1 MiB of L2; NumPy's x
# on 2 MiB pages) 1 MiB chunks, none early and two rows at a time made (8, 2048, 1024)
# float32 0.92-0.97x the time of one early and four at a time (batch 4 to 16, dim 1024
# and 4096: 0.92-0.99x; (32, 2048, 1024), 256 MiB, 0.98x), bfloat16 0.90-0.99x, float16
# 0.93-0.99x (one shape 1.05-1.07x), interleaved rounds in one process (a C model of both
# forms on the same NumPy x: 0.93x); the rows of the first batch row are still fetched
# for writing as the rows are made. On a Zen 5 (1 MiB of L2) 1 MiB chunks four rows at a
# time made an (8, 2048, 1024) float32 add 0.87-0.9x the time of 256 KiB chunks, float16
# and bfloat16 the same time. On an Intel Xeon (2 MiB of L2) 256 KiB chunks eight rows
# at a time took 0.78-0.92x the time of 1 MiB ones four at a time (batch 2 to 16, dim
# 1024 to 4096, float32 and half precision; avx2 and avx512 variants alike; 128 KiB and
# 512 KiB chunks in between, and early rows added after each row is made, for a batch
# of 8, slower).
cdef Py_ssize_t stage_bytes = 1 << 20
cdef Py_ssize_t stage_late_rows = 4
cdef Py_ssize_t stage_early_rows = EARLY_ROWS


def sinusoidal_staging(object chunk_bytes=None, object late_rows=None,
                       object early_rows=None):
    """(chunk bytes, batch rows at a time, early rows) of the PE rows add_sinusoidal
    stages for several batch rows: chosen at import by the CPU's vendor and family
    (sinusoidal.pxi says why); the arguments set them, for tests. The same bits
    whatever they are."""
    global stage_bytes, stage_late_rows, stage_early_rows
    # every argument checked before any is set: a refused call changes nothing
    for name, value, low, high in (("chunk_bytes", chunk_bytes, 1, 1 << 40),
                                   ("late_rows", late_rows, 1, 64),
                                   ("early_rows", early_rows, 0, 64)):
        if value is not None and (type(value) is not int or not low <= value <= high):
            raise ValueError(f"{name} must be an int in {low}..{high}, got {value!r}")
    if chunk_bytes is not None:
        stage_bytes = chunk_bytes
    if late_rows is not None:
        stage_late_rows = late_rows
    if early_rows is not None:
        stage_early_rows = early_rows
    return stage_bytes, stage_late_rows, stage_early_rows


cdef struct SinusoidalCall:
    char *x                   # (batch, seq, dim) view, element strides below
    Py_ssize_t batch, seq, dim
    Py_ssize_t sb, ss, sd
    const int64_t *pos        # (pos_rows, seq) or NULL for offset + t
    Py_ssize_t pos_rows
    int64_t offset
    const double *w           # inverse wavelengths, nfreq = ceil(dim / 2)
    const double *step_s      # sin(w), cos(w): one token's angle step (NULL when
    const double *step_c      # blocked: each unit makes its block's own)
    Py_ssize_t nfreq
    Py_ssize_t fblock         # frequencies per block: nfreq, or FREQ_BLOCK when wider
    bint split                # [sin | cos] halves instead of interleaved pairs
    bint cos_first            # split as [cos | sin] (even dim)
    bint accumulate           # x * scale + PE, else scale * PE
    double scale
    Py_ssize_t chunk          # tokens per work unit, a multiple of BLOCK_TOKENS
    Py_ssize_t late_rows      # staged rows added to this many batch rows at a time
    Py_ssize_t early_rows     # batch rows that take each staged row as it is made
    bint direct               # PE rows written straight into x (float32/64 table rows)
    bint fused                # one batch row: each PE row added as soon as it is made
    Py_ssize_t ahead          # staged rows (not float64): bytes to the next token's
    #                           row, to prefetch (0: none)
    bint stream               # a direct float32 or float64 interleaved table past the
    #                           caches, one block of frequencies: rows go out with
    #                           non-temporal stores
    bint stream_half          # a float16 or bfloat16 table past the caches, one block of
    #                           frequencies: its float32 rows narrowed with them


cdef inline void pe_row(const double *s, const double *c, real_t *pe, Py_ssize_t dim,
                        Py_ssize_t nfreq, bint split, double mult, Py_ssize_t f0,
                        Py_ssize_t f1) noexcept nogil:
    """The columns of frequencies f0 .. f1 - 1 of one row of the encoding (pe is
    the row), times mult, from the sin/cos of their angles (s[0] is frequency f0)."""
    cdef Py_ssize_t i
    cdef Py_ssize_t ncos = min(dim // 2, f1)
    cdef real_t *pair
    if split:
        for i in range(f1 - f0):
            pe[f0 + i] = <real_t>(s[i] * mult)
        for i in range(ncos - f0):
            pe[nfreq + f0 + i] = <real_t>(c[i] * mult)
    else:
        pair = pe + 2 * f0
        for i in range(ncos - f0):
            pair[2 * i] = <real_t>(s[i] * mult)
            pair[2 * i + 1] = <real_t>(c[i] * mult)
        if f1 > ncos:
            pe[dim - 1] = <real_t>(s[f1 - 1 - f0] * mult)


cdef inline void half_row_stream(store_t *row, const float *pe, Py_ssize_t dim) noexcept nogil:
    """row = pe narrowed, with streaming stores (a.stream_half)."""
    if store_t is fpe_f16:
        fpe_f16_run_stream(pe, row, dim)
    elif store_t is fpe_bf16:
        fpe_bf16_run_stream(pe, row, dim)


cdef inline void add_row(store_t *row, Py_ssize_t sd, const real_t *pe, Py_ssize_t dim,
                         bint accumulate, real_t scale) noexcept nogil:
    """row = row * scale + pe (accumulate) or row = pe."""
    cdef Py_ssize_t j
    if store_t is float or store_t is double:
        if sd == 1:
            if not accumulate:
                for j in range(dim):
                    row[j] = <store_t>pe[j]
            elif scale == 1:
                for j in range(dim):
                    row[j] = <store_t>(row[j] + pe[j])
            else:
                for j in range(dim):
                    row[j] = <store_t>(row[j] * scale + pe[j])
            return
    elif real_t is float and FPE_HALF_ADD_RUNS:
        if sd == 1 and accumulate:
            add_rows_half(row, 1, 0, pe, dim, scale, 0)
            return
    cdef real_t tmp[CONVERT_CHUNK]
    cdef Py_ssize_t j0, n
    if not accumulate:
        scatter(pe, row, sd, dim)
        return
    j0 = 0
    while j0 < dim:
        n = min(<Py_ssize_t>CONVERT_CHUNK, dim - j0)
        gather(row + j0 * sd, sd, tmp, n)
        for j in range(n):
            tmp[j] = tmp[j] * scale + pe[j0 + j]
        scatter(tmp, row + j0 * sd, sd, n)
        j0 += n


cdef inline void madd_rows_two(real_t *r0, real_t *r1, const real_t *pe, Py_ssize_t dim,
                               real_t scale) noexcept nogil:
    """add_row (accumulate, unit stride) on two rows with the same PE row, each row
    whole: element by element in turn, rows of a batch some MiB apart (the same offset
    in a 4 KiB page) took 2-3x the time on an Intel Xeon (Emerald Rapids)."""
    cdef Py_ssize_t j
    if scale == 1:
        for j in range(dim):
            r0[j] = r0[j] + pe[j]
        for j in range(dim):
            r1[j] = r1[j] + pe[j]
    else:
        for j in range(dim):
            r0[j] = r0[j] * scale + pe[j]
        for j in range(dim):
            r1[j] = r1[j] * scale + pe[j]


cdef inline void add_rows_of(const SinusoidalCall *a, store_t *x, Py_ssize_t b, Py_ssize_t n,
                             Py_ssize_t t, const real_t *pe) noexcept nogil:
    """Batch rows b .. b + n - 1 of token t (unit stride) = row * scale + pe, one row
    after another, the n rows in one call where the storage has a loop for that (n
    streams of x in flight), else in pairs and one by one. The same bits as add_row."""
    cdef store_t *row = x + b * a.sb + t * a.ss
    cdef Py_ssize_t r = 0
    if store_t is float and real_t is float:
        r = fpe_f32_madd_rows(row, n, a.sb, pe, a.dim, <float>a.scale, a.ahead)
    elif real_t is float and (store_t is fpe_f16 or store_t is fpe_bf16):
        if FPE_HALF_ADD_RUNS:
            add_rows_half(row, n, a.sb, pe, a.dim, <float>a.scale, a.ahead)
            r = n
    if store_t is float or store_t is double:
        while r + 1 < n:
            if store_t is double and real_t is double:
                madd_rows_two(row + r * a.sb, row + (r + 1) * a.sb, pe, a.dim, a.scale)
            elif store_t is float and real_t is float:
                madd_rows_two(row + r * a.sb, row + (r + 1) * a.sb, pe, a.dim, <float>a.scale)
            r += 2
    while r < n:
        add_row(row + r * a.sb, 1, pe, a.dim, True, <real_t>a.scale)
        r += 1


cdef inline void add_rows_half(store_t *row, Py_ssize_t rows, Py_ssize_t stride,
                               const float *pe, Py_ssize_t dim, float scale,
                               Py_ssize_t ahead) noexcept nogil:
    """row = row * scale + pe on `rows` unit-stride half or bfloat16 rows, stride apart
    (ahead: fpe_f32_madd_rows's), each row whole (as fpe_f32_madd_rows goes)."""
    cdef Py_ssize_t r
    for r in range(rows):
        if store_t is fpe_f16:
            fpe_f16_madd_rows(row + r * stride, 1, 0, pe, dim, scale, ahead)
        elif store_t is fpe_bf16:
            fpe_bf16_madd_rows(row + r * stride, 1, 0, pe, dim, scale, ahead)


cdef inline void add_block(store_t *row, Py_ssize_t sd, const real_t *pe, Py_ssize_t dim,
                           Py_ssize_t nfreq, bint split, Py_ssize_t f0, Py_ssize_t f1,
                           bint accumulate, real_t scale) noexcept nogil:
    """add_row on the columns of frequencies f0 .. f1 - 1 (pe is the whole row)."""
    cdef Py_ssize_t ncos = min(dim // 2, f1)
    if f0 == 0 and f1 == nfreq:
        add_row(row, sd, pe, dim, accumulate, scale)
    elif split:
        add_row(row + f0 * sd, sd, pe + f0, f1 - f0, accumulate, scale)
        if ncos > f0:
            add_row(row + (nfreq + f0) * sd, sd, pe + nfreq + f0, ncos - f0, accumulate,
                    scale)
    else:
        add_row(row + 2 * f0 * sd, sd, pe + 2 * f0, min(2 * f1, dim) - 2 * f0, accumulate,
                scale)


cdef inline void add_columns(store_t *x, Py_ssize_t ss, Py_ssize_t sd, const real_t *pe,
                             Py_ssize_t ntok, Py_ssize_t t0, Py_ssize_t dim, bint accumulate,
                             real_t scale) noexcept nogil:
    """add_row on tokens t0 .. t0 + ntok - 1 (pe rows of dim values), feature by
    feature: each feature's run of tokens is a stride-ss walk through memory."""
    cdef Py_ssize_t j, t
    cdef store_t *col
    cdef real_t kind = 0
    for j in range(dim):
        col = x + j * sd + t0 * ss
        if accumulate:
            for t in range(ntok):
                store(col, t * ss, load(col, t * ss, kind) * scale + pe[t * dim + j])
        else:
            for t in range(ntok):
                store(col, t * ss, pe[t * dim + j])


cdef void sinusoidal_unit(const SinusoidalCall *a, store_t *x, Py_ssize_t unit,
                          char *work) noexcept nogil:
    """A chunk of tokens of one positions row: its PE rows (in place for a
    float32/float64 table with unit stride), then every batch row that uses
    them, in long runs: long runs keep the streams sequential (blocks of
    32 tokens measured 1.8x a streaming pass). Batch rows of unit stride go
    a.early_rows of them as the rows are made, the others a.late_rows at a time over
    the chunk, each vector of a staged row read once for the group: for
    (8, 2048, 1024) float32 that measured 0.75x the time of one batch row
    after another (more streams of x in flight, making the rows overlapped
    with the first group's traffic); groups past 6 rows measured slower
    (rows 2048 tokens apart share cache sets)."""
    cdef Py_ssize_t nchunks = ceil_div(a.seq, a.chunk)
    cdef Py_ssize_t prow = unit // nchunks
    cdef Py_ssize_t t0 = (unit % nchunks) * a.chunk
    cdef Py_ssize_t t1 = min(t0 + a.chunk, a.seq)
    cdef Py_ssize_t b0 = 0 if a.pos_rows == 1 else prow
    cdef Py_ssize_t b1 = a.batch if a.pos_rows == 1 else prow + 1
    # a float32 table streamed out: the angle rows sit at its rows' address modulo 32
    # bytes, so that the vector loops read and write both aligned (NumPy's buffers often
    # start 16 bytes into a line: the angles' every other access then split a cache line,
    # about 5% of an 8192 x 1024 table). A float64 table's pairs take twice the bytes of
    # their angles: no shift aligns both, and its angles stay on 32 bytes. float32 PE
    # rows made for adds sit at x's rows' offset likewise (32 * fblock bytes past the
    # angles), as fpe_f32_madd_rows walks x's rows from a 32-byte boundary.
    cdef size_t shift = 0
    if store_t is float and (a.stream or not a.direct):
        shift = <size_t>(x + b0 * a.sb + t0 * a.ss) & 24
    cdef double *s = <double *>(work + shift)
    cdef double *c = s + a.fblock
    cdef double *step_s = c + a.fblock
    cdef double *step_c = step_s + a.fblock
    cdef float *pe_f = <float *>(step_c + a.fblock)
    cdef double *pe_d = step_c + a.fblock
    cdef Py_ssize_t t, b, r, n, f0, f1
    cdef int64_t p, prev
    cdef double w_max
    # [cos | sin]: the split layout with the two halves' sources swapped (an even dim
    # has as many cosines as sines)
    cdef const double *first = c if a.cos_first else s
    cdef const double *second = s if a.cos_first else c
    cdef double mult = 1.0 if a.accumulate else a.scale
    cdef bint direct = a.direct
    # one batch row, token-major: each PE row (or pair of rows) is added as soon as it
    # is made, while it is in L1 (a chunk of rows made first, then added, makes the
    # data pass twice)
    cdef bint fused = a.fused
    # float32 rows (a table's, staged for an add, or fused) two at a time: fpe_pe_rows2_f32
    cdef bint rows2 = store_t is not double and not a.split and a.fblock == a.nfreq
    # batch rows sharing PE rows, staged (unit stride): up to a.early_rows of them take
    # each row (or pair of rows) as soon as it is made, while it is in L1, so that making
    # the rows, which is arithmetic, overlaps their memory traffic (the comments at the
    # top say where it measured so); the others read the staged rows from the caches
    # afterwards, a.late_rows at a time
    cdef bint staged = not direct and not fused and a.sd == 1 and a.accumulate
    cdef Py_ssize_t early = 0
    if staged and a.fblock == a.nfreq:
        if b1 - b0 <= a.early_rows:
            early = b1 - b0
        elif rows2 and FPE_PE_ROWS2 and (
                store_t is float
                or ((store_t is fpe_f16 or store_t is fpe_bf16) and FPE_HALF_ADD_RUNS)):
            early = a.early_rows
    cdef float *pe0
    cdef float *pe1
    # float32 (float16, where it converts in registers) batch rows that take each pair
    # of rows as it is made, in registers (fpe_pe_rows2_f32 says why): the one batch row
    # of a fused add, or the early rows
    cdef Py_ssize_t nx = 0
    cdef void *xrow
    cdef void *xnext
    if store_t is float or (store_t is fpe_f16 and FPE_HALF_ADD_RUNS):
        nx = 1 if fused and a.sd == 1 and a.accumulate else early
    f0 = 0
    while f0 < a.nfreq:  # one block unless the rows are very wide
        f1 = min(f0 + a.fblock, a.nfreq)
        w_max = fpe_abs_max(a.w + f0, f1 - f0)
        if a.step_s != NULL and shift:
            memcpy(step_s, a.step_s, a.nfreq * sizeof(double))
            memcpy(step_c, a.step_c, a.nfreq * sizeof(double))
        elif a.step_s != NULL:
            step_s, step_c = <double *>a.step_s, <double *>a.step_c
        else:
            fpe_sincos_row(1.0, a.w + f0, step_s, step_c, f1 - f0, 1.0)
        prev = 0
        t = t0
        while t < t1:
            p = position_at(a.pos, prow, a.seq, t, a.offset)
            if (rows2 and t % BLOCK_TOKENS != 0 and p == prev + 1
                    and (t + 1) % BLOCK_TOKENS != 0 and t + 1 < t1
                    and position_at(a.pos, prow, a.seq, t + 1, a.offset) == p + 1):
                # two rows, each one angle-addition step on, as angles_for_token below
                if direct:
                    pe0 = <float *>(x + b0 * a.sb + t * a.ss)
                    pe1 = <float *>(x + b0 * a.sb + (t + 1) * a.ss)
                else:
                    pe0 = pe_f + (0 if fused else (t - t0) * a.dim)
                    pe1 = pe0 + a.dim
                xrow = xnext = NULL
                if nx:
                    xrow = <void *>(x + b0 * a.sb + t * a.ss)
                    xnext = <void *>(x + b0 * a.sb + (t + 1) * a.ss)
                if fpe_pe_rows2_f32(s, c, step_s, step_c, pe0, pe1, a.dim, a.nfreq, mult,
                                    a.stream, xrow, xnext, nx, store_t is fpe_f16, a.sb,
                                    <float>a.scale):
                    if nx:
                        pass
                    elif a.stream_half:
                        half_row_stream(x + b0 * a.sb + t * a.ss, pe0, a.dim)
                        half_row_stream(x + b0 * a.sb + (t + 1) * a.ss, pe1, a.dim)
                    elif fused:
                        add_block(x + b0 * a.sb + t * a.ss, a.sd, pe0, a.dim, a.nfreq,
                                  a.split, 0, a.nfreq, a.accumulate, <float>a.scale)
                        add_block(x + b0 * a.sb + (t + 1) * a.ss, a.sd, pe1, a.dim, a.nfreq,
                                  a.split, 0, a.nfreq, a.accumulate, <float>a.scale)
                    elif early:
                        add_rows_of(a, x, b0, early, t, pe0)
                        add_rows_of(a, x, b0, early, t + 1, pe1)
                    elif not direct and a.sd == 1:
                        prefetch_lines(x + b0 * a.sb + t * a.ss, 0, a.dim * sizeof(store_t), 1)
                        prefetch_lines(x + b0 * a.sb + (t + 1) * a.ss, 0,
                                       a.dim * sizeof(store_t), 1)
                    prev = p + 1
                    t += 2
                    continue
            # reseeded at fixed token indices, whatever the chunk: any thread count
            # and chunk size give the same bits
            angles_for_token(s, c, a.w + f0, w_max, step_s, step_c, f1 - f0, p, prev,
                             t % BLOCK_TOKENS == 0)
            prev = p
            r = 0 if fused else (t - t0) * a.dim
            if store_t is double:
                if a.stream:
                    fpe_pe_row_stream_f64(s, c, <double *>(x + b0 * a.sb + t * a.ss), a.dim,
                                          a.nfreq, mult)
                else:
                    pe_row(first, second,
                           <double *>(x + b0 * a.sb + t * a.ss) if direct else pe_d + r,
                           a.dim, a.nfreq, a.split, mult, f0, f1)
            elif store_t is float:
                if a.stream:
                    fpe_pe_row_stream_f32(s, c, <float *>(x + b0 * a.sb + t * a.ss), a.dim,
                                          a.nfreq, mult)
                else:
                    pe_row(first, second,
                           <float *>(x + b0 * a.sb + t * a.ss) if direct else pe_f + r,
                           a.dim, a.nfreq, a.split, mult, f0, f1)
            else:
                pe_row(first, second, pe_f + r, a.dim, a.nfreq, a.split, mult, f0, f1)
            if a.stream_half:
                half_row_stream(x + b0 * a.sb + t * a.ss, pe_f, a.dim)
            elif fused:
                if store_t is double:
                    add_block(x + b0 * a.sb + t * a.ss, a.sd, pe_d, a.dim, a.nfreq, a.split,
                              f0, f1, a.accumulate, a.scale)
                else:
                    add_block(x + b0 * a.sb + t * a.ss, a.sd, pe_f, a.dim, a.nfreq, a.split,
                              f0, f1, a.accumulate, <float>a.scale)
            elif early:
                if store_t is double:
                    add_rows_of(a, x, b0, early, t, pe_d + r)
                else:
                    add_rows_of(a, x, b0, early, t, pe_f + r)
            elif not direct and a.sd == 1 and f1 == a.nfreq:
                # the arithmetic leaves memory idle: fetch the row the first batch
                # row will add into, so its stream starts warm
                prefetch_lines(x + b0 * a.sb + t * a.ss, 0, a.dim * sizeof(store_t), 1)
            t += 1
        f0 = f1
    if a.stream or a.stream_half:
        fpe_stream_fence()
    if direct or fused:
        return
    if a.sd != 1 and magnitude(a.ss) < magnitude(a.sd):
        # tokens lie closer in memory than features (a transposed x): walk them
        # inner, in memory order
        for b in range(b0, b1):
            if store_t is double:
                add_columns(x + b * a.sb, a.ss, a.sd, pe_d, t1 - t0, t0, a.dim, a.accumulate,
                            a.scale)
            else:
                add_columns(x + b * a.sb, a.ss, a.sd, pe_f, t1 - t0, t0, a.dim, a.accumulate,
                            <float>a.scale)
        return
    b = b0 + early
    if staged:
        while b < b1:
            n = min(a.late_rows, b1 - b)
            for t in range(t0, t1):
                r = (t - t0) * a.dim
                if store_t is double:
                    add_rows_of(a, x, b, n, t, pe_d + r)
                else:
                    add_rows_of(a, x, b, n, t, pe_f + r)
            b += n
        return
    for b in range(b, b1):
        for t in range(t0, t1):
            r = (t - t0) * a.dim
            if store_t is double:
                add_row(x + b * a.sb + t * a.ss, a.sd, pe_d + r, a.dim, a.accumulate, a.scale)
            else:
                add_row(x + b * a.sb + t * a.ss, a.sd, pe_f + r, a.dim, a.accumulate,
                        <float>a.scale)


cdef void sinusoidal_run(const SinusoidalCall *a, store_t *x, Work work,
                         int nthreads) noexcept nogil:
    cdef Py_ssize_t u, nunits = a.pos_rows * ceil_div(a.seq, a.chunk)
    if nthreads > 1:
        for u in prange(nunits, schedule="dynamic", num_threads=nthreads):
            sinusoidal_unit(a, x, u, work_for(work, omp_get_thread_num()))
    else:
        for u in range(nunits):
            sinusoidal_unit(a, x, u, work_for(work, 0))


def sinusoidal_call(object x, object inv_freq, object positions, object offset,
                    double scale, bint split, bint cos_first, bint accumulate,
                    int num_threads):
    """The sinusoidal entry of add_sinusoidal, sinusoidal_table and rope_cos_sin:
    x[b, t] = x[b, t] * scale + PE[pos[b, t]] (accumulate), else scale * PE[pos[b, t]],
    in place, and True; False, with nothing written, for any argument outside what it
    takes (the Python layer then validates the call in full, names what is wrong or
    normalises it, and calls this again). PE rows are interleaved (sin, cos) pairs, or
    split halves [sin | cos] ([cos | sin] with cos_first).

    It takes: x an exact, writable, aligned, native float array of 2 or 3 dimensions
    ((seq, dim) or (batch, seq, dim)) with whole-element strides and disjoint elements;
    inv_freq fastpe's C-contiguous float64 (ceil(dim / 2),) frequencies (not checked:
    they come from fastpe, never from a caller); scale finite (in float32 unless x is
    float64); positions None and offset an int with every position below 2**32, or
    offset 0 and positions as owned_positions() takes them, each below 2**32 (copied
    before they are checked).
    """
    cdef SinusoidalCall a
    cdef Py_ssize_t dims[3]
    cdef Py_ssize_t strides[3]
    cdef int64_t posbuf[POSITIONS_STACK]
    cdef int64_t *pos = NULL
    cdef Py_ssize_t pos_rows = 1
    cdef int code = fast_rows(x, dims, strides)
    if (code < 0 or type(offset) is not int or not (scale - scale == 0)
            or (code != CODE_F64 and not -FLT_MAX <= scale <= FLT_MAX)
            or not cnp.PyArray_CheckExact(inv_freq)):
        return False
    cdef cnp.ndarray wa = <cnp.ndarray>inv_freq
    if (cnp.PyArray_TYPE(wa) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(wa) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(wa) or wa.shape[0] != (dims[2] + 1) // 2):
        return False
    if positions is None:
        if not (0 <= offset and offset + dims[1] <= MAX_ANGLE_POSITION):
            return False
    elif offset != 0:
        return False
    else:
        pos = owned_positions(positions, <cnp.ndarray>x, dims[0], dims[1],
                              MAX_ANGLE_POSITION - 1, posbuf, POSITIONS_STACK,
                              &pos_rows)
        if pos == NULL:
            return False
    a.x = <char *>cnp.PyArray_DATA(<cnp.ndarray>x)
    a.batch, a.seq, a.dim = dims[0], dims[1], dims[2]
    a.sb, a.ss, a.sd = strides[0], strides[1], strides[2]
    a.pos = pos
    a.pos_rows = pos_rows
    a.offset = offset if pos == NULL else 0
    a.w = <const double *>cnp.PyArray_DATA(wa)
    a.nfreq = wa.shape[0]
    a.split = split
    a.cos_first = cos_first
    a.accumulate = accumulate
    a.scale = scale
    try:
        sinusoidal_execute(&a, code, cnp.PyArray_NBYTES(<cnp.ndarray>x), num_threads)
    finally:
        if pos != &posbuf[0]:
            free(pos)
    return True


cdef int sinusoidal_execute(SinusoidalCall *a, int code, Py_ssize_t nbytes,
                            int num_threads) except -1:
    """Choose how the rows are made and shared out, and run every unit; `a` holds the
    call (nbytes: the size of x)."""
    if a.batch == 0 or a.seq == 0 or a.dim == 0:
        return 0
    cdef bint one_row = a.pos_rows > 1 or a.batch == 1  # each unit feeds one batch row
    # PE rows of a chunk stay within CHUNK_BYTES (a few MB of cache); rows staged for
    # several batch rows of unit stride within stage_bytes: each batch row reads them
    # from the caches in a run of that length; transposed rows keep the long chunks
    # their column walks need
    cdef Py_ssize_t chunk_tokens = CHUNK_BYTES // (a.dim * <Py_ssize_t>sizeof(double))
    if not one_row and a.sd == 1:
        chunk_tokens = stage_bytes // (a.dim * (8 if code == CODE_F64 else 4))
    a.chunk = max(<Py_ssize_t>BLOCK_TOKENS, min(<Py_ssize_t>CHUNK_TOKENS, chunk_tokens))
    a.chunk -= a.chunk % BLOCK_TOKENS
    a.late_rows = stage_late_rows
    a.early_rows = stage_early_rows
    a.ahead = 0
    if code != CODE_F64 and row_prefetch_on and a.ss > 0:
        a.ahead = a.ss * (<Py_ssize_t>sizeof(float) if code == CODE_F32 else 2)
        a.late_rows = min(a.late_rows, <Py_ssize_t>PREFETCH_LATE_ROWS)
    cdef Py_ssize_t nunits = a.pos_rows * ceil_div(a.seq, a.chunk)
    cdef int nthreads = units_threads(nunits, num_threads)
    a.direct = ((code == CODE_F32 or code == CODE_F64) and not a.accumulate and a.sd == 1
                and one_row)
    a.fused = (not a.direct and one_row
               and (a.sd == 1 or magnitude(a.ss) >= magnitude(a.sd)))
    # work space grows with the work: PE rows only where they are staged, no more
    # rows than tokens, and angles for one block of frequencies
    cdef Py_ssize_t pe_rows = 0 if a.direct else (2 if a.fused else min(a.chunk, a.seq))
    cdef bint blocked = a.nfreq > FREQ_BLOCK
    a.fblock = FREQ_BLOCK if blocked else a.nfreq
    # direct rows are float32 or float64 ones
    a.stream = a.direct and not a.split and not blocked and nbytes > STREAM_TABLE_BYTES
    a.stream_half = (FPE_HALF_STREAM_ROWS and (code == CODE_F16 or code == CODE_BF16)
                     and a.fused and not a.accumulate and a.sd == 1 and not blocked
                     and nbytes > STREAM_TABLE_BYTES)
    cdef Scratch scratch = Scratch((4 * a.fblock + pe_rows * a.dim) * sizeof(double) + 32,
                                   nthreads, 0 if blocked else 2 * a.nfreq * sizeof(double))
    a.step_s = a.step_c = NULL
    if not blocked:
        a.step_s = <const double *>scratch.shared
        a.step_c = a.step_s + a.nfreq
    if keeps_gil(nthreads, nbytes):
        sinusoidal_run_code(a, code, scratch.work, nthreads, blocked)
    else:
        with nogil:
            sinusoidal_run_code(a, code, scratch.work, nthreads, blocked)
    return 0


cdef void sinusoidal_run_code(SinusoidalCall *a, int code, Work work, int nthreads,
                              bint blocked) noexcept nogil:
    """sinusoidal_run on x of storage `code`, one token's angle step first (unless
    blocked)."""
    if not blocked:
        fpe_sincos_row(1.0, a.w, <double *>a.step_s, <double *>a.step_c, a.nfreq, 1.0)
    if code == CODE_F32:
        sinusoidal_run(a, <float *>a.x, work, nthreads)
    elif code == CODE_F64:
        sinusoidal_run(a, <double *>a.x, work, nthreads)
    elif code == CODE_F16:
        sinusoidal_run(a, <fpe_f16 *>a.x, work, nthreads)
    else:
        sinusoidal_run(a, <fpe_bf16 *>a.x, work, nthreads)
