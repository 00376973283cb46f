"""The scanning engine: every canary in a buffer or a file, in every encoding and through every layer inside
it (compression, archives, text encodings, SQLite), within bounds that are reported when reached.

It knows canaries and bytes, nothing of HTTP, flows, findings or what a tenant may see: `harness.detect`
builds the audit's findings on it (an import-linter contract keeps it from importing anything else of
`harness.detect`). `matcher` (the automaton over every encoded form, `forms`, with JSON escapes undone
around their triggers, `escapes`), `containers` (where a layer may start), `codecs` (its streaming
decoders, `compressed` for compression, sharing `progress`), `walk` (one stream and every layer in it),
`hits` (what a scan reports), `stream` (the entry points `scan_bytes` and `scan_file`).
"""
