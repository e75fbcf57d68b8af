"""The compiled loop of :mod:`forensics.sources.wandb.scanner`: one pass over the bytes of a ``.wandb`` file.

Everything is plain integer work on a ``uint8`` array: chunk headers, slicing-by-8 CRC-32, protobuf varints and
length-delimited fields, and two small open-addressing hash tables keyed by bytes (history keys to dense ids, summary
keys to their last operation). Values are not parsed here; their JSON texts are copied out side by side, and
classified (float, integer, true, false, null, or "not a plain number", which hands the row to Python).
"""

from __future__ import annotations

import numpy as np

from forensics.compiled.jit import compiled

#: Compiled without numba's reference counting (as the detection kernel): nothing inside allocates, the caller
#: passes every buffer sized for the worst case of the bytes it hands over (:func:`forensics.sources.wandb.scanner`),
#: and counting references on each array at each call was half of the loop's time (measured: 0.25 s -> 0.13 s per
#: 8 MiB with the helpers inlined alone).
_jit = compiled()
#: The three helpers called per field and per value are inlined into the loop by numba (each passes several arrays,
#: 7 words apiece: 5-10% of the loop, for 2 s more of its one-time compile).
_inline = compiled(inline="always")

BLOCK = 32 * 1024
HDR = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
END, PROBLEM, HANDED, FULL_TABLE, LIMIT = 0, 1, 2, 3, 4
V_FLOAT, V_INT, V_TRUE, V_FALSE, V_NULL, V_OTHER = 0, 1, 2, 3, 4, -1
S_UPDATE, S_REMOVE = 1, 2
(
    F_HISTORY,
    F_SUMMARY,
    F_CONFIG,
    F_RUN,
    F_EXIT,
    F_ITEM,
    F_STEP,
    F_STEP_NUM,
    F_KEY,
    F_NESTED,
    F_VALUE_JSON,
    F_UPDATE,
    F_REMOVE,
    F_INT_DIGITS,
) = range(14)
_FNV_PRIME = 1099511628211


# --- small helpers --------------------------------------------------------------------------------------------------
@_jit
def _copy(dst, d0, src, s0, n):
    for k in range(n):
        dst[d0 + k] = src[s0 + k]


@_jit
def _crc32(buf, lo, hi, crc, T):
    """zlib.crc32(buf[lo:hi], crc), slicing by 8 bytes."""
    c = crc ^ 0xFFFFFFFF
    p = lo
    while p + 8 <= hi:
        one = c ^ (
            np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8) | (np.int64(buf[p + 2]) << 16) | (np.int64(buf[p + 3]) << 24)
        )
        two = (
            np.int64(buf[p + 4])
            | (np.int64(buf[p + 5]) << 8)
            | (np.int64(buf[p + 6]) << 16)
            | (np.int64(buf[p + 7]) << 24)
        )
        c = (
            T[7, one & 255]
            ^ T[6, (one >> 8) & 255]
            ^ T[5, (one >> 16) & 255]
            ^ T[4, (one >> 24) & 255]
            ^ T[3, two & 255]
            ^ T[2, (two >> 8) & 255]
            ^ T[1, (two >> 16) & 255]
            ^ T[0, (two >> 24) & 255]
        )
        p += 8
    while p < hi:
        c = T[0, (c ^ np.int64(buf[p])) & 255] ^ (c >> 8)
        p += 1
    return c ^ 0xFFFFFFFF


@_jit
def _varint(buf, p, hi):
    """(value, position after it); position -1 when it runs past ``hi`` or past 10 bytes."""
    v = 0
    shift = 0
    while p < hi and shift < 70:
        b = np.int64(buf[p])
        p += 1
        v |= (b & 0x7F) << shift
        if b < 128:
            return v, p
        shift += 7
    return 0, -1


@_jit
def _skip(buf, p, hi, wire):
    """The position after a field's value of wire type ``wire`` (not length-delimited), -1 if malformed."""
    if wire == 0:
        _, p = _varint(buf, p, hi)
        return p
    if wire == 1:
        p += 8
    elif wire == 5:
        p += 4
    else:
        return -1
    return p if p <= hi else -1


@_inline
def _field(buf, p, hi):
    """One field header: (field number, wire type, start of its bytes, end of its bytes, position after it).

    For a length-delimited field the bytes are its contents; for the others, its encoded value. Position -1 when
    malformed (field number 0, a group, a length past ``hi``). One-byte tags and lengths (nearly all) take no loop."""
    if p >= hi:
        return 0, 0, 0, 0, -1
    tag = np.int64(buf[p])
    if tag < 128:
        p += 1
    else:
        tag, p = _varint(buf, p, hi)
        if p < 0:
            return 0, 0, 0, 0, -1
    f = tag >> 3
    wire = tag & 7
    if f <= 0 or f >= 1 << 29:  # protobuf's field numbers are 1 .. 2**29 - 1
        return 0, 0, 0, 0, -1
    if wire == 2:
        if p >= hi:
            return 0, 0, 0, 0, -1
        n = np.int64(buf[p])
        if n < 128:
            q = p + 1
        else:
            n, q = _varint(buf, p, hi)
            if q < 0 or n < 0:
                return 0, 0, 0, 0, -1
        if n > hi - q:
            return 0, 0, 0, 0, -1
        return f, wire, q, q + n, q + n
    q = _skip(buf, p, hi, wire)
    return f, wire, p, q, q


@_jit
def _utf8(buf, lo, hi):
    """Whether buf[lo:hi] is valid UTF-8 (what protobuf requires of a string field); ASCII is one vectorised pass."""
    acc = 0
    for k in range(lo, hi):
        acc |= buf[k]
    if acc < 0x80:
        return True
    p = lo
    while p < hi:
        b = buf[p]
        if b < 0x80:
            p += 1
            continue
        if 0xC2 <= b <= 0xDF:
            n = 1
        elif 0xE0 <= b <= 0xEF:
            n = 2
        elif 0xF0 <= b <= 0xF4:
            n = 3
        else:
            return False
        if p + n >= hi:
            return False
        c = buf[p + 1]
        if (b == 0xE0 and c < 0xA0) or (b == 0xED and c > 0x9F) or (b == 0xF0 and c < 0x90) or (b == 0xF4 and c > 0x8F):
            return False
        for k in range(1, n + 1):
            if buf[p + k] < 0x80 or buf[p + k] > 0xBF:
                return False
        p += n + 1
    return True


@_jit
def _same(buf, lo, pool, plo, n):
    for k in range(n):
        if buf[lo + k] != pool[plo + k]:
            return False
    return True


@_jit
def _is(buf, lo, hi, word):
    if hi - lo != len(word):
        return False
    for k in range(hi - lo):
        if buf[lo + k] != word[k]:
            return False
    return True


_NAN = np.frombuffer(b"NaN", np.uint8).copy()
_INF = np.frombuffer(b"Infinity", np.uint8).copy()
_NINF = np.frombuffer(b"-Infinity", np.uint8).copy()
_TRUE = np.frombuffer(b"true", np.uint8).copy()
_FALSE = np.frombuffer(b"false", np.uint8).copy()
_NULL = np.frombuffer(b"null", np.uint8).copy()
_TYPE_MARK = np.frombuffer(b"/_type", np.uint8).copy()


#: 0xF0F0F0F0F0F0F0F0 as a signed 64-bit word: the high nibble of each of eight bytes.
_HIGH_NIBBLES = -1085102592571150096


@_jit
def _digits(buf, p, hi):
    """The position after the run of ASCII digits at ``p``: eight bytes at a time while they are all digits (the
    check of simdjson's ``is_made_of_eight_digits_fast``), then byte by byte."""
    while p + 8 <= hi:
        w = _word(buf, p, 8)
        if ((w & _HIGH_NIBBLES) | (((w + 0x0606060606060606) & _HIGH_NIBBLES) >> 4)) != 0x3333333333333333:
            break
        p += 8
    while p < hi and 48 <= buf[p] <= 57:
        p += 1
    return p


@_jit
def _classify(buf, lo, hi, int_digits):
    """What a value's JSON text is: V_FLOAT, V_INT, V_TRUE, V_FALSE, V_NULL, or V_OTHER (anything else, including
    JSON whitespace and integers longer than ``int_digits`` (> 0), which Python's json refuses: the Python path reads
    those)."""
    if lo >= hi:
        return V_OTHER
    c = buf[lo]
    if c == 78:  # N
        return V_FLOAT if _is(buf, lo, hi, _NAN) else V_OTHER
    if c == 73:  # I
        return V_FLOAT if _is(buf, lo, hi, _INF) else V_OTHER
    if c == 116:
        return V_TRUE if _is(buf, lo, hi, _TRUE) else V_OTHER
    if c == 102:
        return V_FALSE if _is(buf, lo, hi, _FALSE) else V_OTHER
    if c == 110:
        return V_NULL if _is(buf, lo, hi, _NULL) else V_OTHER
    p = lo
    if c == 45:  # -
        if _is(buf, lo, hi, _NINF):
            return V_FLOAT
        p += 1
        if p >= hi:
            return V_OTHER
    if buf[p] == 48:
        p += 1
    elif 49 <= buf[p] <= 57:
        p = _digits(buf, p + 1, hi)
    else:
        return V_OTHER
    kind = V_INT
    if p < hi and buf[p] == 46:  # .
        q = p + 1
        p = _digits(buf, q, hi)
        if p == q:
            return V_OTHER
        kind = V_FLOAT
    if p < hi and (buf[p] == 101 or buf[p] == 69):  # e E
        p += 1
        if p < hi and (buf[p] == 43 or buf[p] == 45):
            p += 1
        q = p
        while p < hi and 48 <= buf[p] <= 57:
            p += 1
        if p == q:
            return V_OTHER
        kind = V_FLOAT
    if kind == V_INT and int_digits > 0 and hi - lo - (buf[lo] == 45) > int_digits:
        return V_OTHER
    return kind if p == hi else V_OTHER


@_inline
def _item_key(buf, lo, hi, F, typed, kbuf):
    """Where the flat key of a history/summary item is (nested keys joined with ``/``, else ``key``) and its value.

    Returns (joined, key start, key length, value_json start, value_json end, plain). The key is ``buf``'s bytes
    when it has one part, else (``joined``) written to ``kbuf`` from 0 (``kbuf`` holds at least ``2 * (hi - lo)``
    bytes: one ``/`` per part of at least two bytes). ``plain`` is False when the item has a typed value, a
    malformed field or a ``key``/``value_json`` field that is not UTF-8 (then Python reads the record). In
    wandb-core's layout nothing is checked here: the key is checked once, when it is new to its table
    (:func:`_key_id`; parts joined by ``/`` are valid if and only if each part is), a history value is ASCII once
    classified, and a summary value is checked by the loop."""
    # wandb-core's layout, nearly every item: one nested_key, then value_json, both lengths under 128
    ntag = (F[F_NESTED] << 3) | 2
    vtag = (F[F_VALUE_JSON] << 3) | 2
    if ntag < 128 and 128 <= vtag < 16384 and hi - lo >= 5 and buf[lo] == ntag and buf[lo + 1] < 128:
        q = lo + 2 + np.int64(buf[lo + 1])
        if (
            q + 3 <= hi
            and buf[q] == ((vtag & 0x7F) | 0x80)
            and buf[q + 1] == (vtag >> 7)
            and buf[q + 2] < 128
            and q + 3 + np.int64(buf[q + 2]) == hi
        ):
            return False, lo + 2, q - lo - 2, q + 3, hi, True
    n_nested = 0
    k_lo = 0
    k_hi = 0
    key_lo = 0
    key_hi = 0
    v_lo = 0
    v_hi = 0
    klen = 0
    p = lo
    while p < hi:
        f, wire, a, b, p = _field(buf, p, hi)
        if p < 0:
            return False, 0, 0, 0, 0, False
        if f == F[F_NESTED] and wire == 2:
            if n_nested == 0:
                k_lo, k_hi = a, b
            else:
                if n_nested == 1:
                    _copy(kbuf, 0, buf, k_lo, k_hi - k_lo)
                    klen = k_hi - k_lo
                kbuf[klen] = 47  # /
                _copy(kbuf, klen + 1, buf, a, b - a)
                klen += 1 + b - a
            n_nested += 1
        elif f == F[F_KEY] and wire == 2:
            if not _utf8(buf, a, b):  # protobuf checks every string, the ones it then overwrites too
                return False, 0, 0, 0, 0, False
            key_lo, key_hi = a, b
        elif f == F[F_VALUE_JSON] and wire == 2:
            if not _utf8(buf, a, b):
                return False, 0, 0, 0, 0, False
            v_lo, v_hi = a, b
        elif f < typed.shape[0] and typed[f]:
            return False, 0, 0, 0, 0, False
    if n_nested > 1:
        return True, 0, klen, v_lo, v_hi, True
    if n_nested == 0:
        k_lo, k_hi = key_lo, key_hi
    return False, k_lo, k_hi - k_lo, v_lo, v_hi, True


@_jit
def _word(ks, p, m):
    """The ``m`` (at most 8) bytes at ``ks[p]`` as a little-endian integer."""
    w = 0
    for k in range(m):
        w |= np.int64(ks[p + k]) << (8 * k)
    return w


@_jit
def _mix(h):
    h = (h ^ (h >> 31)) * _FNV_PRIME
    return h ^ (h >> 29)


@_jit
def _hash(ks, lo, n):
    """A 64-bit hash of ks[lo:lo + n]: its first and last eight bytes (and every eight between, for long keys) and
    its length, mixed; two keys that collide are still told apart by comparing their bytes."""
    if n <= 8:
        return _mix(_word(ks, lo, n) ^ (n * _FNV_PRIME))
    h = _mix(_word(ks, lo, 8) ^ (n * _FNV_PRIME))
    p = lo + 8
    while p + 8 < lo + n:
        h = _mix(h ^ _word(ks, p, 8))
        p += 8
    return _mix(h ^ _word(ks, lo + n - 8, 8))


@_inline
def _key_id(slots, hashes, koff, pool, counts, c, ks, lo, klen):
    """The id of the key ``ks[lo:lo + klen]`` in an open-addressing table (ids dense, in first-seen order), added if
    new; -1 when it is new and the table is half full or its pool is (the pass stops there; the next has a table
    twice as large), -2 when it is new and not UTF-8 (protobuf would refuse the record: Python reads it).
    ``counts[c]`` is the number of keys; ``pool`` holds their bytes, ``koff`` where each starts."""
    h = _hash(ks, lo, klen)
    mask = slots.shape[0] - 1
    i = h & mask
    while slots[i] >= 0:
        k = slots[i]
        if hashes[k] == h and koff[k + 1] - koff[k] == klen and _same(ks, lo, pool, koff[k], klen):
            return k
        i = (i + 1) & mask
    k = counts[c]
    if 2 * (k + 1) > slots.shape[0] or koff[k] + klen > pool.shape[0]:
        return -1
    if not _utf8(ks, lo, lo + klen):
        return -2
    _copy(pool, koff[k], ks, lo, klen)
    koff[k + 1] = koff[k] + klen
    hashes[k] = h
    slots[i] = k
    counts[c] = k + 1
    return k


# --- the pass -------------------------------------------------------------------------------------------------------
#: Indexes into the ``counts`` array a pass fills.
C_ROWS, C_ITEMS, C_HKEYS, C_SKEYS, C_HANDED = range(5)


@compiled(nogil=True)
def scan(
    buf,
    base,
    limit,
    skip,
    F,
    oneof,
    typed,
    T,
    type_crc,
    counts,
    rows,
    items,
    kinds,
    voff,
    vbuf,
    htab,
    hpool,
    stab,
    spool,
    sitems,
    sstore,
    handed,
    hbuf,
    asm,
    kbuf,
    pending,
):
    """Walk ``buf`` (the file's bytes from offset ``base``, a record boundary) record by record.

    Returns ``(stop, why, first)``: ``stop`` is the file offset after the last record taken (where the next read
    starts), ``why`` is END (the bytes ran out: no whole record after ``stop`` in ``buf``), LIMIT (the next record
    starts at ``limit`` or after: ``buf``'s bytes from ``limit`` on are only there to finish the record before it),
    PROBLEM (the chunk at ``stop``, or the split record starting there, fails a check), HANDED (stopped after a
    record whose effect must be applied in order) or FULL_TABLE (a key table or the value arrays are full: the next
    pass gets larger ones). With ``skip``, ``base`` is a block boundary that may be inside a record: its chunks are
    checked and passed over, and ``first`` is where the first record starts (-1 if none does in ``buf``).

    Outputs, filled from 0 and counted in ``counts`` (``C_*``), up to their capacity:

    - ``rows[0]``/``rows[1]``: each row's record offset and ``HistoryStep.num``;
    - ``items[0..1]``: each value's row and key id, ``kinds`` its kind; ``vbuf[voff[m]:voff[m + 1]]`` its JSON text
      (true and false as 1 and 0);
    - ``htab`` (slots, hashes, key starts) and ``hpool``: the history keys; ``stab``/``spool`` the summary keys, and
      ``sitems[0..5]`` per summary key its last operation (0 for none), where its item's bytes are (0: ``buf``, 1:
      ``sstore``), their start and end, the rank of its first update since its last removal (-1 for none) and
      whether the pass removed it;
    - ``handed[0..1]``: start and end offsets of each record handed to Python, ``hbuf[handed[2][i]:...]`` its payload.

    ``asm`` holds a split record while it is reassembled, ``kbuf`` one item's key, ``pending`` one summary record's
    operations until all of it has read. Every buffer is sized by the caller for the worst case of ``len(buf)``
    bytes, except the key tables, ``items`` and ``pending``.
    """
    n = buf.shape[0]
    hslots, hhash, hkoff = htab[0], htab[1], htab[2]
    sslots, shash, skoff = stab[0], stab[1], stab[2]
    n_rows = 0
    n_items = 0
    n_ops = 0
    n_sstore = 0
    n_handed = 0
    n_asm = 0
    in_split = False
    rec_start = 0
    src = buf
    lo = 0
    hi = 0
    pos = 0
    commit = 0
    first = -1 if skip else base
    why = END
    while True:
        block_left = BLOCK - (base + pos) % BLOCK
        if block_left < HDR:
            if n - pos < block_left:
                break
            pos += block_left
            continue
        if n - pos < HDR:
            break
        crc = (
            np.int64(buf[pos])
            | (np.int64(buf[pos + 1]) << 8)
            | (np.int64(buf[pos + 2]) << 16)
            | (np.int64(buf[pos + 3]) << 24)
        )
        length = np.int64(buf[pos + 4]) | (np.int64(buf[pos + 5]) << 8)
        kind = np.int64(buf[pos + 6])
        if kind < FULL or kind > LAST or length > block_left - HDR:
            why = PROBLEM
            break
        if skip:
            if kind == MIDDLE or kind == LAST:  # the end of a record that began before ``base``
                if pos + HDR + length > n:
                    break
                if (
                    (base + pos) % BLOCK != 0
                    or (kind == MIDDLE and length != block_left - HDR)
                    or (_crc32(buf, pos + HDR, pos + HDR + length, type_crc[kind], T) != crc)
                ):
                    why = PROBLEM
                    break
                pos += HDR + length
                commit = pos
                continue
            skip = False
            first = base + pos
            commit = pos
        if not in_split and pos >= limit:
            why = LIMIT  # ``commit`` stays after the last record, where the exact reader leaves its offset
            break
        if pos + HDR + length > n:
            break
        if _crc32(buf, pos + HDR, pos + HDR + length, type_crc[kind], T) != crc:
            why = PROBLEM
            break
        # the record's payload: src[lo:hi], src being buf (a one-chunk record) or asm (reassembled)
        whole = False
        if kind == FULL:
            if in_split:
                why = PROBLEM
                break
            rec_start = pos
            src = buf
            lo = pos + HDR
            hi = lo + length
            whole = True
        elif kind == FIRST:
            if in_split or length != block_left - HDR:
                why = PROBLEM
                break
            in_split = True
            rec_start = pos
            _copy(asm, 0, buf, pos + HDR, length)
            n_asm = length
        else:
            if not in_split or (base + pos) % BLOCK != 0 or (kind == MIDDLE and length != block_left - HDR):
                why = PROBLEM
                break
            _copy(asm, n_asm, buf, pos + HDR, length)
            n_asm += length
            if kind == LAST:
                in_split = False
                src = asm
                lo = 0
                hi = n_asm
                whole = True
        pos += HDR + length
        if not whole:
            continue
        from_buf = kind == FULL

        # --- which member of the record_type oneof it is --------------------------------------------------------
        rtype = 0
        r_lo = 0
        r_hi = 0
        n_members = 0
        ok = True
        p = lo
        while p < hi:
            f, wire, a, b, p = _field(src, p, hi)
            if p < 0:
                ok = False
                break
            if f < oneof.shape[0] and oneof[f]:
                if wire != 2:
                    ok = False
                    break
                n_members += 1
                rtype = f
                r_lo, r_hi = a, b
        ok = ok and n_members <= 1
        if (
            ok
            and n_members == 1
            and (n_items + (r_hi - r_lo) // 2 + 1 > items.shape[1] or (r_hi - r_lo) // 2 + 1 > pending.shape[1])
        ):
            why = FULL_TABLE  # its values might not fit: the next pass has room
            pos = commit
            break
        hand = not ok
        stop_after = hand
        full = False
        if ok and n_members == 1 and rtype == F[F_HISTORY]:
            # --- a history row: every value a plain JSON number (or true/false/null), else Python reads it ------
            first_item = n_items
            first_value = voff[n_items]
            step = 0
            plain = True
            p = r_lo
            while p < r_hi:
                f, wire, a, b, p = _field(src, p, r_hi)
                if p < 0:
                    plain = False
                    break
                if f == F[F_ITEM] and wire == 2:
                    joined, k_lo, klen, v_lo, v_hi, good = _item_key(src, a, b, F, typed, kbuf)
                    ks = kbuf if joined else src
                    vk = _classify(src, v_lo, v_hi, F[F_INT_DIGITS]) if good else V_OTHER
                    if vk == V_OTHER or (klen >= 6 and _same(ks, k_lo + klen - 6, _TYPE_MARK, 0, 6)):
                        plain = False
                        break
                    key = _key_id(hslots, hhash, hkoff, hpool, counts, C_HKEYS, ks, k_lo, klen)
                    if key == -2:
                        plain = False
                        break
                    if key < 0:
                        full = True
                        break
                    v0 = voff[n_items]
                    if vk == V_INT and v_hi - v_lo == 2 and src[v_lo] == 45 and src[v_lo + 1] == 48:
                        vbuf[v0] = 48  # the integer -0 is 0 (float(json.loads("-0")) is 0.0, not -0.0)
                        voff[n_items + 1] = v0 + 1
                    elif vk <= V_INT:
                        _copy(vbuf, v0, src, v_lo, v_hi - v_lo)
                        voff[n_items + 1] = v0 + v_hi - v_lo
                    else:
                        vbuf[v0] = 49 if vk == V_TRUE else 48  # "1" / "0" (a null is masked afterwards)
                        voff[n_items + 1] = v0 + 1
                    items[0, n_items] = n_rows
                    items[1, n_items] = key
                    kinds[n_items] = vk
                    n_items += 1
                elif f == F[F_STEP] and wire == 2:
                    q = a
                    while q < b:
                        g, w2, c0, c1, q = _field(src, q, b)
                        if q < 0:
                            plain = False
                            break
                        if g == F[F_STEP_NUM] and w2 == 0:
                            step, _ = _varint(src, c0, c1)
                    if not plain:
                        break
            if full:
                n_items = first_item
                voff[n_items] = first_value
                why = FULL_TABLE
                break
            if plain:
                rows[0, n_rows] = base + rec_start
                rows[1, n_rows] = step
                n_rows += 1
            else:
                n_items = first_item  # the row goes to Python whole
                voff[n_items] = first_value
                hand = True
        elif ok and n_members == 1 and rtype == F[F_SUMMARY]:
            # --- a summary record: its operations gathered, then (if all of it reads) its updates, its removals --
            p = r_lo
            n_pending = 0
            while p < r_hi:
                f, wire, a, b, p = _field(src, p, r_hi)
                if p < 0:
                    hand = True
                    break
                if (f == F[F_UPDATE] or f == F[F_REMOVE]) and wire == 2:
                    joined, k_lo, klen, v_lo, v_hi, good = _item_key(src, a, b, F, typed, kbuf)
                    if not good or not _utf8(src, v_lo, v_hi):
                        hand = True
                        break
                    key = _key_id(sslots, shash, skoff, spool, counts, C_SKEYS, kbuf if joined else src, k_lo, klen)
                    if key == -2:
                        hand = True
                        break
                    if key < 0:
                        full = True
                        break
                    pending[0, n_pending] = S_UPDATE if f == F[F_UPDATE] else S_REMOVE
                    pending[1, n_pending] = key
                    pending[2, n_pending] = a
                    pending[3, n_pending] = b
                    n_pending += 1
            if full:
                why = FULL_TABLE
                break
            stop_after = hand
            if not hand:
                for op in (S_UPDATE, S_REMOVE):
                    for j in range(n_pending):
                        if pending[0, j] != op:
                            continue
                        key = pending[1, j]
                        a = pending[2, j]
                        b = pending[3, j]
                        sitems[0, key] = op
                        if op == S_REMOVE:
                            sitems[4, key] = -1
                            sitems[5, key] = 1
                        elif sitems[4, key] < 0:
                            sitems[4, key] = n_ops  # where a dict would put it: its first update since a removal
                        n_ops += 1
                        if from_buf:
                            sitems[1, key] = 0
                            sitems[2, key] = a
                            sitems[3, key] = b
                        else:
                            _copy(sstore, n_sstore, src, a, b - a)
                            sitems[1, key] = 1
                            sitems[2, key] = n_sstore
                            sitems[3, key] = n_sstore + b - a
                            n_sstore += b - a
        elif ok and n_members == 1 and (rtype == F[F_CONFIG] or rtype == F[F_RUN] or rtype == F[F_EXIT]):
            hand = True
            stop_after = rtype == F[F_RUN]  # its summary must land between the summary records around it
        if hand:
            h0 = handed[2, n_handed]
            _copy(hbuf, h0, src, lo, hi - lo)
            handed[2, n_handed + 1] = h0 + hi - lo
            handed[0, n_handed] = base + rec_start
            handed[1, n_handed] = base + pos
            n_handed += 1
        commit = pos
        if stop_after:
            why = HANDED
            break
    counts[C_ROWS] = n_rows
    counts[C_ITEMS] = n_items
    counts[C_HANDED] = n_handed
    return base + commit, why, first


@_jit
def pivot(out, valid, first, item_key, item_row, values, kinds, colmap, rowmap, r0, rank0):
    """One batch's values into ``out[col, row]``, in order (a key written twice in a row: the last wins; null
    writes nothing): ``col = colmap[key]`` (< 0: not a column), ``row = rowmap[r0 + row in the batch]``.
    ``first[:, col]`` keeps the (row, rank) of a column's first write, the rank of the batch's value ``m`` being
    ``rank0 + m`` (items of a row are side by side, in the order they were logged)."""
    for m in range(item_key.shape[0]):
        c = colmap[item_key[m]]
        if c < 0 or kinds[m] == V_NULL:
            continue
        r = rowmap[r0 + item_row[m]]
        out[c, r] = values[m]
        valid[c, r] = True
        if r < first[0, c] or (r == first[0, c] and rank0 + m < first[1, c]):
            first[0, c] = r
            first[1, c] = rank0 + m
