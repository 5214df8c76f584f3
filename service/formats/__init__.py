"""Keys and values in a format (docs/formats.md): decoded before the transform, encoded
after it, in one place the stage, the backfill and the tools share (``codec.with_formats``;
``load.load_formatted`` for the tools and the backfill). ``bytes`` everywhere: the
transform itself, nothing added.

    errors.py       what a record or the registry did wrong: dead letter, or wait
    registry.py     the schema registry client: each id, each subject resolved once and
                    cached; unreachable, 5xx, time-out -> RegistryUnavailable (a pause)
    wire.py         the registry wire format (magic byte 0, 4-byte id), protobuf's
                    message indexes
    codecs.py       one decoder and one encoder per format: json, avro (fastavro with
                    the parsed schema), json_schema (jsonschema), protobuf
    codec.py        build(settings) -> Codecs; with_formats(transform, codecs, topic):
                    the transform on decoded values
    load.py         load_formatted(ref, settings): TXSTAGE_TRANSFORM, wrapped
    check.py        check-config: the registry reached, output subjects resolved and
                    the schemas compatible
"""
