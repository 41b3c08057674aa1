"""The checkpoint manifest: what a published checkpoint must contain, byte for byte.

The manifest is read back from a shared filesystem that a crash may have left in any state, so it is
outside input: :func:`parse_manifest` accepts exactly the documented shape and names the first field
that is wrong. Every rank's shard is listed with its size and SHA-256, so a truncated or bit-rotted file
is caught before a gang resumes from it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"
#: Written last inside the staging directory; holds the manifest's SHA-256 so an edited manifest is caught.
COMMIT_MARKER = "COMMITTED"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: No job takes a trillion steps: a larger step (a manifest or directory name with thousands of digits) is
#: damage, refused like any other wrong field instead of raising from int() or overflowing a format.
MAX_STEP = 10**12 - 1
#: One path component: no separators, no parent references, no hidden files (those are ours).
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")


class ManifestError(ValueError):
    """A manifest that does not have the documented shape; the message names the field."""


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: tuple[FileEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def dumps(self) -> bytes:
        body = {
            "version": MANIFEST_VERSION,
            "step": self.step,
            "worldSize": self.world_size,
            "files": [f.to_json() for f in self.files],
        }
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _whole(value: Any, where: str, minimum: int, maximum: int | None = None) -> int:
    # bool is an int in Python; a manifest saying "step": true is still wrong.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum or (
            maximum is not None and value > maximum):
        bound = f" and <= {maximum}" if maximum is not None else ""
        shown = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else "a larger number"
        raise ManifestError(f"{where}: expected a whole number >= {minimum}{bound}, got {shown}")
    return value


def parse_file_entry(raw: Any, where: str) -> FileEntry:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"name", "size", "sha256"})
    if unknown:
        raise ManifestError(f"{where}: unknown keys {unknown}")
    name = raw.get("name")
    if not isinstance(name, str) or not _FILE_NAME.match(name) or name in (MANIFEST_NAME, COMMIT_MARKER):
        raise ManifestError(f"{where}.name: expected a plain file name, got {name!r}")
    digest = raw.get("sha256")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise ManifestError(f"{where}.sha256: expected 64 lowercase hex digits, got {digest!r}")
    return FileEntry(name=name, size=_whole(raw.get("size"), f"{where}.size", 0), sha256=digest)


def parse_manifest(data: bytes | str) -> Manifest:
    """Parse a manifest; raises :class:`ManifestError` naming the first wrong field."""
    try:
        raw = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and ints past Python's digit limit
        raise ManifestError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ManifestError("not JSON: nested too deeply") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"expected a JSON object, got {type(raw).__name__}")
    if raw.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"version: expected {MANIFEST_VERSION}, got {raw.get('version')!r}")
    unknown = sorted(set(raw) - {"version", "step", "worldSize", "files"})
    if unknown:
        raise ManifestError(f"unknown keys {unknown}")
    step = _whole(raw.get("step"), "step", 0, MAX_STEP)
    world_size = _whole(raw.get("worldSize"), "worldSize", 1)
    files_raw = raw.get("files")
    if not isinstance(files_raw, list) or not files_raw:
        raise ManifestError(f"files: expected a non-empty list, got {files_raw!r}")
    files = tuple(parse_file_entry(f, f"files[{i}]") for i, f in enumerate(files_raw))
    names = [f.name for f in files]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ManifestError(f"files: {duplicate!r} is listed twice")
    return Manifest(step=step, world_size=world_size, files=files)
