"""Records: the versioned per-request schema, the append-only writer and the run manifest."""

from formtax.records.schema import SCHEMA_VERSION, ParseRecord, Record
from formtax.records.store import RECORDS, RecordWriter, read_manifest, read_records, write_manifest

__all__ = ["RECORDS", "SCHEMA_VERSION", "ParseRecord", "Record", "RecordWriter", "read_manifest", "read_records",
           "write_manifest"]
