"""The YAML files a user hands the CLI (job specs, kubeconfigs), read so that every failure is one line naming
the file and where in it (line and column, or byte), never a parser's traceback or its ``<unicode string>``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# The stack loader's rule for duplicate keys, and its line/column wording, reused so that a job spec and a stack
# file are refused alike: one rule, one place.
from components.config.loading import StackLoader, yaml_position


class YamlFileError(ValueError):
    """A file that is not readable YAML; the message is one line starting with the file's name."""


def _problem(error: yaml.YAMLError, text: str) -> tuple[str, str]:
    """(where, what) of a parser error; a ReaderError (a control character) has an offset, not a line."""
    if isinstance(error, yaml.reader.ReaderError):
        at = error.position
        line, column = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
        return f"line {line}, column {column}", f"control character #x{error.character:02x} is not allowed"
    what = getattr(error, "problem", None) or getattr(error, "context", None) or str(error)
    return yaml_position(error), " ".join(str(what).split())


def parse_yaml(text: str, source: str, strict: bool = True) -> Any:
    """YAML text as data. ``strict`` refuses a duplicate key (plain YAML keeps the last one in silence); a
    kubeconfig is read without it, as the kubernetes client that reads it next has no such rule."""
    try:
        return yaml.load(text, Loader=StackLoader if strict else yaml.SafeLoader)
    except yaml.YAMLError as error:
        where, what = _problem(error, text)
        raise YamlFileError(f"{source}: {where}: not valid YAML: {what}") from None
    except ValueError as error:  # PyYAML's own, for a timestamp that is no date (2024-02-30)
        raise YamlFileError(f"{source}: not valid YAML: {error}") from None
    except RecursionError:
        raise YamlFileError(f"{source}: not valid YAML: nested too deeply") from None


def read_yaml(path: Path, what: str, strict: bool = True) -> Any:
    """The file's YAML as data: UTF-8 text (a stray byte is named by its offset), then :func:`parse_yaml`;
    ``what`` the file is (``the job spec``) words the message when it cannot be read at all."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise YamlFileError(f"{path}: cannot read {what}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise YamlFileError(f"{path}: is not UTF-8 text ({error.reason} at byte {error.start})") from None
    return parse_yaml(text, str(path), strict)
