"""The settings of keys' and values' formats and of the schema registry (docs/formats.md):
a part of :class:`service.settings.Settings`, which inherits them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

# What the transform sees and returns for a key or value (service/formats).
Format = Literal["bytes", "json", "avro", "json_schema", "protobuf"]
SubjectStrategy = Literal["topic", "record", "topic_record"]
REGISTRY_FORMATS = ("avro", "json_schema", "protobuf")
PARTS = ("input_key", "input_value", "output_key", "output_value")


class FormatSettings(BaseSettings):
    """``TXSTAGE_{INPUT,OUTPUT}_{KEY,VALUE}_FORMAT`` and ``..._SCHEMA``, ``TXSTAGE_REGISTRY_*``."""

    input_key_format: Format = "bytes"
    input_value_format: Format = "bytes"
    output_key_format: Format = "bytes"
    output_value_format: Format = "bytes"
    # Input: a reader schema file (avro) or module:Class (protobuf). Output: a schema
    # file (avro, json_schema) or module:Class (protobuf); empty: the subject's latest.
    input_key_schema: str = ""
    input_value_schema: str = ""
    output_key_schema: str = ""
    output_value_schema: str = ""
    registry_url: str = ""
    registry_basic_auth_user_info: SecretStr = SecretStr("")
    registry_ssl_ca_location: str = ""
    registry_ssl_certificate_location: str = ""
    registry_ssl_key_location: str = ""
    registry_timeout_s: float = Field(5.0, gt=0)
    registry_auto_register: bool = False
    subject_name_strategy: SubjectStrategy = "topic"

    @field_validator("input_key_format", "input_value_format", "output_key_format",
                     "output_value_format", "subject_name_strategy", mode="before")
    @classmethod
    def _lower_names(cls, value: object) -> object:
        return value.lower().strip() if isinstance(value, str) else value

    @property
    def formats(self) -> dict[str, Format]:
        """``input_key`` ... ``output_value`` -> its format."""
        return {part: getattr(self, f"{part}_format") for part in PARTS}

    @property
    def formatted(self) -> bool:
        """A key or value in a format other than bytes (False: the transform as it is)."""
        return any(fmt != "bytes" for fmt in self.formats.values())

    @property
    def uses_registry(self) -> bool:
        return any(fmt in REGISTRY_FORMATS for fmt in self.formats.values())

    def _format_problems(self) -> list[str]:
        problems = []
        registered = [f"TXSTAGE_{part.upper()}_FORMAT" for part, fmt in self.formats.items()
                      if fmt in REGISTRY_FORMATS]
        if registered and not self.registry_url:
            problems.append(f"TXSTAGE_REGISTRY_URL: needed by {', '.join(registered)}")
        for part, fmt in self.formats.items():
            schema = getattr(self, f"{part}_schema")
            name = f"TXSTAGE_{part.upper()}_SCHEMA"
            if fmt == "protobuf" and ":" not in schema:
                problems.append(f"{name}: protobuf needs the message class as module:Class")
            elif schema and (fmt in ("bytes", "json")
                             or (part.startswith("input") and fmt == "json_schema")):
                problems.append(f"{name}: not used with TXSTAGE_{part.upper()}_FORMAT={fmt}")
        return problems
