"""TFRecord framing (TensorBoard event files): every record checked, damage skipped, reading resumed after it.

A record is ``uint64 length``, ``uint32 masked CRC32C of the length bytes``, ``length`` data bytes, ``uint32 masked
CRC32C of the data`` (little-endian; masked = ``((crc >> 15) | (crc << 17)) + 0xa282ead8``, as TensorFlow's
``crc32c.h`` defines it and as TensorBoard's own loader checks). :func:`scan` walks a buffer:

- a record whose two checksums verify is returned;
- a record whose length or data checksum fails is damage: it is skipped, and reading resynchronises at the next byte
  offset where a record's length checksum *and* data checksum verify (scanning forward byte by byte, so a flipped
  length bit loses one record, not the rest of the file; a false match needs two 32-bit checksums to agree by
  chance);
- a record not yet complete at the end (its length checksum verifies, its data is not all there) is a record still
  being written, not damage: the scan stops before it, and the next read starts there;
- a failed record with nothing verifiable after it is, in a live file, left for later (the writer may not have moved
  past it yet: it becomes damage once a good record follows it); in a finished file the rest of the file is damage.

No CRC32C package ships with TensorBoard or protobuf, and a per-byte Python CRC runs at ~1 MB/s, so the checksums are
computed with numpy for all records of a buffer at once: slicing-by-8 tables, one vectorised step per 8 bytes of the
longest record (records over :data:`PIECE` bytes are cut into pieces checked side by side, then combined), which
costs a few percent of decoding the events. (A numba kernel would be faster per byte but costs ~1 s of import and
cache loading per process, more than reading a 100K-event file.)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

HEADER_SIZE = 12  # uint64 length + uint32 masked CRC32C of those 8 bytes
FOOTER_SIZE = 4  # uint32 masked CRC32C of the data
#: Records longer than this are checked as pieces of this size (keeps the number of vectorised steps bounded).
PIECE = 4096
#: Candidate offsets tested per vectorised step while resynchronising: the first window covers a scalar event or
#: two (the next record is usually that close), later ones double up to the last.
_RESYNC_FIRST, _RESYNC_LAST = 256, 1 << 16
#: Bytes walked per batch after damage (doubling while clean), so many damaged records cost no quadratic re-walk.
_BATCH_AFTER_DAMAGE = 1 << 12

_MASK_DELTA = 0xA282EAD8
_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_ALL_ONES = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")


def _tables() -> np.ndarray:
    """Slicing-by-8 tables for reflected CRC-32C: ``t[k][b]`` is byte ``b`` followed by ``k`` zero bytes.

    Tables, registers and indexes are int64 (values below 2**32): numpy indexes with intp arrays ~20x faster than
    with uint32 ones on small arrays, which is what live reads and resynchronising pass."""
    t = np.zeros((8, 256), dtype=np.int64)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        t[0, i] = c
    for k in range(1, 8):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


_T = _tables()
_T0 = _T[0]
_T0_LIST = _T0.tolist()
_x = np.arange(1 << 16, dtype=np.int64)
#: The same tables two bytes at a time (4 lookups per 8 bytes instead of 8): 1 MiB in all, built in ~2 ms.
_A, _B, _C, _D = (_T[7 - 2 * i][_x & 0xFF] ^ _T[6 - 2 * i][_x >> 8] for i in range(4))
del _x


def _step8(state: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The CRC registers after 8 more bytes each (``lo``, ``hi``: those bytes as two little-endian uint32)."""
    lo = state ^ lo
    hi = hi.astype(np.int64)
    return _A[lo & 0xFFFF] ^ _B[lo >> 16] ^ _C[hi & 0xFFFF] ^ _D[hi >> 16]


def _mask(crc: np.ndarray) -> np.ndarray:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


class _Buffer:
    """A byte buffer with unaligned uint64/uint32 views, so a word at any offset is one fancy-index gather."""

    def __init__(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        self.bytes = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        n = self.bytes.shape[0]
        self.n = n
        self.u64 = np.ndarray(shape=(max(n - 7, 0),), dtype="<u8", buffer=self.bytes, strides=(1,))
        self.u32 = np.ndarray(shape=(max(n - 3, 0),), dtype="<u4", buffer=self.bytes, strides=(1,))
        #: ``u32_4[i]`` is the uint32 at ``i + 4`` (saves an addition per gather of a word's high half).
        self.u32_4 = self.u32[4:]

    def registers(self, starts: np.ndarray, lengths: np.ndarray, init: np.ndarray) -> np.ndarray:
        """CRC-32C registers (no final inversion) after ``lengths[i]`` bytes from ``starts[i]``, from ``init[i]``."""
        state = init.astype(np.int64, copy=True)
        if not len(starts):
            return state
        words = lengths >> 3
        order = np.argsort(-words, kind="stable")
        pos = starts[order].astype(np.int64)
        sorted_words = words[order]
        st = state[order]
        # active[j]: how many registers have more than j words (a prefix, since sorted by words descending)
        counts = np.bincount(sorted_words, minlength=int(sorted_words[0]) + 1)
        active = len(pos) - np.cumsum(counts)
        u32, u32_4 = self.u32, self.u32_4
        for j in range(int(sorted_words[0])):
            a = int(active[j])
            p = pos[:a]
            st[:a] = _step8(st[:a], u32[p], u32_4[p])
            p += 8
        rem = lengths[order] & 7
        b = self.bytes
        for k in range(7):
            idx = np.flatnonzero(rem > k)
            if not len(idx):
                break
            s = st[idx]
            st[idx] = _T0[(s ^ b[pos[idx]]) & 0xFF] ^ (s >> 8)
            pos[idx] += 1
        state[order] = st
        return state

    def crc32c(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The (unmasked) CRC-32C of each span; spans longer than :data:`PIECE` are done as pieces, then combined."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        long = np.flatnonzero(lengths > PIECE)
        if not len(long):
            return self.registers(starts, lengths, np.full(len(starts), _ALL_ONES)) ^ _ALL_ONES
        # First piece: the remainder (from the record's initial register); then whole pieces from a zero register,
        # combined as state = shift_PIECE(state) ^ piece (CRC is linear over GF(2)).
        n_pieces = np.where(lengths > PIECE, -(-lengths // PIECE), 1)
        first_len = lengths - (n_pieces - 1) * PIECE
        owner = np.repeat(np.arange(len(starts)), n_pieces)
        first_piece = np.cumsum(n_pieces) - n_pieces
        k = np.arange(len(owner)) - first_piece[owner]
        p_start = starts[owner] + np.where(k == 0, 0, first_len[owner] + (k - 1) * PIECE)
        p_len = np.where(k == 0, first_len[owner], PIECE)
        p_init = np.where(k == 0, _ALL_ONES, 0).astype(np.int64)
        regs = self.registers(p_start, p_len, p_init)
        out = regs[first_piece].copy()
        shift = _shift_tables()
        for r in long:
            s = int(out[r])
            for q in range(int(first_piece[r]) + 1, int(first_piece[r] + n_pieces[r])):
                s = (
                    int(shift[0, s & 0xFF])
                    ^ int(shift[1, (s >> 8) & 0xFF])
                    ^ int(shift[2, (s >> 16) & 0xFF])
                    ^ int(shift[3, s >> 24])
                    ^ int(regs[q])
                )
            out[r] = s
        return out ^ _ALL_ONES

    def heads_ok(self, starts: np.ndarray) -> np.ndarray:
        """Per record at ``starts``: whether its length checksum verifies."""
        head = _step8(np.full(len(starts), _ALL_ONES), self.u32[starts], self.u32_4[starts]) ^ _ALL_ONES
        return _mask(head) == self.u32[starts + 8]

    def data_ok(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Per record at ``starts`` (data ``lengths``, all within the buffer): whether its data checksum verifies."""
        data = starts + HEADER_SIZE
        return _mask(self.crc32c(data, lengths)) == self.u32[data + lengths]


_SHIFT: np.ndarray | None = None


def _shift_tables() -> np.ndarray:
    """``shift[k][b]``: the register after :data:`PIECE` zero bytes from the register ``b << 8k`` (a linear map)."""
    global _SHIFT
    if _SHIFT is None:
        basis = np.array([1 << i for i in range(32)], dtype=np.int64)
        for _ in range(PIECE):
            basis = _T0[basis & 0xFF] ^ (basis >> 8)
        shift = np.zeros((4, 256), dtype=np.int64)
        for k in range(4):
            for b in range(256):
                v = 0
                for bit in range(8):
                    if b >> bit & 1:
                        v ^= basis[8 * k + bit]
                shift[k, b] = v
        _SHIFT = shift
    return _SHIFT


@dataclass
class Frames:
    """What :func:`scan` found: record data spans (offsets relative to the buffer), damaged regions, where to resume.

    ``starts``/``lengths``: int64 arrays, the data bytes of each verified record in file order. ``damaged``:
    ``(offset, length, reason)`` per skipped region. ``end``: the byte where the next read resumes (after the last
    record or damaged region, or at the start of a record still being written). ``state``: ``"end"``,
    ``"incomplete"`` (a record is still being written at ``end``) or ``"unresolved"`` (a failed record at ``end`` with
    no verifiable record after it yet: live files only).
    """

    starts: np.ndarray
    lengths: np.ndarray
    damaged: list[tuple[int, int, str]]
    end: int
    state: str


def scan(data: bytes | bytearray | memoryview | np.ndarray, *, finished: bool = False) -> Frames:
    """Walk the TFRecords in ``data`` from its start, checking both checksums of every record (see the module doc).

    ``finished``: the file is complete, so a failed record with nothing verifiable after it is damage to the end of
    the file (in a live file it waits for the writer to move past it).
    """
    buf = _Buffer(data)
    raw = buf.bytes.data if isinstance(data, np.ndarray) else data
    n = buf.n
    starts_parts: list[np.ndarray] = []
    length_parts: list[np.ndarray] = []
    damaged: list[tuple[int, int, str]] = []
    pos, state = 0, "end"
    batch = n  # the whole buffer in one walk until damage is seen
    while True:
        stop = min(n, pos + batch)
        starts, lengths, walked_to = _walk(raw, pos, stop, n)
        failed = None
        if len(starts):
            # Lengths first: up to the first failed length checksum the walk followed true lengths (past it, it
            # may have walked garbage, whose "data" is not worth a checksum).
            head_ok = buf.heads_ok(starts)
            bad_heads = np.flatnonzero(~head_ok)
            h = int(bad_heads[0]) if len(bad_heads) else len(starts)
            # A record there whose data checksum fails is skipped alone; the next starts where the walk says.
            trusted = buf.data_ok(starts[:h], lengths[:h])
            if not trusted.all() and not finished:
                # A live file: a bad record with no good one after it may not be finished with yet; the scan
                # (and its wait) takes over from the first such record.
                good = np.flatnonzero(trusted)
                tail_bad = int(good[-1]) + 1 if len(good) else 0
                if tail_bad < h:
                    h = tail_bad
                    trusted = trusted[:h]
            for i in np.flatnonzero(~trusted).tolist():
                damaged.append((int(starts[i]), int(lengths[i]) + HEADER_SIZE + FOOTER_SIZE, "data checksum mismatch"))
            starts_parts.append(starts[:h][trusted] + HEADER_SIZE)
            length_parts.append(lengths[:h][trusted])
            if h < len(starts):
                failed = (int(starts[h]), "data checksum mismatch" if head_ok[h] else "length checksum mismatch")
        if failed is None:
            pos = walked_to
            if pos + HEADER_SIZE > n:  # the end, or a header not all written yet
                state = "end" if pos >= n else "incomplete"
                break
            if not _claims_past_end(buf, pos):
                batch = min(n, batch * 2)  # the batch ended; walk on
                continue
            if _header_ok(buf, pos):
                state = "incomplete"  # a verified header whose data is not all there: still being written
                break
            failed = (pos, "length checksum mismatch")
        pos, state = _resync(buf, failed[0], failed[1], finished, damaged)
        if state != "end" or pos >= n:
            break
        batch = _BATCH_AFTER_DAMAGE
    return Frames(_cat(starts_parts), _cat(length_parts), damaged, int(pos), state)


def _claims_past_end(buf: _Buffer, pos: int) -> bool:
    """Whether the record at ``pos`` claims more bytes than the buffer holds (a walk stops there for that reason)."""
    length = int(buf.u64[pos])
    return pos + HEADER_SIZE + length + FOOTER_SIZE > buf.n


def _walk(data, pos: int, stop: int, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Record offsets and lengths from ``pos`` as the length fields say (not yet checked), while records start
    before ``stop`` and end within ``n``; also where the walk stopped."""
    starts: list[int] = []
    lengths: list[int] = []
    unpack = _LENGTH.unpack_from
    add_start, add_length = starts.append, lengths.append
    while pos + HEADER_SIZE <= stop:
        (length,) = unpack(data, pos)
        end = pos + HEADER_SIZE + length + FOOTER_SIZE
        if end > n:
            break
        add_start(pos)
        add_length(length)
        pos = end
    return np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64), pos


def _header_ok(buf: _Buffer, pos: int) -> bool:
    head = _step8(np.full(1, _ALL_ONES), buf.u32[[pos]], buf.u32_4[[pos]]) ^ _ALL_ONES
    return bool(_mask(head)[0] == buf.u32[pos + 8])


def _resync(
    buf: _Buffer, pos: int, reason: str, finished: bool, damaged: list[tuple[int, int, str]]
) -> tuple[int, str]:
    """Skip the failed record at ``pos``: find the next offset whose record verifies (or whose verified header starts
    a record still being written). Returns (where to continue, state); records the damaged region."""
    n = buf.n
    q = pos + 1
    window = _RESYNC_FIRST
    while q + HEADER_SIZE <= n:
        cand = np.arange(q, min(n - HEADER_SIZE + 1, q + window), dtype=np.int64)
        window = min(2 * window, _RESYNC_LAST)
        head = _step8(np.full(len(cand), _ALL_ONES), buf.u32[cand], buf.u32_4[cand]) ^ _ALL_ONES
        for c in cand[_mask(head) == buf.u32[cand + 8]].tolist():
            length = int(buf.u64[c])
            if c + HEADER_SIZE + length + FOOTER_SIZE > n:
                damaged.append((pos, c - pos, reason))
                return c, "incomplete"  # the writer moved on: this one is still being written
            if _data_ok(buf, c, length):
                damaged.append((pos, c - pos, reason))
                return c, "end"
        q = int(cand[-1]) + 1
    if not finished:
        return pos, "unresolved"
    damaged.append((pos, n - pos, reason))
    return n, "end"


def _data_ok(buf: _Buffer, pos: int, length: int) -> bool:
    """Whether one record's data checksum verifies (plain Python for short records: numpy's per-call cost is more)."""
    if length > 256:
        return bool(buf.data_ok(np.array([pos]), np.array([length]))[0])
    data = pos + HEADER_SIZE
    crc = _ALL_ONES
    table = _T0_LIST
    for byte in buf.bytes[data : data + length].tobytes():
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return int(_mask(np.array([crc ^ _ALL_ONES]))[0]) == int(buf.u32[data + length])


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The masked CRC32C that TFRecord stores (for tests and for writing records)."""
    buf = _Buffer(bytes(data) + b"\0" * 8)  # padding keeps the word views non-empty; it is not checksummed
    return int(_mask(buf.crc32c(np.array([0]), np.array([len(data)])))[0])


def frame(payload: bytes) -> bytes:
    """One TFRecord around ``payload`` (what TensorBoard's ``RecordWriter`` writes); used by tests and benches."""
    length = _LENGTH.pack(len(payload))
    return length + masked_crc32c(length).to_bytes(4, "little") + payload + masked_crc32c(payload).to_bytes(4, "little")
