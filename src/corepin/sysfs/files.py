"""Low-level sysfs file access shared by the topology readers.

Every path is resolved under a root directory (`/` on a live host, a fixture directory in
tests). Three rules hold for every read:

- a missing *required* file raises `SysfsError` naming the full path;
- a file whose contents cannot be parsed (not an integer, not a CPU list, ...) raises
  `SysfsError` naming the full path and quoting the bad text, whether the file was required or
  optional: garbage is never silently replaced by a default;
- a missing *optional* file returns `None`; the caller decides the fallback and reports it
  through `Fallbacks.note()`, which logs ONE warning per kind of fallback on the logger
  `corepin.sysfs` (structured `key=value` text) and counts the rest.

Files that are all there but disagree with each other (SMT siblings with different core ids,
a cache list that differs from its mask, ...) are not errors either: the kernel's description
is the truth, and discovery takes the interpretation hwloc and lscpu take. Those choices go
through `Fallbacks.interpret()`: ONE record per kind at INFO level (quiet unless logging is
turned up, e.g. COREPIN_LOG=info), counted like fallbacks.

CPU list texts repeat a lot (every CPU of an L3 lists the same `shared_cpu_list`), so parsed
lists are cached by their text: a 1024-CPU tree parses each distinct list once.
"""

from __future__ import annotations

import os

from corepin.core.cpuset import CPUSet
from corepin.core.errors import SysfsError
from corepin.core.log import INFO, WARNING, emit
from corepin.core.record import field, record

__all__ = ["LOGGER", "Fallbacks", "SysfsFiles"]

LOGGER = "corepin.sysfs"
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
#: one read takes a whole sysfs attribute (the kernel's limit is a page); longer files (a
#: fixture tree) are read on to the end
_CHUNK = 65536


@record(frozen=False, slots=False)
class Fallbacks:
    """Which fallbacks one discovery used: `kind -> (first path, what was done, count)`.

    The first occurrence of a kind logs a warning; later ones only increase the count, so an
    old kernel without `die_id` gives one warning, not one per CPU.
    """

    seen: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    #: interpretations of attributes that disagree, same shape as `seen` (see `interpret`)
    interpreted: dict[str, tuple[str, str, int]] = field(default_factory=dict)

    def note(self, kind: str, path: str, action: str) -> None:
        first = self.seen.get(kind)
        if first is None:
            self.seen[kind] = (path, action, 1)
            emit(LOGGER, WARNING, "sysfs fallback kind=%s path=%s action=%r", kind, path, action)
        else:
            self.seen[kind] = (first[0], first[1], first[2] + 1)

    def interpret(self, kind: str, path: str, action: str) -> None:
        """Record that the files under `path` disagree with others and `action` was taken (the
        hwloc / lscpu reading): logged once per kind at INFO, counted afterwards."""
        first = self.interpreted.get(kind)
        if first is None:
            self.interpreted[kind] = (path, action, 1)
            emit(LOGGER, INFO, "sysfs interpretation kind=%s path=%s action=%r", kind, path, action)
        else:
            self.interpreted[kind] = (first[0], first[1], first[2] + 1)

    @property
    def kinds(self) -> list[str]:
        return sorted(self.seen)


class SysfsFiles:
    """Reads files below `root`; paths given to the methods are absolute host paths
    (e.g. `sys/devices/system/cpu/online`, without the leading slash is fine too)."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = os.fspath(root)
        self.fallbacks = Fallbacks()
        self._lists: dict[str, CPUSet] = {}
        self._masks: dict[str, CPUSet] = {}

    # ------------------------------------------------------------------ paths
    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *(p.lstrip("/") for p in parts))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str, *, required: bool = True) -> list[str] | None:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            if required:
                raise SysfsError(
                    path, "directory is missing (is sysfs mounted under this root?)"
                ) from None
            return None
        except NotADirectoryError:
            raise SysfsError(path, "expected a directory, found a file") from None
        except OSError as exc:
            raise SysfsError(path, f"cannot list directory: {exc.strerror}") from exc

    # ------------------------------------------------------------------ raw text
    def text(self, path: str, *, required: bool = True) -> str | None:
        """The file's text with surrounding whitespace and NUL padding removed.

        Read with one open, read and close (a file object costs twice as much, and discovery
        reads some 25 files per CPU on every `corepin run`)."""
        try:
            fd = os.open(path, _READ_FLAGS)
            try:
                raw = os.read(fd, _CHUNK)
                while len(raw) >= _CHUNK and (more := os.read(fd, _CHUNK)):
                    raw += more
            finally:
                os.close(fd)
        except FileNotFoundError:
            if required:
                raise SysfsError(path, "required file is missing") from None
            return None
        except IsADirectoryError:
            raise SysfsError(path, "expected a file, found a directory") from None
        except NotADirectoryError:
            if required:
                raise SysfsError(
                    path, "required file is missing (a parent is not a directory)"
                ) from None
            return None
        except OSError as exc:
            raise SysfsError(path, f"cannot read: {exc.strerror}") from exc
        try:
            return raw.decode("ascii").strip().strip("\0").strip()
        except UnicodeDecodeError:
            raise SysfsError(path, f"not ASCII text: {raw[:40]!r}") from None

    # ------------------------------------------------------------------ typed
    def integer(self, path: str, *, required: bool = True) -> int | None:
        text = self.text(path, required=required)
        if text is None:
            return None
        try:
            return int(text, 10)
        except ValueError:
            raise SysfsError(path, f"expected an integer, got {text[:60]!r}") from None

    def integer_or_note(self, path: str, kind: str, action: str) -> int | None:
        """An optional integer file; when it is missing, the fallback `kind` is noted with
        `action` (what the caller does instead) and None is returned."""
        value = self.integer(path, required=False)
        if value is None:
            self.note(kind, path, action)
        return value

    def cpulist(self, path: str, *, required: bool = True) -> CPUSet | None:
        """A CPU (or node) list in the kernel's list format, e.g. `0-3,8`; empty file = empty."""
        text = self.text(path, required=required)
        if text is None:
            return None
        return self.parse_cpulist(path, text)

    def parse_cpulist(self, path: str, text: str) -> CPUSet:
        cached = self._lists.get(text)
        if cached is not None:
            return cached
        if text == "(null)":  # how some kernels print an empty mask (e.g. nohz_full)
            parsed = CPUSet()
        else:
            try:
                parsed = CPUSet.parse(text)
            except ValueError as exc:
                raise SysfsError(path, f"not a CPU list: {exc}") from None
        self._lists[text] = parsed
        return parsed

    def cpumask(self, path: str, *, required: bool = True) -> CPUSet | None:
        """A hex CPU mask as in `cpumap` / `shared_cpu_map` (`ff,ffffffff`)."""
        text = self.text(path, required=required)
        if text is None:
            return None
        cached = self._masks.get(text)
        if cached is not None:
            return cached
        try:
            parsed = CPUSet.from_mask(text) if text else CPUSet()
        except ValueError as exc:
            raise SysfsError(path, f"not a hex CPU mask: {exc}") from None
        self._masks[text] = parsed
        return parsed

    def cpus_list_or_mask(
        self,
        list_path: str,
        mask_path: str,
        *,
        kinds: tuple[str, str],
        default: CPUSet,
        action: str,
    ) -> CPUSet:
        """CPUs from a list file (`cpulist`, `shared_cpu_list`), else from its hex mask twin
        (`cpumap`, `shared_cpu_map`), else `default`. Each fallback taken is noted: `kinds[0]`
        when the list is missing, `kinds[1]` (with `action`) when the mask is missing too."""
        listed = self.cpulist(list_path, required=False)
        if listed is not None:
            return listed
        self.note(kinds[0], list_path, f"using {os.path.basename(mask_path)}")
        masked = self.cpumask(mask_path, required=False)
        if masked is not None:
            return masked
        self.note(kinds[1], mask_path, action)
        return default

    def note(self, kind: str, path: str, action: str) -> None:
        self.fallbacks.note(kind, path, action)

    def interpret(self, kind: str, path: str, action: str) -> None:
        self.fallbacks.interpret(kind, path, action)
