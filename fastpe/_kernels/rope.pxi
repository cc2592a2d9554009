# RoPE: rotate feature pairs of q and k in place by angle pos * inv_freq.

cdef struct RopeCall:
    Py_ssize_t batch, seq, half     # half = rotary_dim / 2 = number of frequencies
    Py_ssize_t unit_tokens          # tokens per unit: BLOCK_TOKENS or a run of such blocks
    Py_ssize_t block                # min(seq, unit_tokens)
    Py_ssize_t width                # values per cos/sin table row: half (neox), 2 * half
    Py_ssize_t hq, qb, qs, qh, qd   # q: (batch, seq, hq, head_dim), element strides
    Py_ssize_t hk, kb, ks, kh, kd   # k likewise; hk = 0 when there is no k
    bint q_token_inner              # walk tokens inside heads (tokens closer in memory)
    bint k_token_inner
    bint q_across                   # rows closer in memory than features: rotate_across
    bint k_across
    Py_ssize_t tmp_rows             # rows the rotation's scratch holds: 1, or ACROSS_ROWS
    const int64_t *pos              # (pos_rows, seq) or NULL for offset + t
    Py_ssize_t pos_rows
    int64_t offset
    # multi-axis positions (M-RoPE, 2D vision RoPE): pos is (axes, pos_rows, seq)
    # and frequency pair i rotates by the position on axis pair_axis[i];
    # pair_axis is NULL for one axis
    const int8_t *pair_axis
    Py_ssize_t axes
    # or NULL: the axis of the second feature of each pair where it differs from
    # the first's (HunYuan-VL; rotate_half pairing only)
    const int8_t *pair_axis2
    bint neox                       # pair j with j + half, else 2j with 2j + 1
    # its rows likely in the caches (fpe_rope_cached_bytes): float32 rows 512 bits at a
    # time (avx512 variant), bfloat16 rows inline across heads; else half-precision
    # adjacent pairs prefetched ahead (fastpe_math.h: FPE_ROW_AHEAD)
    bint cached
    # computed angles: inv_freq, one token's step, and the factors on cos and sin
    const double *w
    double w_max                    # max |w[i]|
    const double *step_s
    const double *step_c
    double cos_scale, sin_scale
    # or a cos/sin cache: (rows, half) arrays of storage cache_code; cr0, sr0: bytes
    # from one positions row's cache to the next (transformers' per-token rows of a
    # batch: token_rows), else 0
    const char *cos_cache
    const char *sin_cache
    int cache_code
    Py_ssize_t cc0, cc1, sc0, sc1, cr0, sr0
    bint invert_cache               # rotate by the inverse of the cached matrix


cdef enum:
    # rows of a transposed view rotated together (rotate_across)
    ACROSS_ROWS = 32
    # float32 values in a 64-byte cache line, and the doubles of room rope_block's cos
    # and sin rows (and k's copy of them) take to start at a row's offset from one
    LINE_FLOATS = 16
    LINE_SLACK = 64
    # on AMD CPUs a call whose q and k rows hold at most this many bytes is taken to have
    # them in the caches (fpe_rope_cached_bytes; on Intel CPUs every call): on a Zen 5
    # 512-bit float32 steps took 0.76-0.8x the time of 256-bit steps up to 2 MiB, the
    # same at 8 MiB
    ROPE_CACHED_BYTES = 4 << 20
    # where heads lie one after another: blocks per unit, units per thread at least,
    # and heads rotated a token at a time (rotate_heads)
    TOKEN_INNER_BLOCKS = 8
    UNIT_SHARES = 4
    HEADS_IN_STEP = 8


cdef inline void expand_pairs(real_t *c, real_t *s, Py_ssize_t half) noexcept nogil:
    """cos and sin rows of half values, in place, to one value per feature for
    adjacent pairs: c -> (c0, c0, c1, c1, ...), s -> (-s0, s0, -s1, s1, ...)."""
    cdef Py_ssize_t j
    cdef real_t cj, sj
    for j in range(half - 1, -1, -1):   # from the end: each value moves right
        cj = c[j]
        sj = s[j]
        c[2 * j] = cj
        c[2 * j + 1] = cj
        s[2 * j] = -sj
        s[2 * j + 1] = sj


cdef inline void rotate_row(store_t *row, Py_ssize_t sd, const real_t *c, const real_t *s,
                            Py_ssize_t half, bint neox, bint wide, real_t *tmp) noexcept nogil:
    """Rotate the first 2 * half features of one head row (stride sd): feature j with
    j + half (neox), or adjacent pairs with tables of one value per feature
    (expand_pairs: the same multiply-add on every feature, its partner's value swapped
    in). fastpe_math.h's rotations are inlined into every caller."""
    cdef real_t *x = tmp
    if real_t is float and store_t is fpe_f16:
        if FPE_HALF_ROTATE and sd == 1:
            fpe_rotate_f16(<fpe_f16 *>row, c, s, half, neox)
            return
    if real_t is float and store_t is fpe_bf16:
        if FPE_HALF_ROTATE and sd == 1:
            fpe_rotate_bf16(<fpe_bf16 *>row, c, s, half, neox)
            return
    if sd == 1 and ((store_t is float and real_t is float) or
                    (store_t is double and real_t is double)):
        x = <real_t *>row
    else:
        gather(row, sd, tmp, 2 * half)
    if real_t is float:
        fpe_rotate_f32(x, c, s, half, neox, wide)
    else:
        fpe_rotate_f64(x, c, s, half, neox)
    if x == tmp:
        scatter(tmp, row, sd, 2 * half)


cdef inline void pair_positions(const int64_t *prev, const int8_t *pair_axis, Py_ssize_t half,
                                double *pp) noexcept nogil:
    """pp[i] = the position of pair i: that of its axis, from prev (one per axis)."""
    cdef Py_ssize_t i
    for i in range(half):
        pp[i] = <double>prev[pair_axis[i]]


cdef inline void axis_angles_for_token(const RopeCall *a, const int8_t *pair_axis,
                                       Py_ssize_t prow, Py_ssize_t t, bint first_in_block,
                                       int64_t *prev, double *s, double *c,
                                       double *pp, double *steps, int *steps_moved) noexcept nogil:
    """(s, c) = (sin, cos) of each pair's angle pos[pair_axis[i]] * w[i].

    Within a block, when every axis held its position or moved on by exactly one
    (text tokens; image tokens along a row), the pairs of the axes that moved take
    the angle-addition step of the one-axis kernel and the others keep their
    values; any other jump (a new row, a new image, a new block) forms the angles
    from the positions, in float64, and reduces them afresh. Equal axes therefore
    give the one-axis kernel's values bit for bit.

    steps (room for 2 * half doubles, or NULL) holds the step of each pair for the
    axes that moved, (sin, cos) = (0, 1) for the others, made again only when the set
    of axes that moved (*steps_moved, a bit per axis; -1 before the first) changes:
    along an image row every pair then takes one vectorised step, the pairs of axes
    that held their position exactly (s * 1 + c * 0 is s)."""
    cdef Py_ssize_t ax, i
    cdef int64_t p
    cdef bint fresh = first_in_block, every_axis_moved = True
    cdef bint moved[MAX_AXES]
    cdef double si, ci
    cdef int moved_bits = 0
    for ax in range(a.axes):
        p = a.pos[(ax * a.pos_rows + prow) * a.seq + t]
        if not first_in_block:
            moved[ax] = p == prev[ax] + 1
            every_axis_moved = every_axis_moved and moved[ax]
            fresh = fresh or not (moved[ax] or p == prev[ax])
        prev[ax] = p
    if fresh:
        pair_positions(prev, pair_axis, a.half, pp)
        fpe_sincos(pp, 1, a.w, a.w_max, s, c, a.half, 1.0)
    elif every_axis_moved:
        advance_angles(s, c, a.step_s, a.step_c, a.half)
    elif steps != NULL:
        for ax in range(a.axes):
            if moved[ax]:
                moved_bits |= 1 << ax
        if moved_bits != steps_moved[0]:
            for i in range(a.half):
                steps[i] = a.step_s[i] if moved[pair_axis[i]] else 0.0
                steps[a.half + i] = a.step_c[i] if moved[pair_axis[i]] else 1.0
            steps_moved[0] = moved_bits
        advance_angles(s, c, steps, steps + a.half, a.half)
    else:
        for i in range(a.half):
            if moved[pair_axis[i]]:
                si = s[i]
                ci = c[i]
                s[i] = si * a.step_c[i] + ci * a.step_s[i]
                c[i] = ci * a.step_c[i] - si * a.step_s[i]


cdef inline void cos_sin_rows(const RopeCall *a, Py_ssize_t prow, Py_ssize_t t0, Py_ssize_t t1,
                              real_t *ctab, real_t *stab, double *s, double *c,
                              double *pp) noexcept nogil:
    """cos and sin rows of tokens t0 .. t1 - 1, one row of a.width values per token
    (gptj: expanded, expand_pairs); pp: room for 3 * half doubles (multi-axis
    positions only: the positions and axis_angles_for_token's steps)."""
    cdef Py_ssize_t t, i, r, ax
    cdef int64_t p = 0, prev = 0
    cdef double pt
    cdef int64_t prev_axes[MAX_AXES]
    cdef int steps_moved = -1
    cdef real_t ci, si, norm
    for t in range(t0, t1):
        if a.pair_axis == NULL:
            p = position_at(a.pos, prow, a.seq, t, a.offset)
        r = (t - t0) * a.width
        # a block of one token (a decode row): no token advances from its float64
        # values, so float32 tables take them in float32 from the float64-reduced angle
        # (within 1.5 float32 ulp; a batched decode's (32, 1, 32, 128) angles took 0.6x
        # the time on an Intel Xeon, the whole call 0.93x); multi-axis rows whose axes
        # agree give the one-axis row's bits
        if real_t is float and t1 - t0 == 1 and a.w != NULL:
            if a.pair_axis == NULL:
                pt = <double>p
                fpe_sincos_f32(&pt, 0, a.w, a.w_max, stab + r, ctab + r, a.half,
                               a.sin_scale, a.cos_scale)
            else:
                for ax in range(a.axes):
                    prev_axes[ax] = a.pos[(ax * a.pos_rows + prow) * a.seq + t]
                pair_positions(prev_axes, a.pair_axis, a.half, pp)
                fpe_sincos_f32(pp, 1, a.w, a.w_max, stab + r, ctab + r, a.half,
                               a.sin_scale, a.cos_scale)
        elif a.w != NULL:
            if a.pair_axis != NULL:
                axis_angles_for_token(a, a.pair_axis, prow, t, t == t0, prev_axes, s, c, pp,
                                      pp + a.half, &steps_moved)
            else:
                angles_for_token(s, c, a.w, a.w_max, a.step_s, a.step_c, a.half, p, prev,
                                 t == t0)
                prev = p
            for i in range(a.half):
                ctab[r + i] = <real_t>(c[i] * a.cos_scale)
                stab[r + i] = <real_t>(s[i] * a.sin_scale)
        else:
            gather_code(a.cos_cache + prow * a.cr0 + p * a.cc0, a.cache_code, a.cc1,
                        ctab + r, a.half)
            gather_code(a.sin_cache + prow * a.sr0 + p * a.sc0, a.cache_code, a.sc1,
                        stab + r, a.half)
            if a.invert_cache:
                # the inverse of [[c, -s], [s, c]] is [[c, s], [-s, c]] / (c^2 + s^2)
                for i in range(a.half):
                    ci = ctab[r + i]
                    si = stab[r + i]
                    norm = ci * ci + si * si
                    ctab[r + i] = ci / norm
                    stab[r + i] = -si / norm
        if not a.neox:
            expand_pairs(ctab + r, stab + r, a.half)


cdef inline void rotate_across(store_t *base, Py_ssize_t nrows, Py_ssize_t rs, Py_ssize_t sd,
                               const real_t *ctab, const real_t *stab, Py_ssize_t tab_stride,
                               Py_ssize_t half, bint neox, bint wide, real_t *tmp) noexcept nogil:
    """Rotate nrows rows (stride rs) whose features lie farther apart in memory than
    the rows do (a transposed view): ACROSS_ROWS rows at a time are copied feature
    by feature, each feature's run over the rows in memory order, rotated as rows
    (the arithmetic of rotate_row) and copied back. One row at a time, each of its
    features would be a cache line and a page of its own (26x a streaming pass).
    Row r takes the table row at r * tab_stride (0: heads of one token)."""
    cdef Py_ssize_t r0 = 0, r, f, n, done, w = 2 * half
    cdef real_t kind = 0
    cdef store_t *row0
    while r0 < nrows:
        n = min(<Py_ssize_t>ACROSS_ROWS, nrows - r0)
        row0 = base + r0 * rs
        done = 0
        if store_t is float and real_t is float and rs == 1:
            done = fpe_rows_copy_f32(row0, sd, tmp, w, n, True)
        for f in range(w):
            for r in range(done, n):
                tmp[r * w + f] = load(row0, r * rs + f * sd, kind)
        for r in range(n):
            if real_t is float:
                fpe_rotate_f32(tmp + r * w, ctab + (r0 + r) * tab_stride,
                               stab + (r0 + r) * tab_stride, half, neox, wide)
            else:
                fpe_rotate_f64(tmp + r * w, ctab + (r0 + r) * tab_stride,
                               stab + (r0 + r) * tab_stride, half, neox)
        if store_t is float and real_t is float and rs == 1:
            done = fpe_rows_copy_f32(row0, sd, tmp, w, n, False)
        for f in range(w):
            for r in range(done, n):
                store(row0, r * rs + f * sd, tmp[r * w + f])
        r0 += n


cdef inline void rotate_heads(store_t *base, Py_ssize_t heads, Py_ssize_t sh, Py_ssize_t ss,
                              Py_ssize_t sd, Py_ssize_t ntok, bint token_inner, bint across,
                              const real_t *ctab, const real_t *stab, Py_ssize_t half,
                              Py_ssize_t width, bint neox, bint wide,
                              real_t *tmp) noexcept nogil:
    """Rotate heads x tokens rows starting at `base`, in the order memory runs;
    table rows of `width` values."""
    cdef Py_ssize_t h, t, h0
    if across and token_inner:
        for h in range(heads):
            rotate_across(base + h * sh, ntok, ss, sd, ctab, stab, width, half, neox, wide,
                          tmp)
    elif across:
        for t in range(ntok):
            rotate_across(base + t * ss, heads, sh, sd, ctab + t * width, stab + t * width, 0,
                          half, neox, wide, tmp)
    elif token_inner:
        # HEADS_IN_STEP heads' runs in flight at once, each cos and sin row read once
        # for them all
        h0 = 0
        while h0 < heads:
            for t in range(ntok):
                for h in range(h0, min(h0 + HEADS_IN_STEP, heads)):
                    rotate_row(base + h * sh + t * ss, sd, ctab + t * width,
                               stab + t * width, half, neox, wide, tmp)
            h0 += HEADS_IN_STEP
    else:
        for t in range(ntok):
            for h in range(heads):
                rotate_row(base + h * sh + t * ss, sd, ctab + t * width, stab + t * width,
                           half, neox, wide, tmp)


cdef inline void rotate_tokens_qk(const RopeCall *a, store_t *q, store_t *k, Py_ssize_t ntok,
                                  const real_t *ctab, const real_t *stab,
                                  const real_t *kctab, const real_t *kstab,
                                  real_t *tmp) noexcept nogil:
    """Rotate ntok tokens of q and k (both laid out token by token), head h of q
    beside head h of k: two streams in flight hide more memory latency than one
    after the other. kctab, kstab: the same rows as ctab, stab, placed at k's offset
    from a cache line (float32 rows of unit stride; or ctab, stab). k is NULL where q
    is rotated alone (a.hk 0)."""
    cdef Py_ssize_t t, h, heads = max(a.hq, a.hk)
    cdef const real_t *c
    cdef const real_t *s
    cdef store_t *kt = NULL
    # rows of unit stride, rotated where they are (float16 and bfloat16 widened in
    # registers): every head of a token in one call (fastpe_math.h)
    cdef bint unit = a.qd == 1 and (a.hk == 0 or a.kd == 1)
    cdef bint direct = unit and ((store_t is float and real_t is float)
                                 or (store_t is double and real_t is double))
    for t in range(ntok):
        c = ctab + t * a.width
        s = stab + t * a.width
        if a.hk:
            kt = k + t * a.ks
        if real_t is float and direct:
            fpe_rotate_heads_f32(<float *>(q + t * a.qs), a.hq, a.qh, <float *>kt,
                                 a.hk, a.kh, c, s, kctab + t * a.width, kstab + t * a.width,
                                 a.half, a.neox, a.cached)
            continue
        if real_t is double and direct:
            fpe_rotate_heads_f64(<double *>(q + t * a.qs), a.hq, a.qh,
                                 <double *>kt, a.hk, a.kh, c, s, a.half, a.neox)
            continue
        if real_t is float and store_t is fpe_f16 and FPE_HALF_ROTATE and unit:
            fpe_rotate_heads_f16(<fpe_f16 *>(q + t * a.qs), a.hq, a.qh,
                                 <fpe_f16 *>kt, a.hk, a.kh, c, s, a.half, a.neox,
                                 a.cached)
            continue
        if real_t is float and store_t is fpe_bf16 and FPE_HALF_ROTATE and unit:
            fpe_rotate_heads_bf16(<fpe_bf16 *>(q + t * a.qs), a.hq, a.qh,
                                  <fpe_bf16 *>kt, a.hk, a.kh, c, s, a.half,
                                  a.neox, a.cached)
            continue
        for h in range(heads):
            if h < a.hq:
                rotate_row(q + h * a.qh + t * a.qs, a.qd, c, s, a.half, a.neox, a.cached, tmp)
            if h < a.hk:
                rotate_row(kt + h * a.kh, a.kd, c, s, a.half, a.neox, a.cached, tmp)


cdef inline void rotate_heads_two(store_t *base, Py_ssize_t heads, Py_ssize_t sh,
                                  Py_ssize_t ss, Py_ssize_t sd, Py_ssize_t ntok,
                                  const real_t *tabs, Py_ssize_t half,
                                  real_t *tmp) noexcept nogil:
    """rotate_half pairs whose two features take different angles: x' = x c1 - y s1,
    y' = y c2 + x s2, with tabs holding per token the rows c1, s1, c2, s2."""
    cdef Py_ssize_t h, t, j
    cdef real_t *x = tmp
    cdef real_t *y = tmp + half
    cdef const real_t *r
    cdef real_t u, v
    for h in range(heads):
        for t in range(ntok):
            r = tabs + 4 * half * t
            gather(base + h * sh + t * ss, sd, tmp, 2 * half)
            for j in range(half):
                u = x[j]
                v = y[j]
                x[j] = u * r[j] - v * r[half + j]
                y[j] = v * r[2 * half + j] + u * r[3 * half + j]
            scatter(tmp, base + h * sh + t * ss, sd, 2 * half)


cdef void rope_block_two(const RopeCall *a, store_t *q, store_t *k, Py_ssize_t unit,
                         char *work, real_t kind) noexcept nogil:
    """rope_block for pairs whose features rotate by the positions of two axes
    (pair_axis for the first, pair_axis2 for the second; HunYuan-VL)."""
    cdef Py_ssize_t nblocks = ceil_div(a.seq, a.unit_tokens)
    cdef Py_ssize_t b = unit // nblocks
    cdef Py_ssize_t t0 = (unit % nblocks) * a.unit_tokens
    cdef Py_ssize_t ntok = min(t0 + a.unit_tokens, a.seq) - t0
    cdef Py_ssize_t prow = b if a.pos_rows > 1 else 0
    cdef Py_ssize_t t, i
    cdef double *s1 = <double *>work
    cdef double *c1 = s1 + a.half
    cdef double *s2 = c1 + a.half
    cdef double *c2 = s2 + a.half
    cdef double *pp = c2 + a.half
    cdef real_t *tabs = <real_t *>(pp + a.half)
    cdef real_t *tmp = tabs + 4 * a.block * a.half
    cdef real_t *r
    cdef int64_t prev1[MAX_AXES]
    cdef int64_t prev2[MAX_AXES]
    for t in range(t0, t0 + ntok):
        axis_angles_for_token(a, a.pair_axis, prow, t, t == t0, prev1, s1, c1, pp, NULL, NULL)
        axis_angles_for_token(a, a.pair_axis2, prow, t, t == t0, prev2, s2, c2, pp, NULL,
                              NULL)
        r = tabs + 4 * a.half * (t - t0)
        for i in range(a.half):
            r[i] = <real_t>(c1[i] * a.cos_scale)
            r[a.half + i] = <real_t>(s1[i] * a.sin_scale)
            r[2 * a.half + i] = <real_t>(c2[i] * a.cos_scale)
            r[3 * a.half + i] = <real_t>(s2[i] * a.sin_scale)
    rotate_heads_two(q + b * a.qb + t0 * a.qs, a.hq, a.qh, a.qs, a.qd, ntok, tabs, a.half, tmp)
    if a.hk:
        rotate_heads_two(k + b * a.kb + t0 * a.ks, a.hk, a.kh, a.ks, a.kd, ntok, tabs, a.half,
                         tmp)


cdef void rope_block(const RopeCall *a, store_t *q, store_t *k, Py_ssize_t unit, char *work,
                     real_t kind) noexcept nogil:
    """One unit of tokens of one batch row: cos/sin once (seeded afresh every
    BLOCK_TOKENS tokens), then every q and k head."""
    if a.pair_axis2 != NULL:
        rope_block_two(a, q, k, unit, work, kind)
        return
    cdef Py_ssize_t nblocks = ceil_div(a.seq, a.unit_tokens)
    cdef Py_ssize_t b = unit // nblocks
    cdef Py_ssize_t t0 = (unit % nblocks) * a.unit_tokens
    cdef Py_ssize_t ntok = min(t0 + a.unit_tokens, a.seq) - t0
    cdef double *s = <double *>work
    cdef double *c = s + a.half
    cdef Py_ssize_t rows = a.block * a.width
    cdef real_t *ctab = <real_t *>(c + a.half)
    cdef store_t *first = q + b * a.qb + t0 * a.qs
    if store_t is float and real_t is float:
        # the cos and sin rows at the offset of q's rows from a cache line, so that a
        # row and its cos and sin are read whole lines at a time (fastpe_math.h)
        ctab += (<size_t>first // sizeof(float) - <size_t>ctab // sizeof(float)) % LINE_FLOATS
        rows = round_up(rows, LINE_FLOATS)
    cdef real_t *stab = ctab + rows
    cdef real_t *tmp = stab + rows
    cdef double *pp = c + a.half + 2 * a.block * a.width + 2 * a.half * a.tmp_rows + LINE_SLACK
    cdef store_t *kfirst = NULL
    cdef real_t *kctab = ctab
    cdef real_t *kstab = stab
    cdef Py_ssize_t t = t0
    while t < t0 + ntok:
        cos_sin_rows(a, b if a.pos_rows > 1 else 0, t, min(t + BLOCK_TOKENS, t0 + ntok),
                     ctab + (t - t0) * a.width, stab + (t - t0) * a.width, s, c, pp)
        t += BLOCK_TOKENS
    if store_t is fpe_bf16 and real_t is float and a.w == NULL:
        fpe_f32_nan_tops(ctab, ntok * a.width)   # a caller's cache (fastpe_math.h)
        fpe_f32_nan_tops(stab, ntok * a.width)
    # float32 and float64 q alone (no k, or k in a call of its own) takes the loops of q
    # beside k too: a batched decode's q and k rotated in two calls took 1.32x the time
    # of one call (a row at a time through rotate_heads; on an AMD Zen 4, avx2 kernels,
    # float32 (32, 1, 32, 128)), and 1.1x for a prefill. Half-precision rows alone keep
    # rotate_heads: bfloat16 adjacent pairs there and beside k take a NaN of a caller's
    # cos and sin from different operands (another payload)
    if (not a.q_token_inner and not a.q_across
            and ((a.hk and not a.k_token_inner and not a.k_across)
                 or (a.hk == 0 and (store_t is float or store_t is double)))):
        if a.hk:
            kfirst = k + b * a.kb + t0 * a.ks
            if (store_t is float and real_t is float and a.qd == 1 and a.kd == 1
                    and (<size_t>kfirst - <size_t>first) % (LINE_FLOATS * sizeof(float))):
                # k's rows at another offset from a line than q's: a copy of the rows at
                # k's offset
                kctab = tmp + 2 * a.half * a.tmp_rows
                kctab += (<size_t>kfirst // sizeof(float)
                          - <size_t>kctab // sizeof(float)) % LINE_FLOATS
                kstab = kctab + rows
                memcpy(kctab, ctab, ntok * a.width * sizeof(float))
                memcpy(kstab, stab, ntok * a.width * sizeof(float))
        rotate_tokens_qk(a, first, kfirst, ntok, ctab, stab, kctab, kstab, tmp)
        return
    rotate_heads(first, a.hq, a.qh, a.qs, a.qd, ntok, a.q_token_inner,
                 a.q_across, ctab, stab, a.half, a.width, a.neox, a.cached, tmp)
    if a.hk:
        rotate_heads(k + b * a.kb + t0 * a.ks, a.hk, a.kh, a.ks, a.kd, ntok, a.k_token_inner,
                     a.k_across, ctab, stab, a.half, a.width, a.neox, a.cached, tmp)


cdef void rope_run(const RopeCall *a, store_t *q, store_t *k, Work work,
                   int nthreads) noexcept nogil:
    cdef Py_ssize_t u, nunits = a.batch * ceil_div(a.seq, a.unit_tokens)
    # storage float64 computes in float64, everything else in float32
    cdef double kind_d = 0
    cdef float kind_f = 0
    if nthreads > 1:
        for u in prange(nunits, schedule="dynamic", num_threads=nthreads):
            if store_t is double:
                rope_block(a, q, k, u, work_for(work, omp_get_thread_num()), kind_d)
            else:
                rope_block(a, q, k, u, work_for(work, omp_get_thread_num()), kind_f)
    else:
        for u in range(nunits):
            if store_t is double:
                rope_block(a, q, k, u, work_for(work, 0), kind_d)
            else:
                rope_block(a, q, k, u, work_for(work, 0), kind_f)


cdef enum:
    # decode-sized calls run on a stack buffer: no allocation at all
    STACK_WORK_BYTES = 16384


cdef bint head_view(const View *x, int layout, Py_ssize_t *shape,
                    Py_ssize_t *strides) noexcept:
    """(batch, seq, heads, head_dim) sizes and element strides of x in `layout`;
    False when its strides are not whole elements."""
    cdef int ndim = x.ndim
    cdef Py_ssize_t itemsize = x.itemsize
    cdef int i, src
    # axis of x holding batch, seq, heads, head_dim
    cdef int order[4]
    if layout == LAYOUT_SHD:
        if ndim != 3:
            return False
        shape[0], strides[0] = 1, 0
        for i in range(3):
            if x.strides[i] % itemsize:
                return False
            shape[i + 1], strides[i + 1] = x.shape[i], x.strides[i] // itemsize
        return True
    if ndim != 4:
        return False
    order[0], order[3] = 0, 3
    order[1], order[2] = (2, 1) if layout == LAYOUT_BHSD else (1, 2)
    for i in range(4):
        src = order[i]
        if x.strides[src] % itemsize:
            return False
        shape[i], strides[i] = x.shape[src], x.strides[src] // itemsize
    return True


cdef inline bint rows_across(Py_ssize_t sd, Py_ssize_t ss, Py_ssize_t sh, Py_ssize_t seq,
                             Py_ssize_t heads, bint token_inner) noexcept nogil:
    """Whether the rows walked inner (tokens, else heads) lie closer in memory than the
    features of a row, and are more than one: rotate_across."""
    if token_inner:
        return sd != 1 and seq > 1 and magnitude(ss) < magnitude(sd)
    return sd != 1 and heads > 1 and magnitude(sh) < magnitude(sd)


cdef void rope_setup(RopeCall *a, Py_ssize_t half, const int64_t *pos, Py_ssize_t pos_rows,
                     int64_t offset, bint neox, double cos_scale,
                     double sin_scale) noexcept nogil:
    a.half = half
    a.q_token_inner = magnitude(a.qs) < magnitude(a.qh)
    a.k_token_inner = magnitude(a.ks) < magnitude(a.kh)
    a.q_across = rows_across(a.qd, a.qs, a.qh, a.seq, a.hq, a.q_token_inner)
    a.k_across = rows_across(a.kd, a.ks, a.kh, a.seq, a.hk, a.k_token_inner)
    a.tmp_rows = ACROSS_ROWS if a.q_across or a.k_across else 1
    a.pos, a.pos_rows, a.offset = pos, pos_rows, offset
    a.pair_axis = NULL
    a.pair_axis2 = NULL
    a.axes = 1
    a.neox = neox
    a.cos_scale, a.sin_scale = cos_scale, sin_scale
    a.w = NULL
    a.cos_cache = a.sin_cache = NULL
    a.cache_code = 0
    a.invert_cache = False
    a.cc0 = a.cc1 = a.sc0 = a.sc1 = a.cr0 = a.sr0 = 0


cdef int rope_execute(RopeCall *a, int code, char *qp, char *kp, int num_threads) except -1:
    """Allocate the work space and run every unit; the arguments are complete."""
    if a.batch == 0 or a.seq == 0 or a.half == 0 or (a.hq == 0 and a.hk == 0):
        return 0
    cdef Py_ssize_t blocks = a.batch * ceil_div(a.seq, BLOCK_TOKENS)
    cdef int nthreads = units_threads(blocks, num_threads)
    a.unit_tokens = BLOCK_TOKENS
    if (a.pair_axis2 == NULL and (a.q_token_inner or (a.hk and a.k_token_inner))
            and (a.hq > 1 or a.hk > 1)):
        # heads laid out one after another (transformers' (batch, heads, seq, dim)):
        # each head's rows of a unit are one run of memory. A head at a time over units
        # of 32 tokens took 2x the time of the same bytes laid out (batch, seq, heads,
        # dim) (float32 q (1, 32, 2048, 128), k of 8 heads, on an AMD Zen 4; float16
        # 3.4x); HEADS_IN_STEP heads a token at a time over units of up to
        # TOKEN_INNER_BLOCKS blocks (as many as leave each thread UNIT_SHARES units),
        # 0.97x (float16 1.36x). Units of one block with 8 heads a token at a time took
        # 1.4x the time of units of 8, 16 heads a token at a time 1.7x that of 8 (heads
        # whose strides are multiples of 4 KiB share the L1's sets: likely why). The
        # cos and sin rows are still seeded every BLOCK_TOKENS: the same bits.
        a.unit_tokens = BLOCK_TOKENS * max(1, min(<Py_ssize_t>TOKEN_INNER_BLOCKS,
                                                  blocks // (nthreads * UNIT_SHARES)))
    a.block = min(a.seq, a.unit_tokens)
    a.width = a.half if a.neox else 2 * a.half
    cdef Py_ssize_t row_bytes = (a.batch * a.seq * (a.hq + a.hk) * 2 * a.half
                                 * (2 if code == CODE_F16 or code == CODE_BF16 else
                                    4 if code == CODE_F32 else 8))
    a.cached = row_bytes <= fpe_rope_cached_bytes
    # s, c (double); cos and sin rows of a block and tmp_rows rotated rows (at most
    # double); for multi-axis positions, a row of per-pair positions and two of steps
    # (double)
    cdef Py_ssize_t per_thread = round_up(
        ((2 + 2 * a.tmp_rows + (0 if a.pair_axis == NULL else 3)) * a.half
         + 2 * a.block * a.width + LINE_SLACK) * sizeof(double), 64)
    if a.pair_axis2 != NULL:
        # s, c of both features, positions, the four tables of a block, one row
        per_thread = round_up((7 * a.half + 4 * a.block * a.half) * sizeof(double), 64)
    cdef bint steps = a.w != NULL and a.seq > 1
    cdef Py_ssize_t shared = 2 * a.half * sizeof(double) if steps else 0
    cdef char stack[STACK_WORK_BYTES + 64]
    cdef Scratch heap = None
    cdef Work work
    cdef char *shared_base
    if nthreads == 1 and per_thread + shared <= STACK_WORK_BYTES:
        work.base = <char *>((<size_t>stack + 63) & ~(<size_t>63))
        work.per_thread = per_thread
        shared_base = work.base + per_thread
    else:
        heap = Scratch(per_thread, nthreads, shared)
        work = heap.work
        shared_base = heap.shared
    a.step_s = <const double *>shared_base
    a.step_c = a.step_s + a.half
    if keeps_gil(nthreads, row_bytes):
        rope_run_code(a, code, qp, kp, work, nthreads, steps)
    else:
        with nogil:
            rope_run_code(a, code, qp, kp, work, nthreads, steps)
    return 0


cdef void rope_run_code(RopeCall *a, int code, char *qp, char *kp, Work work, int nthreads,
                        bint steps) noexcept nogil:
    """rope_run on q and k of storage `code`, one token's angle step first."""
    if steps:
        fpe_sincos_row(1.0, a.w, <double *>a.step_s, <double *>a.step_c, a.half, 1.0)
    if code == CODE_F32:
        rope_run(a, <float *>qp, <float *>kp, work, nthreads)
    elif code == CODE_F64:
        rope_run(a, <double *>qp, <double *>kp, work, nthreads)
    elif code == CODE_F16:
        rope_run(a, <fpe_f16 *>qp, <fpe_f16 *>kp, work, nthreads)
    else:
        rope_run(a, <fpe_bf16 *>qp, <fpe_bf16 *>kp, work, nthreads)


cdef bint read_ints(object seq_, Py_ssize_t n, int64_t *out) noexcept:
    """A list or tuple of n Python ints >= 0 into out; False for anything else."""
    cdef Py_ssize_t i
    cdef int overflow
    cdef object v
    if not (type(seq_) is list or type(seq_) is tuple) or len(seq_) != n:
        return False
    for i in range(n):
        v = seq_[i]
        if type(v) is not int:
            return False
        out[i] = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow or out[i] < 0:
            return False
    return True


cdef Py_ssize_t read_position_list(object positions, Py_ssize_t batch, Py_ssize_t seq,
                                   int64_t *out) noexcept:
    """Rows of positions given as a list (seq,) of Python ints or a list of 1 or
    batch such lists (tuples too), read into out; 0 for anything else (the
    general path then reads them, or names the problem)."""
    cdef Py_ssize_t r, rows = len(positions)
    if read_ints(positions, seq, out):
        return 1
    if seq == 0 or not (rows == 1 or rows == batch) or rows * seq > POSITIONS_STACK:
        return 0
    for r in range(rows):
        if not read_ints(positions[r], seq, out + r * seq):
            return 0
    return rows


cdef int fast_arrays(RopeCall *a, const View *q, const View *k, object positions,
                     const View *pv, int64_t offset, int layout, int64_t *max_position,
                     int64_t *buf, int64_t **heap) noexcept:
    """The storage code of q when q, k (or NULL) and positions are the plain common
    case (below), with their shapes, strides and positions filled into `a` and the
    largest position into max_position; -1, having touched nothing, otherwise.

    Common case: q and k writable, aligned, native float views of one dtype in
    `layout` with whole-element strides and disjoint elements, whose memory is
    provably apart from each other's (apart_views), matching in batch, seq and
    head_dim; positions None with offset >= 0, a list or tuple of at most
    POSITIONS_STACK ints >= 0 (read_position_list), or an integer view pv as
    owned_view_positions() takes it, its byte range apart from k's too. Positions are
    copied before they are checked: into buf, or past POSITIONS_STACK values into a
    malloc'd *heap the caller frees.
    """
    cdef Py_ssize_t qshape[4]
    cdef Py_ssize_t qstr[4]
    cdef Py_ssize_t kshape[4]
    cdef Py_ssize_t kstr[4]
    cdef int code = view_code(q)
    cdef int64_t *pos = NULL
    cdef Py_ssize_t pos_rows = 1
    if code < 0:
        return -1
    if not head_view(q, layout, qshape, qstr) or not view_elements_disjoint(q):
        return -1
    if k != NULL:
        if view_code(k) != code:
            return -1
        if not head_view(k, layout, kshape, kstr) or not view_elements_disjoint(k):
            return -1
        if kshape[0] != qshape[0] or kshape[1] != qshape[1] or kshape[3] != qshape[3]:
            return -1
        if not apart_views(q, k):
            return -1  # maybe overlapping: the general path decides exactly
    if positions is None:
        if offset < 0 or offset > INT64_MAX_VALUE - qshape[1]:
            return -1
    else:
        if offset != 0:
            return -1
        if pv == NULL:
            if qshape[1] > POSITIONS_STACK:
                return -1
            pos_rows = read_position_list(positions, qshape[0], qshape[1], buf)
            if pos_rows == 0:
                return -1
            pos = buf
        else:
            if k != NULL and views_overlap(k, pv):
                return -1
            pos = owned_view_positions(pv, q, qshape[0], qshape[1], INT64_MAX_VALUE, buf,
                                       POSITIONS_STACK, &pos_rows)
            if pos == NULL:
                return -1
            if pos != buf:
                heap[0] = pos
    return fast_finish(a, qshape, qstr, kshape, kstr, k != NULL, pos, pos_rows, offset,
                       max_position, code)


cdef int fast_finish(RopeCall *a, Py_ssize_t *qshape, Py_ssize_t *qstr, Py_ssize_t *kshape,
                     Py_ssize_t *kstr, bint has_k, const int64_t *pos, Py_ssize_t pos_rows,
                     int64_t offset, int64_t *max_position, int code) noexcept:
    """fast_arrays' last step: fill in `a` and the largest position; returns code."""
    cdef Py_ssize_t i, n = pos_rows * qshape[1]
    cdef int64_t hi = -1
    if pos == NULL:
        hi = offset + qshape[1] - 1
    for i in range(n if pos != NULL else 0):
        hi = max(hi, pos[i])
    a.batch, a.seq, a.hq = qshape[0], qshape[1], qshape[2]
    a.qb, a.qs, a.qh, a.qd = qstr[0], qstr[1], qstr[2], qstr[3]
    a.hk = a.kb = a.ks = a.kh = a.kd = 0
    if has_k:
        a.hk = kshape[2]
        a.kb, a.ks, a.kh, a.kd = kstr[0], kstr[1], kstr[2], kstr[3]
    rope_setup(a, 0, pos, pos_rows, offset, False, 1.0, 1.0)
    max_position[0] = hi
    return code


cdef int cache_code_of(const View *x) noexcept:
    """Storage code of an aligned, native float view with whole-element strides
    (read-only is fine), else -1."""
    if not (x.aligned and x.native and view_whole_strides(x)):
        return -1
    return float_code(x.typenum)


cdef bint dynamic_ntk_inv_freq(const double *plain, Py_ssize_t half, double factor,
                               int64_t original, int64_t length, double *out) noexcept nogil:
    """Dynamic NTK inverse frequencies of `length` > `original` positions into
    out[:half], from the plain ones of 2 <= half <= DYNAMIC_PAIRS_STACK pairs, as
    fastpe._rope_scaling._dynamic_inv_freq forms them: the same operations in the
    same order, with the C library's log and exp as there (math.log, math.exp),
    hence the same bits. False when the growth is not positive or a frequency is
    outside [0, MAX_INV_FREQ]: the Python function then raises, or decides."""
    cdef double low[DYNAMIC_SPLIT]
    cdef double high[DYNAMIC_BLOCKS]
    cdef Py_ssize_t i
    cdef double growth = factor * <double>length / <double>original - (factor - 1.0)
    cdef double step, w
    if not growth > 0.0:
        return False
    step = log(growth) / <double>(half - 1)
    for i in range(DYNAMIC_SPLIT):
        low[i] = exp(-(<double>i * step))
    for i in range(ceil_div(half, DYNAMIC_SPLIT)):
        high[i] = exp(-(<double>(DYNAMIC_SPLIT * i) * step))
    for i in range(half):
        w = plain[i] * high[i // DYNAMIC_SPLIT] * low[i % DYNAMIC_SPLIT]
        if not 0.0 <= w <= MAX_INV_FREQ:
            return False
        out[i] = w
    return True


cdef Py_ssize_t dynamic_ntk_pairs(object plain, double factor, int64_t original,
                                  int64_t length, double *out) noexcept:
    """dynamic_ntk_inv_freq from a plain float64 vector of 2 to DYNAMIC_PAIRS_STACK
    pairs: their number, or 0 having formed nothing usable."""
    cdef cnp.ndarray pa
    if not cnp.PyArray_CheckExact(plain):
        return 0
    pa = <cnp.ndarray>plain
    if (cnp.PyArray_TYPE(pa) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(pa) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(pa)
            or not 2 <= pa.shape[0] <= DYNAMIC_PAIRS_STACK or original < 1):
        return 0
    if not dynamic_ntk_inv_freq(<const double *>cnp.PyArray_DATA(pa), pa.shape[0], factor,
                                original, length, out):
        return 0
    return pa.shape[0]


def dynamic_ntk_frequencies(object plain, double factor, int64_t original, int64_t length,
                            cnp.ndarray out):
    """dynamic_ntk_inv_freq into `out`, a writable C-contiguous float64 vector the
    size of `plain`, apart from it: True when it formed them all."""
    if (cnp.PyArray_TYPE(out) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(out) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out)
            or not cnp.PyArray_CheckExact(plain) or out.shape[0] != cnp.PyArray_SIZE(
                <cnp.ndarray>plain) or extents_overlap(out, <cnp.ndarray>plain)):
        return False
    return dynamic_ntk_pairs(plain, factor, original, length,
                             <double *>cnp.PyArray_DATA(out)) > 0


cdef inline char *data_or_null(const View *x) noexcept:
    return NULL if x == NULL else x.data


cdef bint apart(const View *x, const View *q, const View *k) noexcept:
    """Whether x's bytes are apart from q's and (when there is one) k's."""
    return apart_views(q, x) and (k == NULL or apart_views(k, x))


cdef int rope_with_frequencies(RopeCall *a, int code, const View *q, const View *k,
                               bint neox, const double *w, Py_ssize_t half, double cos_scale,
                               double sin_scale, int num_threads) except -1:
    """Rotate with the frequencies w[:half] (not in q or k), once fast_arrays() has
    filled `a` and returned storage `code` (>= 0) for positions below
    MAX_ANGLE_POSITION: 1 when it rotated, 0 having touched nothing when the
    frequencies or the scaling are not the plain case."""
    cdef double w_max
    if half == 0 or 2 * half > q.shape[q.ndim - 1]:
        return 0
    w_max = fpe_abs_max_nan(w, half)
    if not w_max <= MAX_INV_FREQ:  # NaN, infinite, or past finite angles
        return 0
    a.half = half
    a.w = w
    a.w_max = w_max
    a.neox = neox
    a.cos_scale, a.sin_scale = cos_scale, sin_scale
    rope_execute(a, code, q.data, data_or_null(k), num_threads)
    return 1


cdef const double *frequency_data(object inv_freq, const View *q, const View *k,
                                  Py_ssize_t *half) noexcept:
    """inv_freq's values when it is an exact C-contiguous float64 vector apart from q
    and k (its length into half), else NULL."""
    cdef View wv
    if not cnp.PyArray_CheckExact(inv_freq) or not array_view(<cnp.ndarray>inv_freq, &wv):
        return NULL
    if (wv.typenum != cnp.NPY_DOUBLE or wv.ndim != 1 or not wv.c_contiguous
            or not apart(&wv, q, k)):
        return NULL
    half[0] = wv.shape[0]
    return <const double *>wv.data


ctypedef fused bits_t:
    uint16_t
    uint32_t
    uint64_t


cdef bint rows_repeat(const char *base, Py_ssize_t d0, Py_ssize_t d1, Py_ssize_t s0,
                      Py_ssize_t s1, Py_ssize_t n, Py_ssize_t sl, bint neox,
                      bits_t kind) noexcept nogil:
    cdef Py_ssize_t i0, i1, j, half = n // 2
    cdef Py_ssize_t second = half * sl if neox else sl
    cdef Py_ssize_t step = sl if neox else 2 * sl
    cdef const char *row
    for i0 in range(d0):
        for i1 in range(d1):
            row = base + i0 * s0 + i1 * s1
            for j in range(half):
                if (<const bits_t *>(row + j * step))[0] != (<const bits_t *>(
                        row + j * step + second))[0]:
                    return False
    return True


cdef bint halves_repeat(const char *p, int nd, const Py_ssize_t *dims, const Py_ssize_t *st,
                        Py_ssize_t isz, bint neox) noexcept nogil:
    """Whether every row of an aligned array of 1 to 3 dims (its last axis, of even
    length) holds each frequency's value twice, bit for bit: its first half again in its
    second (neox), or each even feature in the odd one after it (transformers' per-token
    cos and sin). False also for items of other than 2, 4 or 8 bytes."""
    if nd < 1 or nd > 3 or dims[nd - 1] % 2:
        return False
    cdef Py_ssize_t n = dims[nd - 1], sl = st[nd - 1]
    cdef Py_ssize_t d0 = dims[0] if nd == 3 else 1, s0 = st[0] if nd == 3 else 0
    cdef Py_ssize_t d1 = dims[nd - 2] if nd >= 2 else 1, s1 = st[nd - 2] if nd >= 2 else 0
    if isz == 2:
        return rows_repeat(p, d0, d1, s0, s1, n, sl, neox, <uint16_t>0)
    if isz == 4:
        return rows_repeat(p, d0, d1, s0, s1, n, sl, neox, <uint32_t>0)
    if isz == 8:
        return rows_repeat(p, d0, d1, s0, s1, n, sl, neox, <uint64_t>0)
    return False


def repeated_halves(cnp.ndarray a, bint neox):
    """halves_repeat of an ndarray: one pass, nothing allocated; False also for one it
    does not walk (unaligned, items of other than 2, 4 or 8 bytes, more than 3 dims),
    which the caller then checks by value."""
    if not cnp.PyArray_ISALIGNED(a):
        return False
    return halves_repeat(<const char *>cnp.PyArray_DATA(a), cnp.PyArray_NDIM(a),
                         <const Py_ssize_t *>cnp.PyArray_DIMS(a),
                         <const Py_ssize_t *>cnp.PyArray_STRIDES(a), cnp.PyArray_ITEMSIZE(a),
                         neox)


cdef bint token_rows(RopeCall *a, const View *cos, const View *sin, const View *q,
                     const View *k, bint neox) noexcept:
    """Fill `a` with transformers' per-token cos and sin, lined up with q's tokens (a's
    positions: offset 0, no array): (seq, 2 * half) or (rows, seq, 2 * half) views of one
    shape and float dtype, rows 1 or q's batch, 2 * half <= head_dim, apart from q and k,
    each frequency's value held twice bit for bit as `neox` pairs features; the cache is
    their first halves (or even features), read in place. False otherwise: the
    validating path then checks the values (a zero of either sign held twice) or names
    what is wrong."""
    cdef int code = cache_code_of(cos)
    cdef int nd = cos.ndim
    cdef Py_ssize_t i, rows, n
    if code < 0 or cache_code_of(sin) != code or sin.ndim != nd or (nd != 2 and nd != 3):
        return False
    for i in range(nd):
        if cos.shape[i] != sin.shape[i]:
            return False
    n = cos.shape[nd - 1]
    rows = cos.shape[0] if nd == 3 else 1
    if (n == 0 or n % 2 or n > q.shape[q.ndim - 1] or cos.shape[nd - 2] != a.seq
            or (rows != 1 and rows != a.batch) or not apart(cos, q, k)
            or not apart(sin, q, k)
            or not halves_repeat(cos.data, nd, cos.shape, cos.strides, cos.itemsize, neox)
            or not halves_repeat(sin.data, nd, sin.shape, sin.strides, sin.itemsize, neox)):
        return False
    a.half = n // 2
    a.cos_cache = cos.data
    a.sin_cache = sin.data
    a.cache_code = code
    a.cc0, a.sc0 = cos.strides[nd - 2], sin.strides[nd - 2]
    a.cc1 = (1 if neox else 2) * (cos.strides[nd - 1] // cos.itemsize)
    a.sc1 = (1 if neox else 2) * (sin.strides[nd - 1] // sin.itemsize)
    if rows > 1:
        a.pos_rows = rows
        a.cr0, a.sr0 = cos.strides[0], sin.strides[0]
    return True


cdef bint cached_rows(RopeCall *a, const View *cos, const View *sin, const View *q,
                      const View *k, int64_t hi) noexcept:
    """Fill `a` with the cos/sin cache when cos and sin are 2-D views of one shape
    (rows, half) and one float dtype (any of q's), aligned, native, with whole-element
    strides, apart from q and k, 2 * half <= head_dim and every position (the largest
    is hi) < rows; False otherwise."""
    if cos == NULL or sin == NULL:
        return False
    cdef int cache_code = cache_code_of(cos)
    if cache_code < 0 or cache_code_of(sin) != cache_code:
        return False
    if (cos.ndim != 2 or sin.ndim != 2 or cos.shape[1] == 0
            or cos.shape[0] != sin.shape[0] or cos.shape[1] != sin.shape[1]
            or 2 * cos.shape[1] > q.shape[q.ndim - 1]
            or hi >= cos.shape[0] or not apart(cos, q, k) or not apart(sin, q, k)):
        return False
    a.half = cos.shape[1]
    a.cos_cache = cos.data
    a.sin_cache = sin.data
    a.cache_code = cache_code
    a.cc0, a.sc0 = cos.strides[0], sin.strides[0]
    a.cc1, a.sc1 = cos.strides[1] // cos.itemsize, sin.strides[1] // sin.itemsize
    return True


@cython.auto_pickle(False)
cdef class RopeState:
    """One RoPE configuration as rope_call reads it: built once per configuration by
    fastpe.rope (which caches it by value, RopeStates) and never changed.

    head_dim: q's last axis (-1: any). flip: rotate by -angle (a model that does).
    inv_freq, att: the frequencies (float64, C-contiguous) and the attention scaling of
    cos and sin. switch: -1 when they do not depend on the call; else the original
    length, past which n = max(positions) + 1 (as Hugging Face's dynamic NTK and
    LongRoPE) selects `past`: dynamic NTK's factor (a float: the frequencies are formed
    here from inv_freq, the same bits as fastpe._rope_scaling), a (inv_freq, att) pair
    (LongRoPE's long factors, dynamic NTK's single pair), or None when they could not be
    formed (rope_call then declines the calls past the original length).
    pair_axis: None, or for multi-axis positions (M-RoPE, 2D vision RoPE) the axis of
    each frequency pair, int8, C-contiguous, one per frequency; positions are then
    (axes, 1 or batch, seq) and pair i rotates by the position on axis pair_axis[i].
    pair_axis2: None, or with pair_axis and the neox style the axis of each pair's second
    feature (HunYuan-VL; its first takes pair_axis[i]); such a state does not rotate by
    -angle (its two features turn by different angles: no rotation to invert).
    axes: the position axes, pair_axis's positions' first dimension.
    """
    cdef readonly Py_ssize_t head_dim
    cdef readonly bint flip
    cdef readonly object inv_freq
    cdef readonly double att
    cdef readonly int64_t switch
    cdef readonly object past
    cdef readonly object pair_axis
    cdef readonly object pair_axis2
    cdef readonly Py_ssize_t axes

    def __init__(self, Py_ssize_t head_dim, bint flip, object inv_freq, double att,
                 int64_t switch=-1, object past=None, object pair_axis=None,
                 object pair_axis2=None, Py_ssize_t axes=1):
        self.head_dim, self.flip, self.inv_freq, self.att = head_dim, flip, inv_freq, att
        self.switch, self.past = switch, past
        self.pair_axis, self.pair_axis2, self.axes = pair_axis, pair_axis2, axes


cdef bint same_value(object a, object b, frozenset plain):
    """a is b, or two values of one of the types `plain` (immutable, whose == is a plain
    comparison: an array's == would be an array) and equal value; a tuple (a list
    value kept by items_snapshot) equals a list of the same such values. A base made
    afresh each call is the same base; True is not 1."""
    cdef Py_ssize_t i
    if a is b:
        return True
    if type(a) is tuple and type(b) is list:
        if len(<tuple>a) != len(<list>b):
            return False
        for i in range(len(<tuple>a)):
            if not same_value((<tuple>a)[i], (<list>b)[i], plain):
                return False
        return True
    return type(a) is type(b) and type(a) in plain and a == b


cdef object items_snapshot(dict d, frozenset plain):
    """d's items as a tuple of (key, value), a list value as a tuple; None when a key or
    value (or a list's element) is not of a type in `plain` (then never kept: a dict or
    an array inside may change in place)."""
    cdef list out = []
    cdef object key, value
    for key, value in list(d.items()):
        if type(value) is list:
            value = tuple(value)
            if not all(type(v) in plain for v in value):
                return None
        elif type(value) not in plain:
            return None
        if type(key) not in plain:
            return None
        out.append((key, value))
    return tuple(out)


cdef bint same_items(dict d, tuple items, frozenset plain):
    """Whether d holds `items` (items_snapshot) now, key by key and value by value
    (same_value), in order."""
    cdef Py_ssize_t pos = 0, i = 0, n = len(items)
    cdef PyObject *key
    cdef PyObject *value
    cdef tuple pair
    with cython.critical_section(d):
        if len(d) != n:
            return False
        while PyDict_Next(d, &pos, &key, &value):
            pair = <tuple>PyTuple_GET_ITEM(items, i)
            i += 1
            if not (same_value(pair[0], <object>key, plain)
                    and same_value(pair[1], <object>value, plain)):
                return False
    return True


@cython.auto_pickle(False)
cdef class RopeStates:
    """RopeStates by the arguments that define them (q's head_dim, rotary_dim, base, a
    scaling dict, max_position_embeddings), compared by value (same_value: values of
    the immutable types `plain` only), the most recent first: a decode loop's call
    finds its state in a few comparisons, without hashing a dict. fastpe.rope parses a
    configuration that get() does not find and hands the state to keep()."""
    cdef list entries
    cdef frozenset plain

    def __init__(self, frozenset plain):
        self.entries = []
        self.plain = plain

    def get(self, object q, object rotary_dim, object base, object scaling,
            object max_position_embeddings):
        """The state kept for heads as wide as q's last axis and these arguments; None
        when there is none, or q is not an exact array or torch tensor of three or more
        axes (rope_call checks the width again on what it reads)."""
        cdef tuple e
        cdef frozenset plain = self.plain
        cdef Py_ssize_t head_dim
        if cnp.PyArray_CheckExact(q):
            if cnp.PyArray_NDIM(<cnp.ndarray>q) < 3:
                return None
            head_dim = cnp.PyArray_DIMS(<cnp.ndarray>q)[cnp.PyArray_NDIM(<cnp.ndarray>q) - 1]
        else:
            t = torch_views_of()
            if t is None or type(q) is not (<_TorchViews>t).tensor_type:
                return None
            try:
                shape = q.shape
            except Exception:  # a nested tensor has none
                return None
            if len(shape) < 3 or type(shape[len(shape) - 1]) is not int:
                return None
            head_dim = shape[len(shape) - 1]
        for e in self.entries:
            if (<Py_ssize_t>e[0] == head_dim and same_value(e[1], rotary_dim, plain)
                    and same_value(e[2], base, plain)
                    and same_value(e[3], max_position_embeddings, plain)
                    and ((scaling is None and e[4] is None) or (
                        type(scaling) is dict and e[4] is not None
                        and same_items(<dict>scaling, <tuple>e[4], plain)))):
                return e[5]
        return None

    def keep(self, Py_ssize_t head_dim, object rotary_dim, object base, object scaling,
             object max_position_embeddings, RopeState state):
        """Keep `state`, parsed from these arguments, when every one is a value of the
        plain types (a scaling dict's keys and values, or a list value's elements): a
        dict or an array inside may change in place. `scaling` must be a dict no
        other thread holds (fastpe.rope parses from a copy)."""
        cdef object items = None
        if not all(type(x) in self.plain for x in (rotary_dim, base, max_position_embeddings)):
            return
        if type(scaling) is dict:
            items = items_snapshot(<dict>scaling, self.plain)
            if items is None:
                return
        elif scaling is not None:
            return
        # replaced whole: a thread walking the old list sees a consistent one
        self.entries = [(head_dim, rotary_dim, base, max_position_embeddings, items,
                         state)] + self.entries[:ROPE_STATES_KEPT - 1]


cdef enum:
    # configurations RopeStates keeps
    ROPE_STATES_KEPT = 16


cdef int layout_code_of(object layout) noexcept:
    if type(layout) is not str:
        return -1
    if layout == "bshd":
        return LAYOUT_BSHD
    if layout == "bhsd":
        return LAYOUT_BHSD
    if layout == "shd":
        return LAYOUT_SHD
    return -1


cdef bint call_checks(const View *q, const View *k, object offset, object style,
                      object layout, object inverse, object num_threads, int *lay,
                      bint *neox, int64_t *off, Py_ssize_t *nbytes) noexcept:
    """rope_call's checks of the caller's scalar arguments: True with the layout code,
    pairing, offset and bytes touched filled in when they are the plain case; False,
    having touched nothing, otherwise."""
    cdef int overflow = 0
    cdef long long o
    lay[0] = layout_code_of(layout)
    if lay[0] < 0 or type(style) is not str:
        return False
    if style == "neox":
        neox[0] = True
    elif style == "gptj":
        neox[0] = False
    else:
        return False
    if type(offset) is not int or not (inverse is True or inverse is False):
        return False
    o = PyLong_AsLongLongAndOverflow(offset, &overflow)
    if overflow or o < 0:
        return False
    off[0] = o
    if num_threads is not None and not (type(num_threads) is int
                                        and 1 <= num_threads <= MAX_THREADS_FLOOR):
        return False
    if q.ndim < 1:
        return False
    nbytes[0] = 2 * (q.size * q.itemsize + (0 if k == NULL else k.size * k.itemsize))
    return True


cdef bint axis_positions(RopeCall *a, RopeState state, const View *pa, const View *q,
                         const View *k, int64_t *hi, int64_t *buf, int64_t **heap) noexcept:
    """Multi-axis positions into `a`: pa an aligned, native, C-contiguous int64 view
    (axes, 1 or batch, seq), state.axes <= MAX_AXES of them, its byte range apart
    from q's and k's, copied (into buf up to POSITIONS_STACK values, else into a
    malloc'd *heap the caller frees) and checked below MAX_ANGLE_POSITION, the largest
    into hi; state's pair_axis (and pair_axis2) int8 C-contiguous vectors of one axis
    per frequency, each below axes. False, `a` unchanged, otherwise."""
    cdef cnp.ndarray ax
    cdef object axes_of
    cdef Py_ssize_t i, n, axes, half
    cdef int64_t *out
    cdef const int8_t *pair[2]
    if pa == NULL or not cnp.PyArray_CheckExact(state.inv_freq):
        return False
    half = cnp.PyArray_SIZE(<cnp.ndarray>state.inv_freq)
    if (pa.typenum != cnp.NPY_INT64 or pa.ndim != 3 or not pa.c_contiguous
            or not pa.aligned or not pa.native or pa.shape[2] != a.seq
            or not (pa.shape[1] == 1 or pa.shape[1] == a.batch)
            or pa.shape[0] != state.axes or not 1 <= pa.shape[0] <= MAX_AXES
            or not apart(pa, q, k)):
        return False
    axes = pa.shape[0]
    pair[1] = NULL
    for i, axes_of in enumerate((state.pair_axis, state.pair_axis2)):
        if axes_of is None:
            continue
        if not cnp.PyArray_CheckExact(axes_of):
            return False
        ax = <cnp.ndarray>axes_of
        if (cnp.PyArray_TYPE(ax) != cnp.NPY_INT8 or cnp.PyArray_NDIM(ax) != 1
                or not cnp.PyArray_IS_C_CONTIGUOUS(ax) or ax.shape[0] != half):
            return False
        pair[i] = <const int8_t *>cnp.PyArray_DATA(ax)
        for n in range(half):
            if not 0 <= pair[i][n] < axes:
                return False
    n = pa.size
    out = buf
    if n > POSITIONS_STACK:
        heap[0] = out = <int64_t *>malloc(n * sizeof(int64_t))
        if out == NULL:
            return False
    memcpy(out, pa.data, n * sizeof(int64_t))
    hi[0] = -1
    for i in range(n):
        if not 0 <= out[i] < MAX_ANGLE_POSITION:
            return False
        hi[0] = max(hi[0], out[i])
    a.pos, a.pos_rows, a.offset = out, pa.shape[1], 0
    a.axes = axes
    a.pair_axis, a.pair_axis2 = pair[0], pair[1]
    return True


def rope_call(RopeState state, object q, object k, object positions, object offset,
              object style, object layout, object inverse, object num_threads,
              object cos, object sin, Py_ssize_t serial_bytes, int threads,
              bint token=False):
    """The compiled entry of apply_rope, apply_rope_cached and RotaryEmbedding: the
    caller's arguments as given, checked here. 1 when it rotated; 0, having touched
    nothing, when the call is not the plain case, and fastpe.rope's validating path
    then handles it or names what is wrong; the bytes the call touches, having touched
    nothing, when that is at least serial_bytes and `threads` is 0: the caller asks
    its thread policy (fastpe._threads.resolve) for a team and calls again with it.
    A smaller call runs on one thread. Never raises for the caller's values.

    Plain case: style "neox" or "gptj"; layout "bshd", "bhsd" or "shd" (None: "bshd"
    for arrays); offset an int >= 0; inverse a bool; num_threads None or an int in
    1..MAX_THREADS_FLOOR; q, k and positions as fast_arrays() takes them: exact
    ndarrays, or plain torch CPU tensors (q and k only with the layout given), read
    through DLPack without an ndarray (tensor_view), whose version counters are bumped
    once written.
    The angles come from `state` (q's last axis its head_dim unless that is -1; its
    frequencies apart from q and k, finite, at most head_dim / 2 of them; the scaling a
    normal float32 > 0; with its pair_axis, offset 0 and positions of every axis as
    axis_positions() takes them), or with state None from cos and sin as cached_rows()
    takes them, looked up by positions this call owns; with `token`, cos and sin as
    transformers' rotary modules return them, lined up with q's tokens (token_rows), and
    no positions. fastpe.rope's validating path calls this again with the normalised
    arguments: the only way to the loops.
    """
    cdef View qv, kv, pv, cv, sv
    cdef View *kp = NULL
    cdef View *pp = NULL
    cdef View *cp = NULL
    cdef View *sp = NULL
    cdef object t = None
    cdef Py_ssize_t done
    cdef bint arrays = cnp.PyArray_CheckExact(q) and (k is None or cnp.PyArray_CheckExact(k))
    if not arrays:
        t = tensor_views_now()
        if t is None or layout is None:
            return 0
    if not operand_view(q, t, True, &qv):
        return 0
    if k is not None:
        if not operand_view(k, t, True, &kv):
            return 0
        kp = &kv
    if arrays and not (
            (positions is None or type(positions) is list or type(positions) is tuple
             or cnp.PyArray_CheckExact(positions))
            and (cos is None or cnp.PyArray_CheckExact(cos))
            and (sin is None or cnp.PyArray_CheckExact(sin))):
        # arrays rotated by a model's torch positions (or cos and sin)
        t = tensor_views_now()
    if not (positions is None or type(positions) is list or type(positions) is tuple):
        if not operand_view(positions, t, False, &pv):
            return 0
        pp = &pv
    if cos is not None:
        if not operand_view(cos, t, False, &cv):
            return 0
        cp = &cv
    if sin is not None:
        if not operand_view(sin, t, False, &sv):
            return 0
        sp = &sv
    done = rope_views(state, &qv, kp, positions, pp, offset, style,
                      "bshd" if layout is None else layout, inverse, num_threads, cp, sp,
                      serial_bytes, threads, token)
    if done == 1 and not arrays:
        # q and k were viewed as exact ndarrays or plain tensors
        increment = version_increment()
        if cnp.PyArray_CheckExact(q):
            increment((k,))
        elif k is None or cnp.PyArray_CheckExact(k):
            increment((q,))
        else:
            increment((q, k))
    return done


cdef Py_ssize_t rope_views(RopeState state, const View *q, const View *k, object positions,
                           const View *pv, object offset, object style, object layout,
                           object inverse, object num_threads, const View *cos,
                           const View *sin, Py_ssize_t serial_bytes, int threads,
                           bint token) except -1:
    """rope_call on the operands' views."""
    cdef int lay, code
    cdef bint neox, inv
    cdef int64_t off, hi
    cdef Py_ssize_t nbytes
    cdef RopeCall a
    cdef int64_t posbuf[POSITIONS_STACK]
    cdef int64_t *heap = NULL
    if (not call_checks(q, k, offset, style, layout, inverse, num_threads, &lay, &neox, &off,
                        &nbytes) or (state is None and cos == NULL)):
        return 0
    if nbytes < serial_bytes:
        threads = 1
    elif threads < 1:
        return nbytes
    inv = inverse is True
    if state is None:
        # the cache's rows are looked up by position: positions the call owns, so that a
        # rewrite by another thread cannot move a lookup past the cache
        if token and (positions is not None or off != 0):
            return 0
        code = fast_arrays(&a, q, k, positions, pv, off, lay, &hi, posbuf, &heap)
        try:
            if code < 0 or not (token_rows(&a, cos, sin, q, k, neox) if token
                                else cached_rows(&a, cos, sin, q, k, hi)):
                return 0
            a.neox = neox
            a.invert_cache = inv
            rope_execute(&a, code, q.data, data_or_null(k), threads)
        finally:
            free(heap)
        return 1
    if state.head_dim >= 0 and q.shape[q.ndim - 1] != state.head_dim:
        return 0
    try:
        if state.pair_axis is None:
            code = fast_arrays(&a, q, k, positions, pv, off, lay, &hi, posbuf, &heap)
            if code < 0 or hi >= MAX_ANGLE_POSITION:
                return 0
            return rope_by_state(&a, code, state, q, k, neox, inv, hi, threads)
        # multi-axis: q and k as fast_arrays takes them, then positions of every axis
        code = fast_arrays(&a, q, k, None, NULL, 0, lay, &hi, posbuf, &heap)
        if (code < 0 or off != 0 or state.switch >= 0
                or (state.pair_axis2 is not None and not neox)):
            return 0
        if not axis_positions(&a, state, pv, q, k, &hi, posbuf, &heap):
            return 0
        return rope_by_state(&a, code, state, q, k, neox, inv, hi, threads)
    finally:
        free(heap)


cdef int rope_by_state(RopeCall *a, int code, RopeState state, const View *q,
                       const View *k, bint neox, bint inv, int64_t hi,
                       int threads) except -1:
    """rope_views with angles from `state`, once `a` holds q, k and positions whose
    largest is hi (below MAX_ANGLE_POSITION): 1 when it rotated, else 0."""
    cdef int64_t n
    cdef Py_ssize_t half = 0
    cdef double grown[DYNAMIC_PAIRS_STACK]
    cdef const double *w = NULL
    cdef object inv_freq, freqs, scaling
    cdef double att
    inv = inv != state.flip
    if inv and a.pair_axis2 != NULL:
        return 0
    inv_freq = state.inv_freq
    att = state.att
    if state.switch >= 0:
        n = hi + 1 if a.seq and a.batch else 0
        if n > state.switch:
            freqs = state.past
            if type(freqs) is float:
                # a decode loop's every step has a length, and frequencies, of its own
                half = dynamic_ntk_pairs(inv_freq, <double>freqs, state.switch, n, grown)
                if not half:
                    return 0
                w = grown
            else:
                if not isinstance(freqs, tuple) or len(<tuple>freqs) != 2:
                    return 0
                inv_freq, scaling = freqs
                if type(scaling) is not float:
                    return 0
                att = scaling
    # the validating path refuses what the float32 scaling cannot hold
    if not FLT_MIN <= att <= FLT_MAX:  # NaN, infinite, not positive or not normal
        return 0
    if inv:
        att = 1.0 / att
    if w == NULL:
        w = frequency_data(inv_freq, q, k, &half)
        if w == NULL:
            return 0
    return rope_with_frequencies(a, code, q, k, neox, w, half, att,
                                 -att if inv else att, threads)
