"""Reading columnar files from outside (Parquet, Arrow IPC streams) in bounded memory: task files, the
``.parquet`` files of `rlcr compare`, a store's rollout and evaluation records.

A columnar file is small on disk and may be huge once read: a compressed page ("zip bomb"), a dictionary
page of one long string that every row points at, run-length-encoded levels. So before anything is
materialised the file's metadata is checked (:func:`check_parquet_metadata`): rows, the uncompressed size of
every column chunk, its count of values, its encodings, the columns required. The footer may lie, so every
page header is read too (:func:`check_parquet_pages`): the size each page says it decompresses to is what
Arrow allocates for it, and these sizes are added up before any page is decompressed. The rows are then read in
batches of :data:`BATCH_ROWS`, string columns as dictionaries, and each batch's size *once expanded* (a
dictionary's values counted once per row that points at them, :func:`expanded_bytes`) is added to a running
budget before the batch is decoded. Past a limit: one :class:`~rlcr.untrusted.InvalidInput` line naming the
file, and nothing large was allocated.

What a file may hold (docs/guarantees.md): at most :data:`MAX_TABLE_ROWS` rows and :data:`MAX_TABLE_BYTES`
bytes once decoded into Arrow. Within these a file costs memory in proportion to what it holds.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlcr.untrusted import InvalidInput, printable

__all__ = ["TableTooLarge", "MAX_TABLE_ROWS", "MAX_TABLE_BYTES", "BATCH_ROWS", "check_parquet_metadata",
           "parquet_batches", "check_parquet_pages", "read_parquet_table", "ipc_stream_batches", "expanded_bytes"]

MAX_TABLE_ROWS = 1 << 20
"""Most rows read from one columnar file (1,048,576): task files, evaluation and rollout records."""
MAX_TABLE_BYTES = 512 << 20
"""Most bytes one columnar file may decode to in Arrow (512 MiB), every value counted as often as rows hold it;
also the most its column chunks may hold uncompressed."""
BATCH_ROWS = 1024
"""Rows decoded at a time; a batch's expanded size is checked before it is decoded."""

_BOMB = "refusing to read it (a decompression bomb?)"
_UNBOUNDED_ENCODINGS = {"DELTA_BYTE_ARRAY"}
"""Encodings whose decoded values are bounded only by the chunk times its value count (each value may repeat
the whole of the previous one): read only where that bound fits the budget."""


class TableTooLarge(InvalidInput):
    """A columnar file holds (or decodes to) more than the limits allow; the message names the file."""


def _too_much(name: str, what: str, limit: int, unit: str) -> InvalidInput:
    return TableTooLarge(f"{name}: {what}, more than the {limit:,} {unit} allowed; {_BOMB}")


def _width(physical_type: str) -> int:
    return {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}.get(physical_type, 8)


def check_parquet_metadata(pf: pq.ParquetFile, name: str, *, required: Sequence[str] = (),
                           max_rows: int = MAX_TABLE_ROWS, max_bytes: int = MAX_TABLE_BYTES) -> None:
    """Refuse, from the footer alone, a Parquet file whose rows or decoded size exceed the limits, that uses an
    encoding whose size cannot be bounded within them, or that lacks a ``required`` column."""
    md = pf.metadata
    names = pf.schema_arrow.names
    missing = [c for c in required if c not in names]
    if missing:
        raise InvalidInput(f"{name}: field {printable(repr(missing[0]), 80)} is missing (columns: "
                           f"{printable(', '.join(names), 200)})")
    if md.num_rows > max_rows:
        raise _too_much(name, f"{md.num_rows:,} rows", max_rows, "rows")
    total = 0
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            size = max(chunk.total_uncompressed_size, chunk.num_values * _width(chunk.physical_type))
            if _UNBOUNDED_ENCODINGS & set(chunk.encodings):
                size = max(size, chunk.num_values * chunk.total_uncompressed_size)
            total += size
            if total > max_bytes:
                raise _too_much(name, f"column {printable(repr(chunk.path_in_schema), 80)} (row group {g}) "
                                      f"takes the decoded size past {max_bytes:,} bytes", max_bytes, "bytes")


def expanded_bytes(array: Any) -> int:
    """Bytes ``array`` (an Arrow array or chunked array) takes once decoded: a dictionary's values counted once
    per index that points at them (computed from the value lengths, nothing expanded), lists and structs
    through their children."""
    if isinstance(array, pa.ChunkedArray):
        return sum(expanded_bytes(chunk) for chunk in array.chunks)
    kind = array.type
    if pa.types.is_dictionary(kind):
        values = array.dictionary
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type) or \
                pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
            lengths = pc.take(pc.binary_length(values), array.indices)
            return int(pc.sum(lengths).as_py() or 0) + 8 * len(array)
        return len(array) * max(1, expanded_bytes(values) // max(1, len(values)))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return 8 * (len(array) + 1) + expanded_bytes(array.flatten())
    if pa.types.is_struct(kind):
        return len(array) // 8 + sum(expanded_bytes(array.field(i)) for i in range(kind.num_fields))
    return array.nbytes


def _binary_paths(pf: pq.ParquetFile) -> list[str]:
    """The column paths of byte-array leaves: read as dictionaries, so a repeated value is held once."""
    schema = pf.schema
    return [schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "BYTE_ARRAY"]


def _decoded(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    return batch.cast(schema) if batch.schema != schema else batch


def parquet_batches(source: Any, name: str, *, columns: Sequence[str] | None = None, required: Sequence[str] = (),
                    max_rows: int = MAX_TABLE_ROWS, max_bytes: int = MAX_TABLE_BYTES) -> Iterator[pa.RecordBatch]:
    """The record batches of a Parquet file (a path or a binary file object) from outside, in bounded memory:
    :func:`check_parquet_metadata` and :func:`check_parquet_pages`, then batches of :data:`BATCH_ROWS` rows whose
    expanded size is added to a running budget before each is decoded (to the file's own schema). :class:`InvalidInput`
    naming ``name`` for a file over the limits or not Parquet."""
    name = printable(name)
    try:
        pf = pq.ParquetFile(source)
        check_parquet_metadata(pf, name, required=required, max_rows=max_rows, max_bytes=max_bytes)
        check_parquet_pages(source, pf, name, max_bytes=max_bytes)
        reader = pq.ParquetFile(source, metadata=pf.metadata, read_dictionary=_binary_paths(pf))
        schema = pf.schema_arrow
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        rows, spent = 0, 0
        for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False):
            rows += batch.num_rows
            spent += sum(expanded_bytes(column) for column in batch.columns)
            if rows > max_rows:
                raise _too_much(name, f"more than {max_rows:,} rows", max_rows, "rows")
            if spent > max_bytes:
                raise _too_much(name, f"rows 1 to {rows:,} decode to {spent:,} bytes", max_bytes, "bytes")
            yield _decoded(batch, schema)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        if isinstance(e, InvalidInput):
            raise
        raise InvalidInput(f"{name}: not a readable Parquet file ({type(e).__name__}: {printable(e, 160)})") from None


def read_parquet_table(source: Any, name: str, **limits: Any) -> pa.Table:
    """:func:`parquet_batches` gathered into one table, with the file's schema and its metadata (provenance)."""
    batches = list(parquet_batches(source, name, **limits))
    try:
        schema = pq.ParquetFile(source).schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InvalidInput(f"{printable(name)}: not a readable Parquet file ({printable(e, 160)})") from None
    if limits.get("columns") is not None:
        schema = pa.schema([schema.field(c) for c in limits["columns"]], metadata=schema.metadata)
    return pa.Table.from_batches(batches, schema=schema)


# ----------------------------------------------------------------------------- page headers

MAX_PAGE_HEADER_BYTES = 16 << 20
"""Longest Parquet page header read (Arrow's own default limit): a header holds sizes and optional statistics."""
_HEADER_READ = 64 << 10
_DELTA_BYTE_ARRAY = 7
_MAX_THRIFT_DEPTH = 16


class _Header:
    """A Thrift compact-protocol reader over one page header, reading the file in blocks as it goes and never
    more than :data:`MAX_PAGE_HEADER_BYTES`."""

    def __init__(self, f: Any, at: int, file_size: int):
        self.f, self.at, self.file_size = f, at, file_size
        self.buf, self.pos = b"", 0

    def _need(self, n: int) -> None:
        while len(self.buf) - self.pos < n:
            if len(self.buf) >= MAX_PAGE_HEADER_BYTES or self.at + len(self.buf) >= self.file_size:
                raise ValueError("a page header runs past its limit or the end of the file")
            self.f.seek(self.at + len(self.buf))
            more = self.f.read(min(_HEADER_READ, MAX_PAGE_HEADER_BYTES - len(self.buf)))
            if not more:
                raise ValueError("a page header runs past the end of the file")
            self.buf += more

    def byte(self) -> int:
        self._need(1)
        self.pos += 1
        return self.buf[self.pos - 1]

    def varint(self) -> int:
        out, shift = 0, 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise ValueError("an overlong integer in a page header")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0:
            raise ValueError("a negative length in a page header")
        self._need(n)
        self.pos += n

    def value(self, kind: int, depth: int) -> Any:
        """The value of a field of compact type ``kind``: integers and structs read, the rest skipped (None)."""
        if depth > _MAX_THRIFT_DEPTH:
            raise ValueError("a page header nested too deeply")
        if kind in (1, 2):  # booleans: the value is the type
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.skip_bytes(8)
        elif kind == 8:
            self.skip_bytes(self.varint())
        elif kind in (9, 10):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):  # every element takes at least one byte: bounded by the header's limit
                if elem in (1, 2):  # a boolean in a list is one byte
                    self.byte()
                else:
                    self.value(elem, depth + 1)
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.value(types >> 4, depth + 1)
                    self.value(types & 0x0F, depth + 1)
        elif kind == 12:
            return self.struct(depth + 1)
        elif kind == 13:  # uuid
            self.skip_bytes(16)
        else:
            raise ValueError(f"an unknown field type {kind} in a page header")
        return None

    def struct(self, depth: int = 0) -> dict[int, Any]:
        fields, last = {}, 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)


def _chunk_pages(f: Any, chunk: Any, file_size: int) -> Iterator[tuple[int, int, int]]:
    """``(uncompressed size, value count, encoding)`` of each page of a column chunk, read from the page headers
    that Arrow itself reads (the chunk's byte range as Arrow computes it from the footer), not from the footer's
    totals. A header Arrow could not read either is a ValueError."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset and 0 < chunk.dictionary_page_offset < start:
        start = chunk.dictionary_page_offset
    end = start + chunk.total_compressed_size
    if start < 0 or end > file_size:
        raise ValueError("a column chunk lies outside the file")
    at = start
    while at < end:
        header = _Header(f, at, file_size)
        h = header.struct()
        uncompressed, compressed = h.get(2), h.get(3)
        if not isinstance(uncompressed, int) or not isinstance(compressed, int) or uncompressed < 0 or compressed < 0:
            raise ValueError("a page header without valid sizes")
        sub = next((h[k] for k in (5, 7, 8) if isinstance(h.get(k), dict)), {})
        values = sub.get(1, 0) if isinstance(sub.get(1), int) else 0
        encoding = sub.get(4 if 8 in h and sub is h[8] else 2)
        yield uncompressed, max(0, values), encoding if isinstance(encoding, int) else -1
        at += header.pos + compressed


def check_parquet_pages(source: Any, pf: pq.ParquetFile, name: str, *, max_bytes: int = MAX_TABLE_BYTES) -> None:
    """Refuse a Parquet file whose pages would decompress or decode past ``max_bytes``, from the page headers
    alone, before any page is decompressed: the size each page declares (the buffer Arrow allocates for it)
    and its value count, added up over the file. The footer's totals may under-state both (a hand-made file
    of a few kB whose one page inflates to GiBs passes them); the headers are what Arrow decompresses by."""
    md = pf.metadata
    own = isinstance(source, (str, bytes)) or hasattr(source, "__fspath__")
    f = open(source, "rb") if own else source
    try:
        where = f.tell() if not own else 0
        f.seek(0, 2)
        file_size = f.tell()
        total = 0
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                width = _width(chunk.physical_type)
                for uncompressed, values, encoding in _chunk_pages(f, chunk, file_size):
                    size = max(uncompressed, values * width)
                    if encoding == _DELTA_BYTE_ARRAY:
                        size = max(size, values * uncompressed)
                    total += size
                    if total > max_bytes:
                        raise _too_much(name, f"the pages of column {printable(repr(chunk.path_in_schema), 80)} "
                                              f"(row group {g}) decompress past {max_bytes:,} bytes", max_bytes,
                                        "bytes")
        if not own:
            f.seek(where)
    finally:
        if own:
            f.close()


def ipc_stream_batches(source: Any, name: str, *, max_rows: int = MAX_TABLE_ROWS, max_bytes: int = MAX_TABLE_BYTES,
                       spent: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """The record batches of an Arrow IPC stream (a ``save_to_disk`` ``.arrow`` file), one message at a time:
    each message's body (as many bytes as it decodes to: compressed bodies and dictionary batches are refused)
    is added to the running budget before its batch is decoded. ``spent`` ([rows, bytes]) carries the budget across the
    files of one dataset. :class:`InvalidInput` naming ``name`` past a limit."""
    name = printable(name)
    spent = spent if spent is not None else [0, 0]
    try:
        reader = pa.ipc.MessageReader.open_stream(source)
        first = _next_message(reader)
        if first is None:
            raise ValueError("an empty stream")
        schema = pa.ipc.read_schema(first)
        while (message := _next_message(reader)) is not None:
            spent[1] += message.body.size
            if spent[1] > max_bytes:
                raise _too_much(name, f"its messages hold {spent[1]:,} bytes", max_bytes, "bytes")
            if message.type == "dictionary batch":
                raise InvalidInput(f"{name}: dictionary-encoded columns are not read from an Arrow stream")
            if message.type != "record batch":
                continue
            if _compressed(message):
                raise TableTooLarge(f"{name}: a compressed Arrow stream (its decoded size is unknown before it is "
                                   f"decompressed); {_BOMB}")
            batch = pa.ipc.read_record_batch(message, schema)
            spent[0] += batch.num_rows
            if spent[0] > max_rows:
                raise _too_much(name, f"more than {max_rows:,} rows", max_rows, "rows")
            yield batch
    except (pa.ArrowException, OSError, ValueError) as e:
        if isinstance(e, InvalidInput):
            raise
        raise InvalidInput(f"{name}: not a readable Arrow stream ({type(e).__name__}: {printable(e, 160)})") from None


def _compressed(message: Any) -> bool:
    """Whether a record batch message's body is compressed: its flatbuffer ``RecordBatch`` table (the message's
    header, field 2) has a ``compression`` field (field 3). Read from the metadata, before the body is decoded."""
    import struct

    buf = message.metadata.to_pybytes()

    def fields(pos: int):
        vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        size = struct.unpack_from("<H", buf, vtable)[0]
        return lambda i: struct.unpack_from("<H", buf, vtable + 4 + 2 * i)[0] if 4 + 2 * i < size else 0

    try:
        root = struct.unpack_from("<I", buf, 0)[0]
        header = fields(root)(2)
        if not header:
            return False
        at = root + header
        return fields(at + struct.unpack_from("<I", buf, at)[0])(3) != 0
    except struct.error:
        raise ValueError("unreadable Arrow message metadata") from None


def _next_message(reader: Any) -> Any:
    try:
        return reader.read_next_message()
    except StopIteration:
        return None
